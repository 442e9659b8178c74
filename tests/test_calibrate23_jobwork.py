"""The probes time what the main job's step does (round 23, issue 26; docs/results/bench_planner_mainjob.md,
"Twenty-third round"): the layer's forwards record the autograd graph and keep it while more forwards run, their
backwards later, as training does (until round 23 the forward ran under no_grad and the graph's cost landed in the
backward, timed right after its own forward), and the optimizer probe runs on every rank at once, the
profile fitting the median rank's reading (until round 23 rank 0 alone beside idle ranks)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from hybrid.planner import calibrate as cal
from models.gpt2 import GPT2Block


def test_the_probe_layer_keeps_its_forwards_graphs_and_runs_their_backwards_later():
    """layer_seconds runs each forward with the autograd graph recorded, IN_FLIGHT of them before their backwards
    (oldest first), as training does: no time asked for, the warm-up round and one timed round. Until round 23 it
    timed the forward under no_grad and then forward + backward back to back."""
    events = []
    forward0 = GPT2Block.forward

    def forward(self, x, *a, **kw):
        y = forward0(self, x, *a, **kw)
        k = sum(e[0] == "f" for e in events)
        events.append(("f", torch.is_grad_enabled() and y.requires_grad))
        y.register_hook(lambda g: events.append(("b", k)))
        return y
    with mock.patch.object(GPT2Block, "forward", forward):
        fwd, bwd = cal.layer_seconds(cal.PASS_SHAPE, 0.0, torch.device("cpu"))
    n = cal.IN_FLIGHT
    assert n >= 2 and fwd > 0 and bwd > 0
    one_round = [("f", True)] * n + [("b", k) for k in range(n)]
    assert events == one_round + [("f", True)] * n + [("b", k) for k in range(n, 2 * n)]


def test_the_optimizer_fit_gets_the_median_ranks_steps():
    """Rank 0 read the optimizer fast (as alone), the others slower: the fit's points are the median rank's CPU
    seconds per stage size, the sizes' tensors and parameters kept; ranks that did not run it (None) left out."""
    fast = {"optimizer_step": [(20, 2900, 0.39e-3), (68, 5400, 0.83e-3)]}
    slow = [{"optimizer_step": [(20, 2900, 0.80e-3 + k * 1e-5), (68, 5400, 1.45e-3 + k * 1e-5)]} for k in range(4)]
    assert cal.optimizer_readings([fast, *slow]) == [(20, 2900, pytest.approx(0.81e-3)),
                                                     (68, 5400, pytest.approx(1.46e-3))]
    assert cal.optimizer_readings([fast, {"optimizer_step": None}]) == fast["optimizer_step"]
    record = cal._glue_record([fast, *slow])
    assert record["optimizer_step_cpu_seconds_per_rank"][0] == [0.39e-3, 0.83e-3]
    assert len(record["optimizer_step_cpu_seconds_per_rank"]) == 5
