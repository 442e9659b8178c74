"""The H100's eager clock (hardware.Hardware.eager_clock, H100_EAGER_CLOCK): PyTorch-native training on a 700 W
H100 is planned with its tensor-core work -- the GEMM curve's asymptote and flash attention -- at the fitted
fraction of the curve's rate, and nothing else moves: its memory-bound kernels, launches and collectives keep
their own rates, a fused stack (Megatron / Transformer Engine, Meta's) keeps the curve, and a stated
`--compute-efficiency` is the rate taken as is (docs/planner/rounds.md "Why eager FSDP on H100 was optimistic")."""

from __future__ import annotations

import pytest

from hybrid.planner import Cluster, Layout, Workload, ZeroStage, evaluate, hardware
from hybrid.planner.hardware import H100_500W_CLOCK, H100_EAGER_CLOCK, H100_EFFICIENCY, HOPPER_FLASH
from hybrid.planner.model import ActivationProfile
from hybrid.planner.ops import KernelProfile
from models.config import load_config


def _work(kernels: KernelProfile) -> Workload:
    return Workload(load_config("llama-3-8b"), global_batch=16, seq_length=4096,
                    activations=ActivationProfile.BF16_FLASH, kernels=kernels, fp32_grads=False)


def test_eager_clock_scales_the_tensor_core_terms_and_nothing_else():
    """8 H100s, ZeRO 3, b 2: an eager step on the preset against the same step with the clock at 1. The GEMMs
    (compute-bound at this size: the curve's fixed cost is < 1 % of them) and flash attention take 1 / clock as
    long; memory-bound bytes, launches and the DP collectives do not change."""
    layout = Layout(dp=8, micro_batch=2, zero=ZeroStage.PARAMETERS)
    h100 = hardware("h100-80g")
    clocked = evaluate(_work(KernelProfile.EAGER), Cluster(gpus=8, hw=h100), layout).time
    full = evaluate(_work(KernelProfile.EAGER), Cluster(gpus=8, hw=h100.with_overrides(eager_clock=1.0)), layout).time
    assert clocked.term("attention") == pytest.approx(full.term("attention") / H100_EAGER_CLOCK, rel=1e-9)
    assert clocked.term("gemm") == pytest.approx(full.term("gemm") / H100_EAGER_CLOCK, rel=0.01)
    for name in ("memory_bound", "launches", "optimizer"):
        assert clocked.term(name) == pytest.approx(full.term(name), rel=1e-9)
    assert clocked.total > 1.2 * full.total  # 1 / 0.689 on the tensor-core work, ~70 % of this step


def test_fused_stacks_and_other_cards_keep_the_curve():
    """A Megatron-stack workload on the H100 sees the preset's own asymptote and flash rate; the A100 and the H200
    (whose eager runs are this project's own, fitted at the curve) have no eager clock; the 500 W card has the
    700 W card's stack clock on top of its own 500 W factor (the PyTorch stack sees both)."""
    h100 = hardware("h100-80g")
    assert h100.eager_clock == H100_EAGER_CLOCK
    assert h100.for_stack(pytorch=False) is h100
    eager = h100.for_stack(pytorch=True)
    assert (eager.compute_efficiency, eager.flash_efficiency, eager.eager_clock) == pytest.approx(
        (H100_EFFICIENCY * H100_EAGER_CLOCK, HOPPER_FLASH * H100_EAGER_CLOCK, 1.0))
    assert eager.elementwise_tbps == h100.elementwise_tbps and eager.kernel_overhead_s == h100.kernel_overhead_s
    for name in ("a100-80g", "h200", "cpu"):
        assert hardware(name).eager_clock == 1.0 and hardware(name).for_stack(pytorch=True) is hardware(name)
    w500 = hardware("h100-96g-500w")
    assert w500.eager_clock == H100_EAGER_CLOCK and w500.for_stack(pytorch=False) is w500
    assert w500.compute_efficiency == pytest.approx(H100_EFFICIENCY * H100_500W_CLOCK)
    assert w500.for_stack(pytorch=True).compute_efficiency == pytest.approx(
        H100_EFFICIENCY * H100_500W_CLOCK * H100_EAGER_CLOCK)


def test_a_stated_rate_replaces_the_eager_clock_and_a_bad_clock_is_refused():
    """`--compute-efficiency 0.7` (or a calibrated curve) is the rate a workload runs at: the preset's eager clock
    no longer scales it. An eager clock outside (0, 1] is refused by name."""
    stated = hardware("h100-80g").with_overrides(compute_efficiency=0.7)
    assert stated.eager_clock == 1.0 and stated.for_stack(pytorch=True).compute_efficiency == 0.7
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="eager_clock"):
            hardware("h100-80g").with_overrides(eager_clock=bad)
