"""Round 21's new-user pass over docs/diloco.md: resuming the page's tp 2 x dp 2 run (two replicas) at tp 1 on the
same 4 ranks with `--diloco-replicas 2` printed "diloco: 2 replicas (ZeRO over 2 ranks each)" at --zero-stage 0,
the default: a replica of two DP ranks then holds its states whole on each (plain DP inside it), not sharded. The
line now names the stage, or plain DP at stage 0. In-process: hybrid.diloco.run.startup_line of a RunConfig
stand-in with the sizes the line reads (round 23: the line reads the run's config, no longer the built mesh).
"""

from __future__ import annotations

from types import SimpleNamespace

from hybrid.diloco.args import DiLoCoConfig
from hybrid.diloco.run import startup_line


def _line(inner_dp: int, zero_stage: int) -> str:
    """Two replicas of `inner_dp` DP ranks each (a RunConfig stand-in with the fields the line reads)."""
    return startup_line(SimpleNamespace(diloco=DiLoCoConfig(inner_steps=8, replicas=2),
                                        parallel=SimpleNamespace(dims=SimpleNamespace(dp=2 * inner_dp)),
                                        zero=SimpleNamespace(stage=zero_stage),
                                        compress=SimpleNamespace(simulated_dp_bandwidth=0.0)))


def test_a_replica_of_several_dp_ranks_names_its_zero_stage():
    assert _line(2, 0) == "diloco: 2 replicas (plain DP over 2 ranks each) | H 8 inner steps | outer Nesterov SGD " \
                          "lr 0.7 momentum 0.9"
    assert _line(2, 1).startswith("diloco: 2 replicas (ZeRO 1 over 2 ranks each) | H 8")
    assert _line(1, 3).startswith("diloco: 2 replicas | H 8")  # one rank a replica: nothing inside to say
