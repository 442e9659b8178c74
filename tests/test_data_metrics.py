"""Metrics: FLOPs per token against the published formulas worked by hand, MFU arithmetic, and the TensorBoard
events and JSON-lines records of a real run (tests/test_data_train.py) equal to its log lines."""

from __future__ import annotations

from fractions import Fraction

import pytest

from hybrid.metrics.flops import device_peak_tflops, hardware_flops_per_token, model_flops_per_token
from hybrid.metrics.writer import step_rates
from models import load_config


def test_gpt2_flops_are_narayanans_formula_worked_by_hand():
    """tiny-gpt2: L 4, h 64, V 256, f = 4h, s 32. Narayanan et al. (2021) eq. (3) per token, without and with
    full recomputation: 72 L h^2 (1 + s/6h + V/12Lh) and 96 L h^2 (1 + s/6h + V/16Lh)."""
    cfg = load_config("tiny-gpt2")
    L, h, V, s = 4, 64, 256, 32
    assert (cfg.num_layers, cfg.hidden_size, cfg.vocab_size, cfg.ffn_hidden_size) == (L, h, V, 4 * h)
    # by hand: 72*4*4096 = 1179648; 12*4*32*64 = 98304; 6*64*256 = 98304
    assert model_flops_per_token(cfg, s) == 1179648 + 98304 + 98304 == 1376256
    assert model_flops_per_token(cfg, s) == 72 * L * h**2 * (1 + Fraction(s, 6 * h) + Fraction(V, 12 * L * h))
    assert hardware_flops_per_token(cfg, s, "full") == 96 * L * h**2 * (1 + Fraction(s, 6 * h) + Fraction(V, 16 * L * h))
    assert hardware_flops_per_token(cfg, s, "selective") == 1376256 + 4 * L * s * h


def test_llama_gqa_flops_are_6n_plus_12lsq_with_n_from_the_parameter_count():
    """PaLM's 6 N + 12 L s q (q = heads x head_dim), N the matmul weights: the model's exact parameter count
    (checked against transformers elsewhere) less the input embedding and the RMSNorm weights."""
    cfg = load_config("tiny-llama")
    L, h, V, s = cfg.num_layers, cfg.hidden_size, cfg.vocab_size, 48
    norms = (2 * L + 1) * h  # two RMSNorms per block and the final one
    n_matmul = cfg.num_parameters - V * h - norms  # the untied LM head stays: it is a matmul
    q = cfg.num_heads * cfg.head_dim
    assert model_flops_per_token(cfg, s) == 6 * n_matmul + 12 * L * s * q
    # and by hand: per block q,o 64x64 each, k,v 64x32 each, SwiGLU 3 x 64 x 176; head 64 x 256
    assert n_matmul == 4 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 176) + 64 * 256


def test_mfu_arithmetic():
    """1e9 tokens/s x 1376256 FLOPs/token over 8 devices = 172.032 TFLOP/s each; of a 989 TFLOP/s H100: 17.39%."""
    cfg = load_config("tiny-gpt2")
    r = step_rates(cfg, 32, tokens_per_step=500_000_000, step_s=0.5, world=8, recompute="none", peak_tflops=989.0)
    assert r.tokens_per_s == 1e9
    assert r.tflops_per_device == pytest.approx(172.032, rel=1e-12)
    assert r.mfu == pytest.approx(172.032 / 989.0, rel=1e-12)
    assert device_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0 and device_peak_tflops("cpu") is None
    assert device_peak_tflops("NVIDIA H100 PCIe") == 756.0 and device_peak_tflops("NVIDIA H100 NVL") == 835.0


def test_narayanan_table1_rows_hardware_flops_and_percent_of_peak():
    """Narayanan et al. 2021, Table 1 (tests/data/megatron_2021_table1_subset.csv): with full recomputation our
    per-token hardware FLOPs times B s are eq. (3), F = 96 B s l h^2 (1 + s/6h + V/16lh), written out here with
    exact fractions; and a step at the published TFLOP/s per GPU, fed through step_rates, gives back that rate
    and the published percentage of the A100's 312 TFLOP/s (the paper counts recomputation: hardware FLOPs).
    MFU, which counts model FLOPs only, is that rate x eq. (3)'s 72-factor form / its 96-factor form."""
    from pathlib import Path

    from hybrid.planner.reference import gpt_model, megatron_rows
    rows = megatron_rows(Path(__file__).resolve().parent / "data")
    assert len(rows) == 5
    peak = device_peak_tflops("NVIDIA A100-SXM4-80GB")
    assert peak == 312.0
    for r in rows:
        cfg = gpt_model(r.layers, r.hidden, r.heads, r.vocab, r.seq)
        B, s, l, h, V = r.global_batch, r.seq, r.layers, r.hidden, r.vocab
        eq3 = 96 * B * s * l * h**2 * (1 + Fraction(s, 6 * h) + Fraction(V, 16 * l * h))
        assert hardware_flops_per_token(cfg, s, "full") * B * s == eq3
        model = 72 * B * s * l * h**2 * (1 + Fraction(s, 6 * h) + Fraction(V, 12 * l * h))
        assert model_flops_per_token(cfg, s) * B * s == model
        step_s = float(eq3) / (r.gpus * r.tflops_per_gpu * 1e12)  # the step time the published rate implies
        rates = step_rates(cfg, s, B * s, step_s, r.gpus, "full", peak)
        assert rates.hw_tflops_per_device == pytest.approx(r.tflops_per_gpu, rel=1e-12)
        assert round(100 * rates.hw_tflops_per_device / peak) == r.percent_of_peak, r
        assert rates.mfu == pytest.approx(r.tflops_per_gpu * float(model / eq3) / peak, rel=1e-12)


def _profile(path, matmul: dict, compute_units) -> str:
    """A `hybrid calibrate` profile (its format and every required field) with the given rates."""
    import dataclasses
    import json

    from hybrid.planner.calibrate import FORMAT
    from hybrid.planner.hardware import hardware
    hw = dataclasses.asdict(hardware("cpu").with_overrides(peak_tflops=matmul.get("bf16", matmul["fp32"]),
                                                           compute_units=compute_units))
    path.write_text(json.dumps({"format": FORMAT, "hardware": hw, "matmul_tflops": matmul}))
    return str(path)


def test_mfu_peak_from_a_calibrate_profile_shares_the_cores_among_local_ranks(tmp_path, monkeypatch):
    """--hardware: the profile's matmul rate R for the run's precision, x min(1, cores / local ranks) when its
    ranks share a CPU (compute_units): 8 ranks on 2 cores get R x 2/8 each, so MFU is the share of the machine's
    2 R the whole run achieves. A GPU profile (no compute_units) gives R per device."""
    import argparse

    from hybrid.metrics.args import check, profile_peak_tflops
    from hybrid.zero import Precision, ZeroConfig
    cpu = _profile(tmp_path / "cpu.json", {"fp32": 0.2, "bf16": 1.2}, compute_units=2)
    assert profile_peak_tflops(cpu, fp32=True, local_ranks=8) == pytest.approx(0.2 * 2 / 8)
    assert profile_peak_tflops(cpu, fp32=False, local_ranks=8) == pytest.approx(1.2 * 2 / 8)
    assert profile_peak_tflops(cpu, fp32=True, local_ranks=1) == pytest.approx(0.2)  # a rank cannot use 2 cores
    gpu = _profile(tmp_path / "gpu.json", {"fp32": 50.0, "bf16": 700.0}, compute_units=None)
    assert profile_peak_tflops(gpu, fp32=False, local_ranks=8) == pytest.approx(700.0)

    def args(**kw):
        base = dict(tensorboard_dir=None, metrics_file=None, peak_tflops=None, hardware=None,
                    zero=ZeroConfig(precision=Precision.FP32))
        return argparse.Namespace(**{**base, **kw})
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    cfg = check(args(hardware=cpu), world=8)  # two nodes of 4: the node's ranks share its cores
    assert cfg.peak_tflops == pytest.approx(0.2 * 2 / 4) and "--hardware" in cfg.peak_source
    assert check(args(peak_tflops=3.0)).peak_tflops == 3.0
    with pytest.raises(ValueError, match="--peak-tflops and --hardware both"):
        check(args(hardware=cpu, peak_tflops=1.0))


def test_peak_rss_counts_an_allocation_the_process_touches_and_not_its_parents():
    """CPU peak memory is VmHWM in bytes: after writing a 256 MiB tensor a fresh process' peak is at least its RSS
    before (statm) + 256 MiB, and not 1024x more or less (the unit is right). A child it starts while holding
    1 GiB reports its own peak, not the parent's: getrusage's ru_maxrss would (Linux carries it across fork +
    exec), and every torchrun rank would then show at least its launcher's peak."""
    import os
    import subprocess
    import sys
    child = "from hybrid.metrics.peak_memory import peak_rss_bytes; print(peak_rss_bytes())"
    code = ("import os, subprocess, sys, torch\n"
            "from hybrid.metrics.peak_memory import peak_rss_bytes, peak_memory_bytes\n"
            "rss = int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
            "before = peak_rss_bytes()\n"
            "x = torch.ones(64 * 2**20)  # 256 MiB of float32, every page written\n"
            "after = peak_rss_bytes()\n"
            "y = torch.ones(256 * 2**20)  # 1 GiB more, held while the child runs\n"
            f"kid = int(subprocess.run([sys.executable, '-c', {child!r}], capture_output=True, text=True,"
            " check=True).stdout)\n"
            "print(rss, before, after, peak_memory_bytes(torch.device('cpu')), kid)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=root))
    rss, before, after, via_device, kid = map(int, out.stdout.split())
    mib256 = 256 * 2**20
    assert after >= rss + mib256 and before >= rss
    assert after <= max(before, rss) + mib256 + 32 * 2**20  # allocator and page-table slack
    assert via_device >= after + 4 * mib256  # the 1 GiB too
    assert kid < before + mib256  # the child imports torch as the parent did, and holds no tensor
