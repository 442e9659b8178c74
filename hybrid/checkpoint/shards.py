"""Which chunks of which global tensors this rank holds: ZeRO flat ranges and TP shards as rectangles.

A checkpoint key is a parameter's global name (`h.3.attn.q.weight`: the same for every pipeline layout,
models/common.StageLayout) and its value is the full, TP-unsharded, unpadded tensor. A rank never builds
that tensor; it describes the parts it holds, and DCP writes and reads just those parts.

ZeRO keeps a unit's parameters end to end in one flat buffer and gives rank r the range
[r S, (r+1) S). Inside one parameter p of local (TP-shard) shape (R, C) that range is a flat interval
[f0, f1) of p's row-major elements, which is at most three rectangles -- each one a contiguous slice of
the flat buffer, so its tensor is a view of the fp32 master shard with no copy:

    rows r0 = f0 // C, r1 = f1 // C;  cols c0 = f0 % C, c1 = f1 % C
    [r0, c0 : C]          partial first row   (when c0 > 0)
    [r0' : r1, 0 : C]     whole rows
    [r1, 0 : c1]          partial last row    (when c1 > 0)

A 1-D parameter is the case C = 1. Each local rectangle is then moved to global coordinates by the TP
shard's start along its split dimension (ShardSpec.starts), and clipped to the real rows (vocabulary
padding is not saved; a layout with other padding re-creates zeros there).

Each global element must be written exactly once, so a chunk is *owned* (written) by one rank: DP rank 0
when the optimizer state is not sharded (ZeRO 0), TP rank 0 for TP-replicated parameters, the first TP
rank holding a replicated kv-head, the first pipeline stage for tied embeddings. Every rank *reads*
every chunk it holds, owned or not.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, ShardedTensorMetadata
from torch.distributed._shard.sharded_tensor.api import ShardedTensorBase
from torch.distributed._shard.sharded_tensor.metadata import TensorProperties

from hybrid.moe.params import is_expert
from hybrid.tp import spec_of
from hybrid.tp.sharding import full_shape, logical_rows

# DCP warns on every ShardedTensor that DTensor is preferred; docs/checkpoint.md says why we use it here
warnings.filterwarnings("ignore", message="Please use DTensor instead", category=FutureWarning)

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes)


@dataclass(frozen=True)
class Chunk:
    """One rectangle of a global parameter held by this rank: `view(seg)[lo:hi]` reshaped to `sizes`.

    Attributes:
        name: the parameter's global name (the checkpoint key, after a prefix).
        global_shape: the full, unsharded, unpadded shape.
        offsets, sizes: the rectangle in global coordinates.
        unit, seg: ZeroOptimizer.units[unit].segments[seg] holds it.
        lo, hi: the flat range inside that segment.
        owner: this rank writes it on save (see the module docstring).
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


def flat_rectangles(f0: int, f1: int, cols: int) -> list[tuple[int, int, int, int]]:
    """The flat row-major range [f0, f1) of a (rows, cols) tensor as (row, col, n_rows, n_cols) rectangles
    (at most three, each contiguous in the flat order)."""
    r0, c0 = divmod(f0, cols)
    r1, c1 = divmod(f1, cols)
    if r0 == r1:
        return [(r0, c0, 1, c1 - c0)] if c1 > c0 else []
    out = []
    if c0:
        out.append((r0, c0, 1, cols - c0))
        r0 += 1
    if r1 > r0:
        out.append((r0, 0, r1 - r0, cols))
    if c1:
        out.append((r1, 0, 1, c1))
    return out


def _to_global(p: torch.Tensor, tp_rank: int, rect: tuple[int, int, int, int]) -> tuple[Box, int, int] | None:
    """A local rectangle of p as a global (offsets, sizes), and the flat [start, stop) of p it keeps after
    clipping padding rows; None when it lies wholly in the padding."""
    spec = spec_of(p)
    cols = math.prod(p.shape[1:])
    row, col, nr, nc = rect
    if spec.dim is not None and spec.dim > 0:
        if p.dim() != 2 or p.shape[1] != spec.length or logical_rows(spec, tp_rank)[1] != spec.length:
            raise ValueError(f"checkpoint: a TP split along dim {spec.dim} of a {p.dim()}-D tensor with padding "
                             f"is not supported")
    if spec.dim == 0:
        count = logical_rows(spec, tp_rank)[1]
        nr = min(row + nr, count) - row
        if nr <= 0:
            return None
    start = (row * cols + col, (row + nr - 1) * cols + col + nc)
    off = [row, col] if p.dim() == 2 else [row]
    size = [nr, nc] if p.dim() == 2 else [nr]
    if spec.dim is not None:
        off[spec.dim] += spec.start(tp_rank)
    return (tuple(off), tuple(size)), start[0], start[1]


def shard_box(p: torch.Tensor, tp_rank: int) -> Box | None:
    """The global box of p's whole TP shard (its real rows): the one chunk a rank saves of p when its ZeRO shard
    holds all of p (dp 1, or ZeRO 0). None when the shard is all vocabulary padding."""
    rect, = flat_rectangles(0, p.numel(), math.prod(p.shape[1:]))
    g = _to_global(p, tp_rank, rect)
    return None if g is None else g[0]


def is_owner(p: torch.Tensor, tp_rank: int, dp_rank: int, sharded: bool, duplicate: bool) -> bool:
    """This rank writes p's chunks (each global element once; see the module docstring). An MoE expert's
    `dp_rank` is its expert-DP rank: the expert lives on one rank of each expert-DP replica, whichever TP rank
    that is (hybrid/moe/parallel.py), so no TP rank is skipped."""
    if duplicate or (not sharded and dp_rank != 0):
        return False
    spec = spec_of(p)
    if is_expert(p) and spec.dim is None:
        return True
    if spec.dim is None:
        return tp_rank == 0
    return spec.starts.index(spec.starts[tp_rank]) == tp_rank


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
            dp_rank = (opt.mesh.expert_dp if is_expert(p) else opt.dp).rank
            owner = is_owner(p, tp_rank, dp_rank, opt.cfg.sharded, id(p) in opt.duplicates)
            for rect in flat_rectangles(f0, f0 + s.hi - s.lo, math.prod(p.shape[1:])):
                g = _to_global(p, tp_rank, rect)
                if g is None:
                    continue
                (off, size), start, stop = g
                out.append(Chunk(names[id(p)], full_shape(p, spec_of(p)), off, size, ui, si,
                                 start - f0, stop - f0, owner))
    return out


def complement(shape: tuple[int, ...], boxes: list[Box]) -> list[Box]:
    """Boxes covering what `boxes` (disjoint) leave of a tensor of `shape`: split the whole along the first
    box's faces and recurse (a guillotine cut)."""
    def rec(lo: list[int], hi: list[int], inside: list[Box]) -> list[Box]:
        inside = [b for b in inside if all(o < h and o + s > l for o, s, l, h in zip(*b, lo, hi))]
        if not inside:
            return [(tuple(lo), tuple(h - l for l, h in zip(lo, hi)))] if all(h > l for l, h in zip(lo, hi)) else []
        off, size = inside[0]
        for d in range(len(shape)):
            cut = [max(lo[d], off[d]), min(hi[d], off[d] + size[d])]
            if cut[0] > lo[d] or cut[1] < hi[d]:
                out = []
                for a, b in ((lo[d], cut[0]), (cut[0], cut[1]), (cut[1], hi[d])):
                    if b > a:
                        out += rec(lo[:d] + [a] + lo[d + 1:], hi[:d] + [b] + hi[d + 1:], inside)
                return out
        return []  # the first box fills this one
    return rec([0] * len(shape), list(shape), boxes)


def sharded_tensor(tensors: list[torch.Tensor], boxes: list[Box], shape: tuple[int, ...]) -> ShardedTensor:
    """A ShardedTensor of global `shape` whose local shards are `tensors` at `boxes` -- Megatron's torch_dist
    encoding. Built with no communication: the global metadata lists this rank's shards and placeholder
    shards for the rest (DCP reads and writes only the local shards; the placeholders only make the
    metadata's volume check pass)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    metas = [ShardMetadata(list(o), list(s), placement=f"rank:{rank}/{t.device}") for t, (o, s) in zip(tensors, boxes)]
    rest = [ShardMetadata(list(o), list(s), placement=f"rank:{rank}/cpu") for o, s in complement(shape, boxes)]
    props = TensorProperties(dtype=tensors[0].dtype, layout=torch.strided, requires_grad=False,
                             memory_format=torch.contiguous_format, pin_memory=False)
    meta = ShardedTensorMetadata(shards_metadata=metas + rest, size=torch.Size(shape), tensor_properties=props)
    local = [Shard(t, m) for t, m in zip(tensors, metas)]
    st = ShardedTensorBase._init_from_local_shards_and_global_metadata(local, meta)
    # what ShardedTensor's own constructors set (size() and friends dispatch through the group)
    st._process_group = dist.group.WORLD if dist.is_initialized() else None
    st._remote_shards, st._sharded_tensor_id, st._init_rrefs = {}, None, False
    return st
