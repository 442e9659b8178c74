"""Ranks sharing cores as a list schedule (hybrid/planner/cores.py, issue 26: the main job's 8 ranks on 2 cores).

The simulator against hand-worked processor sharing, its limits (C >= ranks: the dependency makespan, which the
pipeline simulation computes independently; C = 1: the total CPU), monotone in C; and the planner's use of it."""

from __future__ import annotations

import dataclasses
import random

import pytest

from hybrid.pipeline import ScheduleKind
from hybrid.planner import ActivationProfile, Cluster, Layout, Precision, Workload, evaluate
from hybrid.planner.calibrate import _with_busy_units, busy_units
from hybrid.planner.cores import (CoresDeadlock, Grid, Recv, Send, StepCosts, Sync, Work, share_cores,
                                  step_programs)
from hybrid.planner.hardware import GpuKind, hardware
from hybrid.planner.ops import KernelProfile
from hybrid.planner.schedule import StageTimes, run_pipeline
from hybrid.planner.time import core_step, shares_cores
from models import PRESETS

MAIN_JOB = Layout(tp=2, pp=2, dp=2, micro_batch=2)


def test_two_ranks_meeting_at_a_barrier_share_the_cores_as_worked_by_hand():
    """A computes 1 s, B 3 s, they meet, then each computes 1 s. C = 1.5: both run at 0.75 until A is done at
    4/3 (B has done 1); A sleeps in the barrier, so B runs alone at 1 for its last 2 (10/3); then both at 0.75
    for 4/3: 14/3. C = 1: 2, then 4, then 6 = the total CPU. C = 2: 3 + 1."""
    progs = [[Work(1.0), Sync("s", 2), Work(1.0)], [Work(3.0), Sync("s", 2), Work(1.0)]]
    assert share_cores(progs, 1.5).makespan == pytest.approx(14 / 3, rel=1e-12)
    assert share_cores(progs, 1.0).makespan == pytest.approx(6.0, rel=1e-12)
    run = share_cores(progs, 2.0)
    assert run.makespan == pytest.approx(4.0, rel=1e-12)
    assert run.idle == pytest.approx(2 * 4.0 - 6.0, rel=1e-12)  # A's 2 s in the barrier left a core idle


def test_a_receive_waits_for_its_message_and_a_cycle_is_named():
    """A message posted at 2 s with 0.5 s of travel lets its receiver go on at 2.5 s; two receives waiting on
    each other deadlock, and the error names the ranks."""
    progs = [[Work(2.0), Send("x", delay=0.5)], [Recv("x"), Work(1.0)]]
    assert share_cores(progs, 2.0).makespan == pytest.approx(3.5, rel=1e-12)
    with pytest.raises(CoresDeadlock, match="rank 0 at Recv"):
        share_cores([[Recv("a"), Send("b")], [Recv("b"), Send("a")]], 2.0)


def test_one_rank_takes_the_sum_of_its_work():
    prog = [Work(0.25), Work(0.5), Sync("alone", 1), Work(1.25)]
    for units in (0.5, 1.0, 4.0):
        assert share_cores([prog], units).makespan == pytest.approx(2.0 / min(1.0, units), rel=1e-12)


def _random_costs(rng: random.Random, stages: int, tp_calls: int, pp: int) -> StepCosts:
    def calls():
        return tuple(rng.uniform(0.0, 0.2) for _ in range(tp_calls))
    return StepCosts(forward=tuple(rng.uniform(0.5, 1.5) for _ in range(stages)),
                     backward=tuple(rng.uniform(1.0, 3.0) for _ in range(stages)),
                     forward_calls=tuple(calls() for _ in range(stages)),
                     backward_calls=tuple(calls() for _ in range(stages)),
                     message_cpu=rng.uniform(0.0, 0.1), message_delay=0.0,
                     tail=tuple((("dp", 0.3), ("pp", 0.01), ("work", rng.uniform(0.1, 0.4))) for _ in range(pp)))


@pytest.mark.parametrize("kind,pp,m,v", [(ScheduleKind.ONE_F_ONE_B, 4, 8, 1), (ScheduleKind.INTERLEAVED, 2, 4, 2),
                                         (ScheduleKind.ZB_H1, 3, 6, 1), (ScheduleKind.GPIPE, 3, 3, 1)])
def test_a_core_per_rank_gives_the_pipeline_simulations_makespan(kind, pp, m, v):
    """C >= ranks: every rank runs at its solo rate and the step is the dependency makespan -- the pipeline
    simulation's (hybrid.pipeline, an independent event simulation of the same compute orders), one rank a
    stage, no collectives, messages free."""
    rng = random.Random(pp * 100 + m)
    costs = dataclasses.replace(_random_costs(rng, pp * v, 0, pp), message_cpu=0.0, tail=((),) * pp)
    programs = step_programs(kind, Grid(tp=1, pp=pp, dp=1), m, v, costs)
    times = StageTimes(costs.forward, costs.backward, 0.0)
    expected = run_pipeline(kind, pp, m, v, times).makespan
    for units in (pp, pp + 0.5, 64):
        assert share_cores(programs, units).makespan == pytest.approx(expected, rel=1e-9)


def test_one_core_runs_the_total_cpu_and_more_cores_never_slow_the_step():
    """C = 1: some rank is always runnable (no wall-only delays), so the step is the sum of all work; the
    makespan does not grow with C; C >= ranks: nothing shared. Random costs on the main job's grid (8 ranks)."""
    rng = random.Random(26)
    for _ in range(3):
        costs = _random_costs(rng, 2, 3, 2)
        programs = step_programs(ScheduleKind.ONE_F_ONE_B, Grid(tp=2, pp=2, dp=2), 4, 1, costs)
        one = share_cores(programs, 1.0)
        assert one.makespan == pytest.approx(sum(one.cpu), rel=1e-9) and one.idle == pytest.approx(0.0, abs=1e-9)
        spans = [share_cores(programs, c).makespan for c in (0.5, 1.0, 1.5, 1.75, 2.0, 3.0, 4.0, 8.0, 16.0)]
        assert all(b <= a * (1 + 1e-12) for a, b in zip(spans, spans[1:]))
        assert spans[-1] == pytest.approx(spans[-2], rel=1e-12)  # 8 and 16 cores: a core per rank either way
        assert spans[0] == pytest.approx(2 * spans[1], rel=1e-9)  # half a core: everything twice as long


def cpu(**fields):
    """A 2-core CPU of 8 gloo ranks with measured gloo costs (the cpu preset's other fields)."""
    given = dict(gpus_per_node=8, compute_units=2, peak_tflops=0.1, elementwise_tbps=0.005,
                 layer_forward_overhead_s=2e-3, layer_backward_overhead_s=1e-3, collective_cpu_s=3e-4, p2p_cpu_s=8e-4)
    return dataclasses.replace(hardware(GpuKind.CPU), **(given | fields))


def main_job() -> Workload:
    return Workload(PRESETS["tiny-gpt2"], global_batch=16, seq_length=128, precision=Precision.FP32,
                    activations=ActivationProfile.FP32_FLASH, kernels=KernelProfile.EAGER)


def test_the_main_job_keeps_two_cores_busy_and_a_deep_pipeline_does_not():
    """The main job: 4 ranks a pipeline rank, so >= 2 are always runnable and the cores never idle -- the step
    is the node's CPU / C; with busy_units 1.75 (two busy vCPUs deliver less than two solo ones) it is 2 / 1.75
    of the 2-core step. pp 4 with one rank a stage (4 ranks): fill and drain leave fewer than 2 runnable, the
    cores idle and the step exceeds CPU / C."""
    work = main_job()
    step = evaluate(work, Cluster(gpus=8, hw=cpu()), MAIN_JOB).time
    assert step.cores is not None and step.cores.idle == pytest.approx(0.0, abs=1e-9)
    assert step.total == pytest.approx(sum(step.cores.cpu) / 2, rel=1e-9)
    assert sum(v for _, v in step.terms) == pytest.approx(step.total, rel=1e-12)  # --explain's terms add up
    slower = evaluate(work, Cluster(gpus=8, hw=cpu(busy_units=1.75)), MAIN_JOB).time
    assert slower.total == pytest.approx(step.total * 2 / 1.75, rel=1e-9)
    deep = core_step(work, Cluster(gpus=4, hw=cpu(gpus_per_node=4)), Layout(tp=1, pp=4, dp=1, micro_batch=1))
    assert deep.idle > 0 and deep.makespan > sum(deep.cpu) / 2
    assert deep.makespan == pytest.approx((sum(deep.cpu) + deep.idle) / 2, rel=1e-9)  # C T = work + idle


def test_the_list_schedule_is_used_only_where_ranks_share_cores():
    """A core per rank (the 2-rank ranking check), a GPU, a profile without gloo's CPU costs, ZeRO 3: the step
    keeps its former model (cores None)."""
    work = main_job()
    assert shares_cores(work, Cluster(gpus=8, hw=cpu()), MAIN_JOB)
    two = dataclasses.replace(cpu(), gpus_per_node=2)
    assert not shares_cores(work, Cluster(gpus=2, hw=two), Layout(tp=2, micro_batch=2))
    assert evaluate(work, Cluster(gpus=2, hw=two), Layout(tp=2, micro_batch=2)).time.cores is None
    assert not shares_cores(work, Cluster(gpus=8, hw=cpu(collective_cpu_s=0.0, p2p_cpu_s=0.0)), MAIN_JOB)
    assert not shares_cores(work, Cluster(gpus=8, hw=hardware(GpuKind.H100_80G)), MAIN_JOB)
    assert not shares_cores(work, Cluster(gpus=8, hw=cpu()), Layout(tp=2, pp=1, dp=4, micro_batch=1, zero=3))


def test_busy_units_is_the_all_at_once_rate_over_the_solo_rate_and_old_profiles_get_it():
    """8 ranks at 0.0222 TFLOP/s each at once against 0.1028 alone (round 8's quiet calibration 0): 1.725 of the 2
    cores; capped at the cores; a profile written before the field derives it; one without the rates does not."""
    assert busy_units({"fp32": 0.02215562}, {"fp32": 0.10277806}, 8, 2) == pytest.approx(1.7246, abs=1e-4)
    assert busy_units({"fp32": 0.1}, {"fp32": 0.1}, 4, 2) == 2.0
    profile = {"matmul_tflops_all_ranks_at_once": {"fp32": 0.02}, "matmul_tflops_one_rank_alone": {"fp32": 0.1},
               "measured": {"ranks": 8}}
    assert _with_busy_units({"compute_units": 2}, profile)["busy_units"] == pytest.approx(1.6)
    assert "busy_units" not in _with_busy_units({"compute_units": 2}, {"measured": {"ranks": 8}})
    assert _with_busy_units({"compute_units": 2, "busy_units": 1.9}, profile)["busy_units"] == 1.9


def test_the_searchs_lower_bound_stays_below_the_shared_step():
    """The search prunes by time.lower_bound_seconds: with ranks sharing cores it must not exceed the list
    schedule's step (which prices collectives as CPU, not at the 8-rank latencies of the chain bound)."""
    from hybrid.planner.time import lower_bound_seconds
    work = main_job()
    slow_calls = cpu(intra_latency_s=3e-3)  # an 8-rank calibration's contended latency
    for lay in (MAIN_JOB, Layout(tp=2, pp=1, dp=4, micro_batch=2), Layout(tp=1, pp=2, dp=4, micro_batch=1)):
        step = evaluate(work, Cluster(gpus=8, hw=slow_calls), lay).time
        assert step.cores is not None
        assert lower_bound_seconds(work, Cluster(gpus=8, hw=slow_calls), lay) <= step.total * (1 + 1e-12)
