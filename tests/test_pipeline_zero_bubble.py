"""The zero-bubble schedules as data: ZB-H1 and ZBV (Qi et al. 2024, "Zero Bubble Pipeline Parallelism").

* The compute lists equal torch.distributed.pipelining's, op for op, for pp 1..8 and m 1..4 pp: ZBV against
  `ScheduleZBVZeroBubble`, ZB-H1 against `ScheduleInterleavedZeroBubble` with one stage a rank (torch's "ZB1P").
* The simulated makespans equal closed forms (tF, tB, tW per chunk and micro-batch, free communication):
    ZB-H1: m (tF + tB + tW) + (p - 1)(tF + tB) - min(m - 1, p - 1) tW      (tW <= min(tF, tB))
           so for m >= p the bubble is (p - 1)(tF + tB - tW): a third of 1F1B's (p - 1)(tF + tB + tW) at equal costs
    ZBV, tF = tB = tW = t: 6 m t + max(2 (2p - 1 - m), p - 1) t; for m >= (3p - 1)/2 the bubble is (p - 1) t per
           rank, a sixth of 1F1B's on the same model (each 1F1B stage is two chunks: 6 (p - 1) t).
The structural properties every schedule shares (each compute once, messages paired, no deadlock, lazy waits
optimal, in-flight peaks) run over ZB-H1 and ZBV in tests/test_pipeline_schedules.py.
"""

from __future__ import annotations

import functools
import random

import pytest
from torch.distributed.pipelining.schedules import (
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
    _ComputationType,
)

from hybrid.pipeline import Costs, Op, Placement, ScheduleKind, build_schedule, compute_order, format_timeline, simulate
from hybrid.pipeline.schedules import rank_chunk_of, stage_of

ZB_H1, ZBV, ONE_F_ONE_B = ScheduleKind.ZB_H1, ScheduleKind.ZBV, ScheduleKind.ONE_F_ONE_B
TORCH_OP = {_ComputationType.FORWARD: Op.FORWARD, _ComputationType.BACKWARD_INPUT: Op.BACKWARD_INPUT,
            _ComputationType.BACKWARD_WEIGHT: Op.BACKWARD_WEIGHT}


# --- torch's lists, generated without processes ----------------------------------------------------------------
#
# The schedules' constructors want PipelineStage objects (a process group); the per-rank generator
# `_calculate_single_rank_operations` reads only a few sizes, so we set those on an uninitialised instance. Its
# output is torch's pipeline_order before `_prepare_schedule_with_comms` adds the sends and receives.
# Differences, each stated: torch pads the lists with None (idle slots of its lock-step picture; we drop them);
# torch names stages globally (we map our (rank, local chunk) through the placement); torch's ZB1P constructor
# also rejects m that is not a multiple of max(1, m // p) "rounds", a constraint of its interleaved indexing that
# one stage a rank does not have (we allow every m; the generator itself is the same for every m); the
# communication placement is ours (`schedules._with_communication`, deadlock-free by construction), not torch's.


def _torch_zbv(pp: int, m: int) -> dict[int, list]:
    s = object.__new__(ScheduleZBVZeroBubble)
    s.pp_group_size, s.num_stages, s._n_microbatches = pp, 2 * pp, m
    return {r: [a for a in s._calculate_single_rank_operations(r) if a is not None] for r in range(pp)}


def _torch_zb1p(pp: int, m: int) -> dict[int, list]:
    s = object.__new__(ScheduleInterleavedZeroBubble)
    s.pp_group_size, s.n_local_stages, s._n_microbatches = pp, 1, m
    s.number_of_rounds = max(1, m // pp)
    s.microbatches_per_round = m // s.number_of_rounds
    return {r: [a for a in s._calculate_single_rank_operations(r) if a is not None] for r in range(pp)}


@pytest.mark.parametrize("kind", [ZBV, ZB_H1], ids=lambda k: k.value)
def test_compute_lists_equal_torch_op_for_op(kind):
    for pp in range(1, 9):
        for m in range(1, 4 * pp + 1):
            theirs = _torch_zbv(pp, m) if kind is ZBV else _torch_zb1p(pp, m)
            v = 2 if kind is ZBV else 1
            for rank in range(pp):
                ours = [(a.op, a.microbatch, stage_of(rank, a.chunk, pp, kind.placement))
                        for a in compute_order(kind, pp, rank, m, v)]
                torch_ops = [(TORCH_OP[a.computation_type], a.microbatch_index, a.stage_index) for a in theirs[rank]]
                assert ours == torch_ops, (kind, pp, m, rank)


# --- structure ---------------------------------------------------------------------------------------------------


def test_zb_h1_runs_1f1b_order_with_each_backward_split_and_rank_r_deferring_r_weight_passes():
    for pp in range(1, 9):
        for m in range(1, 3 * pp + 1):
            for rank in range(pp):
                zb = compute_order(ZB_H1, pp, rank, m)
                fb = compute_order(ONE_F_ONE_B, pp, rank, m)
                as_1f1b = [a if a.op is Op.FORWARD else a.__class__(Op.BACKWARD, a.microbatch) for a in zb
                           if a.op is not Op.BACKWARD_WEIGHT]
                assert as_1f1b == fb, (pp, m, rank)
                first_w = next(i for i, a in enumerate(zb) if a.op is Op.BACKWARD_WEIGHT)
                b_before = sum(1 for a in zb[:first_w] if a.op is Op.BACKWARD_INPUT)
                assert b_before == min(rank + 1, m), (pp, m, rank)
                ws = [a.microbatch for a in zb if a.op is Op.BACKWARD_WEIGHT]
                assert ws == sorted(ws), "W's in micro-batch order: .grad accumulates as 1F1B's does"


def test_zbv_places_stage_r_and_2p_minus_1_minus_r_on_rank_r():
    for pp in range(1, 9):
        stages = sorted(stage_of(r, c, pp, Placement.V) for r in range(pp) for c in range(2))
        assert stages == list(range(2 * pp))
        for s in range(2 * pp):
            assert stage_of(*rank_chunk_of(s, pp, Placement.V), pp, Placement.V) == s
        assert rank_chunk_of(0, pp, Placement.V) == (0, 0) and rank_chunk_of(2 * pp - 1, pp, Placement.V) == (0, 1)


def test_zbv_turn_of_the_v_is_handed_over_in_memory():
    """Stages pp - 1 and pp are both on rank pp - 1: no message between them; rank 0 sends nothing to rank pp-1."""
    pp, m = 4, 8
    lists = build_schedule(ZBV, pp, m, 2)
    last = lists[pp - 1]
    assert not any(a.op.is_send and a.peer == pp - 1 for a in last)
    assert {a.peer for a in last if not a.op.is_compute} == {pp - 2}
    assert {a.peer for a in lists[0] if not a.op.is_compute} == {1}


def test_weight_passes_send_and_receive_nothing():
    for kind, v in ((ZB_H1, 1), (ZBV, 2)):
        for actions in build_schedule(kind, 4, 8, v):
            for before, a in zip(actions, actions[1:]):
                if a.op.is_send:
                    assert before.op is not Op.BACKWARD_WEIGHT


@pytest.mark.parametrize("kind, v, match", [(ZBV, 1, "^v .*2 for zbv"), (ZBV, 3, "^v "), (ZB_H1, 2, "^v ")])
def test_wrong_chunks_per_rank_are_rejected_naming_v(kind, v, match):
    with pytest.raises(ValueError, match=match):
        build_schedule(kind, 2, 4, v)


# --- closed forms --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _built(kind: ScheduleKind, pp: int, m: int, v: int = 1) -> tuple[tuple, ...]:
    """build_schedule(kind, pp, m, v), built once for the module's simulations: the closed-form tests simulate one
    schedule under several costs (six parametrised cost sets, t in (1, 2.5), the bubble comparisons) and building it
    took half their time. Deterministic in its arguments; tuples, so no simulation can change what the next reads."""
    return tuple(tuple(actions) for actions in build_schedule(kind, pp, m, v))


def _zb_costs(tf: float, tb: float, tw: float) -> Costs:
    return Costs(forward=tf, backward=tb + tw, weight_share=tw / (tb + tw))


def _zb_h1_makespan(pp: int, m: int, tf: float, tb: float, tw: float) -> float:
    return m * (tf + tb + tw) + (pp - 1) * (tf + tb) - min(m - 1, pp - 1) * tw


@pytest.mark.parametrize("tf, tb, tw", [(1, 1, 1), (1, 2, 1), (2, 1, 1), (1, 1.5, 0.5), (3, 2, 2), (1, 1, 0.25)])
def test_zb_h1_makespan_is_the_closed_form(tf, tb, tw):
    for pp in range(1, 9):
        for m in range(1, 3 * pp + 1):
            result = simulate(_built(ZB_H1, pp, m), _zb_costs(tf, tb, tw))
            assert result.makespan == pytest.approx(_zb_h1_makespan(pp, m, tf, tb, tw), abs=1e-9), (pp, m)


def test_zb_h1_closed_form_holds_for_random_costs_with_w_no_longer_than_f_or_b():
    rng = random.Random(0)
    for _ in range(200):
        pp, tf, tb = rng.randint(1, 8), rng.uniform(0.2, 3), rng.uniform(0.2, 3)
        m, tw = rng.randint(1, 3 * pp), rng.uniform(0.05, min(tf, tb))
        result = simulate(_built(ZB_H1, pp, m), _zb_costs(tf, tb, tw))
        assert result.makespan == pytest.approx(_zb_h1_makespan(pp, m, tf, tb, tw), rel=1e-12), (pp, m, tf, tb, tw)


def test_zb_h1_bubble_is_a_third_of_1f1b_at_equal_costs():
    """tF = tB = tW: bubble fraction (p - 1)/(3 m + p - 1) against 1F1B's 3 (p - 1)/(3 m + 3 (p - 1)), m >= p."""
    for pp in range(2, 9):
        for m in range(pp, 3 * pp + 1):
            zb = simulate(_built(ZB_H1, pp, m), _zb_costs(1, 1, 1))
            fb = simulate(_built(ONE_F_ONE_B, pp, m), Costs(forward=1, backward=2))
            assert zb.bubble_fraction == pytest.approx((pp - 1) / (3 * m + pp - 1), abs=1e-12)
            assert (fb.makespan - 3 * m) == 3 * (zb.makespan - 3 * m), (pp, m)


def test_zbv_makespan_at_equal_costs_is_the_closed_form():
    for pp in range(1, 9):
        for m in range(1, 4 * pp + 1):
            for t in (1.0, 2.5):
                result = simulate(_built(ZBV, pp, m, 2), _zb_costs(t, t, t), placement=Placement.V)
                expected = 6 * m * t + max(2 * (2 * pp - 1 - m), pp - 1) * t
                assert result.makespan == pytest.approx(expected, abs=1e-9), (pp, m, t)
                assert result.busy == pytest.approx((6 * m * t,) * pp)


def test_zbv_bubble_is_a_sixth_of_1f1b_on_the_same_model():
    """Each 1F1B stage is two ZBV chunks: whole-stage costs 2t each, bubble 6 (p - 1) t against ZBV's (p - 1) t."""
    for pp in range(2, 9):
        for m in range(2 * pp, 4 * pp + 1):
            zbv = simulate(_built(ZBV, pp, m, 2), _zb_costs(1, 1, 1), placement=Placement.V)
            fb = simulate(_built(ONE_F_ONE_B, pp, m), Costs(forward=2, backward=4))
            assert fb.makespan - 6 * m == 6 * (zbv.makespan - 6 * m) == 6 * (pp - 1), (pp, m)


def test_a_wrong_placement_is_caught_by_the_payload_check():
    with pytest.raises(ValueError, match="payloads differ"):
        simulate(build_schedule(ZBV, 4, 8, 2), _zb_costs(1, 1, 1))  # LOOP placement: messages mismatch


def test_format_timeline_draws_b_and_w():
    result = simulate(build_schedule(ZB_H1, 2, 3), _zb_costs(1, 1, 1))
    assert format_timeline(result) == (
        "rank 0 | F0 F1 .. B0 W0 F2 B1 W1 B2 W2\n"
        "rank 1 | .. F0 B0 F1 B1 W0 F2 B2 W1 W2"
    )
