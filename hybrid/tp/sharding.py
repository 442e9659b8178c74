"""What part of the full ("logical") tensor each parameter shard holds.

Every parameter made by a hybrid layer carries a `ShardSpec` (as `param.shard`). The spec is the one
place that knows how a shard maps onto the unsharded tensor, so these all read it and nothing else:

* initialisation: build the full tensor from a per-parameter seed, keep this rank's slice -- so tp=1
  and tp=4 start from identical full weights;
* checkpoint loading: read only this rank's slice from a safetensors file (`get_slice`);
* gathering a shard (or its gradient) back to full shape, for tests and conversion;
* the gradient fix-up for parameters whose gradient is a partial sum over TP ranks.

A shard along `dim` holds logical rows [start, start + length) and may be longer than `length`
(vocabulary padding: the extra rows are zeros and are never read).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn as nn

from hybrid.comm import Group

InitFn = Callable[[torch.Tensor, torch.Generator], None]


@dataclass(frozen=True)
class ShardSpec:
    """How one parameter shard maps onto its full tensor.

    Attributes:
        dim: the split dimension, or None if every TP rank holds the whole tensor.
        full_size: length of the full (unpadded) tensor along `dim`.
        starts: logical start offset of the shard held by each TP rank (index = tp rank).
        length: logical rows held along `dim` (<= the shard's size; the rest is padding).
        partial_grad: the shard's gradient is a partial sum that must be summed over the TP ranks
            that hold the same rows -- norms and biases applied on sequence-parallel shards, and
            key/value heads replicated because tp exceeds their number.
    """

    dim: int | None = None
    full_size: int = 0
    starts: tuple[int, ...] = (0,)
    length: int = 0
    partial_grad: bool = False

    def start(self, tp_rank: int) -> int:
        return self.starts[tp_rank]


REPLICATED = ShardSpec()


def split_spec(full_size: int, tp_size: int, dim: int, padded_size: int | None = None) -> ShardSpec:
    """Even split of `full_size` rows over tp ranks; with padding each rank owns padded/tp rows of
    the padded range, of which only those below `full_size` are real."""
    per_rank = (padded_size or full_size) // tp_size
    # with padding the last ranks may hold fewer (or zero) real rows: logical_rows() clips them.
    return ShardSpec(dim=dim, full_size=full_size, starts=tuple(r * per_rank for r in range(tp_size)),
                     length=per_rank)


def logical_rows(spec: ShardSpec, tp_rank: int) -> tuple[int, int]:
    """(start, count) of the real rows rank `tp_rank` holds along spec.dim."""
    start = spec.start(tp_rank)
    return start, max(0, min(spec.length, spec.full_size - start))


def set_spec(p: nn.Parameter, spec: ShardSpec, init: InitFn | None = None) -> nn.Parameter:
    p.shard = spec
    p.init_fn = init
    return p


def spec_of(p: torch.Tensor) -> ShardSpec:
    return getattr(p, "shard", REPLICATED)


def split_rank(p: torch.Tensor, tp_rank: int) -> int:
    """The index of this rank's shard of p in spec.starts: its TP rank, unless p is split over another group --
    an MoE expert's width over the expert-TP group (hybrid/moe/experts.py), whose rank it carries as `split_rank`."""
    return getattr(p, "split_rank", tp_rank)


def full_shape(p: torch.Tensor, spec: ShardSpec) -> tuple[int, ...]:
    shape = list(p.shape)
    if spec.dim is not None:
        shape[spec.dim] = spec.full_size
    return tuple(shape)


def param_seed(seed: int, name: str) -> int:
    """One seed per parameter name: names are the same for every layout, so are the weights."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


@torch.no_grad()
def init_parameters(module: nn.Module, seed: int, tp_rank: int) -> None:
    """Initialise every parameter from its full tensor, so the result is independent of tp.

    Costs one full-size temporary per parameter (freed at once); real-size models load checkpoints.
    """
    for name, p in module.named_parameters():
        init = getattr(p, "init_fn", None)
        if init is None:
            continue
        spec = spec_of(p)
        gen = torch.Generator().manual_seed(param_seed(seed, name))
        full = torch.empty(full_shape(p, spec), dtype=torch.float32)
        init(full, gen)
        p.zero_()
        copy_logical_slice(p, full, spec, split_rank(p, tp_rank))


def copy_logical_slice(p: torch.Tensor, full: torch.Tensor, spec: ShardSpec, tp_rank: int) -> None:
    """p[:count] = full[start:start+count] along spec.dim (the whole tensor if replicated)."""
    if spec.dim is None:
        p.copy_(full)
        return
    start, count = logical_rows(spec, tp_rank)
    if count:
        p.narrow(spec.dim, 0, count).copy_(full.narrow(spec.dim, start, count))


def gather_full(t: torch.Tensor, spec: ShardSpec, tp: Group) -> torch.Tensor:
    """The full, unpadded tensor from every rank's shard `t` (a parameter or its gradient)."""
    if spec.dim is None or tp.size == 1:
        return t.narrow(spec.dim, 0, spec.full_size) if spec.dim is not None else t
    chunks = tp.all_gather(t.detach().contiguous(), dim=spec.dim).chunk(tp.size, dim=spec.dim)
    full = torch.zeros(full_shape(t, spec), dtype=t.dtype, device=t.device)
    for r, chunk in enumerate(chunks):
        start, count = logical_rows(spec, r)
        if count:
            full.narrow(spec.dim, start, count).copy_(chunk.narrow(spec.dim, 0, count))
    return full


@torch.no_grad()
def param_grad(p: nn.Parameter) -> torch.Tensor | None:
    """p.grad: where backward leaves a parameter's gradient unless the caller keeps it elsewhere."""
    return p.grad


def sync_partial_grads(params: Iterable[nn.Parameter], tp: Group,
                       grad: Callable[[nn.Parameter], torch.Tensor | None] = param_grad) -> None:
    """Sum partial gradients over TP, in one all-reduce.

    Each partial parameter gets a slot the size of its full tensor in one flat buffer; every rank
    adds its gradient at its own rows, the buffer is all-reduced over TP, and each rank reads its
    rows back. Replicas of the same rows thus all end with the full sum. `grad(p)` is the tensor
    holding p's gradient (ZeRO's fp32 gradients keep it in a flat fp32 buffer, not in p.grad); the
    all-reduce runs in its dtype.
    """
    pairs = [(p, grad(p)) for p in params if spec_of(p).partial_grad]
    partial, grads = [p for p, g in pairs if g is not None], {id(p): g for p, g in pairs if g is not None}
    if tp.size == 1 or not partial:
        return
    fulls = [torch.zeros(full_shape(p, spec_of(p)), dtype=grads[id(p)].dtype, device=grads[id(p)].device)
             for p in partial]
    tp_rank = tp.rank
    for p, full in zip(partial, fulls):
        _slot(full, spec_of(p), tp_rank).copy_(_real(grads[id(p)], spec_of(p), tp_rank))
    flat = torch.cat([f.flatten() for f in fulls])
    tp.all_reduce(flat)
    offset = 0
    for p, full in zip(partial, fulls):
        full.copy_(flat[offset:offset + full.numel()].view_as(full))
        offset += full.numel()
        _real(grads[id(p)], spec_of(p), tp_rank).copy_(_slot(full, spec_of(p), tp_rank))


def _slot(full: torch.Tensor, spec: ShardSpec, tp_rank: int) -> torch.Tensor:
    if spec.dim is None:
        return full
    start, count = logical_rows(spec, tp_rank)
    return full.narrow(spec.dim, start, count)


def _real(shard: torch.Tensor, spec: ShardSpec, tp_rank: int) -> torch.Tensor:
    if spec.dim is None:
        return shard
    return shard.narrow(spec.dim, 0, logical_rows(spec, tp_rank)[1])
