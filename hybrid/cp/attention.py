"""Context-parallel attention: the three ways of attending this rank's T/CP queries to all T keys.

    p2p        ring attention (hybrid/cp/ring.py): K, V blocks pass round the ring, the next transfer overlapped
               with the current block's compute; partial results merged by log-sum-exp. Moves 2 (CP-1)/CP of
               the sequence's K, V per rank forward; never holds more than two blocks of keys.
    a2a        Ulysses (Jacobs et al. 2023): all-to-all from sequence-sharded (B, a, T/CP, d) to head-sharded
               (B, a/CP, T, d) for q, k and v, ordinary attention over the whole sequence for a/CP heads, and
               an all-to-all back. Needs the query and key/value heads of a TP rank divisible by CP.
    allgather  all-gather K, V (B, g, T, d), attend the local queries to them with the global mask
               (Megatron's "all_gather" type; the simplest, and the reference for the others).

All three take q (B, a, T/CP, d), k, v (B, g, T/CP, d) holding this rank's load-balanced tokens
(hybrid/cp/balance.py) after RoPE, and return o (B, a, T/CP, d): exactly softmax(q k^T / sqrt(d) + mask) v of
those queries over the whole sequence. GQA / MQA (g < a), sliding windows and packed-document masks hold on
every path (hybrid/cp/masks.py).
"""

from __future__ import annotations

from hybrid.cp.comm_type import CommType  # noqa: F401  (re-exported: callers import it from here)
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
from torch.utils._python_dispatch import _disable_current_modes

from hybrid.comm import Group
from hybrid.cp.balance import gathered_indices, local_indices
from hybrid.cp.collectives import gather_seq, heads_to_seq, seq_to_heads
from hybrid.cp.masks import AttentionMask
from hybrid.cp.ring import ring_attention


@dataclass(frozen=True)
class CPContext:
    """What an attention layer needs to know about context parallelism.

    Attributes:
        group: the context-parallel group (size 1: no CP; every token of the sequence is here).
        comm_type: how keys and values reach the queries (`--cp-comm-type`).
    """

    group: Group
    comm_type: CommType = CommType.P2P

    @property
    def size(self) -> int:
        return self.group.size

    @property
    def rank(self) -> int:
        return self.group.rank

    def positions(self, local_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """(T/CP,) the sequence positions of this rank's tokens (RoPE, learned positions)."""
        return local_indices(self.rank, self.size, local_len * self.size, device)

    # Eager under --compile (compile_blocks, hybrid/train/loop.py, traces each block's body), as the MoE layer
    # (hybrid/moe/layer.py): the exchange and the attention over it run outside the graph, one graph break at this
    # call; the projections, RoPE, norms and MLP around it compile. Traced, dynamo entered each path's autograd
    # Function and broke at every point-to-point post (the op trail's lock, hybrid/trail.py) and every host read of
    # the load-balanced positions (hybrid/cp/masks.py `int(pos[0])`): a 2-block tiny Llama at cp 2 (p2p) made 17
    # graphs and 16 breaks, 4 graphs and 5 breaks with this (tests/test_compose20_compile.py). torch's p2p ops have
    # no traceable form (functional collectives cover the all-gather and all-to-all, not isend / irecv), and
    # the attention itself is torch's flash kernel per sub-block: nothing left for inductor to fuse.
    @torch._disable_dynamo
    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: AttentionMask = AttentionMask()) -> torch.Tensor:
        if self.comm_type is CommType.P2P:
            return ring_attention(q, k, v, self.group, mask)
        if self.comm_type is CommType.A2A:
            return ulysses_attention(q, k, v, self.group, mask)
        return allgather_attention(q, k, v, self.group, mask)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, q_pos: torch.Tensor,
         k_pos: torch.Tensor) -> torch.Tensor:
    """torch's attention of queries at q_pos over keys at k_pos. Plain causal attention over a whole sequence in
    order takes SDPA's is_causal (no T x T mask; flash kernels); anything else an explicit boolean mask."""
    gqa = k.shape[1] != q.shape[1]
    T = len(q_pos)
    in_order = len(k_pos) == T and bool((q_pos == torch.arange(T, device=q_pos.device)).all()) and \
        bool((k_pos == q_pos).all())
    if in_order and mask.segments is None and (mask.window is None or mask.window >= T):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    m = mask.full(q_pos, k_pos)[:, None]  # (B or 1, 1, Tq, Tk)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=gqa)


def _lower_right(n: int, end: int):
    """torch's `causal_lower_right(n, end)`: n queries at the last n of `end` positions, each seeing its prefix.
    Built with the dispatch modes set aside: the bias is a Tensor subclass carrying two ints, and under op-level
    recomputation (torch's selective-checkpoint mode, `--recompute-granularity selective-op`) the mode would
    hand its constructor a plain tensor and the construction fails. SDPA on it still runs under the mode."""
    with _disable_current_modes():
        return causal_lower_right(n, end)


def allgather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Group,
                        mask: AttentionMask = AttentionMask()) -> torch.Tensor:
    """Gather K and V (one all-gather of both, reduce-scattered in backward), attend the local queries.

    Plain causal attention needs no mask: put the gathered keys in sequence order; each of the rank's two chunks
    (positions [a, b)) then sees exactly the keys [0, b) with its diagonal at the bottom right (torch's
    `causal_lower_right`), so nothing of size (T/CP) x T is built or kept. Windows and documents take the mask."""
    cp, T = group.size, q.shape[2] * group.size
    kv = gather_seq(torch.stack([k, v]), group, dim=3)  # (2, B, g, T, d), rank-major order
    q_pos, k_pos = local_indices(group.rank, cp, T, q.device), gathered_indices(cp, T, q.device)
    if mask.segments is not None or (mask.window is not None and mask.window < T):
        return sdpa(q, kv[0], kv[1], mask, q_pos, k_pos)
    kv = kv.index_select(3, torch.argsort(k_pos))  # sequence order
    n, gqa = q.shape[2] // 2, k.shape[1] != q.shape[1]
    outs = []
    for half in (0, 1):
        end = int(q_pos[half * n + n - 1]) + 1  # the chunk's last position + 1: the keys it may see
        outs.append(F.scaled_dot_product_attention(q[:, :, half * n:(half + 1) * n], kv[0][:, :, :end],
                                                   kv[1][:, :, :end], attn_mask=_lower_right(n, end),
                                                   enable_gqa=gqa))
    return torch.cat(outs, dim=2)


def check_ulysses_heads(q_heads: int, kv_heads: int, cp: int) -> None:
    """Ulysses gives each CP rank whole heads: the query and key/value heads of a TP rank must split CP ways (a
    GQA model with fewer kv-heads than CP cannot: use p2p or allgather)."""
    for what, n in (("attention head", q_heads), ("key/value head", kv_heads)):
        if n % cp:  # one head a rank: no CP size > 1 divides it, so only the other comm types are named
            sizes = f"a context-parallel size dividing {n}, or " if n > 1 else ""
            raise ValueError(f"--cp-comm-type a2a splits heads over --context-parallel-size {cp}, but a tensor-"
                             f"parallel rank holds {n} {what}{'s' if n > 1 else ''}; use {sizes}--cp-comm-type p2p / "
                             f"allgather")


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Group,
                      mask: AttentionMask = AttentionMask()) -> torch.Tensor:
    """All-to-all to head-sharded whole sequences, attention in sequence order, all-to-all back."""
    cp = group.size
    check_ulysses_heads(q.shape[1], k.shape[1], cp)
    T = q.shape[2] * cp
    gathered = gathered_indices(cp, T, q.device)  # position of each gathered token
    order = torch.argsort(gathered)  # gathered -> sequence order
    qh, kh, vh = (seq_to_heads(t.contiguous(), group).index_select(2, order) for t in (q, k, v))
    pos = torch.arange(T, device=q.device)
    o = sdpa(qh, kh, vh, mask, pos, pos)  # (B, a/CP, T, d) in sequence order
    return heads_to_seq(o.index_select(2, gathered).contiguous(), group)


def context_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: CPContext | None,
                      mask: AttentionMask) -> torch.Tensor:
    """The attention layer's entry: over CP ranks when `cp` is given, else over the whole local sequence in
    order (packed documents at cp = 1) with torch's SDPA."""
    if cp is not None and cp.size > 1:
        return cp.attention(q, k, v, mask)
    pos = torch.arange(q.shape[2], device=q.device)
    return sdpa(q, k, v, mask, pos, pos)
