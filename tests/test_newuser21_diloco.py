"""Round 21's new-user pass over docs/diloco.md: resuming the page's tp 2 x dp 2 run (two replicas) at tp 1 on the
same 4 ranks with `--diloco-replicas 2` printed "diloco: 2 replicas (ZeRO over 2 ranks each)" at --zero-stage 0,
the default: a replica of two DP ranks then holds its states whole on each (plain DP inside it), not sharded. The
line now names the stage, or plain DP at stage 0. In-process: the start-up line of hybrid.diloco.run.LocalUpdates
(its mesh and replica layout stand-ins with the two sizes the line reads).
"""

from __future__ import annotations

from types import SimpleNamespace

from hybrid.diloco.args import DiLoCoConfig
from hybrid.diloco.run import LocalUpdates


def _line(inner_dp: int, zero_stage: int) -> str:
    local = LocalUpdates(DiLoCoConfig(inner_steps=8), SimpleNamespace(dp=SimpleNamespace(size=inner_dp)),
                         SimpleNamespace(replicas=2))
    return local.describe(zero_stage)


def test_a_replica_of_several_dp_ranks_names_its_zero_stage():
    assert _line(2, 0) == "diloco: 2 replicas (plain DP over 2 ranks each) | H 8 inner steps | outer Nesterov SGD " \
                          "lr 0.7 momentum 0.9"
    assert _line(2, 1).startswith("diloco: 2 replicas (ZeRO 1 over 2 ranks each) | H 8")
    assert _line(1, 3).startswith("diloco: 2 replicas | H 8")  # one rank a replica: nothing inside to say
