"""Tensor-parallel layers (Megatron-LM, Shoeybi et al. 2019; sequence parallel, Korthikanti et al. 2022).

Every layer takes a `TPContext` -- the TP group and whether sequence parallelism is on -- and tags
each parameter with a `ShardSpec` (see sharding.py). Activations are batch-first, (B, T, C).

Region entry/exit are explicit so several linears can share one collective:

    h = tp.enter(x)                 # f, or all-gather of the sequence under SP
    q, k, v = q_proj(h), k_proj(h), v_proj(h)        # column-parallel, enter=False
    y = o_proj(attn(q, k, v))       # row-parallel: g, or reduce-scatter of the sequence under SP
"""

from __future__ import annotations

import enum
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from hybrid.comm import Group
from hybrid.tp.mappings import (apply_eagerly, copy_to_tp, gather_from_sp, gather_from_tp, reduce_from_tp,
                                reduce_scatter_to_sp)
from hybrid.tp.random import ParallelRNG, Region
from hybrid.tp.sharding import REPLICATED, InitFn, ShardSpec, set_spec, split_spec


DEFAULT_SEED = 1234  # scripts/train.py's --seed default


@dataclass(frozen=True)
class TPContext:
    """What a layer needs to know about tensor parallelism.

    Attributes:
        group: the tensor-parallel group (size 1 = no TP).
        sequence_parallel: activations outside the TP regions are split along the sequence
            (`--sequence-parallel`); norms and dropout then run on T/t tokens per rank.
        rng: this rank's dropout streams (hybrid/tp/random.py); default: seed 1234 at this TP
            rank, pipeline rank 0, on the CPU -- the training loop passes one built from `--seed`.
    """

    group: Group
    sequence_parallel: bool = False
    rng: ParallelRNG | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.rng is None:
            object.__setattr__(self, "rng", ParallelRNG(DEFAULT_SEED, tp_rank=self.group.rank))

    @property
    def activation_region(self) -> Region:
        """The dropout region of activations outside the TP regions: replicated, or split along
        the sequence under SP (each rank's T/t tokens need masks of their own)."""
        return Region.TENSOR_PARALLEL if self.sequence_parallel and self.size > 1 else Region.REPLICATED

    @property
    def size(self) -> int:
        return self.group.size

    @property
    def rank(self) -> int:
        return self.group.rank

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        """Replicated (or sequence-sharded) activations -> input of column-parallel layers."""
        return gather_from_sp(x, self.group) if self.sequence_parallel else copy_to_tp(x, self.group)

    def exit(self, y: torch.Tensor) -> torch.Tensor:
        """Partial sums from row-parallel layers -> replicated (or sequence-sharded) activations."""
        return reduce_scatter_to_sp(y, self.group) if self.sequence_parallel else reduce_from_tp(y, self.group)

    def replicated_spec(self) -> ShardSpec:
        """Spec of a parameter every TP rank holds whole and applies outside the TP regions: under
        SP each rank sees only T/t tokens, so its gradient is a partial sum."""
        return ShardSpec(partial_grad=True) if self.sequence_parallel and self.size > 1 else REPLICATED


def normal_init(std: float) -> InitFn:
    return lambda w, gen: w.normal_(0.0, std, generator=gen)


def zeros_init(w: torch.Tensor, gen: torch.Generator) -> None:
    w.zero_()


def ones_init(w: torch.Tensor, gen: torch.Generator) -> None:
    w.fill_(1.0)


class ColumnParallelLinear(nn.Module):
    """Y = X A, A = [A_1 ... A_t] split by output columns; rank i computes Y_i = X A_i.

    Weight shard: (out/t, in). `enter=True` applies tp.enter to the input (pass False when the
    caller entered the region once for several linears); `gather_output` all-gathers Y.
    `out_spec` overrides the even split (replicated key/value heads).
    """

    def __init__(self, in_features: int, out_features: int, tp: TPContext, bias: bool = True,
                 enter: bool = True, gather_output: bool = False, init: InitFn = normal_init(0.02),
                 out_spec: ShardSpec | None = None):
        super().__init__()
        self.tp, self.enter, self.gather_output = tp, enter, gather_output
        spec = out_spec or _even_split(out_features, tp.size, dim=0, flag="output features")
        local_out = spec.length
        self.weight = set_spec(nn.Parameter(torch.zeros(local_out, in_features)), spec, init)
        self.bias = None
        if bias:
            self.bias = set_spec(nn.Parameter(torch.zeros(local_out)), spec, zeros_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.enter:
            (y,) = enter_linears(x, (self,), self.tp)  # f and X A_i
        else:
            y = F.linear(x, self.weight, self.bias)  # (B, T, out/t)
        return gather_from_tp(y, self.tp.group) if self.gather_output else y


def enter_linears(x: torch.Tensor, linears: Sequence[ColumnParallelLinear], tp: TPContext) -> tuple[torch.Tensor, ...]:
    """tp.enter(x) once, then each column-parallel linear (q, k, v; gate, up): Y_j = f(X) A_j,i^T + b_j,i.

    Without sequence parallelism at t > 1 this is one autograd node (`_EnterLinears`) whose backward posts f's
    all-reduce before the weight gradients and waits after them (eager under --compile: mappings.apply_eagerly);
    otherwise the separate nodes."""
    if tp.size > 1 and not tp.sequence_parallel and not torch.is_autocast_enabled():
        return apply_eagerly(_EnterLinears, x, tp.group, *(t for lin in linears for t in (lin.weight, lin.bias)))
    x = tp.enter(x)
    return tuple(F.linear(x, lin.weight, lin.bias) for lin in linears)


class BackwardPart(enum.Enum):
    """Which gradients the running backward wants from `_EnterLinears` (see `backward_part`)."""

    FULL = "full"  # input and weights: an ordinary backward
    INPUT = "input"  # the zero-bubble B: d loss / d input only
    WEIGHT = "weight"  # the zero-bubble W: the weight gradients only


_BACKWARD_PART = BackwardPart.FULL  # a module global, not a thread-local: the engine may run nodes in its own threads


@contextmanager
def backward_part(part: BackwardPart) -> Iterator[None]:
    """Tell `_EnterLinears` which half of its backward the engine call inside wants. Built-in nodes learn it from the
    engine (AddmmBackward computes dy W alone when only the input gradient is asked for); a Python Function's
    `ctx.needs_input_grad` is fixed at forward, so hybrid/pipeline/split_backward.py sets it around B and W. Without
    it B would also compute the weight gradient and W the input gradient, all-reduced a second time."""
    global _BACKWARD_PART
    before, _BACKWARD_PART = _BACKWARD_PART, part
    try:
        yield
    finally:
        _BACKWARD_PART = before


class _EnterLinears(torch.autograd.Function):
    """Y_j = f(X) A_j^T + b_j for n column-parallel linears sharing one region entry, as one autograd node, so
    f's backward all-reduce overlaps the weight gradients.

    Forward: F.linear each (f is the identity). Backward, with G_j = dL/dY_j (B, T, out_j/t):
        dX_i = sum_j G_j A_j    -> all-reduce posted, not waited for: dX = sum over ranks (f's backward)
        dA_j = G_j^T X, db_j = sum over tokens of G_j    -- computed while the all-reduce is in flight
    then the wait. Megatron's LinearWithGradAccumulationAndAsyncCommunication (allreduce_dgrad), whose q, k, v
    and gate, up are one fused weight each; separate nodes (tp.enter, then F.linear each) run the all-reduce
    only after every weight gradient. The products are autograd's for a linear, and dX sums the G_j A_j last
    linear first, as the engine accumulated them: the same bits; the same bytes (one all-reduce of dX).
    """

    @staticmethod
    def forward(ctx, x, group, *weights_and_biases):
        weights, biases = weights_and_biases[0::2], weights_and_biases[1::2]
        ctx.save_for_backward(x, *weights)
        ctx.group, ctx.has_bias = group, [b is not None for b in biases]
        return tuple(F.linear(x, w, b) for w, b in zip(weights, biases))

    @staticmethod
    def backward(ctx, *grads):
        x, *weights = ctx.saved_tensors
        inputs, params = _BACKWARD_PART is not BackwardPart.WEIGHT, _BACKWARD_PART is not BackwardPart.INPUT
        dx = work = None
        if ctx.needs_input_grad[0] and inputs:  # as f: no input gradient wanted, no all-reduce
            for g, w in reversed(list(zip(grads, weights))):
                dx = g.matmul(w) if dx is None else dx + g.matmul(w)  # (B, T, in): this rank's partial sum
            work = ctx.group.all_reduce_async(dx)
        x2 = x.reshape(-1, x.shape[-1])  # (B*T, in)
        out: list[torch.Tensor | None] = []
        for j, g in enumerate(grads):
            g2 = g.reshape(-1, g.shape[-1])  # (B*T, out_j/t)
            wanted_w, wanted_b = ctx.needs_input_grad[2 + 2 * j], ctx.needs_input_grad[3 + 2 * j]
            out.append(g2.t().matmul(x2) if wanted_w and params else None)  # (out_j/t, in)
            out.append(g2.sum(0) if ctx.has_bias[j] and wanted_b and params else None)
        if work is not None:
            work.wait()
        return (dx, None, *out)


class RowParallelLinear(nn.Module):
    """Y = X B, B = [B_1; ...; B_t] split by input rows; Y = sum_i X_i B_i.

    The input is already split along its last dim (the output of a column-parallel layer).
    Weight shard: (out, in/t). The bias is added once, after the sum (tp.exit).
    """

    def __init__(self, in_features: int, out_features: int, tp: TPContext, bias: bool = True,
                 init: InitFn = normal_init(0.02)):
        super().__init__()
        self.tp = tp
        spec = _even_split(in_features, tp.size, dim=1, flag="input features")
        self.weight = set_spec(nn.Parameter(torch.zeros(out_features, spec.length)), spec, init)
        self.bias = None
        if bias:
            self.bias = set_spec(nn.Parameter(torch.zeros(out_features)), tp.replicated_spec(), zeros_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:  # nothing to sum: let the matmul add the bias (addmm)
            return F.linear(x, self.weight, self.bias)
        y = self.tp.exit(F.linear(x, self.weight))  # partial (B, T, out) summed over TP
        return y + self.bias if self.bias is not None else y


class _VocabParallelWeight(nn.Module):
    """A (V_p/t, C) table split by vocabulary rows; the vocabulary is padded to a multiple of
    t * `pad_to` (Megatron's make-vocab-size-divisible-by), padding rows are zeros and unused.
    Rank i holds rows [i V_p/t, (i+1) V_p/t)."""

    def __init__(self, vocab_size: int, dim: int, tp: TPContext, pad_to: int = 1, init: InitFn = normal_init(0.02)):
        super().__init__()
        self.tp = tp
        spec = vocab_spec(vocab_size, tp.size, pad_to)
        self.vocab_start, self.vocab_size = spec.start(tp.rank), vocab_size
        self.weight = set_spec(nn.Parameter(torch.zeros(spec.length, dim)), spec, init)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel logits (B, T, V_p/t) = enter(h) W_i^T; padding columns are -inf."""
        return parallel_logits(self.tp.enter(h), self.weight, self.vocab_start, self.vocab_size)


class VocabParallelEmbedding(_VocabParallelWeight):
    """Token embedding split by vocabulary rows. A token outside this rank's rows contributes zero,
    so summing over TP (tp.exit) gives every rank the full embedding. `logits` is the tied LM head."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        y = F.embedding(local.masked_fill(outside, 0), self.weight)
        y = y.masked_fill(outside.unsqueeze(-1), 0.0)  # (B, T, C), partial over TP
        return self.tp.exit(y)


class ParallelLMHead(_VocabParallelWeight):
    """Untied LM head: a column-parallel projection onto the (padded) vocabulary."""

    def __init__(self, dim: int, vocab_size: int, tp: TPContext, pad_to: int = 1, init: InitFn = normal_init(0.02)):
        super().__init__(vocab_size, dim, tp, pad_to, init)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.logits(h)


def vocab_spec(vocab_size: int, tp_size: int, pad_to: int) -> ShardSpec:
    """Vocabulary rows split over TP after padding V up to a multiple of pad_to * t."""
    multiple = pad_to * tp_size
    return split_spec(vocab_size, tp_size, dim=0, padded_size=math.ceil(vocab_size / multiple) * multiple)


def parallel_logits(h: torch.Tensor, weight: torch.Tensor, vocab_start: int, vocab_size: int) -> torch.Tensor:
    logits = F.linear(h, weight)
    n_real = max(0, min(weight.shape[0], vocab_size - vocab_start))
    if n_real < weight.shape[0]:  # padded vocabulary rows never win the softmax
        logits = logits.clone()
        logits[..., n_real:] = float("-inf")
    return logits


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm whose parameters carry the TP spec (partial gradients under SP)."""

    def __init__(self, dim: int, tp: TPContext, eps: float = 1e-5):
        super().__init__(dim, eps=eps)
        set_spec(self.weight, tp.replicated_spec(), ones_init)
        set_spec(self.bias, tp.replicated_spec(), zeros_init)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * w, computed in fp32 (as transformers' LlamaRMSNorm)."""

    def __init__(self, dim: int, tp: TPContext, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = set_spec(nn.Parameter(torch.ones(dim)), tp.replicated_spec(), ones_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def _even_split(size: int, tp_size: int, dim: int, flag: str) -> ShardSpec:
    if size % tp_size != 0:
        raise ValueError(f"{flag} ({size}) not divisible by --tensor-model-parallel-size {tp_size}")
    return split_spec(size, tp_size, dim=dim)
