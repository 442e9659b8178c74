"""Workload.attention_kernel (issue 26, rounds 7-8; docs/planner/rounds.md "Attention kernels of the published runs"):
the kernels' published rates by card, head width, mask and sequence length (hardware.FLASH_FWD_BWD_TFLOPS), the
FlashAttention-1-class kernel MosaicML's MPT runs used, the head width flash kernels pad to, and the FLOP count the
rates are quoted in (causal: half the square; backward 2.5x the forward). Tiny planner-only checks, no search of a
published table (tests/test_planner_published.py and tests/test_planner_morerows.py check the rows themselves)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from hybrid.planner.hardware import (A100_FLASH, FLASH1_A100, FLASH_FWD_BWD_TFLOPS, FLASH_SEQS, HOPPER_FLASH,
                                     TRITON_FLASH2_SHARE, AttentionKernel, GpuKind, flash_tflops, hardware)
from hybrid.planner.layout import Cluster, Layout, Workload
from hybrid.planner.model import ActivationProfile
from hybrid.planner.published import MPT_SIZES, mpt_attention_kernel, mpt_model, mpt_runs
from hybrid.planner.published_more import mpt_a100_runs, mpt_h100_runs
from hybrid.planner.time import FLASH_BACKWARD, _context, layer_passes


def _attention(work: Workload, gpu: str) -> float:
    """Forward flash seconds of one layer, one micro-batch of 1, on one `gpu`."""
    forward, _ = layer_passes(_context(work, Cluster(gpus=1, hw=hardware(gpu)), Layout(micro_batch=1)))
    return forward.attention


def _mpt(size: str, seq: int, kernel: AttentionKernel | None = None) -> Workload:
    work = Workload(mpt_model(size, seq), global_batch=8, seq_length=seq, activations=ActivationProfile.BF16_FLASH,
                    fp32_grads=False)
    return work if kernel is None else replace(work, attention_kernel=kernel)


def test_published_rates_are_the_figures_numbers():
    """FlashAttention-2 paper (assets/flash2_{a100,h100}_fwd_bwd_benchmark.png at 4f285b3), forward + backward
    TFLOP/s at 512 / 1k / 2k / 4k / 8k / 16k: Figure 4(d) A100 causal head 128, FlashAttention-2 and -1 (CUDA);
    4(c) head 64; Figure 7(d) H100; and the presets' shares are the 16k FlashAttention-2 bars over the peaks."""
    table = FLASH_FWD_BWD_TFLOPS
    assert FLASH_SEQS == (512, 1024, 2048, 4096, 8192, 16384)
    assert table[GpuKind.A100_80G, AttentionKernel.FLASH2, 128, True] == (99, 133, 155, 173, 182, 189)
    assert table[GpuKind.A100_80G, AttentionKernel.FLASH1, 128, True] == (55, 62, 69, 76, 80, 83)
    assert table[GpuKind.A100_80G, AttentionKernel.FLASH2, 64, True] == (88, 119, 140, 156, 165, 171)
    assert table[GpuKind.A100_80G, AttentionKernel.FLASH1, 64, True] == (58, 70, 77, 87, 92, 97)
    assert table[GpuKind.H100_80G, AttentionKernel.FLASH2, 128, True] == (163, 221, 265, 294, 308, 328)
    assert table[GpuKind.H100_80G, AttentionKernel.FLASH1, 128, True] == (98, 109, 108, 126, 135, 137)
    assert table[GpuKind.H100_80G, AttentionKernel.FLASH2, 128, False] == (248, 294, 320, 326, 335, 338)
    assert (A100_FLASH * 312.0, HOPPER_FLASH * 989.0, FLASH1_A100 * 312.0) == pytest.approx((189.0, 328.0, 83.0))
    for gpu, card in (("a100-80g", GpuKind.A100_80G), ("h100-80g", GpuKind.H100_80G), ("h200", GpuKind.H100_80G)):
        hw = hardware(gpu)
        assert hw.flash_rates == card.value
        for kernel in AttentionKernel:
            for i, s in enumerate(FLASH_SEQS):
                rate = kernel.efficiency(hw, 128, s) * hw.peak_tflops
                if kernel is AttentionKernel.TRITON:  # no published bar: the fitted share of FlashAttention-2's
                    bar = table[card, AttentionKernel.FLASH2, 128, True][i]
                    assert rate == pytest.approx(TRITON_FLASH2_SHARE * bar, rel=1e-12)
                else:
                    assert rate == pytest.approx(table[card, kernel, 128, True][i], rel=1e-12)


def test_rates_between_and_beyond_the_benchmark_lengths():
    """Linear in log2(s) between the figure's lengths, flat past 16k and below 512; head widths <= 64 take the
    head-64 bars, wider ones (after the kernel's padding) head 128's; a mask the figures lack is refused."""
    a100 = hardware("a100-80g")
    log3 = math.log2(3)  # s 3k: log2(3) - 1 of the way from the 2k bar (155) to the 4k bar (173)
    assert flash_tflops(GpuKind.A100_80G, AttentionKernel.FLASH2, 128, 3 * 1024) == pytest.approx(155 + (log3 - 1) * 18)
    assert flash_tflops("a100-80g", AttentionKernel.FLASH2, 128, 2896) == pytest.approx(164.0, rel=1e-4)  # 2k x 2^0.5
    assert flash_tflops(GpuKind.A100_80G, AttentionKernel.FLASH2, 128, 65536) == 189.0
    assert flash_tflops(GpuKind.A100_80G, AttentionKernel.FLASH2, 128, 128) == 99.0
    assert AttentionKernel.FLASH2.efficiency(a100, 64, 8192) * 312.0 == pytest.approx(165.0)
    assert AttentionKernel.FLASH2.efficiency(a100, 80, 8192) * 312.0 == pytest.approx(182.0)  # 80 -> 96: head 128's
    assert AttentionKernel.FLASH1.efficiency(a100, 48, 8192) * 312.0 == pytest.approx(92.0)  # 48 -> 64
    with pytest.raises(ValueError, match="flash2 has no published rate on a100-80g .no mask"):
        AttentionKernel.FLASH2.efficiency(a100, 128, 4096, causal=False)
    with pytest.raises(ValueError, match="flash_rates must be None or a card with published flash rates"):
        replace(a100, flash_rates="v100")


def test_causal_half_and_the_backwards_2_5x_are_what_the_rates_count():
    """One MPT-1B layer (24 x 2048, 16 heads of 128) at s 8192 on an A100: forward flash seconds = half of QK^T and
    PV's 4 b s^2 h FLOPs over Figure 4(d)'s 182 TFLOP/s, backward 2.5x that -- so forward + backward is 3.5 x half
    the square over the benchmark's rate, as its `flops` counts (dropping the causal half or the 2.5 fails here)."""
    b, s, h = 1, 8192, 2048
    forward, backward = layer_passes(_context(_mpt("1b", s), Cluster(gpus=1, hw=hardware("a100-80g")),
                                              Layout(micro_batch=b)))
    assert forward.attention == pytest.approx(4 * b * s * s * h / 2 / 182e12, rel=1e-9)
    assert backward.attention == pytest.approx(2.5 * forward.attention, rel=1e-9)
    assert FLASH_BACKWARD == 2.5


def test_default_is_flash2_and_flash1_is_slower_by_the_published_ratio():
    """MPT-1B (head 128, no padding either way) at s 8192: the attention term grows by Figure 4(d)'s FlashAttention-2
    / FlashAttention-1 bars at 8k (182 / 80) and nothing else moves; the default workload is FlashAttention-2's."""
    assert _mpt("1b", 8192).attention_kernel is AttentionKernel.FLASH2
    fa2 = _attention(_mpt("1b", 8192), "a100-80g")
    fa1 = _attention(_mpt("1b", 8192, AttentionKernel.FLASH1), "a100-80g")
    assert fa1 / fa2 == pytest.approx(182.0 / 80.0)


@pytest.mark.parametrize("kernel, d, padded", [(AttentionKernel.FLASH2, 64, 64), (AttentionKernel.FLASH2, 80, 96),
                                               (AttentionKernel.FLASH2, 112, 128), (AttentionKernel.FLASH2, 128, 128),
                                               (AttentionKernel.FLASH1, 64, 64), (AttentionKernel.FLASH1, 80, 128),
                                               (AttentionKernel.FLASH1, 112, 128), (AttentionKernel.FLASH1, 8, 16),
                                               (AttentionKernel.TRITON, 80, 128), (AttentionKernel.TRITON, 112, 128)])
def test_padded_head_dims_are_the_kernels_tiles(kernel, d, padded):
    """flash-attn 2.4.2 HEADDIM_SWITCH (32, 64, 96, 128, ...); llm-foundry's Triton kernel next_power_of_2 (>= 16)."""
    assert kernel.padded_head_dim(d) == padded


def test_mpt_30b_head_width_112_is_timed_as_128():
    """MPT-30B (h 7168, 64 heads: head dim 112): its attention costs 128 / 112 of an unpadded head's, on H100 under
    FlashAttention-2 -- checked against the same model at a width the kernel does not pad (head dim 128)."""
    layers, d, heads = MPT_SIZES["30b"]
    assert d // heads == 112
    work = _mpt("30b", 4096)
    same_flops = replace(work, model=replace(work.model, num_heads=56, head_dim=128))  # 56 x 128 = 64 x 112
    assert _attention(work, "h100-80g") / _attention(same_flops, "h100-80g") == pytest.approx(128 / 112)


def test_flash1_is_refused_where_no_rate_is_published():
    """A device without a benchmark table (built by hand: Hardware.flash_rates None) runs FlashAttention-2 at its
    flash_efficiency flat and refuses FLASH1, by the field, not by the device's name."""
    bare = replace(hardware("h100-80g"), flash_rates=None)
    assert AttentionKernel.FLASH2.efficiency(bare, 128, 2048) == bare.flash_efficiency
    with pytest.raises(ValueError, match="attention_kernel flash1 has no published rate on h100-80g"):
        AttentionKernel.FLASH1.efficiency(bare, 128, 2048)
    with pytest.raises(ValueError, match="Workload.attention_kernel must be an AttentionKernel"):
        replace(_mpt("1b", 2048), attention_kernel="flash1")


def test_mpt_rows_carry_the_kernel_their_source_names():
    """Every MosaicML row ran llm-foundry's default `attn_impl: triton` (TRITON) but the H100 ">= 128 GPUs" table's
    1B, 3B, 7B and 70B (sweep.py `--attn_impl flash`, flash-attn 2.4.2: FLASH2): the workload's field says which
    (docs/planner/rounds.md "Round 18"), on either card."""
    runs = mpt_runs() + mpt_a100_runs() + mpt_h100_runs()
    assert {r.workload.attention_kernel for r in runs if r.gpu == "a100-80g"} == {AttentionKernel.TRITON}
    flash2 = [r for r in runs if r.workload.attention_kernel is AttentionKernel.FLASH2]
    assert len(flash2) == 12 and all(r.gpu == "h100-80g" and r.gpus >= 128 for r in flash2)
    assert {r.name.split(",")[0] for r in flash2} == {"MPT-1b", "MPT-3b", "MPT-7b", "MPT-70b"}
    assert mpt_attention_kernel("a100-80g", "7b", 256) is AttentionKernel.TRITON
    assert mpt_attention_kernel("h100-80g", "13b", 256) is AttentionKernel.TRITON
    assert mpt_attention_kernel("h100-80g", "7b", 256) is AttentionKernel.FLASH2
