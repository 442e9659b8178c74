"""Round 15: the bad inputs round 14's new-user pass found and left, each ending in one line naming the flag, key or
file and the fix before any process group or long work -- or, where the input is meaningful, taken and said.

1. train.py: virtual pipeline stages (--num-layers-per-virtual-pipeline-stage / --virtual-pipeline-model-parallel-size,
   or --pipeline-schedule zbv's two chunks) at --pipeline-model-parallel-size 1 were taken silently: refused, as
   Megatron-LM refuses them (one stage has no bubble for interleaving to shrink).
2. DiLoCo with one replica (dp 1, or --diloco-replicas 1) was taken silently: taken with one start-up warning (the
   outer Nesterov step still acts, a Lookahead-style method; docs/diloco.md says why it is not refused).
3. `hybrid models DIR`: load_config's errors named train.py's --model, a flag this command does not take; a path
   that does not exist was "no preset".
4. Ctrl-C in `hybrid calibrate` printed tracebacks (its own, the forkserver's, the ranks'): exit 130, one line, no
   profile written (the real Ctrl-C was checked by hand: the report's commands).
5. --shm-gather given by name where it cannot run fell back to gloo silently: refused where known before start
   (the ZeRO group is not a pair, a compressor, a GPU); the set-up's own fallback (a full /dev/shm) said at start.
6. `hybrid plan --inter-dc-bandwidth` quoted "--diloco-fragments 4" -- a default -- as if given.

In this process (conftest's `one_line`: one line, no traceback, no process group)."""

from __future__ import annotations

import argparse
import os
import re
import signal

import pytest

from hybrid.cli import main as hybrid_main

pytestmark = pytest.mark.usefixtures("one_process")


def _validate(argv, monkeypatch, world: int = 1):
    """train.py's checks as rank 0 of a `world`-rank torchrun job on one node (no process group is started)."""
    from hybrid.train.main import validate
    if world > 1:
        for name, value in (("WORLD_SIZE", str(world)), ("RANK", "0"), ("LOCAL_RANK", "0"),
                            ("LOCAL_WORLD_SIZE", str(world)), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
            monkeypatch.setenv(name, value)
    return validate(["--model", "tiny-gpt2"] + argv)


# --- 1. virtual stages at pp 1 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, line", [
    (["--num-layers-per-virtual-pipeline-stage", "1"],
     "--num-layers-per-virtual-pipeline-stage 1 makes 4 virtual stages a rank, and --pipeline-model-parallel-size is "
     "1: interleaving shrinks a pipeline's bubble and one stage has none (Megatron-LM refuses the same); give "
     "--pipeline-model-parallel-size N >= 2 or drop --num-layers-per-virtual-pipeline-stage"),
    (["--virtual-pipeline-model-parallel-size", "2", "--pipeline-schedule", "interleaved"],
     "--virtual-pipeline-model-parallel-size 2 makes 2 virtual stages a rank, and --pipeline-model-parallel-size is "
     "1:"),
    (["--pipeline-schedule", "zbv"], "--pipeline-schedule zbv needs --pipeline-model-parallel-size >= 2"),
    (["--pipeline-schedule", "interleaved"], "--pipeline-schedule interleaved needs "
     "--num-layers-per-virtual-pipeline-stage (or --virtual-pipeline-model-parallel-size) and "
     "--pipeline-model-parallel-size >= 2"),
])
def test_virtual_stages_at_pipeline_size_1_are_one_line(argv, line, one_line, monkeypatch):
    assert one_line(lambda: _validate(argv, monkeypatch)).startswith(f"train.py: error: {line}")


@pytest.mark.parametrize("argv", [["--virtual-pipeline-model-parallel-size", "1"],
                                  ["--num-layers-per-virtual-pipeline-stage", "4"]])
def test_one_chunk_a_rank_at_pipeline_size_1_is_the_plain_layout_and_taken(argv, monkeypatch):
    """v = 1 (every layer in the one chunk) is the default layout: nothing to refuse."""
    assert _validate(argv, monkeypatch)[0].parallel.pipeline.v == 1


def test_virtual_stages_over_a_pipeline_are_still_taken(monkeypatch):
    run = _validate(["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
                     "--global-batch-size", "8"], monkeypatch, world=2)[0]
    assert run.parallel.pipeline.v == 2 and run.parallel.pipeline.kind.value == "interleaved"


# --- 2. DiLoCo with one replica: taken, one warning ------------------------------------------------------------------
@pytest.mark.parametrize("argv, world, why", [
    (["--diloco-inner-steps", "4"], 1, "data-parallel size 1"),
    (["--diloco-inner-steps", "4", "--diloco-replicas", "1", "--zero-stage", "1", "--global-batch-size", "8"], 2,
     "--diloco-replicas 1"),
])
def test_diloco_with_one_replica_runs_with_one_start_up_warning(argv, world, why, monkeypatch, capsys):
    run = _validate(argv, monkeypatch, world)[0]
    assert run.diloco.inner_steps == 4
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "--diloco-inner-steps" in ln]
    assert warned == [f"train.py: warning: --diloco-inner-steps 4 with one replica ({why}): nothing to average and "
                      f"no communication saved; the outer Nesterov step acts on the one replica's 4-step delta "
                      f"(Lookahead-like, docs/diloco.md); for replicas, give more DP ranks or --diloco-replicas "
                      f"R >= 2"]


def test_diloco_with_two_replicas_says_nothing(monkeypatch, capsys):
    _validate(["--diloco-inner-steps", "4", "--global-batch-size", "8"], monkeypatch, world=2)
    assert "--diloco-inner-steps" not in capsys.readouterr().err


# --- 3. hybrid models: its errors name its own word, not --model -----------------------------------------------------
@pytest.mark.parametrize("make, line", [
    (lambda d: str(d), "{p!r}: the directory has no config.json"),
    (lambda d: str(d / "missing"), "{p!r}: no such folder; give a folder holding a transformers config.json, or a "
                                   "preset (`hybrid models` lists them)"),
    (lambda d: (d / "config.json").write_text("{nope") and str(d), "{p}/config.json: not valid JSON"),
    (lambda d: (d / "config.json").write_text('{"model_type": "llama", "hidden_size": 0}') and str(d),
     "{p}/config.json: hidden_size must be a positive integer, got 0"),
])
def test_models_errors_name_the_folder_given_not_train_flags(make, line, tmp_path, one_line):
    path = make(tmp_path)
    got = one_line(lambda: hybrid_main(["models", path]))
    assert got.startswith(f"hybrid models: error: {line.format(p=path)}"), got
    assert "--model" not in got


def test_models_no_preset_hint_names_its_own_argument(one_line):
    assert one_line(lambda: hybrid_main(["models", "gpt3"])) == (
        "hybrid models: error: no preset 'gpt3'; did you mean 'gpt2'? (`hybrid models` lists them all; NAME may "
        "also be a folder holding a transformers config.json)")


# --- 4. Ctrl-C in hybrid calibrate -----------------------------------------------------------------------------------
def _calibrate_args(out: str) -> argparse.Namespace:
    from hybrid.planner.calibrate import CalibrationConfig
    return argparse.Namespace(out=out, ranks=1, backend="gloo", matmul_size=None, copy_bytes=None, sizes=None,
                              seconds=CalibrationConfig.seconds, base="cpu", func=None)


def _raise(error):
    def call(*a, **k):
        raise error
    return call


@pytest.mark.parametrize("where", ["measuring", "writing"])
def test_calibrate_ctrl_c_is_exit_130_one_line_and_no_profile(where, tmp_path, monkeypatch, one_line):
    """A KeyboardInterrupt while the ranks measure, or while the profile is written: status 130, one line saying
    what was measured and what to rerun, no file (not even the temporary beside it), the ranks stopped."""
    from hybrid.planner import calibrate as cal
    stopped, codes = [], []
    monkeypatch.setattr(cal, "ranks_leave_ctrl_c_to_this_process", lambda: 4242)  # the forkserver this run started
    monkeypatch.setattr(cal, "stop_ranks", stopped.append)
    if where == "measuring":
        monkeypatch.setattr(cal, "calibrate", _raise(KeyboardInterrupt))
    else:
        monkeypatch.setattr(cal, "calibrate", lambda cfg: {"format": cal.FORMAT, "hardware": {}})
        monkeypatch.setattr(cal.json, "dump", _raise(KeyboardInterrupt))
    out = str(tmp_path / "hw.json")
    monkeypatch.setattr("sys.argv", ["hybrid", "calibrate", "--ranks", "1", "--out", out])

    def call():
        try:
            cal.run(_calibrate_args(out))
        except SystemExit as e:
            codes.append(e.code)
            raise
    line = one_line(call)
    assert codes == [130] and stopped == [4242] and os.listdir(tmp_path) == []
    head, tail = line.split(" s of measuring ")
    assert head.startswith("hybrid calibrate: interrupted after ") and tail == (
        f"(any lines above are what the 1 gloo rank measured; stopped): nothing written to {out}; rerun "
        f"`hybrid calibrate --ranks 1 --out {out}` to the end to write the profile")


def test_ctrl_c_while_hybrid_imports_its_commands_is_one_line(monkeypatch, one_line):
    """Before any command runs (the sub-commands' imports take seconds: most of a short calibrate's Ctrl-C window on
    a loaded machine): 130 and one line, not Python's traceback through torch's imports."""
    import hybrid.cli
    codes = []
    monkeypatch.setattr(hybrid.cli, "build_parser", _raise(KeyboardInterrupt))

    def call():
        try:
            hybrid.cli.main(["calibrate"])
        except SystemExit as e:
            codes.append(e.code)
            raise
    assert one_line(call) == "hybrid: interrupted while starting, before any work: nothing was run or written"
    assert codes == [130]


def test_calibrate_starts_its_forkserver_deaf_to_ctrl_c_and_restores_its_own_handler(monkeypatch):
    """The forkserver (and every rank it forks) inherits SIGINT ignored; this process keeps its own handler, so
    it alone takes the Ctrl-C. One already running is left as it is (None)."""
    from multiprocessing import forkserver

    from hybrid.planner import calibrate as cal
    server = forkserver._forkserver
    seen = []

    def start():
        seen.append(signal.getsignal(signal.SIGINT))
        monkeypatch.setattr(server, "_forkserver_pid", 4242)
    monkeypatch.setattr(server, "_forkserver_pid", None)
    # a process that never started one (where this worker may have: hybrid.testing._forkserver would then read
    # the address and fd it kept as a fork's, and replace ensure_running)
    monkeypatch.setattr(server, "_forkserver_address", None)
    monkeypatch.setattr(server, "_forkserver_alive_fd", None)
    monkeypatch.setattr(server, "ensure_running", start)
    mine = signal.getsignal(signal.SIGINT)
    assert cal.ranks_leave_ctrl_c_to_this_process() == 4242
    assert seen == [signal.SIG_IGN] and signal.getsignal(signal.SIGINT) is mine
    monkeypatch.setattr(server, "ensure_running", lambda: None)
    assert cal.ranks_leave_ctrl_c_to_this_process() is None  # running already: not ours to stop


# --- 5. --shm-gather by name where it cannot run ---------------------------------------------------------------------
PAIR = "it pairs the 2 ranks of a ZeRO data-parallel group, and this run's group has"
DROP = "; drop the flag (the default takes the shared-memory gather wherever it runs, gloo's elsewhere)"


@pytest.mark.parametrize("argv, world, why", [
    ([], 1, f"{PAIR} 1 rank"),
    (["--global-batch-size", "16"], 4, f"{PAIR} 4 ranks"),
    (["--diloco-inner-steps", "2"], 2, f"{PAIR} 1 rank (ZeRO runs inside each DiLoCo replica: dp / R ranks)"),
    (["--powersgd-rank", "2", "--powersgd-start-iter", "2"], 2,
     "a gradient compressor (PowerSGD, 1-bit Adam) steps and gathers the parameters its own way"),
])
def test_explicit_shm_gather_where_it_cannot_run_is_one_line(argv, world, why, one_line, monkeypatch):
    line = one_line(lambda: _validate(["--zero-stage", "1", "--shm-gather"] + argv, monkeypatch, world))
    assert line == f"train.py: error: --shm-gather: {why}{DROP}"


@pytest.mark.parametrize("argv, world", [(["--shm-gather"], 2), (["--shm-gather", "--context-parallel-size", "2"], 2),
                                         ([], 4), ([], 1)])
def test_shm_gather_on_a_pair_or_by_default_is_taken_quietly(argv, world, monkeypatch, capsys):
    """The pair (dp 2, or dp 1 x cp 2: ZeRO's group is dp x cp) takes it; the default at any size says nothing."""
    run = _validate(["--zero-stage", "2", "--global-batch-size", "16"] + argv, monkeypatch, world)[0]
    assert run.zero.shm_gather and "shm" not in capsys.readouterr().err


def test_gpu_and_platform_reasons_are_named(tmp_path, monkeypatch):
    from hybrid.zero import shm
    assert shm.unusable_before_start(2, "cuda", False) == ("it pairs CPU ranks' host memory, and this run's "
                                                           "parameters are on the GPU (NCCL gathers there)")
    monkeypatch.setattr(shm.platform, "machine", lambda: "aarch64")  # no TSO: the module's ordering argument fails
    assert shm.unusable_before_start(2, "cpu", False, str(tmp_path)) == \
        f"it needs x86-64 Linux with {tmp_path}; this is aarch64"
    monkeypatch.setattr(shm.platform, "machine", lambda: "x86_64")
    assert shm.unusable_before_start(2, "cpu", False, str(tmp_path / "no")) == \
        f"it needs x86-64 Linux with {tmp_path / 'no'}; this is x86_64 without {tmp_path / 'no'}"
    assert shm.unusable_before_start(2, "cpu", False, str(tmp_path)) is None


class _PairAlone:
    """Rank 0 of a 2-rank gloo pair whose peer always agrees (all_reduce doubles): SharedFlats.open's set-up runs
    in this process, with no peer file to attach."""
    size, rank, host_staged = 2, 0, True

    def all_reduce(self, t, tag=None):
        t.mul_(2)


@pytest.mark.parametrize("numels, why", [
    ([2**50], "{d} has <n> MiB free and the pair's files need 8589934592 MiB"),  # 2 files of 2**50 fp32
    ([1024], "the peer rank's file is not in this rank's {d} (the pair on two hosts, or the peer could not make its "
             "file)"),
])
def test_the_set_ups_own_fallback_gives_its_reason(numels, why, tmp_path, monkeypatch):
    """What only the set-up can tell -- the room in /dev/shm, the peer's file on this host -- comes back through
    `why` (ZeroOptimizer.shm_gather_declined; train.py prints it at start), the set-up still falling back."""
    import torch

    from hybrid.zero import shm
    monkeypatch.setattr(shm.platform, "machine", lambda: "x86_64")
    got: list[str] = []
    assert shm.SharedFlats.open(_PairAlone(), numels, torch.float32, shm_dir=str(tmp_path), why=got) is None
    assert len(got) == 1 and re.fullmatch(re.escape(why.format(d=tmp_path)).replace("<n>", r"\d+"), got[0]), got
    assert os.listdir(tmp_path) == []  # nothing left behind


# --- 6. hybrid plan's slow-link table: a default named as a default --------------------------------------------------
PLAN = ["plan", "--model", "tiny-gpt2", "--gpus", "4", "--global-batch-size", "16", "--seq-length", "128",
        "--inter-dc-bandwidth", "1"]


@pytest.mark.parametrize("argv, line", [
    (["--diloco-inner-steps", "6"], "the default --diloco-fragments 4 (not given) must divide --diloco-inner-steps 6 "
                                    "(the Streaming DiLoCo row syncs 1/K of the model every H/K steps): give "
                                    "--diloco-fragments K dividing 6 (e.g. 2, 3, 6)"),
    (["--diloco-fragments", "3"], "--diloco-fragments 3 must divide the default --diloco-inner-steps 100 (not given)"),
    (["--diloco-fragments", "3", "--diloco-inner-steps", "8"], "--diloco-fragments 3 must divide --diloco-inner-steps "
                                                               "8 "),
])
def test_plan_streaming_row_names_defaults_as_defaults(argv, line, one_line, monkeypatch):
    import hybrid.planner.cli as plan_cli
    monkeypatch.setattr(plan_cli, "search", lambda *a, **k: pytest.fail("the flags are checked before the search"))
    assert one_line(lambda: hybrid_main(PLAN + argv)).startswith(f"hybrid plan: error: {line}")


def test_train_sync_delay_names_the_fragments_only_when_given(one_line, monkeypatch):
    line = one_line(lambda: _validate(["--diloco-inner-steps", "2", "--diloco-fragment-sync-delay", "2",
                                       "--global-batch-size", "8"], monkeypatch, world=2))
    assert line == ("train.py: error: --diloco-fragment-sync-delay 2 must be in [0, H / K) = [0, 2) "
                    "(--diloco-inner-steps 2, one fragment (--diloco-fragments 1)): one fragment in flight at a time")
