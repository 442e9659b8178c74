"""Compressor checkpoints of the first layout (per rank, per bucket: `compress/<rank>/counters`, `error.<i>`,
`q.<i>` / `worker_error.<i>`, `server_error.<i>`; before the state was keyed by parameter) used to load with fresh
compressor state, silently: state.json held no `compress/` value, so they looked saved without compression.
hybrid/compress/state.py's detect_first_layout has them mapped (at the layout they were saved at) or refuses
another layout by name.

The old checkpoint is built here: a run saved after step 4 (compressing since step 3) is loaded by train.py's own
objects and saved again with an owner that writes the first layout exactly as that code did (its state_dict, from
git history: hybrid/compress/reduction.py before 9f76cea). Resuming from it gives the uninterrupted run's losses
bit for bit; the same resume with the guard's detection off (the old behaviour: fresh state) does not -- the test's
teeth."""

from __future__ import annotations

import json
import os

import pytest
import torch

from hybrid import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ["--global-batch-size", "8", "--seq-length", "32", "--micro-batch-size", "2", "--log-interval", "1",
          "--lr", "3e-3", "--train-iters", "6", "--zero-stage", "0",
          "--eval-iters", "1"]  # end-of-run validation and test: one batch each (none read)
METHODS = {"powersgd": ["--powersgd-rank", "2", "--powersgd-start-iter", "2"],
           "onebit": ["--optimizer", "onebit-adam", "--onebit-freeze-iters", "2"]}


class FirstLayoutPowerSGD:
    """PowerSGDReduction.state_dict of the first layout (owner prefix compress/<global rank>/)."""

    def __init__(self, red):
        self.red = red

    def state_dict(self):
        red, s = self.red, self.red.state
        out = {"counters": torch.tensor([s.iter, s.draws, *red.layout], dtype=torch.int64)}
        for i, (ne, _, nq) in red.sizes.items():
            out[f"error.{i}"] = s.error[i] if i in s.error else torch.zeros(ne, dtype=red.dtype)
            out[f"q.{i}"] = s.q[i] if i in s.q else torch.zeros(nq, dtype=red.dtype)
        return out


class FirstLayoutOneBit:
    """OneBitAdamReduction.state_dict of the first layout."""

    def __init__(self, red):
        self.red = red

    def state_dict(self):
        red = self.red
        out = {"counters": torch.tensor([red.iter, *red.layout], dtype=torch.int64)}
        for i in red.worker:
            out[f"worker_error.{i}"], out[f"server_error.{i}"] = red.worker[i], red.server[i]
        return out


def _rewrite_first_layout(rank: int, world: int, flags: list[str], load: str, save: str) -> None:
    """train.py's start-up, the resume from `load`, then a save at `save` whose compressor state is written in
    the first layout."""
    import torch.distributed as dist
    from hybrid.checkpoint.run import RunCheckpoints
    from hybrid.compress.reduction import PowerSGDReduction, build, owners
    from hybrid.mesh import Mesh
    from hybrid.tp import ParallelRNG, TPContext
    from hybrid.train.args import parse_args, run_config
    from hybrid.train.loop import build_runner, run_info
    from hybrid.zero import ZeroOptimizer
    run = run_config(parse_args(COMMON + flags + ["--load", load, "--ckpt-step", "4", "--save", save]), world)
    mesh = Mesh.build(run.parallel.dims)
    tp = TPContext(mesh.tp, rng=ParallelRNG(run.training.seed, mesh.coords.tp, mesh.coords.pp, mesh.device))
    model, _ = build_runner(run, mesh, tp)
    reduction = build(run.compress, mesh, run.zero)
    opt = ZeroOptimizer(model, mesh, run.zero, run.optimizer, reduction)
    it, consumed = RunCheckpoints(run.checkpoint, mesh, model, opt, tp.rng, run_info(run),
                                  owners=owners(reduction)).resume()
    old = (FirstLayoutPowerSGD if isinstance(reduction, PowerSGDReduction) else FirstLayoutOneBit)(reduction)
    RunCheckpoints(run.checkpoint, mesh, model, opt, tp.rng, run_info(run),
                   owners={f"compress/{dist.get_rank()}/": old}).save(it, consumed)


def _losses(path: str) -> dict[int, str]:
    with open(path) as f:
        return {r["iteration"]: repr(r["lm_loss"]) for r in map(json.loads, f) if "lm_loss" in r}


def _run(flags: list[str], world: int = 2, ok: bool = True):
    out = testing.torchrun(COMMON + flags, world, env={"HYBRID_FAULT": None, "OMP_NUM_THREADS": "1"}, cwd=ROOT,
                           timeout=600)
    assert (out.returncode == 0) == ok, out.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("method", ["powersgd", "onebit"])
def test_first_layout_compressor_checkpoint_resumes_bit_for_bit_and_another_layout_is_refused(method, tmp_path):
    flags = METHODS[method]
    d = str(tmp_path)
    _run(flags + ["--save-interval", "4", "--save", f"{d}/new", "--metrics-file", f"{d}/straight.jsonl"])
    testing.run_distributed(_rewrite_first_layout, 2, args=(flags, f"{d}/new", f"{d}/old"), timeout=300)
    from hybrid.checkpoint import store
    path = store.final_path(f"{d}/old", 4)
    with open(os.path.join(path, "state.json")) as f:
        state = json.load(f)
    assert not any(k.startswith("compress/") for k in state)  # what made the old load silent
    from hybrid.checkpoint.safe_read import read_metadata
    keys = read_metadata(path).state_dict_metadata
    assert "compress/1/counters" in keys and not any(".error/" in k for k in keys if k.startswith("compress/"))
    _run(flags + ["--load", f"{d}/old", "--metrics-file", f"{d}/resumed.jsonl"])
    want, got = _losses(f"{d}/straight.jsonl"), _losses(f"{d}/resumed.jsonl")
    assert sorted(got) == [5, 6] and all(got[i] == want[i] for i in (5, 6)), (got, want)
    out = _run(flags + ["--load", f"{d}/old"], world=1, ok=False)
    assert "the checkpoint's compressor state is in the first, per-bucket layout (compress/<rank>/), which reads " \
           "back only at the layout it was saved at: dp x tp x pp = 2 x 1 x 1, this run is 1 x 1 x 1" in out.stderr, \
        out.stderr[-2000:]
    assert "Traceback" not in out.stderr
