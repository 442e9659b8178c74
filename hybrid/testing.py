"""Run a function on N ranks in fresh processes: the multi-rank test harness (CPU + gloo by default).

    results = run_distributed(fn, world_size=4, args=(cfg,), timeout=120)

`fn(rank, world_size, *args)` runs in each spawned process after `init_process_group` on a free
local port, with one intra-op thread per rank (so 8 ranks share 2 cores without oversubscription).
Its return values come back as a list indexed by rank. A rank that raises fails the whole call with
that rank's traceback in the message; a hang fails after `timeout` seconds and every rank is killed.
`fn` must be importable by name (a module-level function).

Ranks start from a forkserver that has imported torch, hybrid and models once (PRELOAD): each rank is a fork of
that clean process -- no test state, no process group, no thread pool started -- so it skips the ~3 s of CPU each
import costs under spawn (8 ranks on 2 cores: ~12 s of wall time a launch). Each rank then takes the caller's
current environment (the forkserver's is the one of its first use), working directory and sys.path, as under
spawn. `start_method="spawn"` gives fully fresh interpreters.
"""

from __future__ import annotations

import os
import pickle
import queue as queue_module
import socket
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


# imported once by the forkserver, inherited by every rank it forks; importing them starts no thread pool
PRELOAD = ["torch", "torch.distributed", "hybrid.testing", "hybrid.mesh", "hybrid.comm", "hybrid.tp", "hybrid.data",
           "hybrid.train_step", "hybrid.zero", "hybrid.pipeline.executor", "hybrid.checkpoint.core", "models"]


class DistributedFailure(RuntimeError):
    """One or more ranks raised or timed out."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(fn: Callable, rank: int, world: int, port: int, backend: str, args: tuple, queue,
            environ: dict[str, str]) -> None:
    os.environ.clear()  # the caller's environment at the call, not the forkserver's
    os.environ.update(environ)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        dist.init_process_group(backend, rank=rank, world_size=world)
        # plain pickle: tensors travel as bytes, not as shared memory that dies with this process
        queue.put((rank, True, pickle.dumps(fn(rank, world, *args))))
    except BaseException:  # report every failure, including assertion errors in the test body
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn: Callable, world_size: int, args: tuple = (), timeout: float = 180.0,
                    backend: str = "gloo", start_method: str = "forkserver") -> list[Any]:
    """Run `fn(rank, world_size, *args)` on `world_size` new ranks; return per-rank results."""
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)  # read when the forkserver starts: at the first call
    queue = ctx.Queue()
    port = free_port()
    environ = dict(os.environ)
    procs = [ctx.Process(target=_worker, args=(fn, r, world_size, port, backend, args, queue, environ), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    try:
        deadline = time.monotonic() + timeout  # for the whole job, process start-up included
        for _ in range(world_size):
            try:
                rank, ok, value = queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue_module.Empty:  # someone hangs
                break
            if ok:
                results[rank] = pickle.loads(value)
            else:
                errors[rank] = value
            if errors:  # one failure usually leaves the others blocked in a collective
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not errors and len(results) == world_size else 0.1)
            if p.is_alive():
                p.kill()
    if errors:
        first = min(errors)
        raise DistributedFailure(f"rank {first} of {world_size} failed:\n{errors[first]}")
    if len(results) < world_size:
        missing = sorted(set(range(world_size)) - set(results))
        raise DistributedFailure(f"ranks {missing} of {world_size} did not finish within {timeout:.0f}s")
    return [results[r] for r in range(world_size)]
