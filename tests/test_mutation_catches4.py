"""Tests added by the fourth mutation pass (round 9): the zero-bubble schedules and the B/W split, gradient
compression (PowerSGD, 1-bit Adam, DiLoCo), MoE and context parallelism were each broken on purpose by one edit
and their own fast tests run; these catch the breaks that survived them. In process, no launch. The report's
table lists every mutation and what caught it.

* zero bubble, `dependencies` of a W without its own B: the unit-time check that `build_schedule` runs on every
  compute order then accepts an order that runs a W before its B (nothing else read a W's dependency: every
  order the library builds is valid, so only a wrong order could tell).
"""

from __future__ import annotations

import pytest
import torch


# --- zero bubble ----------------------------------------------------------------------------------------------------
def test_an_order_running_a_w_before_its_own_b_cannot_run():
    """ZB-H1, pp 2, m 3: swap rank 0's first B and the W of the same micro-batch (its W then precedes its B).
    W needs the output gradients B keeps, so the order cannot run and the communication pass must say so; the
    unswapped orders build."""
    from hybrid.pipeline.schedules import (Op, ScheduleKind, _with_communication, compute_order,
                                           dependencies)
    pp, m = 2, 3
    orders = [compute_order(ScheduleKind.ZB_H1, pp, rank, m) for rank in range(pp)]
    _with_communication(orders, pp, 1)  # the library's own orders run
    rank0 = orders[0]
    b = next(i for i, a in enumerate(rank0) if a.op is Op.BACKWARD_INPUT and a.microbatch == 0)
    w = next(i for i, a in enumerate(rank0) if a.op is Op.BACKWARD_WEIGHT and a.microbatch == 0)
    assert b < w
    rank0[b], rank0[w] = rank0[w], rank0[b]
    with pytest.raises(ValueError, match="cannot run"):
        _with_communication(orders, pp, 1)
    # each W waits for the B of its own micro-batch and stage, nothing else (it sends and receives nothing)
    for rank in range(pp):
        for a in orders[rank]:
            if a.op is Op.BACKWARD_WEIGHT:
                assert dependencies(a, rank, pp, 1) == [("B", a.microbatch, rank)]


# --- MoE expert-TP collectives ----------------------------------------------------------------------------------------
class _TwoRanks:
    """Rank `rank` of a 2-rank group whose all-to-all-v reads every rank's input, given with how each rank splits
    it (`splits[i]`; default: as this rank does): rows [sum in_splits[:j], +in_splits[j]) go to rank j."""

    size = 2

    def __init__(self, rank: int, inputs: list[torch.Tensor], splits: list[list[int]] | None = None):
        self.rank, self.inputs, self.splits = rank, inputs, splits

    def all_to_all_v(self, x, out_splits, in_splits, tag=""):
        assert torch.equal(x, self.inputs[self.rank])
        splits = self.splits or [in_splits] * 2
        out = torch.cat([src.split(s)[self.rank] for src, s in zip(self.inputs, splits)])
        assert out.shape[0] == sum(out_splits)
        return out


def test_expert_tp_reduce_scatter_v_sums_every_ranks_partial_of_its_block():
    """reduce_scatter_rows_v on 2 expert-TP ranks with uneven blocks (2 and 3 rows): rank r gets sum_i Y_i[block r]
    (each rank's slice of the experts computed a partial of every gathered row); gather_rows_v puts the blocks
    back in rank order."""
    from hybrid.moe.comm import gather_rows_v, reduce_scatter_rows_v
    sizes, g = [2, 3], torch.Generator().manual_seed(0)
    partials = [torch.randn(5, 4, generator=g) for _ in range(2)]
    total = partials[0] + partials[1]
    for r in range(2):
        got = reduce_scatter_rows_v(partials[r], _TwoRanks(r, partials), sizes)
        torch.testing.assert_close(got, total.split(sizes)[r], rtol=0, atol=1e-6)
    rows = [torch.randn(n, 4, generator=g) for n in sizes]
    copies = [rows[r].repeat(2, 1) for r in range(2)]  # what gather_rows_v sends: its rows to every rank
    for r in range(2):
        torch.testing.assert_close(gather_rows_v(rows[r], _TwoRanks(r, copies, [[n, n] for n in sizes]), sizes), torch.cat(rows))
