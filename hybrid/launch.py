"""Starting a job's processes, shared by training (hybrid/train/main.py) and generation (hybrid/generate/): the
launcher's environment checked before any process group, the device and its threads, and the process group with
`--distributed-timeout-minutes` on start-up and on every collective.

    world = env_world()                       # WORLD_SIZE (1 without torchrun)
    check_launch(world)                       # RANK / MASTER_ADDR / MASTER_PORT / LOCAL_WORLD_SIZE, or one process
    with distributed(world, timedelta(minutes=...)) as device:   # the device, the process group, the heartbeat
        ...                                   # the job (training, generation)

A rank that dies or stalls ends the job within the timeout with one line naming it (hybrid/liveness.py).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from datetime import timedelta
from typing import Iterator

import torch
import torch.distributed as dist

from hybrid import liveness
from hybrid.fault.attempt import attempt_store
from hybrid.mesh import default_backend

MAX_TIMEOUT_MINUTES = 7 * 24 * 60  # `--distributed-timeout-minutes` at most a week
DEFAULT_TIMEOUT_MINUTES = 10.0


def under_launcher() -> bool:
    """torchrun (or any env:// launcher) sets RANK; without it this is one process."""
    return "RANK" in os.environ


def env_world() -> int:
    """WORLD_SIZE (torchrun sets it; 1 without a launcher)."""
    text = os.environ.get("WORLD_SIZE", "1")
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"the environment's WORLD_SIZE {text!r} is not a positive integer; launch with "
                         f"torchrun --nproc-per-node N")
    return int(text)


def check_launcher_env(world: int) -> None:
    """With RANK set, init_process_group reads env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): a missing or
    malformed one would be torch's traceback, and a RANK outside the world a rendezvous that never completes."""
    rank = os.environ["RANK"]
    if not rank.isdigit() or int(rank) >= world:
        raise ValueError(f"the environment's RANK {rank!r} is not an integer in [0, WORLD_SIZE {world}); launch "
                         f"with torchrun --nproc-per-node N")
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(var, "").strip():
            raise ValueError(f"RANK is set but {var} is not (torchrun sets both); launch with torchrun, or unset "
                             f"RANK for one process")
    port = os.environ["MASTER_PORT"]
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"the environment's MASTER_PORT {port!r} is not a port number in [1, 65535]")
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local is not None and (not local.isdigit() or not 1 <= int(local) <= world):
        raise ValueError(f"the environment's LOCAL_WORLD_SIZE {local!r} is not an integer in [1, WORLD_SIZE {world}]")
    local_rank, local_world = os.environ.get("LOCAL_RANK"), int(local) if local is not None else world
    if local_rank is not None and (not local_rank.isdigit() or int(local_rank) >= local_world):  # picks cuda:N
        raise ValueError(f"the environment's LOCAL_RANK {local_rank!r} is not an integer in [0, "
                         f"{'LOCAL_WORLD_SIZE' if local is not None else 'WORLD_SIZE'} {local_world}); launch with "
                         f"torchrun --nproc-per-node N")


def check_launch(world: int) -> None:
    """The launch as a whole: several processes need torchrun's RANK; under torchrun its environment is sound."""
    if world > 1 and not under_launcher():
        raise ValueError(f"WORLD_SIZE is {world} but RANK is not set; launch {world} processes with "
                         f"torchrun --nproc-per-node {world}")
    if under_launcher():
        check_launcher_env(world)
    default_backend()  # HYBRID_BACKEND / HYBRID_DEVICE: a typo is one line here, not a traceback at start-up


def start_device(world: int) -> tuple[str, torch.device]:
    """(backend, device): NCCL + this rank's GPU (made current), or gloo + CPU with this rank's share of the cores
    (the local ranks split them: one thread pool per rank would oversubscribe the host)."""
    backend, device = default_backend()
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    else:
        torch.cuda.set_device(device)
    return backend, device


def init_distributed(world: int, device: torch.device, backend: str, timeout: timedelta) -> None:
    """The process group, with `timeout` on start-up and every collective. Without a launcher: a one-rank group
    on an in-process store (no MASTER_ADDR/PORT needed). Under torchrun's shared agent store, the group's keys
    live under an id the ranks agree on for this attempt (hybrid/fault/attempt.py)."""
    device_id = device if device.type == "cuda" else None
    if under_launcher():
        try:
            store = attempt_store(timeout)
            given = {} if store is None else dict(store=store, rank=int(os.environ["RANK"]), world_size=world)
            dist.init_process_group(backend, timeout=timeout, device_id=device_id, **given)  # else env://
        except dist.DistStoreError as e:  # the other ranks never came: torch's traceback would not say which fix
            raise SystemExit(rendezvous_failed(world, timeout, e)) from None
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout,
                                device_id=device_id)


def rendezvous_failed(world: int, timeout: timedelta, e: Exception) -> str:
    """One line for a start-up whose ranks never all joined (torch's DistStoreError: "... 1/4 clients joined")."""
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    said = (str(e).strip().splitlines() or [""])[0][:160]
    return (f"error: rank {os.environ.get('RANK')}: the {world} ranks did not all join the rendezvous at {where} "
            f"within {timeout.total_seconds():g} s ({said}); start every rank (torchrun's --nnodes x "
            f"--nproc-per-node must be WORLD_SIZE {world}, with the same MASTER_ADDR and MASTER_PORT), or raise "
            f"--distributed-timeout-minutes")


@contextmanager
def distributed(world: int, timeout: timedelta) -> Iterator[torch.device]:
    """The job's process group around its body: the device (`start_device`), the group with `timeout` on start-up
    and every collective (`init_distributed`), under torchrun a heartbeat so that a rank lost or failed is named
    in one line (hybrid/liveness.py); the group destroyed at the end. Yields the device."""
    backend, device = start_device(world)
    init_distributed(world, device, backend, timeout)
    heartbeat = (liveness.Heartbeat(dist.get_rank(), world, timeout.total_seconds())
                 if world > 1 and under_launcher() else None)
    try:
        yield device
    except (Exception, SystemExit) as e:
        liveness.end_after_failure(heartbeat, e)  # under a launcher: exits, naming the rank that failed first
        raise
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        dist.destroy_process_group()
