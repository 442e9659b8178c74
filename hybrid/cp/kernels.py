"""One block of attention with torch's fused (flash) kernel: the output with its log-sum-exp forward, and the
block's gradients backward given the row's *final* output and log-sum-exp -- what ring attention
(hybrid/cp/ring.py) runs for every sub-block, as torch's own ring attention does
(torch/distributed/tensor/experimental/_context_parallel/_attention.py).

    forward    aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0, is_causal, attn_mask=, scale=)
               -> (o in q's dtype, lse fp32)
    backward   aten._scaled_dot_product_flash_attention_for_cpu_backward(do, q, k, v, o, lse, 0, is_causal,
               attn_mask=, scale=) -> (dq, dk, dv)

Backward per block needs only the final o and lse of each row (FlashAttention-2, Alg. 2: p = exp(s - lse) is the
block's share of the final softmax and D = rowsum(do * o) is the row's, both read from the arguments), so each
block's gradients are independent and summed; hybrid/cp/softmax.py states the same math in plain matmuls, and
tests/test_cp_kernels.py checks the two against each other and against fp64 attention.

Which mask a block takes (`BlockMask`, from `AttentionMask.kernel_block`): CAUSAL for a square block of the same
positions with no other masking (the kernel's is_causal: its top-left diagonal is the block's diagonal, and it
skips the tiles above it); None when every query sees every key; else an additive mask (0 visible, -inf not) in
q's dtype, as the op requires.

GQA (g < a key/value heads, a/g = r query heads per kv head) without copying K, V: q (B, a, Tq, d) is viewed as
(B g, r, Tq, d) -- query heads grouped by the kv head they share (transformers' repeat_kv order) -- and k, v
(B, g, Tk, d) as (B g, 1, Tk, d) expanded (stride 0) to r heads. dk, dv come back per query head and are summed
over the r heads of each group. A mask with a batch dimension is repeated over g (the op takes no stride-0
merge of B and g); a batch-free mask broadcasts.

A row that sees no key of a block gets lse = -inf (the kernel writes o = 0, lse = 0 there; the merge needs -inf
so the block weighs nothing).

Devices: the CPU op above. Elsewhere (CUDA's flash / efficient ops are not wired: nothing here runs them) the
plain-matmul path of hybrid/cp/softmax.py computes the same block, exactly, in fp32.
"""

from __future__ import annotations

import torch

from hybrid.cp import softmax
from hybrid.cp.masks import CAUSAL

BlockMask = torch.Tensor | None | str  # (B or 1, Tq, Tk) bool (True = visible), None (all visible) or CAUSAL


def _fused(device: torch.device) -> bool:
    return device.type == "cpu"


def _group_q(t: torch.Tensor, g: int) -> torch.Tensor:
    """(B, a, T, d) -> (B g, a/g, T, d), a view: query heads grouped by their kv head."""
    B, a = t.shape[:2]
    return t.reshape(B * g, a // g, *t.shape[2:])


def _expand_kv(t: torch.Tensor, r: int) -> torch.Tensor:
    """(B, g, T, d) -> (B g, r, T, d), a view with stride 0 over the r query heads of each kv head."""
    B, g, T, d = t.shape
    return t.reshape(B * g, 1, T, d).expand(B * g, r, T, d)


def _additive(m: torch.Tensor, g: int, dtype: torch.dtype) -> torch.Tensor:
    """(B or 1, Tq, Tk) bool -> (B g or 1, 1, Tq, Tk) additive mask in the compute dtype."""
    if m.shape[0] > 1:
        m = m.repeat_interleave(g, dim=0)
    return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(~m, float("-inf"))[:, None]


def _op_args(mask: BlockMask, g: int, dtype: torch.dtype) -> tuple[bool, torch.Tensor | None]:
    """(is_causal, attn_mask) of the op for a block mask."""
    if isinstance(mask, str) and mask == CAUSAL:
        return True, None
    return False, None if mask is None else _additive(mask, g, dtype)


def _to_bool(mask: BlockMask, Tq: int, Tk: int, device: torch.device) -> torch.Tensor | None:
    """The boolean mask softmax.py takes (CAUSAL spelled out)."""
    if isinstance(mask, str) and mask == CAUSAL:
        return torch.ones(Tq, Tk, dtype=torch.bool, device=device).tril()[None]
    return mask


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: BlockMask = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(o (B, a, Tq, d) in q's dtype, lse (B, a, Tq) fp32) of queries q over one block of keys k, v (B, g, Tk, d)."""
    if not _fused(q.device):
        return softmax.attend(q, k, v, _to_bool(mask, q.shape[2], k.shape[2], q.device))
    B, a, Tq, d = q.shape
    g = k.shape[1]
    causal, bias = _op_args(mask, g, q.dtype)
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        _group_q(q, g), _expand_kv(k, a // g), _expand_kv(v, a // g), 0.0, causal, attn_mask=bias)
    o, lse = o.view(B, a, Tq, d), lse.reshape(B, a, Tq)
    if isinstance(mask, torch.Tensor):  # rows that see nothing of this block: weight 0 in the merge
        lse = lse.masked_fill(~mask.any(-1)[:, None], float("-inf"))
    return o, lse


def attend_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                    do: torch.Tensor, mask: BlockMask = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq (B, a, Tq, d), dk, dv (B, g, Tk, d)) of one block's share of attention whose final output is o and
    log-sum-exp lse (B, a, Tq); in q's dtype on the fused path (fp32 on the plain one)."""
    if not _fused(q.device):
        return softmax.attend_backward(q, k, v, o, lse, do, _to_bool(mask, q.shape[2], k.shape[2], q.device))
    B, a, Tq, d = q.shape
    g, r = k.shape[1], a // k.shape[1]
    causal, bias = _op_args(mask, g, q.dtype)
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        _group_q(do.contiguous(), g), _group_q(q, g), _expand_kv(k, r), _expand_kv(v, r),
        _group_q(o.contiguous(), g), _group_q(lse.contiguous(), g), 0.0, causal, attn_mask=bias)
    Tk = k.shape[2]
    return dq.reshape(B, a, Tq, d), dk.reshape(B, g, r, Tk, d).sum(2), dv.reshape(B, g, r, Tk, d).sum(2)
