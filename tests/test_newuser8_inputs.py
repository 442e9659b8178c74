"""Eighth-round new-user findings, on the newest features (MoE, DiLoCo, PowerSGD / 1-bit Adam, the zero-bubble and
interleaved schedules, `hybrid plan`'s slow-link table and --hardware, `hybrid convert`): inputs that were accepted
and then ignored, refused only after the process group, or answered with a misleading line -- each now one line
naming the flag and the fix, before any process group or search, with nothing written.

All in this process, one rank, no process group: train.py's `validate` and `hybrid.cli.main`."""

from __future__ import annotations

import json
import os

import pytest

import hybrid.cli
from hybrid.testing_inputs import OneLine
from hybrid.train.main import validate

pytestmark = pytest.mark.usefixtures("one_process")  # tests/conftest.py: python, not torchrun: world 1


def _world(monkeypatch, n: int) -> None:
    """torchrun's environment for rank 0 of `n` on one node: validate then checks the layout of an n-rank job."""
    for name, value in (("WORLD_SIZE", str(n)), ("RANK", "0"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", str(n)),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)


def _one_line(call, capsys) -> str:
    """The shared bad-input check (hybrid/testing_inputs.py): non-zero exit, one line, no traceback, no group."""
    return OneLine(capsys)(call)


def _has(line: str, *pieces: str) -> None:
    for piece in pieces:
        assert piece in line, line


# --- 1. Megatron's model-shape and short flags: the config field or the flag, not a misleading near spelling -------
@pytest.mark.parametrize("argv, want, not_want", [
    (["--num-experts", "8"], ["--num-experts: the model's shape comes from --model", "num_local_experts"], "see --help"),
    (["--moe-router-topk", "2"], ["num_experts_per_tok"], "see --help"),
    (["--num-layers", "4"], ["num_hidden_layers"], "--num-layers-per-virtual-pipeline-stage"),  # was "did you mean"
    (["--hidden-size", "64"], ["write hidden_size there"], "see --help"),
    (["--ep", "2"], ["--ep: train.py's flag is --expert-model-parallel-size"], "--help?"),  # was "did you mean --help?"
    (["--tp", "2"], ["--tensor-model-parallel-size"], "see --help"),
    (["--merge-file", "merges.txt"], ["--tokenizer-type HuggingFaceTokenizer"], "--metrics-file"),
    (["--use-distributed-optimizer"], ["--zero-stage 1"], "see --help"),
])
def test_megatron_flag_train_py_takes_elsewhere_names_where(argv, want, not_want, capsys):
    line = _one_line(lambda: validate(argv), capsys)
    assert line.startswith(f"train.py: error: unrecognized arguments: {argv[0]}; ")
    _has(line, *want)
    assert not_want not in line, line


def test_a_hinted_flag_beside_a_typo_gets_both(capsys):
    line = _one_line(lambda: validate(["--num-experts", "8", "--lr-warm", "3"]), capsys)
    _has(line, "num_local_experts", "did you mean --lr-warmup-iters?")


def test_help_is_never_the_suggestion():
    from hybrid.cliutil import _suggest
    assert _suggest("unrecognized arguments: --ep", ["-h", "--help", "--lr"]) == "; see --help"


# --- 2. MoE: a dispatcher with nothing to dispatch, an expert bias that never moves --------------------------------
def test_moe_dispatcher_at_ep1_is_one_line(capsys):
    """At EP 1 layer.py's _dispatch runs the local path whichever dispatcher is named: allgather was accepted and
    ignored."""
    line = _one_line(lambda: validate(["--model", "tiny-mixtral", "--moe-token-dispatcher-type", "allgather"]),
                     capsys)
    _has(line, "train.py: error: --moe-token-dispatcher-type allgather", "--expert-model-parallel-size 1",
         "give --expert-model-parallel-size > 1 or drop --moe-token-dispatcher-type")


def test_moe_dispatcher_with_ep_still_passes(monkeypatch):
    _world(monkeypatch, 2)
    run = validate(["--model", "tiny-mixtral", "--expert-model-parallel-size", "2",
                    "--moe-token-dispatcher-type", "allgather"])[0]
    assert run.moe.dispatcher.value == "allgather" and run.moe.expert_parallel == 2


def test_moe_expert_bias_with_a_zero_rate_is_one_line(capsys):
    """b <- b + u sign(mean load - load): at u = 0 the bias stays 0 and the flag did nothing."""
    argv = ["--model", "tiny-mixtral", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "0"]
    line = _one_line(lambda: validate(argv), capsys)
    _has(line, "--moe-router-bias-update-rate 0 keeps the bias at zero", "drop --moe-router-enable-expert-bias")
    assert validate(argv[:3])[0].moe.bias_update_rate == 1e-3


def test_onebit_adam_with_an_moe_model_is_refused_before_the_process_group(capsys, monkeypatch):
    """It passed every check and raised in reduction.py's build_optimizer, after init_process_group."""
    _world(monkeypatch, 2)
    argv = ["--model", "tiny-mixtral", "--optimizer", "onebit-adam", "--onebit-freeze-iters", "5"]
    line = _one_line(lambda: validate(argv), capsys)
    _has(line, "train.py: error: --optimizer onebit-adam does not run with an MoE model", "use --optimizer adam")


# --- 3. compression and DiLoCo that would never engage within --train-iters ---------------------------------------
@pytest.mark.parametrize("argv, want", [
    (["--powersgd-rank", "2", "--train-iters", "20"],  # the default start is torch's 1000
     ["--powersgd-start-iter 1000 (the default, torch's start_powerSGD_iter)", "--train-iters 20 ends first",
      "2 <= N < 20"]),
    (["--powersgd-rank", "2", "--powersgd-start-iter", "20", "--train-iters", "20"], ["--powersgd-start-iter 20 plain"]),
    (["--optimizer", "onebit-adam", "--clip-grad", "0", "--train-iters", "20"],
     ["--onebit-freeze-iters 100 (the default)", "the run would be plain Adam", "--onebit-freeze-iters N < 20"]),
    (["--diloco-inner-steps", "100", "--train-iters", "10"],
     ["--diloco-inner-steps 100 is more than --train-iters 10", "never meet", "or --save DIR"]),
])
def test_a_method_that_starts_after_the_last_step_is_one_line(argv, want, capsys, monkeypatch):
    """Each was accepted and the run trained uncompressed (or the replicas apart) to the end."""
    _world(monkeypatch, 2)
    line = _one_line(lambda: validate(argv), capsys)
    assert line.startswith("train.py: error: ")
    _has(line, *want)


def test_onebit_freeze_from_the_deepspeed_json_is_named_by_its_key(tmp_path, capsys, monkeypatch):
    _world(monkeypatch, 2)
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3, "freeze_step": 5}}}))
    line = _one_line(lambda: validate(["--deepspeed-config", str(ds), "--clip-grad", "0", "--train-iters", "3"]),
                     capsys)
    _has(line, "--deepspeed-config's freeze_step 5", "write a freeze_step < 3")


@pytest.mark.parametrize("argv", [
    ["--powersgd-rank", "2", "--powersgd-start-iter", "19", "--train-iters", "20"],  # the last step compresses
    ["--optimizer", "onebit-adam", "--clip-grad", "0", "--onebit-freeze-iters", "19", "--train-iters", "20"],
    ["--diloco-inner-steps", "10", "--train-iters", "10"],  # one outer sync, at the end
    ["--powersgd-rank", "2", "--train-iters", "20", "--save", "SAVE"],  # a later, longer run continues
    ["--diloco-inner-steps", "100", "--train-iters", "10", "--save", "SAVE"],
])
def test_a_method_that_engages_or_is_saved_for_a_longer_run_still_passes(argv, tmp_path, monkeypatch):
    _world(monkeypatch, 2)
    validate([str(tmp_path / "ck") if a == "SAVE" else a for a in argv])


# --- 4. pipeline flags at one stage ---------------------------------------------------------------------------
@pytest.mark.parametrize("argv, want", [
    (["--pipeline-schedule", "interleaved"], "--pipeline-schedule interleaved needs "
     "--num-layers-per-virtual-pipeline-stage"),  # pp 1: it ran the plain step (zbh1 was refused for the same)
    (["--pipeline-partition", "balanced"], "--pipeline-partition balanced splits the layers over the pipeline's "
     "stages, and there is one"),
    (["--pipeline-layers-per-stage", "4"], "--pipeline-layers-per-stage splits the layers"),
])
def test_pipeline_flag_with_one_stage_is_one_line(argv, want, capsys):
    assert _one_line(lambda: validate(argv), capsys).startswith(f"train.py: error: {want}")


def test_pipeline_flags_with_stages_still_pass(monkeypatch):
    _world(monkeypatch, 2)  # pp 1 x v 2 is refused since round 15 (tests/test_inputs15_fixes.py): pp 2 x v 2
    plan = validate(["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "interleaved",
                     "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "8"])[0]
    assert plan.parallel.pipeline.v == 2
    run = validate(["--pipeline-model-parallel-size", "2", "--pipeline-partition", "balanced"])[0]
    assert len(run.parallel.pipeline.stages) == 2


# --- 5. validation every N steps, and no validation -----------------------------------------------------------
def test_eval_interval_with_no_validation_is_one_line(capsys):
    line = _one_line(lambda: validate(["--eval-interval", "5", "--eval-iters", "0"]), capsys)
    _has(line, "--eval-interval 5 sets how often validation runs, and --eval-iters 0 turns it off")
    assert validate(["--eval-iters", "0"])[0].data.eval_iters == 0
    assert validate(["--eval-interval", "5"])[0].data.eval_interval == 5


# --- 6. hybrid plan: --gpu beside --hardware, slow-link rows without a link, a preset given as --hardware ----------
PLAN = ["plan", "--model", "tiny-gpt2", "--gpus", "4", "--global-batch-size", "8", "--seq-length", "32"]


def _no_search(*a, **k):
    raise AssertionError("the flags are checked before the search")


@pytest.mark.parametrize("extra, want", [
    (["--diloco-inner-steps", "8"], ["--diloco-inner-steps sets a row of the slow-link table",
                                     "--inter-dc-bandwidth GBPS"]),
    (["--powersgd-rank", "8"], ["--powersgd-rank sets a row"]),
    (["--diloco-fragment-sync-delay", "1"], ["--diloco-fragment-sync-delay sets a row"]),
    (["--hardware", "h100"], ["--hardware 'h100' is not a file", "(for the device preset: --gpu h100-80g)"]),
])
def test_plan_flag_that_would_be_ignored_is_one_line(extra, want, capsys, monkeypatch):
    """The method flags set the slow-link table's rows only; without a link they were accepted and unread."""
    monkeypatch.setattr("hybrid.planner.cli.search", _no_search)
    line = _one_line(lambda: hybrid.cli.main(PLAN + extra), capsys)
    assert line.startswith("hybrid plan: error: ")
    _has(line, *want)


def test_plan_gpu_beside_a_hardware_profile_is_one_line(tmp_path, capsys, monkeypatch):
    """--gpu h100-80g with --hardware cpu.json planned for the profile's device and ignored --gpu."""
    monkeypatch.setattr("hybrid.planner.cli.search", _no_search)
    profile = tmp_path / "hw.json"
    profile.write_text("{}")
    line = _one_line(lambda: hybrid.cli.main(PLAN + ["--gpu", "h100-80g", "--hardware", str(profile)]), capsys)
    _has(line, f"--gpu h100-80g and --hardware {profile} both name the device; give one of them")


def test_plan_slow_link_with_scan_is_one_line(capsys, monkeypatch):
    monkeypatch.setattr("hybrid.planner.cli.search", _no_search)
    argv = [a for a in PLAN if a not in ("--gpus", "4")] + ["--scan-gpus", "2,4", "--powersgd-rank", "8"]
    _has(_one_line(lambda: hybrid.cli.main(argv), capsys), "--powersgd-rank (the slow-link table) does not run "
         "with --scan-gpus")


def test_plan_slow_link_rows_take_the_flags_and_defaults(capsys):
    assert hybrid.cli.main(PLAN + ["--top", "1", "--inter-dc-bandwidth", "1", "--diloco-inner-steps", "8"]) in (0, None)
    out = capsys.readouterr().out
    assert "diloco H 8" in out and "powersgd r 4" in out  # the given H, the default rank
    assert hybrid.cli.main(PLAN + ["--top", "1", "--gpu", "h100-80g"]) in (0, None)


def test_train_hardware_given_a_preset_name_names_peak_tflops(capsys):
    from hybrid.planner.hardware import hardware
    line = _one_line(lambda: validate(["--hardware", "h100"]), capsys)
    _has(line, "--hardware 'h100' is not a file",
         f"--peak-tflops {hardware('h100-80g').peak_tflops:g}")


# --- 7. hybrid convert: the reason a --to hf flag gives ---------------------------------------------------------
@pytest.mark.parametrize("flags, why", [
    (["--iteration", "3"], "it picks an iteration of a hybrid SRC, not of a transformers one"),
    (["--max-shard-size", "1KB"], "a hybrid checkpoint is written as train.py saves it, one file per rank"),
    (["--dtype", "bf16"], "a hybrid checkpoint holds fp32 master weights"),
])
def test_convert_to_hybrid_flag_names_its_own_reason(flags, why, tmp_path, capsys):
    """--iteration and --max-shard-size said '(a hybrid checkpoint holds fp32 master weights)', --dtype's reason."""
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 2,
                                                 "vocab_size": 256, "n_positions": 16}))
    (src / "model.safetensors").write_bytes(b"")
    line = _one_line(lambda: hybrid.cli.main(["convert", str(src), str(tmp_path / "out"), *flags]), capsys)
    assert line == f"hybrid convert: error: {flags[0]} applies to --to hf only ({why}); drop {flags[0]}"
    assert sorted(os.listdir(tmp_path)) == ["hf"]


# --- 8. evaluation flags for splits --split leaves empty ------------------------------------------------------
@pytest.mark.parametrize("argv, want", [
    (["--split", "100,0,0", "--eval-interval", "5"], "--eval-interval 5 validates on the valid split, and --split "
     "'100,0,0' gives it no share"),
    (["--split", "99,0,1", "--eval-interval", "5"], "--eval-interval 5 validates on the valid split"),
    (["--split", "100,0,0", "--eval-iters", "5"], "--eval-iters 5 evaluates the valid and test splits, and --split "
     "'100,0,0' gives them no share"),
])
def test_evaluation_flag_for_an_empty_split_is_one_line(argv, want, capsys):
    """evaluate.py skips a split with no share: the flag was accepted and no validation line ever came."""
    assert _one_line(lambda: validate(argv), capsys).startswith(f"train.py: error: {want}")


@pytest.mark.parametrize("argv", [
    ["--split", "100,0,0"],  # no evaluation flag: the default --eval-iters finds nothing to read, as Megatron's
    ["--split", "100,0,0", "--eval-iters", "0"],
    ["--split", "99,0,1", "--eval-iters", "5"],  # the final test evaluation reads the test split
    ["--split", "98,2,0", "--eval-interval", "5"],
])
def test_evaluation_flags_with_a_split_to_read_still_pass(argv):
    validate(argv)


def test_calibrate_sizes_with_one_rank_is_one_line(tmp_path, capsys, monkeypatch):
    """`hybrid calibrate --ranks 1 --sizes 8,64` accepted --sizes and timed no collective (one rank has none to
    time). Refused before anything is spawned; with --ranks 2 the same --sizes reach the run."""
    spawned = []
    monkeypatch.setattr("hybrid.planner.calibrate.calibrate", lambda cfg: spawned.append(cfg) or None)
    out = str(tmp_path / "hw.json")
    line = _one_line(lambda: hybrid.cli.main(["calibrate", "--ranks", "1", "--sizes", "8,64", "--out", out]), capsys)
    _has(line, "--sizes: --ranks 1 times no collectives", "drop --sizes or give --ranks 2")
    assert spawned == [] and not os.path.exists(out)
