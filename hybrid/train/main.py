"""Entry point: `torchrun --nproc-per-node N -m hybrid.train ...` (or `scripts/train.py`, the same code), or
`python -m hybrid.train ...` for one process without torchrun.

    torchrun --nproc-per-node 8 -m hybrid.train --tensor-model-parallel-size 2 \
        --pipeline-model-parallel-size 2 --micro-batch-size 2 --global-batch-size 16 --seq-length 128

Every input is checked before any process group starts; a bad one exits with one line naming it, printed by rank
0 only and recorded in torch elastic's error file, so torchrun's failure summary shows it as the root cause. A rank
that dies or stalls ends the job after `--distributed-timeout-minutes` with one line naming it (liveness.py).
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from hybrid.cliutil import fail, is_rank_zero, outlive_rank_zero
from hybrid.launch import (check_launch, check_launcher_env, env_world, init_distributed, start_device,  # noqa: F401
                           under_launcher)
from hybrid.train import liveness
from hybrid.train.args import (apply_auto_parallel, check_args, check_corpus, check_host, check_numbers,
                               parse_args)
from hybrid.train.loop import run


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
        check_launch(world)
    except ValueError as e:
        raise fail(f"train.py: error: {e}") from None
    if args.ds_unsupported and is_rank_zero():
        print(f"train.py: warning: --deepspeed-config keys not supported, ignored: {', '.join(args.ds_unsupported)}",
              file=sys.stderr, flush=True)
    return args, world, (cfg, dims, batch, plan), corpus


def main(argv: list[str] | None = None) -> None:
    try:
        args, world, (cfg, dims, batch, plan), corpus = validate(argv)
    except SystemExit as e:
        if e.code not in (0, None) and not is_rank_zero() and under_launcher():
            outlive_rank_zero(e)  # so rank 0's one line is printed before torchrun stops the job
        raise
    args.distributed_timeout = timedelta(minutes=args.distributed_timeout_minutes)

    backend, device = start_device(world)
    init_distributed(world, device, backend, args.distributed_timeout)
    heartbeat = (liveness.Heartbeat(dist.get_rank(), world, args.distributed_timeout.total_seconds())
                 if world > 1 and under_launcher() else None)
    try:
        run(args, cfg, dims, batch, plan, corpus, device)
    except Exception as e:
        liveness.exit_if_ranks_lost(heartbeat, e)  # exits naming the lost rank; returns if all are alive
        raise
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        dist.destroy_process_group()


def cli() -> None:
    """The command-line entry (`python -m hybrid.train`, scripts/train.py): `main` under torch elastic's
    `record`, so an unexpected exception's traceback reaches torchrun's failure summary too."""
    record(main)()
