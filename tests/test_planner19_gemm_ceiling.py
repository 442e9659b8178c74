"""Round 19 (issue 26, planner19a): the H100 GEMM curve beyond XLA's table (hardware.LARGE_GEMM_FLOPS,
H100_LARGE_GEMM_RATIO) and the clocks refitted with it (docs/planner/round19-gemm-ceiling.md). The constants'
re-derivation from their fit rows is tests/test_planner_fit.py's; here the ceiling itself and the rows it targets
(four plans, ~1 s)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hybrid.planner.hardware import H100_LARGE_GEMM_RATIO, LARGE_GEMM_FLOPS, Gemm, hardware
from hybrid.planner.published18 import large_ratio, xla_largest


def test_the_ceiling_starts_where_xlas_table_stops_at_the_measured_ratio():
    """LARGE_GEMM_FLOPS is XLA's largest measured product (2 x 4096^3) and H100_LARGE_GEMM_RATIO the geometric mean
    of our H200's four larger products over the H100 curve (published18.h200_beyond: fitted to no training row)."""
    assert LARGE_GEMM_FLOPS == xla_largest()[0]
    assert H100_LARGE_GEMM_RATIO == pytest.approx(large_ratio("h100-80g"), abs=0.0005)


@pytest.mark.parametrize("card", ["h100-80g", "h100-96g-500w"])
def test_a_large_h100_gemm_takes_the_curve_seconds_over_the_ratio_a_small_one_the_curve(card):
    hw = hardware(card)
    bare = replace(hw, large_gemm_flops=None, large_gemm_ratio=1.0)
    big, edge = Gemm(2048, 12288, 12288), Gemm(4096, 4096, 4096)  # GPT-3's fc1 at t 4; XLA's largest, not beyond
    for fp8 in (False, True):
        assert hw.gemm_seconds(big, 2, fp8) == pytest.approx(bare.gemm_seconds(big, 2, fp8) / H100_LARGE_GEMM_RATIO)
        assert hw.gemm_seconds(edge, 2, fp8) == bare.gemm_seconds(edge, 2, fp8)


@pytest.mark.parametrize("card", ["h200", "a100-80g"])
def test_the_h200_and_the_a100_keep_their_curves(card):
    """The h200's curve was fitted on its own measured large products (no extrapolation to correct); the A100 has
    no per-shape table at all."""
    hw = hardware(card)
    assert hw.large_gemm_flops is None and hw.large_gemm_ratio == 1.0


def _row(name: str):
    from hybrid.planner.families import all_published_runs
    return next(r for r in all_published_runs() if r.name == name)


@pytest.mark.parametrize("name, error", [
    # since round 21 with fc1's bias gradient (ops._bias_grad_ops; before it +18.5 / +13.2 / +27.0 %)
    ("DGXC 24.11.1 GPT3-175B BF16, 2048 H100, t4 p8 v12, b1, GBS 4096", 0.183),  # +22.5 % without the ceiling
    # since round 23b with the FP8 weight gathers its YAML states (+12.8 % before; +16.2 % without the ceiling then)
    ("DGXC 25.04.01 GPT3-175B FP8, 2048 H100, t4 p8 v6, b1, GBS 4096", 0.142),
    # +30.7 %; +28.0 % before round 20's attention-dropout cost; +26.2 % before round 25's unfused Megatron loss
    ("Megatron-Core 1.7B, 48 H100, t1 p1 d48", 0.231),
])
def test_the_rows_it_targets(name, error):
    """GPT-3 175B at 2,048 H100 and Megatron-Core's weak scaling: the Megatron / TE stack, no clock, every linear
    beyond XLA's table. Fails if the ceiling is reverted (each row was 2.7-3.8 points more optimistic)."""
    run = _row(name)
    assert run.throughput_error(run.predict()) == pytest.approx(error, abs=0.003)


def test_explain_names_the_ceiling_on_h100_only(capsys):
    """`hybrid plan --explain`'s device line quotes the curve's asymptote; on an H100 it says large GEMMs run below
    it, on an A100 (no ceiling) it does not."""
    from hybrid.planner.cli import main
    for gpu, shown in (("h100-80g", True), ("a100-80g", False)):
        assert main(["--model", "gpt2", "--gpus", "8", "--gpu", gpu, "--global-batch-size", "16", "--seq-length",
                     "1024", "--explain"]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(f"  on {gpu}:"))
        assert ("x 0.959 beyond 1.37e+11 FLOPs" in line) is shown, line
