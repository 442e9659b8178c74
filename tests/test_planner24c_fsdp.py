"""Round 24 (planner24c): KempnerForge's 70B at 8 H200 planned as its pre-flight log ran it, and IBM's stated
cluster links as a what-if (hybrid/planner/published24c_fsdp.py, docs/planner/round24-fsdp-extremes.md)."""

from __future__ import annotations

import contextlib
import io
import os
import statistics

import pytest

from hybrid.planner import published24c_fsdp as r24
from hybrid.planner.ops import KernelProfile
from hybrid.planner.published15 import KEMPNER_WEAK_ROWS, kempner_weak_setting
from hybrid.planner.published_more import evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_log_is_the_readme_row():
    """The README's 70B 8-GPU point (3,623 tok/s, 18.09 s) is the median of the pre-flight log's steps 16-30, and
    its tokens a step are the log's b1 x 8 x 4096 x DP 2 (as many as the driver's b2 x 4: the log alone tells
    them apart)."""
    size, gpus, tok, mem, step = next(row for row in KEMPNER_WEAK_ROWS if row[:2] == ("70B", 8))
    steps = r24.back_half(r24.PREFLIGHT_70B_STEPS)
    assert len(r24.PREFLIGHT_70B_STEPS) == 30 and len(steps) == 15
    assert statistics.median(steps) == step == 18.09
    b, accum, compiled = kempner_weak_setting(size, gpus)
    assert (b, accum, compiled) == (1, 8, False)
    assert tok * step == pytest.approx(b * accum * 4096 * gpus // 4, rel=0.01)


def test_the_70b_row_is_planned_as_logged_and_the_driver_plan_misses():
    """The row module plans b1 x 8 eager (fails if published15's KEMPNER_WEAK_AS_LOGGED is reverted: the row is
    +60.0 % as the driver's b2 x 4 + compile); at b1 the FSDP gathers over the 2-node ring are no longer hidden."""
    driver, logged = r24.kempner_70b_rows()
    assert logged.space.micro_batch == (1,) and logged.workload.kernel_profile is KernelProfile.EAGER
    assert logged.workload.global_batch == driver.workload.global_batch == 16
    d, g = evaluate(driver), evaluate(logged)
    assert d.error == pytest.approx(0.600, abs=0.005)
    assert g.error == pytest.approx(0.175, abs=0.005)
    assert dict(g.plan.time.terms)["dp_in_passes"] > 2.0 > 0.1 > dict(d.plan.time.terms)["dp_in_passes"]


def test_ibm_link_what_if_is_not_landed():
    """The post's node links (6.25 / 12.5 GB/s a GPU) bring fms-fsdp's 13B in (+16.7 -> -5.5 %) and move all seven
    IBM rows negative; the shipped rows keep the presets' links (what-if only)."""
    shipped, stated = r24.ibm_network_what_if()
    assert all(r.run.inter_node_gbps is None for r in shipped)
    assert [r24.stated_link(r.run) for r in shipped] == [6.25] * 4 + [12.5] * 3
    thirteen = [(a.error, b.error) for a, b in zip(shipped, stated) if "13B" in a.run.name]
    assert thirteen == [(pytest.approx(0.167, abs=0.002), pytest.approx(-0.055, abs=0.002))]
    assert all(-0.15 < b.error < 0 for b in stated)


def test_docs_hold_what_the_module_prints():
    """docs/planner/round24-fsdp-extremes.md holds every line `python -m hybrid.planner.published24c_fsdp` prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        r24.main()
    with open(os.path.join(ROOT, "docs", "planner", "round24-fsdp-extremes.md")) as f:
        docs = f.read()
    for line in out.getvalue().splitlines():
        assert line in docs, line
