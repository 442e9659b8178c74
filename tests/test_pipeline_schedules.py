"""Pipeline schedules and their simulation: pure lists, no processes.

Each property is checked on every configuration the schedules promise to support: GPipe, 1F1B and ZB-H1 for pp in
1..8 and m in 1..3 pp; ZBV (v = 2) likewise; interleaved for pp in 1..8, v in {1, 2, 3} and m in {pp, 2 pp, 3 pp}.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from fractions import Fraction

import pytest

from hybrid.pipeline import (
    Action,
    Costs,
    DeadlockError,
    Op,
    Phase,
    Placement,
    ScheduleKind,
    SimResult,
    Transfer,
    build_schedule,
    compute_phases,
    format_timeline,
    rank_chunk_of,
    simulate,
    stage_of,
    warmup_forwards,
)

GPIPE, ONE_F_ONE_B, INTERLEAVED = ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED
ZB_H1, ZBV = ScheduleKind.ZB_H1, ScheduleKind.ZBV
BACKWARDS = (Op.BACKWARD, Op.BACKWARD_INPUT)  # what consumes the output gradient: a full backward, or B


def _configs() -> list[tuple[ScheduleKind, int, int, int]]:
    out = []
    for pp in range(1, 9):
        out += [(kind, pp, m, 1) for kind in (GPIPE, ONE_F_ONE_B, ZB_H1) for m in range(1, 3 * pp + 1)]
        out += [(INTERLEAVED, pp, m, v) for v in (1, 2, 3) for m in (pp, 2 * pp, 3 * pp)]
        out += [(ZBV, pp, m, 2) for m in range(1, 3 * pp + 1)]
    return out


CONFIGS = _configs()


@functools.lru_cache(maxsize=None)
def _schedule(kind: ScheduleKind, pp: int, m: int, v: int) -> tuple[tuple[Action, ...], ...]:
    return tuple(tuple(actions) for actions in build_schedule(kind, pp, m, v))


@functools.lru_cache(maxsize=None)
def _unit_sim(kind: ScheduleKind, pp: int, m: int, v: int) -> SimResult:
    """tf = tb = 1 per chunk for the fused backward; the zero-bubble kinds with tF = tB = tW = 1 (the paper's
    equal costs)."""
    costs = Costs(forward=1.0, backward=2.0) if kind.splits_backward else Costs()
    return simulate([list(a) for a in _schedule(kind, pp, m, v)], costs, placement=kind.placement)


def _computes(actions, op: Op) -> list[tuple[int, int]]:
    return [(a.microbatch, a.chunk) for a in actions if a.op is op]


# --- structure of the lists --------------------------------------------------------------------------------


def test_every_microbatch_is_forwarded_and_backwarded_once_per_chunk():
    """Once F and once the full backward -- or, for the zero-bubble kinds, once B and once W."""
    for kind, pp, m, v in CONFIGS:
        expected = Counter((mb, c) for mb in range(m) for c in range(v))
        backward_ops = (Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT) if kind.splits_backward else (Op.BACKWARD,)
        for actions in _schedule(kind, pp, m, v):
            assert Counter(_computes(actions, Op.FORWARD)) == expected, (kind, pp, m, v)
            for op in backward_ops:
                assert Counter(_computes(actions, op)) == expected, (kind, pp, m, v, op)
            assert not any(a.op is Op.BACKWARD for a in actions) or not kind.splits_backward


def test_every_backward_comes_after_its_forward_and_every_w_after_its_b_on_the_same_rank_and_chunk():
    for kind, pp, m, v in CONFIGS:
        for actions in _schedule(kind, pp, m, v):
            forwarded, b_done = set(), set()
            for a in actions:
                if a.op is Op.FORWARD:
                    forwarded.add((a.microbatch, a.chunk))
                elif a.op in BACKWARDS:
                    assert (a.microbatch, a.chunk) in forwarded, (kind, pp, m, v, a)
                    b_done.add((a.microbatch, a.chunk))
                elif a.op is Op.BACKWARD_WEIGHT:
                    assert (a.microbatch, a.chunk) in b_done, (kind, pp, m, v, a)


def _needs_recv(op: Op, rank: int, chunk: int, pp: int, v: int, placement: Placement) -> bool:
    """A forward needs an activation unless it is stage 0; a backward (or B) a gradient unless it is the last
    stage; a W nothing; nothing crosses the wire when the neighbour stage is on the same rank (pp = 1, the turn of
    the V)."""
    if op is Op.BACKWARD_WEIGHT:
        return False
    stage = stage_of(rank, chunk, pp, placement)
    source = stage - 1 if op is Op.FORWARD else stage + 1
    return 0 <= source < pp * v and rank_chunk_of(source, pp, placement)[0] != rank


def test_each_compute_receives_exactly_what_it_needs_beforehand_and_sends_afterwards():
    for kind, pp, m, v in CONFIGS:
        for rank, actions in enumerate(_schedule(kind, pp, m, v)):
            received = [(a.op, a.microbatch, a.chunk) for a in actions if a.op.is_recv]
            assert len(received) == len(set(received)), (kind, pp, m, v, rank)
            seen_recv, done = set(), set()
            for a in actions:
                if a.op.is_recv:
                    seen_recv.add((a.op, a.microbatch, a.chunk))
                elif a.op.is_send:
                    producer = Op.FORWARD if a.op is Op.SEND_ACT else "backward"
                    assert (producer, a.microbatch, a.chunk) in done, (kind, pp, m, v, rank, a)
                elif a.op is not Op.BACKWARD_WEIGHT:  # a W takes nothing from the wire: B took the gradient
                    recv_op = Op.RECV_ACT if a.op is Op.FORWARD else Op.RECV_GRAD
                    has = (recv_op, a.microbatch, a.chunk) in seen_recv
                    assert has == _needs_recv(a.op, rank, a.chunk, pp, v, kind.placement), (kind, pp, m, v, rank, a)
                    done.add(("backward" if a.op in BACKWARDS else a.op, a.microbatch, a.chunk))


def test_sends_and_receives_pair_up_in_the_same_order_on_every_pair_of_ranks():
    """The k-th send a -> b carries what b's k-th receive from a expects (NCCL matches in posting order)."""
    for kind, pp, m, v in CONFIGS:
        sched = _schedule(kind, pp, m, v)
        sent, got = {}, {}
        for rank, actions in enumerate(sched):
            for a in actions:
                stage = stage_of(rank, a.chunk, pp, kind.placement)
                if a.op is Op.SEND_ACT:
                    sent.setdefault((rank, a.peer), []).append(("act", a.microbatch, stage + 1))
                elif a.op is Op.SEND_GRAD:
                    sent.setdefault((rank, a.peer), []).append(("grad", a.microbatch, stage - 1))
                elif a.op.is_recv:
                    kind_name = "act" if a.op is Op.RECV_ACT else "grad"
                    got.setdefault((a.peer, rank), []).append((kind_name, a.microbatch, stage))
        assert sent == got, (kind, pp, m, v)
        for (src, dst), payloads in sent.items():
            assert all(rank_chunk_of(stage, pp, kind.placement)[0] == dst for _, _, stage in payloads), (kind, pp, m, v)


def test_1f1b_phases_are_warmup_steady_cooldown():
    pp, m = 4, 8
    for rank in range(pp):
        phases = compute_phases(ONE_F_ONE_B, pp, rank, m)
        warmup = pp - rank - 1
        assert [a.op for a in phases[Phase.WARMUP]] == [Op.FORWARD] * warmup
        assert [a.op for a in phases[Phase.STEADY]] == [Op.FORWARD, Op.BACKWARD] * (m - warmup)
        assert [a.op for a in phases[Phase.COOLDOWN]] == [Op.BACKWARD] * warmup


def test_warmup_counts_follow_narayanan_and_megatron():
    for pp in range(1, 9):
        for rank in range(pp):
            for m in range(1, 3 * pp + 1):
                assert warmup_forwards(GPIPE, pp, rank, m) == m
                assert warmup_forwards(ONE_F_ONE_B, pp, rank, m) == min(pp - rank - 1, m)
            for v in (2, 3):
                for m in (pp, 2 * pp, 3 * pp):
                    megatron = (pp - rank - 1) * 2 + (v - 1) * pp
                    assert warmup_forwards(INTERLEAVED, pp, rank, m, v) == min(megatron, m * v)


def test_interleaved_with_one_chunk_is_1f1b():
    for pp in range(1, 9):
        for m in (pp, 2 * pp, 3 * pp):
            assert build_schedule(INTERLEAVED, pp, m, 1) == build_schedule(ONE_F_ONE_B, pp, m)


def test_1f1b_steady_state_batches_pair_send_forward_with_recv_backward():
    """Megatron's send_forward_recv_backward: on a middle rank the activation goes out in the same batch that
    brings the gradient back."""
    actions = build_schedule(ONE_F_ONE_B, 4, 8)[1]
    i = actions.index(Action(Op.SEND_ACT, 3, 0, 2))
    assert actions[i + 1] == Action(Op.RECV_GRAD, 1, 0, 2)
    assert actions[i + 2] == Action(Op.BACKWARD, 1, 0)


# --- invalid input -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, pp, m, v, name",
    [
        (ONE_F_ONE_B, 0, 4, 1, "pp"),
        (GPIPE, 2, 0, 1, "m"),
        (INTERLEAVED, 2, 4, 0, "v"),
        (INTERLEAVED, 4, 6, 2, "m"),
        (ONE_F_ONE_B, 2, 4, 2, "v"),
        (GPIPE, 2.0, 4, 1, "pp"),
    ],
)
def test_invalid_input_raises_value_error_naming_the_parameter(kind, pp, m, v, name):
    with pytest.raises(ValueError, match=rf"^{name} "):
        build_schedule(kind, pp, m, v)


def test_a_free_string_kind_is_rejected():
    with pytest.raises(ValueError, match="kind"):
        build_schedule("1f1b", 2, 4)


# --- simulation --------------------------------------------------------------------------------------------


def _expected_peak(kind: ScheduleKind, pp: int, rank: int, m: int, v: int) -> int:
    if kind is GPIPE:
        return m
    if kind is ZB_H1:  # every rank holds pp micro-batches (F done, W not): rank r defers r W's
        return min(pp, m)
    if kind is ZBV:  # chunk activations; 2 pp = pp whole-rank micro-batches, 1F1B's rank-0 peak, on every rank
        return min(2 * pp, 2 * m, m + rank + 1)
    if v == 1:
        return min(pp - rank, m)
    return min(2 * (pp - rank - 1) + (v - 1) * pp + 1, m * v)


def test_peak_in_flight_matches_the_formulas():
    """1F1B: min(pp - r, m); GPipe: m; interleaved: min(2 (pp - r - 1) + (v - 1) pp + 1, m v) chunk activations;
    ZB-H1: min(pp, m) (held from F to W); ZBV: min(2 pp, 2 m, m + r + 1) chunk activations. ZB-H1 rank r has at
    most min(r + 1, m) micro-batches between B and W."""
    for kind, pp, m, v in CONFIGS:
        result = _unit_sim(kind, pp, m, v)
        expected = tuple(_expected_peak(kind, pp, r, m, v) for r in range(pp))
        assert result.peak_in_flight == expected, (kind, pp, m, v)
        if kind is ZB_H1:
            assert result.peak_weight_pending == tuple(min(r + 1, m) for r in range(pp)), (pp, m)
        elif not kind.splits_backward:
            assert result.peak_weight_pending == (0,) * pp
        if v == 1:
            assert result.peak_in_flight_microbatches == expected, (kind, pp, m, v)
        assert all(mbs <= min(m, c) for mbs, c in zip(result.peak_in_flight_microbatches, expected))


def test_unit_time_bubble_is_exact():
    """tf = tb = 1 per chunk, free comm: bubble = (pp - 1) / (v m + pp - 1), makespan = 2 (v m + pp - 1).
    GPipe and 1F1B are the v = 1 case; interleaved meets Narayanan's (p - 1)/v bubble exactly."""
    for kind, pp, m, v in CONFIGS:
        if kind.splits_backward:
            continue  # their closed forms: the tests below
        result = _unit_sim(kind, pp, m, v)
        assert result.makespan == 2 * (v * m + pp - 1), (kind, pp, m, v)
        assert result.busy == (2.0 * m * v,) * pp
        exact = 1 - Fraction(int(sum(result.busy)), int(pp * result.makespan))
        assert exact == Fraction(pp - 1, v * m + pp - 1), (kind, pp, m, v)
        assert result.bubble_fraction == pytest.approx(float(exact), abs=1e-12)


def test_gpipe_and_1f1b_have_no_extra_bubble_when_backward_is_twice_forward():
    for kind, pp, m, v in CONFIGS:
        if kind in (GPIPE, ONE_F_ONE_B):
            result = simulate(list(map(list, _schedule(kind, pp, m, v))), Costs(forward=1.0, backward=2.0))
            assert result.makespan == 3 * (m + pp - 1), (kind, pp, m)


def _random_costs(rng: random.Random, stages: int, comm: float) -> Costs:
    return Costs(comm=comm, stage_forward=tuple(rng.uniform(0.2, 2) for _ in range(stages)),
                 stage_backward=tuple(rng.uniform(0.2, 4) for _ in range(stages)),
                 stage_weight_share=tuple(rng.uniform(0, 1) for _ in range(stages)))


def test_no_deadlock_and_waiting_less_is_never_slower_with_random_costs():
    """Whether lists deadlock does not depend on durations or on how the executor waits; random per-stage costs
    and comm also exercise the timing code. Each mode waits for a subset of what the next one waits for
    (lazy: a compute's own input; buffered: a batch's receives; rendezvous: the whole batch), so
    lazy <= buffered <= rendezvous."""
    rng = random.Random(0)
    for kind, pp, m, v in CONFIGS[::3]:
        costs = _random_costs(rng, pp * v, rng.uniform(0, 0.5))
        sched = list(map(list, _schedule(kind, pp, m, v)))
        lazy, buffered, blocking = (simulate(sched, costs, t, kind.placement)
                                    for t in (Transfer.LAZY, Transfer.BUFFERED, Transfer.RENDEZVOUS))
        assert lazy.makespan <= buffered.makespan + 1e-9 and buffered.makespan <= blocking.makespan + 1e-9, \
            (kind, pp, m, v)
        assert blocking.busy == pytest.approx(buffered.busy) and lazy.busy == pytest.approx(buffered.busy)


def _earliest_starts(sched: list[list[Action]], costs: Costs, pp: int,
                     placement: Placement = Placement.LOOP) -> dict[tuple[int, Action], float]:
    """Reference for lazy waits with free messages: the longest path through the compute DAG in each rank's order.
    A compute starts at max(the end of the rank's previous compute, the end of the computes it depends on):
    forward at stage s on forward at s - 1; backward (or B) at s on backward (or B) at s + 1 and on its own
    forward; W on its own B."""
    v = 1 + max(a.chunk for actions in sched for a in actions)
    orders = [[a for a in actions if a.op.is_compute] for actions in sched]
    end: dict[tuple[str, int, int], float] = {}
    start: dict[tuple[int, Action], float] = {}
    cursor, clock = [0] * pp, [0.0] * pp
    while any(cursor[r] < len(orders[r]) for r in range(pp)):
        for r in range(pp):
            while cursor[r] < len(orders[r]):
                a = orders[r][cursor[r]]
                s = stage_of(r, a.chunk, pp, placement)
                needs = [("F", a.microbatch, s - 1)] if a.op is Op.FORWARD and s > 0 else []
                if a.op in BACKWARDS:
                    needs = [("F", a.microbatch, s)] + ([("B", a.microbatch, s + 1)] if s < pp * v - 1 else [])
                if a.op is Op.BACKWARD_WEIGHT:
                    needs = [("B", a.microbatch, s)]
                if any(n not in end for n in needs):
                    break
                t = max([clock[r]] + [end[n] for n in needs])
                dur = {Op.FORWARD: costs.forward_time, Op.BACKWARD: costs.backward_time,
                       Op.BACKWARD_INPUT: costs.input_time, Op.BACKWARD_WEIGHT: costs.weight_time}[a.op](s)
                start[(r, a)], clock[r] = t, t + dur
                end[("B" if a.op in BACKWARDS else a.op.letter, a.microbatch, s)] = t + dur
                cursor[r] += 1
    return start


def test_lazy_waits_start_every_compute_as_early_as_its_data_allows():
    """With free messages, Transfer.LAZY (the executor's waits) starts each compute exactly when the longest
    path through the data dependencies says it can: no rank ever waits on a message it does not need yet."""
    rng = random.Random(1)
    for kind, pp, m, v in CONFIGS[::2]:
        costs = _random_costs(rng, pp * v, 0.0)
        sched = list(map(list, _schedule(kind, pp, m, v)))
        result = simulate(sched, costs, placement=kind.placement)
        starts = _earliest_starts(sched, costs, pp, kind.placement)
        for r, spans in enumerate(result.timelines):
            for span in spans:
                assert span.start == pytest.approx(starts[(r, span.action)], abs=1e-9), (kind, pp, m, v, r, span)


@pytest.mark.parametrize("tf, tb", [(1, 1), (1, 2), (1, 3), (2, 3)])
def test_interleaved_bubble_is_one_over_v_of_1f1b_whatever_backward_costs(tf, tb):
    """Narayanan's interleaved bubble, (p - 1)(tf + tb) / v per chunk-cost unit, exactly: makespan
    (tf + tb)(v m + p - 1) per chunk, for tb = tf, 2 tf (no recomputation), 3 tf (full recomputation) and 1.5 tf.
    The 1F1B comparison runs whole-rank costs v tf, v tb: its bubble is (p - 1) v (tf + tb), v times larger."""
    for pp in range(2, 9):
        for v in (2, 3, 4):
            for m in (pp, 2 * pp, 4 * pp):
                result = simulate(build_schedule(INTERLEAVED, pp, m, v), Costs(forward=tf, backward=tb))
                assert result.makespan == (tf + tb) * (v * m + pp - 1), (pp, v, m)
                one_f_one_b = simulate(build_schedule(ONE_F_ONE_B, pp, m), Costs(forward=v * tf, backward=v * tb))
                bubble, bubble_1f1b = (r.makespan - m * v * (tf + tb) for r in (result, one_f_one_b))
                assert bubble * v == bubble_1f1b == (pp - 1) * v * (tf + tb), (pp, v, m)


def test_timelines_hold_every_compute_in_order_without_overlap():
    result = _unit_sim(INTERLEAVED, 4, 8, 2)
    for rank, spans in enumerate(result.timelines):
        assert len(spans) == 2 * 8 * 2
        assert all(a.end <= b.start for a, b in zip(spans, spans[1:]))
        assert all(s.action.op.is_compute for s in spans)
    assert max(s.end for spans in result.timelines for s in spans) == result.makespan


def test_comm_time_delays_each_hop():
    """pp = 2, m = 1: F on rank 0, hop, F and B on rank 1, hop, B on rank 0."""
    result = simulate(build_schedule(ONE_F_ONE_B, 2, 1), Costs(forward=1, backward=2, comm=0.5))
    assert result.makespan == 1 + 0.5 + 1 + 2 + 0.5 + 2


def test_deadlock_names_the_stuck_ranks_and_their_pending_actions():
    # Rank 0 waits for a gradient before sending the activation rank 1 needs to produce it.
    schedule = [
        [Action(Op.FORWARD, 0), Action(Op.RECV_GRAD, 0, 0, 1), Action(Op.BACKWARD, 0), Action(Op.SEND_ACT, 0, 0, 1)],
        [Action(Op.RECV_ACT, 0, 0, 0), Action(Op.FORWARD, 0), Action(Op.BACKWARD, 0), Action(Op.SEND_GRAD, 0, 0, 0)],
    ]
    with pytest.raises(DeadlockError, match=r"rank 0 stuck at batch \[RECV_GRAD\(mb=0,c=0\)@1\]") as info:
        simulate(schedule, transfer=Transfer.RENDEZVOUS)
    assert "rank 1 stuck at batch [RECV_ACT(mb=0,c=0)@0]" in str(info.value)
    with pytest.raises(DeadlockError) as info:  # lazily: each rank stuck at the compute whose input never comes
        simulate(schedule)
    assert "rank 0 stuck at BACKWARD(mb=0,c=0): its input RECV_GRAD(mb=0,c=0)@1 waits for rank 1 to post it" \
        in str(info.value), str(info.value)
    assert "rank 1 stuck at FORWARD(mb=0,c=0): its input RECV_ACT(mb=0,c=0)@0 waits for rank 0" in str(info.value)


def test_unmatched_send_is_reported_as_deadlock():
    schedule = [[Action(Op.FORWARD, 0), Action(Op.SEND_ACT, 0, 0, 1)], [Action(Op.FORWARD, 0)]]
    for transfer in (Transfer.LAZY, Transfer.RENDEZVOUS):  # BUFFERED, a bound, never waits for sends
        with pytest.raises(DeadlockError, match="no matching message"):
            simulate(schedule, transfer=transfer)


def test_messages_matched_with_the_wrong_payload_raise():
    schedule = [
        [Action(Op.FORWARD, 0), Action(Op.SEND_ACT, 0, 0, 1), Action(Op.FORWARD, 1), Action(Op.SEND_ACT, 1, 0, 1)],
        [Action(Op.RECV_ACT, 1, 0, 0), Action(Op.RECV_ACT, 0, 0, 0), Action(Op.FORWARD, 0), Action(Op.FORWARD, 1)],
    ]
    with pytest.raises(ValueError, match="payloads differ"):
        simulate(schedule)


def test_costs_validate_their_fields():
    with pytest.raises(ValueError, match="forward"):
        Costs(forward=-1)
    with pytest.raises(ValueError, match="stage_forward"):
        simulate(build_schedule(ONE_F_ONE_B, 2, 2), Costs(stage_forward=(1.0,)))


def test_format_timeline_draws_1f1b():
    result = simulate(build_schedule(ONE_F_ONE_B, 2, 3))
    assert format_timeline(result) == (
        "rank 0 | F0 F1 .. B0 F2 B1 .. B2\n"
        "rank 1 | .. F0 B0 F1 B1 F2 B2 .."
    )


def test_format_timeline_marks_chunks_and_long_steps():
    result = simulate(build_schedule(INTERLEAVED, 1, 1, 2), Costs(forward=1, backward=2))
    assert format_timeline(result) == "rank 0 | F0a F0b B0b --- B0a ---"
