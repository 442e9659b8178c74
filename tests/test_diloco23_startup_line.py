"""Round 23: DiLoCo's `diloco:` start-up line at 2 DP ranks a replica, from train.py's flags, in one process.

Round 22's mutation pass left the loop's `local.describe(0)` alive (docs/architecture.md's mutation22 tally): the
line took the ZeRO stage as an argument apart from the run, and only a 4-rank launch with replicas of 2 DP ranks
prints it, which no test read. The line is now hybrid.diloco.run.startup_line(run) of the checked RunConfig -- the
call the loop makes, with nothing passed apart -- so the flags' RunConfig at world 4 and 8 gives the line the run
prints, no process group. Each replica's rank count is checked against the groups ReplicaLayout builds
(replicas.inner_cross_ranks: the rank arithmetic, an independent reading of the same flags)."""

from __future__ import annotations

import pytest

from hybrid.diloco.replicas import inner_cross_ranks
from hybrid.diloco.run import startup_line
from hybrid.train.args import parse_args, run_config

TAIL = "| H 8 inner steps | outer Nesterov SGD lr 0.7 momentum 0.9"


def _run(argv: list[str], world: int):
    return run_config(parse_args(["--seq-length", "32", "--train-iters", "16", "--diloco-inner-steps", "8", *argv]),
                      world)


@pytest.mark.parametrize("argv, world, inside", [
    (["--diloco-replicas", "2"], 4, " (plain DP over 2 ranks each) "),  # the default stage 0: states whole
    (["--diloco-replicas", "2", "--zero-stage", "1"], 4, " (ZeRO 1 over 2 ranks each) "),
    (["--diloco-replicas", "2", "--zero-stage", "3"], 4, " (ZeRO 3 over 2 ranks each) "),
    (["--diloco-replicas", "2", "--zero-stage", "2", "--tensor-model-parallel-size", "2"], 8,
     " (ZeRO 2 over 2 ranks each) "),  # tp 2 x dp 4
    (["--diloco-replicas", "4", "--zero-stage", "1"], 8, " (ZeRO 1 over 2 ranks each) "),
    (["--zero-stage", "1"], 4, " "),  # replicas = dp: one rank a replica, nothing inside to say
])
def test_the_line_names_each_replicas_dp_ranks_and_zero_stage(argv, world, inside):
    run = _run(argv, world)
    dims, replicas = run.parallel.dims, run.diloco.replicas or run.parallel.dims.dp
    inner, _ = inner_cross_ranks(dims, replicas)
    assert {len(g) for g in inner} == {dims.dp // replicas}  # the replica's DP group the run builds
    expect = f"diloco: {replicas} replicas{inside}{TAIL}"
    assert startup_line(run) == expect
    if inside.strip():
        assert f" over {len(inner[0])} ranks each" in expect


def test_without_diloco_there_is_no_line():
    assert startup_line(run_config(parse_args(["--seq-length", "32", "--train-iters", "16"]), 4)) == ""
