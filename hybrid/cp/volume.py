"""The bytes ring attention sends, with no torch import: the planner (hybrid/planner/context.py) prices the runtime's
ring from this function, and `hybrid plan` reads it without the runtime (ring.py re-exports it)."""

from __future__ import annotations


def ring_bytes(kv_elements: int, cp: int, element_size: int) -> tuple[int, int]:
    """(forward, backward) bytes one rank sends per attention layer and micro-batch (`send@cp` on the ledger;
    as many received), for a rank's K and V of `kv_elements` elements (2 B g (T/CP) d) in the compute dtype:
    forward CP - 1 ring steps of K, V; backward the same plus CP transfers of the fp32 dK, dV accumulators."""
    kv = kv_elements * element_size
    return (cp - 1) * kv, (cp - 1) * kv + cp * kv_elements * 4
