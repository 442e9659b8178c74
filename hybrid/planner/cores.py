"""Ranks sharing a CPU's cores: one training step as a list schedule of every rank's phases (issue 26).

With more gloo ranks than cores (the main job: 8 ranks, tp 2 x pp 2 x dp 2, on 2 cores) a step is neither the
pipeline's makespan at solo speed nor the node's CPU seconds / cores: the cores idle wherever the pipeline's
dependencies leave fewer runnable ranks than cores (fill, drain, a TP pair waiting for its slower half), and a
runnable rank runs slower wherever more ranks than cores are runnable. So the step is simulated:

* each rank runs a program of phases in order (`Work`, `Sync`, `Send`, `Recv`), built from the plan
  (`step_programs`): its micro-batches' forward and backward passes in the schedule's own order
  (hybrid.pipeline.compute_order, the list the executor runs: no second schedule), each pass's compute cut by its
  TP collectives, each collective a barrier over its group then the call's CPU work, a pipeline message a send
  whose receiver waits for it, then the step's tail: the tied-embedding and DP all-reduces, train.py's scalar
  all-reduces and the optimizer;
* processor sharing, as Linux CFS shares equal-nice CPU-bound processes: at any moment the n runnable ranks (in
  `Work`) each advance at

      rate(n) = min(1, C / n)      seconds of solo work per second,

  C the cores (`units`); a rank blocked in a `Sync` or `Recv` uses no core -- gloo sleeps in a wait, it does not
  spin: a rank blocked 2.4-2.6 s in a recv or an all-reduce for a late peer burned 0.000 s of CPU (utime + stime
  of all its threads in /proc/<pid>/stat; measured 2026-12-06, gloo, torch 2.13 CPU);
* the step is the makespan: every rank starts at 0 (the previous step's last all-reduces, over PP then DP, left
  all ranks in step) and the step ends when the last rank ends.

Properties (tests/test_planner_cores.py): C >= the ranks gives the dependency makespan (every rank at rate 1); C
= 1 gives the total CPU (with no wall-only delays some rank is always runnable until the end); the makespan does
not grow with C; a single rank's program takes the sum of its work.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Hashable, Union

from hybrid.pipeline import Op, ScheduleKind, compute_order
from hybrid.planner.schedule import WEIGHT_SHARE

_EPS = 1e-12  # seconds of work left that count as done (float noise of rate x dt)


@dataclass(frozen=True)
class Work:
    """`cpu` seconds of one core's work at the solo rate (compute, or a collective's own CPU)."""

    cpu: float


@dataclass(frozen=True)
class Sync:
    """A barrier: the rank waits, using no core, until `members` ranks have reached a Sync of the same key."""

    key: Hashable
    members: int


@dataclass(frozen=True)
class Send:
    """Posts message `key` (never blocks: the executor's sends are lazy); it arrives `delay` wall seconds later
    (a transfer on no core; its CPU is a `Work` beside it)."""

    key: Hashable
    delay: float = 0.0


@dataclass(frozen=True)
class Recv:
    """Waits, using no core, until message `key` has arrived."""

    key: Hashable


Phase = Union[Work, Sync, Send, Recv]


class CoresDeadlock(RuntimeError):
    """No rank can advance and some have not finished: the programs wait on each other."""


@dataclass(frozen=True)
class CoreRun:
    """One simulated step.

    Attributes:
        makespan: seconds until the last rank finished.
        cpu: per rank, its seconds of work (the sum of its Work phases).
        idle: core-seconds no rank used: C x makespan - sum(cpu) (the fill, drain and waits the cores sat out).
        units: the cores C simulated.
    """

    makespan: float
    cpu: tuple[float, ...]
    idle: float
    units: float


@dataclass
class _State:
    """The simulator's per-rank cursor."""

    index: int = 0
    left: float = 0.0  # work left in the current Work phase
    started: bool = False  # the current phase has been entered (Work: `left` set; Sync: counted)


@dataclass
class _World:
    """What the ranks share: barrier arrivals and message arrival times."""

    arrived: dict = field(default_factory=lambda: defaultdict(int))
    released: set = field(default_factory=set)
    messages: dict = field(default_factory=dict)


def share_cores(programs: list[list[Phase]], units: float) -> CoreRun:
    """Simulate `programs` (one per rank) on `units` cores shared equally by the runnable ranks (module docstring)."""
    if units <= 0:
        raise ValueError(f"units must be > 0 cores, got {units}")
    states, world, now, idle = [_State() for _ in programs], _World(), 0.0, 0.0
    while True:
        _settle(programs, states, world, now)
        running = [r for r, s in enumerate(states) if s.index < len(programs[r])
                   and isinstance(programs[r][s.index], Work)]
        timers = [t for t in _pending_arrivals(programs, states, world) if t > now]
        if not running and not timers:
            if all(s.index >= len(p) for s, p in zip(states, programs)):
                break
            raise CoresDeadlock(_stuck(programs, states))
        rate = min(1.0, units / len(running)) if running else 0.0
        step = min([states[r].left / rate for r in running] + [t - now for t in timers])
        for r in running:
            states[r].left -= rate * step
        idle += (units - rate * len(running)) * step
        now += step
    cpu = tuple(sum(p.cpu for p in prog if isinstance(p, Work)) for prog in programs)
    return CoreRun(makespan=now, cpu=cpu, idle=idle, units=units)


def _settle(programs: list[list[Phase]], states: list[_State], world: _World, now: float) -> None:
    """Advance every rank through what completes at `now` without a core: finished work, posted sends, arrived
    messages, released barriers; repeat until nothing moves."""
    moved = True
    while moved:
        moved = False
        for r, prog in enumerate(programs):
            s = states[r]
            while s.index < len(prog):
                phase = prog[s.index]
                if isinstance(phase, Work):
                    if not s.started:
                        s.left, s.started = phase.cpu, True
                    if s.left > _EPS:
                        break
                elif isinstance(phase, Send):
                    world.messages[phase.key] = now + phase.delay
                elif isinstance(phase, Recv):
                    if world.messages.get(phase.key, float("inf")) > now + _EPS:
                        break
                else:  # Sync
                    if not s.started:
                        s.started = True
                        world.arrived[phase.key] += 1
                        if world.arrived[phase.key] >= phase.members:
                            world.released.add(phase.key)
                    if phase.key not in world.released:
                        break
                s.index, s.left, s.started, moved = s.index + 1, 0.0, False, True


def _pending_arrivals(programs: list[list[Phase]], states: list[_State], world: _World) -> list[float]:
    """Arrival times of the messages ranks wait for that are already on their way."""
    out = []
    for r, s in enumerate(states):
        if s.index < len(programs[r]) and isinstance(programs[r][s.index], Recv):
            t = world.messages.get(programs[r][s.index].key)
            if t is not None:
                out.append(t)
    return out


def _stuck(programs: list[list[Phase]], states: list[_State]) -> str:
    waits = [f"rank {r} at {programs[r][s.index]}" for r, s in enumerate(states) if s.index < len(programs[r])]
    return "the ranks' programs deadlock: " + "; ".join(waits[:8])


@dataclass(frozen=True)
class StepCosts:
    """Solo seconds of one step's parts, what `step_programs` lays out (time.py computes them from the plan).

    Attributes:
        forward, backward: per global stage, one micro-batch's compute (no collectives) on one core alone.
        forward_calls, backward_calls: per global stage, the CPU seconds of each TP collective of that pass, in
            order (a pass of k collectives computes in k + 1 equal pieces between them).
        message_cpu: CPU seconds of a pipeline send, and of a receive (each end pays it).
        message_delay: wall seconds a message travels on no core.
        tail: per pipeline rank, the step after its last backward, in train.py's order: (group, CPU seconds),
            group "tp", "pp", "dp" or "embedding" for a collective (a barrier over that group first), or "work"
            (the optimizer: no barrier).
    """

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    forward_calls: tuple[tuple[float, ...], ...]
    backward_calls: tuple[tuple[float, ...], ...]
    message_cpu: float
    message_delay: float
    tail: tuple[tuple[tuple[str, float], ...], ...]


@dataclass(frozen=True)
class Grid:
    """Where a rank sits: pipeline rank, DP replica, TP rank (rank = (p dp + d) tp + t: TP innermost)."""

    tp: int
    pp: int
    dp: int

    @property
    def ranks(self) -> int:
        return self.tp * self.pp * self.dp

    def group(self, name: str, p: int, d: int, t: int) -> tuple[tuple, int]:
        """(the id of rank (p, d, t)'s `name` group, its size)."""
        if name == "tp":
            return ("tp", p, d), self.tp
        if name == "dp":
            return ("dp", p, t), self.dp
        if name == "pp":
            return ("pp", d, t), self.pp
        if name == "embedding":  # the first and the last pipeline rank
            return ("embedding", d, t), 2
        raise ValueError(f"unknown group {name!r}")


def step_programs(kind: ScheduleKind, grid: Grid, m: int, v: int, costs: StepCosts) -> list[list[Phase]]:
    """Every rank's program for one step (rank = (p dp + d) tp + t)."""
    programs = []
    for p in range(grid.pp):
        for d in range(grid.dp):
            for t in range(grid.tp):
                programs.append(_rank_program(kind, grid, m, v, costs, p, d, t))
    return programs


def _rank_program(kind: ScheduleKind, grid: Grid, m: int, v: int, costs: StepCosts, p: int, d: int,
                  t: int) -> list[Phase]:
    """Rank (p, d, t): its compute order, each pass waiting for its input message and sending its output, then
    its tail. Messages are keyed (replica d, t, direction, micro-batch, receiving stage)."""
    pp, out, count = grid.pp, [], defaultdict(int)
    last = pp * v - 1
    placement = kind.placement

    def sync(name: str, cpu: float) -> None:
        gid, members = grid.group(name, p, d, t)
        if members > 1:
            out.append(Sync((gid, count[gid]), members))
            count[gid] += 1
        out.append(Work(cpu))

    for a in compute_order(kind, pp, p, m, v):
        stage = placement.stage(p, a.chunk, pp)
        forward = a.op is Op.FORWARD
        source = stage - 1 if forward else stage + 1  # whose output this pass reads
        if a.op is not Op.BACKWARD_WEIGHT and 0 <= source <= last and placement.rank_chunk(source, pp)[0] != p:
            out += [Recv((d, t, forward, a.microbatch, stage)), Work(costs.message_cpu)]
        if a.op is Op.BACKWARD_WEIGHT:
            compute, calls = costs.backward[stage] * _weight_share(stage), ()
        elif forward:
            compute, calls = costs.forward[stage], costs.forward_calls[stage]
        else:
            share = 1.0 - _weight_share(stage) if a.op is Op.BACKWARD_INPUT else 1.0
            compute, calls = costs.backward[stage] * share, costs.backward_calls[stage]
        piece = compute / (len(calls) + 1)
        out.append(Work(piece))
        for call in calls:
            sync("tp", call)
            out.append(Work(piece))
        target = stage + 1 if forward else stage - 1
        if a.op is not Op.BACKWARD_WEIGHT and 0 <= target <= last and placement.rank_chunk(target, pp)[0] != p:
            out += [Work(costs.message_cpu), Send((d, t, forward, a.microbatch, target), costs.message_delay)]
    for name, cpu in costs.tail[p]:
        if name == "work":
            out.append(Work(cpu))
        else:
            sync(name, cpu)
    return out


def _weight_share(stage: int) -> float:
    """W's share of a zero-bubble backward, as the pipeline simulation prices it (planner.schedule): the first
    stage's B computes nothing upstream needs, so its W is the whole backward."""
    return 1.0 if stage == 0 else WEIGHT_SHARE
