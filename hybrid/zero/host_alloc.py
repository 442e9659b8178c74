"""Keep freed host memory for reuse: glibc's malloc set to serve large tensors from its heap (ZeRO on CPU).

glibc maps every allocation above its mmap threshold (dynamic, at most 32 MB) with a fresh `mmap` and unmaps it
when freed, so each new large tensor's first write faults once per 4 kB page and the kernel zeroes every page. A
training step allocates its large gradients afresh: on the bench's 101M Llama (36000 x 1024 embedding and LM head,
147 MB each) autograd's two weight gradients alone are ~72k page faults a rank a step, 70-110 ms of a ~0.37 s
backward on one core (measured; `tests/test_zero12_host_alloc.py` counts the faults of a 64 MB tensor). `BufferPool` (buffers.py) already keeps the
reductions' own temporaries; these are autograd's, which no pool of ours can hand out.

Raising glibc's mmap threshold (and the trim threshold with it) makes those allocations come from the heap, whose
freed blocks the next step reuses: no faults after the first step, no zeroing. It is torch's caching allocator's
rule on a GPU (never return device memory mid-run) and what PyTorch's CPU tuning guide gets by preloading jemalloc
or tcmalloc. The cost: freed memory stays resident (the step's peak, as on a GPU) instead of going back to the
system between steps.

Process-wide by nature (glibc has one malloc), so it is applied only where the process is a data-parallel rank
(`ZeroOptimizer` on the CPU with dp > 1, at ZeRO 1-2: at ZeRO 3 the retained heap raised the peak resident set
above FSDP2's, 1859 vs 1737 MB a rank on the bench, docs/zero.md), only on glibc, and never over a choice the user
made: glibc's own
`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_` or `GLIBC_TUNABLES`, or an allocator preloaded through
`LD_PRELOAD` (jemalloc, tcmalloc), leave it untouched.

On glibc before 2.39 torch's tensors get most of it, not all (measured on the bench's model, docs/zero.md: 72-95k
faults a rank a step without it; with it, under 100 in most steps after the first two, 4-39k in one or two). torch
allocates host tensors with `posix_memalign(64, n)`, which glibc serves from a chunk of n + 64 + 32 bytes, freeing
the part beyond n again. Freed, the block is n bytes -- too small for the next identical request (n + 96 again) --
and it merges with the free memory after it only if nothing in use sits there. Two things often do: that spare
part, which free() parks in the thread's cache of small chunks (tcache, up to 7 a size, never merged while cached:
glibc bug 30723, fixed upstream in 2.39 -- not measured here, on 2.36), and any small allocation carved from the
heap's top while the block lived. The next tensor is then carved from new pages (a 64 MB one: 16,384 faults) until
the freed blocks around it merge; how often depends on the process's history. The block itself stays in the heap
either way (no mapping, no trim), and a plain malloc of the same size reuses it at once; tests/test_zero12_host_alloc.py
checks both. No mallopt option reaches the cache (glibc reads `glibc.malloc.tcache_count` once, at start-up; set
to 0 it removes the first cause only).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
THRESHOLD = 1 << 30  # 1 GiB: above any single tensor the ranks allocate per step (the largest here: 147 MB)
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES", "LD_PRELOAD")

_applied: bool | None = None  # None: not tried in this process yet


def user_chose_allocator(env: dict[str, str] | None = None) -> str | None:
    """The environment variable by which the user set up the allocator themselves, None if none."""
    env = os.environ if env is None else env
    return next((k for k in USER_SETTINGS if env.get(k)), None)


def retain_freed_host_memory() -> bool:
    """Set glibc's mmap and trim thresholds to THRESHOLD, once per process; True if set (now or before)."""
    global _applied
    if _applied is None:
        _applied = False
        libc_name = ctypes.util.find_library("c")
        if libc_name and user_chose_allocator() is None:
            try:
                libc = ctypes.CDLL(libc_name)
                mallopt, _ = libc.mallopt, libc.gnu_get_libc_version  # glibc's own symbols
            except (OSError, AttributeError):  # not glibc: its option numbers mean nothing elsewhere
                return False
            _applied = bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, THRESHOLD))
    return _applied
