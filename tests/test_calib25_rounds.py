"""calibrate's pair rounds at every other latency point (round 25, issue 26): a pair round (the TP probe layer's six
passes and twelve message round trips) was a third of README's 4-rank calibration's CPU at every point; the median
over five rounds and the probe's reading moved round 24's quiet plans by -1.8..+2.5 % against ten's
(docs/results/bench_planner_mainjob.md, "Twenty-fifth round")."""

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
