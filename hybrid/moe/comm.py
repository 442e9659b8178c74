"""Autograd communication of the token dispatchers; each takes its `Group` and keeps it on the ctx.

    all_to_all(x, ep, out_splits, in_splits)   forward: rows [sum in_splits[:j], +in_splits[j]) go to rank j,
                                               rank j's rows for us arrive in group order (out_splits);
                                               backward: the inverse all-to-all (splits swapped)
    gather_rows(x, ep)                         forward: all-gather along dim 0; backward: reduce-scatter
                                               (each rank's copy of the gathered rows feeds its own experts,
                                               so the gradient of a row is the sum over ranks)
    reduce_scatter_rows(y, ep)                 forward: reduce-scatter along dim 0; backward: all-gather
"""

from __future__ import annotations

import torch

from hybrid.comm import Group


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, out_splits, in_splits):
        ctx.group, ctx.splits = group, (out_splits, in_splits)
        return group.all_to_all_v(x, out_splits, in_splits)

    @staticmethod
    def backward(ctx, g):
        out_splits, in_splits = ctx.splits
        return ctx.group.all_to_all_v(g.contiguous(), in_splits, out_splits), None, None, None


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return group.all_gather(x, dim=0)

    @staticmethod
    def backward(ctx, g):
        return ctx.group.reduce_scatter(g, dim=0), None


class _ReduceScatterRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, group):
        ctx.group = group
        return group.reduce_scatter(y, dim=0)

    @staticmethod
    def backward(ctx, g):
        return ctx.group.all_gather(g.contiguous(), dim=0), None


def all_to_all(x: torch.Tensor, group: Group, out_splits: list[int], in_splits: list[int]) -> torch.Tensor:
    return x if group.size == 1 else _AllToAll.apply(x, group, out_splits, in_splits)


def gather_rows(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _GatherRows.apply(x, group)


def reduce_scatter_rows(y: torch.Tensor, group: Group) -> torch.Tensor:
    return y if group.size == 1 else _ReduceScatterRows.apply(y, group)
