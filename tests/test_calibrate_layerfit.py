"""calibrate's layer fit is well-posed (issue 26, round 11): timing noise moves the fixed cost per layer pass and the
memory-bound rate by no more than the bounds its least squares gives, computed here from the probe's shapes --
where the exact two-shape solve it replaced amplified the same noise many times over."""

from __future__ import annotations

import dataclasses
import functools
import itertools

import pytest

from hybrid.planner import calibrate as C
from hybrid.planner import hardware

# this VM's fits (docs/results/bench_planner_mainjob.md, round 11): the fp32 GEMM curve, the rate and the costs
RATE, CF, CB, NOISE = 4.2e9, 0.135e-3, 0.375e-3, 0.05
HW = hardware("cpu").with_overrides(peak_tflops=0.096, compute_efficiency=1.0, gemm_overhead_s=0.0)
OLD_PROBE = dataclasses.replace(C.CPU_PROBE, shapes=((4, 128, 384, 6), (1, 32, 384, 6)), pass_shape=None)


@pytest.fixture(autouse=True)
def cached_parts(monkeypatch):
    """The planner's parts of a probe layer once per shape (the fits call it on every solve)."""
    monkeypatch.setattr(C, "layer_parts_of", functools.cache(C.layer_parts_of))


def synthetic(shape, probe=C.CPU_PROBE) -> tuple[float, float]:
    p = C.layer_parts_of(HW, shape, probe)
    return p.forward_s + p.forward_bytes / RATE + CF, p.backward_s + p.backward_bytes / RATE + CB


def noisy(times: list[tuple[float, float]], signs) -> list[tuple[float, float]]:
    e = iter(signs)
    return [(f * (1 + NOISE * next(e)), b * (1 + NOISE * next(e))) for f, b in times]


def bounds() -> tuple[float, float, float]:
    """The fit's worst move under NOISE on every timed second, from fit_layer's least squares: with
    d = NOISE x t on each time, u = 1 / rate moves by at most sum |x - x0| (d + d0) / sum (x - x0)^2 over the rate
    layers' passes (x their bytes, x0 the pass layer's of the same pass) and a pass's fixed cost by d0 + x0 |du|.
    Returns (|du| u-relative, forward cost relative, backward cost relative)."""
    p0 = C.layer_parts_of(HW, C.CPU_PROBE.pass_shape)
    t0 = synthetic(C.CPU_PROBE.pass_shape)
    x0 = (p0.forward_bytes, p0.backward_bytes)
    num = den = 0.0
    for shape in C.CPU_PROBE.shapes:
        p, t = C.layer_parts_of(HW, shape), synthetic(shape)
        for i, x in enumerate((p.forward_bytes, p.backward_bytes)):
            num += abs(x - x0[i]) * NOISE * (t[i] + t0[i])
            den += (x - x0[i]) ** 2
    du = num / den
    return du * RATE, (NOISE * t0[0] + x0[0] * du) / CF, (NOISE * t0[1] + x0[1] * du) / CB


def test_five_percent_noise_moves_the_fit_within_its_computed_bounds():
    """Every sign pattern of +-5 % on the six timed seconds (two rate layers and the pass layer, forward and
    backward): the rate's 1 / rate within the bound (13.2 % here, attained), each fixed cost within its bound (5.2 %:
    the pass layer is timed, not solved for, so its noise passes through ~1:1), never clamped at 0."""
    du, bf, bb = bounds()
    assert du < 0.15 and bf < 0.06 and bb < 0.06  # what the shapes give; a regression in the probe shows here
    times = [synthetic(s) for s in C.CPU_PROBE.shapes] + [synthetic(C.CPU_PROBE.pass_shape)]
    for signs in itertools.product((-1, 1), repeat=6):
        *layers, per_pass = noisy(times, signs)
        rate, f, b = C.fit_layer(HW, layers, per_pass)
        assert abs(RATE / rate - 1) <= du * (1 + 1e-9)
        assert abs(f / CF - 1) <= bf * (1 + 1e-9) and abs(b / CB - 1) <= bb * (1 + 1e-9)


def test_the_replaced_two_shape_solve_amplified_the_same_noise():
    """The round-10 fit (two_shape_solve on (4, 128, 384, 6) and (1, 32, 384, 6)) on layers built from the same
    rate and costs: exact without noise, but +-5 % moves a fixed cost by over 100 % (to 0 or several times its
    value): more than ten times the new fit's bound -- the 0-4 ms swing of the quiet calibrations."""
    layers = [synthetic(s, OLD_PROBE) for s in OLD_PROBE.shapes]
    rate, f, b = C.two_shape_solve(HW, layers, OLD_PROBE)
    assert rate == pytest.approx(RATE) and f == pytest.approx(CF) and b == pytest.approx(CB)
    worst = max(max(abs(f / CF - 1), abs(b / CB - 1))
                for _, f, b in (C.two_shape_solve(HW, noisy(layers, s), OLD_PROBE)
                                for s in itertools.product((-1, 1), repeat=4)))
    assert worst > 1.0 and worst > 10 * max(bounds()[1:])
