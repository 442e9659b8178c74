"""LazyTape (hybrid/pipeline/simulate.py): the planner's makespan, compiled once per schedule shape and re-timed per
layout, must equal simulate(...).makespan bit for bit -- every number the planner prints goes through it
(round 18's faster planner: families report, `hybrid plan`)."""

import random

import pytest

from hybrid.pipeline import Costs, ScheduleKind, build_schedule, simulate
from hybrid.pipeline.simulate import LazyTape
from hybrid.planner import schedule as planner_schedule
from hybrid.planner.schedule import StageTimes, run_pipeline

SHAPES = [(kind, pp, m, v) for kind, vs in ((ScheduleKind.GPIPE, (1,)), (ScheduleKind.ONE_F_ONE_B, (1,)),
                                            (ScheduleKind.ZB_H1, (1,)), (ScheduleKind.ZBV, (2,)),
                                            (ScheduleKind.INTERLEAVED, (2, 3)))
          for pp in (1, 2, 3, 4) for v in vs for m in (1, 3, 4, 8)
          if kind is not ScheduleKind.INTERLEAVED or m % pp == 0]


def _costs(rng: random.Random, stages: int, comm: float) -> Costs:
    """Uneven stage times (so a wrong stage, op or order shows), the planner's zero-bubble W shares."""
    return Costs(stage_forward=tuple(rng.uniform(0.1, 1.0) for _ in range(stages)),
                 stage_backward=tuple(rng.uniform(0.1, 2.0) for _ in range(stages)), comm=comm,
                 stage_weight_share=(1.0,) + (0.5,) * (stages - 1))


@pytest.mark.parametrize("kind,pp,m,v", SHAPES, ids=lambda x: getattr(x, "value", x))
def test_tape_makespan_is_simulate_makespan_bit_for_bit(kind, pp, m, v):
    lists = build_schedule(kind, pp, m, v)
    tape = LazyTape(lists, kind.placement)
    rng = random.Random(f"{kind.value}{pp}{m}{v}")
    for comm in (0.0, 0.05, 0.7):  # free, small and dominant messages (waits on messages decide the order)
        costs = _costs(rng, pp * v, comm)
        assert tape.makespan(costs) == simulate(lists, costs, placement=kind.placement).makespan


def test_planner_times_each_schedule_shape_once():
    """run_pipeline compiles a shape's lists once (schedule._tape) and re-times them per layout; both layouts'
    makespans equal the full simulation's."""
    kind, pp, m, v = ScheduleKind.INTERLEAVED, 2, 4, 2
    planner_schedule._tape.cache_clear()
    for scale in (1.0, 1.3):
        times = StageTimes(forward=tuple(scale * t for t in (1.0, 1.1, 0.9, 1.2)), backward=(2.0, 2.1, 1.9, 2.5),
                           comm=0.01 * scale)
        run = run_pipeline(kind, pp, m, v, times)
        costs = Costs(stage_forward=times.forward, stage_backward=times.backward, comm=times.comm,
                      stage_weight_share=(1.0,) + (0.5,) * 3)
        assert run.makespan == simulate(build_schedule(kind, pp, m, v), costs).makespan
    assert planner_schedule._tape.cache_info().misses == 1 and planner_schedule._tape.cache_info().hits == 1
