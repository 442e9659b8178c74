"""ZeRO 1-2: the post-step parameter all-gather overlaps the next forward (ZeroConfig.overlap_param_gather, the
default; `--no-overlap-param-gather` waits in the step). Overlapping changes when the gathered values are waited
for, never the values: losses and weights after several steps equal the blocking run's bit for bit, the ledger
moves the same all-gather bytes, and the waits happen inside the forward, block by block."""

from __future__ import annotations

import pytest
import torch

from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.mesh import Mesh, ParallelDims
from hybrid.pipeline import ScheduleKind, build_schedule
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.testing import run_distributed
from hybrid.tp import TPContext
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import Precision, ZeroConfig, ZeroOptimizer
from hybrid.zero.engine import block_modules
from models import build_pipeline_chunks, load_config

STEPS, GLOBAL, MICRO, SEQ = 4, 8, 2, 32
OPT = OptimizerConfig(lr=1e-3, eps=1e-5, decay_style="constant")
CASES = [(stage, precision, overlap) for stage in (1, 2) for precision in (Precision.FP32, Precision.BF16)
         for overlap in (True, False)]


def _train(mesh: Mesh, model: str, stage: int, precision: Precision, overlap: bool) -> dict:
    cfg = load_config(model)
    chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp), mesh.coords.pp, mesh.dims.pp, 1, seed=3)
    spec = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp)
    if mesh.dims.pp == 1:
        runner = LocalForwardBackward(chunks[0], mesh.device)
    else:
        lists = build_schedule(ScheduleKind.ONE_F_ONE_B, mesh.dims.pp, spec.num_micro_batches)
        runner = PipelineExecutor(chunks, lists[mesh.coords.pp], mesh.pp,
                                  StageIO((MICRO, SEQ, cfg.hidden_size), precision.dtype), mesh.device)
    z = ZeroConfig(stage=stage, precision=precision, overlap_param_gather=overlap, bucket_bytes=2**14)
    opt = ZeroOptimizer(chunks, mesh, z, OPT)
    events = _record_events(opt, chunks)
    corpus, losses = load_corpus(), []
    for it in range(STEPS):
        mesh.ledger.reset()
        events.clear()
        losses.append(train_step(chunks, micro_batches(corpus, spec, 3, it, mesh.coords.dp), opt, mesh,
                                 runner=runner))
    with opt.gathered():  # waits for the last step's gathers: nothing ran a forward since
        weights = {n: p.detach().float().clone() for c in chunks for n, p in c.named_parameters()}
    return {"losses": losses, "weights": weights, "all_gather": mesh.ledger.bytes("all_gather", "dp"),
            "events": list(events), "units": len(opt.units),
            "groups": [len(g) for g in getattr(opt, "_gather_groups", [])]}


def _record_events(opt: ZeroOptimizer, chunks) -> list:
    """('wait', n) when a forward hook found n gathers still in flight and waited for them; ('block', i) as block
    i's forward starts (registered after the engine's hooks, so it runs after the block's wait); ('adamw',) for
    each optimizer call and ('gather',) for each parameter all-gather the step posts."""
    events: list = []
    # the engine's post of a unit's gather (gloo's, or since round 14 by default the shared-memory one)
    inner, adamw, gather = opt._wait_gathers, opt.optimizer.step, opt._all_gather
    opt.optimizer.step = lambda *a, **k: (events.append(("adamw",)), adamw(*a, **k))[1]
    opt._all_gather = lambda *a, **k: (events.append(("gather",)), gather(*a, **k))[1]

    def wait(units):
        pending = sum(id(u) in opt._param_gathers for u in units)
        if pending:
            events.append(("wait", pending))
        inner(units)
    opt._wait_gathers = wait
    for chunk in chunks:
        for i, b in enumerate(block_modules(chunk)):
            b.register_forward_pre_hook(lambda m, a, i=i: events.append(("block", i)))
    return events


def _run(rank, world, pp):
    mesh = Mesh.build(ParallelDims(pp=pp, dp=world // pp))
    model = "tiny-gpt2" if pp > 1 else "tiny-llama"  # tied embeddings across pipeline stages
    return {case: _train(mesh, model, *case) for case in CASES}


# pp2xdp2 (4 ranks, GPT-2's embeddings tied across the stages) is marked slow: the fast tier keeps dp2's launch (every
# check below), and ZeRO 1-2 with the default overlapped gathers across pipeline stages trains against one process
# in tests/test_zero.py's fast tp2 x pp2 x dp2 launch
@pytest.fixture(scope="module", params=[1, pytest.param(2, marks=pytest.mark.slow)], ids=["dp2", "pp2xdp2"])
def runs(request):
    pp = request.param
    return run_distributed(_run, 2 * pp, args=(pp,))


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("precision", [Precision.FP32, Precision.BF16], ids=lambda p: p.value)
def test_overlapped_gathers_give_the_blocking_runs_losses_and_weights_bit_for_bit(runs, stage, precision):
    for rank, per_rank in enumerate(runs):
        on, off = per_rank[(stage, precision, True)], per_rank[(stage, precision, False)]
        assert on["losses"] == off["losses"], rank
        assert on["weights"].keys() == off["weights"].keys()
        for name, w in on["weights"].items():
            assert torch.equal(w, off["weights"][name]), (rank, name)
        assert on["all_gather"] == off["all_gather"] > 0, rank


def test_the_next_forward_waits_for_the_gathers_block_by_block(runs):
    """With overlap, gathers are still in flight when the forward starts and are waited for by later blocks'
    hooks, after earlier blocks have run; without it the step waited for all of them and no hook waits."""
    for per_rank in runs:
        for (stage, precision, overlap), run in per_rank.items():
            waits = [i for i, e in enumerate(run["events"]) if e[0] == "wait"]
            if not overlap:
                assert not waits, (stage, precision)
                continue
            first_block = next(i for i, e in enumerate(run["events"]) if e[0] == "block")
            assert run["units"] > 2 and any(i > first_block for i in waits), (stage, precision, run["events"][:12])


def test_the_step_posts_each_groups_gathers_right_after_stepping_it(runs):
    """ZeroConfig.step_in_gather_order (the default): with overlap one optimizer call per group of units a forward
    hook waits for (inputs, each block, output side), each followed by its units' gathers, so the first gathers are
    on the wire while later groups step; without overlap one call, then the gathers. Either way the weights are bit
    for bit the same (the test above)."""
    for per_rank in runs:
        for (stage, precision, overlap), run in per_rank.items():
            step = [e[0] for e in run["events"] if e[0] in ("adamw", "gather")]
            groups, n = run["groups"], run["units"]
            if overlap:
                assert len(groups) > 2 and sum(groups) == n, groups
                assert step == [e for k in groups for e in ["adamw"] + ["gather"] * k], (stage, precision)
            else:
                assert step == ["adamw"] + ["gather"] * n, (stage, precision)
