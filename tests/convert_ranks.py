"""The ranks of test_convert's multi-rank tests, in a module that imports no transformers.

A rank runs a function it finds by module and name, so it imports that module: test_convert imports transformers
(its reference models), ~2 s of CPU in every rank. Here the ranks import only what they run, and the model
configs come from the test process, made there without the transformers config object they were read from
(load_config of a transformers folder reads it through transformers' AutoConfig)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from hybrid.checkpoint import core, store
from hybrid.convert.presharded import TargetLayout
from hybrid.mesh import Mesh, ParallelDims
from hybrid.testing import each_case
from hybrid.tp import TPContext
from hybrid.train_step import OptimizerConfig
from hybrid.zero import ZeroConfig, ZeroOptimizer
from models import build_pipeline_chunks, shift_labels

# (name, (tp, pp, dp, ZeRO)): each converted model loaded and re-saved at its layout
RESAVE = [("gpt2", (1, 2, 2, 3)), ("llama-gqa", (4, 1, 1, 0)), ("mistral-window-tied", (2, 2, 1, 1))]
TARGET = TargetLayout(tp=2, pp=2)


def load_and_resave(rank, world, root, cfgs):
    """On each (tp, pp, dp, ZeRO) layout: the model and ZeroOptimizer train.py builds, its master weights
    loaded from the converted checkpoint (hybrid/checkpoint's resume path, model only) and saved again."""
    for name, (tp, pp, dp, zero) in RESAVE:
        mesh = Mesh.build(ParallelDims.from_world(world, tp=tp, pp=pp))
        model = build_pipeline_chunks(cfgs[name], TPContext(mesh.tp), mesh.coords.pp, pp, 1, seed=7)
        opt = ZeroOptimizer(model, mesh, ZeroConfig(stage=zero), OptimizerConfig())
        names = core.param_names(model)
        core.load(opt, names, None, store.final_path(os.path.join(root, name + ".ckpt"), 0), optim=False,
                  rng_too=False)
        state = {"model": os.path.join(root, name), "layout": {"tp": tp, "pp": pp, "dp": dp, "zero": zero},
                 "iteration": 1, "consumed_samples": 0}
        core.start_save(opt, names, None, os.path.join(root, name + ".resaved"), 1, state).finish()


def run_at_target(rank, world, root, ids, cfgs):
    """What a tp 2 x pp 2 run does with each pre-sharded checkpoint: the resume path (core.load, model only)
    into train.py's model and ZeroOptimizer (ZeRO 0), the logits and loss of a fixed batch through the two
    stages, and a save of its own (core.start_save) to compare chunk by chunk."""
    mesh = Mesh.build(ParallelDims.from_world(world, tp=TARGET.tp, pp=TARGET.pp))
    out = {}
    for name, cfg in cfgs.items():
        model = build_pipeline_chunks(cfg, TPContext(mesh.tp), mesh.coords.pp, TARGET.pp, 1, seed=7)
        opt = ZeroOptimizer(model, mesh, ZeroConfig(stage=0), OptimizerConfig())
        names = core.param_names(model)
        core.load(opt, names, None, store.final_path(os.path.join(root, name + ".ckpt"), 0), optim=False,
                  rng_too=False)
        with torch.no_grad():
            if mesh.is_first_stage:
                dist.send(model[0](ids).contiguous(), rank + TARGET.tp)  # stage 0 -> the same TP rank of stage 1
            else:
                h = torch.empty(ids.shape + (cfg.hidden_size,))
                dist.recv(h, rank - TARGET.tp)
                logits = mesh.tp.all_gather(model[0](h), dim=-1)[..., :cfg.vocab_size]
                out[name] = (logits, model[0](h, shift_labels(ids)).item())
        state = {"model": os.path.join(root, name), "layout": TARGET.layout(cfg), "iteration": 1,
                 "consumed_samples": 0}
        core.start_save(opt, names, None, os.path.join(root, name + ".run"), 1, state).finish()
    return out


CHECKS = {"resave": load_and_resave, "target": run_at_target}  # test_convert's two 4-rank checks


def _check(rank, world, args, kind):
    return CHECKS[kind](rank, world, *args[kind])


def both_checks(rank, world, args):
    """test_convert's two 4-rank checks in one launch -- its forks, process group and imports paid once --
    {(kind,): the check's result} (`args[kind]`: its arguments after rank and world), each a case of
    hybrid.testing.each_case: a check that raises is its own test's failure (case_result)."""
    return each_case(_check, [(kind,) for kind in CHECKS], rank, world, args)
