"""Data-parallel gradient averaging with buckets.

After the last micro-batch's backward, gradients are packed into flat buckets of about
`bucket_bytes` and each bucket is all-reduced over the DP group and divided by dp. One big
all-reduce per bucket instead of one per parameter amortises each collective's fixed latency
(the same reason torch DDP buckets at 25 MB). This is the reference implementation, kept for
tests that compare against it; training uses `hybrid.zero.ZeroOptimizer` (stage 0 = this, with
the buckets reduced from backward hooks so they overlap backward).

Per step this moves 2(n-1)/n * Psi * bytes on the wire per rank (ring all-reduce of the
Psi gradients this rank holds), recorded on the ledger as all_reduce@dp of Psi * bytes.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn as nn

from hybrid.comm import Group

DEFAULT_BUCKET_BYTES = 25 * 2**20


def make_buckets(params: list[nn.Parameter], bucket_bytes: int,
                 element_size: int | None = None) -> list[list[nn.Parameter]]:
    """Consecutive parameters (in reverse registration order: the order backward produces them)
    grouped until a bucket reaches `bucket_bytes`. `element_size` counts each element at that many
    bytes (the gradient dtype, when it differs from the parameters'); default: the parameter's own."""
    buckets: list[list[nn.Parameter]] = [[]]
    size = 0
    for p in reversed(params):
        nbytes = p.numel() * (element_size or p.element_size())
        if buckets[-1] and size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes
    return [b for b in buckets if b]


class GradAverager:
    """Averages the gradients of `params` over the data-parallel group, bucket by bucket: the unsharded-DP
    reference of the tests (ZeRO stages 0-1 equal it bit for bit); train.py never runs it."""

    loss_scale = 1.0  # no loss scaling (fp32)

    def __init__(self, params: Iterable[nn.Parameter], dp: Group, bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        self.dp = dp
        self.buckets = make_buckets([p for p in params if p.requires_grad], bucket_bytes)

    def begin_step(self, num_micro_batches: int) -> None:
        """Nothing to arm: this averager runs after backward."""

    def finish_backward(self, model: nn.Module, mesh) -> None:
        """After the last backward: TP partial sums, tied-embedding sums, then the DP average."""
        from hybrid.tp import sync_partial_grads
        from hybrid.train_step import sync_tied_embeddings
        sync_partial_grads(model.parameters(), mesh.tp)
        sync_tied_embeddings(model, mesh)
        self()

    @torch.no_grad()
    def __call__(self) -> None:
        if self.dp.size == 1:
            return
        for bucket in self.buckets:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket]
            flat = torch.cat([g.flatten() for g in grads])
            self.dp.all_reduce(flat).div_(self.dp.size)
            offset = 0
            for p, g in zip(bucket, grads):
                p.grad = flat[offset:offset + g.numel()].view_as(p)
                offset += g.numel()
