"""Round 21's new-user pass over docs/operations.md ("Restarts and a changed GPU count"): the elastic re-plan's
`--auto-parallel` on a CPU printed "auto-parallel: ... (predicted 0.002 s/step on cpu)" above the run's own
"planner: this layout on the cpu preset: no time (the cpu preset's rates are placeholders ...)": two lines of one
start-up disagreeing on whether the preset times anything. Now the auto-parallel line says its layout is ranked on
the placeholder rates, with the calibration that gives a time; a --hardware profile (or a GPU) keeps the time.
In-process: train.py's own checks (hybrid.train.main.validate) with a 2-rank launcher's environment.
"""

from __future__ import annotations

import importlib

import torch

from hybrid.train.args import auto_parallel_time


def test_auto_parallel_on_the_cpu_preset_times_nothing(monkeypatch, capsys):
    if torch.cuda.is_available():
        import pytest
        pytest.skip("a GPU plans on its preset's rates")
    for k, v in {"WORLD_SIZE": 2, "RANK": 0, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 2, "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": 29500}.items():
        monkeypatch.setenv(k, str(v))
    importlib.import_module("hybrid.train.main").validate(["--auto-parallel", "--global-batch-size", "8"])
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("auto-parallel: ")]
    assert "s/step" not in line and line.endswith(
        "(ranked on the cpu preset's placeholder rates, no time: `hybrid calibrate --out cpu.json`, then --hardware "
        "cpu.json)"), line


def test_a_profile_keeps_the_predicted_step():
    assert auto_parallel_time(0.0123, "vm", placeholder=False) == "predicted 0.0123 s/step on vm"
