"""Pipeline schedules as data: each pipeline rank's ordered list of actions.

`build_schedule(kind, pp, m, v)` is a pure function (no torch, no processes). The same lists feed the
executor, the unit tests, the simulator (`hybrid.pipeline.simulate`), the planner and the timeline plots.

Layout (Megatron's). The model is cut into `pp * v` consecutive stages. Rank `r` holds `v` model chunks;
its chunk `c` is global stage

    s = c * pp + r,

so activations flow rank 0 -> 1 -> ... -> pp-1 within chunk c, then rank pp-1 chunk c -> rank 0 chunk c+1.
Gradients flow the opposite way. Stage 0 reads the data (its forward needs no RECV_ACT); stage pp*v-1
computes the loss (its backward starts from the loss, no RECV_GRAD).

Action fields. `chunk` is always the *local* chunk on the rank that owns the list: for SEND_ACT the chunk that
produced the activation, for RECV_ACT the chunk that will consume it (likewise for gradients). `peer` is the
pipeline rank on the other end of a communication action, None for compute.

How an executor must run a list (the simulator models exactly this):

1. Walk the list in order.
2. A maximal run of consecutive communication actions is ONE batch: post all its sends and receives together
   (`torch.distributed.batch_isend_irecv`). Waiting for the whole batch before the next compute action is
   deadlock-free (see below); `PipelineExecutor` waits less (lazily): for a receive just before the compute
   that consumes it, for sends at the end of the step.
3. A RECV precedes the compute that consumes it (possibly several batches earlier: a prefetched payload is kept
   in a buffer keyed by (op, microbatch, chunk) until its compute runs); a SEND follows the compute that made it.
4. Point-to-point messages between a pair of ranks are matched in posting order (NCCL ignores tags), so on every
   directed pair (a -> b) the k-th send of a is the k-th receive of b, with the same payload. `build_schedule`
   guarantees this by construction: receivers post receives in the order their sender produces the payloads.
5. Payload shapes are fixed and known ahead (one micro-batch's hidden states), so no shape exchange is needed.
6. With pp = 1 there is no communication at all: chunk c's output is handed to chunk c+1 in memory.

Schedules (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC'21, Sec. 2.2):

* GPIPE: all m forwards, then all m backwards (FIFO). Bubble (p-1)/(m+p-1); m activations held.
* ONE_F_ONE_B (PipeDream-Flush): warm-up of min(p - r - 1, m) forwards, a steady state alternating one forward
  and one backward, then a cool-down of the remaining backwards. Same bubble as GPipe, but at most
  min(p - r, m) micro-batches in flight on rank r.
* INTERLEAVED: 1F1B over "virtual micro-batches" (micro-batch, chunk), in Megatron's order. Needs m % pp == 0.
  Warm-up on rank r is min(2 (p - r - 1) + (v - 1) p, m v) chunk-forwards, so the peak number of
  (micro-batch, chunk) activations held on rank r is

      peak_chunks(r) = min(2 (p - r - 1) + (v - 1) p + 1, m v)       (v >= 2)

  i.e. peak_chunks(r) / v in units of a whole rank's activations for one micro-batch. Bubble with unit
  per-chunk costs (tf = tb): exactly (p-1)/(v m + p - 1) (Narayanan: bubble time (p-1)(tf+tb)/v). Unlike
  Megatron we do not special-case m == pp (Megatron then makes every rank all warm-up): the min(., m v) cap
  gives the same bubble with fewer activations on the later ranks. With v = 1 INTERLEAVED returns the
  ONE_F_ONE_B schedule (Megatron's interleaved warm-up formula would double the warm-up for no gain).
  With lazy waits (the executor's, `Transfer.LAZY`) that bubble holds for tb != tf too: makespan exactly
  (tf + tb)(v m + p - 1) (tested for tb / tf in 1, 1.5, 2, 3). Blocking batches lose some of it when tb != tf.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from hybrid.cliutil import check_number


class Op(enum.Enum):
    """What one action does. Compute ops run a chunk; the rest are point-to-point transfers.

    A backward is either one BACKWARD (input and weight gradients together: GPipe, 1F1B, interleaved) or, in the
    zero-bubble schedules, a BACKWARD_INPUT ("B": the gradient w.r.t. the chunk's input, which the previous
    stage waits for) followed later by a BACKWARD_WEIGHT ("W": the weight gradients, which nobody waits for,
    so they can fill bubbles; Qi et al. 2024)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    BACKWARD_INPUT = "backward_input"  # B: d loss / d input of the chunk (sent to the previous stage)
    BACKWARD_WEIGHT = "backward_weight"  # W: d loss / d weights, from what B left (saved inputs, output grads)
    SEND_ACT = "send_act"  # send this chunk's output activation to the next stage
    RECV_ACT = "recv_act"  # receive this chunk's input activation from the previous stage
    SEND_GRAD = "send_grad"  # send the gradient w.r.t. this chunk's input to the previous stage
    RECV_GRAD = "recv_grad"  # receive the gradient w.r.t. this chunk's output from the next stage

    # Plain per-member attributes, set once below (not properties): the list builder and the simulator read them
    # for every action, and an attribute read is several times cheaper than a property evaluating a tuple test.
    is_compute: bool  # FORWARD, BACKWARD, BACKWARD_INPUT or BACKWARD_WEIGHT
    is_backward: bool  # consumes the output gradient and produces the input gradient: BACKWARD or BACKWARD_INPUT
    # The compute after which a (micro-batch, chunk)'s saved activations are gone: the full backward, or W (W still
    # needs F's saved inputs; the executor keeps the whole graph until W).
    frees_activations: bool
    letter: str  # F, B or W, as the schedule pictures draw them (a full backward is drawn as B too); "?" otherwise
    is_send: bool  # SEND_ACT or SEND_GRAD
    is_recv: bool  # RECV_ACT or RECV_GRAD


for _op in Op:
    _op.is_compute = _op in (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT)
    _op.is_backward = _op in (Op.BACKWARD, Op.BACKWARD_INPUT)
    _op.frees_activations = _op in (Op.BACKWARD, Op.BACKWARD_WEIGHT)
    _op.letter = {Op.FORWARD: "F", Op.BACKWARD: "B", Op.BACKWARD_INPUT: "B", Op.BACKWARD_WEIGHT: "W"}.get(_op, "?")
    _op.is_send = _op in (Op.SEND_ACT, Op.SEND_GRAD)
    _op.is_recv = _op in (Op.RECV_ACT, Op.RECV_GRAD)
del _op


@dataclass(frozen=True)
class Action:
    """One step of a rank's list."""

    op: Op
    microbatch: int  # index in [0, m)
    chunk: int = 0  # local model chunk on this rank, in [0, v); global stage = chunk * pp + rank
    peer: int | None = None  # pipeline rank on the other end of a SEND/RECV; None for compute

    def __str__(self) -> str:
        peer = "" if self.peer is None else f"@{self.peer}"
        return f"{self.op.name}(mb={self.microbatch},c={self.chunk}){peer}"


class Placement(enum.Enum):
    """Which global stage each (rank, local chunk) holds.

    LOOP (Megatron's interleaved layout): chunk c of rank r is stage c pp + r, so the activations loop
    0 -> pp-1, then back to rank 0 for the next chunk. V (ZBV, Qi et al. 2024 Sec. 6): two chunks, chunk 0 of
    rank r is stage r and chunk 1 is stage 2 pp - 1 - r, so the activations go down the ranks and come back up:
    rank pp-1 holds stages pp-1 and pp (a hand-off in memory) and rank 0 holds the first and the last stage.
    """

    LOOP = "loop"
    V = "v"

    def stage(self, rank: int, chunk: int, pp: int) -> int:
        if self is Placement.V:
            return rank if chunk == 0 else 2 * pp - 1 - rank
        return chunk * pp + rank

    def rank_chunk(self, stage: int, pp: int) -> tuple[int, int]:
        if self is Placement.V:
            return (stage, 0) if stage < pp else (2 * pp - 1 - stage, 1)
        return stage % pp, stage // pp


class ScheduleKind(enum.Enum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    ZB_H1 = "zbh1"  # zero bubble, 1F1B's memory: 1F1B with each backward split into B and a deferred W
    ZBV = "zbv"  # zero bubble, V placement, two chunks a rank

    @property
    def placement(self) -> Placement:
        return Placement.V if self is ScheduleKind.ZBV else Placement.LOOP

    @property
    def splits_backward(self) -> bool:
        """Whether the schedule runs B and W as separate actions (the zero-bubble schedules)."""
        return self in (ScheduleKind.ZB_H1, ScheduleKind.ZBV)


class Phase(enum.Enum):
    """The three phases of a 1F1B-style compute order (GPipe is all warm-up then all cool-down)."""

    WARMUP = "warmup"  # forwards only, filling the pipeline
    STEADY = "steady"  # one forward, then one backward
    COOLDOWN = "cooldown"  # backwards only, draining the pipeline


def stage_of(rank: int, chunk: int, pp: int, placement: Placement = Placement.LOOP) -> int:
    """Global stage of `chunk` on `rank` (default: Megatron's layout, chunk-major, rank-minor)."""
    return placement.stage(rank, chunk, pp)


def rank_chunk_of(stage: int, pp: int, placement: Placement = Placement.LOOP) -> tuple[int, int]:
    """Inverse of `stage_of`: (rank, chunk) holding global stage `stage`."""
    return placement.rank_chunk(stage, pp)


def validate(kind: ScheduleKind, pp: int, m: int, v: int) -> None:
    """Raise ValueError naming the bad parameter and the fix."""
    if not isinstance(kind, ScheduleKind):
        raise ValueError(f"kind must be a ScheduleKind, got {kind!r}")
    for name, value in (("pp", pp), ("m", m), ("v", v)):
        check_number(name, value, 1, integer=True)
    if kind is ScheduleKind.ZBV and v != 2:
        raise ValueError(f"v (chunks per rank) must be 2 for zbv (the V holds stages r and 2 pp - 1 - r), got {v}")
    if kind not in (ScheduleKind.INTERLEAVED, ScheduleKind.ZBV) and v != 1:
        raise ValueError(f"v (chunks per rank) must be 1 for {kind.value}, got {v}; use ScheduleKind.INTERLEAVED")
    if kind is ScheduleKind.INTERLEAVED and m % pp != 0:
        raise ValueError(f"m (micro-batches) must be a multiple of pp={pp} for interleaved 1F1B, got m={m}; "
                         f"use m={(m // pp + 1) * pp}")


def warmup_forwards(kind: ScheduleKind, pp: int, rank: int, m: int, v: int = 1) -> int:
    """Number of (chunk-)forwards rank `rank` runs before its first backward.

    GPipe: all m. 1F1B (and ZB-H1): min(pp - rank - 1, m), one per downstream rank: just enough that the first
    gradient arrives as the steady state begins (Narayanan et al. 2021). Interleaved (Megatron):
    min(2 (pp - rank - 1) + (v - 1) pp, m v). Even the last rank must first push the first pp micro-batches
    through chunks 0..v-2, (v - 1) pp chunk-forwards; a rank further upstream starts one step earlier and gets
    its first gradient one step later, and fills both steps with forwards -- 2 per downstream rank.
    ZBV: the forwards before the first B of its list (2 pp when m >= 2 pp - 1, see `_zbv_order`).
    """
    validate(kind, pp, m, v)
    if not 0 <= rank < pp:
        raise ValueError(f"rank must be in [0, pp={pp}), got {rank}")
    if kind is ScheduleKind.GPIPE:
        return m
    if kind in (ScheduleKind.ONE_F_ONE_B, ScheduleKind.ZB_H1) or v == 1:
        return min(pp - rank - 1, m)
    if kind is ScheduleKind.ZBV:
        order = _zbv_order(pp, rank, m)
        return next(i for i, a in enumerate(order) if a.op is not Op.FORWARD)
    return min(2 * (pp - rank - 1) + (v - 1) * pp, m * v)


def build_schedule(kind: ScheduleKind, pp: int, m: int, v: int = 1) -> list[list[Action]]:
    """Each pipeline rank's ordered action list (compute and communication) for one training step."""
    validate(kind, pp, m, v)
    orders = [compute_order(kind, pp, rank, m, v) for rank in range(pp)]
    return _with_communication(orders, pp, v, kind.placement)


def compute_order(kind: ScheduleKind, pp: int, rank: int, m: int, v: int = 1) -> list[Action]:
    """Rank `rank`'s compute actions (F, B, and W for the zero-bubble kinds) in execution order, no
    communication."""
    phases = compute_phases(kind, pp, rank, m, v)
    return [a for phase in Phase for a in phases[phase]]


def compute_phases(kind: ScheduleKind, pp: int, rank: int, m: int, v: int = 1) -> dict[Phase, list[Action]]:
    """The compute order split into warm-up, steady state and cool-down. For the zero-bubble kinds: the
    forwards before the first backward, up to the last forward, the rest (B's and the deferred W's)."""
    warmup = warmup_forwards(kind, pp, rank, m, v)
    if kind.splits_backward:
        order = _zb_h1_order(pp, rank, m) if kind is ScheduleKind.ZB_H1 else _zbv_order(pp, rank, m)
        last_forward = max(i for i, a in enumerate(order) if a.op is Op.FORWARD)
        return {Phase.WARMUP: order[:warmup], Phase.STEADY: order[warmup:last_forward + 1],
                Phase.COOLDOWN: order[last_forward + 1:]}
    order = [_virtual_microbatch(k, pp, v) for k in range(m * v)] if v > 1 else [(i, 0) for i in range(m)]
    forwards = [Action(Op.FORWARD, mb, chunk) for mb, chunk in order]
    # Backward visits chunks in reverse within each group of pp micro-batches: gradients enter at the last chunk.
    backwards = [Action(Op.BACKWARD, mb, v - 1 - chunk) for mb, chunk in order]
    return _split_phases(forwards, backwards, warmup)


def _zb_h1_order(pp: int, rank: int, m: int) -> list[Action]:
    """ZB-H1 (Qi et al. 2024, Sec. 2.1; torch's ScheduleInterleavedZeroBubble with one chunk, "ZB1P"): 1F1B's
    order with each backward split into B and W, rank r deferring its first r W's. The B's then run as early
    as 1F1B's backwards could if they did not wait for W's, and the r deferred W's fill the cool-down, where
    rank r of 1F1B idles for r backwards. Every rank then holds at most pp micro-batches (F done, W not)."""
    warmup = min(pp - rank - 1, m)
    order = [Action(Op.FORWARD, mb) for mb in range(warmup)]
    b = w = 0
    for step in range(warmup, m + warmup):  # steady state (a forward, then a B), then the cool-down B's
        if step < m:
            order.append(Action(Op.FORWARD, step))
        order.append(Action(Op.BACKWARD_INPUT, b))
        b += 1
        if step - warmup >= rank:  # past the first `rank` B's: a W of the oldest micro-batch after each B
            order.append(Action(Op.BACKWARD_WEIGHT, w))
            w += 1
    order += [Action(Op.BACKWARD_WEIGHT, mb) for mb in range(w, m)]
    return order


def _zbv_order(pp: int, rank: int, m: int) -> list[Action]:
    """ZBV (Qi et al. 2024, Sec. 6; torch's ScheduleZBVZeroBubble, which this follows action for action).
    Chunk 0 is stage r, chunk 1 stage 2 pp - 1 - r (`Placement.V`). Built for n = max(m, 2 pp - 1) micro-batches,
    the fewest that fill the V, then the actions of micro-batches >= m are dropped (as torch does).

    warm-up: 2 (pp - r) - 1 chunk-0 forwards; r pairs (F chunk 1, F chunk 0); pp - r triples (F, B, W of chunk 1)
    steady:  F chunk 0, B W chunk 0, F chunk 1, B W chunk 1, until every forward ran
    cool-down: r pairs (B chunk 0, B chunk 1); pp - r pairs (B chunk 0, W chunk 0); the W's left, chunk 1 first.
    """
    n = max(2 * pp - 1, m)
    order: list[Action] = []
    count = {key: 0 for key in ("f0", "f1", "b0", "b1", "w0", "w1")}

    def add(op: Op, chunk: int) -> None:
        key = {Op.FORWARD: "f", Op.BACKWARD_INPUT: "b", Op.BACKWARD_WEIGHT: "w"}[op] + str(chunk)
        order.append(Action(op, count[key], chunk))
        count[key] += 1

    F, B, W = Op.FORWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT
    for _ in range(2 * (pp - rank) - 1):
        add(F, 0)
    for _ in range(rank):
        add(F, 1), add(F, 0)
    for _ in range(pp - rank):
        add(F, 1), add(B, 1), add(W, 1)
    while count["f1"] < count["f0"] or count["f0"] < n:
        if count["f0"] < n:
            add(F, 0)
        add(B, 0), add(W, 0), add(F, 1), add(B, 1), add(W, 1)
    # each B so far was followed by its W, so the W counters equal the B counters here (torch's w0_cnt = b0_cnt)
    for _ in range(rank):
        add(B, 0), add(B, 1)
    for _ in range(pp - rank):
        add(B, 0), add(W, 0)
    while count["w1"] < count["b1"]:
        add(W, 1)
    while count["w0"] < count["b0"]:
        add(W, 0)
    return [a for a in order if a.microbatch < m]


def _virtual_microbatch(k: int, pp: int, v: int) -> tuple[int, int]:
    """Megatron's k-th (micro-batch, chunk) on every rank: groups of pp micro-batches go through chunk 0,
    then the same pp micro-batches through chunk 1, ..., then the next group."""
    group, within = divmod(k, pp * v)
    return group * pp + within % pp, within // pp


def _split_phases(forwards: Sequence[Action], backwards: Sequence[Action], warmup: int) -> dict[Phase, list[Action]]:
    """Warm-up: `warmup` forwards. Steady: the remaining forwards, each followed by the oldest backward.
    Cool-down: the backwards left. GPipe is warmup = len(forwards) (no steady state)."""
    steady_pairs = zip(forwards[warmup:], backwards)
    steady = [a for pair in steady_pairs for a in pair]
    return {
        Phase.WARMUP: list(forwards[:warmup]),
        Phase.STEADY: steady,
        Phase.COOLDOWN: list(backwards[len(forwards) - warmup:]),
    }


# ---------------------------------------------------------------------------------------------------------------
# Communication placement (Megatron's lock-step pairing, derived from the timeline instead of hand-coded).
#
# Take the ideal unit-time timeline (every compute lasts 1, messages are free; `_unit_time_starts`). A send goes in
# the batch right after its producer: in that timeline the batch is open over [t, S] = [producer end, start of the
# sender's next compute]. Its receive goes in the LATEST batch of the receiver that (i) comes before the consumer
# and (ii) is open at some moment of [t, S]: so the receiver never waits for data it does not need yet, and the
# sender never waits longer than it already does. Then, per directed pair of ranks, receives are moved earlier
# where needed so that they are posted in the sender's order (NCCL matches point-to-point messages in order).
#
# Deadlock freedom, for any durations: give each batch B the start time s(B) of the compute after it in the ideal
# timeline. A posted batch X can only wait for a partner batch Y of another rank that is not posted yet because
# that rank is stuck at an earlier batch P; P precedes Y by at least one compute, and Y's window overlaps X's, so
# s(P) < e(Y) <= s(X). Following the waits, s strictly decreases, so waits never form a cycle.
#
# What comes out is Megatron's pattern: send_forward_recv_backward / send_backward_recv_forward pairs in the 1F1B
# steady state (the last stage receives the next activation after its backward), and in the interleaved schedule
# payloads crossing between rank pp-1 and rank 0 are received early into a buffer keyed by (op, micro-batch,
# chunk), like Megatron's per-chunk receive queues.
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Message:
    send: Action  # on the sender, right after compute `producer`
    recv: Action  # on the receiver (peer = sender), in the batch before compute `gap`
    sender: int
    producer: int  # index of the producing compute in the sender's order
    gap: int  # the receiver's batch: the one before its compute number `gap`


def _with_communication(orders: list[list[Action]], pp: int, v: int,
                        placement: Placement = Placement.LOOP) -> list[list[Action]]:
    starts = _unit_time_starts(orders, pp, v, placement)
    position = [{_dependency_key(a): i for i, a in enumerate(order)} for order in orders]  # O(1) consumer lookup
    messages = [m for rank in range(pp) for m in _messages_of(rank, orders, starts, position, pp, v, placement)]
    messages = _in_sender_order(messages)
    mine: list[list[_Message]] = [[] for _ in range(pp)]  # per rank, the messages it sends or receives, in order
    for m in messages:  # (_rank_list reads only those: one pass here, not a scan of all messages per rank)
        mine[m.sender].append(m)
        mine[m.send.peer].append(m)
    return [_rank_list(rank, orders[rank], mine[rank]) for rank in range(pp)]


def _messages_of(rank: int, orders: list[list[Action]], starts: list[list[int]], position: list[dict],
                 pp: int, v: int, placement: Placement) -> list[_Message]:
    """The messages rank `rank` sends, each with the receiver's latest batch open during the sender's batch.
    A rank's unit-time starts increase, so the batches opened by a time are counted by bisection."""
    out = []
    for j, action in enumerate(orders[rank]):
        pair = _message_pair(action, rank, pp, v, placement)
        if pair is None:
            continue
        send, recv = pair
        receiver = send.peer
        sender_next = starts[rank][j + 1] if j + 1 < len(starts[rank]) else starts[rank][j] + 1
        consumer = position[receiver][_consumer_of(recv)]
        open_gaps = bisect.bisect_right(starts[receiver], sender_next - 1)  # batches opened by then
        out.append(_Message(send, recv, rank, j, min(consumer, open_gaps)))
    return out


def _in_sender_order(messages: list[_Message]) -> list[_Message]:
    """Per (sender, receiver) pair, move receives earlier (suffix minimum of the gap) so the receiver posts them
    in send order. Moving earlier keeps the overlap: a later message's window starts later still."""
    out: list[_Message] = []
    by_pair: dict[tuple[int, int], list[_Message]] = {}
    for m in messages:
        by_pair.setdefault((m.sender, m.send.peer), []).append(m)
    for pair_messages in by_pair.values():
        pair_messages.sort(key=lambda m: m.producer)
        earliest = None
        for m in reversed(pair_messages):
            earliest = m.gap if earliest is None else min(earliest, m.gap)
            out.append(_Message(m.send, m.recv, m.sender, m.producer, earliest))
    return out


def _rank_list(rank: int, order: list[Action], messages: list[_Message]) -> list[Action]:
    """Batch before compute g: the send of compute g-1, then the receives placed there, in (sender, send) order."""
    sends = {m.producer: m.send for m in messages if m.sender == rank}
    inbox: dict[int, list[_Message]] = {}
    for m in messages:
        if m.send.peer == rank:
            inbox.setdefault(m.gap, []).append(m)
    out: list[Action] = []
    for gap in range(len(order) + 1):
        if gap - 1 in sends:
            out.append(sends[gap - 1])
        out.extend(m.recv for m in sorted(inbox.get(gap, []), key=lambda m: (m.sender, m.producer)))
        if gap < len(order):
            out.append(order[gap])
    return out


def _message_pair(action: Action, rank: int, pp: int, v: int,
                  placement: Placement = Placement.LOOP) -> tuple[Action, Action] | None:
    """(send, receive) of what `action` produces -- its output activation or its input gradient -- or None when
    nothing is sent: a W (its gradients stay on the rank), the last stage's forward (the loss follows), the
    first stage's backward, or a hand-off to a chunk on the same rank (pp = 1; the V's turn on rank pp - 1)."""
    if not (action.op is Op.FORWARD or action.op.is_backward):
        return None
    forward = action.op is Op.FORWARD
    target = placement.stage(rank, action.chunk, pp) + (1 if forward else -1)  # stage_of, without the call
    if not 0 <= target < pp * v:
        return None
    peer, peer_chunk = placement.rank_chunk(target, pp)
    if peer == rank:
        return None
    send = Action(Op.SEND_ACT if forward else Op.SEND_GRAD, action.microbatch, action.chunk, peer)
    recv = Action(Op.RECV_ACT if forward else Op.RECV_GRAD, action.microbatch, peer_chunk, rank)
    return send, recv


def _dependency_key(action: Action) -> tuple[str, int, int]:
    """("F" | "B" | "W", micro-batch, chunk): a full BACKWARD and a B play the same part in the dependencies
    (both consume the output gradient and produce the input gradient)."""
    kind = "F" if action.op is Op.FORWARD else "B" if action.op.is_backward else "W"
    return kind, action.microbatch, action.chunk


def _consumer_of(recv: Action) -> tuple[str, int, int]:
    """The compute that uses a received payload: RECV_ACT feeds the forward, RECV_GRAD the backward (or B)."""
    return ("F" if recv.op is Op.RECV_ACT else "B"), recv.microbatch, recv.chunk


def _unit_time_starts(orders: list[list[Action]], pp: int, v: int,
                      placement: Placement = Placement.LOOP) -> list[list[int]]:
    """Start time of each compute when every compute takes 1 and messages are free and buffered (as soon as
    possible, in each rank's order). Forward at stage s waits for forward at s-1; backward (or B) at s waits
    for backward at s+1 (or its own forward at the last stage) and its own forward; W waits for its own B.
    ValueError if the orders cannot all run (inconsistent)."""
    done: dict[tuple[str, int, int], int] = {}  # (F|B|W, micro-batch, global stage) -> end time
    # per compute, what it waits for and the key it completes, worked out once (not at every retry while blocked)
    needs = [[dependencies(a, rank, pp, v, placement) for a in order] for rank, order in enumerate(orders)]
    made = [[_done_key(a, rank, pp, placement) for a in order] for rank, order in enumerate(orders)]
    starts: list[list[int]] = [[] for _ in range(pp)]
    clock, cursor, moved = [0] * pp, [0] * pp, True
    while moved:
        moved = False
        for rank in range(pp):
            rank_needs, rank_made, rank_starts, n = needs[rank], made[rank], starts[rank], len(orders[rank])
            while cursor[rank] < n:
                ready = 0  # max over the dependencies' end times (0 for none); ints, so exact in any order
                for key in rank_needs[cursor[rank]]:
                    end = done.get(key)
                    if end is None:
                        break
                    ready = max(ready, end)
                else:
                    start = max(clock[rank], ready)
                    rank_starts.append(start)
                    clock[rank] = start + 1
                    done[rank_made[cursor[rank]]] = start + 1
                    cursor[rank] += 1
                    moved = True
                    continue
                break
    if any(cursor[r] < len(orders[r]) for r in range(pp)):
        raise ValueError(f"compute orders cannot run: ranks stuck at positions {cursor}")
    return starts


def dependencies(action: Action, rank: int, pp: int, v: int,
                 placement: Placement = Placement.LOOP) -> list[tuple[str, int, int]]:
    """What a compute waits for, as (F|B|W, micro-batch, global stage): a forward the forward of the stage
    before; a backward (or B) its own forward and the backward of the stage after; a W its own B."""
    stage = stage_of(rank, action.chunk, pp, placement)
    if action.op is Op.FORWARD:
        return [("F", action.microbatch, stage - 1)] if stage > 0 else []
    if action.op is Op.BACKWARD_WEIGHT:
        return [("B", action.microbatch, stage)]
    needs = [("F", action.microbatch, stage)]
    if stage < pp * v - 1:
        needs.append(("B", action.microbatch, stage + 1))
    return needs


def _done_key(action: Action, rank: int, pp: int, placement: Placement) -> tuple[str, int, int]:
    """The (F|B|W, micro-batch, global stage) that `action` completes, as `dependencies` names it."""
    kind, mb, chunk = _dependency_key(action)
    return kind, mb, stage_of(rank, chunk, pp, placement)
