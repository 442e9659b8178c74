"""Elastic re-plan after a stop.

(Not here yet: a worker SIGKILLed under `torchrun --max-restarts 2`. torchrun restarts the workers, but the
restarted process group fails in init (gloo connectFullMesh: connection refused), which a plain torch script on
the same launcher does not do; until that is found, in-place restarts are not claimed -- docs/operations.md.)

* Elastic: a run saved on 8 ranks (tp2 x pp2 x dp2) and restarted on 4 with --auto-parallel re-plans the layout,
  reshards the checkpoint and continues with the same global batch and data order: its losses stay within fp32
  reduction noise of the uninterrupted 8-rank run (another summation order; the bound is derived below).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from hybrid.testing import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ["--global-batch-size", "8", "--seq-length", "32", "--log-interval", "1", "--lr", "3e-3"]
MICRO = ["--micro-batch-size", "2"]  # --auto-parallel picks its own


def _torchrun(nproc: int, flags: list[str], env: dict | None = None, restarts: int = 0) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--max-restarts",
           str(restarts), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{free_port()}", "-m",
           "hybrid.train", *COMMON, *flags]
    full_env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", **(env or {}))
    if "HYBRID_FAULT" not in (env or {}):
        full_env.pop("HYBRID_FAULT", None)
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=600)


def _losses(out: str) -> dict[int, list[str]]:
    """iteration -> every loss printed for it (a resumed job prints the re-run iterations again)."""
    found: dict[int, list[str]] = {}
    for it, loss in re.findall(r"iteration +(\d+)/\d+ \| lm loss (\S+)", out):
        found.setdefault(int(it), []).append(loss)
    return found


def test_a_run_restarted_on_fewer_ranks_re_plans_reshards_and_continues(tmp_path):
    """8 ranks for 4 iterations, saved; then 4 ranks with --auto-parallel load it and run iterations 5-8.
    Bound: the loss is a mean over the global batch; another layout sums the same terms in another order
    (dp 2 -> another dp, other TP partial sums), each float32 sum off by <= n * 2^-24 relative with n the
    number of addends folded together (here <= 64 per reduction), through 4 steps of AdamW whose early steps
    are sign-like -- measured 1e-5 here as in tests/test_parallel_adamw.py; we allow 1e-4 relative on the loss."""
    save = str(tmp_path / "ckpt")
    layout = MICRO + ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]
    straight = _torchrun(8, layout + ["--train-iters", "8"])
    assert straight.returncode == 0, straight.stderr[-3000:]
    first = _torchrun(8, layout + ["--train-iters", "8", "--save", save, "--exit-interval", "4"])
    assert first.returncode == 0, first.stderr[-3000:]
    second = _torchrun(4, ["--auto-parallel", "--train-iters", "8", "--load", save, "--save", save])
    assert second.returncode == 0, second.stderr[-3000:]
    want, got = _losses(straight.stdout), _losses(second.stdout)
    assert sorted(got) == [5, 6, 7, 8], got
    for it in got:
        assert float(got[it][0]) == pytest.approx(float(want[it][0]), rel=1e-4), (it, got[it], want[it])
