"""Autograd communication primitives of tensor (and sequence) parallelism.

Names follow the region they move a tensor into or out of (Megatron's mappings.py); each takes
its `Group` as an argument and keeps it on the autograd ctx, so backward never looks a group up.

Shapes are batch-first, (B, T, C): the hidden dimension is the last, the sequence dimension 1.

Megatron-LM (Shoeybi et al. 2019, Fig. 3) names two conjugate operators:
  f = copy_to_tp      forward: identity        backward: all-reduce
  g = reduce_from_tp  forward: all-reduce      backward: identity
An MLP  Y = GeLU(X A) B  with A split by columns and B by rows is  g(GeLU(f(X) A_i) B_i): one
all-reduce forward, one backward.

Sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2) swaps f and g for the conjugate pair
  gather_from_sp          forward: all-gather along T    backward: reduce-scatter along T
  reduce_scatter_to_sp    forward: reduce-scatter along T backward: all-gather along T
An all-reduce is a reduce-scatter followed by an all-gather, so the bytes are the same while norms
and dropout between the blocks run on a 1/t slice of the sequence.
"""

from __future__ import annotations

import torch

from hybrid.comm import Group

SEQ_DIM = 1
HIDDEN_DIM = -1


def _split(x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
    """This rank's 1/size slice of `x` along `dim`."""
    if x.shape[dim] % group.size != 0:
        raise ValueError(f"cannot split dim {dim} of size {x.shape[dim]} over {group.size} {group.name} ranks")
    return x.chunk(group.size, dim=dim)[group.rank].contiguous()


class _CopyToTP(torch.autograd.Function):
    """f: identity forward, all-reduce backward (each rank's input gradient is partial)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        return ctx.group.all_reduce(g.contiguous()), None


class _ReduceFromTP(torch.autograd.Function):
    """g: all-reduce forward (sum the partial outputs), identity backward. In place: the partial
    sum is a fresh matmul output that no backward needs, so no copy is made (mark_dirty)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.mark_dirty(x)
        return group.all_reduce(x)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherFromTP(torch.autograd.Function):
    """All-gather along the hidden dim forward; keep this rank's slice backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return group.all_gather(x, dim=HIDDEN_DIM)

    @staticmethod
    def backward(ctx, g):
        return _split(g, ctx.group, HIDDEN_DIM), None


class _ScatterToTP(torch.autograd.Function):
    """Keep this rank's slice of the hidden dim forward; all-gather backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split(x, group, HIDDEN_DIM)

    @staticmethod
    def backward(ctx, g):
        return ctx.group.all_gather(g, dim=HIDDEN_DIM), None


class _GatherFromSP(torch.autograd.Function):
    """All-gather the sequence forward; reduce-scatter backward (the consumer is a TP region whose
    input gradients are partial sums, so the backward both sums them and re-shards the sequence)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return group.all_gather(x, dim=SEQ_DIM)

    @staticmethod
    def backward(ctx, g):
        return ctx.group.reduce_scatter(g, dim=SEQ_DIM), None


class _ReduceScatterToSP(torch.autograd.Function):
    """Reduce-scatter along the sequence forward (sum partial outputs, keep T/t rows); all-gather backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return group.reduce_scatter(x, dim=SEQ_DIM)

    @staticmethod
    def backward(ctx, g):
        return ctx.group.all_gather(g, dim=SEQ_DIM), None


class _ScatterToSP(torch.autograd.Function):
    """Keep this rank's sequence slice forward; all-gather backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split(x, group, SEQ_DIM)

    @staticmethod
    def backward(ctx, g):
        return ctx.group.all_gather(g, dim=SEQ_DIM), None


def copy_to_tp(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else apply_eagerly(_CopyToTP, x, group)


def reduce_from_tp(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else apply_eagerly(_ReduceFromTP, x, group)


@torch._disable_dynamo
def apply_eagerly(function: type[torch.autograd.Function], *args):
    """`function.apply(*args)` eagerly under --compile (hybrid/train/loop.py compile_blocks): one graph break per
    call, as every multi-rank collective (hybrid/comm.py _eager). For TP's Functions without sequence parallelism
    (f, g, hybrid/tp/layers.py _EnterLinears), whose forward has no collective to stop dynamo at the call (the SP
    pair's does, and dynamo runs that Function eagerly): traced, dynamo took f's identity forward into the graph and
    its backward with it, where the all-reduce's ledger write and the op trail's lock cannot be traced, and could
    not follow g's in-place ctx.mark_dirty. A tiny tp 2 Llama's 2 compiled blocks broke 14 times (the trail's lock
    5, Group.all_reduce 7, mark_dirty, the ledger write); with this, only here (tests/test_compose20_compile.py
    tp2-cp2-docs). The arithmetic is the same either way: the traced run fell back to eager at each break."""
    return function.apply(*args)


def gather_from_tp(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _GatherFromTP.apply(x, group)


def scatter_to_tp(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _ScatterToTP.apply(x, group)


def gather_from_sp(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _GatherFromSP.apply(x, group)


def reduce_scatter_to_sp(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _ReduceScatterToSP.apply(x, group)


def scatter_to_sp(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _ScatterToSP.apply(x, group)
