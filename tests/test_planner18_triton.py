"""Issue 26, round 18: llm-foundry's Triton attention as a kernel of its own (AttentionKernel.TRITON), at one fitted
share of FlashAttention-2's published rate on every card, unclocked by the PyTorch stack (docs/planner/rounds.md "Round
18"). Cheap: rates from the tables, two MosaicML rows planned. tests/test_planner_fit.py re-derives the share."""

from __future__ import annotations

import pytest

from hybrid.planner.cli import explain
from hybrid.planner.families import all_published_runs
from hybrid.planner.hardware import (FLASH_FWD_BWD_TFLOPS, H100_EAGER_CLOCK, TRITON_FLASH2_SHARE, AttentionKernel,
                                     GpuKind, hardware)
from hybrid.planner.layout import Cluster, Workload
from hybrid.planner.model import ActivationProfile
from hybrid.planner.ops import KernelProfile
from hybrid.planner.published import mpt_model


def _rate(kernel: AttentionKernel, gpu: str, seq: int = 16384) -> float:
    """TFLOP/s of `kernel` as an eager (PyTorch-stack) MPT-1B workload sees the `gpu` preset (Workload.device)."""
    work = Workload(mpt_model("1b", seq), global_batch=8, seq_length=seq, activations=ActivationProfile.BF16_FLASH,
                    kernels=KernelProfile.EAGER, attention_kernel=kernel, fp32_grads=False)
    hw = work.device(hardware(gpu), None)
    return kernel.efficiency(hw, 128, seq) * hw.peak_tflops


@pytest.mark.parametrize("card", [GpuKind.A100_80G, GpuKind.H100_80G])
def test_triton_runs_at_the_share_of_flashattention2s_published_bar_on_either_card(card):
    """At s 16384, head 128, causal: TRITON_FLASH2_SHARE x Figure 4(d) / 7(d)'s FlashAttention-2 bar (102 on A100,
    178 on H100), not x the H100's eager clock, which FlashAttention-2 under the PyTorch stack still gets."""
    bar = FLASH_FWD_BWD_TFLOPS[(card, AttentionKernel.FLASH2, 128, True)][-1]
    assert _rate(AttentionKernel.TRITON, card.value) == pytest.approx(TRITON_FLASH2_SHARE * bar)
    clock = H100_EAGER_CLOCK if card is GpuKind.H100_80G else 1.0
    assert _rate(AttentionKernel.FLASH2, card.value) == pytest.approx(clock * bar)
    assert 0.5 < TRITON_FLASH2_SHARE < 0.6


def test_the_named_long_sequence_rows_come_in_on_both_cards():
    """MPT-1B at s 65536 ran the same Triton kernel on both cards and missed in opposite directions (-17.7 % on A100
    at FlashAttention-1's bars, +24.5 % on H100 at FlashAttention-2's x the clock); at the one share both are within
    3 %, and --explain names the kernel and its rate (178 TFLOP/s on H100: the bars are flat beyond 16k)."""
    runs = {r.name: r for r in all_published_runs()}
    for name in ("MPT-1b, s 65536, 8 A100, FSDP z3, b1 x 2, AC", "MPT-1b, s 65536, 8 H100, FSDP z3, b1 x 2, AC"):
        run = runs[name]
        assert run.workload.attention_kernel is AttentionKernel.TRITON
        plan = run.predict()
        assert abs(run.throughput_error(plan)) < 0.03, name
    text = explain(run.workload, Cluster(gpus=run.gpus, hw=run.hardware()), plan)
    assert "flash attention (triton, head 128, s 65536) at 178 TFLOP/s" in text
