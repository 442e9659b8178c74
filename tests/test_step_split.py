"""Where the step time goes: the measured split (op-trail phases per rank and step, hybrid/fault/straggler.py) and
the planner's predicted split in the same categories (hybrid/metrics/split.py). Pure functions, no processes."""

from __future__ import annotations

import argparse

import pytest
import torch

from hybrid.fault.straggler import COLUMNS, time_split
from hybrid.metrics.split import predicted_split, run_layout
from hybrid.mesh import ParallelDims
from hybrid.planner import Cluster, evaluate, hardware
from hybrid.zero.config import ZeroConfig
from models import Recompute, load_config


def test_measured_split_is_each_phase_over_the_step_averaged_over_ranks():
    # 2 ranks x 2 steps; columns: total, then COLUMNS (forward, backward, p2p, optimizer, comm, other)
    rank0 = [[1.0, 0.2, 0.4, 0.1, 0.1, 0.2, 0.0]] * 2  # compute 60 %, pipeline 10, optimizer 10, comm 20
    rank1 = [[2.0, 0.2, 0.6, 0.6, 0.2, 0.2, 0.2]] * 2  # compute 40 %, pipeline 30, optimizer 10, comm 10, other 10
    assert COLUMNS == ("forward", "backward", "p2p", "optimizer", "comm", "other")
    split = time_split(torch.tensor([rank0, rank1], dtype=torch.float64))
    assert split == pytest.approx({"compute": 0.5, "collectives": 0.15, "pipeline": 0.2, "optimizer": 0.1,
                                   "other": 0.05})


@pytest.mark.parametrize("tp, pp, dp, v", [(2, 2, 2, 1), (1, 2, 1, 2), (1, 1, 4, 1), (4, 1, 1, 1)])
def test_predicted_split_accounts_for_the_whole_predicted_step(tp, pp, dp, v):
    """The four parts are a partition of StepTime.total (pipeline + DP + optimizer + other), the pipeline's share
    being the simulated makespan's idle part (zero without a pipeline; ranks slowed by sharing cores count as
    compute)."""
    cfg = load_config("tiny-gpt2")
    batch = argparse.Namespace(global_batch=16, seq_length=64, micro_batch=2)
    work, layout = run_layout(ZeroConfig(), Recompute.NONE, False, cfg, ParallelDims(tp=tp, pp=pp, dp=dp), batch, v)
    t = evaluate(work, Cluster(gpus=tp * pp * dp, hw=hardware("cpu")), layout).time
    split = predicted_split(t)
    assert sum(split.values()) == pytest.approx(1.0)
    busy = sum(t.run.busy) / len(t.run.busy)
    assert split["pipeline"] * t.total == pytest.approx(t.run.makespan - busy, abs=1e-12 * t.total)
    assert (split["compute"] + split["collectives"] + split["pipeline"]) * t.total == pytest.approx(
        t.pipeline + t.dp_comm + t.other)
    assert split["optimizer"] * t.total == pytest.approx(t.optimizer)
    if pp == 1:
        assert split["pipeline"] == pytest.approx(0, abs=1e-12)


@pytest.mark.parametrize("kind, v", [("zbh1", 1), ("zbv", 2), ("1f1b", 1)])
def test_the_runs_planner_line_prices_the_runs_own_schedule(kind, v, monkeypatch):
    """train.py's start-up planner line evaluates the run's schedule: a zero-bubble run is priced as ZB-H1 / ZBV
    (its smaller bubble), not as 1F1B / interleaved."""
    from hybrid.metrics.split import predicted_split_line
    from hybrid.pipeline.schedules import ScheduleKind
    from hybrid.planner import Layout
    import hybrid.planner.calibrate as calibrate

    cfg = load_config("tiny-gpt2")
    batch = argparse.Namespace(global_batch=16, seq_length=64, micro_batch=2)
    dims = ParallelDims(pp=2)
    monkeypatch.setattr(calibrate, "load_hardware", lambda path, precision=None: hardware("cpu"))  # a --hardware file
    run = argparse.Namespace(training=argparse.Namespace(hardware="cpu.json"), zero=ZeroConfig(),
                             model=argparse.Namespace(recompute=Recompute.NONE),
                             parallel=argparse.Namespace(sequence_parallel=False))
    plan = argparse.Namespace(v=v, kind=ScheduleKind(kind), stages=[[0]] * v)
    line = predicted_split_line(run, cfg, dims, batch, plan)
    work, _ = run_layout(ZeroConfig(), Recompute.NONE, False, cfg, dims, batch, v)
    want = Layout(tp=1, pp=2, dp=1, v=v, micro_batch=2, zero_bubble=kind != "1f1b")
    bubble = evaluate(work, Cluster(gpus=2, hw=hardware("cpu")), want).time.bubble_fraction
    assert f"(bubble {bubble:.1%})" in line, line
