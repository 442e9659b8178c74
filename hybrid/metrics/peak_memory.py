"""Peak memory of each rank, for the log line, TensorBoard and the JSON-lines file.

Two measures, one per device kind, each named for what it is:

* CUDA: `torch.cuda.max_memory_allocated` -- the most bytes of tensors the caching allocator has handed out
  since the process started (Megatron's `mem-max-allocated-bytes`). Cached-but-free blocks are not counted.
* CPU: the process's peak resident set size, the kernel's high-water mark of its resident pages (`VmHWM` in
  /proc/self/status). torch keeps no allocator statistics on CPU, and the other candidates measure less than
  what the host must hold: the activation ledger (hybrid/measured_memory.py) counts saved activations only and costs a
  hook on every saved tensor; model-state bytes leave out activations, buffers and workspace. Peak RSS is what a
  host memory limit (a cgroup, the OOM killer) counts, and reading it costs one small file read. It includes the
  interpreter and the mapped pages of torch's libraries (a few hundred MB) that a GPU figure leaves out --
  compare CPU runs with CPU runs.
  Not `getrusage(RUSAGE_SELF).ru_maxrss`: Linux carries it across fork + exec, so a rank started by a launcher
  reports at least the launcher's peak (a rank under pytest showed pytest's 372 MiB, above its own 301 MiB).
  VmHWM belongs to the process's own address space, made new by exec. Without /proc (macOS) ru_maxrss is the
  fallback.

Both are peaks since the process started, never reset, so a value on a later log line is never lower.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MemoryMeasure:
    """Attributes:
        key: the field name in the JSON-lines file (bytes, the max over ranks; `key` + "_per_rank" the list).
        tag: the TensorBoard tag of the max over ranks.
        label: what the log line calls it.
    """

    key: str
    tag: str
    label: str


CUDA_MEASURE = MemoryMeasure("max_memory_allocated_bytes", "mem-max-allocated-bytes", "max allocated")
CPU_MEASURE = MemoryMeasure("peak_rss_bytes", "mem-peak-rss-bytes", "peak RSS")


def measure_for(device: torch.device) -> MemoryMeasure:
    return CUDA_MEASURE if device.type == "cuda" else CPU_MEASURE


def peak_rss_bytes() -> int:
    """This process's peak resident set size in bytes: VmHWM (kB) from /proc/self/status; without /proc,
    getrusage's ru_maxrss (kibibytes on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def current_rss_bytes() -> int:
    """This process's resident set size now (VmRSS); 0 without /proc. The start-up line's baseline: what a rank
    holds before its model is built (the interpreter, torch's libraries, the process group)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_memory_bytes(device: torch.device) -> int:
    """This rank's peak by the measure of its device kind (module docstring)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return peak_rss_bytes()


def gather_peaks(device: torch.device, group=None) -> list[int]:
    """Every rank's peak, in rank order: an all-gather of one int64 over `group` (hybrid.comm.Group, the mesh's
    world; collective, so every rank calls it at the same log line). Without a group: this process's alone."""
    mine = torch.tensor([peak_memory_bytes(device)], dtype=torch.int64, device=device)
    if group is None or group.size == 1:
        return [int(mine.item())]
    return [int(v) for v in group.all_gather(mine).tolist()]


def memory_field(peaks: list[int], measure: MemoryMeasure) -> str:
    """' | peak RSS 371.2 MiB (max, rank 3; min 352.0)' for the log line (one rank: no max/min)."""
    mib = [p / 2**20 for p in peaks]
    top = max(range(len(peaks)), key=lambda r: peaks[r])
    if len(peaks) == 1:
        return f" | {measure.label} {mib[0]:.1f} MiB"
    return f" | {measure.label} {mib[top]:.1f} MiB (max, rank {top}; min {min(mib):.1f})"
