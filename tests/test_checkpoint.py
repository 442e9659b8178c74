"""Checkpoints (hybrid/checkpoint): exact resume, resharding to any layout, atomicity and corruption,
asynchronous saves, and the train.py flags.

References are independent of the checkpoint code: the uninterrupted run (exact resume), and tensors
gathered by a separate path -- parameters with the ZeRO engine's own gather and ShardSpec's gather_full,
Adam moments by all-gathering each flat unit over DP, cutting it at the unit's parameter offsets and
gathering over TP -- on the saving and on the loading layout (resharding). Everything is fp32 and must
be bit-identical (torch.equal): a checkpoint copies values, it computes nothing.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from hybrid.checkpoint import core, store
from hybrid.checkpoint.faults import ENV as CRASH_ENV, SimulatedCrash
from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.mesh import Mesh, ParallelDims
from hybrid.pipeline import ScheduleKind, build_schedule
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.testing import run_distributed
from hybrid.tp import ParallelRNG, TPContext, gather_full, spec_of
from hybrid.training import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from models import build_pipeline_chunks, load_config

GLOBAL, MICRO, SEQ, N = 8, 2, 16, 2  # N steps before and after the save
# train.py's optimizer defaults (hybrid/train/loop.py builds OptimizerConfig from these flags)
OPT = OptimizerConfig(lr=1e-3, min_lr=1e-4, weight_decay=0.01, beta1=0.9, beta2=0.95, warmup_iters=1,
                      decay_style="cosine", train_iters=2 * N, clip_grad=1.0)
LLAMA_ODD_VOCAB = ("tiny-llama", 259)  # 259 rows: padded at tp 2 and 4; 2 kv-heads < tp 4


def model_cfg(name: str, vocab: int | None = None):
    cfg = load_config(name)
    return dataclasses.replace(cfg, vocab_size=vocab) if vocab else cfg


class Run:
    """One model + ZeroOptimizer + runner at a layout, trained as train.py trains."""

    def __init__(self, mesh: Mesh, model: tuple[str, int | None], zero: ZeroConfig, seed: int = 5):
        self.mesh, self.cfg = mesh, model_cfg(*model)
        self.rng = ParallelRNG(seed, mesh.coords.tp, mesh.coords.pp)
        tp = TPContext(mesh.tp, rng=self.rng)
        self.model = build_pipeline_chunks(self.cfg, tp, mesh.coords.pp, mesh.dims.pp, 1, seed=seed)
        self.spec = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp)
        if mesh.dims.pp == 1:
            self.runner = LocalForwardBackward(self.model[0], mesh.device)
        else:
            schedule = build_schedule(ScheduleKind.ONE_F_ONE_B, mesh.dims.pp, self.spec.num_micro_batches)
            self.runner = PipelineExecutor(self.model, schedule[mesh.coords.pp], mesh.pp,
                                           StageIO((MICRO, SEQ, self.cfg.hidden_size), torch.float32), mesh.device)
        self.opt = ZeroOptimizer(self.model, mesh, zero, OPT)
        self.names = core.param_names(self.model)

    def train(self, start: int, stop: int, corpus) -> list[float]:
        return [train_step(self.model, micro_batches(corpus, self.spec, 3, it, self.mesh.coords.dp), self.opt,
                           self.mesh, lr=OPT.lr_at(it), runner=self.runner) for it in range(start, stop)]

    def save(self, root: str, iteration: int, asynchronous: bool = False) -> core.PendingSave:
        return core.start_save(self.opt, self.names, self.rng, root, iteration, {"iteration": iteration},
                               asynchronous=asynchronous)

    def load(self, directory: str, rng: bool = True) -> dict:
        return core.load(self.opt, self.names, self.rng, directory, rng_too=rng)


def full_state(run: Run) -> dict[str, dict[str, torch.Tensor]]:
    """name -> {param, exp_avg, exp_avg_sq}: full tensors gathered without the checkpoint code (see the
    module docstring). Every rank returns its pipeline stage's parameters."""
    opt, mesh = run.opt, run.mesh
    out: dict[str, dict[str, torch.Tensor]] = {}
    with opt.gathered():
        for n, p in run.model.named_parameters():
            out.setdefault(n.split(".", 1)[1], {})["param"] = gather_full(p.detach().float(), spec_of(p), mesh.tp).clone()
    for kind in core.MOMENTS:
        for u in opt.units:
            shard = torch.zeros(u.shard_numel)
            for v, s in zip(u.views, u.segments):
                st = opt.optimizer.state.get(v)
                if st:
                    shard[s.lo:s.hi] = st[kind].float().cpu()
            flat = torch.cat(mesh.dp.all_gather(shard, dim=0).chunk(opt.dp.size)) if opt.cfg.sharded else shard
            for p, off in zip(u.params, u.offsets):
                local = flat[off:off + p.numel()].view(p.shape)
                name = next(n for n, q in run.model.named_parameters() if q is p).split(".", 1)[1]
                out[name][kind] = gather_full(local, spec_of(p), mesh.tp).clone()
    return out


def adam_step(run: Run) -> int:
    return core.adam_step(run.opt)


# --- (1) exact resume at tp2 x pp2 x dp2 ----------------------------------------------------------------
RESUME_CASES = [(m, z, off) for m in ("tiny-gpt2", "tiny-llama") for z, off in ((0, False), (1, False), (3, False),
                                                                                  (3, True))]


def zero_cfg(stage: int, offload: bool) -> ZeroConfig:
    """train.py's defaults: --cpu-adam auto (DeepSpeed's CPU Adam where it builds) when offloading."""
    return ZeroConfig(stage=stage, offload_optimizer=offload, offload_params=offload and stage == 3)


def _resume_phase(rank, world, root, phase, cases=tuple(RESUME_CASES)):
    mesh = Mesh.build(ParallelDims.from_world(world, tp=2, pp=2))
    corpus = load_corpus()
    out = {}
    for m, z, off in cases:
        key = f"{m}-z{z}{'-offload' if off else ''}"
        run = Run(mesh, (m, None), zero_cfg(z, off))
        if phase == "straight":  # 2N steps, saving after N (the save must not perturb the run)
            losses = run.train(0, N, corpus)
            run.save(os.path.join(root, key), N).finish()
            losses += run.train(N, 2 * N, corpus)
        else:  # fresh processes: load after N, train N
            state = run.load(store.final_path(os.path.join(root, key), N))
            assert state["iteration"] == N
            losses = run.train(N, 2 * N, corpus)
        out[key] = (losses, full_state(run), adam_step(run))
    return out


@pytest.fixture(scope="module")
def resume(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("resume"))
    straight = run_distributed(_resume_phase, 8, args=(root, "straight"), timeout=600)
    resumed = run_distributed(_resume_phase, 8, args=(root, "resumed"), timeout=600)
    return straight, resumed


@pytest.mark.parametrize("case", [f"{m}-z{z}{'-offload' if off else ''}" for m, z, off in RESUME_CASES])
def test_resume_after_save_is_bit_identical_to_the_uninterrupted_run(resume, case):
    straight, resumed = resume
    for rank in range(8):
        a, b = straight[rank][case], resumed[rank][case]
        assert a[0][N:] == b[0], f"rank {rank}: losses after the resume differ"
        assert a[2] == b[2] == 2 * N
        for name in a[1]:
            for kind in a[1][name]:
                assert torch.equal(a[1][name][kind], b[1][name][kind]), f"rank {rank}: {name} {kind}"
