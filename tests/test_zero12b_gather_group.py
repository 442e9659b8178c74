"""ZeRO 1-2's post-step all-gathers on a group of their own (`ZeroOptimizer(gather_group=...)`: the DP ranks in a
second process group, so train_step's loss all-reduce on the DP group does not queue behind the gathers' bytes;
docs/zero.md round 7). Only where the gathers travel changes: losses and weights after several steps equal the
default run's bit for bit, and the ledger moves the same all-gather bytes, on the gather group instead of "dp"."""

from __future__ import annotations

import pytest
import torch

from hybrid.comm import Group
from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.mesh import Mesh, ParallelDims
from hybrid.testing import run_distributed
from hybrid.tp import TPContext
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from models import build_pipeline_chunks, load_config

STEPS, GLOBAL, MICRO, SEQ = 3, 4, 2, 16
OPT = OptimizerConfig(lr=1e-3, eps=1e-5, decay_style="constant")


def _train(mesh: Mesh, stage: int, gather_group: Group | None) -> dict:
    chunks = build_pipeline_chunks(load_config("tiny-llama"), TPContext(mesh.tp), 0, 1, 1, seed=3)
    spec = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp)
    opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=stage, bucket_bytes=2**14), OPT, gather_group=gather_group)
    runner, corpus, losses = LocalForwardBackward(chunks[0], mesh.device), load_corpus(), []
    for it in range(STEPS):
        mesh.ledger.reset()
        losses.append(train_step(chunks, micro_batches(corpus, spec, 3, it, mesh.coords.dp), opt, mesh,
                                 runner=runner))
    gathered = {g: mesh.ledger.bytes("all_gather", g) for g in ("dp", "dp_gather")}
    with opt.gathered():
        weights = {n: p.detach().clone() for n, p in chunks[0].named_parameters()}
    return {"losses": losses, "weights": weights, "gathered": gathered}


def _run(rank, world):
    mesh = Mesh.build(ParallelDims(dp=world))
    own = Group.create("dp_gather", list(mesh.dp.ranks), mesh.ledger)
    try:
        ZeroOptimizer(build_pipeline_chunks(load_config("tiny-llama"), TPContext(mesh.tp), 0, 1, 1, seed=3), mesh,
                      ZeroConfig(stage=1), OPT, gather_group=Group.solo("wrong", mesh.ledger))
        rejected = None
    except ValueError as e:
        rejected = str(e)
    return {"rejected": rejected,
            **{(stage, mode): _train(mesh, stage, own if mode == "own" else None)
               for stage in (1, 2) for mode in ("dp", "own")}}


@pytest.fixture(scope="module")
def runs():
    return run_distributed(_run, 2)


@pytest.mark.parametrize("stage", [1, 2])
def test_gathers_on_their_own_group_give_the_default_runs_losses_and_weights_bit_for_bit(runs, stage):
    for r in runs:
        base, own = r[(stage, "dp")], r[(stage, "own")]
        assert own["losses"] == base["losses"]
        assert base["losses"][-1] != base["losses"][0]  # it trained
        for name, w in base["weights"].items():
            assert torch.equal(own["weights"][name], w), name


@pytest.mark.parametrize("stage", [1, 2])
def test_the_same_all_gather_bytes_move_on_the_gather_group(runs, stage):
    for r in runs:
        base, own = r[(stage, "dp")]["gathered"], r[(stage, "own")]["gathered"]
        assert base["dp"] > 0 and base["dp_gather"] == 0
        assert own["dp_gather"] == base["dp"] and own["dp"] == 0


def test_a_gather_group_over_other_ranks_is_refused_by_name(runs):
    for r in runs:
        assert r["rejected"] is not None and "gather_group ranks" in r["rejected"]
