"""--compile composed with --recompute-granularity: every mode that runs trains as the eager run without
recomputation does -- each step's loss and the reduced gradient this rank's optimizer steps on, to fp32 tolerance
(1e-5, tests/test_compile.py's: inductor fuses elementwise kernels in fp32, recomputation replays exactly).

Two layouts in one 2-rank launch, a 2-layer tiny Llama, 2 steps each:
* tp 2 with sequence parallelism and dropout 0.1 (hidden and attention): full and selective keep their checkpoint
  eager around the compiled block body, replaying the tensor-parallel dropout streams (models/common.py
  `_replaying_checkpoint`; selective's attention-core checkpoint is a graph break inside the compiled body);
* dp 2 under ZeRO 3, no dropout (the Llama default): full, selective and selective-op, the last with its op-level
  checkpoint traced inside the compiled block forward (torchtitan's SAC under compile), the block's parameters
  gathered and freed around it.
What does not compose (selective-op with dropout, tp > 1, cp > 1 or an MoE model) is refused by name before any
process group (tests/test_inputs.py: compile-selective-op-dropout, -tp, -moe; cp: tests/test_compose20_compile.py),
and --auto-parallel plans only what runs (below). Full and selective recomputation of an MoE model, and CP, under --compile:
tests/test_compose20_compile.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._dynamo.utils import counters

from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.mesh import Mesh, ParallelDims
from hybrid.testing import run_distributed
from hybrid.tp import ParallelRNG, TPContext
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from models import Recompute, build_pipeline_chunks, load_config

STEPS, GLOBAL, MICRO, SEQ = 2, 4, 2, 32
TOL = 1e-5  # relative, fp32 (tests/test_compile.py)
OPT = OptimizerConfig(lr=1e-3, eps=1e-5, decay_style="constant")
LAYOUTS = {  # name: (tp, ZeRO stage, dropout, the recompute modes compiled)
    "tp2-sp-dropout": (2, 1, 0.1, (Recompute.FULL, Recompute.SELECTIVE)),
    "dp2-zero3": (1, 3, 0.0, (Recompute.FULL, Recompute.SELECTIVE, Recompute.SELECTIVE_OP)),
}


def _train(world: int, layout: str, recompute: Recompute, compiled: bool) -> dict:
    """STEPS steps of `layout`; each step's loss and the gradient shards the optimizer stepped on."""
    from hybrid.train.loop import compile_blocks
    tp_size, stage, dropout, _ = LAYOUTS[layout]
    torch._dynamo.reset()  # each run compiles afresh: a graph of another mode is never reused
    counters.clear()
    mesh = Mesh.build(ParallelDims.from_world(world, tp=tp_size))
    cfg = dataclasses.replace(load_config("tiny-llama"), num_layers=2, dropout=dropout, attention_dropout=dropout)
    tp = TPContext(mesh.tp, sequence_parallel=tp_size > 1, rng=ParallelRNG(11, mesh.tp.rank))
    chunks = build_pipeline_chunks(cfg, tp, 0, 1, 1, seed=3, recompute=recompute)
    if compiled:
        compile_blocks(chunks)
    opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=stage, bucket_bytes=2**14), OPT)
    grads, step = [], opt.step

    def recording_step():
        grads.append([u.grad_shard.clone() for u in opt.units])
        return step()
    opt.step = recording_step
    spec, corpus = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp), load_corpus()
    losses = [train_step(chunks, micro_batches(corpus, spec, 5, it, mesh.coords.dp), opt, mesh,
                         runner=LocalForwardBackward(chunks[0], mesh.device)) for it in range(STEPS)]
    return {"losses": losses, "grads": grads, "graphs": counters["stats"]["unique_graphs"],
            "breaks": sum(counters["graph_break"].values())}


def _all_layouts(rank: int, world: int) -> dict:
    out = {}
    for layout, (_, _, _, modes) in LAYOUTS.items():
        out[layout, Recompute.NONE] = _train(world, layout, Recompute.NONE, compiled=False)
        for mode in modes:
            out[layout, mode] = _train(world, layout, mode, compiled=True)
    return out


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool((got - want).abs().max() <= TOL * want.abs().max())


@pytest.mark.slow
def test_compiled_recomputation_trains_as_the_eager_run():
    per_rank = run_distributed(_all_layouts, 2, timeout=1200)
    for rank, out in enumerate(per_rank):
        for layout, (_, _, _, modes) in LAYOUTS.items():
            want = out[layout, Recompute.NONE]
            for mode in modes:
                got, case = out[layout, mode], (rank, layout, mode.value)
                assert len(got["losses"]) == STEPS and len(got["grads"]) == STEPS, case
                assert got["graphs"] >= 1, case  # the blocks ran compiled code
                if mode is Recompute.SELECTIVE_OP:  # the checkpoint and its policy traced: no graph break
                    assert got["breaks"] == 0, (case, got["graphs"], got["breaks"])
                for a, b in zip(got["losses"], want["losses"]):
                    assert abs(a - b) <= TOL * abs(b), (case, got["losses"], want["losses"])
                for step, (gs, ws) in enumerate(zip(got["grads"], want["grads"])):
                    assert len(gs) == len(ws) > 0, case
                    for unit, (g, w) in enumerate(zip(gs, ws)):
                        assert _close(g, w), (case, step, unit, (g - w).abs().max().item(), w.abs().max().item())


def test_auto_parallel_with_compile_and_selective_op_searches_tp_1(monkeypatch):
    """--auto-parallel --compile --recompute-granularity selective-op: the planner is asked only for tp 1 layouts
    with that recomputation (its traced checkpoint holds no TP collective; check_compile refuses tp > 1), so the
    layout it picks is one the run accepts; full keeps every tp."""
    from hybrid import planner
    from hybrid.train.args import apply_auto_parallel, parse_args
    seen = []
    real = planner.search

    def spy(work, cluster, space, **kw):
        seen.append(space)
        return real(work, cluster, space, **kw)
    monkeypatch.setattr(planner, "search", spy)
    for mode, tp in (("selective-op", (1,)), ("full", None)):
        args = parse_args(["--auto-parallel", "--compile", "--recompute-granularity", mode, "--global-batch-size", "16",
                           "--seq-length", "32"])
        apply_auto_parallel(args, 4)
        assert seen[-1].tp == tp and [r.value for r in seen[-1].recompute] == [mode]
        assert mode != "selective-op" or args.tensor_model_parallel_size == 1
