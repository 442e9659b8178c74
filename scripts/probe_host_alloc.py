"""Page faults a rank a step under each host-allocator setting (docs/zero.md, "The host allocator on glibc < 2.39").

    python scripts/probe_host_alloc.py                      # all three settings, 8 steps each
    python scripts/probe_host_alloc.py --setting hybrid --steps 12

bench_zero.py's model (101M Llama, dp 2, fp32) under ZeRO-1 with hybrid's defaults, one train_step at a time; per
rank and step: minor page faults (getrusage, every thread of the rank) and glibc's heap (mallinfo2's `arena`, MB).
Settings: `glibc` -- glibc's default (ZeroOptimizer's thresholds skipped); `hybrid` -- as shipped (mmap and trim
thresholds set by ZeroOptimizer); `hybrid+tcache0` -- the same in ranks started with
GLIBC_TUNABLES=glibc.malloc.tcache_count=0 (fresh interpreters: glibc reads it at start-up; the thresholds then set
here by mallopt, since hybrid leaves a process with GLIBC_TUNABLES alone). Counts, not times: load barely moves them.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SETTINGS = ("glibc", "hybrid", "hybrid+tcache0")


class _MallInfo2(ctypes.Structure):  # glibc >= 2.33's struct mallinfo2, all size_t
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def _rank(rank: int, world: int, setting: str, steps: int) -> dict:
    import torch

    import bench_zero as bz
    import hybrid.zero.engine as engine
    from hybrid.mesh import Mesh, ParallelDims
    from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    from hybrid.zero.host_alloc import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, THRESHOLD
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    if setting == "glibc":
        engine.retain_freed_host_memory = lambda: False
    elif setting == "hybrid+tcache0":  # what retain_freed_host_memory does, past its GLIBC_TUNABLES check
        engine.retain_freed_host_memory = lambda: bool(libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD)
                                                       and libc.mallopt(M_TRIM_THRESHOLD, THRESHOLD))
    args = bz.parse_args([])
    mesh = Mesh.build(ParallelDims(dp=world))
    model = torch.nn.ModuleList([bz.build(args)])
    zero = ZeroOptimizer(model, mesh, ZeroConfig(stage=1), OptimizerConfig(lr=1e-3, weight_decay=0.01))
    faults, heap_mb = [], []
    for it in range(steps):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        train_step(model, [bz.batch(args, rank, it)], zero, mesh, runner=LocalForwardBackward(model[0], mesh.device))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        heap_mb.append(libc.mallinfo2().arena >> 20)
    return {"faults": faults, "heap_mb": heap_mb}


def main(argv: list[str] | None = None) -> None:
    from hybrid.cliutil import HelpFormatter, OneLineParser, int_in
    p = OneLineParser(prog="probe_host_alloc.py", description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--setting", choices=SETTINGS + ("all",), default="all", help="which allocator setting(s)")
    p.add_argument("--steps", type=int_in(1, 100), default=8, help="train steps a setting")
    args = p.parse_args(argv)
    from hybrid.testing import run_distributed
    for setting in SETTINGS if args.setting == "all" else (args.setting,):
        method = "forkserver"
        if setting == "hybrid+tcache0":
            os.environ["GLIBC_TUNABLES"] = "glibc.malloc.tcache_count=0"
            method = "spawn"
        try:
            results = run_distributed(_rank, 2, args=(setting, args.steps), start_method=method, timeout=1800)
        finally:
            os.environ.pop("GLIBC_TUNABLES", None)
        for rank, r in enumerate(results):
            print(f"{setting:15s} rank {rank}  faults a step {r['faults']}  heap MB {r['heap_mb']}", flush=True)


if __name__ == "__main__":
    main()
