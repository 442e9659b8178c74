"""The CPU a calibrated step spends outside the model's passes (issue 26, round 14): the pipeline executor's own
Python per forward / backward action (Hardware.executor_*_cpu_s, calibrate.executor_action_cpu: the pair run as a
pp-2 pipeline) and the optimizer's per tensor and per step (Hardware.optimizer_*_cpu_s, calibrate.optimizer_step_cpu:
the runtime's ZeroOptimizer timed on two stage sizes). Round 12's `--account` found both unpriced in the main job;
each is a probe of a primitive, composed by the planner: here the probes' arithmetic, the terms' composition, and
that profiles without the fields (GPUs, presets, older profiles) plan as before."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hybrid.comm import Group
from hybrid.planner import ActivationProfile, Cluster, Layout, Precision, Workload, evaluate
from hybrid.planner import calibrate as C
from hybrid.planner.hardware import GpuKind, hardware
from hybrid.planner.ops import KernelProfile
from hybrid.planner.time import TERMS, optimizer_bytes_per_param, stage_times
from models import PRESETS

# of the order this round's probes read (docs/results/bench_planner_mainjob.md); distinct, so a field read in the
# wrong place shows
EXEC_F, EXEC_B, OPT_T, OPT_S = 0.18e-3, 0.09e-3, 21e-6, 0.7e-3
CPU = dataclasses.replace(hardware(GpuKind.CPU), gpus_per_node=8, compute_units=2, layer_forward_overhead_s=0.13e-3,
                          layer_backward_overhead_s=0.37e-3)
GLUE = dataclasses.replace(CPU, executor_forward_cpu_s=EXEC_F, executor_backward_cpu_s=EXEC_B,
                           optimizer_tensor_cpu_s=OPT_T, optimizer_step_cpu_s=OPT_S)
WORK = Workload(PRESETS["tiny-gpt2"], global_batch=16, seq_length=128, precision=Precision.FP32,
                activations=ActivationProfile.FP32_FLASH, kernels=KernelProfile.EAGER)
MAIN = Layout(tp=2, pp=2, dp=2, micro_batch=2)
FIELDS = ("executor_forward_cpu_s", "executor_backward_cpu_s", "optimizer_tensor_cpu_s", "optimizer_step_cpu_s")


def plan(hw, layout=MAIN):
    return evaluate(WORK, Cluster(gpus=8, hw=hw), layout).time


def test_every_stage_pass_carries_the_executors_cpu_when_the_executor_runs():
    """tp 2 x pp 2 x dp 2: each stage's forward longer by EXEC_F and its backward by EXEC_B (per micro-batch, its
    compute and its CPU on the shared cores alike); the explain term is m = 4 micro-batches x (EXEC_F + EXEC_B) on
    the busiest pipeline rank (one stage each). pp 1 (LocalForwardBackward, no executor): nothing."""
    with_, without = stage_times(WORK, Cluster(gpus=8, hw=GLUE), MAIN)[0], stage_times(WORK, Cluster(gpus=8, hw=CPU),
                                                                                       MAIN)[0]
    for s in (0, 1):
        assert with_.forward[s] - without.forward[s] == pytest.approx(EXEC_F, rel=1e-9)
        assert with_.backward[s] - without.backward[s] == pytest.approx(EXEC_B, rel=1e-9)
        assert with_.rank_compute[s] - without.rank_compute[s] == pytest.approx(EXEC_F + EXEC_B, rel=1e-9)
    t = plan(GLUE)
    assert t.term("executor") == pytest.approx(4 * (EXEC_F + EXEC_B), rel=1e-9)
    assert plan(CPU).term("executor") == 0.0
    assert plan(GLUE, Layout(tp=2, pp=1, dp=4, micro_batch=2)).term("executor") == 0.0


def test_the_optimizer_term_grows_by_the_probes_fields_times_the_cores_sharing():
    """The fullest pipeline rank of tiny-gpt2 at pp 2 holds 2 layers; the planner counts a GPT-2 layer's tensors as
    6 linear weights (q, k, v, out, 2 MLP) + 6 biases + 4 norm parameters = 16 (time._parameter_tensors; the runtime's
    GPT2Block has the same 16), plus 3 for the embedding / head / final norm: 35. The optimizer term
    grows by (35 OPT_T + OPT_S) x 8 ranks / 2 cores (the ranks' optimizer steps share the cores:
    Hardware.shared_compute_factor)."""
    grown = plan(GLUE).optimizer - plan(CPU).optimizer
    assert grown == pytest.approx((35 * OPT_T + OPT_S) * 8 / 2, rel=1e-9)


def test_the_step_moves_by_more_than_the_terms_alone_and_the_terms_still_add_up():
    """With the fields the main job's step is longer (the term is not dropped on its way to the total), and every
    explain term adds up to the step as before."""
    a, b = plan(CPU), plan(GLUE)
    assert b.total > a.total + b.term("executor")
    assert [n for n, _ in b.terms] == [n for n, _ in TERMS]
    assert sum(v for _, v in b.terms) == pytest.approx(b.total, rel=1e-12)


def test_gpus_and_profiles_without_the_fields_plan_bit_identically(tmp_path):
    """A GPU preset has the four fields at 0 and its step terms' executor 0; a profile written before round 14 loads
    them as 0 and plans the main job exactly as the same hardware with them 0."""
    h100 = hardware(GpuKind.H100_80G)
    assert all(getattr(h100, f) == 0.0 for f in FIELDS)
    t = evaluate(WORK, Cluster(gpus=8, hw=h100), MAIN).time
    assert t.term("executor") == 0.0
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": C.FORMAT, "hardware": {k: v for k, v in dataclasses.asdict(CPU).items()
                                                                  if k not in FIELDS}}))
    old = C.load_hardware(str(path))
    assert all(getattr(old, f) == 0.0 for f in FIELDS)
    assert plan(old) == plan(CPU)


def test_the_executor_fit_is_the_median_over_ranks_clamped_at_zero():
    """fit_executor: the median over the ranks that ran the probe (an outlier does not move it; the odd rank's None
    skipped); a negative reading (noise) gives 0; no probe, no fields."""
    row = {"executor": {"forward": EXEC_F, "backward": EXEC_B}}
    far = {"executor": {"forward": 9 * EXEC_F, "backward": 9 * EXEC_B}}
    assert C.fit_executor([row, row, far, None]) == pytest.approx(
        {"executor_forward_cpu_s": EXEC_F, "executor_backward_cpu_s": EXEC_B}, rel=1e-12)
    neg = {"executor": {"forward": -1e-6, "backward": EXEC_B}}
    assert C.fit_executor([neg])["executor_forward_cpu_s"] == 0.0
    assert C.fit_executor([None, {}]) == {}


def test_the_optimizer_fit_is_the_line_through_two_sizes_net_of_the_planners_bytes():
    """Two stage sizes whose CPU is exactly planned bytes + k x OPT_T + OPT_S: the fit gives OPT_T per tensor and
    OPT_S per step back (the planner's bytes, 40 B a parameter in fp32 at the profile's memory-bound rate, taken
    off first); a size costing less than its bytes clamps at 0; one size is not a line."""
    per_param = optimizer_bytes_per_param(C._probe_workload(C.PASS_SHAPE, C.CPU_PROBE))
    assert per_param == 40.0  # fp32: the clip norm (4) and scale (8), AdamW (28)
    rate = CPU.elementwise_bytes_per_s
    points = [(k, n, per_param * n / rate + k * OPT_T + OPT_S) for k, n in ((20, 66560), (68, 216512))]
    assert C.fit_optimizer_step(points, CPU) == pytest.approx(
        {"optimizer_tensor_cpu_s": OPT_T, "optimizer_step_cpu_s": OPT_S}, rel=1e-6)
    cheap = [(k, n, 0.0) for k, n, _ in points]
    assert C.fit_optimizer_step(cheap, CPU) == {"optimizer_tensor_cpu_s": 0.0, "optimizer_step_cpu_s": 0.0}
    assert C.fit_optimizer_step(points[:1], CPU) == {}


def test_the_executor_probe_runs_the_runtimes_executor_in_process():
    """executor_action_cpu on a one-rank group (a one-stage pipeline, no messages; the pair runs it as pp 2 in
    calibrate): both actions timed, CPU seconds > 0; the executor's `_backward` (timed during the probe) is restored
    afterwards."""
    from hybrid.pipeline import executor
    before = executor._backward
    out = C.executor_action_cpu(C.ThreadTimedGroup.of(Group.solo("pp")), m=2, steps=2, blocks=1)
    assert executor._backward is before
    assert sorted(out) == ["backward", "forward"]
    assert all(v > 0 for v in out.values())


def test_the_optimizer_probe_times_the_runtimes_optimizer_on_two_sizes():
    """optimizer_step_cpu in-process (a one-rank mesh): one row per size, more tensors and parameters for the larger
    stage (GPT-2: 16 tensors a layer, 4 outside), CPU seconds > 0."""
    rows = C.optimizer_step_cpu(steps=2, blocks=1)
    assert [k for k, _, _ in rows] == [20, 68]
    assert rows[0][1] < rows[1][1] and all(c > 0 for _, _, c in rows)
