"""Round 23's outside mutation review of round 22's new code: one-line bugs planted on purpose in the planner's FP8
parameter gather and the MLPerf rows, the CP views of `hybrid plan` (--explain / --json / --emit-args / --plot),
polish22's fullest rank and OOM units, calibrate's latency rounds, the resumed data split, the Megatron / DeepSpeed
porting, bf16 gradients, trust22's refusals and the scripts' plots; the area's fast tier run on each. Each test here
kills a mutant that tier let live, shown failing on the mutant and passing on HEAD; plus round 22's one open mutant
(the loop's DiLoCo line at ZeRO 0). In-process, no process group.

The mutant ids (K1-diloco-describe-0, ...) are those of branch mutation23's report and of docs/architecture.md's
tally."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


# --- K: the loop's start-up lines (hybrid/train/loop.py's feature_lines) ------------------------------------------
def test_the_loop_names_the_runs_zero_stage_on_the_diloco_line():
    """A DiLoCo replica of 2 DP ranks at --zero-stage 2: the run's `diloco:` line says "ZeRO 2 over 2 ranks each",
    the stage the loop passes. K1-diloco-describe-0 (the loop's `local.describe(0)`: "plain DP over 2 ranks each")
    lived through round 22 -- only a 4-rank DiLoCo launch printed the line, and none read it; feature_lines (the
    loop's start-up lines as a function of the run and its LocalUpdates) is called here with the mesh's DP size of
    a replica, no process group."""
    from hybrid.diloco.run import LocalUpdates
    from hybrid.train.args import parse_args, run_config
    from hybrid.train.loop import feature_lines
    run = run_config(parse_args(["--diloco-inner-steps", "4", "--diloco-replicas", "2", "--zero-stage", "2",
                                 "--global-batch-size", "16"]), 4)
    local = LocalUpdates(run.diloco, SimpleNamespace(dp=SimpleNamespace(size=2)), SimpleNamespace(replicas=2))
    assert feature_lines(run, local) == ["diloco: 2 replicas (ZeRO 2 over 2 ranks each) | H 4 inner steps | outer "
                                         "Nesterov SGD lr 0.7 momentum 0.9"]
    off = run_config(parse_args(["--zero-stage", "2", "--global-batch-size", "16"]), 4)
    assert feature_lines(off, LocalUpdates(None, SimpleNamespace(dp=SimpleNamespace(size=4)))) == []


# --- P: FP8 parameter gathers (hybrid/planner/time.py, layout.py) -------------------------------------------------
def test_one_bucket_of_fp8_weights_has_nothing_to_hide_behind():
    """ZeRO 1's parameter all-gather overlaps the next forward except its first bucket (time._dp_step_seconds:
    gather / n + ...). A rank of 23.2 M parameters gathers 46 MB of bf16 weights, two 25 MiB buckets (one hidden),
    but 23 MB of FP8 weights (Workload.fp8_param_gather): one bucket, all of it exposed -- the overlap changes
    nothing. P4-buckets-precision-bytes (the bucket count from the precision's 2 bytes, not param_gather_bytes)
    lived through the planner22 files: their rows' bucket counts are large, where n and 2n read nearly alike."""
    from hybrid.planner.hardware import hardware
    from hybrid.planner.layout import Cluster, Layout, Workload, ZeroStage
    from hybrid.planner.reference import gpt_model
    from hybrid.planner.time import step_time
    layout, cluster = Layout(tp=1, pp=1, dp=8, zero=ZeroStage.OPTIMIZER), Cluster(gpus=8, hw=hardware("h100-80g"))

    def exposed(fp8_params: bool, overlap: bool) -> float:
        work = Workload(gpt_model(2, 512, 8, 32000, 1024), global_batch=8, seq_length=1024, fp8=True,
                        fp8_param_gather=fp8_params, overlap_param_gather=overlap, fp32_grads=False)
        return step_time(work, cluster, layout).term("dp_exposed")

    assert exposed(False, True) < exposed(False, False)  # bf16: two buckets, the second hidden
    assert exposed(True, True) == exposed(True, False)  # FP8: one bucket, nothing hidden


def test_fp8_weights_leave_the_gradient_reduction_and_its_overlap_as_they_were():
    """Under Workload.overlap_grad_reduce ZeRO 1's reduce-scatter hides under the last backward (time.
    _dp_step_seconds: reduce = the step's ledger less the parameter gather). FP8 weights halve the gather, not the
    gradients' reduce-scatter, so what overlapping the reduction saves is the same with and without them.
    P5-reduce-precision-bytes (the ledger of `reduce` at the precision's 2 bytes while the gather it subtracts is at
    1: half the gather counted as gradient reduction, and hidden) lived through the planner22 files."""
    from hybrid.planner.hardware import hardware
    from hybrid.planner.layout import Cluster, Layout, Workload, ZeroStage
    from hybrid.planner.reference import gpt_model
    from hybrid.planner.time import step_time
    layout, cluster = Layout(tp=1, pp=1, dp=8, zero=ZeroStage.OPTIMIZER), Cluster(gpus=8, hw=hardware("h100-80g"))

    def saved(fp8_params: bool) -> float:
        times = [step_time(Workload(gpt_model(2, 512, 8, 32000, 1024), global_batch=8, seq_length=1024, fp8=True,
                                    fp8_param_gather=fp8_params, overlap_grad_reduce=overlap,
                                    fp32_grads=False), cluster, layout)
                 for overlap in (False, True)]
        return times[0].term("dp_exposed") - times[1].term("dp_exposed")

    assert saved(False) > 0 and saved(True) == pytest.approx(saved(False), rel=1e-9)


# --- D: the resumed run's train split (hybrid/train/loop.py's resumed_data, hybrid/data/source.py) ----------------
def test_the_loop_builds_a_resumed_runs_split_to_the_end_of_its_reads():
    """Saved at 8 a step, resumed at iteration 10 (80 samples read) at 4 a step for --train-iters 20: the run reads
    samples 80-119, so the split it trains on holds 120 (train_samples), not Megatron's 20 x 4 = 80 -- whose end
    would wrap the run around to samples 0-39, read before. A fresh run keeps the split it was built with.
    D5-loop-no-resume (the loop's train_samples called without the checkpoint's iteration and samples) lived
    through the data files' fast tier: only the slow train.py resumes of test_data22_resume_batch called it."""
    import numpy as np

    from hybrid.data.indexed import InMemoryDocuments
    from hybrid.data.source import DataSource, SplitSizes
    from hybrid.train.args import parse_args, run_config
    from hybrid.train.loop import resumed_data
    run = run_config(parse_args(["--train-iters", "20", "--global-batch-size", "4", "--micro-batch-size", "4",
                                 "--eval-interval", "10", "--eval-iters", "1"]), 1)  # the split's own sizes
    tokens = np.random.default_rng(0).integers(0, 256, 100 * 500).astype(np.uint8)
    data = DataSource([InMemoryDocuments(tokens, np.full(100, 500), "corpus.txt")], [1.0], (0.8, 0.15, 0.05), 16,
                      1234, SplitSizes.for_run(20, 4, 10, 1))
    assert data.sizes.train == 80
    assert resumed_data(run, data, 10, 80).sizes.train == 120
    assert resumed_data(run, data, 0, 0) is data



def test_a_resume_with_no_step_left_keeps_megatrons_split():
    """A run resumed at its last iteration (--train-iters = the checkpoint's: Megatron's --skip-train, evaluation
    only) reads no training sample: its split is Megatron's train_iters x G even when the checkpoint read more (a
    larger saved batch), so its shuffle is the one a fresh run of those flags draws. D1-no-step-left-ge (train_samples'
    `train_iters > start` as `>=`: the split sized to the checkpoint's 80 samples) lived through the data files."""
    from hybrid.data.source import train_samples
    assert train_samples(10, 4, 10, 80) == 40  # saved at 8 a step, resumed at 4 a step with no step left
    assert train_samples(11, 4, 10, 80) == 84  # one step left: to the end of its reads, 80 + 4


# --- C: `hybrid plan --context-parallel-size` views (hybrid/planner/cli.py) ---------------------------------------
def test_a_cp_1_plan_emits_no_cp_flags_and_names_no_comm_type(capsys):
    """--context-parallel-size 1 plans with no ring: its train.py flags are the plain plan's (no
    --context-parallel-size 1 --cp-comm-type p2p), and --json's layout names no comm type. C6-cp1-flags-emitted
    (cli.train_args' `plan.cp > 1` as `>= 1`) lived through test_cpviews22 and the CP planner files: every plan
    they emit is at cp 2 (train.py accepts the flags at 1, so --emit-args' own check passes them)."""
    import json

    from hybrid.planner.cli import main
    assert main(["--model", "tiny-llama", "--gpus", "4", "--gpu", "cpu", "--global-batch-size", "8", "--seq-length",
                 "128", "--top", "1", "--context-parallel-size", "1", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plans"][0]
    assert plan["layout"]["context_parallel_size"] == 1 and plan["layout"]["cp_comm_type"] is None
    assert not [f for f in plan["train_args"] if f.startswith(("--context-parallel", "--cp-"))], plan["train_args"]


def _cpu_cp_plans():
    """tiny-llama at 128 tokens on 4 ranks of the cpu preset, cp 2 over every comm type (the views' CPU case)."""
    from hybrid.cp.comm_type import CommType
    from hybrid.planner import Cluster, SearchSpace, Workload, context, hardware
    from models.config import load_config
    work = Workload(load_config("tiny-llama"), global_batch=8, seq_length=128, fp32_grads=False)
    return context.search_cp(work, Cluster(gpus=4, hw=hardware("cpu")), SearchSpace(), cps=(2,),
                             comms=tuple(CommType), top=3)


def test_a_cpu_cp_plans_bar_draws_the_ring_in_mib():
    """On CPU hardware --plot's bars are MiB of RSS (plot.HOST_UNIT): the ring's buffers too, and the bar adds up to
    the table's RSS column (the tensors less the GPU reserve, plus the process). C11-ring-in-GB (bar_parts' ring
    over GB, not the unit's bytes) lived through test_cpviews22: its bars are a GPU's, where the unit is GB."""
    from hybrid.planner.plot import HOST_UNIT, RING, bar_parts
    baseline = 300 * 2**20
    plans = _cpu_cp_plans()
    assert any(p.ring_bytes > 0 for p in plans)
    for p in plans:
        parts = bar_parts(p, HOST_UNIT, baseline)
        assert parts[RING] == pytest.approx(p.ring_bytes / 2**20, rel=1e-12)
        rss = (p.memory_gb * 1e9 - p.base.memory.peak.workspace + baseline) / 2**20
        assert sum(parts.values()) == pytest.approx(rss, rel=1e-9)


def test_a_cp_plans_json_rate_is_over_the_whole_step(capsys):
    """--json's tflops_per_gpu of a CP plan is the step's FLOPs over the step with CP's terms: without
    recomputation (step FLOPs = model FLOPs) it is mfu x peak. C9-tflops-base-seconds (the rate over the reduced
    plan's seconds, CP's terms left out) lived through test_cpviews22, which asks only that it be > 0."""
    import json

    from hybrid.planner import hardware
    from hybrid.planner.cli import main
    assert main(["--model", "tiny-llama", "--gpus", "4", "--gpu", "cpu", "--global-batch-size", "8", "--seq-length",
                 "128", "--top", "3", "--context-parallel-size", "2", "--recompute-granularity", "none",
                 "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans and all(p["context_parallel"]["extra_seconds"] > 0 for p in plans)
    for p in plans:
        assert p["tflops_per_gpu"] == pytest.approx(p["mfu"] * hardware("cpu").peak_tflops, rel=1e-9)


def test_a_bar_whose_step_gradient_outgrows_the_activations_adds_up_to_the_table():
    """llama-3-8b at 512 tokens, tp 8, ZeRO 0: the optimizer step's fp32 gradient (4.0 GB) outgrows the freed
    activations (1.6-3.2 GB) and the loss's logit gradient (0.07-0.13 GB), so both bar parts are drawn, the step's
    beyond the other two -- the bar still adds up to the table's column. C12-step-grad-counts-loss-twice (the step
    part not less the loss gradient) lived through test_cpviews22, whose 8k-token plans' activations hide the step
    gradient (part 0)."""
    from hybrid.planner import Cluster, SearchSpace, Workload, hardware, search
    from hybrid.planner.layout import ZeroStage
    from hybrid.planner.model import ActivationProfile
    from hybrid.planner.plot import bar_parts
    from models.config import load_config
    work = Workload(load_config("llama-3-8b"), global_batch=8, seq_length=512, activations=ActivationProfile.BF16_FLASH,
                    fp32_grads=False)
    plans = search(work, Cluster(gpus=8, hw=hardware("h100-80g")), SearchSpace(tp=(8,), pp=(1,), zero=(
        ZeroStage.NONE,)), top=2).plans
    for p in plans:
        peak = p.memory.peak
        assert peak.step_transient > peak.activations + peak.backward_transient > peak.activations
        assert sum(bar_parts(p).values()) == pytest.approx(p.memory_gb, rel=1e-9)


# --- M: polish22's units (hybrid/planner/predicted_memory.py) -----------------------------------------------------
def test_a_demand_beside_an_oom_reason_is_in_its_unit():
    """demand_text writes a rank's demand as needs_of does: MiB (2^20 bytes) on CPU hardware, GB (1e9) on a GPU --
    the schedule note beside a CPU OOM reason ('1f1b 1,918 MiB'). M6-demand-text-GB (the MiB figure divided by
    1e9: '2 MiB') lived through the polish22 files: their zero-bubble notes on a CPU all fit (no OOM note)."""
    from hybrid.planner.hardware import hardware
    from hybrid.planner.predicted_memory import demand_text, needs_of
    cpu, gpu = hardware("cpu"), hardware("h100-80g")
    assert demand_text(1918 * 2**20, cpu) == "1,918 MiB" and demand_text(2.0e9, gpu) == "2.0 GB"
    demand = cpu.capacity_bytes + 5000 * 2**20  # an OOM: needs_of's figure is demand_text's
    assert needs_of(demand, cpu).startswith(f"needs {demand_text(demand, cpu)} of "), needs_of(demand, cpu)


# --- L: calibrate's latency rounds (hybrid/planner/calibrate.py) --------------------------------------------------
def test_a_latency_round_times_its_own_blocks_calls_and_warm_up():
    """_collective_seconds on a CPU: `warmup` untimed calls, then `blocks` blocks of `calls` calls, then one
    all-reduce of the slowest rank's block median -- a latency round's 10 + 2 x 20 + 1 all-reduces and 2 block
    means. L6-blocks-ignored (COLLECTIVE_BLOCKS = 5 blocks whatever `blocks` said: 2.5x the round's cost) lived
    through the calibrate files: test_calibrate22_latency mocks _collective_seconds whole. torch.distributed
    stood in for: no process group."""
    from unittest import mock

    import torch

    from hybrid.planner import calibrate as cal
    reduces = []
    fake = SimpleNamespace(all_reduce=lambda t, op=None: reduces.append(op), barrier=lambda: None,
                           ReduceOp=SimpleNamespace(MAX="max"))
    with mock.patch.object(cal, "dist", fake):
        _, means = cal._collective_seconds("all_reduce", 8, 8, torch.device("cpu"), blocks=2, calls=20, warmup=10)
    assert len(means) == 2 and len(reduces) == 10 + 2 * 20 + 1 and reduces[-1] == "max"


# --- G: Megatron's flags ported (hybrid/train/args.py) -------------------------------------------------------------
def test_block_recomputation_must_cover_the_largest_chunk():
    """tiny-gpt2's 4 layers as pp 2 with --pipeline-layers-per-stage 3,1: megatron-core's block method with N
    checkpoints each chunk's first N layers, so only N >= 3 (the largest chunk) is every layer -- full here; N = 1
    would leave 2 of the first chunk's 3 layers unrecomputed, refused. G6-most-is-min (the smallest chunk's layers:
    N = 1 accepted as full) lived through test_newuser22_megatron, whose chunks are even (2 and 2)."""
    from hybrid.train.args import parse_args, run_config
    from models import Recompute
    base = ["--model", "tiny-gpt2", "--pipeline-model-parallel-size", "2", "--pipeline-layers-per-stage", "3,1",
            "--global-batch-size", "8", "--recompute-granularity", "full", "--recompute-method", "block"]
    assert run_config(parse_args(base + ["--recompute-num-layers", "3"]), 2).model.recompute is Recompute.FULL
    with pytest.raises(ValueError, match=r"block --recompute-num-layers 1 recomputes 1 layers of each model chunk "
                                         r"\(up to 3 layers here\)"):
        run_config(parse_args(base + ["--recompute-num-layers", "1"]), 2)


@pytest.mark.parametrize("flags", [["--lr-warmup-iters", "5"], ["--lr-decay-style", "linear"]])
def test_a_deepspeed_optimizer_without_scheduler_is_not_warned_of_when_a_schedule_flag_is_given(tmp_path, capsys,
                                                                                                 flags):
    """The DeepSpeed no-scheduler warning says train.py's default schedule runs where DeepSpeed would run a constant
    rate; a schedule flag given is the user's choice, said nothing of (args.deepspeed_schedule_warning's
    SCHEDULE_DESTS test). G9-ds-warn-despite-flags (that test dropped) lived through test_newuser22_megatron: its
    flags-given case is --lr-decay-style constant --lr-warmup-iters 0, which the constant-rate test silences too."""
    import json

    from hybrid.train.main import validate
    (tmp_path / "ds.json").write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}}))
    capsys.readouterr()
    validate(["--deepspeed-config", str(tmp_path / "ds.json"), *flags])
    assert "no scheduler" not in capsys.readouterr().err
    validate(["--deepspeed-config", str(tmp_path / "ds.json")])  # no schedule flag: warned
    assert "has an optimizer section and no scheduler" in capsys.readouterr().err


# --- B: bf16 gradients (hybrid/train/args.py) ----------------------------------------------------------------------
@pytest.mark.parametrize("precision", [[], ["--fp16"]], ids=["fp32", "fp16"])
def test_grad_reduce_in_bf16_needs_bf16_whatever_else_the_run_trains_in(precision):
    """--grad-reduce-in-bf16 reduces bf16 gradients: without --bf16 -- fp32 training as much as --fp16 -- it means
    nothing and is one line. B3-bf16-needed-check-wrong (the guard `not args.bf16` as `args.fp16`: fp32 training
    accepted it, silently) lived through the bf16-gradient files: test_inputs asks with --fp16 only."""
    from hybrid.train.args import parse_args, run_config
    with pytest.raises(ValueError, match=r"^--grad-reduce-in-bf16 needs --bf16 "):
        run_config(parse_args(["--grad-reduce-in-bf16", *precision]), 1)


def test_auto_parallel_plans_the_gradient_dtype_the_run_has(monkeypatch, capsys):
    """--auto-parallel --bf16 runs fp32 gradients (Megatron's default; args.grads_in_fp32): its plan must count
    4 gradient bytes a parameter, and 2 with --grad-reduce-in-bf16 -- the layout chosen to fit memory and traffic
    the run has. B7-auto-plan-old-flag (the planner's Workload from --accumulate-allreduce-grads-in-fp32 alone: bf16
    gradients planned for a run of fp32 ones) lived through the bf16-gradient files."""
    from hybrid.train import args as train_args
    planned, search = [], train_args._plan_without_cp
    monkeypatch.setattr(train_args, "_plan_without_cp",
                        lambda work, cluster, space: planned.append(work) or search(work, cluster, space))
    for extra in ([], ["--grad-reduce-in-bf16"]):
        train_args.apply_auto_parallel(train_args.parse_args(["--auto-parallel", "--bf16", "--global-batch-size", "8",
                                                              *extra]), 2)
    assert [(w.fp32_grads, w.grad_bytes) for w in planned] == [(True, 4), (False, 2)]


# --- S: the scripts' pictures (scripts/plot_*.py) -------------------------------------------------------------------
def _script(name: str):
    """scripts/<name>.py as a module, registered (its dataclasses look their module up in sys.modules)."""
    import importlib.util
    import os
    import sys
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_mutation23_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_cp_pictures_memory_is_in_gib_as_its_axis_says():
    """plot_cp.py's memory panel reads "GiB" and draws an H100's 80 GB at 74.5 GiB: its curves are the planner's
    attention bytes (context.attention_memory_per_rank, every layer) over 2^30. S3-cp-memory-GB (over 1e9: 7 %
    high against the 74.5 GiB line) lived through test_pictures22, whose checks are ratios (1/cp, linear in s)."""
    from dataclasses import replace

    from hybrid.planner.context import attention_memory_per_rank, llama3_405b_131k
    from hybrid.planner.layout import Layout
    plot = _script("plot_cp")
    curves, layers = plot.memory_curves()
    work = llama3_405b_131k()[0]
    assert layers == work.model.num_layers == 126
    bytes_8k = attention_memory_per_rank(replace(work, seq_length=plot.SEQS[0]), Layout(tp=8), 1) * layers
    assert curves[1][0] == pytest.approx(bytes_8k / 2**30, rel=1e-12)


def test_the_accuracy_pictures_prediction_is_the_published_rate_times_one_plus_the_error():
    """A row's error is predicted / published throughput - 1 (published.py), so the scatter's predicted point is
    published x (1 + error): 100 published at +10 % is 110, and a rejected row (no error) is not drawn.
    S7-predicted-divides (published / (1 + error): 90.9, the error's sign half undone) lived through
    test_pictures22's fast tier, which counts the drawn points and the band but reads no point."""
    plot = _script("plot_planner_accuracy")
    assert plot.Point(SimpleNamespace(error=0.1), 100.0).predicted == pytest.approx(110.0, rel=1e-12)
    assert plot.Point(SimpleNamespace(error=-0.2), 50.0).predicted == pytest.approx(40.0, rel=1e-12)
    assert plot.Point(SimpleNamespace(error=None), 50.0).predicted is None


def test_the_accuracy_picture_plots_a_step_time_row_as_its_rate():
    """Throughput axes: a row published as a step time (Metric.STEP_S, the MLPerf rows) is drawn as 1 / step, so
    that predicted = published x (1 + error) holds in its unit too (error is over throughputs); a rate row as
    published. S8-step-not-inverted (a 10.98 s step drawn at 10.98, its error's sign then against the axes) lived
    through test_pictures22's fast tier."""
    from hybrid.planner.published import Metric
    plot = _script("plot_planner_accuracy")
    assert plot._throughput(SimpleNamespace(metric=Metric.STEP_S, published=4.0)) == 0.25
    rate = next(m for m in Metric if m is not Metric.STEP_S)
    assert plot._throughput(SimpleNamespace(metric=rate, published=150.0)) == 150.0
