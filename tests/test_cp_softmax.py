"""The online-softmax core of context parallelism (hybrid/cp/softmax.py), alone, against full attention
computed independently in fp64 (explicit softmax, mask from torch.tril/triu): the merge of blockwise results
equals attention over all keys, forward (o, lse) and backward (dq, dk, dv summed over blocks), in fp32 to 1e-5
of the largest value. Also the load-balancing index function and the mask, with no processes."""

from __future__ import annotations

import math

import pytest
import torch

from hybrid.cp import balance
from hybrid.cp.masks import EMPTY, AttentionMask
from hybrid.cp.softmax import attend, attend_backward, attend_blocks, empty_result, merge

TOL = 1e-5


def close(a: torch.Tensor, b: torch.Tensor, tol: float = TOL) -> bool:
    """max |a - b| within tol of the largest |b| (fp32 against an fp64 reference)."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


def reference_mask(T: int, window: int | None, segments: torch.Tensor | None) -> torch.Tensor:
    """(B or 1, T, T) bool built without hybrid/cp/masks.py: tril for causal, triu for the window."""
    m = torch.ones(T, T, dtype=torch.bool).tril()
    if window is not None:
        m &= torch.ones(T, T, dtype=torch.bool).triu(-(window - 1))
    m = m[None]
    if segments is not None:
        m = m & (segments[:, :, None] == segments[:, None, :])
    return m


def reference_attention(q, k, v, mask):
    """fp64 softmax(q k^T / sqrt(d) + mask) v with key/value heads repeated for GQA; also lse."""
    q, k, v = q.double(), k.double(), v.double()
    r = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(r, 1), v.repeat_interleave(r, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask[:, None], float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1) @ v, lse


def _qkv(B=2, a=4, g=2, T=24, d=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, a, T, d, generator=gen), torch.randn(B, g, T, d, generator=gen),
            torch.randn(B, g, T, d, generator=gen))


def _segments(B: int, T: int) -> torch.Tensor:
    """Packed documents: row 0 cut at 5 and 13, row 1 at 9 (document ids, non-decreasing)."""
    seg = torch.zeros(B, T, dtype=torch.long)
    for b, cuts in enumerate([(5, 13), (9,)][:B]):
        for c in cuts:
            seg[b, c:] += 1
    return seg


MASKS = {"causal": (None, False), "window-3": (3, False), "window-10": (10, False), "docs": (None, True),
         "window-docs": (4, True)}
HEADS = {"mha": (4, 4), "gqa": (4, 2), "mqa": (4, 1)}


def _blocks(T: int, bounds: list[int]) -> list[torch.Tensor]:
    """Key positions cut at `bounds`, in a scrambled order (the merge is order-free)."""
    cuts = [0] + bounds + [T]
    parts = [torch.arange(a, b) for a, b in zip(cuts, cuts[1:])]
    return parts[1::2] + parts[::2]


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("kind", MASKS)
def test_blockwise_merge_equals_full_attention_forward_and_backward(kind, heads):
    a, g = HEADS[heads]
    window, docs = MASKS[kind]
    q, k, v = _qkv(a=a, g=g)
    T = q.shape[2]
    seg = _segments(2, T) if docs else None
    ref_mask = reference_mask(T, window, seg)
    mask = AttentionMask(window=window, segments=seg)
    pos = torch.arange(T)
    blocks = _blocks(T, [4, 7, 15, 19])
    o, lse = attend_blocks(q, [(k[:, :, kp], v[:, :, kp], mask.block(pos, kp)) for kp in blocks])

    qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
    o_ref, lse_ref = reference_attention(qr, kr, vr, ref_mask)
    assert close(o, o_ref) and close(lse, lse_ref)

    do = torch.randn_like(q)
    o_ref.backward(do.double())
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for kp in blocks:
        m = mask.block(pos, kp)
        if isinstance(m, str):
            continue
        dq_b, dk_b, dv_b = attend_backward(q, k[:, :, kp], v[:, :, kp], o, lse, do, m)
        dq += dq_b
        dk[:, :, kp] += dk_b
        dv[:, :, kp] += dv_b
    assert close(dq, qr.grad) and close(dk, kr.grad) and close(dv, vr.grad)


def test_merge_with_a_block_that_sees_nothing_is_the_identity():
    q, k, v = _qkv(T=8)
    o, lse = attend(q, k, v)
    none = torch.zeros(1, 8, 8, dtype=torch.bool)
    o_e, lse_e = attend(q, k, v, none)
    assert torch.isneginf(lse_e).all() and (o_e == 0).all()
    o2, lse2 = merge(o, lse, o_e, lse_e)
    assert torch.equal(o2, o) and torch.equal(lse2, lse)
    o3, lse3 = merge(*empty_result(q), o, lse)
    assert torch.equal(o3, o) and torch.equal(lse3, lse)


def test_mask_block_kinds():
    m = AttentionMask(window=4)
    assert m.block(torch.arange(8, 12), torch.arange(0, 4)) == EMPTY  # beyond the window
    assert m.block(torch.arange(4, 8), torch.arange(4, 8)) is not None  # causal diagonal: partial
    assert AttentionMask().block(torch.arange(8, 12), torch.arange(0, 4)) is None  # causal, wholly visible
    assert AttentionMask().block(torch.arange(0, 4), torch.arange(8, 12)) == EMPTY  # the future


# --- load balancing (pure index arithmetic) --------------------------------------------------------------
@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_load_balanced_shards_partition_the_sequence_and_balance_causal_work(cp):
    T = 4 * cp * 2
    shards = [balance.local_indices(r, cp, T) for r in range(cp)]
    assert sorted(torch.cat(shards).tolist()) == list(range(T))  # every position exactly once
    n = T // (2 * cp)
    for r, s in enumerate(shards):
        assert s.tolist() == list(range(r * n, (r + 1) * n)) + list(range((2 * cp - 1 - r) * n, (2 * cp - r) * n))
    work = [int((s + 1).sum()) for s in shards]  # query at position t sees t + 1 keys
    assert len(set(work)) == 1


def test_shard_unshard_round_trip():
    x = torch.randn(2, 32, 3)
    for cp in (1, 2, 4):
        assert torch.equal(balance.unshard([balance.shard(x, r, cp) for r in range(cp)]), x)
    assert balance.chunk_ids(1, 4) == (1, 6)


def test_sequence_not_divisible_by_two_cp_chunks_is_rejected_by_flag():
    with pytest.raises(ValueError, match="--seq-length 12 .*--context-parallel-size"):
        balance.local_indices(0, 4, 12)
