"""MoE checkpoints: every expert stored exactly once at any expert-parallel size, and loaded at any EP / TP / PP /
DP / ZeRO layout bit for bit, optimizer state and the routers' expert bias included; a checkpoint that lost an
expert fails naming it.

One 4-rank spawn trains tiny Mixtral (4 layers, 4 experts, expert bias on) for 2 steps at layout A, saves, then
loads that checkpoint at B, saves again, loads at C, saves, loads at D, saves. Each checkpoint is then read back
whole in this process (DCP with no process group, per key): every tensor -- master weights, both Adam moments,
the expert biases -- of B, C and D equals A's bit for bit. A load that put an expert in another's place, kept
an initial value, or read a moment from the wrong rows would be saved as it holds it, and differ.

The lost expert is the failure users of EP checkpoints report: a save where one EP rank's experts are not written
(simulated by making every expert on EP rank 1 un-owned) loads "successfully" elsewhere with the initial weights.
Here the load fails with one line naming the missing expert tensor."""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile

import pytest
import torch
import torch.distributed.checkpoint as dcp

from hybrid.checkpoint import core
from hybrid.checkpoint.store import CorruptCheckpoint
from hybrid.mesh import Mesh, ParallelDims
from hybrid.moe.config import MoEConfig
from hybrid.moe.layer import ExpertContext
from hybrid.moe.parallel import build_mesh
from hybrid.moe.params import is_expert
from hybrid.moe.runtime import owners as moe_owners
from hybrid.pipeline import ScheduleKind, build_schedule
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.testing import run_distributed
from hybrid.tp import ParallelRNG, TPContext
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from hybrid.zero import state as zero_state
from models import build_pipeline_chunks, from_hf
from moe_reference import hf_config
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)

WORLD, GLOBAL, SEQ = 4, 4, 16
OPT = OptimizerConfig(lr=1e-3, decay_style="constant")
# name: (tp, pp, ep, zero stage)
LAYOUTS = {"A-tp2sp-dp2-ep2-zero1": (2, 1, 2, 1), "B-dp4-ep4-zero3": (1, 1, 4, 3),
           "C-pp2-dp2-ep2-zero0": (1, 2, 2, 0), "D-tp2sp-pp2-ep1-zero2": (2, 2, 1, 2)}


def model_config():
    """Tiny Mixtral, 4 layers, 4 experts: made in the test process and passed to the ranks without the transformers
    config it was read from (unpickling one would import transformers in every rank, ~2 s of CPU each)."""
    return dataclasses.replace(from_hf(hf_config("mixtral", 4)), hf_config=None)


class Run:
    def __init__(self, layout, world, cfg):
        tp, pp, ep, zero = LAYOUTS[layout]
        self.cfg = cfg
        self.mesh = build_mesh(ParallelDims.from_world(world, tp=tp, pp=pp), ep)
        self.rng = ParallelRNG(5, self.mesh.coords.tp, self.mesh.coords.pp)
        moe = ExpertContext(MoEConfig(expert_parallel=ep, aux_loss_coeff=0.01, expert_bias=True,
                                      bias_update_rate=0.01), self.mesh.ep)
        self.model = build_pipeline_chunks(self.cfg, TPContext(self.mesh.tp, sequence_parallel=tp > 1, rng=self.rng),
                                           self.mesh.coords.pp, pp, seed=5, moe=moe)
        self.opt = ZeroOptimizer(self.model, self.mesh, ZeroConfig(stage=zero), OPT)
        self.names = core.param_names(self.model)
        self.tp, self.pp = tp, pp

    def batches(self, it):
        ids = torch.randint(0, 64, (GLOBAL, SEQ + 1), generator=torch.Generator().manual_seed(it))
        rows = GLOBAL // self.mesh.dims.dp
        d = self.mesh.coords.dp
        return [(ids[d * rows + i:d * rows + i + 1, :-1], ids[d * rows + i:d * rows + i + 1, 1:]) for i in range(rows)]

    def train(self, steps):
        m = GLOBAL // self.mesh.dims.dp
        if self.pp == 1:
            runner = LocalForwardBackward(self.model[0], self.mesh.device)
        else:
            schedule = build_schedule(ScheduleKind.ONE_F_ONE_B, self.pp, m)[self.mesh.coords.pp]
            runner = PipelineExecutor(self.model, schedule, self.mesh.pp,
                                      StageIO((1, SEQ // self.tp, self.cfg.hidden_size)), self.mesh.device)
        return [train_step(self.model, self.batches(it), self.opt, self.mesh, runner=runner) for it in range(steps)]

    def save(self, root):
        d = self.mesh.dims
        state = {"iteration": 2, "consumed_samples": 8, "model": "tiny-mixtral-4-experts",
                 "layout": {"tp": d.tp, "pp": d.pp, "dp": d.dp, "zero": self.opt.cfg.stage}}
        core.save_state(self.owners(), root, 2, state).finish()
        return os.path.join(root, "iter_0000002")

    def load(self, directory):
        return core.load_state(self.owners(rng_too=False), directory)

    def owners(self, rng_too=True):
        """What train.py's checkpoint collects (hybrid/train/loop.py): the optimizer, the RNG, the routers' biases."""
        return {**core.statefuls(self.opt, self.names, self.rng, rng_too=rng_too), **moe_owners(self.model)}


def _chain(rank, world, root, cfg):
    order = list(LAYOUTS)
    first = Run(order[0], world, cfg)
    losses = first.train(2)
    dirs = {order[0]: first.save(os.path.join(root, order[0]))}
    for prev, name in zip(order, order[1:]):
        run = Run(name, world, cfg)
        run.load(dirs[prev])
        dirs[name] = run.save(os.path.join(root, name))
    # a save that loses EP rank 1's experts (each is written by nobody), then a load elsewhere: the trained run at A
    # saved again (its save above changed nothing in it), this time with EP rank 1's experts owned by nobody
    bad = first
    owner = zero_state.is_owner  # who writes each piece (hybrid/stateful.is_owner, as zero/state.py reads it)
    zero_state.is_owner = lambda p, *a: False if is_expert(p) and bad.mesh.ep.rank == 1 else owner(p, *a)
    try:
        lossy = bad.save(os.path.join(root, "lossy"))
    finally:
        zero_state.is_owner = owner
    try:
        Run(order[1], world, cfg).load(lossy)
        error = None
    except CorruptCheckpoint as e:
        error = str(e)
    return {"dirs": dirs, "losses": losses, "error": error}


def read_all(directory):
    """Every tensor of a checkpoint, whole (DCP, no process group: one load of every key, each into a tensor of
    its full size), and each key's stored chunk volume."""
    meta = dcp.FileSystemReader(directory).read_metadata().state_dict_metadata
    out, volume = {}, {}
    for key, m in meta.items():
        if key.startswith("rng/"):
            continue
        out[key] = torch.empty(tuple(m.size), dtype=m.properties.dtype)
        volume[key] = sum(math.prod(c.sizes) for c in m.chunks)
    dcp.load(out, storage_reader=dcp.FileSystemReader(directory), no_dist=True)
    return out, volume


@pytest.fixture(scope="module")
def chain():
    root = tempfile.mkdtemp(prefix="moe-ckpt-")
    per_rank = run_distributed(_chain, WORLD, args=(root, model_config()), timeout=1500)
    r = per_rank[0]
    return {name: read_all(d) for name, d in r["dirs"].items()}, r


def test_every_expert_is_stored_exactly_once_at_every_ep(chain):
    states, _ = chain
    cfg = model_config()
    experts = {f"{kind}/layers.{layer}.mlp.experts.{e}.{proj}.weight"
               for kind in ("model", "optim.exp_avg", "optim.exp_avg_sq")
               for layer in range(cfg.num_layers) for e in range(cfg.num_experts)
               for proj in ("gate_proj", "up_proj", "down_proj")}
    for name, (tensors, volume) in states.items():
        assert experts <= set(tensors), f"{name}: missing {sorted(experts - set(tensors))[:3]}"
        for key, t in tensors.items():  # the saved chunks tile each tensor: every element written once
            assert volume[key] == t.numel(), f"{name}: {key} stored {volume[key]} elements for {t.numel()}"
        assert {f"moe/layers.{i}.mlp.gate.expert_bias" for i in range(cfg.num_layers)} <= set(tensors)


@pytest.mark.parametrize("name", list(LAYOUTS)[1:])
def test_loaded_at_another_layout_bit_for_bit(chain, name):
    """Master weights, Adam moments and expert biases of the checkpoint saved after loading at `name` = the
    original's (layout A), bit for bit."""
    states, _ = chain
    ref, _ = states[list(LAYOUTS)[0]]
    got, _ = states[name]
    assert set(got) == set(ref)
    differing = [k for k in ref if not torch.equal(got[k], ref[k])]
    assert not differing, f"{len(differing)} tensors differ, e.g. {differing[:3]}"


def test_expert_bias_was_trained(chain):
    """The saved biases moved off zero in steps of the update rate (DeepSeek-V3's update ran, +-0.01 a step;
    an expert loaded exactly at the mean, or up one step and down the next, stays at 0)."""
    states, _ = chain
    ref, _ = states[list(LAYOUTS)[0]]
    biases = torch.stack([t for k, t in ref.items() if k.endswith("expert_bias")])
    assert biases.abs().sum() > 0
    assert torch.allclose(biases / 0.01, (biases / 0.01).round(), atol=1e-5) and biases.abs().max() <= 0.02 + 1e-7


def test_a_checkpoint_missing_an_expert_fails_naming_it(chain):
    _, r = chain
    assert r["error"] is not None and "\n" not in r["error"]
    assert ".mlp.experts." in r["error"] and "Missing key" in r["error"], r["error"]
