"""scripts/bench_planner_mainjob.py --account (round 24): the gradients' end-of-backward work
(ZeroOptimizer.finish_backward) is counted in the "optimizer" phase, where the planner prices it (calibrate's
optimizer probe times it), not in whichever phase the executor's last action left -- "backward" on the main job's
first stage, where round 23-24's accounts read it as "executor backward" (no launch: a Trail driven by hand)."""

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


def test_finish_backward_counts_in_the_optimizer_phase_not_the_backward(tmp_path, monkeypatch):
    """A first-stage step: its last backward action (10 ms of CPU), then train_step's finish_backward (30 ms) with
    no phase of its own: the account puts 10 ms in "backward" and 30 in "optimizer"."""
    from hybrid.zero.engine import ZeroOptimizer
    for name in ("_switch", "begin_iteration", "take_phase_seconds"):  # restored after the test
        monkeypatch.setattr(trail.Trail, name, getattr(trail.Trail, name))
    monkeypatch.setattr(ZeroOptimizer, "finish_backward", lambda self, *a, **kw: busy(0.03))
    monkeypatch.setattr(trail, "TRAIL", trail.Trail())
    monkeypatch.setenv("RANK", "0")
    dump = bench.install_accounting(str(tmp_path), warmup=0)
    t = trail.TRAIL
    t.begin_iteration(1)
    t.enter("backward")
    busy(0.01)
    ZeroOptimizer.finish_backward(object())
    t.take_phase_seconds()
    dump()
    phases = json.loads((tmp_path / "rank0.json").read_text())["phases"]
    assert 0.008 <= phases["backward"]["cpu"] < 0.02
    assert 0.028 <= phases["optimizer"]["cpu"] < 0.04
