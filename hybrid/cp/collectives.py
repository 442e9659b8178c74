"""The context-parallel region's collectives as autograd functions (the all-gather and Ulysses paths; the ring
has its own Function, hybrid/cp/ring.py). Each keeps its group on the ctx, as hybrid/tp/mappings.py does.

    gather_seq      all-gather along the sequence forward, reduce-scatter backward (every rank's queries
                    contributed to the gradient of every key: the sum, then each rank keeps its own shard)
    seq_to_heads    all-to-all: (B, heads, T/CP, d) sequence-sharded -> (B, heads/CP, T, d) head-sharded;
                    backward the inverse all-to-all (a permutation of elements: its transpose is its inverse)
    heads_to_seq    the inverse of seq_to_heads
"""

from __future__ import annotations

import torch

from hybrid.comm import Group

HEAD_DIM, SEQ_DIM = 1, 2  # attention layout (B, heads, T, d)


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group: Group, dim: int):
        ctx.group, ctx.dim = group, dim
        return group.all_gather(x, dim=dim)

    @staticmethod
    def backward(ctx, g):
        return ctx.group.reduce_scatter(g, dim=ctx.dim), None, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group: Group, scatter_dim: int, gather_dim: int):
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return group.all_to_all(x, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, g):
        scatter_dim, gather_dim = ctx.dims
        return ctx.group.all_to_all(g.contiguous(), gather_dim, scatter_dim), None, None, None


def gather_seq(x: torch.Tensor, group: Group, dim: int = SEQ_DIM) -> torch.Tensor:
    """Every CP rank's shard concatenated along `dim` in rank order (hybrid/cp/balance.gathered_indices)."""
    return _GatherSeq.apply(x, group, dim) if group.size > 1 else x


def seq_to_heads(x: torch.Tensor, group: Group) -> torch.Tensor:
    return _AllToAll.apply(x, group, HEAD_DIM, SEQ_DIM) if group.size > 1 else x


def heads_to_seq(x: torch.Tensor, group: Group) -> torch.Tensor:
    return _AllToAll.apply(x, group, SEQ_DIM, HEAD_DIM) if group.size > 1 else x
