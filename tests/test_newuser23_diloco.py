"""Round 23's new-user pass over docs/diloco.md: "DiLoCo with ZeRO-3". With the default replicas (R = dp, each DP
rank its own replica) `--diloco-inner-steps 8 --zero-stage 3` on 2 or 4 ranks ran with "zero: stage 3" on its
start-up line and nothing sharded -- ZeRO shards inside a replica, and a replica was one rank. One start-up
warning now says so and names the --diloco-replicas that give a replica several ranks. In-process: train.py's checks.
"""

from __future__ import annotations

import pytest

from hybrid.train.main import validate

pytestmark = pytest.mark.usefixtures("one_process")  # tests/conftest.py: python, not torchrun: world 1
RUN = ["--micro-batch-size", "2", "--global-batch-size", "8", "--seq-length", "64", "--train-iters", "16",
       "--diloco-inner-steps", "8"]


def _warnings(monkeypatch, world: int, flags: list[str]) -> tuple[str, ...]:
    """The run's start-up warnings as rank 0 of `world` under torchrun sees them."""
    for name, value in (("WORLD_SIZE", str(world)), ("RANK", "0"), ("LOCAL_RANK", "0"),
                        ("LOCAL_WORLD_SIZE", str(world)), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)
    return validate(RUN + flags)[0].warnings


def test_zero_inside_one_rank_replicas_is_said_to_shard_nothing(monkeypatch):
    got = [w for w in _warnings(monkeypatch, 4, ["--zero-stage", "3"]) if w.startswith("--zero-stage")]
    assert got == ["--zero-stage 3 with --diloco-inner-steps: ZeRO shards inside each replica, and each of the 4 "
                   "replicas is one rank (data-parallel size 4 / 4 replicas), so nothing is sharded; give "
                   "--diloco-replicas 2 for several ranks a replica, or drop --zero-stage"], got


@pytest.mark.parametrize("world, flags", [
    (4, ["--zero-stage", "3", "--diloco-replicas", "2"]),  # 2 ranks a replica: sharded
    (4, ["--zero-stage", "2", "--context-parallel-size", "2"]),  # a replica's CP ranks: sharded over them
    (4, []),  # ZeRO 0: nothing to say
])
def test_zero_that_shards_inside_a_replica_is_not_warned(monkeypatch, world, flags):
    assert not [w for w in _warnings(monkeypatch, world, flags) if w.startswith("--zero-stage")]
