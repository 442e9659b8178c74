"""Which keys a query may see, by global sequence position: the one mask every CP path (and the unsharded
reference) builds its blocks from.

    visible(i, j) = (j <= i)                      causal
                    and (i - j < W)               sliding window of W keys, the query's own included (Mistral, Qwen2)
                    and (doc(i) == doc(j))        packed documents (`--reset-attention-mask`)

A context-parallel rank holds queries and keys at scattered positions (hybrid/cp/balance.py), so a block of
attention is described by two position vectors rather than an offset; the mask is a function of those alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EMPTY = "empty"  # a block in which no query sees any key: skipped, its keys still pass round the ring


@dataclass(frozen=True)
class AttentionMask:
    """Attributes:
        window: sliding-window size W in keys (None: the whole causal prefix).
        segments: (B, T) int64 document id of every position of the whole sequence (None: one document per
            row). Built by the data loader from the end-of-document tokens (hybrid/cp/data.py).
    """

    window: int | None = None
    segments: torch.Tensor | None = None

    def block(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None | str:
        """The mask of queries at `q_pos` (Tq,) against keys at `k_pos` (Tk,): None when every query sees every
        key (no mask needed), EMPTY when none sees any, else (B or 1, Tq, Tk) bool, True = visible."""
        d = q_pos[:, None] - k_pos[None, :]  # (Tq, Tk)
        vis = d >= 0
        if self.window is not None:
            vis = vis & (d < self.window)
        vis = vis[None]
        if self.segments is not None:
            seg = self.segments.to(q_pos.device)
            vis = vis & (seg[:, q_pos, None] == seg[:, None, k_pos])
        if not bool(vis.any()):
            return EMPTY
        if bool(vis.all()):
            return None
        return vis

    def full(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """(B or 1, Tq, Tk) bool, always a tensor (the all-gather and Ulysses paths hand it to SDPA)."""
        m = self.block(q_pos, k_pos)
        if m is None or isinstance(m, str):
            return torch.full((1, len(q_pos), len(k_pos)), m is None, dtype=torch.bool, device=q_pos.device)
        return m
