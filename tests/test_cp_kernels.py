"""The fused block kernel of ring attention (hybrid/cp/kernels.py: torch's CPU flash op with its log-sum-exp),
alone, against full attention computed independently in fp64 (tests/test_cp_softmax.py's reference), and against
the plain-matmul block of hybrid/cp/softmax.py.

Queries and keys are cut into 3 blocks of 8 (slices, as the ring slices its chunks); every (query block, key block)
pair goes through `kernels.attend` with the mask `AttentionMask.kernel_block` gives it -- CAUSAL on square diagonal
blocks (is_causal), None on fully visible blocks, an additive mask otherwise, skipped when empty -- merged with
softmax.merge; backward sums each block's gradients given the FINAL o and lse. MHA / GQA / MQA x causal, window 3
(rows that see nothing of a block), window 10 (diagonal blocks still causal), documents, window + documents:
o, lse, dq, dk, dv within 1e-5 of the largest value, fp32. No processes.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hybrid.comm import Group
from hybrid.cp import kernels, softmax
from hybrid.cp.attention import allgather_attention, ulysses_attention
from hybrid.cp.masks import CAUSAL, EMPTY, AttentionMask
from hybrid.cp.ring import ring_attention
from tests.test_cp_softmax import HEADS, MASKS, _qkv, _segments, close, reference_attention, reference_mask

BLOCKS = [slice(0, 8), slice(8, 16), slice(16, 24)]


def _pairs(mask: AttentionMask, T: int):
    """(query slice, key slice, block mask) of every non-empty block pair, CAUSAL where the op's is_causal fits."""
    pos = torch.arange(T)
    out = []
    for qs in BLOCKS:
        for ks in BLOCKS:
            m = mask.kernel_block(pos[qs], pos[ks])
            if isinstance(m, str) and m == EMPTY:
                continue
            out.append((qs, ks, m))
    return out


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("kind", MASKS)
def test_fused_blocks_merged_equal_full_attention_forward_and_backward(kind, heads):
    a, g = HEADS[heads]
    window, docs = MASKS[kind]
    q, k, v = _qkv(a=a, g=g)
    B, T = q.shape[0], q.shape[2]
    seg = _segments(B, T) if docs else None
    pairs = _pairs(AttentionMask(window=window, segments=seg), T)
    kinds = {type(m).__name__ if not isinstance(m, str) else m for _, _, m in pairs}
    assert "causal" in kinds or window == 3 or docs  # plain causal and window 10 do take is_causal

    o, lse = softmax.empty_result(q)
    for qs, ks, m in pairs:
        o_b, lse_b = kernels.attend(q[:, :, qs], k[:, :, ks], v[:, :, ks], m)
        o[:, :, qs], lse[:, :, qs] = softmax.merge(o[:, :, qs], lse[:, :, qs], o_b.float(), lse_b)
    qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
    o_ref, lse_ref = reference_attention(qr, kr, vr, reference_mask(T, window, seg))
    assert close(o, o_ref) and close(lse, lse_ref)

    do = torch.randn_like(q)
    o_ref.backward(do.double())
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for qs, ks, m in pairs:
        dq_b, dk_b, dv_b = kernels.attend_backward(q[:, :, qs], k[:, :, ks], v[:, :, ks], o[:, :, qs],
                                                   lse[:, :, qs], do[:, :, qs], m)
        dq[:, :, qs] += dq_b
        dk[:, :, ks] += dk_b
        dv[:, :, ks] += dv_b
    assert close(dq, qr.grad) and close(dk, kr.grad) and close(dv, vr.grad)


def test_a_row_that_sees_nothing_of_a_block_has_lse_minus_inf_and_the_plain_path_agrees():
    q, k, v = _qkv(T=8)
    m = torch.ones(1, 8, 8, dtype=torch.bool).tril()
    m[0, 2] = False  # row 2 sees nothing
    o, lse = kernels.attend(q, k, v, m)
    o_p, lse_p = softmax.attend(q, k, v, m)
    assert torch.isneginf(lse[:, :, 2]).all() and (o[:, :, 2] == 0).all()
    assert close(o, o_p) and torch.equal(torch.isneginf(lse), torch.isneginf(lse_p))
    assert close(lse.nan_to_num(neginf=0.0), lse_p.nan_to_num(neginf=0.0))


def _as_bool(m, Tq: int, Tk: int) -> torch.Tensor:
    if isinstance(m, str):
        return torch.ones(1, Tq, Tk, dtype=torch.bool).tril() if m == CAUSAL else torch.zeros(1, Tq, Tk, dtype=torch.bool)
    return torch.ones(1, Tq, Tk, dtype=torch.bool) if m is None else m


@pytest.mark.parametrize("window", [None, 1, 3, 6, 9])
def test_kernel_block_is_the_same_mask_as_block_decided_without_building_it(window):
    """kernel_block on runs of positions (every pair of 4-position runs in 0..15, and scattered positions)
    describes exactly block()'s mask; CAUSAL only on a square diagonal block the window does not cut."""
    mask = AttentionMask(window=window)
    runs = [torch.arange(a, a + 4) for a in range(0, 13, 3)] + [torch.tensor([0, 2, 5, 9])]
    for qp in runs:
        for kp in runs:
            got, want = mask.kernel_block(qp, kp), mask.block(qp, kp)
            assert torch.equal(_as_bool(got, 4, 4), _as_bool(want, 4, 4).expand(1, 4, 4)), (qp, kp, got)
            diagonal = torch.equal(qp, kp) and int(qp[-1] - qp[0]) == 3
            assert (got == CAUSAL if isinstance(got, str) else False) == (diagonal and (window or 99) >= 4)


class _Ops(TorchDispatchMode):
    """Records the aten ops a region runs."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_ring_attention_runs_the_fused_kernel_not_a_score_matrix():
    """At CP 1 the ring holds one block of two chunks: three non-empty sub-blocks (two diagonal, is_causal; the
    second chunk's queries over the first chunk's keys, unmasked), so forward and backward each call the CPU
    flash op three times, and no matmul builds a (Tq, Tk) score matrix (the plain path's `bmm` / `matmul`)."""
    q, k, v = (t.requires_grad_() for t in _qkv(a=4, g=2, T=16))
    with _Ops() as rec:
        ring_attention(q, k, v, Group.solo("cp")).sum().backward()
    assert rec.ops.count("_scaled_dot_product_flash_attention_for_cpu") == 3, rec.ops
    assert rec.ops.count("_scaled_dot_product_flash_attention_for_cpu_backward") == 3, rec.ops
    assert not {"bmm", "mm", "matmul", "logsumexp"} & set(rec.ops), rec.ops


@pytest.mark.parametrize("kind", ["causal", "window-3", "docs"])
def test_allgather_and_ulysses_attention_run_the_fused_kernel_too(kind):
    """Both hand their attention to torch's SDPA, which on CPU dispatches to the same flash op for every mask they
    pass (is_causal, a boolean mask, causal_lower_right) and for GQA (enable_gqa): one forward and one backward
    call per attention call (allgather: one per chunk of plain causal attention), no score-matrix matmul."""
    window, docs = MASKS[kind]
    q, k, v = (t.requires_grad_() for t in _qkv(a=4, g=2, T=16))
    mask = AttentionMask(window=window, segments=_segments(2, 16) if docs else None)
    for fn, calls in ((allgather_attention, 2 if kind == "causal" else 1), (ulysses_attention, 1)):
        with _Ops() as rec:
            fn(q, k, v, Group.solo("cp"), mask).sum().backward()
        assert rec.ops.count("_scaled_dot_product_flash_attention_for_cpu") == calls, (fn.__name__, rec.ops)
        assert rec.ops.count("_scaled_dot_product_flash_attention_for_cpu_backward") == calls, fn.__name__
        assert not {"bmm", "mm", "matmul", "_softmax"} & set(rec.ops), (fn.__name__, rec.ops)
