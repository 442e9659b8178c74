"""The schedule lists and the simulated times of a few shapes of every schedule kind, pinned to the values the code
gave before round 23 made list building and tape compiling faster (hybrid/pipeline/schedules.py,
hybrid/pipeline/simulate.py, hybrid/planner/schedule.py's gc pause). A speed-up must change no planned number: the
lists are pinned by a digest of their repr (every action, peer and position), the makespans by their exact float
(float.hex), under uneven per-stage costs, a message time and the zero-bubble B / W split, for the lazy simulation,
the blocking one (Transfer.RENDEZVOUS: it reads every message pairing) and the compiled tape. The full check --
every published row's plan and a dozen `hybrid plan --json` outputs byte for byte -- is scripts/planner_dump.py."""

from __future__ import annotations

import hashlib

import pytest

from hybrid.pipeline import Costs, ScheduleKind as K, build_schedule, simulate
from hybrid.pipeline.simulate import LazyTape, Transfer
from hybrid.planner import schedule as planner_schedule

# (kind, pp, m, v, lists digest, lazy makespan, rendezvous makespan, tape makespan, peak in flight, peak W pending)
PINNED = [
    (K.GPIPE, 3, 4, 1, '5dea0d8685659678', '0x1.48ccccccccccep+4', '0x1.48ccccccccccep+4', '0x1.48ccccccccccep+4',
     (4, 4, 4), (0, 0, 0)),
    (K.ONE_F_ONE_B, 4, 6, 1, '4c04aacf2d87e0f1', '0x1.e6ac083126e99p+4', '0x1.e6ac083126e99p+4',
     '0x1.e6ac083126e99p+4', (4, 3, 2, 1), (0, 0, 0, 0)),
    (K.INTERLEAVED, 4, 8, 2, '78255fed9affed26', '0x1.0c3126e978d53p+6', '0x1.1cd70a3d70a40p+6',
     '0x1.0c3126e978d53p+6', (11, 9, 7, 5), (0, 0, 0, 0)),
    (K.INTERLEAVED, 3, 9, 3, '34b8df17a16df91c', '0x1.965c28f5c28f6p+6', '0x1.b771a9fbe76d1p+6',
     '0x1.965c28f5c28f6p+6', (11, 9, 7), (0, 0, 0)),
    (K.ZB_H1, 4, 6, 1, '15b230aaf291c3bf', '0x1.89189374bc6a9p+4', '0x1.96374bc6a7efbp+4', '0x1.89189374bc6a9p+4',
     (4, 4, 4, 4), (1, 2, 3, 4)),
    (K.ZBV, 4, 7, 2, 'e7c1d7b8d952ac7f', '0x1.a3ea7ef9db235p+5', '0x1.d352f1a9fbe7cp+5', '0x1.a3ea7ef9db235p+5',
     (8, 8, 8, 8), (1, 3, 5, 7)),
    (K.ZBV, 3, 2, 2, 'f0dd7d8e7e401c3e', '0x1.48851eb851eb9p+4', '0x1.53083126e978dp+4', '0x1.48851eb851eb9p+4',
     (3, 4, 4), (1, 1, 1)),
]


def _costs(pp: int, v: int) -> Costs:
    """Uneven stages (no two equal), a message time, and the planner's B / W split (stage 0's B defers it all)."""
    n = pp * v
    return Costs(stage_forward=tuple(1.0 + 0.137 * s for s in range(n)),
                 stage_backward=tuple(2.1 - 0.071 * s for s in range(n)), comm=0.093,
                 stage_weight_share=(1.0,) + (0.5,) * (n - 1))


@pytest.mark.parametrize("kind, pp, m, v, digest, lazy, rendezvous, tape, in_flight, pending", PINNED,
                         ids=[f"{p[0].value}-pp{p[1]}-m{p[2]}-v{p[3]}" for p in PINNED])
def test_lists_and_times_equal_the_pinned_values(kind, pp, m, v, digest, lazy, rendezvous, tape, in_flight, pending):
    lists = build_schedule(kind, pp, m, v)
    assert hashlib.sha256(repr(lists).encode()).hexdigest()[:16] == digest
    costs = _costs(pp, v)
    result = simulate(lists, costs, placement=kind.placement)
    assert result.makespan.hex() == lazy
    assert simulate(lists, costs, Transfer.RENDEZVOUS, placement=kind.placement).makespan.hex() == rendezvous
    assert LazyTape(lists, kind.placement).makespan(costs).hex() == tape
    assert (result.peak_in_flight, result.peak_weight_pending) == (in_flight, pending)


def test_gc_paused_restores_the_collector_and_survives_an_error():
    import gc
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with planner_schedule.gc_paused():
            assert not gc.isenabled()
            raise RuntimeError("inside")
    assert gc.isenabled()
    gc.disable()
    try:
        with planner_schedule.gc_paused():
            pass
        assert not gc.isenabled()  # left off when it was off
    finally:
        gc.enable()
