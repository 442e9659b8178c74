"""Attention over one block of keys with its log-sum-exp, and the merge of partial results (online softmax).

This is the only place the numerics of blockwise attention live; ring attention (hybrid/cp/ring.py) calls it for
every block it sees, and tests/test_cp_softmax.py checks it alone against full attention.

For queries q (B, a, Tq, d) and one block of keys k, values v (B, g, Tk, d) -- g key/value heads shared by a/g
query heads each (GQA; g = a is plain multi-head, g = 1 multi-query):

    s   = q k^T / sqrt(d),  masked to -inf where the query may not see the key      (B, a, Tq, Tk)
    lse = log sum_j exp(s_j)                                                           (B, a, Tq)
    o   = sum_j exp(s_j - lse) v_j                                                     (B, a, Tq, d)

Two blocks A, B of the same queries merge exactly (Milakov & Gimelshein 2018; FlashAttention's rescaling):

    lse = log(exp(lse_A) + exp(lse_B)),    o = exp(lse_A - lse) o_A + exp(lse_B - lse) o_B

so attention over all keys is the merge of its blocks, in any order. A row that sees no key of a block has
lse = -inf and contributes nothing (the -inf - -inf of the naive formula is taken as weight 0).

Backward, per block, needs only the *final* o and lse of the row (FlashAttention-2, Alg. 2): with
p = exp(s - lse) the block's share of the final softmax and D = rowsum(do * o),

    dv = p^T do,   ds = p * (do v^T - D),   dq = ds k / sqrt(d),   dk = ds^T q / sqrt(d)

so each block's gradients are computed independently and summed -- no merge in backward. Everything is computed
in fp32 (inputs are upcast), as flash kernels accumulate.
"""

from __future__ import annotations

import math

import torch

from hybrid.cp.masks import EMPTY

Mask = torch.Tensor | None  # (B or 1, Tq, Tk) bool, True = visible; None = every key visible


def _grouped(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(B, a, T, d) -> (B, g, a/g, T, d): query heads grouped by the key/value head they share (GQA: query head
    h uses kv head h // (a/g), as transformers' repeat_kv)."""
    B, a, T, d = q.shape
    return q.view(B, kv_heads, a // kv_heads, T, d)


def _scores(q: torch.Tensor, k: torch.Tensor, mask: Mask) -> torch.Tensor:
    """(B, g, r, Tq, Tk) fp32 scores q k^T / sqrt(d), -inf where masked."""
    qg = _grouped(q.float(), k.shape[1])
    s = qg @ k.float().unsqueeze(2).transpose(-1, -2) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        s = s.masked_fill(~mask[:, None, None], float("-inf"))
    return s


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """lse with -inf (rows that see nothing) replaced by 0, so exp(s - lse) is exp(-inf) = 0 there, not NaN."""
    return torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(o (B, a, Tq, d) fp32, lse (B, a, Tq) fp32) of queries q over one block of keys/values."""
    s = _scores(q, k, mask)
    lse = torch.logsumexp(s, dim=-1)  # (B, g, r, Tq)
    p = torch.exp(s - _finite(lse)[..., None])
    o = p @ v.float().unsqueeze(2)  # (B, g, r, Tq, d)
    B, a, Tq, d = q.shape
    return o.reshape(B, a, Tq, d), lse.reshape(B, a, Tq)


def merge(o: torch.Tensor, lse: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact result of two disjoint blocks of keys from their partial results (see the module doc)."""
    new = torch.logaddexp(lse, lse_b)
    ref = _finite(new)
    out = torch.exp(lse - ref)[..., None] * o + torch.exp(lse_b - ref)[..., None] * o_b
    return out, new


def empty_result(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The merge identity: o = 0, lse = -inf (no key seen yet)."""
    B, a, Tq, d = q.shape
    return (torch.zeros(B, a, Tq, d, dtype=torch.float32, device=q.device),
            torch.full((B, a, Tq), float("-inf"), dtype=torch.float32, device=q.device))


def attend_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                    do: torch.Tensor, mask: Mask = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), fp32, of one block's share of attention whose final output is o and log-sum-exp lse."""
    g = k.shape[1]
    s = _scores(q, k, mask)
    p = torch.exp(s - _grouped(_finite(lse)[..., None], g))  # (B, g, r, Tq, Tk)
    dog = _grouped(do.float(), g)
    D = (dog * _grouped(o.float(), g)).sum(-1, keepdim=True)  # (B, g, r, Tq, 1)
    dv = (p.transpose(-1, -2) @ dog).sum(2)  # (B, g, Tk, d): summed over the query heads sharing each kv head
    ds = p * (dog @ v.float().unsqueeze(2).transpose(-1, -2) - D)
    scale = 1.0 / math.sqrt(q.shape[-1])
    dq = (ds @ k.float().unsqueeze(2)) * scale
    dk = (ds.transpose(-1, -2) @ _grouped(q.float(), g)).sum(2) * scale
    return dq.reshape(q.shape), dk, dv


def attend_blocks(q: torch.Tensor, blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge of `attend` over (k, v, mask) blocks, skipping EMPTY ones: attention over all their keys."""
    o, lse = empty_result(q)
    for k, v, mask in blocks:
        if isinstance(mask, str) and mask == EMPTY:
            continue
        o, lse = merge(o, lse, *attend(q, k, v, mask))
    return o, lse
