"""The FP8 casts the planner prices (hybrid/planner/ops.py `fp8_casts`, issue 26): the bytes Transformer Engine's
Linear moves beside its FP8 GEMMs, counted from its source (transformer_engine/pytorch/module/linear.py: a fused
cast-and-transpose of the input and, each micro-batch, of the weight; of the output gradient in the backward),
with the amax pass a CURRENT-scaling recipe adds (torchao float8, TE's current scaling) and a DELAYED one does not
(TE's DelayedScaling, Composer's amp_fp8). Fast: no plans searched, no processes."""

from __future__ import annotations

import pytest

from hybrid.planner.hardware import hardware
from hybrid.planner.layout import Cluster, Layout, Recompute, Workload, ZeroStage
from hybrid.planner.model import ActivationProfile
from hybrid.planner.ops import Fp8Scaling, fp8_casts
from hybrid.planner.published import mpt_model, mpt_runs
from hybrid.planner.time import _context, layer_passes

E = 2  # bf16


def _mpt_shard(size: str = "3b", seq: int = 2048):
    work = Workload(mpt_model(size, seq), global_batch=8, seq_length=seq, activations=ActivationProfile.BF16_FLASH,
                    fp8=True, fp32_grads=False)
    return work.shard(1)


def test_delayed_scaling_casts_read_bf16_once_and_write_fp8_twice():
    """MPT-3B (h 2560, GELU MLP of 4h): four distinct linear inputs a layer -- the fused QKV's h, the attention
    output's h, the MLP up's h, the down projection's 4h: 7h elements, each read in bf16 (2 bytes) and written
    as FP8 and its transpose (1 + 1); the output gradients of all four linears, 3h + h + 4h + h = 9h elements;
    the 12 h^2 weights once per micro-batch. Counted by hand from the shapes, not from the planner's GEMM list."""
    h, tokens = 2560, 4096
    traffic = fp8_casts(_mpt_shard(), tokens, E, Fp8Scaling.DELAYED)
    assert traffic.fwd_bytes == pytest.approx((E + 2) * (7 * h + 12 * h * h / tokens))
    assert traffic.bwd_bytes == pytest.approx((E + 2) * 9 * h)
    assert (traffic.fwd_kernels, traffic.bwd_kernels) == (4 + 4, 4)  # four inputs + four weights; four gradients


def test_current_scaling_adds_one_amax_read_and_one_kernel_a_cast():
    shard, tokens = _mpt_shard(), 4096
    delayed = fp8_casts(shard, tokens, E, Fp8Scaling.DELAYED)
    current = fp8_casts(shard, tokens, E, Fp8Scaling.CURRENT)
    assert current.fwd_bytes / delayed.fwd_bytes == pytest.approx((2 * E + 2) / (E + 2))
    assert current.bwd_bytes / delayed.bwd_bytes == pytest.approx((2 * E + 2) / (E + 2))
    assert (current.fwd_kernels, current.bwd_kernels) == (2 * delayed.fwd_kernels, 2 * delayed.bwd_kernels)


def test_weight_casts_amortise_over_the_micro_batch_and_activation_casts_do_not():
    """Per token, the weights' share falls as 1 / tokens; the activations' does not: at small micro-batches of a
    wide model the weight casts dominate, at long sequences the activation casts do."""
    shard, h = _mpt_shard(), 2560
    small, large = (fp8_casts(shard, t, E, Fp8Scaling.DELAYED) for t in (1024, 65536))
    activations = (E + 2) * 7 * h
    assert (small.fwd_bytes - activations) / (large.fwd_bytes - activations) == pytest.approx(64)
    assert small.bwd_bytes == large.bwd_bytes


def test_layer_pays_the_casts_at_the_elementwise_rate():
    """The layer's memory-bound time grows by exactly the casts' bytes at Hardware.elementwise_bytes_per_s, and its
    launches by their kernels x kernel_overhead_s, forward and backward (no recomputation)."""
    base = Workload(mpt_model("3b", 2048), global_batch=80, seq_length=2048,
                    activations=ActivationProfile.BF16_FLASH, fused_cross_entropy=True, fp32_grads=False)
    fp8 = Workload(mpt_model("3b", 2048), global_batch=80, seq_length=2048, activations=ActivationProfile.BF16_FLASH,
                   fused_cross_entropy=True, fp8=True, fp8_scaling=Fp8Scaling.DELAYED, fp32_grads=False)
    layout = Layout(tp=1, pp=1, dp=8, micro_batch=10, zero=ZeroStage.PARAMETERS, recompute=Recompute.NONE)
    cluster = Cluster(gpus=8, hw=hardware("h100-80g"))
    (f0, b0), (f1, b1) = (layer_passes(_context(w, cluster, layout)) for w in (base, fp8))
    hw, tokens = cluster.hw, 10 * 2048
    casts = fp8_casts(fp8.shard(1), tokens, E, Fp8Scaling.DELAYED)
    assert f1.memory - f0.memory == pytest.approx(casts.fwd_bytes * tokens / hw.elementwise_bytes_per_s)
    assert b1.memory - b0.memory == pytest.approx(casts.bwd_bytes * tokens / hw.elementwise_bytes_per_s)
    assert f1.launches - f0.launches == pytest.approx(casts.fwd_kernels * hw.kernel_overhead_s)
    assert f1.gemm < 0.55 * f0.gemm  # the GEMMs at the FP8 peak (nearly half)


def test_mpt_fp8_rows_are_planned_with_composers_delayed_scaling():
    """Composer's amp_fp8 runs te.fp8_autocast with a DelayedScaling recipe (composer/core/precision.py); the
    BF16 rows keep the default, which --fp8-scaling only changes with --fp8."""
    runs = mpt_runs()
    assert {r.workload.fp8_scaling for r in runs if r.workload.fp8} == {Fp8Scaling.DELAYED}
    assert all(r.workload.fp8_scaling is Fp8Scaling.CURRENT for r in runs if not r.workload.fp8)


def test_fp8_scaling_without_fp8_is_rejected_by_name():
    with pytest.raises(ValueError, match="--fp8-scaling"):
        Workload(mpt_model("1b", 2048), global_batch=8, seq_length=2048, activations=ActivationProfile.BF16_FLASH,
                 fp8_scaling=Fp8Scaling.DELAYED, fp32_grads=False)


CLI = ["--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-80g", "--global-batch-size", "8", "--seq-length",
       "2048", "--activation-profile", "bf16-flash", "--tensor-model-parallel-size", "1",
       "--pipeline-model-parallel-size", "1", "--micro-batch-size", "1", "--zero-stage", "3", "--top", "1", "--json"]


def test_cli_fp8_scaling_needs_fp8_and_delayed_plans_a_faster_step(capsys):
    """`hybrid plan --fp8-scaling delayed` without --fp8 is one line naming the flag; with --fp8 the delayed
    recipe's casts (no amax pass) give a shorter step than the default current scaling."""
    import json
    from hybrid.planner.cli import main
    assert main(CLI + ["--fp8-scaling", "delayed"]) == 2
    err = capsys.readouterr().err
    assert "--fp8-scaling" in err and len(err.strip().splitlines()) == 1
    steps = {}
    for scaling in ("current", "delayed"):
        assert main(CLI + ["--fp8", "--fp8-scaling", scaling]) == 0
        steps[scaling] = json.loads(capsys.readouterr().out)["plans"][0]["step_seconds"]
    assert steps["delayed"] < steps["current"]
