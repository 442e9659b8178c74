"""The ZeRO optimizer's checkpointable state, as a sharded state dict (hybrid/stateful.py): the model's weights
(its fp32 master shards) and Adam's moments as pieces of each global parameter, Adam's step and the fp16 loss
scaler as plain values.

    "model/NAME"              fp32 master weights of the parameter with global name NAME (layout-independent)
    "optim.exp_avg/NAME"      AdamW first moment, the same pieces
    "optim.exp_avg_sq/NAME"   AdamW second moment
    "adam_step"               AdamW's step count
    "scaler"                  {"loss_scale", "good_steps", "skipped_steps"}

The compute-dtype parameters are not state: they are the master weights cast (bf16/fp16) or the master weights
themselves (fp32), and `load_state_dict` rebuilds them (`ZeroOptimizer.sync_params_from_master`). Which pieces a
rank holds follows from its units' flat ranges and each parameter's ShardSpec (hybrid/stateful.py's geometry).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import torch

from hybrid.moe.params import is_expert
from hybrid.stateful import Shards, flat_rectangles, global_box, is_owner
from hybrid.tp import spec_of
from hybrid.tp.sharding import full_shape

MOMENTS = ("exp_avg", "exp_avg_sq")
MODEL = "model"


@dataclass(frozen=True)
class Chunk:
    """One rectangle of a global parameter held by this rank: `view(seg)[lo:hi]` reshaped to `sizes`.

    Attributes:
        name: the parameter's global name (the state-dict key, after a prefix).
        global_shape: the full, unsharded, unpadded shape.
        offsets, sizes: the rectangle in global coordinates.
        unit, seg: ZeroOptimizer.units[unit].segments[seg] holds it.
        lo, hi: the flat range inside that segment.
        owner: this rank writes it on save (hybrid/stateful.py).
    """

    name: str
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    unit: int
    seg: int
    lo: int
    hi: int
    owner: bool


def param_names(model) -> dict[int, str]:
    """id(param) -> global name, for every chunk of a pipeline rank (names are layout-independent)."""
    names: dict[int, str] = {}
    for chunk in (model if isinstance(model, torch.nn.ModuleList) else [model]):
        for n, p in chunk.named_parameters():
            names.setdefault(id(p), n)
    return names


def optimizer_chunks(opt, names: dict[int, str]) -> list[Chunk]:
    """Every chunk of every parameter in a ZeroOptimizer's master shards on this rank. `names` maps id(param)
    to its global name."""
    tp_rank = opt.mesh.tp.rank
    out = []
    for ui, u in enumerate(opt.units):
        a, _ = u.shard_range
        offsets = {id(p): off for p, off in zip(u.params, u.offsets)}
        for si, s in enumerate(u.segments):
            p = s.param
            if p.dim() > 2:
                raise ValueError(f"checkpoint: parameter {names[id(p)]} has {p.dim()} dims; at most 2 are supported")
            f0 = s.lo + a - offsets[id(p)]  # flat range of p inside this segment
            dp_rank = (opt.mesh.expert_dp if is_expert(p) else opt.dp).rank  # MoE experts: their expert-DP rank
            owner = is_owner(p, tp_rank, dp_rank, opt.cfg.sharded, id(p) in opt.duplicates)
            for rect in flat_rectangles(f0, f0 + s.hi - s.lo, math.prod(p.shape[1:])):
                g = global_box(p, tp_rank, rect)
                if g is None:
                    continue
                (off, size), start, stop = g
                out.append(Chunk(names[id(p)], full_shape(p, spec_of(p)), off, size, ui, si,
                                 start - f0, stop - f0, owner))
    return out


# --- Adam's state ---------------------------------------------------------------------------------------------
def ensure_adam_state(opt) -> None:
    """Zero moments and step 0 where AdamW has not stepped yet, laid out as the optimizer itself would
    create them (torch: a float32 step tensor, on the device when fused; DeepSpeed's CPU Adam: an int)."""
    deepspeed = opt.optimizer_kind.startswith("deepspeed")
    for group in opt.optimizer.param_groups:
        for p in group["params"]:
            st = opt.optimizer.state[p]
            if st:
                continue
            if deepspeed:
                st["step"] = 0
            else:
                on_device = group.get("fused") or group.get("capturable")
                st["step"] = torch.zeros((), dtype=torch.float32, device=p.device if on_device else "cpu")
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def adam_step(opt) -> int:
    """AdamW's step count (the same for every parameter; 0 before the first step)."""
    for group in opt.optimizer.param_groups:
        for p in group["params"]:
            st = opt.optimizer.state.get(p)
            if st and "step" in st:
                return int(st["step"])
    return 0


def set_adam_step(opt, step: int) -> None:
    for group in opt.optimizer.param_groups:
        for p in group["params"]:
            st = opt.optimizer.state[p]
            if torch.is_tensor(st["step"]):
                st["step"].fill_(float(step))
            else:
                st["step"] = step
    if opt.optimizer_kind.startswith("deepspeed"):
        _replay_deepspeed_step(opt.optimizer, step)


def _replay_deepspeed_step(optimizer, step: int) -> None:
    """DeepSpeed's CPU Adam keeps beta1^t, beta2^t in C++, multiplied once per step; a fresh optimizer at
    step t would take std::pow instead -- another rounding. Replaying steps 1..t on a one-element dummy
    rebuilds the products bit for bit (the dummy's update is thrown away)."""
    group = optimizer.param_groups[0]
    b1, b2 = group["betas"]
    dummy = [torch.zeros(1) for _ in range(4)]
    for s in range(1, step + 1):
        optimizer.ds_opt_adam.adam_update(optimizer.opt_id, s, group["lr"], b1, b2, group["eps"], 0.0,
                                          group["bias_correction"], *dummy)


def scaler_state(opt) -> dict:
    return {"loss_scale": opt.loss_scale, "good_steps": opt.good_steps, "skipped_steps": opt.skipped_steps}


def load_scaler_state(opt, state: dict) -> None:
    opt.loss_scale, opt.good_steps, opt.skipped_steps = state["loss_scale"], state["good_steps"], state["skipped_steps"]


# --- the state dict -------------------------------------------------------------------------------------------
def key(kind: str, name: str) -> str:
    return f"{MODEL}/{name}" if kind == MODEL else f"optim.{kind}/{name}"


def _view(opt, c: Chunk, kind: str) -> torch.Tensor:
    base = opt.units[c.unit].views[c.seg] if kind == MODEL else opt.moment(c.unit, c.seg, kind)
    return base[c.lo:c.hi].view(c.sizes)


def state_dict(opt, optimizer: bool = True, names: dict[int, str] | None = None) -> dict[str, object]:
    """The master weights (and with `optimizer` the Adam moments, step and loss scaler) as `Shards` of each
    global parameter -- views of the live state -- and plain values. First `before_param_writes`: post-step
    parameter all-gathers in flight waited for (the master shards view the buffers they write) and, with shm_gather,
    the peer's take of this rank's shards (a load fills these views in place: in fp32 they are the shards the peer
    copies from); creates Adam's state where it has not stepped yet, so that a load has somewhere to put it."""
    opt.before_param_writes()
    if optimizer:
        ensure_adam_state(opt)
    by_name: dict[str, list[Chunk]] = defaultdict(list)
    for c in _one_per_box(optimizer_chunks(opt, names or param_names(opt.model)))[0]:
        by_name[c.name].append(c)
    out: dict[str, object] = {}
    for kind in (MODEL, *MOMENTS) if optimizer else (MODEL,):
        for name, cs in by_name.items():
            out[key(kind, name)] = Shards(cs[0].global_shape, [_view(opt, c, kind) for c in cs],
                                          [(c.offsets, c.sizes) for c in cs], write=cs[0].owner)
    if optimizer:
        out.update(adam_step=adam_step(opt), scaler=scaler_state(opt))
    return out


def load_state_dict(opt, state: dict[str, object]) -> None:
    """After the checkpoint filled `state_dict()`'s pieces in place: Adam's step and the loss scaler when given,
    then the compute parameters rebuilt from the master weights."""
    if "adam_step" in state:
        set_adam_step(opt, state["adam_step"])
    if "scaler" in state:
        load_scaler_state(opt, state["scaler"])
    kinds = (MODEL, *MOMENTS) if "adam_step" in state else (MODEL,)
    for twin, kept in _one_per_box(optimizer_chunks(opt, param_names(opt.model)))[1]:
        for kind in kinds:  # the second copy of a tied weight on this rank: the values just loaded
            _view(opt, twin, kind).copy_(_view(opt, kept, kind))
    opt.sync_params_from_master()


def _one_per_box(chunks: list[Chunk]) -> tuple[list[Chunk], list[tuple[Chunk, Chunk]]]:
    """One chunk per (name, global box), the written one first, and the (twin, kept) pairs left out: a tied
    embedding whose two copies sit on one rank (pp = 1 with v chunks; zbv's first and last stage, both on pp rank
    0) has the same box twice, which DCP refuses as overlapping pieces -- and only one of them is written."""
    kept: dict[tuple, Chunk] = {}
    twins = []
    for c in sorted(chunks, key=lambda c: not c.owner):  # stable: owners first, else the order given
        box = (c.name, tuple(c.offsets), tuple(c.sizes))
        if box in kept:
            twins.append((c, kept[box]))
        else:
            kept[box] = c
    keep = {id(k) for k in kept.values()}
    return [c for c in chunks if id(c) in keep], twins
