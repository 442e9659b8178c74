"""Checkpoint throughput and the time training is blocked: sync save vs --async-save, and load.

    python scripts/bench_checkpoint.py --model gpt2 --dir /tmp/bench_ckpt          # one process
    torchrun --nproc-per-node 4 scripts/bench_checkpoint.py --zero-stage 1 ...      # any layout (dp = world)

Per repeat: a synchronous save (blocked = total), an asynchronous save (blocked = until start_save
returns, i.e. the CPU staging copy; total = until finish), a load (checksum verification + DCP read).
Throughput is checkpoint bytes / seconds, beside the disk's write bandwidth measured with one fsynced
file of the same size. Prints one JSON line per measurement, medians at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from hybrid.checkpoint import core, store  # noqa: E402
from hybrid.mesh import Mesh, ParallelDims  # noqa: E402
from hybrid.tp import ParallelRNG, TPContext  # noqa: E402
from hybrid.training import OptimizerConfig  # noqa: E402
from hybrid.zero import ZeroConfig, ZeroOptimizer  # noqa: E402
from models import build_pipeline_chunks, load_config  # noqa: E402


def disk_write_gbps(directory: str, nbytes: int) -> float:
    path = os.path.join(directory, "bandwidth.probe")
    data = os.urandom(min(nbytes, 1 << 26))
    t = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            f.write(data[:left])
            left -= len(data)
        f.flush()
        os.fsync(f.fileno())
    dt = time.perf_counter() - t
    os.remove(path)
    return nbytes / dt / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2")
    p.add_argument("--dir", required=True)
    p.add_argument("--zero-stage", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    mesh = Mesh.build(ParallelDims.from_world(dist.get_world_size()))
    rng = ParallelRNG(1, 0, 0)
    model = build_pipeline_chunks(load_config(args.model), TPContext(mesh.tp, rng=rng), 0, 1, 1, seed=1)
    opt = ZeroOptimizer(model, mesh, ZeroConfig(stage=args.zero_stage), OptimizerConfig())
    names = core.param_names(model)
    root = os.path.join(args.dir, "bench")
    rows = []
    for r in range(args.repeats):
        shutil.rmtree(root, ignore_errors=True) if dist.get_rank() == 0 else None
        dist.barrier()
        row = {"repeat": r}
        t = time.perf_counter()
        core.start_save(opt, names, rng, root, 1, {"iteration": 1}).finish()
        row["sync_s"] = time.perf_counter() - t
        t = time.perf_counter()
        pending = core.start_save(opt, names, rng, root, 2, {"iteration": 2}, asynchronous=True)
        row["async_blocked_s"] = time.perf_counter() - t
        pending.finish()
        row["async_total_s"] = time.perf_counter() - t
        t = time.perf_counter()
        assert core.verify(store.final_path(root, 2)) is None
        core.load(opt, names, rng, store.final_path(root, 2))
        row["load_s"] = time.perf_counter() - t
        nbytes = sum(os.path.getsize(os.path.join(store.final_path(root, 2), n))
                     for n in os.listdir(store.final_path(root, 2)))
        row.update(bytes=nbytes, save_gbps=nbytes / row["sync_s"] / 1e9, load_gbps=nbytes / row["load_s"] / 1e9)
        if dist.get_rank() == 0:
            row["disk_write_gbps"] = disk_write_gbps(args.dir, nbytes)
            print(json.dumps(row), flush=True)
        rows.append(row)
    if dist.get_rank() == 0:
        med = {k: statistics.median(x[k] for x in rows) for k in rows[0] if k != "repeat"}
        print("median " + json.dumps({k: round(v, 4) for k, v in med.items()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
