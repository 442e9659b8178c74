"""Round 25 (planner25a): hybrid-sharded data parallelism (HSDP) in the planner -- Layout.dp_replicate, its two
groups' traffic and memory, the search's proposal, the CLI flag's refusals -- and IBM fms-fsdp's rows that ran it
(docs/planner/round25-hsdp.md)."""

from __future__ import annotations

import json

import pytest

from hybrid.planner import hardware
from hybrid.planner.hardware import GB, Collective, GroupPlacement, collective_seconds
from hybrid.planner.layout import (Cluster, Layout, Workload, ZeroStage, layout_problems, replicate_placement,
                                   shard_placement)
from hybrid.planner.model import ActivationProfile
from hybrid.planner.predicted_comm import dp_microbatch_ledger, hsdp_replicate_ledger, step_ledger
from hybrid.planner.predicted_memory import plan_memory
from hybrid.planner.search import SearchSpace, _sizes
from hybrid.planner.time import _overlapped, hsdp_traffic, step_time

Z3 = ZeroStage.PARAMETERS
SMALL = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--gpus", "16",
         "--global-batch-size", "32", "--seq-length", "512", "--tensor-model-parallel-size", "1",
         "--pipeline-model-parallel-size", "1", "--micro-batch-size", "1", "--recompute-granularity", "none",
         "--gpu", "h100-80g"]


def _work(gb: int = 32) -> Workload:
    from hybrid.planner.published import llama_model
    cfg = llama_model(4, 512, 8, 8, 1536, 32000, 512)
    return Workload(cfg, global_batch=gb, seq_length=512, activations=ActivationProfile.BF16_FLASH, fp32_grads=False)


def test_replica_all_reduce_bytes_and_seconds_by_hand():
    """A shard group of 8 reduce-scatters 2 psi gradient bytes; each rank then all-reduces its reduced shard,
    2 psi / 8 bytes, over the 4 replicas: a ring all-reduce moves 2 (r - 1) / r of it, one NIC a rank (one member
    of each replica group a node: 8 groups share the node's 8 NICs)."""
    psi = 1_000_000
    assert hsdp_replicate_ledger(psi, 8, 4, 2) == {"all_reduce@dp_replicate": {"calls": 1, "bytes": 250_000}}
    assert hsdp_replicate_ledger(psi, 8, 1, 2) == {}  # no HSDP: no replica traffic
    shard = dp_microbatch_ledger(psi, Z3, 8, 2, 2)  # the shard group's ZeRO 3 traffic is plain ZeRO 3 over 8
    assert shard["forward"] == {"all_gather@dp": {"calls": 1, "bytes": 2_000_000}}
    hw = hardware("h100-80g")
    cluster, lay = Cluster(gpus=32, hw=hw), Layout(dp=32, zero=Z3, dp_replicate=4)
    assert shard_placement(cluster, lay) == GroupPlacement(size=8, per_node=8)  # a node
    assert replicate_placement(cluster, lay) == GroupPlacement(size=4, per_node=1)  # one a node
    by_hand = hw.inter_latency_s + 2 * 3 / 4 * 250_000 / (hw.inter_node_gbps * GB)
    got = collective_seconds(hw, Collective.ALL_REDUCE, 250_000, replicate_placement(cluster, lay))
    assert got == pytest.approx(by_hand, rel=1e-12)


def test_step_ledger_and_memory_shard_over_the_group_only():
    """One step's ledger at HSDP 8 x 2 on 16 GPUs: every reduce-scatter over the 8 is followed by an all-reduce of
    its output (its input / 8) over the replicas, as many calls; the all-gathers are ZeRO 3's over 8. The states
    are sharded over 8, not 16: twice ZeRO 3's over all."""
    work, cluster = _work(), Cluster(gpus=16, hw=hardware("h100-80g"))
    hsdp, fsdp = Layout(dp=16, zero=Z3, dp_replicate=2), Layout(dp=16, zero=Z3)
    led = step_ledger(work, hsdp, 0)
    rs, ar = led["reduce_scatter@dp"], led["all_reduce@dp_replicate"]
    assert ar["calls"] == rs["calls"] and ar["bytes"] == rs["bytes"] / 8
    assert led["all_gather@dp"] == step_ledger(_work(16), Layout(dp=8, zero=Z3), 0)["all_gather@dp"]  # m 2 both
    assert "all_reduce@dp_replicate" not in step_ledger(work, fsdp, 0)
    a, b = plan_memory(work, cluster, hsdp).peak.states, plan_memory(work, cluster, fsdp).peak.states
    assert (a.params, a.grads, a.optimizer) == pytest.approx((2 * b.params, 2 * b.grads, 2 * b.optimizer))
    traffic = hsdp_traffic(work, cluster, hsdp)
    assert traffic["shard"]["link"] == "inside a node" and traffic["replicate"]["link"] == "across nodes"
    assert traffic["replicate"]["bytes"] == ar["bytes"] and hsdp_traffic(work, cluster, fsdp) is None


def test_two_links_overlap_by_hand():
    """_overlapped with a replica all-reduce on another link: one layer's share of both exposed (its reduce-scatter
    then its all-reduce), the rest on the busier link, every hidden collective second slowing the compute; at
    replica 0 it is the one-link formula."""
    # compute 10, dp 4, replica 8, 4 layers, cost 0.5: exposed 12/4 = 3, rest 8 - 2 = 6, slowed 0.5 x 9 = 4.5
    assert _overlapped(10.0, 0.0, 4.0, 4, False, 0.0, 0.5, 8.0) == (3.0 + 14.5, 6.0)
    assert _overlapped(10.0, 1.0, 4.0, 4, False, 0.0, 0.5) == (1.0 + 11.0 + 1.5, 3.0)  # 1 + max(10 + 1 + 1.5, 3)


def test_search_proposes_hsdp_only_where_zero_is_searched():
    """ZeRO unpinned: the node-sized shard group (8 of 16) is tried beside full sharding; --zero-stage 3 alone is
    FSDP's full sharding (the published FSDP rows pin it); a pinned replica count is tried as given."""
    work, cluster = _work(), Cluster(gpus=16, hw=hardware("h100-80g"))
    pinned = dict(tp=(1,), pp=(1,), micro_batch=(1,), sequence_parallel=(False,))

    def replicas(space):
        return {lay.dp_replicate for lay in _sizes(work, cluster, space, []) if lay.zero is Z3}
    assert replicas(SearchSpace(**pinned)) == {1, 2}
    assert replicas(SearchSpace(zero=(Z3,), **pinned)) == {1}
    assert replicas(SearchSpace(zero=(Z3,), dp_replicate=(4,), **pinned)) == {4}
    assert {lay.dp_replicate for lay in _sizes(work, cluster, SearchSpace(**pinned), []) if lay.zero < Z3} == {1}


def test_bad_layouts_and_flags_are_one_line(capsys):
    from hybrid.planner.cli import main
    work, cluster = _work(), Cluster(gpus=16, hw=hardware("h100-80g"))
    (reason,) = layout_problems(work, cluster, Layout(dp=16, zero=ZeroStage.OPTIMIZER, dp_replicate=2))
    assert "needs --zero-stage 3" in reason
    (reason,) = layout_problems(work, cluster, Layout(dp=16, zero=Z3, dp_replicate=16))
    assert "leave a shard group of 2 or more" in reason
    preset = ["--model", "llama-3-8b"] + SMALL[6:]  # --emit-args needs a model train.py builds
    for argv, said in ((SMALL + ["--data-parallel-replicate-degree", "3"], "must divide the 16 data-parallel ranks"),
                       (SMALL + ["--data-parallel-replicate-degree", "2", "--zero-stage", "1"], "give --zero-stage 3"),
                       (preset + ["--data-parallel-replicate-degree", "2", "--emit-args"],
                        "train.py shards ZeRO 3 over all"),
                       (SMALL + ["--data-parallel-replicate-degree", "0"], "--data-parallel-replicate-degree")):
        with pytest.raises(SystemExit) if argv[-1] == "0" else _returns(2):
            assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and said in err, err


class _returns:
    """A stand-in context for pytest.raises where main returns its status."""

    def __init__(self, status: int):
        self.status = status

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_json_and_explain_show_both_groups(capsys):
    from hybrid.planner.cli import main
    assert main(SMALL + ["--data-parallel-replicate-degree", "2", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plans"][0]
    assert plan["layout"]["dp_replicate"] == 2 and plan["layout"]["zero_stage"] == 3
    groups = plan["dp_groups"]
    assert (groups["shard"]["ranks"], groups["replicate"]["ranks"], groups["replicate"]["per_node"]) == (8, 2, 1)
    assert main(SMALL + ["--data-parallel-replicate-degree", "2", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "hsdp8x2" in out and "HSDP 8 x 2: ZeRO 3 over shard groups of 8 (inside a node)" in out


def test_hsdp_prices_the_replica_link():
    """The same layout priced with a slower inter-node link: HSDP's step grows (its all-reduce crosses nodes), and
    at the shard group's own link it would not (a 16-GPU node: both groups inside it)."""
    work = _work()
    lay = Layout(dp=16, zero=Z3, dp_replicate=2)
    fast, slow = hardware("h100-80g"), hardware("h100-80g").with_overrides(inter_node_gbps=0.5)
    t_fast = step_time(work, Cluster(gpus=16, hw=fast), lay).total
    t_slow = step_time(work, Cluster(gpus=16, hw=slow), lay).total
    assert t_slow > t_fast * 1.05
    node16 = slow.with_overrides(gpus_per_node=16)
    assert step_time(work, Cluster(gpus=16, hw=node16), lay).total < t_slow


def test_ibm_rows_that_stated_hsdp_are_planned_so():
    """fms-fsdp's README (0d31998: 7B and 13B on 128 A100; 5e522b4: 7B on 96 H100) states HSDP, FSDP1's
    HYBRID_SHARD over a node's 8 GPUs: those three rows plan HSDP 8 x gpus/8 and move toward zero (the 13B into the
    band); planned as ZeRO 3 over all (as_full_shard: reverting the round) they are rounds 16-24's numbers. The
    34B / 70B stated FSDP: as HSDP they would not fit a node's shard group."""
    from hybrid.planner.published25_hsdp import as_full_shard, ibm_runs, states_hsdp
    from hybrid.planner.published_more import evaluate
    want = {"fms-fsdp Llama 2 7B, 128 A100, HSDP 8 x 16, b2, no AC": (0.037, 0.017),
            "fms-fsdp Llama 2 13B, 128 A100, HSDP 8 x 16, b1, no AC": (0.167, 0.122),
            "fms-fsdp Llama 2 7B, 96 H100, HSDP 8 x 12, b2, no AC": (0.085, 0.067)}
    runs = {r.name: r for r in ibm_runs()}
    assert want.keys() <= runs.keys() and sum(states_hsdp(as_full_shard(r).name) for r in runs.values()) == 3
    for name, (before, after) in want.items():
        run = runs[name]
        assert run.space.dp_replicate == (run.gpus // 8,)
        plan = evaluate(run)
        assert plan.plan.layout.dp_shard == 8 and plan.error == pytest.approx(after, abs=0.002)
        assert evaluate(as_full_shard(run)).error == pytest.approx(before, abs=0.002)


def test_docs_hold_what_the_module_prints():
    """docs/planner/round25-hsdp.md holds every line `python -m hybrid.planner.published25_hsdp` prints."""
    import contextlib
    import io
    import os
    from hybrid.planner import published25_hsdp
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        published25_hsdp.main()
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "planner", "round25-hsdp.md")) as f:
        docs = f.read()
    missing = [line for line in out.getvalue().splitlines() if line not in docs]
    assert not missing, missing
