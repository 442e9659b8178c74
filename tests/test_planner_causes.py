"""Issue 26, round 13: the GPT-3 175B candidate causes (hybrid/planner/causes.py) are knobs that price one cost
more and leave the model as it was once the block ends. Cheap: a 4-layer model, no published row planned (the
module's own report plans ~200 rows per candidate: docs/planner/rounds.md "Round 13" holds its output)."""

from __future__ import annotations

import pytest

from hybrid.planner import causes
from hybrid.planner import time as ptime
from hybrid.planner.hardware import hardware
from hybrid.planner.layout import Cluster, Layout, Workload
from hybrid.planner.published import PublishedRun
from hybrid.planner.reference import gpt_model


def _case(pp: int, v: int):
    work = Workload(gpt_model(4, 1024, 16, 50257, 1024), global_batch=8, seq_length=1024, fp32_grads=False)
    return work, Cluster(gpus=pp, hw=hardware("h100-80g")), Layout(pp=pp, v=v, micro_batch=1)


@pytest.mark.parametrize("pp, v", [(2, 1), (2, 2), (4, 1)])
def test_a_handoff_cost_is_paid_once_per_stage_edge_and_undone_after(pp, v):
    """Stage s of pp v pays c per edge it has ((s > 0) + (s < pp v - 1)) in its forward and its backward; the first
    and last stages one edge, the middle ones two; the model is the old one again after the block."""
    work, cluster, layout = _case(pp, v)
    before = ptime.stage_times(work, cluster, layout)[0]
    c = 1e-3
    with causes._handoff_cost(c):
        during = ptime.stage_times(work, cluster, layout)[0]
    after = ptime.stage_times(work, cluster, layout)[0]
    n = pp * v
    for s in range(n):
        edges = (s > 0) + (s < n - 1)
        assert during.forward[s] - before.forward[s] == pytest.approx(c * edges, abs=1e-12)
        assert during.backward[s] - before.backward[s] == pytest.approx(c * edges, abs=1e-12)
    assert after == before


def test_the_knobs_slow_a_step_and_restore_the_presets():
    """Every candidate at its far end prices the same pipelined layout slower than today; PublishedRun.hardware is
    the original method once each block ends."""
    work, cluster, layout = _case(2, 2)
    original = PublishedRun.hardware
    today = ptime.step_time(work, cluster, layout).total
    for c in causes.candidates():
        with c.apply(c.worst):
            hw = PublishedRun.hardware(PublishedRun("x", "", work, "h100-80g", 2, None, None, 1.0))
            slower = ptime.step_time(work, Cluster(gpus=2, hw=hw), layout).total
        assert slower > today, c.name
        assert PublishedRun.hardware is original
