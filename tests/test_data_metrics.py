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
