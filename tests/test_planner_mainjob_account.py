"""scripts/bench_planner_mainjob.py --account: the per rank per phase CPU seconds it reports are the step's (not
what runs between steps), and its table adds them up (no launch: a Trail driven by hand)."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import bench_planner_mainjob as bench  # noqa: E402
from hybrid import trail  # noqa: E402


def busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_step_phases_count_cpu_seconds_and_leave_out_warmup_and_between(tmp_path, monkeypatch):
    from hybrid.zero.engine import ZeroOptimizer
    for name in ("_switch", "begin_iteration", "take_phase_seconds"):  # restored after the test
        monkeypatch.setattr(trail.Trail, name, getattr(trail.Trail, name))
    monkeypatch.setattr(ZeroOptimizer, "finish_backward", ZeroOptimizer.finish_backward)
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


def test_the_components_split_a_models_forward_and_backward_into_its_parts(tmp_path, monkeypatch):
    """install_components on a whole tiny GPT-2 (one rank, in process): embedding, layers and head-and-loss each
    get CPU in both passes, and the parts add up to the model's forward and to the backward (the hooks split one
    clock); nothing is counted at or before the warm-up iteration."""
    import torch

    from hybrid.comm import Group
    from hybrid.pipeline import executor
    from hybrid.tp import TPContext
    from models import PRESETS, gpt2
    monkeypatch.setattr(trail.Trail, "_switch", trail.Trail._switch)
    for cls, name in ((gpt2.GPT2, "forward"), (gpt2.GPT2, "embed"), (gpt2.GPT2Block, "forward")):
        monkeypatch.setattr(cls, name, getattr(cls, name))
    monkeypatch.setattr(executor, "_backward", executor._backward)
    monkeypatch.setattr(trail.TRAIL, "iteration", 1)
    dump = bench.install_components(str(tmp_path), warmup=1)
    torch.manual_seed(0)
    model = gpt2.GPT2(PRESETS["tiny-gpt2"], TPContext(Group.solo("tp")))
    ids = torch.randint(0, 256, (2, 32))
    executor._backward(model(ids, ids), None)  # iteration 1: warm-up, not counted
    monkeypatch.setattr(trail.TRAIL, "iteration", 2)
    for _ in range(3):
        executor._backward(model(ids, ids), None)
    dump()
    d = json.loads((tmp_path / "components0.json").read_text())
    parts = bench.COMPONENTS[:6]
    assert all(d[k] > 0 for k in parts), d
    assert d["embedding forward"] + d["layers forward"] + d["head and loss forward"] == \
        pytest.approx(d["model forward"], rel=1e-9)
    bwd = d["head and loss backward"] + d["layers backward"] + d["embedding backward"]
    assert bwd == pytest.approx(d["model backward"], rel=1e-9)
    assert d["layers forward"] > d["embedding forward"]  # four layers against one table lookup
