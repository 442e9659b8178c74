"""The planner's context-parallel model (hybrid/planner/context.py): a CP layout is the plain layout it reduces to
per rank, plus attention over the other ranks' keys and the CP transfers; CP 1 is the plain plan; the ring's bytes
are the runtime's ledger formula; recomputation reruns the forward's transfers; attention memory per rank falls as 1/CP; the search over CP finds the CP sizes
that make a long sequence fit; Llama 3 405B's published 131k-token run is expressed and predicted as the docs say."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from hybrid.cp.attention import CommType
from hybrid.planner.context import (attention_memory_per_rank, evaluate_cp, layer_cost, llama3_405b_131k, reduce,
                                    search_cp)
from hybrid.planner.hardware import hardware
from hybrid.planner.layout import Cluster, Layout, Recompute, Workload, ZeroStage
from hybrid.planner.model import ActivationProfile
from hybrid.planner.search import SearchSpace, evaluate, search
from models import load_config

DOCS = Path(__file__).resolve().parent.parent / "docs" / "context-parallel.md"


def _work(seq: int, batch: int = 16) -> Workload:
    cfg = dataclasses.replace(load_config("llama-3-8b"), max_position_embeddings=seq)
    return Workload(cfg, global_batch=batch, seq_length=seq, activations=ActivationProfile.BF16_FLASH, fp32_grads=False)


H100x64 = Cluster(gpus=64, hw=hardware("h100-80g"))


def test_cp1_is_the_plain_plan():
    work, layout = _work(8192), Layout(tp=8, pp=2, dp=4, zero=ZeroStage.OPTIMIZER, sequence_parallel=True)  # 64
    plan, plain = evaluate_cp(work, H100x64, layout, cp=1), evaluate(work, H100x64, layout)
    assert plan.total_s == plain.time.total and plan.mfu == pytest.approx(plain.mfu, rel=1e-12)
    assert plan.memory_gb * 1e9 == plain.memory.peak.total


def test_a_cp_layout_reduces_to_dp_times_cp_on_a_shorter_sequence():
    work, layout = _work(32768), Layout(tp=8, pp=2, dp=1, zero=ZeroStage.OPTIMIZER)
    reduced_work, reduced = reduce(work, layout, 4)
    assert (reduced_work.seq_length, reduced_work.global_batch, reduced.dp) == (8192, 64, 4)
    assert reduced_work.global_batch * reduced_work.seq_length == work.global_batch * work.seq_length
    with pytest.raises(ValueError, match="--seq-length 32768 is not divisible by 2 x --context-parallel-size"):
        reduce(work, layout, 3 * 2**14)


def test_activation_memory_per_rank_falls_as_one_over_cp():
    work = _work(65536)
    one = attention_memory_per_rank(work, Layout(tp=8, dp=8), 1)
    acts = evaluate_cp(work, H100x64, Layout(tp=8, dp=8), 1).base.memory.peak.activations
    for cp in (2, 4, 8):
        layout = Layout(tp=8, dp=8 // cp)  # 64 GPUs = tp x cp x dp
        assert attention_memory_per_rank(work, layout, cp) * cp == one
        got = evaluate_cp(work, H100x64, layout, cp).base.memory.peak.activations
        assert got == pytest.approx(acts / cp, rel=1e-9)  # every activation is linear in s under flash


def test_ring_transfers_hide_under_attention_at_long_sequences_and_not_at_short():
    long_ = layer_cost(_work(131072), H100x64, Layout(tp=8, pp=1, dp=8), 8, CommType.P2P)  # reduced layouts
    assert long_.exposed < long_.transfer / 7  # of 2 x 7 ring steps + 1, only the last dK, dV transfer shows
    short = layer_cost(_work(2048), H100x64, Layout(tp=8, pp=1, dp=8), 8, CommType.P2P)
    assert short.exposed > 0.3 * short.transfer  # 256-token blocks: the transfers outlast the compute
    for comm in (CommType.A2A, CommType.ALLGATHER):  # not overlapped
        c = layer_cost(_work(131072), H100x64, Layout(tp=8, pp=1, dp=8), 8, comm)
        assert c.exposed == c.transfer > 0


def test_recomputation_adds_the_forward_transfers_once_more():
    """As the runtime's ledger shows (tests/test_cp_models.py::test_recomputation_reruns_exactly_the_forward_...):
    every mode reruns the forward's transfers; a2a's forward is 4 of its 8 all-to-alls, 3 of them under
    selective recomputation (q, k, v: torch's checkpoint stops before the output's)."""
    work, cp = _work(2048), 8  # short blocks: the ring's transfers are not hidden, so the rerun shows in both
    cost = {(r, comm): layer_cost(work, H100x64, Layout(tp=8, dp=8, recompute=r), cp, comm)
            for r in Recompute for comm in CommType}
    for r in (Recompute.SELECTIVE, Recompute.SELECTIVE_OP, Recompute.FULL):
        assert cost[r, CommType.P2P].transfer > cost[Recompute.NONE, CommType.P2P].transfer
        assert cost[r, CommType.P2P].exposed > cost[Recompute.NONE, CommType.P2P].exposed
        ag_none, ag = cost[Recompute.NONE, CommType.ALLGATHER].transfer, cost[r, CommType.ALLGATHER].transfer
        assert ag == pytest.approx(1.5 * ag_none, rel=1e-12)  # gather == reduce-scatter time, the gather twice
    a2a = {r: cost[r, CommType.A2A].transfer for r in Recompute}
    assert a2a[Recompute.FULL] == a2a[Recompute.SELECTIVE_OP] == pytest.approx(1.5 * a2a[Recompute.NONE], rel=1e-12)
    assert a2a[Recompute.NONE] < a2a[Recompute.SELECTIVE] < a2a[Recompute.FULL]


def test_search_over_cp_makes_a_long_sequence_fit_and_is_faster():
    work = _work(131072)
    space = SearchSpace(tp=(8,), micro_batch=(1,), recompute=(Recompute.NONE,))
    assert not search(work, H100x64, space, top=1).plans  # without CP nothing fits without recomputation
    plans = search_cp(work, H100x64, space, cps=(1, 2, 4, 8), comms=tuple(CommType), top=3)
    assert plans and all(p.cp > 1 and p.memory_gb * 1e9 <= H100x64.hw.capacity_bytes for p in plans)
    assert [p.total_s for p in plans] == sorted(p.total_s for p in plans)


def test_ulysses_is_not_offered_beyond_the_kv_heads():
    work = _work(131072)  # 8 kv-heads: 1 a TP rank at tp 8
    plans = search_cp(work, H100x64, SearchSpace(tp=(8,), micro_batch=(1,)), cps=(2, 4), comms=(CommType.A2A,))
    assert plans == []


def test_llama3_405b_131k_prediction_is_the_one_the_docs_report():
    work, cluster, space, cp = llama3_405b_131k()
    (best,) = search_cp(work, cluster, space, cps=(cp,), comms=(CommType.P2P,), top=1)
    tflops = best.mfu * cluster.hw.peak_tflops
    row = next(line for line in DOCS.read_text().splitlines() if line.startswith("| Llama 3 405B, 16384 H100"))
    assert f"| {best.short()} |" in row and f"| {tflops:.0f} |" in row, (row, best.short(), tflops)
    assert re.search(r"\| 380 \|", row)


# --- `hybrid plan --context-parallel-size` ------------------------------------------------------------------
PLAN = ["--model", "llama-3-8b", "--gpus", "16", "--gpu", "h100-80g", "--global-batch-size", "8", "--seq-length",
        "32768", "--activation-profile", "bf16-flash", "--tensor-model-parallel-size", "8", "--micro-batch-size", "1",
        "--top", "3"]


def test_hybrid_plan_searches_cp_and_its_comm_type_with_the_rest(capsys):
    from hybrid.planner.cli import main
    assert main(PLAN + ["--context-parallel-size", "2", "--cp-comm-type", "p2p"]) == 0
    out = capsys.readouterr().out
    work = Workload(dataclasses.replace(load_config("llama-3-8b"), max_position_embeddings=32768), global_batch=8,
                    seq_length=32768, activations=ActivationProfile.BF16_FLASH,
                    fp32_grads=True)  # hybrid plan's default under --precision mixed (round 23: train.py's --bf16)
    cluster = Cluster(gpus=16, hw=hardware("h100-80g"))
    want = search_cp(work, cluster, SearchSpace(tp=(8,), micro_batch=(1,)), cps=(2,), comms=(CommType.P2P,), top=3)
    rows = [line.split() for line in out.splitlines() if re.match(r"\s*\d+  tp", line)]
    assert [" ".join(r[1:-5]) for r in rows] == [p.short() for p in want] and all("cp2 p2p" in p.short() for p in want)
    assert [float(r[-4]) for r in rows] == [pytest.approx(p.total_s, rel=1e-3) for p in want]


@pytest.mark.parametrize("extra,message", [
    (["--context-parallel-size", "2", "--inter-dc-bandwidth", "1"],  # --json: runs (tests/test_cpviews22.py)
     "--inter-dc-bandwidth does not run with --context-parallel-size"),
    (["--cp-comm-type", "a2a"], "--cp-comm-type needs --context-parallel-size"),
    (["--context-parallel-size", "2,0"], "--context-parallel-size '2,0': give one or more comma-separated")])
def test_hybrid_plan_rejects_what_cp_planning_does_not_do_in_one_line(extra, message, capsys):
    from hybrid.planner.cli import main
    assert main(PLAN + extra) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hybrid plan: error: {message}") and err.count("\n") == 1, err
