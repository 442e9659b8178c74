"""--compile on an MoE model (hybrid/train/loop.py compile_blocks; the MoE layer's forward stays eager,
hybrid/moe/layer.py MoELayer.forward): one graph break per compiled block (at the MoE layer's call), no
recompilation after the first step although the routed rows change every step, and the losses of the eager run.

Why the bounds. The dense parts of a block (norms, attention, residuals) see the same shapes every step, so after the
first step dynamo must find every frame it needs compiled: 0 new frames. The MoE layer's per-expert row counts and
all-to-all split sizes are data-dependent; traced, they broke the graph at each `.tolist()` / `bincount` / boolean
index and recompiled as the counts changed: at ep 1 here 20 frames, 1 more after the first step; train.py
at ep 2, 28 breaks and 20 recompilations a rank in 10 steps, 1 to 10 s each (docs/moe.md). Tolerance:
tests/test_compile.py's, fp32 1e-5 relative (inductor fuses elementwise kernels in another order; the eager backend
here changes nothing).

Dynamo runs with its `eager` backend in-process (graph capture, guards and recompiles are dynamo's alone; no
inductor code generation): one process at ep 1 (the fast tier), and two ranks at ep 2 (the all-to-all's split sizes;
~8 s of CPU, slow). The slow launch test runs train.py with and without --compile at ep 2 and ZeRO 3 (inductor;
ZeRO 3's hooks around the compiled body and the experts' gather inside the eager layer)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from hybrid import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RTOL = 1e-5  # tests/test_compile.py's fp32 tolerance
STEPS = 3  # the first compiles; the old code recompiled at the second


def _steps(model, rank: int, compiled: bool, backend: str = "eager") -> dict:
    """STEPS forward + backward passes on new tokens each (so the routing, and every per-expert count, changes):
    the losses, and dynamo's frame and graph-break counters after each step."""
    from torch._dynamo.utils import counters

    from hybrid.train.loop import compile_blocks
    from models import shift_labels
    torch._dynamo.reset()
    counters.clear()
    if compiled:
        compile_blocks([model], backend=backend)
    out = {"loss": [], "frames": [], "breaks": []}
    for step in range(STEPS):
        ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(100 * rank + step))
        loss = model(ids, shift_labels(ids))
        loss.backward()
        out["loss"].append(loss.item())
        out["frames"].append(counters["frames"]["total"])
        out["breaks"].append(sum(counters["graph_break"].values()))
    return out


def _check(eager: dict, compiled: dict) -> None:
    assert compiled["frames"][0] > 0, compiled  # the blocks were compiled at all
    assert compiled["frames"][-1] == compiled["frames"][0], f"recompiled after the first step: {compiled['frames']}"
    assert compiled["breaks"][-1] <= 1, f"graph breaks: {compiled['breaks']}"
    for a, b in zip(compiled["loss"], eager["loss"]):
        assert abs(a - b) <= RTOL * abs(b), (compiled["loss"], eager["loss"])


def _model(ep=None):
    from hybrid.comm import Group
    from hybrid.moe.config import MoEConfig
    from hybrid.moe.layer import ExpertContext
    from hybrid.tp import TPContext
    from models import build_model, load_config
    moe = ExpertContext() if ep is None else ExpertContext(MoEConfig(expert_parallel=ep.size), ep)
    cfg = dataclasses.replace(load_config("tiny-mixtral"), num_layers=2, moe_layers=(0, 1))  # 2 blocks: one code
    return build_model(cfg, TPContext(Group.solo("tp")), seed=0, moe=moe)  # object, compiled once for both


def test_compiled_moe_block_breaks_once_and_never_recompiles():
    """One process, ep 1: the dispatch's data-dependent sizes stay out of the compiled graphs."""
    _check(_steps(_model(), 0, compiled=False), _steps(_model(), 0, compiled=True))


def _ep2(rank, world):
    from hybrid.mesh import ParallelDims
    from hybrid.moe.parallel import build_mesh
    mesh = build_mesh(ParallelDims.from_world(world), world)  # dp 2 folded into ep 2: each rank holds 4 experts
    eager = _steps(_model(mesh.ep), rank, compiled=False)
    return eager, _steps(_model(mesh.ep), rank, compiled=True)


@pytest.mark.slow
def test_compiled_moe_block_at_ep2_never_recompiles():
    """Two ranks, ep 2: the all-to-all's split sizes (this rank's rows for each peer's experts) change every step;
    they stay in the eager layer, so the compiled frames serve every step."""
    for eager, compiled in testing.run_distributed(_ep2, 2):
        _check(eager, compiled)


ZERO3 = ["--model", "tiny-mixtral", "--expert-model-parallel-size", "2", "--zero-stage", "3", "--train-iters", "3",
         "--log-interval", "1", "--eval-iters", "0"]


def _losses(tmp_path, extra: list[str]) -> list[float]:
    out = tmp_path / f"m{len(extra)}.jsonl"
    proc = testing.torchrun_cli(["--standalone", "--nproc-per-node", "2", os.path.join(ROOT, "scripts", "train.py"),
                                 *ZERO3, "--metrics-file", str(out), *extra], env={"OMP_NUM_THREADS": "1"},
                                timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [r["lm_loss"] for r in map(json.loads, out.read_text().splitlines()) if "lm_loss" in r]


@pytest.mark.slow
def test_compiled_moe_under_zero3_trains_as_the_eager_run(tmp_path):
    """train.py --compile, tiny-mixtral at ep 2 and ZeRO 3 (inductor): the losses of the eager run, fp32 1e-5."""
    eager, compiled = _losses(tmp_path, []), _losses(tmp_path, ["--compile"])
    assert len(eager) == len(compiled) == 3
    for a, b in zip(compiled, eager):
        assert abs(a - b) <= RTOL * abs(b), (compiled, eager)
