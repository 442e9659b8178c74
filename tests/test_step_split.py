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
