"""The planner against what an H200 measured (scripts/gpu_check.py, 2026-12-04; the raw results are committed in
tests/data/gpu_h200/, the GEMM table in hybrid/planner/data/gemm_h200_measured.csv, docs/results/gpu_h200.md).

The workload is the speed section's: a 1.2B Llama (Llama 3.2 1B's shape: 16 layers, h 2048, 32 heads, 8 kv-heads,
FFN 8192, vocabulary 128256, tied) at s 4096, --bf16, micro-batch 1, 8 micro-batches a step, one GPU, ZeRO 0,
train.py's defaults otherwise; planned with the bf16-flash profile (train.py attends with SDPA: flash on a GPU)."""

from __future__ import annotations

import csv
import json
import math
import os

import pytest
from transformers import LlamaConfig

from hybrid.planner import Cluster, Layout, Recompute, Workload, evaluate, hardware
from hybrid.planner.hardware import Gemm
from hybrid.planner.model import ActivationProfile, Precision
from hybrid.planner.ops import KernelProfile
from models import from_hf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = os.path.join(ROOT, "tests", "data", "gpu_h200")
TABLE = os.path.join(ROOT, "hybrid", "planner", "data", "gemm_h200_measured.csv")


def _run(name: str) -> dict:
    with open(os.path.join(RUNS, name)) as f:
        return json.load(f)["sections"]


def _workload() -> Workload:
    cfg = LlamaConfig(num_hidden_layers=16, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8,
                      intermediate_size=8192, vocab_size=128256, max_position_embeddings=4096,
                      tie_word_embeddings=True, rope_theta=500000.0)
    return Workload(from_hf(cfg), global_batch=8, seq_length=4096, precision=Precision.MIXED,
                    activations=ActivationProfile.BF16_FLASH, kernels=KernelProfile.EAGER, fp32_grads=False)


def test_the_h200_preset_curve_fits_the_gemms_measured_on_an_h200():
    """rms log error 9.8 % over the 16 shapes; worst +33 % (predicted rate over measured), the batched QK^T of the
    attention core (32 heads of 4096 x 64 x 4096: a short reduction, as XLA's worst H100 shape) -- train.py's
    flash attention does not run these as separate products -- and every unbatched product within 11 %."""
    hw = hardware("h200")
    with open(TABLE) as f:
        rows = [(Gemm(int(r["m"]), int(r["n"]), int(r["k"]), int(r["b"])), float(r["bf16_flops_per_s"]))
                for r in csv.DictReader(f)]
    assert len(rows) == 16
    logs = [math.log(hw.gemm_flops(g, 2) / measured) for g, measured in rows]
    assert math.sqrt(sum(x * x for x in logs) / len(logs)) <= 0.10
    assert max(abs(x) for x in logs) <= math.log(1.34)
    assert max(abs(x) for (g, _), x in zip(rows, logs) if g.batch == 1) <= math.log(1.11)


def test_planned_memory_is_what_the_h200_allocated():
    """Measured with torch.cuda.memory_allocated / max_memory_allocated (no CUDA context, no allocator cache, so
    against the plan less its workspace): model states 19.84 GB (planned 19.77), one micro-batch's kept
    activations 9.29 GB (9.23), the peak of its backward 4.20 GB above them -- the loss's two fp32 gradients over
    4096 x 128256 logits (planned 4.20) -- and train.py's peak 33.34 GB (planned 33.21). Each within 1 %."""
    measured = _run("run3_8d2f7a7.json")["breakdown"]["result"]["measured"]
    train = _run("run2_dcd63a0.json")["speed"]["result"]["train_py_recompute_none"]
    plan = evaluate(_workload(), Cluster(gpus=1, hw=hardware("h200")), Layout(micro_batch=1))
    rank = plan.memory.ranks[0]
    kept = measured["one_micro_batch_forward_kept_bytes"]
    assert rank.states.device == pytest.approx(measured["states_bytes"], rel=0.01)
    assert rank.activations == pytest.approx(kept, rel=0.01)
    assert rank.backward_transient == pytest.approx(
        measured["one_micro_batch_forward_backward_peak_above_states_bytes"] - kept, rel=0.01)
    assert rank.total - rank.workspace == pytest.approx(train["peak_memory_bytes"], rel=0.01)


@pytest.mark.parametrize("recompute", [Recompute.NONE, Recompute.SELECTIVE])
def test_planned_step_time_is_within_10_percent_of_the_h200_run(recompute):
    """train.py's step (median of 10): 0.726 s, selective recomputation 0.793 s; planned on the h200 preset with
    the whole-layer model and our eager kernels 0.735 / 0.762 s (+1.2 % / -4.0 %). The forward + backward of run 3
    is the row the per-kernel latency is fitted to (tests/test_planner_fit.py), so the no-recomputation step
    checks only the optimizer (planned 20 ms of passes and launches, measured 36 ms) and the selective one the
    rerun attention; before issue 26 they were -9.1 % / -8.6 %."""
    measured = _run("run2_dcd63a0.json")["speed"]["result"][f"train_py_recompute_{recompute.value}"]["step_s"]
    plan = evaluate(_workload(), Cluster(gpus=1, hw=hardware("h200")), Layout(micro_batch=1, recompute=recompute))
    assert abs(plan.time.total / measured["median"] - 1) <= 0.10


def test_the_shipped_h200_profile_plans_the_step_it_was_measured_beside():
    """hybrid/planner/data/h200_calibrated.json (`hybrid calibrate --ranks 1 --base h200` on the H200, run 2) loads
    as a profile and plans train.py's no-recomputation step at 0.707 s against 0.726 measured
    (docs/planner/validation.md,
    "One GPU"); it predates the per-kernel field (0 here) and its elementwise rate is the old two-shape solve's."""
    from hybrid.planner.calibrate import load_hardware
    hw = load_hardware(os.path.join(ROOT, "hybrid", "planner", "data", "h200_calibrated.json"), Precision.MIXED)
    assert hw.kernel_overhead_s == 0.0 and hw.elementwise_tbps > hw.hbm_tbps
    plan = evaluate(_workload(), Cluster(gpus=1, hw=hw), Layout(micro_batch=1))
    measured = _run("run2_dcd63a0.json")["speed"]["result"]["train_py_recompute_none"]["step_s"]["median"]
    assert round(plan.time.total, 3) == 0.707 and abs(plan.time.total / measured - 1) <= 0.05
