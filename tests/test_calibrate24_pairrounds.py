"""The pair probe's gloo CPU on a CPU (round 24, issue 26's main job): `collective_cpu_s` (a TP all-reduce's CPU) and
`p2p_cpu_s` (a pipeline message's) were one reading each at one moment of the calibration -- round 22-23's nine
quiet profiles read 250-401 us and 553-1060 us, and between two of them those two fields alone moved the main job's
plan +3.7 %. Now calibrate also takes them in rounds between its other probes (PairRounds, beside LatencyRounds)
and fits, per rank, the median of the probe's reading and the rounds' (docs/results/bench_planner_mainjob.md,
"Twenty-fourth round")."""

from __future__ import annotations

from unittest import mock

import pytest

from hybrid.planner import calibrate as cal


def rank(layer: float, message: float, rounds: list[tuple[float, float]]) -> dict:
    """One rank's pair probe output: the layer's per-call CPU, three message sizes 1 ns a byte apart, rounds."""
    sizes = [(8, message), (2**16, message), (2**20, message + 2**20 * 1e-9)]
    return {"tp_layer": [(49152, layer)], "send_recv": sizes, "rounds": rounds}


def test_the_fields_are_the_median_over_the_rounds_and_the_probes_reading_not_one_reading():
    """Each rank's probe met a stall (its one reading 3x the rounds') while its rounds read 300-340 / 800-860 us:
    the fit gets the rounds' level, moved one place by the stalled reading; one round's own stall (2 ms) moves it
    one place, not by its excess. The probe's readings alone (before round 24, `rounds=False`) give the stall."""
    rounds = [(3.0e-4, 8.0e-4), (3.2e-4, 8.2e-4), (2e-3, 8.4e-4), (3.4e-4, 8.6e-4), (3.1e-4, 8.1e-4)]
    rows = [rank(9e-4, 2.4e-3, rounds) for _ in range(3)] + [None]  # None: the odd rank out
    fit = cal.fit_comm_cpu(rows)
    per_byte = fit["comm_cpu_s_per_byte"]
    assert per_byte == pytest.approx(1e-9 * 2**20 / (2**20 - 8))  # the probe's sizes: one moment, unchanged
    assert fit["collective_cpu_s"] == pytest.approx(3.3e-4 - 49152 * per_byte)  # median of 9e-4 and the 5 rounds
    assert fit["p2p_cpu_s"] == pytest.approx(8.3e-4)
    one = cal.fit_comm_cpu(rows, rounds=False)
    assert one["collective_cpu_s"] == pytest.approx(9e-4 - 49152 * per_byte) and one["p2p_cpu_s"] == 2.4e-3


def test_the_median_is_per_rank_first_then_over_the_ranks():
    """Rank a read low rounds, rank b high ones, rank c in between: per rank its median, then the median rank's
    (as the pair probe's readings always were); a profile from before round 24 (no rounds) fits as it did."""
    rows = [rank(4e-4, 8e-4, [(1e-4, 5e-4)] * 4), rank(4e-4, 8e-4, [(9e-4, 1.2e-3)] * 4),
            rank(4e-4, 8e-4, [(5e-4, 9e-4)] * 4)]
    fit = cal.fit_comm_cpu(rows)
    assert fit["collective_cpu_s"] == pytest.approx(5e-4 - 49152 * fit["comm_cpu_s_per_byte"])
    assert fit["p2p_cpu_s"] == pytest.approx(9e-4)
    old = [{k: v for k, v in r.items() if k != "rounds"} for r in rows]
    assert cal.fit_comm_cpu(old) == cal.fit_comm_cpu(rows, rounds=False)


def test_a_round_is_the_pair_probes_layer_and_its_smallest_message_on_a_cpus_pairs_only():
    """A round times the probe's own two costs (Pair.layer_call: the TP probe layer's all-reduce; message_call of
    the smallest size, CPU_COMM_SIZES[0]); nothing on the odd rank out (no pair), one rank or a GPU (on=False)."""
    pair = mock.Mock(spec=cal.Pair)
    pair.layer_call.return_value = (49152, 3e-4)
    pair.message_call.return_value = 8e-4
    rounds = cal.PairRounds(pair, on=True, every=1)  # a round at every point (the default: test_calib25_rounds)
    for _ in range(3):
        rounds.take()
    assert rounds.readings == [(3e-4, 8e-4)] * 3
    pair.message_call.assert_called_with(cal.CPU_COMM_SIZES[0])
    for quiet in (cal.PairRounds(None, on=True), cal.PairRounds(pair, on=False)):
        quiet.take()
        assert quiet.readings == []
    assert pair.layer_call.call_count == 3
