"""Round 19's outside mutation review of round 18's new code: one-line bugs planted on purpose in `hybrid plan`
without torch (cli SUBCOMMANDS, hybrid/lazy.py and the torch-free modules), the planner's LazyTape, the Triton
attention kernel and its fit, Workload.sp_copies / float8_tp_gathers, inputs18's fixes and the subjects of the
suite's cheaper tests; the area's fast tier run on each. Each test here kills a mutant that tier let live, shown
failing on the mutant and passing on HEAD. In-process (one fresh interpreter without torch), no process group.

The mutant ids (A5-commtype-attention, ...) are those of branch mutation19's report and of docs/architecture.md's
tally."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- A: hybrid plan without torch (hybrid/cp/__init__.py, models/config.py) ------------------------------------------
def test_the_packages_torch_free_names_load_no_torch():
    """`from hybrid.cp import CommType` and `from models import Recompute` are the torch-free enums (the planner's
    names): the package's lazy table must point CommType at hybrid.cp.comm_type, not at attention.py, which
    re-exports the same object but imports torch. A5-commtype-attention (_LAZY["CommType"] = "hybrid.cp.attention")
    lived through test_startup18_torch_free, test_cli_subcommands, test_inputs18_plan_inputs, test_calibrate,
    test_cp_planner and test_cp_attention (145 passed): the object is the same, only the import differs. A fresh
    interpreter that never loads torch: ~0.1 s of CPU on HEAD."""
    code = ("import sys\nfrom hybrid.cp import CommType\nfrom models import Recompute\n"
            "print(CommType.P2P.value, Recompute.FULL.value, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["p2p", "full", "False"]


def test_default_rope_reads_no_transformers_config():
    """A preset's default RoPE is computed from its own fields (theta^(-2i/d)); only a scaled RoPE asks
    transformers (ModelConfig.hf builds a preset's transformers config: imports transformers, ~1.2 s of CPU in
    each rank, what round 18's suite cuts took out of the ranks). F1-rope-reads-hf (rope_inv_freq testing
    `self.hf is not None` before the rope type) lived through test_cp_models, test_cp_memory and test_moe_convert,
    all tiers: their ranks' configs carry no preset name, so `hf` builds nothing there and their "no transformers
    in the ranks" assertions hold; a preset's run (train.py --model tiny-llama) imported transformers on every
    rank."""
    import torch

    from models import PRESETS
    cfg = dataclasses.replace(PRESETS["tiny-llama"], hf_config=None)
    assert cfg.name == "tiny-llama" and cfg.rope_type == "default"
    inv_freq, scale = cfg.rope_inv_freq()
    d = cfg.head_dim
    expected = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    assert torch.allclose(inv_freq.double(), expected, rtol=1e-6, atol=0) and scale == 1.0
    assert cfg.hf_config is None  # no transformers config was built for it


def test_powersgd_compresses_a_matrix_exactly_when_torchs_hook_does():
    """compress/volume.matrix_rank is torch's `_should_compress` (compress when (n + m) r x rate < n m, strictly)
    at r = min(n, m, rank), which the planner prices and the runtime sends. At the boundary (8 x 8 at r 2, rate 2:
    64 = 64) torch sends the matrix whole. A8-rank-le (`<=`) lived through test_compress_powersgd,
    test_compress_onebit, test_planner_slowlink*.py and test_compress_*.py (95 passed): their shapes never sit on
    the boundary."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    from hybrid.compress.volume import PowerSGDConfig, matrix_rank
    boundary = 0
    for rate in (1.0, 2.0, 3.0):
        for rank in (1, 2, 4):
            cfg = PowerSGDConfig(rank=rank, min_compression_rate=rate)
            for n in range(1, 13):
                for m in range(1, 13):
                    r = min(n, m, rank)
                    boundary += (n + m) * r * rate == n * m
                    assert (matrix_rank((n, m), cfg) > 0) == _should_compress(n, m, r, rate)[0], (n, m, rank, rate)
    assert boundary > 0  # the grid holds shapes on the boundary
