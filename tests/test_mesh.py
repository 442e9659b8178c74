"""The layout's rank arithmetic, checked with no processes: TP innermost, then DP, then PP."""

from __future__ import annotations

import itertools

import pytest

from hybrid.mesh import Axis, Coords, ParallelDims, validate_model_dims


def factorisations(world: int):
    for tp, pp in itertools.product(range(1, world + 1), repeat=2):
        if world % (tp * pp) == 0:
            yield tp, pp, world // (tp * pp)


LAYOUTS = [(w, *f) for w in (8, 16) for f in factorisations(w)]


@pytest.mark.parametrize("world,tp,pp,dp", LAYOUTS, ids=[f"w{w}-tp{t}-pp{p}-dp{d}" for w, t, p, d in LAYOUTS])
def test_every_factorisation_partitions_the_world_with_tp_innermost(world, tp, pp, dp):
    dims = ParallelDims.from_world(world, tp=tp, pp=pp)
    assert (dims.tp, dims.pp, dims.dp, dims.world) == (tp, pp, dp, world)
    for r in range(world):  # coordinates round-trip, and follow rank = tp + t(dp + d pp)
        c = dims.coords(r)
        assert dims.rank(c) == r == c.tp + tp * (c.dp + dp * c.pp)
    for axis, size in ((Axis.TP, tp), (Axis.DP, dp), (Axis.PP, pp)):
        groups = dims.group_ranks(axis)
        assert sorted(r for g in groups for r in g) == list(range(world))  # a partition
        assert all(len(g) == size for g in groups)
    assert all(g == list(range(g[0], g[0] + tp)) for g in dims.group_ranks(Axis.TP))  # contiguous TP
    for g in dims.group_ranks(Axis.PP):  # stride of a pipeline = one stage's ranks
        assert all(b - a == tp * dp for a, b in zip(g, g[1:]))
    for pipe, emb in zip(dims.group_ranks(Axis.PP), dims.embedding_group_ranks()):
        assert emb == ([pipe[0], pipe[-1]] if pp > 1 else [pipe[0]])


def test_group_of_finds_the_ranks_sharing_the_other_coordinates():
    dims = ParallelDims(tp=2, pp=2, dp=2)
    assert dims.group_of(Axis.TP, 5) == [4, 5]
    assert dims.group_of(Axis.DP, 5) == [5, 7]
    assert dims.group_of(Axis.PP, 5) == [1, 5]
    assert dims.coords(5) == Coords(tp=1, dp=0, pp=1)


@pytest.mark.parametrize("world,tp,pp,message", [
    (8, 3, 1, "not divisible by --tensor-model-parallel-size (3)"),
    (8, 2, 3, "--pipeline-model-parallel-size (3)"),
    (6, 4, 1, "choose sizes whose product divides 6"),
])
def test_world_not_divisible_by_tp_times_pp_is_rejected(world, tp, pp, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ParallelDims.from_world(world, tp=tp, pp=pp)


@pytest.mark.parametrize("kwargs,flag", [({"tp": 0}, "--tensor-model-parallel-size"),
                                         ({"pp": -1}, "--pipeline-model-parallel-size"),
                                         ({"dp": 0}, "data-parallel size")])
def test_non_positive_sizes_are_rejected(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        ParallelDims(**kwargs)


@pytest.mark.parametrize("tp,heads,kv,layers,pp,message", [
    (3, 32, 8, 32, 1, "does not divide the 32 attention heads"),
    (5, 20, 4, 12, 1, "key/value heads must divide one another"),
    (4, 8, 6, 8, 1, "key/value heads must divide one another"),
    (1, 8, 8, 4, 8, "exceeds the 4 layers"),
])
def test_model_that_cannot_be_split_is_rejected_with_the_flag(tp, heads, kv, layers, pp, message):
    with pytest.raises(ValueError, match=message):
        validate_model_dims(ParallelDims(tp=tp, pp=pp), heads, kv, layers)


def test_valid_gqa_splits_pass():
    validate_model_dims(ParallelDims(tp=8), 32, 8, 32)   # kv split evenly
    validate_model_dims(ParallelDims(tp=8), 32, 2, 32)   # kv replicated 4x


# --- context parallelism: CP between TP and DP (Megatron's "tp-cp-ep-dp-pp" without EP) ----------------------
def cp_factorisations(world: int):
    for tp, cp, pp in itertools.product(range(1, world + 1), repeat=3):
        if world % (tp * cp * pp) == 0:
            yield tp, cp, pp, world // (tp * cp * pp)


CP_LAYOUTS = [(w, *f) for w in (8, 16) for f in cp_factorisations(w)]


@pytest.mark.parametrize("world,tp,cp,pp,dp", CP_LAYOUTS,
                         ids=[f"w{w}-tp{t}-cp{c}-pp{p}-dp{d}" for w, t, c, p, d in CP_LAYOUTS])
def test_cp_sits_between_tp_and_dp_and_dp_cp_groups_partition_each_stage(world, tp, cp, pp, dp):
    dims = ParallelDims.from_world(world, tp=tp, pp=pp, cp=cp)
    assert (dims.tp, dims.cp, dims.pp, dims.dp) == (tp, cp, pp, dp)
    for r in range(world):
        c = dims.coords(r)
        assert dims.rank(c) == r == c.tp + tp * (c.cp + cp * (c.dp + dp * c.pp))
    for axis, size in ((Axis.TP, tp), (Axis.CP, cp), (Axis.DP, dp), (Axis.PP, pp), ((Axis.CP, Axis.DP), cp * dp)):
        groups = dims.group_ranks(axis)
        assert sorted(r for g in groups for r in g) == list(range(world)) and all(len(g) == size for g in groups)
    for g in dims.group_ranks(Axis.CP):  # a CP group: stride tp, so tp x cp consecutive ranks hold a TP x CP block
        assert all(b - a == tp for a, b in zip(g, g[1:]))
    for g in dims.group_ranks((Axis.CP, Axis.DP)):  # dp_cp: every rank of one (TP rank, stage), nothing else
        cs = [dims.coords(r) for r in g]
        assert len({(c.tp, c.pp) for c in cs}) == 1 and len({(c.cp, c.dp) for c in cs}) == cp * dp


def test_cp_defaults_to_one_and_keeps_the_three_axis_layout():
    for tp, pp, dp in ((2, 2, 2), (1, 4, 2), (4, 1, 2)):
        plain, with_cp = ParallelDims(tp=tp, pp=pp, dp=dp), ParallelDims(tp=tp, pp=pp, dp=dp, cp=1)
        assert plain == with_cp
        assert plain.group_ranks((Axis.CP, Axis.DP)) == plain.group_ranks(Axis.DP)
        assert all(len(g) == 1 for g in plain.group_ranks(Axis.CP))


def test_rank_order_is_data():
    dims = ParallelDims(tp=2, cp=2, dp=2, order="cp-tp-dp-pp")  # CP innermost instead
    assert dims.group_of(Axis.CP, 0) == [0, 1] and dims.group_of(Axis.TP, 0) == [0, 2]
    assert ParallelDims(tp=2, cp=2, dp=2).group_of(Axis.CP, 0) == [0, 2]
    with pytest.raises(ValueError, match="must name each of"):
        ParallelDims(order="tp-dp-pp")


def test_world_not_divisible_by_tp_cp_pp_names_the_cp_flag():
    with pytest.raises(ValueError, match=r"--context-parallel-size \(3\)"):
        ParallelDims.from_world(8, tp=2, cp=3)
    with pytest.raises(ValueError, match="--context-parallel-size must be a positive integer"):
        ParallelDims(cp=0)
