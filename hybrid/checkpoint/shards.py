"""The checkpoint's encoding of sharded state: each global tensor a torch ShardedTensor of the pieces this rank holds
(Megatron's torch_dist encoding), DCP writing and reading just those pieces.

A checkpoint key is a global name (`model/h.3.attn.q.weight`: the same for every pipeline layout,
models/common.StageLayout) and its value is the full, TP-unsharded, unpadded tensor. A rank never builds that
tensor: its owners describe the pieces they hold (hybrid/stateful.py: `Shards`, and the geometry from each
parameter's ShardSpec and ZeRO flat range), and `sharded_tensor` wraps them with the metadata DCP needs.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, ShardedTensorMetadata
from torch.distributed._shard.sharded_tensor.api import ShardedTensorBase
from torch.distributed._shard.sharded_tensor.metadata import TensorProperties

# the geometry of a piece lives with the Stateful protocol; re-exported for the checkpoint's callers
from hybrid.stateful import Box, flat_rectangles, global_box, is_owner, shard_box  # noqa: F401

# DCP warns on every ShardedTensor that DTensor is preferred; docs/checkpoint.md says why we use it here
warnings.filterwarnings("ignore", message="Please use DTensor instead", category=FutureWarning)


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
