"""Autograd communication of the token dispatchers; each takes its `Group` and keeps it on the ctx.

    all_to_all(x, ep, out_splits, in_splits)   forward: rows [sum in_splits[:j], +in_splits[j]) go to rank j,
                                               rank j's rows for us arrive in group order (out_splits);
                                               backward: the inverse all-to-all (splits swapped)
    gather_rows(x, ep)                         forward: all-gather along dim 0; backward: reduce-scatter
                                               (each rank's copy of the gathered rows feeds its own experts,
                                               so the gradient of a row is the sum over ranks)
    reduce_scatter_rows(y, ep)                 forward: reduce-scatter along dim 0; backward: all-gather
    gather_rows_v(x, etp, sizes)               forward: all-gather of uneven blocks (rank j has sizes[j] rows);
                                               backward: reduce-scatter-v (the expert-TP ranks each computed a
                                               partial input gradient of every gathered row)
    reduce_scatter_rows_v(y, etp, sizes)       forward: sum the ranks' (sum sizes, h) partials, keep our sizes[r]
                                               rows; backward: all-gather-v

The uneven pair runs as all-to-all-v (torch's all_gather has no uneven form on gloo): gather sends our rows to
every rank, reduce-scatter sends rank j its block of our partials and sums what arrives. The ledger counts what
leaves the rank, as a ring would move it: (etp - 1) x our rows forward for the gather, the other ranks' rows for
the reduce-scatter.
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


class _GatherRowsV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, sizes):
        ctx.group, ctx.sizes = group, sizes
        return _gather_v(x, group, sizes)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter_v(g, ctx.group, ctx.sizes), None, None


class _ReduceScatterRowsV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, group, sizes):
        ctx.group, ctx.sizes = group, sizes
        return _reduce_scatter_v(y, group, sizes)

    @staticmethod
    def backward(ctx, g):
        return _gather_v(g, ctx.group, ctx.sizes), None, None


def _gather_v(x: torch.Tensor, group: Group, sizes: list[int]) -> torch.Tensor:
    """(sizes[r], h) on rank r -> (sum sizes, h), the ranks' blocks in group order."""
    return group.all_to_all_v(x.contiguous().repeat(group.size, 1), sizes, [x.shape[0]] * group.size)


def _reduce_scatter_v(y: torch.Tensor, group: Group, sizes: list[int]) -> torch.Tensor:
    """(sum sizes, h) partials on every rank -> (sizes[r], h): the sum over ranks of block r."""
    mine = sizes[group.rank]
    got = group.all_to_all_v(y.contiguous(), [mine] * group.size, sizes)  # (size * mine, h): every rank's block r
    return got.view(group.size, mine, *y.shape[1:]).sum(0)


def gather_rows_v(x: torch.Tensor, group: Group, sizes: list[int]) -> torch.Tensor:
    return x if group.size == 1 else _GatherRowsV.apply(x, group, sizes)


def reduce_scatter_rows_v(y: torch.Tensor, group: Group, sizes: list[int]) -> torch.Tensor:
    return y if group.size == 1 else _ReduceScatterRowsV.apply(y, group, sizes)
