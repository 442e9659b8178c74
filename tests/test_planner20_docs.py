"""Issue 26, round 20 (planner20b): docs/planner/round20-fsdp2-tp.md holds what `python -m hybrid.planner.published20`
prints, and the module's what-ifs reach no plan after their blocks."""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_page_holds_every_line_the_module_prints():
    """The async-TP speed-ups, the CP rows' ring steps and the H200 FP8 what-if, line for line (regenerate: python -m
    hybrid.planner.published20)."""
    from hybrid.planner.published20 import report
    with open(os.path.join(ROOT, "docs", "planner", "round20-fsdp2-tp.md")) as f:
        page = f.read()
    for line in report().splitlines():
        assert line in page, line


def test_the_pooled_rule_is_a_what_if_undone_on_leaving():
    """Inside pooled_async_tp the 8B async row is priced by the pooled rule (+26.2 %, rounds 14-19), outside by the
    fused ops (+11.4 %): the block restores async_tp.seconds."""
    import pytest

    from hybrid.planner import async_tp
    from hybrid.planner.published14 import async_tp_runs
    from hybrid.planner.published20 import pooled_async_tp
    run = next(r for r in async_tp_runs() if r.workload.tp_comm_overlap and "8B" in r.name and not r.workload.fp8)
    fused = async_tp.seconds
    with pooled_async_tp():
        assert run.throughput_error(run.predict()) == pytest.approx(0.262, abs=0.002)
    assert async_tp.seconds is fused
    assert run.throughput_error(run.predict()) == pytest.approx(0.114, abs=0.002)
