"""Entry point: `torchrun --nproc-per-node N -m hybrid.train ...` (or `scripts/train.py`, the same code), or
`python -m hybrid.train ...` for one process without torchrun.

    torchrun --nproc-per-node 8 -m hybrid.train --tensor-model-parallel-size 2 \
        --pipeline-model-parallel-size 2 --micro-batch-size 2 --global-batch-size 16 --seq-length 128

Every input is checked before any process group starts; a bad one exits with one line naming it, printed by rank
0 only and recorded in torch elastic's error file, so torchrun's failure summary shows it as the root cause. A rank
that dies or stalls ends the job after `--distributed-timeout-minutes` with one line naming it (hybrid/launch.py,
hybrid/liveness.py).
"""

from __future__ import annotations

import sys
from datetime import timedelta

from torch.distributed.elastic.multiprocessing.errors import record

from hybrid.cliutil import fail, is_rank_zero, outlive_rank_zero
from hybrid.launch import check_launch, check_launcher_env, distributed, env_world, under_launcher  # noqa: F401
from hybrid.train.args import configure, parse_args
from hybrid.train.loop import run as train
from hybrid.zero.ds_config import ignored_line


def validate(argv: list[str] | None):
    """Parse and check everything the run touches; SystemExit with one line on the first bad input.
    Returns (RunConfig, world, corpus): the flags end here."""
    args = parse_args(argv)
    try:
        world = env_world()
        if args.auto_parallel and under_launcher():
            check_launcher_env(world)  # the planner reads LOCAL_WORLD_SIZE
        run, corpus = configure(args, world)  # the DataSource of --data-path (hybrid/data)
        check_launch(world)
    except ValueError as e:  # configure names a value the DeepSpeed config set by its JSON key
        raise fail(f"train.py: error: {e}") from None
    if is_rank_zero():
        ignored = (ignored_line(run.ds_unsupported),)
        for line in args.repeated + run.warnings + (ignored if run.ds_unsupported else ()):
            print(f"train.py: warning: {line}", file=sys.stderr, flush=True)
    return run, world, corpus


def main(argv: list[str] | None = None) -> None:
    try:
        run, world, corpus = validate(argv)
    except SystemExit as e:
        if e.code not in (0, None) and not is_rank_zero() and under_launcher():
            outlive_rank_zero(e)  # so rank 0's one line is printed before torchrun stops the job
        raise
    with distributed(world, timedelta(minutes=run.parallel.timeout_minutes)) as device:
        train(run, corpus, device)


def cli() -> None:
    """The command-line entry (`python -m hybrid.train`, scripts/train.py): `main` under torch elastic's
    `record`, so an unexpected exception's traceback reaches torchrun's failure summary too."""
    record(main)()
