"""docs/planner.md "How accurate is it" quotes the first two tables `python -m hybrid.planner.families` prints (the
published rows by family and card, then by issue 26's held-out kinds): recomputed here, so the guide's accuracy
claim moves with the planner's physics or the test fails (~10 s of CPU: every published row planned once)."""

from __future__ import annotations

from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "planner.md"


@pytest.mark.slow
def test_guide_accuracy_tables_are_the_families_report():
    from hybrid.planner.families import all_rows, family_table, slice_table
    text = GUIDE.read_text()
    section = text.split("\n## How accurate is it\n")[1].split("\n## ")[0]
    rows = all_rows()
    # each table whole (header to last row, in order), not line by line: a row dropped or reordered fails too
    assert family_table(rows) + "\n\n" + slice_table(rows) + "\n" in section
