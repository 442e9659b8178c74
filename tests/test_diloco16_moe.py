"""DiLoCo with an MoE model (round 16; hybrid/diloco/replicas.py `inner_expert_dp_ranks`, args.check_layout).

A replica holds whole expert-parallel groups (EP x expert-TP divides the replica's tp x cp x dp / R ranks of a
stage, else one line): the token all-to-all stays inside it; the experts' gradients are reduced (and ZeRO-sharded)
over the replica's share of their expert-DP group; and the outer all-reduce pairs the holders of the same experts'
same shard, which is the dense parameters' cross group (the docstring of inner_expert_dp_ranks says why).

On 4 ranks, dp 4 with 2 replicas of 2 ranks, tiny-mixtral (no biases; 4 experts, top-2; the balancing loss off,
train.py's default):

* H = 1, outer lr 1, no momentum, SGD inside = one process's SGD on the whole global batch, within test_diloco's
  derived fp32 bound -- with EP 2 inside each replica at ZeRO 1 and at ZeRO 3, and with EP 1 (experts replicated
  over the replica's ranks: the dense layout) at ZeRO 1.
* H = 4, Nesterov 0.9, AdamW inside (eps 1e-5) with EP 2 = the same DiLoCo with EP 1 within WC_RTOL
  (tests/test_diloco16_compose.py's bound, derived there: the two sum the experts' gradients in another order).
* The expert-DP group inside a replica: EP 2 -> each rank alone holds its experts in the replica (inner size 1);
  EP 1 -> the replica's 2 ranks.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hybrid.comm import CommLedger
from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.diloco import DiLoCoConfig
from hybrid.diloco.run import LocalUpdates
from hybrid.mesh import Mesh, ParallelDims
from hybrid.moe.config import MoEConfig
from hybrid.moe.layer import ExpertContext
from hybrid.moe.parallel import build_mesh
from hybrid.testing import run_distributed
from hybrid.tp import TPContext
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from models import build_pipeline_chunks, load_config
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)
from test_diloco import (DATA_SEED, DILOCO, EPS32, EXACT, GLOBAL, MICRO, NOISE, SEED, SEQ, SGD, SGD_LR, SGD_STEPS,
                         SIM_STEPS, _one_thread, _weights)
from test_diloco16_compose import ADAMW_WC, WC_RTOL

MIXTRAL = "tiny-mixtral"
R2 = dict(replicas=2)


def _train(mesh: Mesh, ep: int, cfg: DiLoCoConfig, opt_cfg: OptimizerConfig, steps: int, stage: int) -> dict:
    moe = ExpertContext(MoEConfig(expert_parallel=ep), mesh.ep, mesh.etp)
    chunks = build_pipeline_chunks(load_config(MIXTRAL), TPContext(mesh.tp), 0, 1, 1, seed=SEED, moe=moe)
    spec, corpus = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp), load_corpus()
    runner = LocalForwardBackward(chunks[0], mesh.device)
    local = LocalUpdates.build(cfg, mesh)
    opt = ZeroOptimizer(chunks, local.mesh, ZeroConfig(stage=stage), opt_cfg)
    local.checkpointed(opt)
    for it in range(steps):
        train_step(chunks, micro_batches(corpus, spec, DATA_SEED, it, mesh.coords.dp), opt, mesh,
                   lr=opt_cfg.lr_at(it), runner=runner)
        local.after_step(it)
    local.finish()
    with opt.gathered():
        weights = _weights(chunks, mesh)
    return {"weights": weights, "edp": local.mesh.expert_dp.ranks, "experts": sorted(
        n for n in weights if ".experts." in n)}


def _world4(rank: int, world: int) -> dict:
    dims = ParallelDims.from_world(world)  # dp 4
    ep2, ep1 = build_mesh(dims, 2, ledger=CommLedger()), build_mesh(dims, 1, ledger=CommLedger())
    exact = dataclasses.replace(EXACT, **R2)
    return {"ep2-z1-sgd": _train(ep2, 2, exact, SGD, SGD_STEPS, stage=1),
            "ep2-z3-sgd": _train(ep2, 2, exact, SGD, SGD_STEPS, stage=3),
            "ep1-z1-sgd": _train(ep1, 1, exact, SGD, SGD_STEPS, stage=1),
            "ep2-adamw": _train(ep2, 2, dataclasses.replace(DILOCO, **R2), ADAMW_WC, SIM_STEPS, stage=1),
            "ep1-adamw": _train(ep1, 1, dataclasses.replace(DILOCO, **R2), ADAMW_WC, SIM_STEPS, stage=1)}


@pytest.fixture(scope="module")
def world4():
    return run_distributed(_world4, 4, timeout=600)


def _sgd_reference() -> dict:
    """One process, the whole global batch, torch SGD (test_diloco's reference, on tiny-mixtral)."""
    mesh = Mesh.single()
    chunks = build_pipeline_chunks(load_config(MIXTRAL), TPContext(mesh.tp), 0, 1, 1, seed=SEED)
    params = list(chunks.parameters())
    opt = torch.optim.SGD([{"params": [p for p in params if p.dim() >= 2], "weight_decay": SGD.weight_decay},
                           {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=SGD_LR)
    spec, corpus, gmax = BatchSpec(GLOBAL, MICRO, SEQ, 1), load_corpus(), 0.0
    for it in range(SGD_STEPS):
        opt.zero_grad(set_to_none=True)
        LocalForwardBackward(chunks[0], mesh.device).forward_backward(micro_batches(corpus, spec, DATA_SEED, it, 0))
        gmax = max([gmax] + [p.grad.abs().max().item() for p in params if p.grad is not None])
        opt.step()
    return {"weights": _weights(chunks, mesh), "gmax": gmax}


@pytest.mark.parametrize("case", ["ep2-z1-sgd", "ep2-z3-sgd", "ep1-z1-sgd"])
def test_moe_h1_sgd_equals_synchronous_dp(world4, case):
    ref = _one_thread(_sgd_reference)
    for rank, r in enumerate(world4):
        got = r[case]["weights"]
        assert got.keys() <= ref["weights"].keys() and r[case]["experts"]
        for n, w in got.items():  # an EP rank's experts: its own (their global names)
            want = ref["weights"][n]
            bound = SGD_STEPS * (SGD_LR * NOISE * ref["gmax"] + 4 * EPS32 * want.abs().max().item())
            dev = (w - want).abs().max().item()
            assert dev <= bound, f"{case} rank {rank} {n}: off by {dev:.3g} > {bound:.3g}"


def test_moe_diloco_h4_adamw_ep2_equals_ep1_within_the_derived_bound(world4):
    for rank, r in enumerate(world4):
        want = r["ep1-adamw"]["weights"]
        for n, w in r["ep2-adamw"]["weights"].items():
            dev, bound = (w - want[n]).abs().max().item(), WC_RTOL * want[n].abs().max().item()
            assert dev <= bound, f"rank {rank} {n}: off by {dev:.3g} > {bound:.3g}"


def test_moe_expert_dp_group_stays_inside_the_replica(world4):
    for rank, r in enumerate(world4):
        assert r["ep2-z1-sgd"]["edp"] == (rank,)
        assert r["ep1-z1-sgd"]["edp"] == ((0, 1) if rank < 2 else (2, 3))


# --- flags (no processes) -----------------------------------------------------------------------------------
def _run_config(argv: list[str], world: int):
    from hybrid.train.args import parse_args, run_config
    return run_config(parse_args(["--seq-length", "32", "--train-iters", "8", "--diloco-inner-steps", "4",
                                  "--model", MIXTRAL, *argv]), world)


def test_moe_with_ep_inside_a_replica_is_taken():
    assert _run_config(["--expert-model-parallel-size", "2", "--diloco-replicas", "2"], 4).diloco.inner_steps == 4
    assert _run_config([], 2).diloco.inner_steps == 4  # EP 1


@pytest.mark.parametrize("argv, world, message", [
    (["--expert-model-parallel-size", "2"], 2,
     "--expert-model-parallel-size 2 x --expert-tensor-parallel-size 1 must divide the 1 rank of a DiLoCo "
     "replica's pipeline stage .* give --diloco-replicas 1$"),  # round 17: the replica counts that fit, said
    (["--expert-model-parallel-size", "4", "--diloco-replicas", "2"], 4, "give --diloco-replicas 1$"),
    (["--moe-router-enable-expert-bias", "--moe-router-score-function", "sigmoid"], 2,
     "--moe-router-enable-expert-bias does not run with --diloco-inner-steps yet"),
])
def test_moe_layouts_that_cross_replicas_are_one_line(argv, world, message):
    with pytest.raises(ValueError, match=message):
        _run_config(argv, world)
