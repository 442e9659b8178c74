"""Which parameters are experts' (no heavy imports: ZeRO and the checkpoint ask this).

An expert parameter lives on one expert-parallel rank and is replicated over that rank's expert-data-parallel
group, not over the dense data-parallel group (hybrid/moe/parallel.py), so ZeRO reduces and shards its
gradient over the expert-DP group, the gradient norm counts it on every rank of the EP group, and the
checkpoint writes it from expert-DP rank 0. Megatron marks the same parameters with `allreduce = False`.
"""

from __future__ import annotations

import torch


def mark_expert(p: torch.Tensor) -> torch.Tensor:
    p.expert = True
    return p


def is_expert(p: torch.Tensor) -> bool:
    return getattr(p, "expert", False)
