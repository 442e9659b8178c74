"""Round 13's new-user pass (round 12's new flags and scripts, bad inputs): each finding's input ends in one line
naming the flag and the fix, before any search, spawn or write -- or, where the input was good, does what the line
said it would.

1. `hybrid plan` with Megatron-core's split flags that no pipeline can hold (an accounting flag beside a layer
   count, more layers on the first / last rank than the model has) planned pp 1 without a word: every pp > 1
   layout was rejected on it, and pp 1 ignores a split.
2. bench_comm_efficient.py: an unknown --model, a --tp not dividing the heads, a --pp above the layers, a --seq
   above the positions were each rank's traceback after the spawn; an MoE model ran the AdamW and PowerSGD rows
   (minutes) and then failed in the 1-bit Adam row; --simulated-dp-bandwidth -1, --lr inf, --sgd-momentum 1 ran.
   gradient_spectrum.py: an unknown --model was a traceback, --lr nan ran.
3. bench_zero.py / bench_checkpoint.py / bench_collectives.py --quick without --out replaced the measured
   docs/results table with the smoke table; bench_collectives' bad --out was a traceback; bench_zero's
   --zero3-only / --overlap-only / --ddp-only together ran no row and wrote a table of "not run";
   bench_planner_mainjob.py found a bad --hardware, too few logged intervals, an --account file or a --warmup
   leaving out every iteration after the calibration and the 8-rank run (minutes); bench_comm_efficient's and
   bench_moe's bad --out, plot_comm_efficient's missing / non-JSON / foreign --ce were tracebacks, and its panel
   was titled "TP 2 x PP 2 x DP 2" whatever the run; `python -m hybrid.diloco.bench --json` into a missing folder
   failed after the training (argparse's parser, plain open()).
4. train.py: --sgd-momentum 1 (a velocity that never forgets) ran; Megatron's fp16 loss-scale flags were
   "unrecognized ... see --help" with nothing about where the scale is set.
5. `hybrid models path/to/hf_model` said "no preset" while its own line says --model takes such a folder.
6. ZeroConfig(step_in_gather_order="false") stepped in gather order (a truthy string); other fields alike.
   OptimizerConfig(decay_style="cosin") ran cosine and optimizer="adamw" ran Adam without a word (no check at all).

In this process (conftest's `one_line`: one line, no traceback, no process group); nothing is searched, spawned
or measured (each entry point past its checks is replaced by one that fails the test)."""

from __future__ import annotations

import os
import sys

import pytest

from hybrid.cli import main as hybrid_main

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
sys.path.insert(0, SCRIPTS)

import bench_checkpoint  # noqa: E402
import bench_collectives  # noqa: E402
import bench_comm_efficient  # noqa: E402
import bench_moe  # noqa: E402
import bench_planner_mainjob  # noqa: E402
import bench_zero  # noqa: E402
import gradient_spectrum  # noqa: E402
import plot_comm_efficient  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_process")


def _never(*a, **k):
    raise AssertionError("the bad input reached the work")


# --- 1. hybrid plan: a split no pipeline can hold -------------------------------------------------------------------
PLAN = ["plan", "--model", "tiny-gpt2", "--gpus", "4", "--global-batch-size", "16", "--seq-length", "128"]


@pytest.mark.parametrize("flags, line", [
    (["--account-for-embedding-in-pipeline-split", "--decoder-last-pipeline-num-layers", "2"],
     "hybrid plan: error: --account-for-embedding-in-pipeline-split and --decoder-last-pipeline-num-layers: the "
     "accounting flags and the first / last layer counts are exclusive (as in Megatron-core); give one kind"),
    (["--decoder-first-pipeline-num-layers", "3", "--decoder-last-pipeline-num-layers", "2"],
     "hybrid plan: error: --decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers: 5 layers on "
     "the first / last pipeline rank, more than the model's 4; give at most 4 in all"),
])
def test_plan_split_no_pipeline_can_hold_is_one_line_before_the_search(flags, line, one_line, monkeypatch):
    import hybrid.planner.cli as plan_cli
    monkeypatch.setattr(plan_cli, "search", _never)
    assert one_line(lambda: hybrid_main(PLAN + flags)) == line


def test_plan_split_that_a_pipeline_holds_still_reaches_the_search(monkeypatch):
    """The check refuses only what no pp can hold: 2 + 2 of tiny-gpt2's 4 layers is pp 2's split."""
    import hybrid.planner.cli as plan_cli

    class Reached(Exception):
        pass

    def reached(work, *a, **k):
        raise Reached(work.pipeline_split)
    monkeypatch.setattr(plan_cli, "search", reached)
    with pytest.raises(Reached):
        hybrid_main(PLAN + ["--decoder-first-pipeline-num-layers", "2", "--decoder-last-pipeline-num-layers", "2"])


def test_megatron_split_names_only_the_counts_given():
    """A pp that cannot hold the split names the counts given ('3 on the first rank'), not 'None' for the other."""
    from hybrid.planner.layout import PipelineSplit, megatron_split
    with pytest.raises(ValueError) as e:
        megatron_split(12, 2, 2, PipelineSplit(first=3))
    assert str(e.value) == ("--decoder-first-pipeline-num-layers: pp 2 x v 2 cannot hold 3 on the first rank and the "
                            "other 9 layers evenly on 1 middle ranks (each rank's layers a multiple of v)")


# --- 2. the comm-efficient bench and the gradient spectrum: the model and the numbers before any rank --------------
@pytest.mark.parametrize("argv, fragment", [
    (["--model", "gpt9"], "--model 'gpt9' is neither a preset nor a directory with config.json; did you mean 'gpt2'?"),
    (["--tp", "3"], "--tp 3 does not divide the 4 attention heads; use a divisor of 4"),
    (["--pp", "8"], "--pp 8 exceeds the 4 layers; use at most 4 stages"),
    (["--model", "tiny-gpt2", "--seq", "512"], "--seq 512 exceeds the model's 256 positions; use at most 256"),
    (["--model", "tiny-mixtral"], "--model tiny-mixtral: the 1-bit Adam row does not run with MoE experts"),
    (["--simulated-dp-bandwidth", "-1"], "argument --simulated-dp-bandwidth: expected a number >= 0.0, got -1"),
    (["--lr", "inf"], "argument --lr: expected a finite number, got 'inf'"),
    (["--sgd-momentum", "1"], "argument --sgd-momentum: expected a number in [0.0, 1.0), got 1"),
])
def test_comm_efficient_bench_bad_model_or_number_is_one_line_before_any_rank(argv, fragment, one_line,
                                                                              monkeypatch):
    monkeypatch.setattr(bench_comm_efficient, "measure", _never)
    line = one_line(lambda: bench_comm_efficient.main(argv))
    assert line.startswith("bench_comm_efficient.py: error: ") and fragment in line, line


def test_comm_efficient_bench_moe_model_without_the_onebit_row_is_taken(monkeypatch):
    """tiny-mixtral's AdamW and PowerSGD rows run (measured here: 40 s, --quick); only the 1-bit Adam row is not."""
    class Reached(Exception):
        pass

    def reached(args):
        raise Reached(args.rows)
    monkeypatch.setattr(bench_comm_efficient, "measure", reached)
    with pytest.raises(Reached) as e:
        bench_comm_efficient.main(["--model", "tiny-mixtral", "--rows", "AdamW,PowerSGD"])
    assert e.value.args[0] == ["AdamW", "PowerSGD"]


@pytest.mark.parametrize("argv, fragment", [
    (["--model", "gpt9"], "--model 'gpt9' is neither a preset nor a directory with config.json"),
    (["--lr", "nan"], "argument --lr: expected a finite number, got 'nan'"),
])
def test_gradient_spectrum_bad_model_or_lr_is_one_line(argv, fragment, one_line, monkeypatch):
    monkeypatch.setattr("models.build_model", _never)
    line = one_line(lambda: gradient_spectrum.main(argv + ["--steps", "1"]))
    assert line.startswith("gradient_spectrum.py: error: ") and fragment in line, line


# --- 3. a smoke run never replaces a measured table ------------------------------------------------------------------
@pytest.mark.parametrize("module, parse, table", [
    (bench_zero, bench_zero.parse_args, "bench_zero.md"),
    (bench_checkpoint, bench_checkpoint.parse_args, "bench_checkpoint.md"),
    (bench_collectives, bench_collectives.parse, "bench_collectives.md"),
])
def test_quick_without_out_is_one_line_and_the_measured_table_stays(module, parse, table, one_line):
    measured = os.path.join(SCRIPTS, "..", "docs", "results", table)
    stamp = (lambda: os.stat(measured).st_mtime_ns if os.path.exists(measured) else None)
    before = stamp()
    line = one_line(lambda: parse(["--quick"]))
    assert line.startswith(f"{module.__name__}.py: error: --quick measures nothing: give --out FILE (without it the "
                           f"smoke table would replace the measured ") and line.endswith(f"{table})"), line
    assert stamp() == before
    assert parse(["--quick", "--out", os.path.join("/tmp", "x.md")]).out == "/tmp/x.md"  # named: taken


def test_bench_collectives_bad_out_is_the_parsers_line(tmp_path, one_line):
    line = one_line(lambda: bench_collectives.parse(["--out", str(tmp_path / "no" / "x.md")]))
    assert line == (f"bench_collectives.py: error: --out '{tmp_path}/no/x.md': its directory {tmp_path}/no does not "
                    f"exist; create it first")


def test_bench_zero_two_only_flags_are_one_line(one_line):
    line = one_line(lambda: bench_zero.parse_args(["--ddp-only", "--zero3-only", "--out", "/tmp/x.md"]))
    assert line == ("bench_zero.py: error: --zero3-only and --ddp-only each pick one table's rows (together: none); "
                    "give one of them")


@pytest.mark.parametrize("argv, line", [
    (["--iters", "10"], "--iters 10 logs 0 step-time lines at --log-interval 20; the report needs 2 (the first is "
                        "warm-up): give --iters >= 40 or a smaller --log-interval"),
    (["--log-interval", "0"], "argument --log-interval: expected an integer >= 1, got 0"),
    (["--hardware", "{d}/hw.json"], "--hardware {d}/hw.json: not valid JSON (Expecting value at line 1 column 1)"),
    (["--account", "{d}/hw.json"], "--account '{d}/hw.json' exists and is not a directory"),
    (["--account", "{d}/acc", "--warmup", "40"], "--warmup 40 leaves out all 40 accounted iterations (--account runs "
                                                 "min(--iters, 40)); give --warmup < 40"),
])
def test_mainjob_bench_bad_input_is_one_line_before_the_calibration(argv, line, tmp_path, monkeypatch, one_line):
    import subprocess
    for name in ("run", "Popen"):
        monkeypatch.setattr(subprocess, name, _never)
    (tmp_path / "hw.json").write_text("not json")
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    assert one_line(lambda: bench_planner_mainjob.main(argv)) == \
        "bench_planner_mainjob.py: error: " + line.replace("{d}", str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["hw.json"]


@pytest.mark.parametrize("call", [
    lambda out: bench_comm_efficient.main(["--out", out]),
    lambda out: bench_comm_efficient.main(["--json", out]),
    lambda out: bench_moe.main(["--out", out]),
    lambda out: plot_comm_efficient.main(["--ce", "x.json", "--out", out]),
])
def test_bench_bad_out_is_the_parsers_line_not_a_traceback(call, tmp_path, monkeypatch, one_line):
    monkeypatch.setattr(bench_comm_efficient, "measure", _never)
    monkeypatch.setattr(bench_moe, "bench_layer", _never)
    out = str(tmp_path / "no" / "x.md")
    line = one_line(lambda: call(out))
    assert line.endswith(f": error: --out {out!r}: its directory {tmp_path / 'no'} does not exist; create it first") \
        or line.endswith(f": error: --json {out!r}: its directory {tmp_path / 'no'} does not exist; create it first"), \
        line


def test_bench_moe_negative_warmup_is_one_line(monkeypatch, one_line):
    monkeypatch.setattr(bench_moe, "bench_layer", _never)
    assert one_line(lambda: bench_moe.main(["--warmup", "-1"])) == \
        "bench_moe.py: error: argument --warmup: expected an integer >= 0, got -1"


@pytest.mark.parametrize("text, want", [
    (None, "--ce '{d}/ce.json': cannot read it (No such file or directory)"),
    ("{", "--ce '{d}/ce.json' is not JSON; give scripts/bench_comm_efficient.py --json's output"),
    ('{"rows": []}', "--ce '{d}/ce.json' is not scripts/bench_comm_efficient.py --json's output"),
    ('[{"method": "x", "losses": [1]}]', "--ce '{d}/ce.json' is not scripts/bench_comm_efficient.py --json's output"),
])
def test_plot_comm_efficient_unreadable_or_foreign_ce_is_one_line(text, want, tmp_path, one_line):
    if text is not None:
        (tmp_path / "ce.json").write_text(text)
    line = one_line(lambda: plot_comm_efficient.main(["--ce", str(tmp_path / "ce.json"), "--out",
                                                      str(tmp_path / "c.png")]))
    assert line == "plot_comm_efficient.py: error: " + want.replace("{d}", str(tmp_path))
    assert not (tmp_path / "c.png").exists()


def test_plot_comm_efficient_titles_the_run_its_file_records():
    assert plot_comm_efficient._ce_title({"model": "tiny-qwen2", "tp": 1, "pp": 1, "dp": 2}) == \
        "tiny-qwen2, TP 1 x PP 1 x DP 2: gradient compression"


def test_diloco_bench_json_into_a_missing_folder_is_one_line_before_training(tmp_path, monkeypatch, one_line):
    from hybrid.diloco import bench as diloco_bench
    monkeypatch.setattr(diloco_bench, "rows", _never)
    out = str(tmp_path / "no" / "d.json")
    assert one_line(lambda: diloco_bench.main(["--json", out])) == (
        f"python -m hybrid.diloco.bench: error: --json {out!r}: its directory {tmp_path / 'no'} does not exist; "
        f"create it first")


# --- 4. train.py: SGD's momentum, Megatron's loss-scale flags ---------------------------------------------------
@pytest.mark.parametrize("argv, line", [
    (["--optimizer", "sgd", "--sgd-momentum", "1"], "train.py: error: --sgd-momentum must be in [0, 1), got 1.0"),
    (["--fp16", "--initial-loss-scale", "4096"],
     "train.py: error: unrecognized arguments: --initial-loss-scale; --initial-loss-scale: the fp16 loss scale is "
     "dynamic (from 2^16, halved on an overflow, doubled after 1000 clean steps); set fp16.initial_scale_power (the "
     "power of two it starts at) in a --deepspeed-config JSON"),
    (["--fp16", "--loss-scale", "128"],
     "train.py: error: unrecognized arguments: --loss-scale; --loss-scale: a static loss scale is not implemented: "
     "the fp16 loss scale is dynamic; its start is fp16.initial_scale_power in a --deepspeed-config JSON; drop the "
     "flag"),
    (["--fp16", "--min-loss-scale", "1"], "set fp16.min_loss_scale in a --deepspeed-config JSON"),
    (["--fp16", "--loss-scale-window", "500"], "set fp16.loss_scale_window in a --deepspeed-config JSON"),
    (["--fp16", "--hysteresis", "2"], "--hysteresis: not implemented: the fp16 loss scale halves at the first "
                                      "overflow (as DeepSpeed's at hysteresis 1); drop the flag"),
])
def test_train_sgd_momentum_and_megatron_loss_scale_flags_are_one_line(argv, line, one_line):
    from hybrid.train.main import validate
    got = one_line(lambda: validate(argv))
    assert got == line or (got.startswith("train.py: error: unrecognized arguments: ") and got.endswith(line)), got


def test_the_loss_scale_hint_states_the_engines_defaults():
    """The hint's numbers are the engine's: start 2^16, window 1000 (hybrid/zero/config.ZeroConfig)."""
    from hybrid.zero import ZeroConfig
    z = ZeroConfig()
    assert (z.initial_loss_scale, z.loss_scale_window) == (2.0**16, 1000)


# --- 5. hybrid models FOLDER --------------------------------------------------------------------------------------
def test_models_of_a_transformers_folder_shows_that_model(tmp_path, capsys):
    """A GPT-2 of 2 layers, h 64, vocab 256, 128 positions: 2 x 12 h^2 + 13 h (weights and biases of a block)
    + (256 + 128) h + 2 h (final LayerNorm) = 123,648 parameters, tied head -> 0.1M."""
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, '
                                          '"vocab_size": 256, "n_positions": 128}')
    hybrid_main(["models", str(tmp_path), "tiny-gpt2"])
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines()[1:]]
    assert rows[0] == [str(tmp_path), "gpt2", "0.1M", "2", "64", "4", "4", "256"]
    assert rows[1][0] == "tiny-gpt2" and len(rows) == 2
    from models import load_config
    assert load_config(str(tmp_path)).num_parameters == 2 * (12 * 64 * 64 + 13 * 64) + (256 + 128) * 64 + 2 * 64


def test_models_of_a_folder_with_a_bad_config_is_one_line(tmp_path, one_line):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "n_layer": "two"}')
    line = one_line(lambda: hybrid_main(["models", str(tmp_path)]))
    assert line == (f'hybrid models: error: {tmp_path}/config.json: n_layer must be a positive integer, '
                    f'got "two"')  # no "--model": this command takes the folder as NAME (round 15)
    assert one_line.out == ""


# --- 6. ZeroConfig's fields typed ---------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value, fragment", [
    ("step_in_gather_order", "false", "ZeroConfig.step_in_gather_order must be True or False, got 'false'"),
    ("overlap_param_gather", 0, "ZeroConfig.overlap_param_gather must be True or False, got 0"),
    ("shm_gather", "yes", "ZeroConfig.shm_gather must be True or False, got 'yes'"),  # a switch added after the check
    ("precision", "bf16", "ZeroConfig.precision must be a Precision (Precision.FP32"),
    ("cpu_adam", "torch", "ZeroConfig.cpu_adam must be a CpuAdam (CpuAdam.AUTO"),
    ("stage", 1.0, "ZeroConfig.stage must be an integer, got 1.0"),
    ("bucket_bytes", 1e6, "ZeroConfig.bucket_bytes must be an integer, got 1000000.0"),
    ("initial_loss_scale", float("nan"), "ZeroConfig.initial_loss_scale must be a finite number, got nan"),
    ("min_loss_scale", "1", "ZeroConfig.min_loss_scale must be a finite number, got '1'"),
])
def test_zero_config_field_of_the_wrong_type_names_it(field, value, fragment):
    from hybrid.zero import ZeroConfig
    with pytest.raises(ValueError) as e:
        ZeroConfig(**{field: value})
    assert fragment in str(e.value), str(e.value)


@pytest.mark.parametrize("field, value, fragment", [
    ("decay_style", "cosin", "OptimizerConfig.decay_style (--lr-decay-style) must be one of constant, linear, cosine, "
                             "got 'cosin'"),
    ("optimizer", "adamw",
     "OptimizerConfig.optimizer (--optimizer) must be one of adam, sgd, onebit-adam, got 'adamw'"),
    ("lr", "1e-3", "OptimizerConfig.lr must be a finite number >= 0, got '1e-3'"),
    ("beta2", 1.0, "OptimizerConfig.beta2 must be a finite number in [0, 1), got 1.0"),
    ("clip_grad", float("inf"), "OptimizerConfig.clip_grad must be a finite number >= 0, got inf"),
    ("train_iters", 0, "OptimizerConfig.train_iters must be a positive integer, got 0"),
    ("decay_iters", 2.5, "OptimizerConfig.decay_iters must be a positive integer, got 2.5"),
])
def test_optimizer_config_field_out_of_its_set_or_range_names_it(field, value, fragment):
    from hybrid.train_step import OptimizerConfig
    with pytest.raises(ValueError) as e:
        OptimizerConfig(**{field: value})
    assert str(e.value) == fragment


def test_optimizer_config_takes_what_train_py_builds():
    """lr 0 (the evaluation pipeline's), decay_iters None (train_iters), each optimizer and style."""
    from hybrid.train_step import OptimizerConfig
    for style in OptimizerConfig.DECAY_STYLES:
        for opt in OptimizerConfig.OPTIMIZERS:
            OptimizerConfig(lr=0, decay_style=style, optimizer=opt, decay_iters=None, clip_grad=0.0)


@pytest.mark.parametrize("saved", [{"lr_decay_style": "weird"}, {"lr": "x"}])
def test_a_checkpoints_unreadable_schedule_is_a_resume_line_not_a_crash(saved):
    """state.json's recorded flags are data: a schedule OptimizerConfig refuses (or one lr_at could not compute:
    lr "x" was a TypeError at start-up) is named on the resume line; the run steps at its own flags."""
    from hybrid.train.explain import lr_change_line
    now = {"lr": 1e-3, "min_lr": 1e-4, "lr_warmup_iters": 0, "lr_decay_style": "constant", "train_iters": 10}
    line = lr_change_line({**now, **saved}, now, 2)
    assert line.startswith("resume: the checkpoint's recorded lr schedule is not one hybrid runs (OptimizerConfig.")
    assert line.endswith("); this run steps at its own flags' rates: 0.001, then constant"), line
