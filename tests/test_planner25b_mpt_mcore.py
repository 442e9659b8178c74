"""Round 25 (planner25b): Megatron-Core's unfused loss (landed) and Composer's BACKWARD_POST (what-if).

docs/planner/round25-mpt-mcore.md; hybrid/planner/published25b_mpt_mcore.py."""

from dataclasses import replace
from pathlib import Path

import pytest

from hybrid.planner.layout import Workload
from hybrid.planner.ops import KernelProfile, Traffic, head_ops
from hybrid.planner.published_more import mcore_weak_runs

DOC = Path(__file__).resolve().parents[1] / "docs" / "planner" / "round25-mpt-mcore.md"


def _error(run):
    return run.throughput_error(run.predict())


def test_megatron_unfused_loss_prices_the_in_place_softmax_pass():
    """The six passes of megatron/core/tensor_parallel/cross_entropy.py's forward at f2e5db4: cast (e + 4), max (4),
    subtract (8), exp (8), sum (4), div_ (8) = e + 36 bytes a logit in six kernels; the backward is unchanged."""
    shard = mcore_weak_runs()[0].workload.shard(1)
    e, logits = 2, shard.vocab
    five = Traffic.of(head_ops(shard, False, e, KernelProfile.FUSED))
    six = Traffic.of(head_ops(shard, False, e, KernelProfile.FUSED, megatron_unfused=True))
    assert six.fwd_bytes - five.fwd_bytes == pytest.approx(12 * logits)
    assert (six.fwd_kernels, six.bwd_bytes, six.bwd_kernels) == (five.fwd_kernels + 1, five.bwd_bytes,
                                                                 five.bwd_kernels)
    eager = Traffic.of(head_ops(shard, False, e, KernelProfile.EAGER, megatron_unfused=True))
    assert eager == Traffic.of(head_ops(shard, False, e, KernelProfile.EAGER))  # FUSED only


def test_mcore_rows_plan_the_loss_their_code_ran():
    """The nine weak-scaling rows carry the field (f2e5db4 leaves --cross-entropy-loss-fusion off); the 1.7B and 7.1B
    move from +26.2 / +15.6 % (the five-pass loss) to +23.1 / +14.8 %. Reverting the field in published_more fails."""
    runs = mcore_weak_runs()
    assert all(r.workload.megatron_unfused_loss for r in runs)
    small, seven = runs[0], runs[1]
    assert small.name.startswith("Megatron-Core 1.7B") and seven.name.startswith("Megatron-Core 7.1B")
    assert _error(small) == pytest.approx(0.231, abs=0.003)
    assert _error(seven) == pytest.approx(0.148, abs=0.003)
    off = [replace(r, workload=replace(r.workload, megatron_unfused_loss=False)) for r in (small, seven)]
    assert [_error(r) for r in off] == pytest.approx([0.262, 0.156], abs=0.003)


def test_megatron_unfused_loss_refuses_a_second_loss():
    work = mcore_weak_runs()[0].workload
    with pytest.raises(ValueError, match="megatron_unfused_loss.*one loss at a time"):
        Workload(work.model, global_batch=8, seq_length=1024, activations=work.activations,
                 megatron_unfused_loss=True, fused_cross_entropy=True)


def test_backward_post_what_if_moves_mosaic_rows_only_inside_its_block():
    """The what-if serialises the backward all-gather of MosaicML's ZeRO 3 rows (70B at 64 A100 40GB +35.2 ->
    +29.6 %), leaves a Megatron row alone, and the shipped model is back after the block."""
    from hybrid.planner.published25b_mpt_mcore import _runs, backward_post_prefetch
    runs = _runs()
    seventy = runs["MPT-70b, s 2048, 64 A100 40GB, FSDP z3, b2 x 1, AC"]
    mcore = mcore_weak_runs()[0]
    shipped = (_error(seventy), _error(mcore))
    with backward_post_prefetch():
        post = (_error(seventy), _error(mcore))
    assert shipped[0] == pytest.approx(0.352, abs=0.003)
    assert post[0] == pytest.approx(0.296, abs=0.005)
    assert post[1] == pytest.approx(shipped[1])
    assert _error(seventy) == pytest.approx(shipped[0])


def test_doc_holds_the_module_tables():
    """docs/planner/round25-mpt-mcore.md carries every line the module prints by default."""
    from hybrid.planner.published25b_mpt_mcore import (backward_post_rows, mcore_flops_check, mcore_loss_table,
                                                        same_command_table, stack_table)
    text = DOC.read_text()
    for block in (stack_table(), same_command_table(), backward_post_rows(), mcore_flops_check(), mcore_loss_table()):
        for line in block.splitlines():
            assert line in text, line
