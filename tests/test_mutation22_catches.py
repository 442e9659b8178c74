"""Round 22's outside mutation review of round 21's new code: one-line bugs planted on purpose in the planner's fc1
bias-gradient term (ops / layout / time), the CPU units of `hybrid plan` (RSS MiB in the table, --explain, --plot,
the CP table), the MoE plan's ep column and flags, the new published rows' settings, train.py's resume lines
(schedule, implied global batch, what a resumed run reads), the resumed-checkpoint line, the `compress:` and
`diloco:` start-up lines, the trail's CP ring phase, the consumed-samples count and the auto-parallel time; the
area's fast tier run on each. Each test here kills a mutant that tier let live, shown failing on the mutant and
passing on HEAD. In-process, no process group.

The mutant ids (E2-schedule-old-pp1, ...) are those of branch mutation22's report and of docs/architecture.md's
tally."""

from __future__ import annotations

from hybrid.train import explain

FLAGS = {"lr": 1e-3, "min_lr": 1e-4, "lr_warmup_iters": 2, "lr_decay_style": "cosine", "train_iters": 20,
         "lr_decay_iters": None, "seed": 1234, "data_path": None, "split": "969, 30, 1", "seq_length": 32,
         "global_batch_size": 8, "micro_batch_size": 2, "pipeline_schedule": None}
PP1 = {"tp": 1, "pp": 1, "dp": 2, "zero": 0, "v": 1, "stages": [[0, 1, 2, 3]]}
PP2 = {"tp": 1, "pp": 2, "dp": 1, "zero": 0, "v": 1, "stages": [[0, 1], [2, 3]]}


# --- E: train.py's resume lines (hybrid/train/explain.py) ---------------------------------------------------------
def _resume(saved_layout: dict, saved_flags: dict, layout: dict, flags: dict, global_batch: int) -> list[str]:
    saved = {"model": "tiny-llama", "layout": saved_layout, "args": {**FLAGS, **saved_flags}, "iteration": 10,
             "consumed_samples": 80, "contents": "full"}
    return explain.resume_lines(saved, {"model": "tiny-llama", "layout": layout, "args": {**FLAGS, **flags}}, 10, 80,
                                None, global_batch)


def test_a_pp1_checkpoint_resumed_with_a_pipeline_names_no_schedule_it_never_ran():
    """A pp 1 run runs no schedule: resumed at pp 2 with --pipeline-schedule zbh1 the layout line says what moved,
    and no "pipeline schedule 1f1b -> zbh1" (1f1b was never run). E2-schedule-old-pp1 (the saved layout's
    `pp == 1` test dropped) lived through the explain / resume files' fast tier: their pp 1 case is pp 1 both
    times."""
    assert explain.schedule_change_line({}, {"pipeline_schedule": "zbh1"}, PP1, PP2) is None
    lines = _resume({**PP1, "dp": 1}, {}, PP2, {"pipeline_schedule": "zbh1"}, 8)
    assert lines[0].startswith("resume: layout changed: saved at tp 1 x pp 1 x dp 1") and len(lines) == 1, lines


def test_a_global_batch_given_anew_is_not_called_unset():
    """--global-batch-size 8 -> 16 is in the flags line; the implied-batch line ("--global-batch-size unset:
    micro-batch x dp") is for a batch that moved with no flag changed. E6-implied-batch-with-flag (the
    `"global_batch_size" not in changed` test dropped) lived: every test of that line leaves the flag unset."""
    lines = _resume(PP2, {}, PP2, {"global_batch_size": 16}, 16)
    assert lines[0] == "resume: flags changed since the checkpoint: --global-batch-size 8 -> 16", lines
    assert not [ln for ln in lines if "--global-batch-size unset" in ln], lines


def test_only_the_saved_order_reads_samples_none_read_before():
    """Since data22 a resumed run's split covers what it reads (no wrap, no --global-batch-size hint: mutation22's
    E9 test of that hint's rounding went with it). Its reads are "the saved order's next samples: none read
    before" only where the shuffle is the saved run's; a new order draws them anew. E12-wrap-always-saved
    (`same_order` ignored) lived before data22; here its successor (the claim made whatever the order)."""
    same = explain.reads_text(80, 120, 10, 4, True)
    assert same == ("this run reads its samples 80-119 (the checkpoint's 80 + 10 iterations x 4), the saved "
                    "order's next samples: none read before"), same
    assert "none read before" not in explain.reads_text(80, 120, 10, 4, False)


# --- M: `hybrid plan` on a CPU: --plot's axis (hybrid/planner/plot.py) ---------------------------------------------
def _tiny_plans(gpu: str, model: str = "tiny-gpt2", top: int = 2):
    from hybrid.planner import Cluster, Workload, hardware, search
    from models import load_config
    work = Workload(load_config(model), global_batch=16, seq_length=128, fp32_grads=False)
    cluster = Cluster(gpus=4, hw=hardware(gpu))
    return work, cluster, search(work, cluster, top=top).plans


def test_a_hosts_memory_far_above_the_bars_is_named_not_drawn():
    """The cpu preset's 64 GB a rank is ~240,000 MiB over bars of a few hundred: drawn, it would flatten them, so
    it is named in the legend "(above the axis)" and the axis ends over the tallest bar. M13-line-when-far
    (`cap < 10 * tallest`) lived through the planner files' fast tier: test_newuser21_plot reads the bars' labels
    and the legend's parts, not the line or the axis."""
    import pytest
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from hybrid.planner import plot
    _, cluster, plans = _tiny_plans("cpu")
    fig = plot.draw_memory(plans, device_bytes=cluster.hw.capacity_bytes, host_baseline=200 * 2**20)
    ax = fig.axes[0]
    tallest = max(sum(plot.memory_parts(p.memory.peak, plot.HOST_UNIT, 200 * 2**20).values()) for p in plans)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert [t for t in legend if t.endswith("(above the axis)")] and ax.get_ylim()[1] == pytest.approx(1.35 * tallest)
    plt.close(fig)


def test_hybrid_plan_with_cp_on_a_cpu_prints_rss_mib(capsys):
    """The command, not context.report alone: `hybrid plan --context-parallel-size ... --gpu cpu` hands the CP
    table the process's RSS baseline, so its memory column is the plain table's "RSS MiB", not GB with the 2 GB GPU
    reserve. M11-cp-table-without-baseline (cli._plan_cp calling context.report without it) lived through the
    planner files' fast tier: test_newuser21_cp asks context.report with a baseline it passes itself."""
    from hybrid.planner.cli import main
    assert main(["--model", "tiny-llama", "--gpus", "4", "--gpu", "cpu", "--global-batch-size", "16",
                 "--seq-length", "256", "--context-parallel-size", "1,2", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "RSS MiB" in out and "mem GB" not in out, out

# --- C: the resumed-checkpoint line (hybrid/checkpoint/run.py) ----------------------------------------------------
STATE = {"iteration": 4, "consumed_samples": 8}


def test_the_resumed_line_names_cp_by_its_own_size_and_only_above_1():
    """tp 1 x cp 2 reads "tp 1 x cp 2"; a checkpoint that records cp 1 adds nothing (the layout line's text).
    C1-cp-at-1 (`cp >= 1`) and C2-cp-as-tp (the cp cell from lay['tp']) lived through test_newuser21_cp and the
    checkpoint files' fast tier: its CP checkpoint is tp 2 x cp 2, its others record no cp."""
    from hybrid.checkpoint.run import resumed_line
    cp2 = {"tp": 1, "cp": 2, "pp": 1, "dp": 2, "zero": 0}
    assert "(saved at tp 1 x cp 2 x pp 1 x dp 2, ZeRO 0) |" in resumed_line("c", cp2, STATE, False, True, True, True)
    cp1 = {"tp": 2, "cp": 1, "pp": 1, "dp": 2, "zero": 1}
    assert "(saved at tp 2 x pp 1 x dp 2, ZeRO 1) |" in resumed_line("c", cp1, STATE, False, True, True, True)


def test_a_converted_checkpoint_is_weights_only_not_a_missing_optimizer():
    """A `hybrid convert` output (weights only) loads no optimizer state by nature: the line says "weights only",
    not also "optimizer state not loaded" (which reads as --no-load-optim). C3-optim-line-on-weights (`or
    model_only` dropped) lived: the fast tier's resumed lines are of full checkpoints."""
    from hybrid.checkpoint.run import resumed_line
    lay = {"tp": 1, "pp": 1, "dp": 1, "zero": 0}
    line = resumed_line("c", lay, STATE, True, False, False, True)
    assert "| weights only (a converted checkpoint)" in line and "optimizer state not loaded" not in line, line
    assert "RNG not restored" not in line, line  # no RNG streams in it either: not --no-load-rng's doing
    assert resumed_line("c", lay, STATE, False, False, True, True).endswith("| optimizer state not loaded")


def test_a_load_at_another_layout_says_why_the_rng_was_not_restored(monkeypatch):
    """RunCheckpoints._load hands resumed_line whether the saved tp, pp, dp are this run's: at another dp the RNG
    is not restored because of the layout, not --no-load-rng. C6-same-inverted (`not same` passed) lived through
    the checkpoint files' fast tier (test_mutation19_catches' harness asks only whether the text is there)."""
    from hybrid.checkpoint import run as ckpt_run
    from hybrid.checkpoint.args import CheckpointConfig

    class Core:
        statefuls = staticmethod(lambda opt, names, rng, optim=True, rng_too=True: {})
        load_state = staticmethod(lambda owners, path, pg: {"iteration": 3, "consumed_samples": 24})

    lines, layout = [], {"tp": 1, "pp": 1, "dp": 2, "zero": 0}
    monkeypatch.setattr(ckpt_run, "_core", lambda: Core)
    monkeypatch.setattr(ckpt_run, "_log", lines.append)
    for saved_dp, load_rng, why in ((1, True, "another layout"), (2, False, "--no-load-rng")):
        monkeypatch.setattr(ckpt_run.store, "read_state",
                            lambda path, dp=saved_dp: {"model": "tiny-gpt2", "layout": dict(layout, dp=dp)})
        run = object.__new__(ckpt_run.RunCheckpoints)
        run.cfg = CheckpointConfig(load="ck", load_rng=load_rng)
        run.info, run.opt, run.names, run.rng, run.owners, run.pg = {"model": "tiny-gpt2", "layout": layout}, \
            None, {}, None, {}, None
        assert run._load("ck/iter_0000003") == (3, 24)
        assert lines[-1].endswith(f"| RNG not restored ({why})"), lines


# --- K: the `compress:` start-up line (hybrid/compress/args.py) ---------------------------------------------------
def test_under_diloco_the_compress_line_leaves_the_link_to_the_diloco_line():
    """Under DiLoCo the simulated link is the cross-replica one, named on the `diloco:` line ("simulated
    cross-replica link"); the `compress:` line names only the scheme. K3-link-under-diloco (`and not diloco`
    dropped) lived through the compress files' fast tier: no test asks for the line under DiLoCo."""
    from hybrid.compress.args import CompressConfig, describe
    from hybrid.compress.volume import PowerSGDConfig
    cfg = CompressConfig(powersgd=PowerSGDConfig(rank=2, start_iter=4), simulated_dp_bandwidth=0.5)
    assert describe(cfg).endswith("| simulated DP link 0.5 GB/s (each step sleeps its DP bytes / that)")
    line = describe(cfg, diloco=True)
    assert line.startswith("compress: PowerSGD rank 2 on the DP gradients from optimizer step 5") and "link" not in line
    assert describe(CompressConfig(simulated_dp_bandwidth=0.5), diloco=True) == ""

# --- D: DiLoCo's start-up line (hybrid/diloco/run.py) -------------------------------------------------------------
def test_the_diloco_line_names_the_replicas_size_and_stage_apart():
    """2 replicas of 4 DP ranks at ZeRO 3: "(ZeRO 3 over 4 ranks each)". D4-ranks-as-replicas (the replica count
    for its size) and D5-stage-as-bool (`ZeRO {int(bool(stage))}`) lived through test_newuser21_diloco and the
    diloco files' fast tier: its line has 2 replicas of 2 ranks at ZeRO 1."""
    from types import SimpleNamespace

    from hybrid.diloco.args import DiLoCoConfig
    from hybrid.diloco.run import startup_line
    run = SimpleNamespace(diloco=DiLoCoConfig(inner_steps=8, replicas=2), parallel=SimpleNamespace(
        dims=SimpleNamespace(dp=8)), zero=SimpleNamespace(stage=3), compress=SimpleNamespace(simulated_dp_bandwidth=0))
    assert startup_line(run).startswith("diloco: 2 replicas (ZeRO 3 over 4 ranks each) | H 8")


# --- T: `hybrid plot-run`'s memory panel (hybrid/metrics/plot.py) -------------------------------------------------
def test_the_run_plots_memory_axis_names_mib_as_its_curve_divides():
    """The memory curve divides bytes by 2^20; the axis says MiB (2^20 bytes), not MB (1e6: 5 % off at 1 GiB).
    T6-axis-MB (the label "MB") lived through the metrics files' fast tier: test_plot_run counts curves only."""
    import pytest
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from hybrid.metrics import plot
    fig = plot.draw([plot.Run("a", loss={1: 2.0}, memory={1: 3 * 2**20}, memory_label="peak RSS")])
    mem = fig.axes[2]
    assert list(mem.lines[0].get_ydata()) == [3.0] and mem.get_ylabel() == "MiB (2^20 bytes)"
    plt.close(fig)


# --- A: the auto-parallel line's time (hybrid/train/args.py) --------------------------------------------------------
def test_auto_parallel_on_a_gpu_without_a_profile_keeps_its_predicted_step(monkeypatch, capsys):
    """On a CUDA device train.py plans on the card's preset (an H100 here), whose rates time the step: the line
    keeps "predicted ... s/step on h100-80g"; only the cpu preset without --hardware is placeholder rates.
    A3-placeholder-without-cuda-test (the `not torch.cuda.is_available()` test dropped) lived through the
    round-21 operations test and the training files' fast tier: they run on a CPU, where both tests agree. The GPU
    is stood in for: torch.cuda's two calls the planning device reads."""
    import importlib
    from types import SimpleNamespace

    import torch
    for k, v in {"WORLD_SIZE": 2, "RANK": 0, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 2, "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": 29500}.items():
        monkeypatch.setenv(k, str(v))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=85e9))
    importlib.import_module("hybrid.train.main").validate(["--auto-parallel", "--global-batch-size", "8"])
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("auto-parallel: ")]
    assert " s/step on h100-80g)" in line and "placeholder" not in line, line


def test_auto_parallel_on_a_cpu_with_a_profile_keeps_its_predicted_step(monkeypatch, capsys, tmp_path):
    """On a CPU with --hardware (a `hybrid calibrate` profile: measured rates) the line keeps the predicted step;
    the placeholder text is for the cpu preset without one. A1-placeholder-or (`not args.hardware or not
    cuda`) lived through the round-21 operations test and the training files' fast tier: the profile case is asked
    of auto_parallel_time alone, not of the line train.py prints. The profile: the cpu preset's fields, named."""
    import dataclasses
    import importlib
    import json

    import torch

    from hybrid.planner import calibrate, hardware
    if torch.cuda.is_available():
        import pytest
        pytest.skip("the CPU's planning device")
    path = tmp_path / "vm.json"
    path.write_text(json.dumps({"format": calibrate.FORMAT,
                                "hardware": {**dataclasses.asdict(hardware("cpu")), "name": "vm"}}))
    for k, v in {"WORLD_SIZE": 2, "RANK": 0, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 2, "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": 29500}.items():
        monkeypatch.setenv(k, str(v))
    importlib.import_module("hybrid.train.main").validate(["--auto-parallel", "--global-batch-size", "8",
                                                           "--hardware", str(path)])
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("auto-parallel: ")]
    assert " s/step on vm)" in line and "placeholder" not in line, line
