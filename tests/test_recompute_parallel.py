"""Op-level selective recomputation (`--recompute-granularity selective-op`) under tensor and pipeline parallelism:
training equals training without recomputation bit for bit (fp32; the same float operations, rerun) under 1F1B,
and the TP collectives it reruns are the ones the planner prices (hybrid/planner/predicted_comm.py: as full
recomputation's, the o_proj all-reduce a layer, whose reduced output the MLP's norm reads). The zero-bubble
schedules (whose W reruns a block a second time, after torch's selective checkpoint has freed what it stored)
are refused by train.py's checks, by name.

4 gloo ranks: pp 2 x tp 2, tiny-llama and tiny-gpt2 (GPT-2 with its dropout on: the RNG streams are replayed with
the SAC policy), ZeRO 1, 3 steps."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.mesh import Mesh, ParallelDims
from hybrid.pipeline import ScheduleKind, build_schedule
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.planner.layout import Workload
from hybrid.planner.model import ActivationProfile
from hybrid.planner.predicted_comm import tp_ledger
from hybrid.testing import run_distributed
from hybrid.tp import TPContext, gather_full, spec_of
from hybrid.train_step import OptimizerConfig, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from models import Recompute, build_pipeline_chunks, load_config

STEPS, GLOBAL, MICRO, SEQ, TP, PP = 3, 8, 2, 32, 2, 2
OPT = OptimizerConfig(lr=1e-3, min_lr=1e-4, warmup_iters=1, decay_style="cosine", train_iters=STEPS, clip_grad=1.0)
RUNS = [(Recompute.NONE, ScheduleKind.ONE_F_ONE_B), (Recompute.SELECTIVE_OP, ScheduleKind.ONE_F_ONE_B),
        (Recompute.FULL, ScheduleKind.ONE_F_ONE_B)]


def _train(mesh: Mesh, model: str, recompute: Recompute, kind: ScheduleKind) -> dict:
    cfg = load_config(model)
    stage_ids = [kind.placement.stage(mesh.coords.pp, 0, PP)]
    chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp), mesh.coords.pp, PP, 1, seed=7, stage_ids=stage_ids,
                                   recompute=recompute)
    spec = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp)
    schedule = build_schedule(kind, PP, spec.num_micro_batches, 1)[mesh.coords.pp]
    runner = PipelineExecutor(chunks, schedule, mesh.pp, StageIO((MICRO, SEQ, cfg.hidden_size)), mesh.device,
                              placement=kind.placement)
    opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=1), OPT)
    runner.before_weight = opt.gather_chunk
    corpus, losses = load_corpus(), []
    for it in range(STEPS):
        mesh.ledger.reset()
        losses.append(train_step(chunks, micro_batches(corpus, spec, 3, it, mesh.coords.dp), opt, mesh,
                                 lr=OPT.lr_at(it), runner=runner))
    tp_calls = {op: mesh.ledger.calls(op, "tp") for op in ("all_reduce", "all_gather", "reduce_scatter")}
    with opt.gathered():
        weights = {n: gather_full(p.detach(), spec_of(p), mesh.tp).clone() for c in chunks
                   for n, p in c.named_parameters()}
    return {"losses": losses, "weights": weights, "tp_calls": tp_calls}


def _all(rank: int, world: int) -> dict:
    mesh = Mesh.build(ParallelDims.from_world(world, tp=TP, pp=PP))
    return {model: {run: _train(mesh, model, *run) for run in RUNS} for model in ("tiny-llama", "tiny-gpt2")}


@pytest.fixture(scope="module")
def runs():
    return run_distributed(_all, TP * PP, timeout=900)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt2"])
def test_selective_op_trains_exactly_as_without_recomputation(runs, model):
    for rank in runs:
        ref = rank[model][RUNS[0]]
        for run in RUNS[1:]:
            got = rank[model][run]
            assert got["losses"] == ref["losses"], run
            for name, w in ref["weights"].items():
                assert torch.equal(got["weights"][name], w), (run, name)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt2"])
def test_selective_op_reruns_the_tp_collectives_the_planner_prices(runs, model):
    """Per step, selective-op's TP calls exceed no recomputation's by what predicted_comm's tp_ledger adds for
    it (the same as full recomputation's rerun): one all-reduce per layer and micro-batch."""
    cfg = load_config(model)
    shard = Workload(cfg, global_batch=GLOBAL, seq_length=SEQ, activations=ActivationProfile.FP32_FLASH
                     if cfg.dropout == 0 else ActivationProfile.KORTHIKANTI, fp32_grads=False).shard(TP)
    m = GLOBAL // MICRO
    for rank, got in enumerate(runs):
        layers = cfg.num_layers // PP
        predicted = {}
        for recompute in (Recompute.NONE, Recompute.SELECTIVE_OP):
            book = tp_ledger(shard, MICRO, SEQ, layers, rank // TP == 0, rank // TP == PP - 1, False, recompute, 4)
            predicted[recompute] = book["backward"].get("all_reduce@tp", {"calls": 0})["calls"]
        extra = got[model][RUNS[1]]["tp_calls"]["all_reduce"] - got[model][RUNS[0]]["tp_calls"]["all_reduce"]
        assert extra == m * (predicted[Recompute.SELECTIVE_OP] - predicted[Recompute.NONE]) == m * layers
        assert got[model][RUNS[1]]["tp_calls"] == got[model][RUNS[2]]["tp_calls"]  # as full recomputation's


def test_train_refuses_selective_op_with_a_zero_bubble_schedule():
    from hybrid.train.args import check_args, parse_args
    flags = ["--model", "tiny-llama", "--pipeline-model-parallel-size", "2", "--micro-batch-size", "2",
             "--global-batch-size", "8", "--seq-length", "32", "--recompute-granularity", "selective-op"]
    check_args(parse_args(flags), world=2)  # 1F1B: accepted
    with pytest.raises(ValueError, match="selective-op does not run with --pipeline-schedule zbh1"):
        check_args(parse_args(flags + ["--pipeline-schedule", "zbh1"]), world=2)
