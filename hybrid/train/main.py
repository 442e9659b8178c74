"""Entry point: `torchrun --nproc-per-node N -m hybrid.train ...` (or `scripts/train.py`, the same code), or
`python -m hybrid.train ...` for one process without torchrun.

    torchrun --nproc-per-node 8 -m hybrid.train --tensor-model-parallel-size 2 \
        --pipeline-model-parallel-size 2 --micro-batch-size 2 --global-batch-size 16 --seq-length 128

Every input is checked before any process group starts; a bad one exits with one line naming it, printed by rank
0 only and recorded in torch elastic's error file, so torchrun's failure summary shows it as the root cause. A rank
that dies or stalls ends the job after `--distributed-timeout-minutes` with one line naming it (liveness.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from hybrid.cliutil import fail, is_rank_zero, outlive_rank_zero
from hybrid.fault.attempt import attempt_store
from hybrid.mesh import default_backend
from hybrid.train import liveness
from hybrid.train.args import (apply_auto_parallel, check_args, check_corpus, check_host, check_numbers,
                               parse_args)
from hybrid.train.loop import run
from hybrid.zero.ds_config import name_keys


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


def validate(argv: list[str] | None):
    """Parse and check everything the run touches; SystemExit with one line on the first bad input.
    Returns (args, world, (cfg, dims, batch, plan), corpus)."""
    args = parse_args(argv)
    try:
        world = env_world()
        check_numbers(args)
        if args.auto_parallel:
            if under_launcher():
                check_launcher_env(world)  # the planner reads LOCAL_WORLD_SIZE
            apply_auto_parallel(args, world)
        cfg, dims, batch, plan = check_args(args, world)
        check_host(args, cfg, batch, world)
        corpus = check_corpus(args, cfg, batch)  # the DataSource of --data-path (hybrid/data)
        if world > 1 and not under_launcher():
            raise ValueError(f"WORLD_SIZE is {world} but RANK is not set; launch {world} processes with "
                             f"torchrun --nproc-per-node {world}")
        if under_launcher():
            check_launcher_env(world)
    except ValueError as e:  # a value the DeepSpeed config set is named by its JSON key (ds_config.name_keys)
        raise fail(f"train.py: error: {name_keys(str(e), getattr(args, 'ds_origins', {}))}") from None
    if args.ds_unsupported and is_rank_zero():
        print(f"train.py: warning: --deepspeed-config keys not supported, ignored: {', '.join(args.ds_unsupported)}",
              file=sys.stderr, flush=True)
    return args, world, (cfg, dims, batch, plan), corpus


def init_distributed(args: argparse.Namespace, world: int, device: torch.device, backend: str) -> None:
    """The process group, with `--distributed-timeout-minutes` on start-up and every collective. Without a
    launcher: a one-rank group on an in-process store (no MASTER_ADDR/PORT needed). Under torchrun's shared agent
    store, the group's keys live under an id the ranks agree on for this attempt (hybrid/fault/attempt.py)."""
    timeout = timedelta(minutes=args.distributed_timeout_minutes)
    device_id = device if device.type == "cuda" else None
    if under_launcher():
        store = attempt_store(timeout)
        given = {} if store is None else dict(store=store, rank=int(os.environ["RANK"]), world_size=world)
        dist.init_process_group(backend, timeout=timeout, device_id=device_id, **given)  # else env://
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout,
                                device_id=device_id)


def main(argv: list[str] | None = None) -> None:
    try:
        args, world, (cfg, dims, batch, plan), corpus = validate(argv)
    except SystemExit as e:
        if e.code not in (0, None) and not is_rank_zero() and under_launcher():
            outlive_rank_zero(e)  # so rank 0's one line is printed before torchrun stops the job
        raise
    args.distributed_timeout = timedelta(minutes=args.distributed_timeout_minutes)

    backend, device = default_backend()
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    else:
        torch.cuda.set_device(device)
    init_distributed(args, world, device, backend)
    heartbeat = (liveness.Heartbeat(dist.get_rank(), world, args.distributed_timeout.total_seconds())
                 if world > 1 and under_launcher() else None)
    try:
        run(args, cfg, dims, batch, plan, corpus, device)
    except (Exception, SystemExit) as e:
        liveness.end_after_failure(heartbeat, e)  # under a launcher: exits, naming the rank that failed first
        raise
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        dist.destroy_process_group()


def cli() -> None:
    """The command-line entry (`python -m hybrid.train`, scripts/train.py): `main` under torch elastic's
    `record`, so an unexpected exception's traceback reaches torchrun's failure summary too."""
    record(main)()
