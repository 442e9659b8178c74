"""scripts/bench_planner_mainjob.py --account: the per rank per phase CPU seconds it reports are the step's (not
what runs between steps), and its table adds them up (no launch: a Trail driven by hand)."""

from __future__ import annotations

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import bench_planner_mainjob as bench  # noqa: E402
from hybrid import trail  # noqa: E402


def busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_step_phases_count_cpu_seconds_and_leave_out_warmup_and_between(tmp_path, monkeypatch):
    for name in ("_switch", "begin_iteration", "take_phase_seconds"):  # restored after the test
        monkeypatch.setattr(trail.Trail, name, getattr(trail.Trail, name))
    monkeypatch.setenv("RANK", "0")
    dump = bench.install_accounting(str(tmp_path), warmup=1)
    t = trail.Trail()
    for it in (1, 2, 3):
        t.begin_iteration(it)
        t.enter("forward")
        busy(0.02)
        t.enter("comm")
        time.sleep(0.03)  # blocked: wall, no CPU
        t.take_phase_seconds()
        busy(0.02)  # between steps (logging): not the step's
    dump()
    row = json.loads((tmp_path / "rank0.json").read_text())
    assert row["iterations"] == 2  # iteration 1 is warm-up
    fwd, comm = row["phases"]["forward"], row["phases"]["comm"]
    assert 0.04 <= fwd["cpu"] < 0.06 and fwd["thread_cpu"] <= fwd["cpu"] + 1e-3
    assert comm["wall"] >= 0.06 and comm["cpu"] < 0.01
    assert 0.015 <= row["phases"]["between"]["cpu"] < 0.03  # iteration 2 -> 3 (1 -> 2 is warm-up)
    rows = bench.read_account(str(tmp_path), 1)
    assert abs(rows[0]["forward"]["cpu"] - fwd["cpu"] / 2) < 1e-12
    table = bench.account_table(rows, 2)
    step = sum(rows[0][ph]["cpu"] for ph in bench.PHASES) * 1e3
    assert f"**{step:.1f}** (/ 2 cores: {step / 2:.1f})" in table[-1]
