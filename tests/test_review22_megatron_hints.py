"""Round 22 review: Megatron's --use-cpu-initialization exists to make the initial weights the same at every
tensor-parallel size ("This eliminates init differences based on tensor parallelism", megatron/training/arguments.py).
hybrid already initialises that way (hybrid/tp/sharding.init_parameters: each shard is cut from its full tensor,
drawn from a per-parameter seed), so the hint says so instead of "there is no such switch"; the claim it now makes is
held here in-process: a column- and a row-split weight at tp 2 are the slices of the tp 1 weight, bit for bit."""

from __future__ import annotations

import torch
import torch.nn as nn

from hybrid.tp.sharding import REPLICATED, init_parameters, set_spec, split_spec
from hybrid.train.other_flags import hints

OUT, IN, SEED = 6, 4, 1234


def _linear(spec, rows: int, cols: int) -> nn.Module:
    layer = nn.Module()
    layer.weight = set_spec(nn.Parameter(torch.empty(rows, cols)), spec, lambda t, g: t.normal_(0, 0.02, generator=g))
    return layer


def test_the_cpu_initialization_hint_says_init_is_already_the_same_at_every_tp():
    hint = hints()["--use-cpu-initialization"]
    assert "the same initial weights at every --tensor-model-parallel-size" in hint, hint
    assert "init_parameters" in hint and hint.endswith("drop the flag"), hint


def test_a_split_weight_at_tp_2_is_the_slice_of_the_tp_1_weight():
    """What the hint claims: init_parameters draws the full tensor and keeps this rank's rows (dim 0, a column-
    parallel weight) or columns (dim 1, row-parallel)."""
    whole = _linear(REPLICATED, OUT, IN)
    init_parameters(whole, SEED, tp_rank=0)
    for dim, (rows, cols) in ((0, (OUT // 2, IN)), (1, (OUT, IN // 2))):
        full = OUT if dim == 0 else IN
        shards = [_linear(split_spec(full, 2, dim), rows, cols) for _ in range(2)]
        for rank, shard in enumerate(shards):
            init_parameters(shard, SEED, tp_rank=rank)
        assert torch.equal(torch.cat([s.weight for s in shards], dim=dim), whole.weight), dim
