"""Pieces GPT-2 and Llama share: the stage layout, tensor-parallel attention, the LM loss."""

from __future__ import annotations

import functools
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from hybrid.measured_memory import track_stored

from hybrid.cp.attention import CPContext, context_attention
from hybrid.cp.loss import context_parallel_loss
from hybrid.cp.masks import AttentionMask
from hybrid.tp import (IGNORE_INDEX, ColumnParallelLinear, ParallelRNG, Region, RowParallelLinear, ShardSpec,
                       TPContext, enter_linears, normal_init, vocab_parallel_cross_entropy)
from models.config import ModelConfig
from models.recompute import Recompute  # noqa: F401  (re-exported: the model code and its callers import it from here)


def set_recompute(model: nn.Module, granularity: Recompute) -> nn.Module:
    """Set the recomputation of every block and attention layer in `model`."""
    for m in model.modules():
        if hasattr(m, "recompute"):
            m.recompute = granularity
    return model


def maybe_checkpoint(enabled: bool, fn, *args, rng: ParallelRNG | None = None, selective_op: bool = False):
    """fn(*args), recomputed in backward instead of saving its intermediates when `enabled`.

    torch's checkpoint replays the default generators only; `rng` (given when the region draws dropout masks
    from the tensor-parallel streams) is replayed too (Megatron's CheckpointFunction does the same with its RNG
    tracker), so the recomputed forward draws the original masks. `selective_op`: keep what `SelectiveOpPolicy`
    stores (op-level SAC).

    Under torch.compile (`--compile`, hybrid/train/loop.py compile_blocks): without `rng` the checkpoint can be
    traced (dynamo's checkpoint operator; the op-level policy through a module-level context function, as
    torchtitan's compiled SAC); the streams' replay context cannot, so that checkpoint always runs eagerly
    (`_replaying_checkpoint`: a graph break when reached from compiled code) around compiled code."""
    if not enabled:
        return fn(*args)
    if rng is not None:
        return _replaying_checkpoint(fn, args, rng, selective_op)
    if selective_op:
        return checkpoint(fn, *args, use_reentrant=False, context_fn=selective_op_contexts)
    return checkpoint(fn, *args, use_reentrant=False)


@torch._dynamo.disable
def _replaying_checkpoint(fn, args: tuple, rng: ParallelRNG, selective_op: bool):
    """torch's checkpoint of fn(*args) whose recomputation also replays `rng`'s streams from their position now."""
    state = rng.get_state()

    def contexts():
        forward, recompute = selective_op_contexts() if selective_op else (nullcontext(), nullcontext())
        return forward, _Both(recompute, _Replay(rng, state))
    return checkpoint(fn, *args, use_reentrant=False, context_fn=contexts)


def selective_op_contexts():
    """The forward and recomputation contexts of op-level SAC with a fresh `SelectiveOpPolicy` (a module-level
    function: dynamo traces a checkpoint whose context_fn is one)."""
    policy = SelectiveOpPolicy()
    forward, recompute = create_selective_checkpoint_contexts(policy)
    policy.owner = recompute  # the stored outputs live as long as the checkpoint frame holds this
    return forward, recompute


def dropout_streams(cfg: ModelConfig, tp: TPContext) -> ParallelRNG | None:
    """The streams a block's recomputation must replay: `tp.rng` when the block draws dropout masks (hidden or
    attention dropout > 0), else None (nothing to replay: the checkpoint is then traceable by torch.compile)."""
    return tp.rng if cfg.dropout > 0 or (cfg.attention_dropout or 0) > 0 else None


def checkpoint_block(recompute: Recompute, training: bool, fn, *args, rng: ParallelRNG | None = None):
    """A Transformer block's forward under its recomputation: FULL and SELECTIVE_OP checkpoint the whole block
    (SELECTIVE_OP with the op-level policy), the others run it plainly (SELECTIVE acts inside the attention)."""
    whole = recompute in (Recompute.FULL, Recompute.SELECTIVE_OP) and training
    return maybe_checkpoint(whole, fn, *args, rng=rng, selective_op=recompute is Recompute.SELECTIVE_OP)


_MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
_ATTENTION = tuple(getattr(torch.ops.aten, name).default for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
    if hasattr(torch.ops.aten, name))


class SelectiveOpPolicy:
    """torchtitan's op-level selective activation checkpointing policy (its `_save_list` with "recompute every
    second mm"), for one checkpointed block: store the attention kernel's outputs and the output of every other
    matmul in forward order (the 1st, 3rd, ...: q, v, c_fc / gate, down), recompute everything else. Counted
    separately in the forward and in the recomputation, so both pick the same matmuls. What it stores is
    reported to the active SavedActivationLedgers (hybrid/measured_memory.py) for as long as `owner` (the
    recomputation context the checkpoint frame keeps) lives."""

    def __init__(self) -> None:
        self.matmuls = {False: 0, True: 0}
        self.owner: object | None = None

    def __call__(self, ctx, func, *args, **kwargs) -> CheckpointPolicy:
        save = func in _ATTENTION
        if func in _MATMULS:
            self.matmuls[ctx.is_recompute] += 1
            save = self.matmuls[ctx.is_recompute] % 2 == 1
        if save and not ctx.is_recompute and self.owner is not None:
            track_stored(ctx.op_output, self.owner)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE


class _Both:
    """Two contexts entered in order and left in reverse (the SAC recomputation mode and the RNG replay); can be
    entered again after it is left."""

    def __init__(self, first, second) -> None:
        self.first, self.second = first, second

    def __enter__(self) -> None:
        self.first.__enter__()
        self.second.__enter__()

    def __exit__(self, *exc) -> bool | None:
        try:
            self.second.__exit__(*exc)
        finally:
            self.first.__exit__(*exc)
        return None


class _Replay:
    """`rng.restored(state)` as a context that can be entered once per recomputation: a zero-bubble schedule's
    W (hybrid/pipeline/split_backward.py) recomputes the region a second time, after B did."""

    def __init__(self, rng: ParallelRNG, state: dict) -> None:
        self.rng, self.state, self.entered = rng, state, []

    def __enter__(self) -> None:
        cm = self.rng.restored(self.state)
        cm.__enter__()
        self.entered.append(cm)

    def __exit__(self, *exc) -> bool | None:
        return self.entered.pop().__exit__(*exc)


def set_context_parallel(model: nn.Module, cp: CPContext | None) -> nn.Module:
    """Give every attention layer and model (chunk) in `model` the context-parallel group (None: no CP): its
    attention then covers the whole sequence from T/CP local tokens, its positions and loss follow the
    load-balanced layout (hybrid/cp/). Applied after building, like `set_recompute`: the parameters are the same
    at every CP size."""
    for m in model.modules():
        if hasattr(m, "cp"):
            m.cp = cp if cp is not None and cp.size > 1 else None
    return model


@dataclass(frozen=True)
class StageLayout:
    """The part of the model one pipeline stage holds: its Transformer blocks (by global index,
    so parameter names -- and therefore initial weights and checkpoint keys -- are the same for
    every layout), and whether it holds the embedding (first) and the head and loss (last)."""

    layer_ids: tuple[int, ...]
    first: bool = True
    last: bool = True

    @classmethod
    def whole(cls, num_layers: int) -> "StageLayout":
        return cls(layer_ids=tuple(range(num_layers)))


def kv_spec(cfg: ModelConfig, tp: TPContext) -> ShardSpec | None:
    """Key/value projection split. kv-heads divisible by tp: the even split (None). Fewer kv-heads
    than tp ranks: each rank holds one whole kv-head, the one its query heads attend with --
    rank r holds query heads [r a/t, (r+1) a/t), whose group is r * kv / t -- so each kv-head is
    replicated on t/kv ranks and its gradient is summed over them (partial_grad)."""
    kv, t, hd = cfg.num_kv_heads, tp.size, cfg.head_dim
    if kv % t == 0:
        return None
    starts = tuple((r * kv // t) * hd for r in range(t))
    return ShardSpec(dim=0, full_size=kv * hd, starts=starts, length=hd, partial_grad=True)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+d/2}) by position-dependent angles (transformers' rotate_half layout).
    x: (B, heads, T, hd); cos, sin: (T, hd)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


@functools.lru_cache(maxsize=8)
def sliding_window_mask(seq_len: int, window: int, device: torch.device) -> torch.Tensor:
    """(T, T) bool, True where query i may attend key j: 0 <= i - j < window (causal, the last
    `window` positions including i itself -- transformers' `kv_idx > q_idx - sliding_window`)."""
    i = torch.arange(seq_len, device=device)
    dist = i[:, None] - i[None, :]
    return (dist >= 0) & (dist < window)


def decode_mask(t_q: int, t_k: int, window: int | None, device: torch.device) -> torch.Tensor:
    """(T_q, T_k) bool for queries that are the last T_q of T_k positions (decoding with a KV cache): query i
    sits at position t_k - t_q + i and sees key j when 0 <= pos - j (< window, with a sliding window)."""
    pos = torch.arange(t_k - t_q, t_k, device=device)
    dist = pos[:, None] - torch.arange(t_k, device=device)[None, :]
    return (dist >= 0) & (dist < window) if window is not None else dist >= 0


class LayerCache:
    """One layer's keys and values of the tokens seen so far, (B, kv-heads on this TP rank, T_past, hd), after
    RoPE: a decoding step computes k, v for its new tokens only and attends over past + new."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new tokens' k, v (along T); the whole keys and values."""
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v


class KVCache:
    """The KV cache of a whole model (or stage) for incremental decoding, inference only: `length` tokens are
    cached, so the next forward's tokens sit at positions length, length + 1, ... (RoPE angles, GPT-2's learned
    positions). The model's forward advances `length` by the tokens it was given."""

    def __init__(self) -> None:
        self.length = 0
        self._layers: dict[int, LayerCache] = {}

    def layer(self, layer_id: int) -> LayerCache:
        return self._layers.setdefault(layer_id, LayerCache())


class ParallelAttention(nn.Module):
    """Causal self-attention with heads split over TP: rank i holds a/t query heads and their
    key/value heads; q/k/v are column-parallel (one shared region entry), the output projection
    row-parallel. Communication: one all-reduce forward (o_proj) and one backward (the entry).

    `window` (sliding-window attention) restricts each query to the last `window` keys; SDPA then
    takes an explicit boolean mask (on CUDA: the memory-efficient kernel instead of flash).
    Attention-probability dropout is drawn from the TENSOR_PARALLEL stream: each rank's heads
    are different elements of the (B, a, T, T) probabilities.

    Context parallelism (`self.cp`, set by `set_context_parallel`): x holds this rank's T/CP load-balanced
    tokens and the core attends them to the whole sequence by ring, Ulysses or all-gather (hybrid/cp/);
    `segments` (packed documents, `--reset-attention-mask`) restrict each query to its own document. The
    projections, RoPE and TP are unchanged: they act token by token."""

    def __init__(self, cfg: ModelConfig, tp: TPContext, out_std: float, window: int | None = None):
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.tp, self.head_dim, self.dropout, self.window = tp, hd, cfg.attention_dropout, window
        self.recompute = Recompute.NONE
        self.cp: CPContext | None = None
        self.n_heads = cfg.num_heads // tp.size
        col = dict(tp=tp, bias=cfg.qkv_bias, enter=False)
        self.q_proj = ColumnParallelLinear(h, cfg.num_heads * hd, **col)
        self.k_proj = ColumnParallelLinear(h, cfg.num_kv_heads * hd, out_spec=kv_spec(cfg, tp), **col)
        self.v_proj = ColumnParallelLinear(h, cfg.num_kv_heads * hd, out_spec=kv_spec(cfg, tp), **col)
        self.o_proj = RowParallelLinear(cfg.num_heads * hd, h, tp, bias=cfg.out_bias, init=normal_init(out_std))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                cache: LayerCache | None = None, segments: torch.Tensor | None = None) -> torch.Tensor:
        # one region entry (x replicated, or SP: gathered from (B, T/t, C)) for the three column-parallel projections
        q, k, v = enter_linears(x, (self.q_proj, self.k_proj, self.v_proj), self.tp)
        # this rank's heads: (B, T, heads/t x hd) -> (B, heads/t, T, hd)
        heads = "b t (heads hd) -> b heads t hd"
        q = rearrange(q, heads, hd=self.head_dim)  # (B, a/t, T, hd)
        k = rearrange(k, heads, hd=self.head_dim)  # (B, kv/t, T, hd)
        v = rearrange(v, heads, hd=self.head_dim)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            k, v = cache.extend(k, v)  # (B, kv/t, T_past + T, hd)
        y = maybe_checkpoint(self.recompute is Recompute.SELECTIVE and self.training, self.core, q, k, v, segments,
                             rng=self.tp.rng if self.dropout > 0 else None)  # the probabilities' dropout stream
        # heads back side by side for the row-parallel o_proj, whose input rows are this rank's heads
        return self.o_proj(rearrange(y, "b heads t hd -> b t (heads hd)"))  # (B, T, C), summed over TP

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             segments: torch.Tensor | None = None) -> torch.Tensor:
        """softmax(q k^T / sqrt(hd) + causal (or sliding-window) mask) v, per head, with dropout on
        the probabilities in training."""
        if self.cp is not None or segments is not None:  # the whole sequence from T/CP tokens, or packed documents
            if self.training and self.dropout > 0:
                raise NotImplementedError("attention dropout with context parallelism or --reset-attention-mask")
            return context_attention(q, k, v, self.cp, AttentionMask(self.window, segments))
        T, T_k = q.shape[2], k.shape[2]
        if T_k > T:  # decoding: the queries are the last T of T_k positions
            mask = decode_mask(T, T_k, self.window, q.device)
        else:
            mask = sliding_window_mask(T, self.window, q.device) if self.window is not None and self.window < T else None
        p = self.dropout if self.training else 0.0
        with self.tp.rng.fork(Region.TENSOR_PARALLEL) if p > 0 else nullcontext():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, dropout_p=p,
                                                  enable_gqa=k.shape[1] != q.shape[1])


def lm_loss(logits: torch.Tensor, labels: torch.Tensor, vocab_start: int, tp: TPContext,
            cp: CPContext | None = None) -> torch.Tensor:
    """Mean cross-entropy over vocab-parallel logits; labels are already the next tokens
    (IGNORE_INDEX where there is none). Under CP: this rank's share of the mean over the whole sequence, scaled
    for the DP x CP gradient average (hybrid/cp/loss.py)."""
    if cp is not None:
        return context_parallel_loss(logits, labels, vocab_start, tp.group, cp.group)
    return vocab_parallel_cross_entropy(logits, labels, vocab_start, tp.group, IGNORE_INDEX)


def shift_labels(ids: torch.Tensor) -> torch.Tensor:
    """labels[t] = ids[t+1]; the last position has no target (as transformers shifts inside)."""
    return F.pad(ids[:, 1:], (0, 1), value=IGNORE_INDEX)
