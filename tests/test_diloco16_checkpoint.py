"""DiLoCo's checkpoints at ZeRO-3 and with context parallelism, through train.py (round 16).

Two runs of 4 ranks, H = 2, Nesterov 0.9 (each launch costs; one run covers two compositions; H = 2 as in
tests/test_diloco_checkpoint.py: a sync on each side of the mid-round save, 4 + 1 steps):

* ZeRO-3 with context parallelism: cp 2 x dp 2, a replica per DP rank = a CP pair, ZeRO-3 sharded over it. The run
  saves at iteration 3 -- mid-round, the replicas apart, the outer momentum nonzero since the sync at 2 -- and at
  4. Resumed from 3 it logs the same loss for 4 and ends, after the sync at 4, with every tensor of its checkpoint
  equal, bit for bit: both replicas' master weights and Adam moments, theta and the outer momentum (stored from
  the ZeRO-3 shards, each piece once). That iteration-3 checkpoint loaded at another layout -- tp 2 x dp 2 at
  ZeRO 1 -- by train.py's own objects and saved again at once holds the same tensors, bit for bit (the RNG streams
  aside): the outer state reshards from ZeRO-3 shards.
* MoE at ZeRO-3 over DP ranks: tiny-mixtral, dp 4, 2 replicas of 2 ranks with EP 2 inside each, ZeRO-3 over the
  replica's 2 DP ranks (the dense parameters; each rank alone holds its experts). Saved at 3 and resumed: the same
  loss, every tensor equal (both replicas' experts, their theta and momentum); the checkpoint loaded at EP 1
  (experts replicated in each replica, ZeRO 1) and saved again holds the same tensors.
"""

from __future__ import annotations

import pytest
import torch

from hybrid import testing
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)
from test_diloco_checkpoint import COMMON, _losses, _run, _same, _tensors

pytestmark = pytest.mark.slow  # end-to-end train.py launches (conftest.py: the fast tier leaves them out)

ZERO3 = ["--context-parallel-size", "2", "--zero-stage", "3"]  # cp2 x dp2: a replica per DP rank, ZeRO-3 over CP
OTHER = ["--tensor-model-parallel-size", "2", "--zero-stage", "1"]  # tp2 x dp2: a replica per DP rank
MOE = ["--model", "tiny-mixtral", "--diloco-replicas", "2"]
EP2 = ["--expert-model-parallel-size", "2", "--zero-stage", "3"]
EP1 = ["--zero-stage", "1"]


def _straight(d, flags: list[str]) -> None:
    _run(flags + ["--train-iters", "4", "--save-interval", "3", "--save", str(d / "a"),
                  "--metrics-file", str(d / "a.jsonl")])


def _resumes_bit_for_bit(d, flags: list[str]) -> None:
    _run(flags + ["--train-iters", "4", "--load", str(d / "a"), "--ckpt-step", "3", "--save", str(d / "b"),
                  "--metrics-file", str(d / "b.jsonl")])
    want, got = _losses(str(d / "a.jsonl")), _losses(str(d / "b.jsonl"))
    assert sorted(got) == [4] and got[4] == want[4]
    saved = _tensors(str(d / "b"), 4)
    for kind in ("diloco.anchor/", "diloco.momentum/", "diloco.replica1/model/", "diloco.replica1/optim."):
        assert any(k.startswith(kind) for k in saved), kind
    _same(saved, _tensors(str(d / "a"), 4))


@pytest.fixture(scope="module")
def zero3(tmp_path_factory):
    d = tmp_path_factory.mktemp("diloco16_zero3")
    _straight(d, ZERO3)
    return d


def test_zero3_cp_diloco_resumes_mid_round_bit_for_bit(zero3):
    t = _tensors(str(zero3 / "a"), 3)  # mid-round: the replicas apart
    assert not torch.equal(t["model/wte.weight"], t["diloco.replica1/model/wte.weight"])
    _resumes_bit_for_bit(zero3, ZERO3)


def _reshard(rank: int, world: int, argv: list[str]) -> None:
    """train.py's start-up at another layout up to the resume (hybrid/train/loop.py), then a save of what it loaded."""
    from hybrid.checkpoint.run import RunCheckpoints
    from hybrid.diloco.run import LocalUpdates
    from hybrid.mesh import Mesh
    from hybrid.tp import ParallelRNG, TPContext
    from hybrid.train.args import parse_args, run_config
    from hybrid.train.loop import build_runner, expert_layout, run_info
    from hybrid.zero import ZeroOptimizer
    run = run_config(parse_args(argv), world)
    experts = expert_layout(run)  # MoE: the ep / edp groups
    mesh = Mesh.build(run.parallel.dims, expert_groups=experts.groups() if experts is not None else None)
    tp = TPContext(mesh.tp, rng=ParallelRNG(run.training.seed, mesh.coords.tp, mesh.coords.pp, mesh.device))
    model, _ = build_runner(run, mesh, tp)
    local = LocalUpdates.build(run.diloco, mesh)
    saved = local.checkpointed(ZeroOptimizer(model, local.mesh, run.zero, run.optimizer), run.checkpoint)
    ckpt = RunCheckpoints(run.checkpoint, mesh, model, saved, tp.rng, run_info(run), owners=local.owners())
    ckpt.save(*ckpt.resume())


def test_zero3_diloco_state_reshards_to_another_layout_and_stage(zero3, tmp_path):
    argv = COMMON + OTHER + ["--train-iters", "4", "--load", str(zero3 / "a"), "--ckpt-step", "3",
                             "--save", str(tmp_path / "c")]
    testing.run_distributed(_reshard, 4, args=(argv,), timeout=300)
    got, want = _tensors(str(tmp_path / "c"), 3), _tensors(str(zero3 / "a"), 3)
    _same(*({k: v for k, v in t.items() if not k.startswith("rng/")} for t in (got, want)))


def test_moe_zero3_diloco_resumes_mid_round_bit_for_bit_and_loads_at_ep1(tmp_path):
    _straight(tmp_path, MOE + EP2)
    _resumes_bit_for_bit(tmp_path, MOE + EP2)
    want = _tensors(str(tmp_path / "a"), 3)
    assert any(".experts." in k and k.startswith("diloco.anchor/") for k in want)
    argv = COMMON + MOE + EP1 + ["--train-iters", "4", "--load", str(tmp_path / "a"), "--ckpt-step", "3",
                           "--save", str(tmp_path / "c")]
    testing.run_distributed(_reshard, 4, args=(argv,), timeout=300)
    got = _tensors(str(tmp_path / "c"), 3)
    _same(*({k: v for k, v in t.items() if not k.startswith("rng/")} for t in (got, want)))
