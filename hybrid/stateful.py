"""What an owner of state gives the checkpoint: torchtitan's `Stateful`, sharded.

    class Stateful(Protocol):
        def state_dict(self) -> dict[str, object]: ...       # live views of the state, described
        def load_state_dict(self, state: dict[str, object]) -> None: ...

The owners -- the ZeRO optimizer (the model's fp32 master weights and Adam's moments, hybrid/zero/state.py), the
RNG streams (hybrid/tp/random.py: RNGState), the data position and the fault counters (hybrid/checkpoint/run.py,
hybrid/fault/session.py) -- each say what they hold; the checkpoint (hybrid/checkpoint/core.py) only collects,
stores and hands back. A state dict's values are:

* `Shards`: this rank's pieces of one global tensor -- local tensors (views of the live state) and where each
  lies in the global tensor, plus whether this rank is the one that writes them (each global element is written
  once; every rank reads every piece it holds, so a checkpoint loads at any layout);
* a torch.Tensor: a whole tensor this rank alone keeps (a generator's state);
* plain JSON values (int, float, str, bool, list, dict): small scalars (a step count, a loss scale).

On load the checkpoint fills the tensors of a fresh `state_dict()` in place and passes the dict, with the JSON
values read back, to `load_state_dict`, which puts derived state right (parameters from master weights, say).

The geometry below is how a ZeRO flat range of a TP shard becomes pieces of the global tensor -- the parameter's
`ShardSpec` (hybrid/tp/sharding.py) says which rows its TP shard holds, and nothing else is consulted:

A ZeRO unit keeps its parameters end to end in one flat buffer and gives DP rank r the range [r S, (r+1) S).
Inside one parameter p of local (TP-shard) shape (R, C) that range is a flat interval [f0, f1) of p's row-major
elements, which is at most three rectangles -- each one a contiguous slice of the flat buffer, so its tensor is a
view with no copy:

    rows r0 = f0 // C, r1 = f1 // C;  cols c0 = f0 % C, c1 = f1 % C
    [r0, c0 : C]          partial first row   (when c0 > 0)
    [r0' : r1, 0 : C]     whole rows
    [r1, 0 : c1]          partial last row    (when c1 > 0)

A 1-D parameter is the case C = 1. Each local rectangle is then moved to global coordinates by the TP shard's
start along its split dimension (ShardSpec.starts), and clipped to the real rows (vocabulary padding is not saved;
a layout with other padding re-creates zeros there). A piece is *written* by one rank only: DP rank 0 when the
optimizer state is not sharded (ZeRO 0), TP rank 0 for TP-replicated parameters, the first TP rank holding a
replicated kv-head, the first pipeline stage for tied embeddings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from hybrid.moe.params import is_expert
from hybrid.tp import spec_of
from hybrid.tp.sharding import logical_rows, split_rank

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes) in global coordinates


class Stateful(Protocol):
    def state_dict(self) -> dict[str, object]: ...

    def load_state_dict(self, state: dict[str, object]) -> None: ...


@dataclass
class Shards:
    """This rank's pieces of one global tensor.

    Attributes:
        global_shape: the full, unsharded, unpadded shape.
        tensors: the local pieces, views of the live state (filled in place on load).
        boxes: where each piece lies in the global tensor, (offsets, sizes).
        write: this rank writes these pieces on save (each global element is written by one rank).
    """

    global_shape: tuple[int, ...]
    tensors: list[torch.Tensor]
    boxes: list[Box]
    write: bool


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


def global_box(p: torch.Tensor, tp_rank: int, rect: tuple[int, int, int, int]) -> tuple[Box, int, int] | None:
    """A local rectangle of p as a global (offsets, sizes), and the flat [start, stop) of p it keeps after
    clipping padding rows; None when it lies wholly in the padding. (An expert split over expert-TP is placed
    by its expert-TP rank: tp_rank is read through split_rank.)"""
    spec = spec_of(p)
    tp_rank = split_rank(p, tp_rank)
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
    """The global box of p's whole TP shard (its real rows): the one piece a rank saves of p when its ZeRO shard
    holds all of p (dp 1, or ZeRO 0). None when the shard is all vocabulary padding."""
    rect, = flat_rectangles(0, p.numel(), math.prod(p.shape[1:]))
    g = global_box(p, tp_rank, rect)
    return None if g is None else g[0]


def is_owner(p: torch.Tensor, tp_rank: int, dp_rank: int, sharded: bool, duplicate: bool) -> bool:
    """This rank writes p's pieces (each global element once; see the module docstring). An MoE expert's `dp_rank`
    is its expert-DP rank: an expert lives on one rank of each expert-DP replica, whichever TP rank that is
    (hybrid/moe/parallel.py), so no TP rank is skipped; with expert-TP each expert-TP rank writes its own slice."""
    if duplicate or (not sharded and dp_rank != 0):
        return False
    spec = spec_of(p)
    tp_rank = split_rank(p, tp_rank)
    if is_expert(p) and spec.dim is None:
        return True
    if spec.dim is None:
        return tp_rank == 0
    return spec.starts.index(spec.starts[tp_rank]) == tp_rank
