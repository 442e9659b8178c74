"""The stage edges at tp > 1 on a CPU (issue 26, round 12): the first stage's vocab-parallel embedding and the last
stage's final norm, vocab-parallel LM head and cross-entropy cost a pass beyond their sharded kernels, as the layer
does (test_calibrate_tppass.py). calibrate's pair probe times the runtime's edge-only GPT-2 stages at one token, tp 2
and unsharded; the difference, less the planner's own, is Hardware.tp_{embedding,head}_{forward,backward}_overhead_s,
read only at tp > 1 and only on the stage holding the edge."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hybrid.comm import Group
from hybrid.planner import ActivationProfile, Cluster, Layout, Precision, Workload
from hybrid.planner import calibrate as C
from hybrid.planner.hardware import GpuKind, hardware
from hybrid.planner.ops import KernelProfile
from hybrid.planner.time import stage_times
from models import PRESETS

# the extras per pass (s), of the order round 12 measured (docs/results/bench_planner_mainjob.md); distinct values
# so a field read in the wrong place shows
EMB_F, EMB_B, HEAD_F, HEAD_B = 0.11e-3, 0.07e-3, 0.53e-3, 0.29e-3
CPU = dataclasses.replace(hardware(GpuKind.CPU), gpus_per_node=8, compute_units=2, layer_forward_overhead_s=0.13e-3,
                          layer_backward_overhead_s=0.37e-3)
EDGES = dataclasses.replace(CPU, tp_embedding_forward_overhead_s=EMB_F, tp_embedding_backward_overhead_s=EMB_B,
                            tp_head_forward_overhead_s=HEAD_F, tp_head_backward_overhead_s=HEAD_B)
WORK = Workload(PRESETS["tiny-gpt2"], global_batch=16, seq_length=128, precision=Precision.FP32,
                activations=ActivationProfile.FP32_FLASH, kernels=KernelProfile.EAGER)


def test_each_edge_gets_its_own_extra_only_at_tp_above_one():
    """The planner's edges: unchanged at tp 1; at tp 2 and 4 the embedding longer by (EMB_F, EMB_B), the head and
    loss by (HEAD_F, HEAD_B), exactly."""
    shape = (2, 128, 64, 4)
    assert C.planned_edge_seconds(EDGES, shape, 1) == C.planned_edge_seconds(CPU, shape, 1)
    for tp in (2, 4):
        with_, without = C.planned_edge_seconds(EDGES, shape, tp), C.planned_edge_seconds(CPU, shape, tp)
        for edge, (f, b) in (("embedding", (EMB_F, EMB_B)), ("head", (HEAD_F, HEAD_B))):
            assert with_[edge][0] - without[edge][0] == pytest.approx(f, rel=1e-9)
            assert with_[edge][1] - without[edge][1] == pytest.approx(b, rel=1e-9)


def test_the_main_jobs_stages_grow_by_their_own_edge():
    """tiny-gpt2 tp 2 x pp 2 x dp 2: stage 0's passes grow by the embedding's extras, stage 1's by the head's (per
    micro-batch); tp 1 x pp 2 x dp 4 not at all."""
    def times(hw, layout):
        return stage_times(WORK, Cluster(gpus=8, hw=hw), layout)[0]
    tp2, tp1 = Layout(tp=2, pp=2, dp=2, micro_batch=2), Layout(tp=1, pp=2, dp=4, micro_batch=2)
    with_, without = times(EDGES, tp2), times(CPU, tp2)
    assert with_.rank_compute[0] - without.rank_compute[0] == pytest.approx(EMB_F + EMB_B, rel=1e-9)
    assert with_.rank_compute[1] - without.rank_compute[1] == pytest.approx(HEAD_F + HEAD_B, rel=1e-9)
    assert times(EDGES, tp1) == times(CPU, tp1)


def test_an_old_profile_without_the_fields_plans_as_before(tmp_path):
    """Profiles written before round 12: the four fields load as 0 and the main job's plan is unchanged."""
    path = tmp_path / "old.json"
    names = [n for pair in C.EDGE_FIELDS.values() for n in pair]
    fields = {k: v for k, v in dataclasses.asdict(CPU).items() if k not in names}
    path.write_text(json.dumps({"format": C.FORMAT, "hardware": fields}))
    hw = C.load_hardware(str(path))
    assert all(getattr(hw, n) == 0.0 for n in names)
    lay = Layout(tp=2, pp=2, dp=2, micro_batch=2)
    assert stage_times(WORK, Cluster(gpus=8, hw=hw), lay) == stage_times(WORK, Cluster(gpus=8, hw=CPU), lay)


def synthetic_rank(extra: dict[str, tuple[float, float]], hw=CPU) -> dict:
    """A rank's edge_pass_cpu record whose edges take exactly what the planner says, plus `extra` at tp 2."""
    tp1, tp2 = (C.planned_edge_seconds(hw, C.PASS_SHAPE, tp) for tp in (1, 2))
    rec = {}
    for edge in C.EDGES:
        rec[f"{edge}_tp1"] = list(tp1[edge])
        rec[f"{edge}_tp2"] = [tp2[edge][i] + extra[edge][i] for i in (0, 1)]
    return {"edge_pass": rec}


def test_the_fit_gives_a_synthetic_pairs_extras_back_and_clamps_a_saving_at_zero():
    """Median over ranks of (tp 2 - unsharded) less the planner's difference: each extra back in its own field; an
    outlying rank does not move the median; tp 2 cheaper than planned gives 0; the odd rank (None) is skipped; an hw
    already carrying the extras fits the same."""
    extra = {"embedding": (EMB_F, EMB_B), "head": (HEAD_F, HEAD_B)}
    far = {k: (5 * f, 5 * b) for k, (f, b) in extra.items()}
    ranks = [synthetic_rank(extra), synthetic_rank(extra), synthetic_rank(far), None]
    fit = C.fit_edge_pass(ranks, CPU)
    fixed = [f for pair in C.EDGE_FIXED_FIELDS.values() for f in pair]  # round 25: the unsharded pass's own, 0 here
    assert fit == pytest.approx({"tp_embedding_forward_overhead_s": EMB_F, "tp_embedding_backward_overhead_s": EMB_B,
                                 "tp_head_forward_overhead_s": HEAD_F, "tp_head_backward_overhead_s": HEAD_B}
                                | dict.fromkeys(fixed, 0.0), rel=1e-9)
    saving = C.fit_edge_pass([synthetic_rank({k: (-f, -b) for k, (f, b) in extra.items()})], CPU)
    assert set(saving.values()) == {0.0} and len(saving) == 8
    assert C.fit_edge_pass(ranks, EDGES) == fit
    assert C.fit_edge_pass([None, {}], CPU) == {}


def test_the_probe_runs_the_runtimes_edge_stages_in_process():
    """edge_pass_cpu on a one-rank group (no process group: both 'tp 2' and unsharded run unsharded here; the pair
    runs it in calibrate): every edge and size is timed, forward and backward CPU seconds > 0."""
    out = C.edge_pass_cpu(C.ThreadTimedGroup.of(Group.solo("tp")), calls=2, blocks=1)
    assert sorted(out) == sorted(f"{e}_{tp}" for e in C.EDGES for tp in ("tp2", "tp1"))
    assert all(len(v) == 2 and v[0] > 0 and v[1] > 0 for v in out.values())
