"""ZeRO 1-2's reduce-scatter straight from autograd's gradients (`ZeroConfig.reduce_from_grads`, the default on
2-rank gloo groups: hybrid/zero/direct.py, docs/zero.md round 8) against the flat path it replaces (each gradient
copied into a flat buffer first). The same additions in the same order: losses and weights after several steps equal
the flat path's bit for bit, with one micro-batch and with two (stage 2 reduces each micro-batch, stage 1 falls back
to its flat buffer), with buckets that split parameters between the two ranks' halves; padded units and missing
gradients land as the flat exchange's; the ledger records the same reduce-scatter bytes; and the direct path did run
(each unit of each micro-batch, stage 1 only in steps of one micro-batch). The unsharded reference for the default
path is tests/test_zero.py's."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.mesh import Mesh, ParallelDims
from hybrid.testing import run_distributed
from hybrid.tp import TPContext
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from hybrid.zero.direct import reduce_scatter_grads
from hybrid.zero.units import FlatUnit
from models import build_pipeline_chunks, load_config

STEPS, MICRO, SEQ = 2, 2, 16
OPT = OptimizerConfig(lr=1e-3, eps=1e-5, decay_style="constant")
CASES = [(stage, m) for stage in (1, 2) for m in (1, 2)]  # (ZeRO stage, micro-batches a step)


def _train(mesh: Mesh, stage: int, m: int, direct: bool) -> dict:
    import hybrid.zero.engine as engine
    chunks = build_pipeline_chunks(load_config("tiny-llama"), TPContext(mesh.tp), 0, 1, 1, seed=3)
    spec = BatchSpec(MICRO * m * mesh.dims.dp, MICRO, SEQ, mesh.dims.dp)
    opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=stage, bucket_bytes=2**14, reduce_from_grads=direct), OPT)
    calls, inner = [0], engine.reduce_scatter_grads

    def counted(*a, **k):
        calls[0] += 1
        return inner(*a, **k)
    engine.reduce_scatter_grads = counted
    runner, corpus, losses, scattered = LocalForwardBackward(chunks[0], mesh.device), load_corpus(), [], []
    try:
        for it in range(STEPS):
            mesh.ledger.reset()
            losses.append(train_step(chunks, micro_batches(corpus, spec, 3, it, mesh.coords.dp), opt, mesh,
                                     runner=runner))
            scattered.append(mesh.ledger.bytes("reduce_scatter", "dp"))
    finally:
        engine.reduce_scatter_grads = inner
    with opt.gathered():
        weights = {n: p.detach().clone() for n, p in chunks[0].named_parameters()}
    return {"losses": losses, "weights": weights, "scattered": scattered, "calls": calls[0],
            "units": len(opt.units) - sum(u.deferred for u in opt.units)}


def _pieces_against_the_flat_exchange(mesh: Mesh, sizes: list[int], missing: set[int]) -> bool:
    """One unit of parameters of `sizes` (padded when their sum is odd), the ones in `missing` without a gradient:
    the piecewise reduce-scatter's shard equals the flat exchange's (hybrid/comm.py) over the zero-filled buffer."""
    dp = mesh.dp
    params = [nn.Parameter(torch.zeros(n)) for n in sizes]
    u = FlatUnit("t", params, parts=2, part=dp.rank)
    gen = torch.Generator().manual_seed(11 + dp.rank)
    grads = {id(p): torch.randn(p.numel(), generator=gen) for i, p in enumerate(params) if i not in missing}
    full = torch.zeros(u.padded)
    for p, off in zip(params, u.offsets):
        if id(p) in grads:
            full[off:off + p.numel()] = grads[id(p)]
    want, got = torch.empty(u.shard_numel), torch.full((u.shard_numel,), float("nan"))
    dp.reduce_scatter_into(want, full, torch.empty(u.shard_numel)).wait()
    reduce_scatter_grads(dp, u, grads, got, torch.empty(u.shard_numel)).wait()
    return torch.equal(got, want)


def _run(rank, world):
    mesh = Mesh.build(ParallelDims(dp=world))
    out = {(stage, m, direct): _train(mesh, stage, m, direct) for stage, m in CASES for direct in (True, False)}
    out["pieces"] = [_pieces_against_the_flat_exchange(mesh, [3, 4, 6], {1}),  # 13 elements: padded, one missing
                     _pieces_against_the_flat_exchange(mesh, [1], set()),  # rank 1's half is all padding
                     _pieces_against_the_flat_exchange(mesh, [5, 7], {0, 1})]  # no gradient at all
    return out


@pytest.fixture(scope="module")
def runs():
    return run_distributed(_run, 2)


@pytest.mark.parametrize("stage,m", CASES)
def test_direct_reduction_gives_the_flat_paths_losses_and_weights_bit_for_bit(runs, stage, m):
    for r in runs:
        flat, direct = r[(stage, m, False)], r[(stage, m, True)]
        assert direct["losses"] == flat["losses"]
        assert flat["losses"][-1] != flat["losses"][0]  # it trained
        for name, w in flat["weights"].items():
            assert torch.equal(direct["weights"][name], w), name


@pytest.mark.parametrize("stage,m", CASES)
def test_direct_reduction_moves_the_flat_paths_reduce_scatter_bytes(runs, stage, m):
    for r in runs:
        assert r[(stage, m, True)]["scattered"] == r[(stage, m, False)]["scattered"]
        assert r[(stage, m, True)]["scattered"][0] > 0


@pytest.mark.parametrize("stage,m", CASES)
def test_the_direct_path_runs_where_it_should(runs, stage, m):
    """Every unit of every micro-batch at stage 2; at stage 1 every unit once a step with one micro-batch, never
    with two (its flat buffer accumulates them); never when switched off. Small buckets split parameters across
    the two halves."""
    for r in runs:
        on = r[(stage, m, True)]
        want = on["units"] * STEPS * (m if stage == 2 else 1) if (stage == 2 or m == 1) else 0
        assert on["calls"] == want
        assert r[(stage, m, False)]["calls"] == 0


def test_pieces_padding_and_missing_gradients_land_as_the_flat_exchange(runs):
    """A padded unit with a parameter that got no gradient, a unit whose second half is all padding, a unit with
    no gradient at all: the shard equals the flat exchange's over the zero-filled buffer, bit for bit."""
    for r in runs:
        assert r["pieces"] == [True, True, True]
