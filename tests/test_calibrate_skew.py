"""The ranks' skew at a synchronous collective (issue 26, the 2-rank CPU ranking planned every layout slow): what
`hybrid calibrate` measures (calibrate.skew_probe, fit_skew), and how the planner charges it (Hardware.
collective_skew_s / collective_skew_per_s, hardware.sync_wait_seconds, time.py's `tp_wait` term)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from hybrid.planner import Cluster, Layout, evaluate
from hybrid.planner.calibrate import fit_skew, load_hardware, measures_skew, skew_probe
from hybrid.planner.hardware import GpuKind, hardware, sync_wait_seconds
from hybrid.planner.layout import Workload
from hybrid.planner.model import ActivationProfile, Precision
from hybrid.planner.predicted_comm import tp_ledger
from hybrid.planner.time import TERMS
from hybrid.testing import run_distributed
from models import load_config

# a 2-core CPU as calibrate writes it, but for the skew (values of the lead's quiet calibration at df0ef47)
CPU = hardware(GpuKind.CPU).with_overrides(
    name="cpu-2", peak_tflops=0.1016, compute_efficiency=1.0, gemm_overhead_s=2.9e-6, hbm_tbps=0.022,
    gpus_per_node=2, intra_node_gbps=0.93, intra_latency_s=300e-6, compute_units=2, elementwise_tbps=0.0051)
SKEW_S, SKEW_PER_S = 700e-6, 0.05


def _work(layers: int = 4) -> Workload:
    cfg = dataclasses.replace(load_config("tiny-gpt2"), num_layers=layers)
    return Workload(cfg, global_batch=16, seq_length=128, precision=Precision.FP32,
                    activations=ActivationProfile.FP32_FLASH)


def _terms(hw, **layout) -> dict[str, float]:
    return dict(evaluate(_work(), Cluster(gpus=2, hw=hw), Layout(**layout)).time.terms)


def test_fit_skew_recovers_an_affine_wait_and_falls_back_on_noise():
    base = 250e-6  # the back-to-back call, subtracted from each point
    bursts = (0.5e-3, 2e-3, 10e-3)
    fit = fit_skew([(c, base + SKEW_S + SKEW_PER_S * c) for c in bursts], base)
    assert fit["collective_skew_s"] == pytest.approx(SKEW_S) and fit["collective_skew_per_s"] == pytest.approx(SKEW_PER_S)
    # falling with compute (noise): the mean wait, no slope
    fit = fit_skew([(c, base + w) for c, w in zip(bursts, (3e-3, 2e-3, 1e-3))], base)
    assert fit == {"collective_skew_s": pytest.approx(2e-3), "collective_skew_per_s": 0.0}
    # a line through a negative intercept: refitted through the origin, sum c w / sum c^2
    waits = [0.0, 0.0, 1e-3]
    fit = fit_skew([(c, base + w) for c, w in zip(bursts, waits)], base)
    assert fit["collective_skew_s"] == 0.0
    assert fit["collective_skew_per_s"] == pytest.approx(10e-3 * 1e-3 / sum(c * c for c in bursts))
    # every call no slower than back to back: no wait
    assert fit_skew([(c, base / 2) for c in bursts], base) == {"collective_skew_s": 0.0, "collective_skew_per_s": 0.0}


def test_the_probe_runs_only_with_a_core_per_gloo_rank(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert measures_skew(2, "gloo")
    assert not measures_skew(8, "gloo")  # the main job's 8 ranks on 2 cores: the shared-compute bound's regime
    assert not measures_skew(1, "gloo") and not measures_skew(2, "nccl")


def test_sync_wait_is_a_fixed_cost_per_call_plus_the_jitter_of_the_compute_between():
    hw = CPU.with_overrides(collective_skew_s=SKEW_S, collective_skew_per_s=SKEW_PER_S)
    assert sync_wait_seconds(hw, 21, 0.04) == pytest.approx(21 * SKEW_S + SKEW_PER_S * 0.04)
    assert sync_wait_seconds(hw, 0, 0.04) == 0.0  # a pass without collectives waits for nobody
    for kind in GpuKind:  # presets (GPUs, the dry-run cpu) measure no skew
        assert sync_wait_seconds(hardware(kind), 21, 0.04) == 0.0


def test_tp_layouts_pay_each_collective_its_wait_and_nothing_else_moves():
    hw = CPU.with_overrides(collective_skew_s=SKEW_S)
    m = 16
    # the calls of one micro-batch, counted by predicted_comm (the runtime's ledger, tests/test_planner_runtime.py)
    book = tp_ledger(_work().shard(2), 1, 128, 4, True, True, False)
    calls = sum(e["calls"] for ledger in book.values() for e in ledger.values())
    assert calls == 4 * 4 + 1 + 3 + 1  # Megatron: 4 a layer; the embedding's, the loss's 3, the head input's
    plain, skewed = _terms(CPU, tp=2, micro_batch=1), _terms(hw, tp=2, micro_batch=1)
    assert plain["tp_wait"] == 0.0 and skewed["tp_wait"] == pytest.approx(m * calls * SKEW_S)
    assert {k: v for k, v in skewed.items() if k not in ("tp_wait", "bubble")} == pytest.approx(
        {k: v for k, v in plain.items() if k not in ("tp_wait", "bubble")})
    assert sum(skewed.values()) - sum(plain.values()) == pytest.approx(m * calls * SKEW_S)
    # data and pipeline parallelism run no TP collective: unchanged to the bit
    for layout in (dict(dp=2, micro_batch=1), dict(pp=2, micro_batch=2)):
        assert _terms(hw, **layout) == _terms(CPU, **layout)


def test_the_jitter_term_charges_the_compute_the_collectives_follow():
    """With skew_per_s alone the wait is skew_per_s x the compute of every pass that ends in a TP collective: all
    of a tp 2 step's but the embedding's backward (a gather's gradient: no collective after it, ~1 % here), and
    not the optimizer's. One micro-batch: no gradient accumulation pass (it runs outside the passes)."""
    hw = CPU.with_overrides(collective_skew_per_s=SKEW_PER_S)
    t = evaluate(_work(), Cluster(gpus=2, hw=hw), Layout(tp=2, micro_batch=16)).time
    compute = sum(t.term(k) for k in ("gemm", "attention", "memory_bound", "launches"))
    assert 0.98 * SKEW_PER_S * compute < t.term("tp_wait") <= SKEW_PER_S * compute


def test_explain_lists_the_wait_and_the_terms_still_add_up():
    assert "tp_wait" in dict(TERMS)
    hw = CPU.with_overrides(collective_skew_s=SKEW_S, collective_skew_per_s=SKEW_PER_S)
    t = evaluate(_work(), Cluster(gpus=2, hw=hw), Layout(tp=2, micro_batch=2)).time
    assert sum(v for _, v in t.terms) == pytest.approx(t.total)


def test_hybrid_plan_explain_shows_the_wait_from_a_profile(tmp_path, capsys):
    from hybrid.planner.calibrate import FORMAT
    from hybrid.planner.cli import main
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"format": FORMAT, "hardware": dataclasses.asdict(
        CPU.with_overrides(collective_skew_s=SKEW_S, collective_skew_per_s=SKEW_PER_S))}))
    assert main(["--model", "tiny-gpt2", "--gpus", "2", "--global-batch-size", "16", "--seq-length", "128",
                 "--hardware", str(path), "--precision", "fp32", "--activation-profile", "fp32-flash",
                 "--tensor-model-parallel-size", "2", "--micro-batch-size", "1", "--top", "1", "--explain"]) == 0
    rows = {line.split()[0]: float(line.split()[1]) for line in capsys.readouterr().out.splitlines()
            if line.startswith("  ") and line.split()[0] in dict(TERMS)}
    assert rows["tp_wait"] > 16 * 21 * SKEW_S  # 16 micro-batches of 21 TP calls, plus the jitter of their compute


def test_a_profile_without_the_fields_loads_with_no_wait_and_one_with_them_keeps_them(tmp_path):
    from hybrid.planner.calibrate import FORMAT
    fields = dataclasses.asdict(CPU)
    old = {k: v for k, v in fields.items() if not k.startswith("collective_skew")}
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": FORMAT, "hardware": old}))
    assert load_hardware(str(path)) == CPU  # profiles written before: planned as before
    path.write_text(json.dumps({"format": FORMAT, "hardware": dict(fields, collective_skew_s=SKEW_S,
                                                                    collective_skew_per_s=SKEW_PER_S)}))
    assert load_hardware(str(path)).collective_skew_per_s == SKEW_PER_S
    path.write_text(json.dumps({"format": FORMAT, "hardware": dict(fields, collective_skew_s=-1e-3)}))
    with pytest.raises(ValueError, match="collective_skew_s must be a finite number >= 0"):
        load_hardware(str(path))


def _probe(rank: int, world: int) -> list[tuple[float, float]]:
    return skew_probe(world, bursts=(16, 256), calls=3)


def test_the_probe_times_an_all_reduce_after_each_burst_on_two_gloo_ranks():
    """Tiny bursts, 3 calls each: the points are the ranks' means (all-reduced: equal on both ranks), the bursts
    take longer as they grow, and the fit of them is finite and >= 0."""
    points = run_distributed(_probe, 2, timeout=120)
    assert points[0] == points[1] and len(points[0]) == 2
    (c1, w1), (c2, w2) = points[0]
    assert 0 < c1 < c2 and w1 > 0 and w2 > 0
    fit = fit_skew(points[0], min(w1, w2) / 2)
    assert all(math.isfinite(v) and v >= 0 for v in fit.values())


def test_a_gradient_add_streams_at_the_copy_rate_on_a_calibrated_cpu():
    """Eager gradient accumulation (AccumulateGrad) is an add: fp32 reads the new gradient and the sum and writes the
    sum, 12 bytes a parameter, for m - 1 of m micro-batches. On a calibrated CPU at the copy rate (hbm_tbps, 22 GB/s)
    -- not the layer's GELU / softmax mix (elementwise_tbps, 5.1 GB/s), which priced the 2-rank ranking's dp 2 b 1
    step's accumulation at 70 ms; on a GPU preset at its elementwise rate, as before (that is its copy rate)."""
    from hybrid.planner.time import _context, _grad_accumulation
    work, params, m = _work(), 1_000_000, 8
    layout = Layout(dp=2, micro_batch=1)
    assert work.num_microbatches(layout) == m and not work.fused_grad_accumulation
    cpu = _grad_accumulation(_context(work, Cluster(gpus=2, hw=CPU), layout), params)
    assert cpu.memory == pytest.approx(12 * params * (m - 1) / m / 0.022e12)
    h100 = hardware(GpuKind.H100_80G)
    gpu = _grad_accumulation(_context(work, Cluster(gpus=2, hw=h100), layout), params)
    assert gpu.memory == pytest.approx(12 * params * (m - 1) / m / h100.elementwise_bytes_per_s)
