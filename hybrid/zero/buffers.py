"""Reused host buffers for the gradient collectives' temporaries (ZeRO stages 1-3 on CPU).

Each reduction needs flat temporaries that live only until it completes: the full gradient of a unit (stages 2-3),
the 2-rank exchange's receive buffer, a later micro-batch's reduced shard. Taken fresh, every one of them is a new
mapping on the host (glibc maps allocations of more than a few MB and unmaps them when freed), so the first write
to each 4 kB page faults: a fresh 74 MB receive buffer cost as much as the transfer into it on a 2-rank gloo pair
(the exchange reduce-scatter 1.9-2.5x slower than with a reused buffer, loaded 2-core machine). torch DDP keeps its
buckets for the run; this pool keeps what the reductions release and hands it back out, best fit.

On a GPU torch's caching allocator already reuses device memory, so the pool only serves host tensors.
"""

from __future__ import annotations

import torch


class BufferPool:
    """Flat buffers handed out (`take`) and handed back (`give`) once nothing reads them; a request is served by
    the smallest free buffer of the same dtype and device holding at least that many elements (a view of its
    front), else newly allocated. Holds at most as many buffers as were out at once."""

    def __init__(self) -> None:
        self._free: list[torch.Tensor] = []

    def take(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialised 1-D tensor of `numel` elements."""
        if device.type != "cpu":
            return torch.empty(numel, dtype=dtype, device=device)
        fits = [i for i, b in enumerate(self._free) if b.dtype == dtype and b.numel() >= numel]
        if not fits:
            return torch.empty(numel, dtype=dtype, device=device)
        return self._free.pop(min(fits, key=lambda i: self._free[i].numel()))[:numel]

    def give(self, t: torch.Tensor | None) -> None:
        """Return a tensor `take` gave out (its whole buffer goes back)."""
        if t is not None and t.device.type == "cpu":
            self._free.append(t if t._base is None else t._base)

    def clear(self) -> None:
        """Release every free buffer to the allocator."""
        self._free.clear()

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._free)
