"""Workload.attention_kernel (issue 26, seventh round; docs/planner.md "Attention kernels of the published runs"):
the FlashAttention-1-class kernel MosaicML's MPT runs used, at its published A100 rate, and the head width flash
kernels pad to. Tiny planner-only checks, no search of a published table (tests/test_planner_published.py and
tests/test_planner_morerows.py check the rows themselves)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hybrid.planner.hardware import A100_FLASH, FLASH1_A100, AttentionKernel, hardware
from hybrid.planner.layout import Cluster, Layout, Workload
from hybrid.planner.model import ActivationProfile
from hybrid.planner.published import MPT_SIZES, mpt_attention_kernel, mpt_model, mpt_runs
from hybrid.planner.published_more import mpt_a100_runs, mpt_h100_runs
from hybrid.planner.time import _context, layer_passes


def _attention(work: Workload, gpu: str) -> float:
    """Forward flash seconds of one layer, one micro-batch of 1, on one `gpu`."""
    forward, _ = layer_passes(_context(work, Cluster(gpus=1, hw=hardware(gpu)), Layout(micro_batch=1)))
    return forward.attention


def _mpt(size: str, seq: int, kernel: AttentionKernel | None = None) -> Workload:
    work = Workload(mpt_model(size, seq), global_batch=8, seq_length=seq, activations=ActivationProfile.BF16_FLASH)
    return work if kernel is None else replace(work, attention_kernel=kernel)


def test_published_rates_are_the_figures_numbers():
    """FlashAttention-2 paper, Figure 4(d) (A100, causal, head dim 128, 16k): Triton 80 TFLOP/s of 312."""
    assert FLASH1_A100 * 312.0 == pytest.approx(80.0)
    assert AttentionKernel.FLASH1.efficiency(hardware("a100-80g")) == pytest.approx(80.0 / 312.0)
    assert AttentionKernel.FLASH2.efficiency(hardware("a100-80g")) == A100_FLASH


def test_default_is_flash2_and_flash1_is_slower_by_the_published_ratio():
    """MPT-1B (head 128, no padding either way): the attention term grows by A100_FLASH / FLASH1_A100 and nothing
    else moves; the default workload is FlashAttention-2's."""
    assert _mpt("1b", 8192).attention_kernel is AttentionKernel.FLASH2
    fa2 = _attention(_mpt("1b", 8192), "a100-80g")
    fa1 = _attention(_mpt("1b", 8192, AttentionKernel.FLASH1), "a100-80g")
    assert fa1 / fa2 == pytest.approx(A100_FLASH / FLASH1_A100)


@pytest.mark.parametrize("kernel, d, padded", [(AttentionKernel.FLASH2, 64, 64), (AttentionKernel.FLASH2, 80, 96),
                                               (AttentionKernel.FLASH2, 112, 128), (AttentionKernel.FLASH2, 128, 128),
                                               (AttentionKernel.FLASH1, 64, 64), (AttentionKernel.FLASH1, 80, 128),
                                               (AttentionKernel.FLASH1, 112, 128), (AttentionKernel.FLASH1, 8, 16)])
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
    with pytest.raises(ValueError, match="attention_kernel flash1 has a published rate on A100 only"):
        _attention(_mpt("1b", 2048, AttentionKernel.FLASH1), "h100-80g")
    with pytest.raises(ValueError, match="Workload.attention_kernel must be an AttentionKernel"):
        replace(_mpt("1b", 2048), attention_kernel="flash1")


def test_mpt_rows_carry_the_kernel_their_source_names():
    """Every A100 row (llm-foundry's default `attn_impl: triton`) is FLASH1; H100 rows keep FLASH2's rate (no
    published rate for that kernel there; the H100 clock was fitted over them)."""
    runs = mpt_runs() + mpt_a100_runs() + mpt_h100_runs()
    assert {r.workload.attention_kernel for r in runs if r.gpu == "a100-80g"} == {AttentionKernel.FLASH1}
    assert {r.workload.attention_kernel for r in runs if r.gpu != "a100-80g"} == {AttentionKernel.FLASH2}
    assert mpt_attention_kernel("a100-80g") is AttentionKernel.FLASH1
