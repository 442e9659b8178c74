"""Data-parallel gradient averaging with buckets.

After the last micro-batch's backward, gradients are packed into flat buckets of about
`bucket_bytes` and each bucket is all-reduced over the DP group and divided by dp. One big
all-reduce per bucket instead of one per parameter amortises each collective's fixed latency
(the same reason torch DDP buckets at 25 MB). Overlapping the buckets with backward comes with
the ZeRO work (issue: ZeRO stages 1-3), which replaces this class behind the same call.

Per step this moves 2(n-1)/n * Psi * bytes on the wire per rank (ring all-reduce of the
Psi gradients this rank holds), recorded on the ledger as all_reduce@dp of Psi * bytes.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn as nn

from hybrid.comm import Group

DEFAULT_BUCKET_BYTES = 25 * 2**20


def make_buckets(params: list[nn.Parameter], bucket_bytes: int) -> list[list[nn.Parameter]]:
    """Consecutive parameters (in reverse registration order: the order backward produces them)
    grouped until a bucket reaches `bucket_bytes`."""
    buckets: list[list[nn.Parameter]] = [[]]
    size = 0
    for p in reversed(params):
        if buckets[-1] and size + p.numel() * p.element_size() > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += p.numel() * p.element_size()
    return [b for b in buckets if b]


class GradAverager:
    """Averages the gradients of `params` over the data-parallel group, bucket by bucket."""

    def __init__(self, params: Iterable[nn.Parameter], dp: Group, bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        self.dp = dp
        self.buckets = make_buckets([p for p in params if p.requires_grad], bucket_bytes)

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
