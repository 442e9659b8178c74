"""`hybrid plan` and the planner read models, hardware profiles and the byte formulas without importing torch (round
18): the runtime costs ~3 s of CPU to import (more under load) and the planner needs none of it. What made that
possible, each checked here:

* `hybrid` imports only the module of the sub-command named first (hybrid/cli.py SUBCOMMANDS);
* models/ and hybrid.cp import their torch modules on first use of a name (PEP 562), the configs, the
  recomputation enum (models/recompute.py) and --cp-comm-type (hybrid/cp/comm_type.py) have no torch;
* the bytes the planner prices come from torch-free modules the runtime re-exports (hybrid/cp/volume.py,
  hybrid/compress/volume.py), and the profile loader is hybrid/planner/profile.py, calibrate.py the measuring.

The subprocess tests fail if any of these imports torch again (a new module-level `import torch` on the path)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN = ["plan", "--model", "llama-3-8b", "--gpus", "16", "--gpu", "h100-80g", "--global-batch-size", "256",
        "--seq-length", "4096", "--context-parallel-size", "1,2", "--top", "2"]


def _fresh(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)


def test_hybrid_plan_runs_a_search_without_importing_torch():
    r = _fresh("import sys\nfrom hybrid.cli import main\nmain(%r)\n"
               "print('TORCH', sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))" % PLAN)
    assert r.returncode == 0, r.stderr
    assert "tp " in r.stdout or "layout" in r.stdout, r.stdout  # a ranked plan was printed
    assert r.stdout.rstrip().endswith("TORCH []"), r.stdout[-500:]


def test_the_planner_and_its_profile_loader_import_no_torch(tmp_path):
    r = _fresh("import sys\nimport hybrid.planner.cli, hybrid.planner.profile, hybrid.planner.slowlink, "
               "hybrid.planner.context, models.presets, hybrid.cp.comm_type\n"
               "print('torch' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_another_subcommand_still_registers_every_command_for_help():
    from hybrid.cli import SUBCOMMANDS, build_parser
    commands = {c for cs in SUBCOMMANDS.values() for c in cs}
    full = build_parser([])._subparsers._group_actions[0].choices
    assert commands <= set(full)
    only_plan = build_parser(["plan"])._subparsers._group_actions[0].choices
    assert set(only_plan) == {"layout", "models", "plan", "calibrate"}


@pytest.mark.parametrize("package, name, module", [
    ("models", "GPT2", "models.gpt2"), ("models", "Llama", "models.llama"), ("models", "StageLayout", "models.common"),
    ("models", "set_recompute", "models.common"), ("models", "shift_labels", "models.common"),
    ("models", "Recompute", "models.recompute"), ("hybrid.cp", "CommType", "hybrid.cp.comm_type"),
    ("hybrid.cp", "CPContext", "hybrid.cp.attention"), ("hybrid.cp", "ring_attention", "hybrid.cp.ring"),
    ("hybrid.cp", "shard", "hybrid.cp.balance"), ("hybrid.cp", "AttentionMask", "hybrid.cp.masks")])
def test_a_lazy_name_is_the_defining_modules_object(package, name, module):
    assert getattr(importlib.import_module(package), name) is getattr(importlib.import_module(module), name)


def test_the_runtime_modules_reexport_the_torch_free_formulas():
    from hybrid.compress import onebit, powersgd, volume
    from hybrid.cp import ring
    from hybrid.cp import volume as cp_volume
    from hybrid.planner import calibrate, profile
    from models import common, recompute
    assert ring.ring_bytes is cp_volume.ring_bytes
    assert powersgd.PowerSGDConfig is volume.PowerSGDConfig and powersgd.matrix_rank is volume.matrix_rank
    assert onebit.padded_length is volume.padded_length
    assert calibrate.load_hardware is profile.load_hardware and calibrate.FORMAT == profile.FORMAT
    assert tuple(calibrate.DTYPES) == profile.DTYPE_NAMES  # the rates a profile holds = the dtypes measured
    assert common.Recompute is recompute.Recompute
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        importlib.import_module("models").nope  # noqa: B018
