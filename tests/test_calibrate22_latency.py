"""`intra_latency_s` on a CPU (round 22, issue 26's main job): with 8 gloo ranks on 2 cores the smallest all-reduce
reads the OS scheduler of the moment, so calibrate takes it in short rounds between its other probes and keeps the
median over the rounds and the collectives' own reading -- one reading moved the main job's planned step 0.229 ->
0.278 s between two quiet calibrations (docs/results/bench_planner_mainjob.md, rounds 21-22)."""

from __future__ import annotations

from unittest import mock

import torch

from hybrid.planner import calibrate as cal
from hybrid.planner.hardware import hardware


def test_the_latency_is_the_median_over_the_rounds_not_one_reading():
    """A calibration whose collectives met a quiet moment (2 ms) while its rounds read 3.4-3.8 ms gets the
    rounds' level; a round that met a stall (40 ms) or the quiet one moves it by one rank of the order, not its
    excess. One reading alone (before round 22) would give 2 ms; the mean of the readings 6.6 ms."""
    rounds = [3.6e-3, 3.4e-3, 40e-3, 3.8e-3, 3.5e-3, 3.7e-3, 1.5e-3, 3.6e-3, 3.5e-3, 3.7e-3]
    assert cal.latency_of(2e-3, rounds) == 3.6e-3
    assert cal.latency_of(2e-3, []) == 2e-3  # no rounds (a GPU): the collectives' reading
    reduces = [{"bytes": 8, "seconds": 2e-3, "busbw_gbps": 0.0}, {"bytes": 2**20, "seconds": 0.02, "busbw_gbps": 0.4}]
    node = cal.node_fields(reduces, 8, hardware("cpu"), rounds)
    assert node == {"gpus_per_node": 8, "intra_node_gbps": 0.4, "intra_latency_s": 3.6e-3}
    assert cal.node_fields(reduces, 8, hardware("cpu"))["intra_latency_s"] == 2e-3


def test_a_round_is_a_few_short_blocks_after_a_short_warm_up_on_a_cpu_only():
    """Each round: LATENCY_ROUND_BLOCKS blocks of LATENCY_ROUND_CALLS calls of the smallest all-reduce after
    LATENCY_ROUND_WARMUP untimed ones -- short, so 10 rounds cost ~2 s of a ~50 s quiet calibration; nothing on one rank
    or on a GPU (NCCL's latency holds still: its one reading stays)."""
    with mock.patch.object(cal, "_collective_seconds", return_value=(3e-3, [3e-3] * 3)) as timed:
        rounds = cal.LatencyRounds(8, 8, torch.device("cpu"))
        for _ in range(4):
            rounds.take()
        assert rounds.seconds == [3e-3] * 4
        assert timed.call_args.args == ("all_reduce", 8, 8, torch.device("cpu"))
        assert timed.call_args.kwargs == {"blocks": cal.LATENCY_ROUND_BLOCKS, "calls": cal.LATENCY_ROUND_CALLS,
                                          "warmup": cal.LATENCY_ROUND_WARMUP}
        assert (cal.LATENCY_ROUND_BLOCKS, cal.LATENCY_ROUND_CALLS, cal.LATENCY_ROUND_WARMUP) == (2, 20, 10)
        for world, device in ((1, "cpu"), (8, "cuda")):
            quiet = cal.LatencyRounds(8, world, torch.device(device))
            quiet.take()
            assert quiet.seconds == []
        assert timed.call_count == 4
