"""The pipeline simulated on shared cores (issue 26, round 13: hybrid/pipeline/shared_cores.py): more processes than
cores share them (processor sharing), so a step is neither the plain makespan nor the cores' CPU bound alone."""

from __future__ import annotations

import dataclasses
import os
import random

import pytest

from hybrid.pipeline import Costs, ScheduleKind, build_schedule, simulate
from hybrid.pipeline.shared_cores import shared_rate, simulate_shared
from hybrid.planner import Cluster, Layout, evaluate
from hybrid.planner.calibrate import load_hardware
from hybrid.planner.hardware import GpuKind, hardware
from hybrid.planner.model import Precision
from hybrid.planner.time import _stages, shared_compute_bound, step_time

from tests.test_calibrate_cpu import MAIN_JOB, main_job

KEPT = os.path.join(os.path.dirname(__file__), "..", "docs", "results", "data", "mainjob_r12_run1.hw8.json")


def test_two_cores_four_processes_one_f_one_b_by_hand():
    """pp 2, m 2, 1F1B, each pipeline rank 2 processes on 2 cores; every pass d = 1.5 s with a core of its own, of
    which w = 1 runs (l = 0.5 waits). Alone a rank's 2 processes use 2 x 1 / 1.5 < 2 cores: rho = 1, a pass 1.5.
    Both ranks at once: 4 x 1 / (0.5 + 1 / rho) = 2 -> rho = 2/3, a pass 2. Timeline: F0 on rank 0 [0, 1.5];
    rank 0 F1 and rank 1 F0 together [1.5, 3.5]; rank 1 B0 alone [3.5, 5]; rank 0 B0 and rank 1 F1 [5, 7];
    rank 1 B1 [7, 8.5]; rank 0 B1 [8.5, 10]. 10 s: above the plain makespan (9) and the CPU bound (8 passes x
    2 processes x 1 / 2 cores = 8) -- the step exceeds both, as the main job's does."""
    lists = build_schedule(ScheduleKind.ONE_F_ONE_B, 2, 2, 1)
    wall, cpu = Costs(forward=1.5, backward=1.5), Costs(forward=1.0, backward=1.0)
    assert simulate_shared(lists, wall, cpu, processes=2, cores=2) == pytest.approx(10.0, rel=1e-12)
    assert simulate(lists, wall).makespan == pytest.approx(9.0)
    # no waits (w = d): the cores' CPU bound, 8 x 2 x 1 / 2; one process a rank (2 on 2 cores): the plain makespan
    assert simulate_shared(lists, cpu, cpu, processes=2, cores=2) == pytest.approx(8.0, rel=1e-12)
    assert simulate_shared(lists, wall, cpu, processes=1, cores=2) == pytest.approx(9.0, rel=1e-12)


def test_the_shared_rate_limits():
    """rho = 1 while the running computes use no more than the cores; with no waits it is plain processor sharing,
    cores / (processes x running); with waits the cores' use at rho is exactly the cores."""
    assert shared_rate([(1.0, 1.0)], processes=2, cores=2) == 1.0
    assert shared_rate([(1.0, 0.0)] * 3, processes=2, cores=2) == pytest.approx(1 / 3, rel=1e-12)
    rho = shared_rate([(1.0, 0.5), (2.0, 0.2)], processes=4, cores=2)
    assert 0 < rho < 1
    assert sum(4 * w / (l + w / rho) for w, l in [(1.0, 0.5), (2.0, 0.2)]) == pytest.approx(2.0, rel=1e-9)


@pytest.mark.parametrize("kind,pp,m,v", [(ScheduleKind.ONE_F_ONE_B, 3, 7, 1), (ScheduleKind.INTERLEAVED, 2, 4, 2),
                                         (ScheduleKind.ZB_H1, 3, 5, 1), (ScheduleKind.ZBV, 2, 4, 2),
                                         (ScheduleKind.GPIPE, 2, 3, 1)])
def test_a_core_per_process_is_the_plain_simulation(kind, pp, m, v):
    """No more processes than cores: rho = 1 throughout, so every schedule's makespan is `simulate`'s exactly
    (uneven stages, messages, B / W shares), whatever the CPU share of a pass; with fewer cores it is longer."""
    rnd = random.Random(13)
    n = pp * v
    wall = Costs(stage_forward=tuple(rnd.uniform(0.5, 2) for _ in range(n)),
                 stage_backward=tuple(rnd.uniform(1, 3) for _ in range(n)), comm=0.3,
                 stage_weight_share=(1.0,) + (0.5,) * (n - 1))
    cpu = dataclasses.replace(wall, stage_forward=tuple(0.6 * t for t in wall.stage_forward))
    lists = build_schedule(kind, pp, m, v)
    plain = simulate(lists, wall, placement=kind.placement).makespan
    assert simulate_shared(lists, wall, cpu, 2, 2 * pp, kind.placement) == pytest.approx(plain, rel=1e-12)
    assert simulate_shared(lists, wall, cpu, 2, 1, kind.placement) > plain


def test_the_planner_simulates_the_main_job_on_its_two_cores():
    """The main job (8 ranks, 2 cores) on a kept quiet profile: the pipeline term is the shared-core simulation,
    above both old bounds (the makespan with a core per rank, the node's CPU / cores); per pass the CPU is at most
    its wall time. With 8 cores (a core per rank) the step is the plain makespan's again, to the last digit."""
    work = main_job()
    hw = load_hardware(KEPT, Precision.FP32)
    cluster = Cluster(gpus=8, hw=hw)
    t = step_time(work, cluster, MAIN_JOB)
    st = _stages(work, cluster, MAIN_JOB)
    assert all(0 < c <= d for c, d in zip(st.cpu.forward + st.cpu.backward, st.times.forward + st.times.backward))
    bound = shared_compute_bound(cluster, MAIN_JOB, t.run, 4, st.times)
    assert t.pipeline > t.run.makespan * 1.03 and t.pipeline > bound
    wide = Cluster(gpus=8, hw=dataclasses.replace(hw, compute_units=8))
    t8 = step_time(work, wide, MAIN_JOB)
    assert _stages(work, wide, MAIN_JOB).cpu is None
    assert t8.pipeline == t8.run.makespan and t8.total == t8.run.makespan + t8.dp_comm + t8.optimizer + t8.other


def test_gpus_and_old_profiles_are_not_simulated_on_shared_cores():
    """GPUs (compute_units None) never take the shared path; nor does a CPU with no more ranks than cores."""
    work = main_job()
    assert _stages(work, Cluster(gpus=8, hw=hardware(GpuKind.H100_80G)), MAIN_JOB).cpu is None
    two = dataclasses.replace(hardware(GpuKind.CPU), gpus_per_node=2, compute_units=2)
    assert _stages(work, Cluster(gpus=2, hw=two), Layout(tp=2, pp=1, dp=1, micro_batch=2)).cpu is None
    assert evaluate(work, Cluster(gpus=8, hw=hardware(GpuKind.H100_80G)), MAIN_JOB).time.total > 0
