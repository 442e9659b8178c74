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
