"""The pipeline numbers the planner needs, taken from the schedule simulation (hybrid.pipeline), never from a
second formula: activations in flight per rank, and the makespan (hence the bubble) of one step.

Cost control. `build_schedule` costs about pp (m v)^2 operations and `simulate` about pp m v, so a step with
m = 512 micro-batches on pp = 64 ranks is not simulated whole. Two properties of the lists, checked by
tests/test_planner.py on every small configuration, make that unnecessary:

* In flight. The number of (micro-batch, chunk) activation sets a rank holds depends only on the order of
  its compute actions, not on their durations or on the messages between them; so it is simulated on the
  compute-only lists (`compute_order`), which skips the quadratic message placement. It rises through the
  warm-up and stays flat in the steady state: once every rank completes its warm-up -- m >= pp for 1F1B,
  m >= 2 pp for interleaved (rank 0 warms up with 2 (pp - 1) + (v - 1) pp < 2 pp v chunk-forwards) -- the
  peaks no longer change with m, so we simulate min(m, that saturation point), cached per (schedule, pp, m, v).
* Makespan. In the steady state each further micro-batch (1F1B) or group of pp micro-batches (interleaved)
  adds the same time. We simulate at m1, m1 + k, m1 + 2k (k = 1 or pp), slide the window while the two
  increments differ (start-up transient), then extrapolate linearly: T(m) = T(m3) + (m - m3)/k (T(m3) - T(m2)).
  Busy time is exact, m sum of the rank's stage costs; bubble = 1 - sum busy / (pp T) as `SimResult` defines it.

Schedules up to `SIM_BUDGET` (pp (m v)^2) are simulated; a larger one raises `SimulationTooLarge`.

Zero bubble (ZB-H1, `Layout.zero_bubble`). The simulation prices B and W apart: W takes `WEIGHT_SHARE` of a
stage's backward (a linear's dX and dW are GEMMs of equal FLOPs; the attention core, with no weights, is B's, so
0.5 errs towards W), except on the first stage, whose B does nothing (nothing upstream needs an input gradient)
and whose W is the whole backward (hybrid/pipeline/split_backward.py). In flight counts a (micro-batch, chunk)
from F to W (W needs F's saved tensors); `InFlight.weight_pending` counts those between B and W, which also hold
the output gradients B keeps for W (`kept_gradient_bytes`). Same saturation point as 1F1B: m >= pp.

ZBV (`Layout.zero_bubble` with v = 2): the same B / W pricing on 2 pp stages placed in a V (rank r holds stages
r and 2 pp - 1 - r, `Placement.V`; `layout.rank_stages`). Its lists are built for max(m, 2 pp - 1) micro-batches,
so in flight saturates at m = 2 pp - 1, and the makespan grows by the same step per micro-batch from
m >= (3 pp - 1) / 2: the window of three starts at 2 pp - 1 with step 1. At tF = tB = tW = t it is the closed form
6 m t + max(2 (2 pp - 1 - m), pp - 1) t (tests/test_pipeline_zb_planner.py). Its two chunks on a rank differ
(rank 0's are the first stage, with the embedding, and the last, with the LM head), so its activation peak is
walked in bytes (`peak_held`: +A at F, +kept at B, -both at W) rather than counted in sets.
"""

from __future__ import annotations

import gc
import math

from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

from hybrid.pipeline import Costs, Op, ScheduleKind, SimResult, build_schedule, compute_order, simulate
from hybrid.planner.model import ACT_BYTES, FP32, ActivationProfile
from hybrid.pipeline.schedules import Action
from hybrid.pipeline.simulate import LazyTape
from hybrid.pipeline.shared_cores import simulate_shared
from hybrid.planner.layout import rank_stages

SIM_BUDGET = 3.0e6  # pp (m v)^2 of the largest schedule simulated: about two seconds of list building
WEIGHT_SHARE = 0.5  # W's share of a stage's backward under the zero-bubble schedules (see the module docstring)
_MAX_SLIDES = 8  # windows tried before giving up on a steady increment


class SimulationTooLarge(ValueError):
    """The schedule needed for an answer exceeds the simulation budget."""


@dataclass(frozen=True)
class InFlight:
    """Activations held, from the compute-only simulation.

    Attributes:
        chunks: per pipeline rank, the peak number of (micro-batch, chunk) activation sets
            (`SimResult.peak_in_flight`; one set = one chunk's layers for one micro-batch).
        microbatches: per rank, the peak number of distinct micro-batches held.
        first_chunk: peak micro-batches whose chunk 0 activations rank 0 holds (embedding outputs).
        last_chunk: peak micro-batches whose last-stage activations its rank holds (logits; rank pp - 1, or
            rank 0's chunk 1 under ZBV's V).
        simulated_m: the micro-batch count simulated (saturated: same peaks for every larger m).
        weight_pending: per rank, the peak (micro-batch, chunk) pairs between B and W (zero-bubble schedules;
            0 for the others): each holds the output gradients B kept for W.
    """

    chunks: tuple[int, ...]
    microbatches: tuple[int, ...]
    first_chunk: int
    last_chunk: int
    simulated_m: int
    weight_pending: tuple[int, ...] = ()


@dataclass(frozen=True)
class StageTimes:
    """Seconds of one micro-batch on each global stage (stage = chunk pp + rank), and of one message.

    Attributes:
        forward: per global stage, one micro-batch's forward.
        backward: per global stage, its backward (recomputation included).
        comm: one point-to-point activation or gradient message between neighbouring stages.
        rank_compute: per pipeline rank, one micro-batch's compute over its chunks without the TP collectives
            in the stage times (what occupies a core; the shared-compute bound's input); () when not given.
    """

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    comm: float
    rank_compute: tuple[float, ...] = ()


@dataclass(frozen=True)
class PipelineRun:
    """One step of the pipeline, from the simulation.

    Attributes:
        makespan: seconds from the first forward to the last backward on any rank.
        busy: per rank, seconds of compute.
        bubble_fraction: 1 - sum busy / (pp makespan): idle share, imbalance and blocked messages included.
        simulated_m: the micro-batch counts simulated.
        extrapolated: True when makespan was extrapolated from `simulated_m`.
    """

    makespan: float
    busy: tuple[float, ...]
    bubble_fraction: float
    simulated_m: tuple[int, ...]
    extrapolated: bool


def saturation_m(kind: ScheduleKind, pp: int, v: int) -> int:
    """Smallest m at which every rank completes its warm-up (see the module docstring); ZBV: 2 pp - 1, the
    micro-batches that fill its V (`_zbv_order` builds every list for max(m, 2 pp - 1))."""
    if kind is ScheduleKind.GPIPE:
        raise ValueError("GPipe holds all m micro-batches: its peaks never saturate; simulate the full m")
    if kind is ScheduleKind.ZBV:
        return 2 * pp - 1
    return pp if v == 1 else 2 * pp


def extrapolation_step(kind: ScheduleKind, pp: int, v: int) -> int:
    """Micro-batches that add one steady-state increment to the makespan: 1 (1F1B, ZB-H1, ZBV, whose steady
    state repeats per micro-batch), pp for interleaved (a group of pp micro-batches goes through every chunk)."""
    return 1 if v == 1 or kind is ScheduleKind.ZBV else pp


def sim_size(pp: int, m: int, v: int) -> float:
    """Work of building the lists, pp (m v)^2 (the list builder pairs every message with its consumer)."""
    return pp * float(m * v) ** 2


def in_flight(kind: ScheduleKind, pp: int, m: int, v: int) -> InFlight:
    """Peak activations in flight per rank for m micro-batches (simulated at the saturation point)."""
    m_sim = m if kind is ScheduleKind.GPIPE else min(m, saturation_m(kind, pp, v))
    return _in_flight(kind, pp, m_sim, v)


@lru_cache(maxsize=512)
def _in_flight(kind: ScheduleKind, pp: int, m: int, v: int) -> InFlight:
    # The peaks depend only on each rank's compute order (the simulator counts + at a forward, - after a
    # backward, in execution order), so the compute-only lists give the same peaks as the full ones without
    # the cost of placing the messages; tests/test_planner.py checks the two agree.
    with gc_paused():  # as _tape: many short-lived acyclic objects
        orders = [compute_order(kind, pp, rank, m, v) for rank in range(pp)]
        result = simulate(orders, Costs())
    return InFlight(chunks=result.peak_in_flight, microbatches=result.peak_in_flight_microbatches,
                    first_chunk=_chunk_peak(result, 0, 0),
                    last_chunk=_chunk_peak(result, *kind.placement.rank_chunk(pp * v - 1, pp)),
                    simulated_m=m, weight_pending=result.peak_weight_pending)


def peak_held(kind: ScheduleKind, pp: int, m: int, v: int, rank: int, held: tuple[float, ...],
              kept: tuple[float, ...]) -> float:
    """Peak bytes on `rank` when its chunk c's forward saves held[c] and, under a zero-bubble schedule, its B
    keeps kept[c] more until W frees both (a full backward frees held[c]): the running maximum over the rank's
    compute order, at the saturation point (same peak for every larger m)."""
    m_sim = m if kind is ScheduleKind.GPIPE else min(m, saturation_m(kind, pp, v))
    total = peak = 0.0
    for a in compute_order(kind, pp, rank, m_sim, v):
        if a.op is Op.FORWARD:
            total += held[a.chunk]
        elif a.op is Op.BACKWARD_INPUT:
            total += kept[a.chunk]
        else:
            total -= held[a.chunk] + (kept[a.chunk] if a.op is Op.BACKWARD_WEIGHT else 0.0)
        peak = max(peak, total)
    return peak


def _chunk_peak(result: SimResult, rank: int, chunk: int) -> int:
    """Peak micro-batches of `chunk` held on `rank`: + at its forward, - at its backward (or W), in timeline order."""
    held = peak = 0
    for span in result.timelines[rank]:
        if span.action.chunk == chunk:
            held += 1 if span.action.op is Op.FORWARD else -1 if span.action.op.frees_activations else 0
            peak = max(peak, held)
    return peak


def run_pipeline(kind: ScheduleKind, pp: int, m: int, v: int, times: StageTimes,
                 budget: float = SIM_BUDGET) -> PipelineRun:
    """Makespan, busy time and bubble of one step, simulated (extrapolated in m when m is large)."""
    if len(times.forward) != pp * v or len(times.backward) != pp * v:
        raise ValueError(f"StageTimes must give one cost per global stage (pp x v = {pp * v})")
    busy = tuple(m * sum(times.forward[s] + times.backward[s] for s in stages)
                 for stages in rank_stages(pp, v, kind.placement))
    step = extrapolation_step(kind, pp, v)
    first = m if kind is ScheduleKind.GPIPE else min(m, saturation_m(kind, pp, v))
    if m <= first + 2 * step or kind is ScheduleKind.GPIPE:
        _check_budget(pp, m, v, budget, "the step", m)
        return _run(m, busy, (m,), _makespan(kind, pp, m, v, times), extrapolated=False)
    return _extrapolate(kind, pp, m, v, times, busy, first, step, budget)


def _extrapolate(kind: ScheduleKind, pp: int, m: int, v: int, times: StageTimes, busy: tuple[float, ...],
                 first: int, step: int, budget: float) -> PipelineRun:
    ms = [first, first + step, first + 2 * step]
    for _ in range(_MAX_SLIDES):
        if ms[-1] >= m:
            break
        _check_budget(pp, ms[-1], v, budget, "the steady state", m)
        t1, t2, t3 = (_makespan(kind, pp, k, v, times) for k in ms)
        if abs((t3 - t2) - (t2 - t1)) <= 1e-9 * t3:
            return _run(m, busy, tuple(ms), t3 + (m - ms[-1]) / step * (t3 - t2), extrapolated=True)
        ms = [k + step for k in ms]
    _check_budget(pp, m, v, budget, "the step (no steady increment found)", m)
    return _run(m, busy, (m,), _makespan(kind, pp, m, v, times), extrapolated=False)


def _run(m: int, busy: tuple[float, ...], ms: tuple[int, ...], makespan: float, extrapolated: bool) -> PipelineRun:
    bubble = 0.0 if makespan <= 0 else max(0.0, 1.0 - sum(busy) / (len(busy) * makespan))  # float noise at pp = 1
    return PipelineRun(makespan=makespan, busy=busy, bubble_fraction=bubble, simulated_m=ms,
                       extrapolated=extrapolated)


@lru_cache(maxsize=8192)
def _makespan(kind: ScheduleKind, pp: int, m: int, v: int, times: StageTimes) -> float:
    shares = (1.0,) + (WEIGHT_SHARE,) * (pp * v - 1)  # the first stage's B defers its whole backward to W
    costs = Costs(stage_forward=times.forward, stage_backward=times.backward, comm=times.comm,
                  stage_weight_share=shares)  # read by the zero-bubble schedules only (B and W)
    return _tape(kind, pp, m, v).makespan(costs)  # simulate(_lists(...), costs, placement=...).makespan, bit for bit


@lru_cache(maxsize=128)
def _tape(kind: ScheduleKind, pp: int, m: int, v: int) -> LazyTape:
    # Keyed on the lists' shape only (an enum and three ints): the tape holds the lists' step order and message
    # pairing, which depend on nothing else, and is immutable, so every layout that times these lists shares it
    # (building and matching the lists was most of a step's planning time; only the float pass is per costs).
    # The lists themselves are not kept (build_schedule, not the cached _lists): the tape is all a makespan needs.
    with gc_paused():
        return LazyTape(build_schedule(kind, pp, m, v), kind.placement)


@contextmanager
def gc_paused():
    """The cyclic garbage collector off for the block (back on after, if it was on). Building a tape allocates
    about ten objects per action (Actions, batches, tuples, dict entries) and frees them all by reference counting
    (no cycles), yet every ~700 net allocations start a collection of the youngest generation, every tenth of those
    the middle one too, and every hundredth -- once the survivors awaiting it pass a quarter of the oldest
    generation, as a tape's build makes them -- a full one that walks every live object of the planner, collecting
    nothing (gc.get_threshold() = (700, 10, 10)): those full walks were a quarter of a cold all_rows(). Pausing it
    changes no result (nothing it would free is made here; it runs again after)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@lru_cache(maxsize=128)
def _lists(kind: ScheduleKind, pp: int, m: int, v: int) -> list[list[Action]]:
    return build_schedule(kind, pp, m, v)


def _check_budget(pp: int, m: int, v: int, budget: float, what: str, m_step: int) -> None:
    """Refuse to simulate `m` micro-batches beyond the budget; the fix names the budget that always suffices:
    pp (m_step v)^2 for the step's own m_step (every simulation of the step, slides included, is at most that)."""
    size = sim_size(pp, m, v)
    if size > budget:
        enough = math.ceil(sim_size(pp, m_step, v))
        raise SimulationTooLarge(
            f"simulating {what} needs pp {pp} x v {v} with m = {m} micro-batches, pp (m v)^2 = "
            f"{size:.6g} > the budget {budget:.6g}; rerun with --sim-budget {enough} (pp (m v)^2 at the step's "
            f"m = {m_step}), or use fewer chunks v or micro-batches")


def kept_gradient_bytes(shard, b: int, s: int, sp: bool, layers: int, head: bool) -> float:
    """Bytes a zero-bubble B keeps for its W on one chunk and micro-batch: the gradient w.r.t. the output of each
    linear (its GEMM's m x n) and of the two norms of every layer (b s h, / t under SP), and with `head` the
    logits' (b s V_p / t). Measured: the runtime keeps exactly these (tests/test_pipeline_memory.py's H - A)."""
    elem = FP32 if shard.profile is ActivationProfile.FP32_FLASH else ACT_BYTES
    h = shard.cfg.hidden_size
    per_layer = sum(g.m * g.n for g in shard.layer_linear_gemms(b, s)) + 2 * b * s * h / (shard.t if sp else 1)
    return elem * (layers * per_layer + (b * s * shard.vocab / shard.t if head else 0.0))


@lru_cache(maxsize=1024)
def run_shared(kind: ScheduleKind, pp: int, m: int, v: int, times: StageTimes, cpu: StageTimes, processes: int,
               cores: float, budget: float = SIM_BUDGET) -> float:
    """Makespan of one step when each pipeline rank's `processes` processes share `cores` compute units with every
    other's (more gloo ranks than a CPU's cores): hybrid/pipeline/shared_cores.py's simulation, each pass `times`
    long with a core of its own, of which `cpu` (per global stage, forward / backward) runs on a core. The whole
    m is simulated (no extrapolation: the runnable set, not only the durations, changes through the warm-up)."""
    _check_budget(pp, m, v, budget, "the step on shared cores", m)
    shares = (1.0,) + (WEIGHT_SHARE,) * (pp * v - 1)  # as _makespan: the first stage's B defers its backward to W
    costs = Costs(stage_forward=times.forward, stage_backward=times.backward, comm=times.comm,
                  stage_weight_share=shares)
    busy = Costs(stage_forward=cpu.forward, stage_backward=cpu.backward, stage_weight_share=shares)
    return simulate_shared(_lists(kind, pp, m, v), costs, busy, processes, cores, placement=kind.placement)
