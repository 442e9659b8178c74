"""Which keys a query may see, by global sequence position: the one mask every CP path (and the unsharded
reference) builds its blocks from.

    visible(i, j) = (j <= i)                      causal
                    and (i - j < W)               sliding window of W keys, the query's own included (Mistral, Qwen2)
                    and (doc(i) == doc(j))        packed documents (`--reset-attention-mask`)

A context-parallel rank holds queries and keys at scattered positions (hybrid/cp/balance.py), so a block of
attention is described by two position vectors rather than an offset; the mask is a function of those alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

EMPTY = "empty"  # a block in which no query sees any key: skipped, its keys still pass round the ring
CAUSAL = "causal"  # a square block of one run of positions cut by causality alone: a fused kernel's is_causal


def _run(pos: torch.Tensor) -> tuple[int, int] | None:
    """(first, last) when `pos` is one ascending run of consecutive positions (a load-balanced chunk), else None."""
    first, last = int(pos[0]), int(pos[-1])
    if last - first != len(pos) - 1 or (len(pos) > 1 and not bool((pos.diff() == 1).all())):
        return None
    return first, last


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

    def kernel_block(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None | str:
        """`block` for a fused kernel (hybrid/cp/kernels.py): CAUSAL where the block is the square causal triangle
        of one run of positions, and decided from the runs' ends alone -- no (Tq, Tk) mask built -- where both
        position vectors are runs and no document cuts them: with d = i - j over the block, visible iff
        0 <= d < W, so EMPTY if max d < 0 or min d >= W, None if min d >= 0 and max d < W."""
        q_run, k_run = _run(q_pos), _run(k_pos)
        if self.segments is None and q_run and k_run:
            window = self.window if self.window is not None else math.inf
            d_min, d_max = q_run[0] - k_run[1], q_run[1] - k_run[0]
            if d_max < 0 or d_min >= window:
                return EMPTY
            if d_min >= 0 and d_max < window:
                return None
            if q_run == k_run and window >= len(q_pos):
                return CAUSAL
        m = self.block(q_pos, k_pos)
        if isinstance(m, torch.Tensor) and q_run and q_run == k_run and m.shape[0] == 1:  # a document's diagonal
            n = len(q_pos)
            if torch.equal(m[0], torch.ones(n, n, dtype=torch.bool, device=m.device).tril()):
                return CAUSAL
        return m

    def full(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """(B or 1, Tq, Tk) bool, always a tensor (the all-gather and Ulysses paths hand it to SDPA)."""
        m = self.block(q_pos, k_pos)
        if m is None or isinstance(m, str):
            return torch.full((1, len(q_pos), len(k_pos)), m is None, dtype=torch.bool, device=q_pos.device)
        return m
