"""calibrate's cost (round 25, issue 26; docs/results/bench_planner_mainjob.md, "Twenty-fifth round"): the pair
rounds at every other latency point -- a pair round (the TP probe layer's six passes and twelve message round trips)
at every point was a third of README's 4-rank calibration's CPU; the median over five rounds and the probe's reading
moved round 24's quiet plans by -1.8..+2.5 % against ten's -- and, on a CPU, the all-reduce without the all-gather."""

from unittest import mock

import hybrid.planner.calibrate as cal


def test_a_pair_round_is_taken_at_every_other_latency_point_from_the_first():
    """Ten points (calibrate's probes with bf16: the latency's ten rounds) give five pair rounds, at points 0, 2, 4,
    6 and 8 -- every rank counts the same points, so the pairs' rounds run at once; fails if every point takes one."""
    pair = mock.Mock(spec=cal.Pair)
    pair.layer_call.side_effect = [(49152, 1e-4 * (i + 1)) for i in range(10)]
    pair.message_call.return_value = 8e-4
    rounds = cal.PairRounds(pair, on=True)
    for _ in range(10):
        rounds.take()
    assert cal.PAIR_ROUND_EVERY == 2 and rounds.points == 10
    assert [c for c, _ in rounds.readings] == [1e-4 * (i + 1) for i in range(5)]  # one layer_call a round taken
    assert pair.layer_call.call_count == pair.message_call.call_count == 5
    off = cal.PairRounds(pair, on=False)
    off.take()
    assert off.readings == [] and pair.layer_call.call_count == 5


def test_a_cpu_times_the_all_reduce_alone_a_gpu_the_all_gather_beside_it():
    """No field reads the all-gather (intra_node_gbps and intra_latency_s are the all-reduce's), and on gloo it
    was about half of the collectives' time: timed on nccl only, as nccl-tests reports both."""
    assert cal.timed_collectives("gloo") == ("all_reduce",)
    assert cal.timed_collectives("nccl") == ("all_reduce", "all_gather")
