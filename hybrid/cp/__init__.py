"""Context parallelism: each sequence split across CP ranks (causal load-balanced), attention by ring (p2p),
Ulysses (a2a) or all-gather. See docs/context-parallel.md."""

from hybrid.cp.attention import CommType, CPContext, allgather_attention, ulysses_attention
from hybrid.cp.balance import chunk_ids, gathered_indices, local_indices, shard, unshard
from hybrid.cp.masks import AttentionMask
from hybrid.cp.ring import ring_attention

__all__ = ["AttentionMask", "CPContext", "CommType", "allgather_attention", "chunk_ids", "gathered_indices",
           "local_indices", "ring_attention", "shard", "ulysses_attention", "unshard"]
