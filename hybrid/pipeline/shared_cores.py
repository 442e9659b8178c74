"""The pipeline simulation with the node's cores as a shared resource (more processes than cores: gloo ranks on a
CPU), so a step is one simulated number where the planner had max(makespan, CPU a step / cores).

Each pipeline rank stands for `processes` OS processes (its t x d tensor- and data-parallel ranks, in lock step).
A compute of stage s takes `Costs` seconds when it has a core of its own (its wall time d: kernels, Python and the
TP collectives it waits in); of that, `cpu` seconds (w <= d) run on a core and the rest, l = d - w, the process
waits without running (blocked in a collective for its peers or the wire). With more processes than cores the
runnable ones share the cores equally (processor sharing): each advances at

    rho = min(1, cores / runnable).

Fluid, within a compute: its w and l are spread finely over it (a pass is many collectives apart), so a process of
it is runnable a share (w / rho) / (l + w / rho) of the time and the compute lasts l + w / rho. The cores then run

    sum over running computes i of processes x w_i / (l_i + w_i / rho)      CPU seconds a second,

which is rho x runnable; rho = 1 when that is <= cores at rho = 1 (nobody waits for a core), else the rho in
(0, 1) at which it equals the cores (one root: the sum rises with rho; bisection). rho is constant between events
(a compute starting or ending), so each compute's progress is piecewise linear and the makespan exact for this
model. The two limits are the planner's two old bounds: no waits (l = 0) -> the cores' CPU bound
(rho = cores / (processes x running)); a core per process -> rho = 1, the plain simulation's makespan exactly
(tests/test_shared_cores.py checks both, and a hand-derived 2-core, 4-process 1F1B whose step exceeds both).

Messages move as in `simulate`'s Transfer.LAZY (posting never blocks; a compute waits for its input, arrival =
max(both posts) + comm; the last sends count towards the makespan); their wall time is not CPU here (their CPU
is the caller's to put in `cpu`). Not modelled: cache sharing between processes, the scheduler's slices (a
descheduled peer delays its partner's collective -- that is in d only as far as the calibrated latency holds it)."""

from __future__ import annotations

from hybrid.pipeline.schedules import Action, Placement
from hybrid.pipeline.simulate import (Costs, _Batch, _Durations, _input_arrival, _input_messages, _lazy_batch_done,
                                      _match_messages, _raise_if_lazy_stuck, _to_steps)

_BISECTIONS = 60  # rho to 2^-60 relative: far below any timing's noise
_TOL = 1e-12  # relative: events this close are one event (float sums of the same durations)


def shared_rate(running: list[tuple[float, float]], processes: int, cores: float) -> float:
    """rho: the speed of a runnable process when computes with (w, l) = `running` share `cores` (module
    docstring). 1 when nothing waits for a core."""
    def used(rho: float) -> float:  # CPU seconds a second the running computes take at rate rho
        return sum(processes * w / (l + w / rho) for w, l in running if w > 0)
    if used(1.0) <= cores:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(_BISECTIONS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if used(mid) <= cores else (lo, mid)
    return lo if lo > 0 else hi


def simulate_shared(schedule: list[list[Action]], costs: Costs, cpu: Costs, processes: int, cores: float,
                    placement: Placement = Placement.LOOP) -> float:
    """Makespan of `schedule` (Transfer.LAZY) when each compute's CPU seconds `cpu` (read like `costs`: per global
    stage, forward / backward / B / W; clipped to the compute's wall time) run on `cores` shared by every running
    compute's `processes` processes."""
    pp = len(schedule)
    if cores <= 0 or processes < 1:
        raise ValueError(f"simulate_shared needs cores > 0 and processes >= 1, got {cores}, {processes}")
    v = 1 + max((a.chunk for actions in schedule for a in actions), default=0)
    costs.check_stages(pp * v)
    cpu.check_stages(pp * v)
    steps = [_to_steps(actions) for actions in schedule]
    _match_messages(steps, pp, placement)
    inputs = [_input_messages(rank_steps) for rank_steps in steps]
    wall, busy = _Durations(costs, pp, placement), _Durations(cpu, pp, placement)
    now, last_end = 0.0, 0.0
    cursor, free_at = [0] * pp, [0.0] * pp
    posted: dict[tuple[int, int], float] = {}
    running: dict[int, list[float]] = {}  # rank -> [w, l, progress in [0, 1]]
    starts: dict[int, float] = {}  # rank -> when its next compute may start (its input's arrival)
    while True:
        _advance(steps, inputs, cursor, free_at, posted, running, starts, now, costs, wall, busy)
        if not running and not starts:
            break
        rho = shared_rate([(w, l) for w, l, _ in running.values()], processes, cores)
        ends = {r: now + (1 - p) * (l + w / rho) for r, (w, l, p) in running.items()}
        then = min(list(ends.values()) + list(starts.values()))
        for r in list(running):
            w, l, p = running[r]
            if ends[r] <= then + _TOL * max(1.0, then):
                del running[r]
                free_at[r] = last_end = then
                cursor[r] += 1
            else:
                running[r][2] = p + (then - now) / (l + w / rho)
        now = then
    _raise_if_lazy_stuck(steps, cursor, inputs, posted)
    sends = [_lazy_batch_done(rank, i, step, posted, costs) for rank, rank_steps in enumerate(steps)
             for i, step in enumerate(rank_steps) if isinstance(step, _Batch)]
    return max([last_end] + sends)


def _advance(steps, inputs, cursor, free_at, posted, running, starts, now, costs, wall, busy) -> None:
    """At time `now`: every idle rank posts its batches and starts the computes whose input has arrived (until
    no rank moves: a post may release another rank's input); a compute whose input arrives later is due at that
    time (`starts`)."""
    moved = True
    while moved:
        moved = False
        for rank in range(len(steps)):
            while rank not in running and cursor[rank] < len(steps[rank]):
                index, step = cursor[rank], steps[rank][cursor[rank]]
                if isinstance(step, _Batch):
                    posted[(rank, index)] = free_at[rank]
                    cursor[rank] += 1
                    moved = True
                    continue
                ready = _input_arrival(step, rank, steps, inputs, posted, costs)
                if ready is None:
                    break
                start = max(free_at[rank], ready)
                if start > now + _TOL * max(1.0, now):
                    starts[rank] = start
                    break
                starts.pop(rank, None)
                moved = True
                d = wall.of(step, rank)
                if d <= 0:  # nothing to run: done at once
                    free_at[rank] = now
                    cursor[rank] += 1
                    continue
                running[rank] = [min(busy.of(step, rank), d), d - min(busy.of(step, rank), d), 0.0]
