"""Event simulation of all pipeline ranks running their action lists, under the executor's semantics.

Model (the one `hybrid.pipeline.schedules` documents for the executor):

* Each rank runs its list in order and has one compute stream: a compute starts when the previous step on that
  rank ended and lasts `Costs.forward_time(stage)` (F), `Costs.backward_time(stage)` (a full backward),
  `Costs.input_time(stage)` (B) or `Costs.weight_time(stage)` (W); B + W = the full backward.
* A maximal run of consecutive communication actions is one batch, *posted* when the rank reaches it. Messages
  on a directed pair (a -> b) are matched in posting order: a's k-th send to b is b's k-th receive from a.
  A message is transferred once both its send and its receive are posted, taking `Costs.comm` seconds from the
  later of the two post times. What a rank waits for depends on `Transfer`:
* `Transfer.LAZY` (default; what `PipelineExecutor` does): posting never blocks. A FORWARD/BACKWARD waits
  only for the message carrying its own input (RECV_ACT / RECV_GRAD of the same micro-batch and chunk); sends
  are waited for at the end of the step, so a rank's last send still counts towards the makespan. A compute
  then starts at max(previous end on its rank, its input's arrival): with comm = 0 that is the earliest start
  the data dependencies allow for this compute order (tests check it against a longest-path computation).
* `Transfer.RENDEZVOUS` (blocking batches, as an executor that waits for each whole batch -- Megatron without
  overlap_p2p_comm): a batch completes when all its messages have; the rank then continues. A send therefore
  blocks its rank until the receiver posts the matching receive -- which is what makes badly ordered lists
  deadlock. `Transfer.BUFFERED` lets sends complete at once, receives still wait at their batch.

Because every rank's clock depends only on its own previous steps and on its partners' post times, the order in
which the simulator advances ranks does not change the result. If no rank can advance and some are unfinished,
the lists deadlock: `DeadlockError` names the stuck ranks, their pending batch and what each waits for.

Metrics:

* makespan T = the latest end time of any step (all ranks start at 0).
* busy_r = the total compute time (F, B, W) of rank r; communication and waiting are idle.
* bubble fraction = 1 - sum_r busy_r / (pp * T): the share of the pp x T device-time rectangle not computing.
* in flight on rank r: (micro-batch, chunk) pairs whose forward on r has run and whose backward on r has not
  finished -- for the zero-bubble schedules, whose W has not finished (W still needs F's saved inputs) -- i.e.
  activation sets held, in units of one chunk's activations for one micro-batch (`peak_in_flight`).
  `peak_weight_pending` counts the pairs whose B has run and W has not: each also holds the output gradients
  B left for W. `peak_in_flight_microbatches` counts distinct micro-batches instead; with v = 1 the two
  agree. Memory in units of a whole rank's activations for one micro-batch is peak_in_flight / v.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hybrid.cliutil import check_number, is_finite
from hybrid.pipeline.schedules import Action, Op, Placement, stage_of


class Transfer(enum.Enum):
    """When a point-to-point message lets its two ends go on."""

    LAZY = "lazy"  # posting never blocks; a compute waits for its own input, sends are waited at the step's end
    RENDEZVOUS = "rendezvous"  # a whole batch blocks until every message in it moved (both ends posted)
    BUFFERED = "buffered"  # a batch blocks on its receives only; sends complete at once


@dataclass(frozen=True)
class Costs:
    """Durations of the simulated steps, in any consistent time unit (e.g. seconds or "one forward")."""

    forward: float = 1.0  # time of one chunk's forward for one micro-batch (tf)
    backward: float = 1.0  # time of one chunk's backward for one micro-batch (tb)
    comm: float = 0.0  # time of one point-to-point message, once both ends are posted
    stage_forward: tuple[float, ...] | None = None  # per global stage (chunk * pp + rank); overrides `forward`
    stage_backward: tuple[float, ...] | None = None  # per global stage; overrides `backward`
    # W's share of the full backward (B = (1 - share) tb, W = share tb); 0.5: a linear layer's dX and dW GEMMs
    # cost the same FLOPs
    weight_share: float = 0.5
    stage_weight_share: tuple[float, ...] | None = None  # per global stage; overrides `weight_share`

    def __post_init__(self) -> None:
        for name in ("forward", "backward", "comm"):
            check_number(f"Costs.{name}", getattr(self, name), 0)
        check_number("Costs.weight_share", self.weight_share, 0, 1)
        for name in ("stage_forward", "stage_backward"):
            values = getattr(self, name)
            if values is not None and any(not is_finite(t) or t < 0 for t in values):
                raise ValueError(f"Costs.{name} must hold times >= 0, got {values}")
        shares = (self.weight_share,) + (self.stage_weight_share or ())
        if any(not 0 <= f <= 1 for f in shares):
            raise ValueError(f"Costs.weight_share / stage_weight_share must lie in [0, 1], got {shares}")

    def forward_time(self, stage: int) -> float:
        return self.forward if self.stage_forward is None else self.stage_forward[stage]

    def backward_time(self, stage: int) -> float:
        return self.backward if self.stage_backward is None else self.stage_backward[stage]

    def weight_time(self, stage: int) -> float:
        """W of one micro-batch on `stage`: its share of the full backward."""
        share = self.weight_share if self.stage_weight_share is None else self.stage_weight_share[stage]
        return share * self.backward_time(stage)

    def input_time(self, stage: int) -> float:
        """B of one micro-batch on `stage`: the full backward less W."""
        return self.backward_time(stage) - self.weight_time(stage)

    def check_stages(self, num_stages: int) -> None:
        for name in ("stage_forward", "stage_backward", "stage_weight_share"):
            values = getattr(self, name)
            if values is not None and len(values) != num_stages:
                raise ValueError(f"Costs.{name} must have one entry per global stage (pp * v = {num_stages}), "
                                 f"got {len(values)}")


@dataclass(frozen=True)
class Span:
    """One compute action on one rank."""

    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class BatchSpan:
    """One communication batch on one rank: posted when the rank reached it, done when all its messages were."""

    actions: tuple[Action, ...]
    posted: float
    done: float


@dataclass(frozen=True)
class SimResult:
    """What `simulate` measured; times in the unit of `Costs`, all ranks start at 0."""

    pp: int
    v: int
    timelines: tuple[tuple[Span, ...], ...]  # per rank, compute spans in execution order
    batches: tuple[tuple[BatchSpan, ...], ...]  # per rank, communication batches in execution order
    makespan: float  # T: latest end time over all ranks
    busy: tuple[float, ...]  # per rank, total compute time
    peak_in_flight: tuple[int, ...]  # per rank, max (micro-batch, chunk) activation sets held
    peak_in_flight_microbatches: tuple[int, ...]  # per rank, max distinct micro-batches with activations held
    peak_recv_buffers: tuple[int, ...]  # per rank, max payloads received but not yet consumed (prefetched)
    peak_weight_pending: tuple[int, ...] = ()  # per rank, max (micro-batch, chunk) with B done and W not

    @property
    def bubble_fraction(self) -> float:
        """1 - sum_r busy_r / (pp * makespan); 0 for an empty schedule."""
        if self.makespan == 0:
            return 0.0
        return 1.0 - sum(self.busy) / (self.pp * self.makespan)


class DeadlockError(RuntimeError):
    """The action lists cannot all finish under the executor's semantics."""


@dataclass
class _Batch:
    actions: tuple[Action, ...]
    partners: list[tuple[int, int] | None]  # per action, (rank, step index) of the batch holding its match


# A message end: (rank, step index of its batch, position in the batch).
_Endpoint = tuple[int, int, int]


# A rank's list as steps: a compute Action or a _Batch of communication actions.
_Step = Action | _Batch


def simulate(schedule: list[list[Action]], costs: Costs = Costs(),
             transfer: Transfer = Transfer.LAZY, placement: Placement = Placement.LOOP) -> SimResult:
    """Run all ranks' lists (schedule[r] is rank r's) under the executor's semantics; see the module docstring.

    `Transfer.LAZY` is what `PipelineExecutor` does; `Transfer.RENDEZVOUS` and `Transfer.BUFFERED` model
    executors that wait for each batch (all of it, or its receives). `placement`: which stage each (rank,
    chunk) holds -- `ScheduleKind.placement` of the lists' kind (V for ZBV); a wrong one raises ValueError
    (messages matched with different payloads).
    """
    pp = len(schedule)
    if pp < 1:
        raise ValueError("schedule must hold one action list per pipeline rank, got none")
    v = 1 + max((a.chunk for actions in schedule for a in actions), default=0)
    costs.check_stages(pp * v)
    steps = [_to_steps(actions) for actions in schedule]
    _match_messages(steps, pp, placement)
    run = _run_lazy if transfer is Transfer.LAZY else _run
    spans, batch_spans = run(steps, _Durations(costs, pp, placement), pp, transfer)
    buffers = tuple(_peak_recv_buffers(actions) for actions in schedule)
    return _result(pp, v, spans, batch_spans, buffers)


def _to_steps(actions: list[Action]) -> list[_Step]:
    """Group maximal runs of communication actions into batches."""
    steps: list[_Step] = []
    run: list[Action] = []
    for action in actions:
        if action.op.is_compute:
            if run:
                steps.append(_Batch(tuple(run), [None] * len(run)))
                run = []
            steps.append(action)
        else:
            run.append(action)
    if run:
        steps.append(_Batch(tuple(run), [None] * len(run)))
    return steps


def _match_messages(steps: list[list[_Step]], pp: int, placement: Placement) -> None:
    """Pair the k-th send a -> b with the k-th receive of b from a; record in each batch its messages' partner
    batches. ValueError when a matched pair disagrees on the payload (that would corrupt data silently). A send
    or receive with no partner keeps None and shows up as a deadlock."""
    sends: dict[tuple[int, int], list[_Endpoint]] = {}  # (src, dst) -> sends in posting order
    recvs: dict[tuple[int, int], list[_Endpoint]] = {}  # (src, dst) -> receives in posting order
    for rank, rank_steps in enumerate(steps):
        for index, step in enumerate(rank_steps):
            if isinstance(step, _Batch):
                for position, action in enumerate(step.actions):
                    if action.peer is None or not 0 <= action.peer < pp or action.peer == rank:
                        _check_peer(action, rank, pp)  # raises
                    if action.op.is_send:
                        sends.setdefault((rank, action.peer), []).append((rank, index, position))
                    else:
                        recvs.setdefault((action.peer, rank), []).append((rank, index, position))
    for pair, pair_sends in sends.items():
        for send, recv in zip(pair_sends, recvs.get(pair, [])):
            _pair(send, recv, steps, pp, placement)


def _check_peer(action: Action, rank: int, pp: int) -> None:
    if action.peer is None or not 0 <= action.peer < pp or action.peer == rank:
        raise ValueError(f"rank {rank}: {action} needs a peer pipeline rank in [0, {pp}) other than itself")


def _pair(send: _Endpoint, recv: _Endpoint, steps: list[list[_Step]], pp: int, placement: Placement) -> None:
    s_batch, r_batch = steps[send[0]][send[1]], steps[recv[0]][recv[1]]
    s_action, r_action = s_batch.actions[send[2]], r_batch.actions[recv[2]]
    if not _same_payload(s_action, send[0], r_action, recv[0], pp, placement):
        raise ValueError(f"rank {send[0]} {s_action} is matched (posting order) with rank {recv[0]} {r_action}: "
                         "payloads differ; post receives in the order the sender sends")
    s_batch.partners[send[2]] = recv[:2]
    r_batch.partners[recv[2]] = send[:2]


def _same_payload(send: Action, s_rank: int, recv: Action, r_rank: int, pp: int, placement: Placement) -> bool:
    """SEND_ACT of stage s pairs with RECV_ACT of stage s + 1; SEND_GRAD of stage s with RECV_GRAD of s - 1."""
    expected, step = _PAYLOAD[send.op]
    return (recv.op is expected and recv.microbatch == send.microbatch
            and placement.stage(r_rank, recv.chunk, pp) == placement.stage(s_rank, send.chunk, pp) + step)


_PAYLOAD = {Op.SEND_ACT: (Op.RECV_ACT, 1), Op.SEND_GRAD: (Op.RECV_GRAD, -1)}  # a send's receive, stage step


def _run(steps: list[list[_Step]], costs: "_Durations", pp: int,
         transfer: Transfer) -> tuple[list[list[Span]], list[list[BatchSpan]]]:
    """Advance every rank as far as it can until all finish or none can move."""
    clock = [0.0] * pp
    cursor = [0] * pp
    posted: dict[tuple[int, int], float] = {}  # (rank, step) -> post time of that batch
    spans: list[list[Span]] = [[] for _ in range(pp)]
    batch_spans: list[list[BatchSpan]] = [[] for _ in range(pp)]
    moved = True
    while moved:
        moved = False
        for rank in range(pp):
            while cursor[rank] < len(steps[rank]):
                step = steps[rank][cursor[rank]]
                if isinstance(step, Action):
                    end = clock[rank] + costs.of(step, rank)
                    spans[rank].append(Span(step, clock[rank], end))
                else:
                    posted.setdefault((rank, cursor[rank]), clock[rank])
                    end = _batch_done(step, clock[rank], posted, costs.costs, transfer)
                    if end is None:
                        break
                    batch_spans[rank].append(BatchSpan(step.actions, clock[rank], end))
                clock[rank] = end
                cursor[rank] += 1
                moved = True
    _raise_if_stuck(steps, cursor, posted)
    return spans, batch_spans


def _run_lazy(steps: list[list[_Step]], costs: "_Durations", pp: int,
              transfer: Transfer) -> tuple[list[list[Span]], list[list[BatchSpan]]]:
    """Transfer.LAZY: batches are posted without blocking; a compute waits for the message carrying its input.

    A message moves at max(its send's post, its receive's post) + comm. The compute consuming it starts at
    max(the rank's clock, that arrival); it cannot be placed before the sender has posted the send, since the
    arrival depends on it. Batch spans get done = the arrival of their last message (sends included: the
    executor waits for them at the end of the step, so they count towards the makespan)."""
    inputs = [_input_messages(rank_steps) for rank_steps in steps]
    clock, cursor = [0.0] * pp, [0] * pp
    posted: dict[tuple[int, int], float] = {}
    spans: list[list[Span]] = [[] for _ in range(pp)]
    moved = True
    while moved:
        moved = False
        for rank in range(pp):
            while cursor[rank] < len(steps[rank]):
                index, step = cursor[rank], steps[rank][cursor[rank]]
                if isinstance(step, _Batch):
                    posted[(rank, index)] = clock[rank]
                else:
                    ready = _input_arrival(step, rank, steps, inputs, posted, costs.costs)
                    if ready is None:
                        break
                    start = max(clock[rank], ready)
                    clock[rank] = start + costs.of(step, rank)
                    spans[rank].append(Span(step, start, clock[rank]))
                cursor[rank] += 1
                moved = True
    _raise_if_lazy_stuck(steps, cursor, inputs, posted)
    batch_spans = [[BatchSpan(step.actions, posted[(rank, i)], _lazy_batch_done(rank, i, step, posted, costs.costs))
                    for i, step in enumerate(rank_steps) if isinstance(step, _Batch)]
                   for rank, rank_steps in enumerate(steps)]
    return spans, batch_spans


def _input_messages(rank_steps: list[_Step]) -> dict[tuple[bool, int, int], tuple[int, int]]:
    """(consumer is a forward, micro-batch, chunk) -> (step index, position) of the receive carrying its input
    (RECV_ACT feeds the forward, RECV_GRAD the backward or B; a W receives nothing)."""
    out = {}
    for index, step in enumerate(rank_steps):
        if isinstance(step, _Batch):
            for position, a in enumerate(step.actions):
                if a.op.is_recv:
                    out[(a.op is Op.RECV_ACT, a.microbatch, a.chunk)] = (index, position)
    return out


def _input_key(action: Action) -> tuple[bool, int, int] | None:
    """The `_input_messages` key of a compute's input, None for a W (its input is on the rank already)."""
    if action.op is Op.BACKWARD_WEIGHT:
        return None
    return action.op is Op.FORWARD, action.microbatch, action.chunk


def _input_arrival(action: Action, rank: int, steps: list[list[_Step]], inputs: list[dict],
                   posted: dict[tuple[int, int], float], costs: Costs) -> float | None:
    """When `action`'s input message has arrived (0.0 if it receives none), None while its send is not posted."""
    key = _input_key(action)
    where = None if key is None else inputs[rank].get(key)
    if where is None:
        return 0.0
    partner = steps[rank][where[0]].partners[where[1]]
    if partner is None or partner not in posted:
        return None
    return max(posted[(rank, where[0])], posted[partner]) + costs.comm


def _lazy_batch_done(rank: int, index: int, batch: _Batch, posted: dict[tuple[int, int], float],
                     costs: Costs) -> float:
    own = posted[(rank, index)]
    return max([own] + [max(own, posted[p]) + costs.comm for p in batch.partners if p is not None])


def _raise_if_lazy_stuck(steps: list[list[_Step]], cursor: list[int], inputs: list[dict],
                         posted: dict[tuple[int, int], float]) -> None:
    """A rank stuck at a compute whose input never comes, or a message with no partner (its wait at the end of
    the step would never return)."""
    stuck = [rank for rank in range(len(steps)) if cursor[rank] < len(steps[rank])]
    lines = [f"rank {rank}: {a} has no matching message, so the end-of-step wait for it never returns"
             for rank, rank_steps in enumerate(steps) if rank not in stuck
             for step in rank_steps if isinstance(step, _Batch)
             for a, p in zip(step.actions, step.partners) if p is None]
    for rank in stuck:
        action = steps[rank][cursor[rank]]  # lazily, only a compute can wait
        index, position = inputs[rank][_input_key(action)]
        batch = steps[rank][index]
        partner = batch.partners[position]
        who = "no matching message" if partner is None else f"rank {partner[0]} to post it"
        lines.append(f"rank {rank} stuck at {action}: its input {batch.actions[position]} waits for {who}")
    if lines:
        raise DeadlockError("pipeline schedule deadlocks:\n  " + "\n  ".join(lines))


class LazyTape:
    """`simulate`'s Transfer.LAZY makespan for one set of lists, compiled once and re-timed for any `Costs`
    (the planner times the same lists under many layouts' stage costs: hybrid/planner/schedule.py).

    Which step can run next in `_run_lazy` depends only on which batches are posted, never on durations, so the
    order in which it advances the steps is the same for every `Costs`. The tape records that order once, with
    each compute's stage, op and the posted slots of its input message, and each batch's own and partner slots;
    `makespan` then redoes exactly `_run_lazy`'s float operations in that order -- start = max(clock, max(own
    post, partner post) + comm), end = start + duration, a batch done at max(own, max(own, partner) + comm) --
    so it returns the same float as simulate(...).makespan, bit for bit (tests/test_pipeline18_tape.py).
    Flat lists of ints (few objects for the garbage collector to walk), never changed after __init__."""

    _OPS = (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT)  # a duration's row in `makespan`

    def __init__(self, schedule: list[list[Action]], placement: Placement = Placement.LOOP) -> None:
        self.pp = len(schedule)
        if self.pp < 1:
            raise ValueError("schedule must hold one action list per pipeline rank, got none")
        self.v = 1 + max((a.chunk for actions in schedule for a in actions), default=0)
        steps = [_to_steps(actions) for actions in schedule]
        _match_messages(steps, self.pp, placement)
        slot: dict[tuple[int, int], int] = {}  # (rank, step index) of each batch -> its post time's index
        for rank, rank_steps in enumerate(steps):
            for i, step in enumerate(rank_steps):
                if isinstance(step, _Batch):
                    slot[(rank, i)] = len(slot)
        self.slots = len(slot)
        # per entry, in run order: the rank; the duration's index (op row x stages + stage), -1 for a post; the
        # post's slot or the compute's own input slot (-1: receives nothing); the input's partner slot
        self.rank: list[int] = []
        self.duration: list[int] = []
        self.own: list[int] = []
        self.partner: list[int] = []
        self._order(steps, placement, slot)
        # each batch's messages, flat: (its slot, the partner's slot); a batch is done at the max of its own post
        # and of max(own, partner) + comm over them, and the makespan takes the max over all, so flat is the same
        self.message_own: list[int] = []
        self.message_partner: list[int] = []
        for (rank, i), own in slot.items():
            for p in steps[rank][i].partners:
                if p is not None:
                    self.message_own.append(own)
                    self.message_partner.append(slot[p])

    def _order(self, steps: list[list[_Step]], placement: Placement, slot: dict) -> None:
        """`_run_lazy`'s loop without the clock, appending each step to the tape in the order it runs them."""
        pp, stages = self.pp, self.pp * self.v
        row = {op: i * stages for i, op in enumerate(self._OPS)}
        stage = [[stage_of(rank, chunk, pp, placement) for chunk in range(self.v)] for rank in range(pp)]
        inputs = [_input_messages(rank_steps) for rank_steps in steps]
        entries = [self._entries(rank, rank_steps, inputs[rank], row, stage[rank], slot)
                   for rank, rank_steps in enumerate(steps)]
        cursor, posted = [0] * pp, set()  # posted: the slots of the batches posted so far
        ranks, durations, owns, partners = self.rank.append, self.duration.append, self.own.append, self.partner.append
        moved = True
        while moved:
            moved = False
            for rank in range(pp):
                rank_entries, n, i = entries[rank], len(entries[rank]), cursor[rank]
                while i < n:
                    duration, own, partner = rank_entries[i]
                    if duration < 0:
                        posted.add(own)
                    elif own >= 0 and (partner is None or partner not in posted):
                        break  # its input's send is not posted yet (None: it has no partner; a deadlock)
                    ranks(rank), durations(duration), owns(own), partners(-1 if partner is None else partner)
                    i += 1
                moved = moved or i > cursor[rank]
                cursor[rank] = i
        posted_at = {key: 0.0 for key, index in slot.items() if index in posted}
        _raise_if_lazy_stuck(steps, cursor, inputs, posted_at)

    @staticmethod
    def _entries(rank: int, rank_steps: list[_Step], inputs: dict, row: dict, stage: list[int],
                 slot: dict) -> list[tuple[int, int, int | None]]:
        """Each step of the rank as the tape will hold it: (-1, its slot, -1) for a batch; (duration index, its
        input's own slot, the partner's slot) for a compute, (.., -1, -1) when it receives nothing, partner None
        when the receive has no matching send."""
        out = []
        for index, step in enumerate(rank_steps):
            if isinstance(step, _Batch):
                out.append((-1, slot[(rank, index)], -1))
                continue
            key = _input_key(step)
            where = None if key is None else inputs.get(key)
            own = partner = -1
            if where is not None:
                other = rank_steps[where[0]].partners[where[1]]
                own, partner = slot[(rank, where[0])], None if other is None else slot[other]
            out.append((row[step.op] + stage[step.chunk], own, partner))
        return out

    def makespan(self, costs: Costs) -> float:
        """simulate(schedule, costs, Transfer.LAZY, placement).makespan, bit for bit."""
        costs.check_stages(self.pp * self.v)
        reads = (costs.forward_time, costs.backward_time, costs.input_time, costs.weight_time)  # as _OPS
        durations = [read(stage) for read in reads for stage in range(self.pp * self.v)]
        comm = costs.comm
        clock, posted = [0.0] * self.pp, [0.0] * self.slots
        end = 0.0
        for rank, d, own, partner in zip(self.rank, self.duration, self.own, self.partner):
            if d < 0:
                posted[own] = clock[rank]
                continue
            ready = 0.0 if own < 0 else max(posted[own], posted[partner]) + comm
            start = max(clock[rank], ready)
            clock[rank] = start + durations[d]
            end = max(end, clock[rank])
        end = max([end] + posted)  # every batch's own post (max is exact: any grouping gives the same float)
        for own, partner in zip(self.message_own, self.message_partner):
            end = max(end, max(posted[own], posted[partner]) + comm)
        return end


@dataclass(frozen=True)
class _Durations:
    """Each compute's duration on its rank: `Costs` read at the action's global stage."""

    costs: Costs
    pp: int
    placement: Placement

    def of(self, action: Action, rank: int) -> float:
        stage = stage_of(rank, action.chunk, self.pp, self.placement)
        return _READ[action.op](self.costs, stage)


_READ = {Op.FORWARD: Costs.forward_time, Op.BACKWARD: Costs.backward_time, Op.BACKWARD_INPUT: Costs.input_time,
         Op.BACKWARD_WEIGHT: Costs.weight_time}  # a compute's duration, by its op (built once, not per action)


def _batch_done(batch: _Batch, now: float, posted: dict[tuple[int, int], float], costs: Costs,
                transfer: Transfer) -> float | None:
    """Completion time of a batch posted at `now`, or None while a partner it must wait for is not posted yet."""
    done = now
    for action, partner in zip(batch.actions, batch.partners):
        if transfer is Transfer.BUFFERED and action.op.is_send:
            continue
        if partner is None or partner not in posted:
            return None
        done = max(done, max(now, posted[partner]) + costs.comm)
    return done


def _raise_if_stuck(steps: list[list[_Step]], cursor: list[int], posted: dict[tuple[int, int], float]) -> None:
    stuck = [rank for rank in range(len(steps)) if cursor[rank] < len(steps[rank])]
    if not stuck:
        return
    lines = []
    for rank in stuck:
        batch = steps[rank][cursor[rank]]
        waits = [f"{a} waits for " + ("no matching message" if p is None else f"rank {p[0]} to reach it")
                 for a, p in zip(batch.actions, batch.partners) if p is None or p not in posted]
        lines.append(f"rank {rank} stuck at batch [{', '.join(map(str, batch.actions))}]: {'; '.join(waits)}")
    raise DeadlockError("pipeline schedule deadlocks:\n  " + "\n  ".join(lines))


def _result(pp: int, v: int, spans: list[list[Span]], batch_spans: list[list[BatchSpan]],
            buffers: tuple[int, ...]) -> SimResult:
    ends = [s.end for rank in spans for s in rank] + [b.done for rank in batch_spans for b in rank]
    peaks = [_peak_in_flight(rank) for rank in spans]
    pending = tuple(_peak_weight_pending(rank) for rank in spans)
    return SimResult(
        pp=pp,
        v=v,
        timelines=tuple(tuple(rank) for rank in spans),
        batches=tuple(tuple(rank) for rank in batch_spans),
        makespan=max(ends, default=0.0),
        busy=tuple(sum(s.end - s.start for s in rank) for rank in spans),
        peak_in_flight=tuple(p[0] for p in peaks),
        peak_in_flight_microbatches=tuple(p[1] for p in peaks),
        peak_recv_buffers=buffers,
        peak_weight_pending=pending,
    )


def _peak_in_flight(spans: list[Span]) -> tuple[int, int]:
    """Max (micro-batch, chunk) pairs and max distinct micro-batches held: + at a forward, - after a full
    backward or a W (a B frees nothing: W still needs F's saved tensors)."""
    held: dict[int, int] = {}  # micro-batch -> chunks held
    peak_chunks = peak_mbs = chunks = 0  # chunks = sum(held.values()), kept as it changes
    for span in spans:
        if not (span.action.op is Op.FORWARD or span.action.op.frees_activations):
            continue
        mb = span.action.microbatch
        step = 1 if span.action.op is Op.FORWARD else -1
        held[mb] = held.get(mb, 0) + step
        chunks += step
        if held[mb] == 0:
            del held[mb]
        peak_chunks = max(peak_chunks, chunks)
        peak_mbs = max(peak_mbs, len(held))
    return peak_chunks, peak_mbs


_PENDING_STEP = {Op.BACKWARD_INPUT: 1, Op.BACKWARD_WEIGHT: -1}


def _peak_weight_pending(spans: list[Span]) -> int:
    """Max (micro-batch, chunk) pairs whose B has run and whose W has not: + at a B, - after its W."""
    pending = peak = 0
    for span in spans:
        pending += _PENDING_STEP.get(span.action.op, 0)
        peak = max(peak, pending)
    return peak


def _peak_recv_buffers(actions: list[Action]) -> int:
    """Max payloads a rank holds between their receive and the compute that consumes them (FORWARD(mb, c) takes
    RECV_ACT(mb, c), BACKWARD(mb, c) takes RECV_GRAD(mb, c)). 1 means no prefetching beyond the next compute."""
    consumes = {Op.FORWARD: Op.RECV_ACT, Op.BACKWARD: Op.RECV_GRAD, Op.BACKWARD_INPUT: Op.RECV_GRAD}
    held: set[tuple[Op, int, int]] = set()
    peak = 0
    for action in actions:
        if action.op.is_recv:
            held.add((action.op, action.microbatch, action.chunk))
            peak = max(peak, len(held))
        elif action.op in consumes:
            held.discard((consumes[action.op], action.microbatch, action.chunk))
    return peak


def format_timeline(result: SimResult, slot: float | None = None) -> str:
    """ASCII picture: one row per rank, one cell per `slot` of time (default: the shortest compute span).

    A cell reads F<mb> / B<mb> / W<mb> (with the chunk letter a, b, ... when v > 1) where a compute starts, '-' while
    it continues, '.' when the rank is idle (bubble or waiting on communication).
    """
    durations = [s.end - s.start for rank in result.timelines for s in rank if s.end > s.start]
    slot = slot or min(durations, default=1.0)
    width = 1 + len(str(max((s.action.microbatch for r in result.timelines for s in r), default=0)))
    width += 1 if result.v > 1 else 0
    cells = round(result.makespan / slot)
    rows = []
    for rank, spans in enumerate(result.timelines):
        row = ["." * width] * cells
        for span in spans:
            first, last = round(span.start / slot), round(span.end / slot)
            for cell in range(first, last):
                row[cell] = _label(span.action, result.v, width) if cell == first else "-" * width
        rows.append(f"rank {rank} | " + " ".join(row))
    return "\n".join(rows)


def _label(action: Action, v: int, width: int) -> str:
    chunk = chr(ord("a") + action.chunk) if v > 1 else ""
    return f"{action.op.letter}{action.microbatch}{chunk}".ljust(width)
