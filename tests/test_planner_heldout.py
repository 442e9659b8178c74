"""Held-out discipline (issue 26: "fit on some rows, check on others"), hybrid/planner/heldout.py: every fitted
constant of the time model is set by the FIT rows that name it -- one row each, but the H100's eager clock and the
Triton kernel's share, fitted on MosaicML's rows (18 and 16) -- and fit.py re-derives it from those rows;
every other row only checks; the error summary is computed from the rows (the docs' copy of it is checked in
tests/test_planner_published.py, where the published runs' plans are already cached); our H200's and this CPU's
rows are what their recorded files hold."""

from __future__ import annotations

import importlib
import re

import pytest

from hybrid.planner import fit, heldout
from hybrid.planner.heldout import CPU, H200, Kind, Row, cpu_rows, h200_rows, summary_table
from hybrid.planner.published import Role, all_runs

HARDWARE = importlib.import_module("hybrid.planner.hardware")  # the module; the package exports a function


@pytest.fixture(scope="module")
def h200():
    return h200_rows()


def _fit_rows(h200_rows_):
    return [(r.name, r.fits) for r in all_runs() if r.role is Role.FIT] + \
           [(r.name, r.fits) for r in h200_rows_ if r.role is Role.FIT]


def test_each_fitted_constant_has_its_fit_rows_that_name_its_fit_function(h200):
    """The constants fit.py re-derives are exactly those the FIT rows name, one row each but H100_EAGER_CLOCK and
    TRITON_FLASH2_SHARE (MosaicML's rows, published.mpt_fits: fit.mpt_h100_fit_runs, fit.triton_share_fit_runs),
    and each is a constant hardware.py ships; no CHECK
    row names a constant."""
    named: dict[str, list[str]] = {}
    for name, fits in _fit_rows(h200):
        constant, function = re.fullmatch(r"(\w+) \(fit\.(\w+)\)", fits).groups()
        named.setdefault(constant, []).append(name)
        assert getattr(fit, function) is fit.FITS[constant]
        assert hasattr(HARDWARE, constant)
    assert set(named) == set(fit.FITS)
    several = {c: rows for c, rows in named.items() if len(rows) > 1}
    assert set(several) == {"H100_EAGER_CLOCK", "TRITON_FLASH2_SHARE"}
    # published.py's rows of each; the rest of its fit rows are published_more.py's (fit.fit_runs reads every module)
    assert len(several["H100_EAGER_CLOCK"]) == 12 and len(several["TRITON_FLASH2_SHARE"]) == 3
    assert set(several["H100_EAGER_CLOCK"]) < {r.name for r in fit.mpt_h100_fit_runs()}
    assert set(several["TRITON_FLASH2_SHARE"]) < {r.name for r in fit.triton_share_fit_runs()}
    assert all(not r.fits for r in all_runs() + h200 if r.role is Role.CHECK)


def test_h200_rows_are_the_recorded_runs(h200):
    """Run 3's forward + backward is the fit row (error 0 by construction); train.py's three steps check within
    10 %; the optimizer and the probe layers are parts, not in the step summary."""
    fit_row, *rest = h200
    assert fit_row.role is Role.FIT and fit_row.error == pytest.approx(0.0, abs=0.01)
    assert fit_row.measured == fit.H200_RUN3_FORWARD_BACKWARD_S
    steps = [r for r in rest if r.kind is Kind.STEP]
    assert [r.measured for r in steps] == pytest.approx([0.7259, 0.7930, 0.6004], abs=5e-4)
    assert all(r.role is Role.CHECK and abs(r.error) <= 0.10 for r in steps)
    parts = [r for r in rest if r.kind is Kind.PART]
    assert len(parts) == 5 and parts[0].measured == pytest.approx(0.03559, abs=1e-5)  # the optimizer step


def test_cpu_rows_are_the_ranking_runs_17_layouts_with_its_ratio():
    """The results file's 'measured / predicted' column is 1 + the row's error."""
    rows = cpu_rows()
    assert len(rows) == 17 and all(r.source == CPU and r.role is Role.CHECK for r in rows)
    text = heldout.CPU_RANKING.read_text()
    for r in rows:
        layout = r.name.split(", ", 1)[1]
        ratio = re.search(rf"^\| {re.escape(layout)} \| [0-9.]+ \| [0-9.]+ \| \d+ % \| ([0-9.]+) \|", text, re.M)
        assert 1 + r.error == pytest.approx(float(ratio.group(1)), abs=0.006)


def _row(source, error, role=Role.CHECK, kind=Kind.STEP, fits=""):
    return Row(source, "x", role, fits, "s", 1.0, 1.0 + error, error, kind)


def test_summary_reports_check_rows_apart_from_fit_rows_with_signed_mean_and_spread():
    """Hand-counted: the fit row's zero error is not averaged in; errors of both signs give a signed mean, the
    median of |error| and the spread; parts are counted apart and not averaged."""
    rows = [_row(H200, 0.0, Role.FIT, fits="KERNEL_OVERHEAD_S (fit.fit_kernel_overhead)"), _row(H200, -0.10),
            _row(H200, 0.04), _row(H200, 0.20), _row(CPU, 0.02), _row(H200, 3.0, kind=Kind.PART)]
    lines = summary_table(rows).splitlines()
    h200_line = next(line for line in lines if line.startswith(f"| {H200} "))
    assert h200_line == (f"| {H200} | 1 (KERNEL_OVERHEAD_S) | 3 | +4.7 % | 10.0 % | -10.0 % to +20.0 % | 1 / 2 | "
                         "2 of 3 |")
    everything = next(line for line in lines if "all check rows" in line)
    assert "| 4 | +4.0 % | 7.0 % | -10.0 % to +20.0 % | 1 / 3 | 3 of 4 |" in everything
    parts = next(line for line in lines if line.startswith("| parts"))
    assert parts.endswith("| 0 | 1 | - | - | +300.0 % to +300.0 % | 0 / 1 | 0 of 1 |")


def test_main_job_row_is_its_recorded_prediction_against_the_median_interval():
    """step_split.md: planned 0.224 s, measured 0.294 / 0.298 / 0.294 s over three intervals (median 0.294): the
    planner is optimistic by 0.294 / 0.224 - 1 = 31 %, a check row outside ±15 % that the summary counts."""
    (row,) = heldout.main_job_rows()
    assert (row.predicted, row.measured, row.role) == (0.224, 0.294, Role.CHECK)
    assert row.error == pytest.approx(0.294 / 0.224 - 1)
