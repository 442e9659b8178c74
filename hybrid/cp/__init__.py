"""Context parallelism: each sequence split across CP ranks (causal load-balanced), attention by ring (p2p),
Ulysses (a2a) or all-gather. See docs/context-parallel.md.

The names below are imported on first use (PEP 562 `__getattr__`): the planner reads `hybrid.cp.comm_type`
without importing torch through this package."""

from __future__ import annotations

from hybrid.lazy import lazy_names

_LAZY = {"CommType": "hybrid.cp.comm_type", "CPContext": "hybrid.cp.attention",
         "allgather_attention": "hybrid.cp.attention", "ulysses_attention": "hybrid.cp.attention",
         "chunk_ids": "hybrid.cp.balance", "gathered_indices": "hybrid.cp.balance", "local_indices": "hybrid.cp.balance",
         "shard": "hybrid.cp.balance", "unshard": "hybrid.cp.balance", "AttentionMask": "hybrid.cp.masks",
         "ring_attention": "hybrid.cp.ring"}

__all__ = sorted(_LAZY)
__getattr__ = lazy_names("hybrid.cp", _LAZY, globals())
