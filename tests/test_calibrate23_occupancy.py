"""The probe layers on a CPU (round 23, issue 26's main job): every rank times them at once, each on its CPU clock,
and the profile fits the median rank's reading -- what a small layer's pass costs a core (mostly Python, the
dispatcher, autograd) depends on what else the cores run, and the main job runs 8 ranks on 2 cores throughout.
Until round 22 rank 0 timed them alone beside idle ranks: one process at one moment, the other core idle
(docs/results/bench_planner_mainjob.md, "Twenty-third round")."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from hybrid.planner import calibrate as cal


def test_each_rank_times_a_share_of_the_cores_so_the_wall_stays():
    """8 ranks on 2 cores: each times 2 / 8 of `seconds` on its CPU clock (the cores' wall ~ `seconds`, as rank 0
    alone took); a core each (ranks <= cores): every rank the whole `seconds`."""
    assert cal.occupied_seconds(0.5, 8, 2) == 0.125
    assert cal.occupied_seconds(0.5, 2, 2) == cal.occupied_seconds(0.5, 1, 2) == 0.5


def test_the_profile_fits_the_median_ranks_layers_not_rank_0s():
    """Rank 0 read the layers fast (as alone beside an idle core), the others slower: the fit gets the median
    rank's (forward, backward) per shape, element by element; where only rank 0 timed them (a GPU: the others
    None) its reading."""
    fast = {"layer_seconds": [(2.6e-3, 5.1e-3), (3.4e-3, 6.9e-3)], "layer_pass_seconds": (0.13e-3, 0.35e-3)}
    slow = [{"layer_seconds": [(2.7e-3 + k * 1e-5, 6.3e-3 + k * 1e-5), (3.6e-3, 8.1e-3 - k * 1e-5)],
             "layer_pass_seconds": (0.18e-3 + k * 1e-6, 0.55e-3)} for k in range(4)]
    read = cal.layer_readings([fast, *slow])
    assert read["layer_seconds"] == [pytest.approx([2.71e-3, 6.31e-3]), pytest.approx([3.6e-3, 8.08e-3])]
    assert read["layer_pass_seconds"] == pytest.approx([0.181e-3, 0.55e-3])
    gpu = cal.layer_readings([{"layer_seconds": [(1.0, 2.0)]}, {"layer_seconds": [None]}])
    assert gpu == {"layer_seconds": [[1.0, 2.0]]}
    assert cal.rank_median([None, None]) is None


def test_a_cpu_times_the_layers_on_every_rank_at_once_a_gpu_on_rank_0_alone():
    """`_layer_probe` on a CPU runs through `occupied` (every rank) with occupied_seconds' share of the CPU clock;
    on a GPU through `alone` with the whole `seconds`."""
    cfg = cal.CalibrationConfig(ranks=8, seconds=0.5)
    runs = []

    def route(name):
        return lambda fn: (runs.append(name), fn())[1]

    with mock.patch.object(cal, "layer_seconds", side_effect=lambda *a: a[1]) as timed, \
            mock.patch.object(cal.dist, "get_world_size", return_value=8), mock.patch.object(cal.os, "cpu_count",
                                                                                             return_value=2):
        got = cal._layer_probe(cal.PASS_SHAPE, cal.CPU_PROBE, cfg, torch.device("cpu"), cal.CPU_CLOCK,
                               route("alone"), route("occupied"))
        assert (runs, got) == (["occupied"], 0.125)
        got = cal._layer_probe(cal.GPU_PROBE.shapes[0], cal.GPU_PROBE, cfg, torch.device("cuda"), None,
                               route("alone"), route("occupied"))
        assert (runs, got) == (["occupied", "alone"], 0.5)
        assert timed.call_count == 2
