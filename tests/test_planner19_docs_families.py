"""docs/planner.md "How accurate is it" quotes the first two tables `python -m hybrid.planner.families` prints (the
published rows by family and card, then by issue 26's held-out kinds): recomputed here, so the guide's accuracy
claim moves with the planner's physics or the test fails. And the guide's picture of every published row
(scripts/plot_planner_accuracy.py, round 22; its made-up-row and other plots: tests/test_pictures22.py) draws what
that report counts.

Both plan every published row. They share one module so that the first planning's schedule simulations, which
hybrid/planner/schedule.py caches per schedule shape (104 pipeline tapes: ~10 of a cold planning's ~12 s of CPU),
serve the second: the plot's planning (plot.collect, a module fixture) runs cold once, the guide's all_rows() then
takes ~1 s -- in two files on two workers each paid the cold planning."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_pictures22 import _families_counts, _png, _script

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "planner.md"


@pytest.fixture(scope="module")
def points() -> list:
    """Every published row planned as the plot plans it (families.all_rows()'s runs, with their published
    throughput): once for the module."""
    return _script("plot_planner_accuracy").collect()


@pytest.mark.slow  # plans every published row (the module fixture): ~12 s of CPU
def test_planner_plot_of_every_published_row_is_families_report(points, tmp_path):
    plot = _script("plot_planner_accuracy")
    counts = plot.draw(points, str(tmp_path / "acc.png"))
    rows = [p.row for p in points]
    want = _families_counts(rows)
    assert _png(tmp_path / "acc.png") and os.path.getsize(tmp_path / "acc.png") < 150_000
    assert counts["points"] == want["planned"] and counts["rejected"] == len(rows) - want["planned"]
    assert counts["within_band"] == sum(abs(r.error) <= 0.15 for r in rows if r.error is not None)
    assert (counts["check_points"], counts["check_within_band"]) == (want["check_planned"], want["check_within"])
    assert f"{100 * counts['median_abs']:.1f} %" == want["median"]
    assert f"{100 * counts['signed_mean']:+.1f} %" == want["mean"]
    # the rows are families.all_rows()'s (the test below holds the two equal): docs/planner.md's "all families"
    # line, which the test below holds equal to families' report, is theirs
    from hybrid.planner.families import stats
    guide = GUIDE.read_text()
    assert f"| **all families** | all | {stats(rows)} |" in guide
    checks, fits = (int(c) for c in stats(rows).split(" | ")[:2])
    assert checks + fits == len(points)


@pytest.mark.slow  # every published row planned (at ~1 s after the plot's planning; ~12 s alone)
def test_guide_accuracy_tables_are_the_families_report(points):
    from hybrid.planner.families import all_rows, family_table, slice_table
    text = GUIDE.read_text()
    section = text.split("\n## How accurate is it\n")[1].split("\n## ")[0]
    rows = all_rows()
    assert rows == [p.row for p in points]  # the plot draws the rows the report counts, row for row
    # each table whole (header to last row, in order), not line by line: a row dropped or reordered fails too
    assert family_table(rows) + "\n\n" + slice_table(rows) + "\n" in section
