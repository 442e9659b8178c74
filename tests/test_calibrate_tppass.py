"""What tensor parallelism does not save on a CPU (issue 26, round 11): a layer pass at tp 2 costs its CPU beyond
the sharded GEMMs and bytes (the TP autograd Functions, first touches after each blocking all-reduce). calibrate's
pair probe times a 1-token layer at tp 2 and unsharded; the difference, less the planner's own, is
Hardware.tp_layer_{forward,backward}_overhead_s, read only at tp > 1."""

from __future__ import annotations

import dataclasses

import pytest

from hybrid.planner import ActivationProfile, Cluster, Layout, Precision, Workload
from hybrid.planner import calibrate as C
from hybrid.planner.hardware import GpuKind, hardware
from hybrid.planner.ops import KernelProfile
from hybrid.planner.time import stage_times
from models import PRESETS

F, B = 0.4e-3, 0.9e-3  # the extra per pass (s): round 11's order (1.7-1.8 ms a 1-token pass, forward + backward)
CPU = dataclasses.replace(hardware(GpuKind.CPU), gpus_per_node=8, compute_units=2, layer_forward_overhead_s=0.13e-3,
                          layer_backward_overhead_s=0.37e-3)
TP = dataclasses.replace(CPU, tp_layer_forward_overhead_s=F, tp_layer_backward_overhead_s=B)


def test_the_extra_is_read_only_at_tp_above_one():
    """A layer's passes: unchanged at tp 1; at tp 2 and 4 longer by exactly (F, B)."""
    shape = (2, 128, 64, 4)
    assert C.planned_pass_seconds(TP, shape, 1) == C.planned_pass_seconds(CPU, shape, 1)
    for tp in (2, 4):
        with_, without = C.planned_pass_seconds(TP, shape, tp), C.planned_pass_seconds(CPU, shape, tp)
        assert with_[0] - without[0] == pytest.approx(F, rel=1e-9)
        assert with_[1] - without[1] == pytest.approx(B, rel=1e-9)


def test_the_main_jobs_compute_grows_by_its_layers_passes():
    """tiny-gpt2 on tp 2 x pp 2 x dp 2: the busiest rank's compute a micro-batch grows by its stage's layers x
    (F + B); at tp 1 x pp 2 x dp 4 not at all."""
    work = Workload(PRESETS["tiny-gpt2"], global_batch=16, seq_length=128, precision=Precision.FP32,
                    activations=ActivationProfile.FP32_FLASH, kernels=KernelProfile.EAGER)
    layers = PRESETS["tiny-gpt2"].num_layers // 2

    def compute(hw, layout):
        return stage_times(work, Cluster(gpus=8, hw=hw), layout)[1]
    tp2, tp1 = Layout(tp=2, pp=2, dp=2, micro_batch=2), Layout(tp=1, pp=2, dp=4, micro_batch=2)
    assert compute(TP, tp2) - compute(CPU, tp2) == pytest.approx(layers * (F + B), rel=1e-9)
    assert compute(TP, tp1) == compute(CPU, tp1)


def test_an_old_profile_without_the_fields_loads_with_no_extra(tmp_path):
    """Profiles written before the field: the extra is 0, the plan as before."""
    import json
    path = tmp_path / "old.json"
    fields = {k: v for k, v in dataclasses.asdict(CPU).items() if not k.startswith("tp_layer_")}
    path.write_text(json.dumps({"format": C.FORMAT, "hardware": fields}))
    hw = C.load_hardware(str(path))
    assert hw.tp_layer_forward_overhead_s == 0.0 and hw.tp_layer_backward_overhead_s == 0.0


def synthetic_rank(extra: tuple[float, float], hw=CPU) -> dict:
    """A rank's tp_pass_cpu record whose layers take exactly what the planner says, plus `extra` at tp 2."""
    tp1 = C.planned_pass_seconds(hw, C.PASS_SHAPE, 1)
    tp2 = C.planned_pass_seconds(hw, C.PASS_SHAPE, 2)
    return {"tp_pass": {"tp1": list(tp1), "tp2": [tp2[0] + extra[0], tp2[1] + extra[1]]}}


def test_the_fit_gives_a_synthetic_pairs_extra_back_and_clamps_a_saving_at_zero():
    """Median over ranks of (tp 2 - unsharded) less the planner's difference: the extra back exactly; a rank
    outlying does not move the median; tp 2 cheaper than planned gives 0; the odd rank (None) is skipped."""
    ranks = [synthetic_rank((F, B)), synthetic_rank((F, B)), synthetic_rank((5 * F, 5 * B)), None]
    fit = C.fit_tp_pass(ranks, CPU)
    assert fit["tp_layer_forward_overhead_s"] == pytest.approx(F, rel=1e-9)
    assert fit["tp_layer_backward_overhead_s"] == pytest.approx(B, rel=1e-9)
    saving = C.fit_tp_pass([synthetic_rank((-F, -B))], CPU)
    assert saving == {"tp_layer_forward_overhead_s": 0.0, "tp_layer_backward_overhead_s": 0.0}
    # the fit prices against the plain planner: an hw already carrying the extra gives the same answer
    assert C.fit_tp_pass(ranks, TP) == fit
    assert C.fit_tp_pass([None, {}], CPU) == {}
