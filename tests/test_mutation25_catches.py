"""Round 25's outside mutation review of round 24's new code: one-line bugs planted on purpose in calibrate's
PairRounds and its optimizer probe on the job's mesh, the liveness heartbeat's parent check, the fork watch, the
planner's round-24 Workload fields (fp32_grads' default, unsharded_grad_accumulation, adam_master_copy,
bf16_cross_entropy, gathered_logits in memory) and rows, newuser24's refusals (another run's --metrics-file /
--tensorboard-dir, generate's guessed-bytes refusal, hybrid.data.args.not_text_files), PowerSGD's resume cast line
and the DiLoCo ZeRO warning; the area's fast tier (`-m "not slow"`) run on each. Each test here kills a mutant that
tier let live, shown failing on the mutant and passing on HEAD. In-process, no process group.

The mutant ids (MET1-restart0, ...) are those of branch mutation25's report."""

from __future__ import annotations

import pytest


# --- MET: a fresh run into another run's --metrics-file / --tensorboard-dir (hybrid/metrics/args.py) -------------
def test_torchruns_first_attempt_is_no_restart(tmp_path, monkeypatch):
    """torchrun sets TORCHELASTIC_RESTART_COUNT=0 on a job's first attempt: that is a fresh run, whose records would
    follow another run's, so it is refused as under `python`. MET1-restart0 (`int(restart) >= 0`: every torchrun
    job read as a restart) let a torchrun job append to another run's file; the metrics tests only set 1 and
    'abc'."""
    from hybrid.metrics.args import check_not_another_run
    metrics = tmp_path / "m.jsonl"
    metrics.write_text('{"iteration": 7, "lm_loss": 5.0}\n')
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    with pytest.raises(ValueError, match=r"holds another run's records \(up to iteration 7\)"):
        check_not_another_run(str(metrics), None, continues=False)


def test_an_empty_metrics_file_holds_no_run(tmp_path):
    """An empty --metrics-file (made ahead with `touch`, or left by a run killed before its first record) holds no
    other run's records: taken. MET3-empty-refused (`getsize >= 0`) refused it; the metrics tests' files all hold
    records."""
    from hybrid.metrics.args import check_not_another_run
    (tmp_path / "m.jsonl").write_bytes(b"")
    check_not_another_run(str(tmp_path / "m.jsonl"), None, continues=False)


def test_the_refusal_names_the_last_whole_record(tmp_path):
    """The line names the iteration the other run reached: its last whole record's, past a torn last line (a run
    killed mid-write) and a record whose "iteration" is no integer. MET5-first-record (the records read from the
    first) named iteration 1; MET6-iter-any-type (any "iteration" key taken) named None; the metrics tests' files
    hold one record, or end on a whole one."""
    from hybrid.metrics.args import check_not_another_run
    metrics = tmp_path / "m.jsonl"
    metrics.write_text('{"iteration": 1, "lm_loss": 5.5}\n{"iteration": 2, "lm_loss": 5.4}\n'
                       '{"iteration": 3, "lm_loss": 5.3}\n{"iteration": null, "note": "end"}\n{"iterati')
    with pytest.raises(ValueError, match=r"\(up to iteration 3\)"):
        check_not_another_run(str(metrics), None, continues=False)


def test_a_tensorboard_dir_without_event_files_holds_no_run(tmp_path):
    """A --tensorboard-dir holding other files (notes, a plugin folder) but no `events.out.tfevents.*` holds no
    run's curves: taken. MET7-tb-any-file (any file refused) refused it; the tests' folders hold event files or are
    new."""
    from hybrid.metrics.args import check_not_another_run
    (tmp_path / "tb" / "plugins").mkdir(parents=True)
    (tmp_path / "tb" / "notes.txt").write_text("lr sweep\n")
    check_not_another_run(None, str(tmp_path / "tb"), continues=False)


def test_a_tensorboard_dir_with_another_runs_event_files_is_refused_in_the_fast_tier(tmp_path):
    """One event file of another run is enough to refuse a fresh run's --tensorboard-dir (a name with glob's
    metacharacters still found: glob.escape). MET8-tb-check-gone (the check dropped) lived through the fast tier:
    only the slow test, after a forked training run, wrote event files."""
    from hybrid.metrics.args import check_not_another_run
    tb = tmp_path / "tb[1]"
    tb.mkdir()
    (tb / "events.out.tfevents.1.host.1.0").write_bytes(b"")
    with pytest.raises(ValueError, match=r"--tensorboard-dir .* holds another run's event files"):
        check_not_another_run(None, str(tb), continues=False)


# --- GEN, DAT: generate's guessed-bytes refusal (hybrid/generate/cli.py), hybrid.data.args.not_text_files -------
LLAMA = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2,
         "num_hidden_layers": 1, "intermediate_size": 64, "vocab_size": 512, "max_position_embeddings": 64}


def test_generates_checks_run_the_guessed_bytes_refusal(tmp_path, monkeypatch, one_line, one_process):
    """`hybrid generate SRC --prompt` of a run that read an indexed prefix and recorded no tokenizer is one line
    from generate's own checks (read_source stubbed with such a run's config and state.json: no training run).
    GEN4-call-gone (the check's call dropped from _validate) lived through the fast tier: only the slow test, after
    a forked training run, went through _validate."""
    import json

    from hybrid.cli import main as hybrid_main
    from hybrid.generate import cli as generate_cli
    from models.config import load_config
    (tmp_path / "cfg.json").write_text(json.dumps(LLAMA))
    (tmp_path / "ck").mkdir()
    cfg, state = load_config(str(tmp_path / "cfg.json")), {"args": {"data_path": [str(tmp_path / "corpus_doc")]}}
    monkeypatch.setattr(generate_cli, "read_source", lambda src, model: (cfg, str(tmp_path / "ck"), state))
    line = one_line(lambda: hybrid_main(["generate", str(tmp_path / "ck"), "--prompt", "Hi", "--max-new-tokens",
                                         "2"]))
    assert line.startswith(f"hybrid generate: error: --prompt: SRC's run read --data-path {tmp_path / 'corpus_doc'} "
                           f"(token ids"), line


def test_a_transformers_folder_without_a_tokenizer_is_no_train_run(tmp_path):
    """A transformers SRC has no state.json (read_source's None): no run's --data-path to read, so nothing to refuse
    (its bytes fallback is find_codec's). GEN6-state-none (the `state is None` guard dropped) raised AttributeError
    from state.get; the tests give a state every time."""
    from types import SimpleNamespace

    from hybrid.generate.cli import check_guessed_bytes
    check_guessed_bytes(SimpleNamespace(prompt="Hi"), SimpleNamespace(vocab_size=32000),
                        SimpleNamespace(guessed=True), None)


def test_a_folder_on_the_data_path_is_no_text_file(tmp_path):
    """not_text_files lists the --data-path entries that are no file here: a folder where the run's entry was (train
    .py refuses a folder, so the run did not read bytes from it) is one. DAT2-exists (os.path.exists for isfile)
    took the folder for a text file and generate's refusal for text data."""
    from hybrid.data.args import not_text_files
    text = tmp_path / "corpus.txt"
    text.write_text("hello\n")
    (tmp_path / "corpus_text_document").mkdir()
    entries = ["0.3", str(text), "0.7", str(tmp_path / "corpus_text_document")]
    assert not_text_files(entries) == [str(tmp_path / "corpus_text_document")]


# --- DIL: the DiLoCo ZeRO warning (hybrid/diloco/args.py unsharded_zero_warning) --------------------------------
def test_one_replica_of_one_rank_gets_no_zero_warning():
    """dp 1 (one rank, one replica): the one-replica warning says what there is to say; the ZeRO warning, whose
    advice (--diloco-replicas R < dp, or more ranks a replica) has nothing to offer at dp 1, is not given.
    DIL1-r1 (the `r == 1` guard dropped: dp // r x cp = 1 at dp 1) warned "each of the 1 replicas is one rank"."""
    from types import SimpleNamespace

    from hybrid.diloco.args import unsharded_zero_warning
    dims = SimpleNamespace(dp=1, cp=1)
    assert unsharded_zero_warning(SimpleNamespace(replicas=None), dims, 3) == ()
    assert unsharded_zero_warning(SimpleNamespace(replicas=1), SimpleNamespace(dp=2, cp=1), 3) == ()


# --- PSG: PowerSGD's resume cast line (hybrid/train/explain.py powersgd_cast_line) --------------------------------
def test_no_cast_line_when_this_run_compresses_only_one_bit_adams_momentum():
    """--powersgd-rank with --onebit-compressor powersgd is 1-bit Adam's momentum compressor, not gradient
    PowerSGD: this run loads no gradient error feedback, so a gradient-PowerSGD checkpoint's casts are not this
    run's to announce. PSG3-onebit-counted (the compressor test dropped from _gradient_powersgd) said the cast
    line; PSG11-onebit-flag-default (a state.json without the key read as 1-bit Adam's) said none for gradient
    PowerSGD; the cast-line tests have no 1-bit Adam run and always record the key."""
    from hybrid.train.explain import powersgd_cast_line
    saved = {"args": {"bf16": True, "grad_reduce_in_bf16": True, "powersgd_rank": 2, "powersgd_start_iter": 2},
             "compress/powersgd": {"iter": 4, "dp": 2, "tp": 1, "pp": 1, "rank": 2}}
    now = {"args": {"bf16": True, "grad_reduce_in_bf16": False, "powersgd_rank": 2, "powersgd_start_iter": 2}}
    assert powersgd_cast_line(saved, now) is not None  # gradient PowerSGD both times: the line
    onebit = {"args": {**now["args"], "onebit_compressor": "powersgd"}}
    assert powersgd_cast_line(saved, onebit) is None


# --- WL: the planner's round-24 Workload fields (hybrid/planner/layout.py, model.py, predicted_memory.py) --------
def test_the_bf16_loss_needs_the_bf16_flash_profile():
    """bf16_cross_entropy prices torch's loss on bf16 logits, which only the bf16-flash profile models: with
    Korthikanti's profile (the default) it is refused as with the fused loss. WL7-profile-allowed (the profile
    half of the check dropped) took it; the kempner tests only try the fused loss."""
    from hybrid.planner.layout import Workload
    from hybrid.planner.reference import gpt_model
    with pytest.raises(ValueError, match="bf16_cross_entropy .* bf16-flash profile"):
        Workload(gpt_model(2, 512, 8, 32000, 1024), global_batch=8, seq_length=1024, bf16_cross_entropy=True)


def test_the_fused_loss_over_gathered_logits_keeps_all_of_them():
    """gathered_logits: every TP rank's loss reads all V_p logits, the fused loss too -- it keeps the bf16 logits
    over V_p a token, not V_p / t (plus its fp32 logsumexp). MOD5-fused-vocab-t (the fused branch left at V_p / t)
    planned a quarter of them at tp 4; the kempner tests' gathered rows use torch's bf16 loss, not the fused one."""
    from dataclasses import replace

    from hybrid.planner.layout import ActivationProfile, Workload
    from hybrid.planner.reference import gpt_model
    work = Workload(gpt_model(2, 512, 8, 32000, 1024), global_batch=8, seq_length=1024, fused_cross_entropy=True,
                    activations=ActivationProfile.BF16_FLASH, gathered_logits=True)
    gathered, parallel = work.shard(4), replace(work, gathered_logits=False).shard(4)
    b, s, v = 2, 1024, gathered.vocab
    extra = gathered.head_activation_bytes(b, s, sp=True) - parallel.head_activation_bytes(b, s, sp=True)
    assert extra == pytest.approx(2 * b * s * (v - v / 4))



def test_unsharded_accumulation_is_zero_3s_only():
    """unsharded_grad_accumulation is FSDP2's no-sync accumulation of ZeRO 3 (grads_unsharded: "ZeRO 3 over dp > 1
    with more than one micro-batch"): at ZeRO 2 the gradients are still planned sharded, 4 Psi / Nd.
    PM1-zero2-too (ZeRO 2 and up) planned the whole 4 Psi on every rank; every kempner row is ZeRO 3."""
    from hybrid.planner.layout import Layout, Workload, ZeroStage
    from hybrid.planner.predicted_memory import grads_unsharded, model_states
    from hybrid.planner.reference import gpt_model
    work = Workload(gpt_model(2, 512, 8, 32000, 1024), global_batch=32, seq_length=1024,
                    unsharded_grad_accumulation=True)
    zero2, zero3 = Layout(dp=8, zero=ZeroStage.GRADIENTS), Layout(dp=8, zero=ZeroStage.PARAMETERS)
    assert work.num_microbatches(zero2) == 4 and grads_unsharded(work, zero3)
    assert not grads_unsharded(work, zero2)
    states = model_states(1.0, zero2.zero, 8, zero2.offload, work.precision, work.fp32_grads, work.optimizer_bytes,
                          grads_unsharded(work, zero2))
    assert states.grads == 4 / 8



# --- ROW: the builders that state fp32_grads=False since Workload's default became fp32 (round 24, 7c4e594) ------
def test_the_h200_rows_are_still_planned_with_bf16_gradients():
    """Round 24 made Workload's default gradient dtype fp32 under mixed precision and had every builder that relied
    on the old default state fp32_grads=False, its rows byte-identical (7c4e594). ROW8-h200-llama (the statement
    dropped from fit.h200_llama_workload: fp32 gradients) moved heldout.h200_rows' step and optimizer rows and no
    test saw it -- the H200 fit uses only the pipeline's forward + backward, which the gradient dtype leaves alone."""
    from hybrid.planner import fit
    from hybrid.planner.hardware import hardware
    from hybrid.planner.layout import Cluster, Layout
    from hybrid.planner.search import evaluate
    work = fit.h200_llama_workload()
    assert work.fp32_grads is False and work.grad_bytes == 2
    plan = evaluate(work, Cluster(gpus=1, hw=hardware("h200")), Layout(micro_batch=1))
    assert plan.memory.peak.states.grads == pytest.approx(2 * plan.memory.peak.parameters)


# --- CAL: calibrate's PairRounds record (hybrid/planner/calibrate.py _pair_rounds_record) -------------------------
def test_the_profiles_one_reading_fields_are_the_probes_alone():
    """The profile keeps, beside the fitted fields, what the pair probe's own readings alone give (what calibrate
    fitted before round 24) and every rank's rounds, the odd rank out None; a calibration with no pair probe (one
    rank, a GPU) records neither. CAL8-one-reading-rounds (`fit_comm_cpu(comm)`: the rounds folded in) recorded the
    fitted fields twice; the PairRounds tests call fit_comm_cpu, not the record."""
    from hybrid.planner import calibrate as cal
    rounds = [(3.0e-4, 8.0e-4), (3.2e-4, 8.2e-4), (3.1e-4, 8.1e-4)]
    sizes = [(8, 2.4e-3), (2**16, 2.4e-3), (2**20, 2.4e-3 + 2**20 * 1e-9)]
    comm = {"tp_layer": [(49152, 9e-4)], "send_recv": sizes, "rounds": rounds}
    record = cal._pair_rounds_record([{"comm_cpu": comm}, {"comm_cpu": comm}, {"comm_cpu": None}])
    assert record["pair_cpu_rounds_s_per_rank"] == [rounds, rounds, None]
    one = record["pair_cpu_one_reading"]
    assert one["p2p_cpu_s"] == 2.4e-3 and one == cal.fit_comm_cpu([comm, comm], rounds=False)
    assert cal.fit_comm_cpu([comm, comm])["p2p_cpu_s"] == pytest.approx(8.15e-4)  # median of 2.4 ms and 0.80-0.82
    assert cal._pair_rounds_record([{"comm_cpu": None}]) == {}

def test_the_optimizer_probe_leaves_out_the_stages_forward_and_backward(monkeypatch):
    """optimizer_step_cpu times train_step less the stage's forward and backward (_ProbeRunner's seconds: the
    model's, priced by the pass probes): a forward that takes 1 s of the clock adds nothing to a step's reading
    (one rank, in-process; the clock is the test's, advanced only by the forward). CAL11-model-counted (the
    runner's seconds not subtracted) read 1 s a step; the optimizer-mesh tests time only the clock's waits."""
    from hybrid.planner import calibrate as cal
    now = [0.0]
    make = cal._probe_stage

    def stage(layers, mesh=None):
        model = make(layers, mesh=mesh)
        forward = model.forward

        def timed_forward(*args):
            now[0] += 1.0
            return forward(*args)
        model.forward = timed_forward
        return model
    monkeypatch.setattr(cal, "_probe_stage", stage)
    ((tensors, params, seconds),) = cal.optimizer_step_cpu(layers=(1,), steps=2, blocks=1, clock=lambda: now[0])
    assert tensors > 0 and seconds == 0.0


# --- LIV: the heartbeat's parent check (hybrid/liveness.py Heartbeat._beat / _stop_if_orphaned) -----------------
class _AgentStore:
    """The agent's store as a rank's heartbeat thread sees it: `add` works until the agent dies (`dies_on_add`),
    then the agent -- this rank's parent -- is gone (`gone`) and, with `fails`, its store with it."""

    def __init__(self, fails: bool):
        import threading
        self.fails, self.gone, self.adds = fails, threading.Event(), 0

    def add(self, key, n):
        self.adds += 1
        if self.adds > 1:  # the second beat: the agent has been SIGKILLed since the first
            self.gone.set()
            if self.fails:
                raise RuntimeError("Connection reset by peer")

    def check(self, keys):
        return False


def _beat_until_exit(monkeypatch, store: _AgentStore) -> list[int]:
    """Run a heartbeat's thread body (no process group: the store stubbed) whose parent pid changes when `store`
    says the agent is gone; the exit codes it asked for (os._exit stubbed: the stop is what it does instead)."""
    import threading

    from hybrid import liveness
    hb = liveness.Heartbeat.__new__(liveness.Heartbeat)
    hb.rank, hb.world, hb.interval, hb._prefix = 1, 2, 0.01, "hybrid/heartbeat/test"
    hb._agent, hb._store, hb._stop = 4242, store, threading.Event()
    exits: list[int] = []

    def _exit(code):
        exits.append(code)
        hb._stop.set()
    monkeypatch.setattr(liveness.os, "getppid", lambda: 1 if store.gone.is_set() else 4242)
    monkeypatch.setattr(liveness.os, "_exit", _exit)
    thread = threading.Thread(target=hb._beat, daemon=True)
    thread.start()
    thread.join(timeout=10)
    hb._stop.set()
    thread.join(timeout=5)
    return exits


def test_a_rank_whose_agent_dies_while_its_store_answers_exits_1(monkeypatch, capsys):
    """The agent gone while the store still answers (a store not in the agent's process): the beat loop's own check
    stops the rank, exit 1, one line naming the agent. LIV4-loop-check-gone (the check at the top of the loop
    dropped) kept the rank training; LIV5-exit0 (exit 0) ended it as a success. The launch test
    (tests/test_liveness24_agent_gone.py) kills the agent that hosts the store, so only the store-lost path runs
    there, in minutes of wall on a loaded machine; this one takes about a second."""
    assert _beat_until_exit(monkeypatch, _AgentStore(fails=False)) == [1]
    assert "stopped: torchrun's agent (pid 4242) is gone" in capsys.readouterr().err


def test_a_rank_whose_agent_and_store_die_together_still_exits_1(monkeypatch, capsys):
    """The agent that hosts the store SIGKILLed between two checks: the beat meets the lost store first, and the
    thread keeps checking its parent (every second) rather than ending. LIV3-except-returns (the store-lost path
    returning at once) left the orphaned rank running with no heartbeat and no check (the launch test, minutes of
    wall here, was not rerun cleanly on it)."""
    assert _beat_until_exit(monkeypatch, _AgentStore(fails=True)) == [1]
    assert "is gone" in capsys.readouterr().err


# --- ORP: the fork watch (hybrid/testing.py _kill_self_at_eof, _die_with_parent, _run_child) ---------------------
class _Prctl:
    """ctypes.CDLL(None).prctl recorded, not called (the test process keeps its own parent-death signal)."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)
        return 0


def _preexec(monkeypatch, sig, parent_gone: bool):
    """_die_with_parent(sig)'s preexec_fn run in this process with prctl and os.kill recorded, the parent pid
    as a child would read it when its parent is (not) gone: (prctl calls, os.kill calls)."""
    import ctypes
    import os

    from hybrid import testing
    prctl, kills = _Prctl(), []
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: type("Libc", (), {"prctl": prctl})())
    preexec = testing._die_with_parent(sig)
    parent = os.getpid()
    monkeypatch.setattr(testing.os, "getppid", lambda: 1 if parent_gone else parent)
    monkeypatch.setattr(testing.os, "kill", lambda pid, s: kills.append((pid, s)))
    preexec()
    return prctl.calls, kills


def test_a_child_whose_parent_died_before_its_prctl_signals_itself(monkeypatch):
    """PR_SET_PDEATHSIG only covers a parent that dies after the prctl: a child whose parent was already gone
    (re-parented: another parent pid) sends itself the signal at once. ORP6-parent-gone-race (that check dropped)
    left such a child running; the orphan tests kill the parent long after the child's start."""
    import os
    import signal
    calls, kills = _preexec(monkeypatch, signal.SIGTERM, parent_gone=True)
    assert calls == [(1, int(signal.SIGTERM), 0, 0, 0)] and kills == [(os.getpid(), signal.SIGTERM)]
    assert _preexec(monkeypatch, signal.SIGTERM, parent_gone=False)[1] == []
