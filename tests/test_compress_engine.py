"""PowerSGD through the ZeRO engine's seam (hybrid/compress/reduction.py) against torch's `powerSGD_hook`.

The reference is the plain bucketed data-parallel path of the tests (hybrid.dp.GradAverager + torch AdamW, which
ZeRO stages 0-1 equal bit for bit: tests/test_zero.py) with each bucket's average replaced by torch's own
`powerSGD_hook` on that bucket (the stand-in GradBucket of tests/test_compress_powersgd.py). Each rank hooks its
own TP shard's gradients over its DP group and pipeline stages their own parameters, so the same reference holds
at tp2 x pp2 x dp2. ZeRO stages 0, 1 and 2 with PowerSGD must give the reference's losses and final weights bit
for bit; the DP all-reduce bytes of every step equal r(n + m) per compressed matrix plus the uncompressed
elements (plain all-reduce before the start iteration), counted from the parameters' shapes; ZeRO-3 is refused.
"""

from __future__ import annotations

import math

import pytest
import torch

from hybrid.compress.powersgd import PowerSGDConfig
from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.dp import GradAverager
from hybrid.mesh import Mesh, ParallelDims
from hybrid.pipeline import ScheduleKind, build_schedule
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.testing import run_distributed
from hybrid.tp import TPContext, gather_full, spec_of
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, build_optimizer, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from models import build_pipeline_chunks, load_config

STEPS, START, GLOBAL, MICRO, SEQ, RANK = 5, 2, 8, 2, 32, 2
OPT = OptimizerConfig(lr=3e-3, eps=1e-8, weight_decay=0.01, decay_style="constant")
MODEL = "tiny-llama"


class HookAverager(GradAverager):
    """GradAverager with each bucket reduced by torch's powerSGD_hook (after its start iteration: plain mean)."""

    def __init__(self, params, dp, cfg: PowerSGDConfig):
        super().__init__(params, dp)
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState
        self.state = PowerSGDState(process_group=dp.pg, matrix_approximation_rank=cfg.rank,
                                   start_powerSGD_iter=cfg.start_iter)

    @torch.no_grad()
    def __call__(self) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

        from tests.test_compress_powersgd import FakeBucket
        for i, bucket in enumerate(self.buckets):
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket]
            flat = torch.cat([g.flatten() for g in grads])
            out = powerSGD_hook(self.state, FakeBucket(i, flat, [tuple(g.shape) for g in grads],
                                                       i == len(self.buckets) - 1)).wait()
            at = 0
            for p in bucket:
                p.grad = out[at:at + p.numel()].view_as(p).clone()
                at += p.numel()


def _runner(mesh: Mesh, chunks, cfg):
    if mesh.dims.pp == 1:
        return LocalForwardBackward(chunks[0], mesh.device)
    spec = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp)
    schedule = build_schedule(ScheduleKind.ONE_F_ONE_B, mesh.dims.pp, spec.num_micro_batches)[mesh.coords.pp]
    return PipelineExecutor(chunks, schedule, mesh.pp, StageIO((MICRO, SEQ, cfg.hidden_size), torch.float32),
                            mesh.device)


def _expected_dp_bytes(chunks, cfg: PowerSGDConfig) -> tuple[int, int]:
    """(bytes a step before the start, after): every gradient element; then r(n + m) per matrix worth
    compressing (r(n + m) x 2 < n m, torch's min_compression_rate) and the rest whole -- from the shapes alone."""
    before = after = 0
    for p in chunks.parameters():
        n, m = p.shape[0], p.numel() // p.shape[0]
        r = min(n, m, cfg.rank)
        before += p.numel()
        after += r * (n + m) if 2 * r * (n + m) < n * m else p.numel()
    return 4 * before, 4 * after


def _train(mesh: Mesh, stage: int | None, cfg: PowerSGDConfig):
    """STEPS steps on the same batches: the engine at ZeRO `stage` with PowerSGD, or (None) the hook reference."""
    from hybrid.compress.reduction import PowerSGDReduction
    arch = load_config(MODEL)
    chunks = build_pipeline_chunks(arch, TPContext(mesh.tp), mesh.coords.pp, mesh.dims.pp, 1, seed=7)
    spec = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp)
    runner = _runner(mesh, chunks, arch)
    expected = _expected_dp_bytes(chunks, cfg)
    if stage is None:
        opt, sync = build_optimizer(chunks, OPT), HookAverager(chunks.parameters(), mesh.dp, cfg)
    else:
        layout = (mesh.dp.size, mesh.tp.size, mesh.pp.size)
        opt, sync = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=stage), OPT, PowerSGDReduction(cfg, layout)), None
    corpus, losses, dp_bytes = load_corpus(), [], []
    for it in range(STEPS):
        mesh.ledger.reset()
        losses.append(train_step(chunks, micro_batches(corpus, spec, 3, it, mesh.coords.dp), opt, mesh, sync,
                                 runner=runner))
        dp_bytes.append(sum(e.bytes for (op, g), e in mesh.ledger.entries.items()
                            if op in ("all_reduce", "reduce_scatter") and (g == "dp" or g.startswith("dp:powersgd"))))
    if stage is not None:
        with opt.gathered():
            weights = {n: gather_full(p.detach(), spec_of(p), mesh.tp).clone()
                       for c in chunks for n, p in c.named_parameters()}
    else:
        weights = {n: gather_full(p.detach(), spec_of(p), mesh.tp).clone()
                   for c in chunks for n, p in c.named_parameters()}
    return {"losses": losses, "weights": weights, "dp_bytes": dp_bytes, "expected": expected}


def _run_all(rank, world, tp, pp):
    torch.set_num_threads(1)
    mesh = Mesh.build(ParallelDims.from_world(world, tp=tp, pp=pp))
    cfg = PowerSGDConfig(rank=RANK, start_iter=START)
    out = {s: _train(mesh, s, cfg) for s in (None, 0, 1, 2)}
    try:
        ZeroOptimizer(build_pipeline_chunks(load_config(MODEL), TPContext(mesh.tp), mesh.coords.pp, mesh.dims.pp, 1,
                                            seed=7), mesh, ZeroConfig(stage=3), OPT,
                      __import__("hybrid.compress.reduction", fromlist=["x"]).PowerSGDReduction(cfg, (0, 0, 0)))
        out["stage3"] = "accepted"
    except ValueError as e:
        out["stage3"] = str(e)
    return out


LAYOUTS = {"dp2": (2, 1, 1), "tp2pp2dp2": (8, 2, 2)}
_RUNS: dict = {}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def runs(request):
    if request.param not in _RUNS:
        world, tp, pp = LAYOUTS[request.param]
        _RUNS[request.param] = run_distributed(_run_all, world, args=(tp, pp), timeout=900)
    return _RUNS[request.param]


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_engine_powersgd_equals_torch_hook_reference_bit_for_bit(runs, stage):
    for r in runs:
        ref, got = r[None], r[stage]
        assert got["losses"] == ref["losses"]
        for n, w in ref["weights"].items():
            assert torch.equal(got["weights"][n], w), n
    assert runs[0][None]["losses"][-1] < runs[0][None]["losses"][0]


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_engine_dp_bytes_are_r_n_plus_m_per_matrix_after_the_start(runs, stage):
    for r in runs:
        before, after = r[stage]["expected"]
        assert after < before
        assert r[stage]["dp_bytes"][START:] == [after] * (STEPS - START)
        if stage == 0:  # unpadded all-reduce before the start (ZeRO 1-2 reduce-scatter padded units)
            assert r[stage]["dp_bytes"][:START] == [before] * START


def test_zero3_with_powersgd_is_refused_by_name(runs):
    assert "--zero-stage 3" in runs[0]["stage3"], runs[0]["stage3"]
