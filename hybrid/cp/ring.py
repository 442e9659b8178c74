"""Ring attention (Liu et al. 2023; Megatron's `AttnFuncWithCPAndKVP2P`): keys and values travel round the CP
ring while each rank attends its own queries to the block it holds.

CP rank r holds queries, keys and values of its two load-balanced chunks (hybrid/cp/balance.py). In step
s = 0 .. CP-1 it holds the keys/values of rank r - s (mod CP) and

    forward   posts the send of that block to r + 1 and the receive of the next from r - 1, attends its queries
              to the block it holds (hybrid/cp/softmax.py, merged into the running o, lse), then waits:
              the transfer of block s + 1 overlaps the compute of block s.
    backward  the same ring of keys/values, plus an fp32 accumulator dK, dV that travels with each block: at
              step s rank r receives from r - 1 the accumulator of the block it now holds, adds its own
              share, and sends it on to r + 1; after the last step the accumulator reaches its owner.

Each step splits into four sub-blocks (two query chunks x two key chunks); a sub-block no query can see
(future chunks, beyond a sliding window, other documents) is skipped. Every other sub-block runs torch's fused
flash kernel with its log-sum-exp (hybrid/cp/kernels.py): is_causal on a diagonal sub-block, no mask on a fully
visible one, an additive mask only where a window or document boundary cuts it. For plain causal attention this is
Megatron's balanced split: the diagonal step is causal; of a block from an earlier rank (j < r) both query chunks
see only its first chunk; a block from a later rank (j > r) only the second query chunk sees, whole -- half a
block of work each, on every rank.

Bytes on the ledger (`send@cp`, counted by the sender; b = bytes of the compute dtype, kv = 2 B g (T/CP) d):

    forward   (CP - 1) kv b                     backward  (CP - 1) kv b  +  CP kv 4   (fp32 accumulators)

Only q, k, v, the output (in the compute dtype) and lse (B, a, T/CP, fp32) are saved for backward: the attention
matrix is never kept. Backward runs the kernel's backward per sub-block with these final o and lse
(FlashAttention-2: each block's gradients are independent given them) and sums in fp32.
"""

from __future__ import annotations

import torch

from hybrid.comm import Group
from hybrid.cp.balance import local_indices
from hybrid.cp.kernels import attend, attend_backward
from hybrid.cp.masks import EMPTY, AttentionMask
from hybrid.cp.softmax import empty_result, merge
from hybrid.cp.volume import ring_bytes  # noqa: F401  (re-exported)


def _halves(pos: torch.Tensor) -> list[tuple[slice, torch.Tensor]]:
    """The two load-balanced chunks of a rank's tokens: (slice into the local tensor, their positions)."""
    n = len(pos) // 2
    return [(slice(0, n), pos[:n]), (slice(n, 2 * n), pos[n:])]


def _sub_blocks(mask: AttentionMask, q_pos: torch.Tensor, k_pos: torch.Tensor):
    """(query slice, key slice, block mask of hybrid/cp/kernels.py) of every sub-block in which some query sees
    some key."""
    out = []
    for qs, qp in _halves(q_pos):
        for ks, kp in _halves(k_pos):
            m = mask.kernel_block(qp, kp)
            if not (isinstance(m, str) and m == EMPTY):
                out.append((qs, ks, m))
    return out


class _Ring:
    """The CP group seen as a ring: post a send to the next rank and a receive from the previous one."""

    def __init__(self, group: Group, phase: str):
        self.group, self.phase = group, phase
        self.next, self.prev = (group.rank + 1) % group.size, (group.rank - 1) % group.size

    def shift(self, t: torch.Tensor | None, recv_like: torch.Tensor | None, step: int, what: str):
        """Post send of `t` (None: no send) and receive into a new buffer shaped `recv_like` (None: none).
        Returns (buffer, works); the op trail names the CP ring step, so a hang says which one."""
        sends = [(t, self.next)] if t is not None else []
        buf = torch.empty_like(recv_like) if recv_like is not None else None
        recvs = [(buf, self.prev)] if buf is not None else []
        labels = tuple(f"cp ring {self.phase} step {step}: {kind} {what}"
                       for kind in (["send"] * len(sends) + ["recv"] * len(recvs)))
        return buf, self.group.batch_p2p_async(sends, recvs, labels=labels)


def _wait(works) -> None:
    for w in works:
        w.wait()


class RingAttention(torch.autograd.Function):
    """o = softmax(q k^T / sqrt(d) + mask) v over the whole sequence, for this rank's queries; q (B, a, T/CP, d),
    k, v (B, g, T/CP, d) load-balanced shards, `group` the CP group. Returns o in q's dtype."""

    @staticmethod
    def forward(ctx, q, k, v, group: Group, mask: AttentionMask):
        cp, r = group.size, group.rank
        seq_len = q.shape[2] * cp
        q_pos = local_indices(r, cp, seq_len, q.device)
        o, lse = empty_result(q)
        ring, kv = _Ring(group, "forward"), torch.stack([k, v])  # (2, B, g, T/CP, d): one transfer a step
        for step in range(cp):
            src = (r - step) % cp
            nxt, works = ring.shift(kv, kv, step, "kv") if step < cp - 1 else (None, [])
            for qs, ks, m in _sub_blocks(mask, q_pos, local_indices(src, cp, seq_len, q.device)):
                o_b, lse_b = attend(q[:, :, qs], kv[0][:, :, ks], kv[1][:, :, ks], m)
                o[:, :, qs], lse[:, :, qs] = merge(o[:, :, qs], lse[:, :, qs], o_b.float(), lse_b)  # no autograd
            _wait(works)
            kv = nxt
        out = o.to(q.dtype)
        ctx.group, ctx.mask = group, mask
        ctx.save_for_backward(q, k, v, out, lse)  # the output in the compute dtype, as flash kernels keep it
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        group, mask = ctx.group, ctx.mask
        cp, r = group.size, group.rank
        seq_len = q.shape[2] * cp
        q_pos = local_indices(r, cp, seq_len, q.device)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        ring, kv = _Ring(group, "backward"), torch.stack([k, v])
        acc_like = torch.empty((2,) + tuple(k.shape), dtype=torch.float32, device=k.device)
        sending = []
        for step in range(cp):
            src = (r - step) % cp
            acc_in, w_acc = ring.shift(None, acc_like, step, "dkv") if step > 0 else (None, [])
            nxt, w_kv = ring.shift(kv, kv, step, "kv") if step < cp - 1 else (None, [])
            mine = torch.zeros_like(acc_like)
            for qs, ks, m in _sub_blocks(mask, q_pos, local_indices(src, cp, seq_len, q.device)):
                dq_b, dk_b, dv_b = attend_backward(q[:, :, qs], kv[0][:, :, ks], kv[1][:, :, ks], o[:, :, qs],
                                                   lse[:, :, qs], do[:, :, qs], m)
                dq[:, :, qs] += dq_b
                mine[0][:, :, ks] += dk_b
                mine[1][:, :, ks] += dv_b
            _wait(w_acc)
            acc = mine if acc_in is None else acc_in.add_(mine)
            if cp == 1:
                own = acc
            else:
                sending += ring.shift(acc, None, step, "dkv")[1]
            _wait(w_kv)
            kv = nxt
        if cp > 1:
            own, w_own = ring.shift(None, acc_like, cp, "dkv")
            _wait(w_own)
        _wait(sending)
        return dq.to(q.dtype), own[0].to(k.dtype), own[1].to(v.dtype), None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Group,
                   mask: AttentionMask = AttentionMask()) -> torch.Tensor:
    return RingAttention.apply(q, k, v, group, mask)
