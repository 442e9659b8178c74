"""Pipeline stage partitioning: uniform, balanced (exact minimax, checked against brute force), manual
(`--pipeline-layers-per-stage`), and the interleaved stage order (stage = chunk * pp + rank)."""

from __future__ import annotations

import itertools

import pytest

from hybrid.partition import (PartitionMethod, StageCosts, parse_layers_per_stage, partition_costs,
                              partition_layers, rank_chunks, stage_costs_from_config)
from models import load_config

BALANCED, MANUAL = PartitionMethod.BALANCED, PartitionMethod.MANUAL


def _counts(parts):
    return [len(p) for p in parts]


def test_uniform_splits_layers_evenly_and_in_order():
    parts = partition_layers(12, 4)
    assert parts == [(0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11)]
    assert partition_layers(5, 1) == [(0, 1, 2, 3, 4)]


def test_uniform_refuses_a_count_that_does_not_divide_and_names_the_fix():
    with pytest.raises(ValueError, match=r"the model's 10 layers .* --pipeline-partition balanced.*"
                                         r"--pipeline-layers-per-stage 2,2,3,3"):
        partition_layers(10, 2, v=2)
    with pytest.raises(ValueError, match="fewer than the 4 stages"):
        partition_layers(2, 4)


def test_interleaved_stages_are_chunk_major_and_ranks_hold_every_pp_th_stage():
    parts = partition_layers(8, pp=2, v=2)
    assert parts == [(0, 1), (2, 3), (4, 5), (6, 7)]  # stages 0..3 in model order
    assert rank_chunks(parts, pp=2, rank=0) == [(0, 1), (4, 5)]  # stages 0 and 2
    assert rank_chunks(parts, pp=2, rank=1) == [(2, 3), (6, 7)]  # stages 1 and 3


def test_balanced_equals_uniform_when_layers_alone_cost():
    assert partition_layers(12, 4, method=BALANCED) == partition_layers(12, 4)


def test_balanced_moves_layers_off_the_last_stage_when_the_head_is_expensive():
    parts = partition_layers(16, 4, method=BALANCED, head_cost=2.0)
    assert _counts(parts) == [4, 4, 5, 3]  # stage costs 4, 4, 5, 5
    assert max(partition_costs(parts, head_cost=2.0)) == 5
    assert _counts(partition_layers(4, 2, method=BALANCED, head_cost=10.0)) == [4, 0]  # head alone on the last


def test_balanced_moves_layers_off_the_first_stage_when_the_embedding_is_expensive():
    assert _counts(partition_layers(16, 4, method=BALANCED, embedding_cost=3.0)) == [1, 5, 5, 5]


def test_balanced_ties_put_fewer_layers_on_early_stages():
    assert _counts(partition_layers(10, 4, method=BALANCED)) == [2, 2, 3, 3]


@pytest.mark.parametrize("n,stages", [(5, 3), (7, 4), (6, 2), (3, 5)])
def test_balanced_is_the_exact_minimax_over_all_contiguous_splits(n, stages):
    layer_cost, emb, head = [1.0, 3.0, 2.0, 5.0, 1.0, 4.0, 2.0][:n], 0.5, 4.0
    parts = partition_layers(n, stages, method=BALANCED, layer_cost=layer_cost, embedding_cost=emb, head_cost=head)
    best = min(max(partition_costs(_split(counts), layer_cost, emb, head))
               for counts in _valid_counts(n, stages))
    assert max(partition_costs(parts, layer_cost, emb, head)) == best
    assert all(len(p) > 0 for p in parts[1:-1])


def _valid_counts(n, stages):
    for counts in itertools.product(range(n + 1), repeat=stages):
        if sum(counts) == n and all(c > 0 for c in counts[1:-1]):
            yield counts


def _split(counts):
    return partition_layers(sum(counts), len(counts), layers_per_stage=list(counts))


def test_balanced_refuses_more_middle_stages_than_layers():
    with pytest.raises(ValueError, match="use at most 5 stages"):
        partition_layers(3, 6, method=BALANCED)


def test_manual_split_follows_the_flag():
    parts = partition_layers(14, 2, v=2, layers_per_stage=parse_layers_per_stage("3,4,4,3"))
    assert parts == [(0, 1, 2), (3, 4, 5, 6), (7, 8, 9, 10), (11, 12, 13)]
    assert _counts(partition_layers(4, 3, layers_per_stage=[0, 4, 0])) == [0, 4, 0]  # first/last may be empty


@pytest.mark.parametrize("counts,message", [
    ([3, 4, 4], "gives 3 counts for 4 stages"),
    ([3, 4, 4, 4], "sums to 15, not the model's 14 layers"),
    ([3, -1, 8, 4], "integer >= 0"),
    ([7, 0, 4, 3], r"stages \[1\] hold no layers"),
])
def test_manual_split_errors_name_the_flag_and_the_fix(counts, message):
    with pytest.raises(ValueError, match=rf"--pipeline-layers-per-stage.*{message}"):
        partition_layers(14, 2, v=2, layers_per_stage=counts)


def test_flag_and_argument_errors():
    with pytest.raises(ValueError, match="--pipeline-layers-per-stage '3,x'"):
        parse_layers_per_stage("3,x")
    with pytest.raises(ValueError, match="--pipeline-partition balanced cannot apply"):
        partition_layers(8, 2, method=BALANCED, layers_per_stage=[4, 4])
    with pytest.raises(ValueError, match="--pipeline-partition must be a PartitionMethod"):
        partition_layers(8, 2, method="balanced")
    with pytest.raises(ValueError, match="--pipeline-model-parallel-size must be a positive integer"):
        partition_layers(8, 0)
    with pytest.raises(ValueError, match="layer_cost gives 3 per-layer costs for --num-layers 8"):
        partition_layers(8, 2, method=BALANCED, layer_cost=[1.0, 1.0, 1.0])


def test_stage_costs_from_config_is_narayanans_flops_count_for_gpt2():
    cfg = load_config("gpt2")
    b, s, h, vocab = 2, 1024, cfg.hidden_size, cfg.vocab_size
    costs = stage_costs_from_config(cfg, seq=s, micro_batch=b)
    assert costs == StageCosts(layer_cost=3 * (24 * b * s * h * h + 4 * b * s * s * h),
                               embedding_cost=3 * b * s * h, head_cost=3 * 2 * b * s * h * vocab)
    # GPT-2 small at s = 1024: the head is ~4.5 layers, so the last of 4 stages takes no layer
    assert _counts(partition_layers(12, 4, method=BALANCED, **costs.as_kwargs())) == [4, 4, 4, 0]


def test_stage_costs_from_config_counts_gqa_and_swiglu():
    cfg = load_config("llama-3-8b")
    b, s, h, f = 1, 4096, cfg.hidden_size, cfg.ffn_hidden_size
    kv = cfg.num_kv_heads * cfg.head_dim
    forward = 2 * b * s * (2 * h * h + 2 * h * kv) + 2 * b * s * 3 * h * f + 4 * b * s * s * h
    assert stage_costs_from_config(cfg, seq=s, micro_batch=b).layer_cost == 3 * forward
