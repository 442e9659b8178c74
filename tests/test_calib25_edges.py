"""A pipeline stage edge's own fixed cost a pass at every tp (round 25, issue 26): calibrate's edge probe times the
unsharded edge-only stages at one token, where the planner's kernels are ~0 and the pass read 0.12-0.16 ms on the
2-core VM (round 24); only what tp 2 adds beyond that was priced (the tp_* fields: differences, in which the fixed
cost cancels). Now the unsharded reading less the planner's kernels is Hardware.{embedding,head}_*_overhead_s, charged
on the stage holding the edge at every tp (time._edge_fixed), beside the tp_* fields at tp > 1."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hybrid.planner import Cluster, Layout
from hybrid.planner import calibrate as C
from hybrid.planner.time import stage_times
from test_calibrate_edgepass import CPU, WORK

# the unsharded edge's own cost a pass (s), of the order round 24 measured; distinct so a misplaced field shows
FIXED = {"embedding": (0.13e-3, 0.12e-3), "head": (0.11e-3, 0.16e-3)}
TP_EXTRA = {"embedding": (0.15e-3, 0.07e-3), "head": (0.47e-3, 0.23e-3)}


def rank(hw=CPU) -> dict:
    """An edge_pass_cpu record: each unsharded edge the planner's kernels + FIXED, tp 2 that + the planner's
    difference + TP_EXTRA."""
    tp1, tp2 = (C.planned_edge_seconds(hw, C.PASS_SHAPE, tp) for tp in (1, 2))
    rec = {}
    for edge in C.EDGES:
        rec[f"{edge}_tp1"] = [tp1[edge][i] + FIXED[edge][i] for i in (0, 1)]
        rec[f"{edge}_tp2"] = [tp2[edge][i] + FIXED[edge][i] + TP_EXTRA[edge][i] for i in (0, 1)]
    return {"edge_pass": rec}


def fields(values: dict, names: dict) -> dict:
    return {names[edge][i]: values[edge][i] for edge in C.EDGES for i in (0, 1)}


def test_the_fit_gives_the_unsharded_edges_fixed_cost_and_what_tp_adds_apart():
    """Both back, each in its own field; a hw already carrying them fits the same; the fields were absent before
    round 25 (the fixed cost then cancelled out of the tp difference and was priced nowhere)."""
    want = fields(FIXED, C.EDGE_FIXED_FIELDS) | fields(TP_EXTRA, C.EDGE_FIELDS)
    fit = C.fit_edge_pass([rank(), rank(), None], CPU)
    assert fit == pytest.approx(want, rel=1e-9)
    assert C.fit_edge_pass([rank()], dataclasses.replace(CPU, **want)) == pytest.approx(want, rel=1e-9)


def test_the_planner_charges_the_fixed_cost_on_the_edges_stage_at_every_tp():
    """tp 1 and tp 2 alike: stage 0's passes grow by the embedding's fixed (forward + backward), stage 1's by the
    head's, per micro-batch; the main job's plan grows with them."""
    hw = dataclasses.replace(CPU, **fields(FIXED, C.EDGE_FIXED_FIELDS))
    for lay in (Layout(tp=2, pp=2, dp=2, micro_batch=2), Layout(tp=1, pp=2, dp=4, micro_batch=2)):
        with_, without = (stage_times(WORK, Cluster(gpus=8, hw=h), lay)[0] for h in (hw, CPU))
        assert with_.rank_compute[0] - without.rank_compute[0] == pytest.approx(sum(FIXED["embedding"]), rel=1e-9)
        assert with_.rank_compute[1] - without.rank_compute[1] == pytest.approx(sum(FIXED["head"]), rel=1e-9)


def test_a_profile_without_the_fields_plans_as_before(tmp_path):
    """Profiles written before round 25 load the four fields as 0: the plan is unchanged."""
    names = [n for pair in C.EDGE_FIXED_FIELDS.values() for n in pair]
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": C.FORMAT, "hardware": {k: v for k, v in dataclasses.asdict(CPU).items()
                                                                  if k not in names}}))
    hw = C.load_hardware(str(path))
    assert all(getattr(hw, n) == 0.0 for n in names)
    lay = Layout(tp=2, pp=2, dp=2, micro_batch=2)
    assert stage_times(WORK, Cluster(gpus=8, hw=hw), lay) == stage_times(WORK, Cluster(gpus=8, hw=CPU), lay)
