"""Round 17 (issue 26): the TP plan's collective count (Workload.tp_plan, predicted_comm.tp_gathers).

KempnerForge's DTensor plan puts `ColwiseParallel(input_layouts=Shard(1))` on each of q, k, v, gate and up, so a
layer all-gathers its sequence-sharded input five times where Megatron (and torchtitan's PrepareModuleInput) does
it twice; its own profile of a 13B TP 4 run counts 12.1 all-gathers and 8.0 reduce-scatters a layer and
micro-batch. Ledger arithmetic and one planned row; ~1 s of CPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hybrid.planner.layout import Recompute, TpPlan, Workload
from hybrid.planner.predicted_comm import tp_gathers, tp_ledger
from hybrid.planner.published import LLAMA3_8B, llama_model
from hybrid.planner.published15 import runs15
from hybrid.planner.published_more import evaluate

B, S, L = 2, 4096, 3


def _shard(t: int = 4):
    return Workload(llama_model(*LLAMA3_8B, S), global_batch=8, seq_length=S, fp32_grads=False).shard(t)


def _calls(book: dict, op: str) -> int:
    return sum(int(side.get(f"{op}@tp", {"calls": 0})["calls"]) for side in book.values())


def test_projection_plan_gathers_once_per_column_parallel_projection():
    """Llama: q, k, v, gate, up -- 5 inputs where BLOCK gathers 2 (SwiGLU's 3 MLP matrices, 1 of them rowwise)."""
    shard = _shard()
    assert (tp_gathers(shard, TpPlan.BLOCK), tp_gathers(shard, TpPlan.PROJECTION)) == (2, 5)


@pytest.mark.parametrize("plan,ag,rs", [(TpPlan.BLOCK, 6, 5), (TpPlan.PROJECTION, 12, 8)])
def test_full_recomputation_counts_are_the_profiled_ones(plan, ag, rs):
    """Under SP and full (early-stopped) recomputation, a layer's all-gathers are forward c + backward 2 + rerun c
    and its reduce-scatters 2 + c + 1 (c = 2 or 5): KempnerForge's profile (9,679 / 800 = 12.1 and 6,420 / 800 =
    8.0, benchmarks/profiling/13b_24gpu_profiling.md) is the PROJECTION row."""
    book = tp_ledger(_shard(), B, S, L, False, False, True, Recompute.FULL, 2, plan)
    assert (_calls(book, "all_gather"), _calls(book, "reduce_scatter")) == (ag * L, rs * L)
    bsh = B * S * 4096 * 2
    assert book["forward"]["all_gather@tp"]["bytes"] == (ag - 2) // 2 * L * bsh  # c inputs, each the full b s h


def test_without_sp_each_projection_all_reduces_its_input_gradient():
    """Plain TP: the forward's 2 row-parallel all-reduces either way; the backward reduces each column-parallel
    input's gradient (Partial -> Replicate), 5 under PROJECTION, 2 under BLOCK."""
    for plan, backward in ((TpPlan.BLOCK, 2), (TpPlan.PROJECTION, 5)):
        book = tp_ledger(_shard(), B, S, L, False, False, False, Recompute.NONE, 2, plan)
        assert book["forward"]["all_reduce@tp"]["calls"] == 2 * L
        assert book["backward"]["all_reduce@tp"]["calls"] == backward * L


def test_block_is_the_default_and_a_bad_plan_is_refused_by_name():
    work = Workload(llama_model(*LLAMA3_8B, S), global_batch=8, seq_length=S, fp32_grads=False)
    assert work.tp_plan is TpPlan.BLOCK
    with pytest.raises(ValueError, match="Workload.tp_plan must be a TpPlan"):
        replace(work, tp_plan="projection")


def test_kempnerforge_rows_carry_their_plan_and_a_named_row_moves_into_the_band():
    """Every KempnerForge row plans its code's plan; the 13B weak-scaling row at 32 H200 (TP 4 x FSDP 8) was +10.6 %
    with one gather a block and is within +-5 % with five, both without round 18's DTensor copies (it fails if the
    plan or its ledger is reverted)."""
    runs = runs15()
    assert {r.workload.tp_plan for r in runs} == {TpPlan.PROJECTION}
    row = next(r for r in runs if r.name.startswith("KempnerForge 13B weak scaling, 32 H200"))
    # round 18's copies and round 20's gathered logits apart (their own tests)
    row = replace(row, workload=replace(row.workload, sp_copies=False, gathered_logits=False))
    now = evaluate(row).error
    before = evaluate(replace(row, workload=replace(row.workload, tp_plan=TpPlan.BLOCK))).error
    assert before == pytest.approx(0.106, abs=0.002)
    assert abs(now) <= 0.05 and now < before - 0.08


TP_FLAGS = ["--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-80g", "--global-batch-size", "16", "--seq-length",
            "4096", "--activation-profile", "bf16-flash", "--tensor-model-parallel-size", "4",
            "--sequence-parallel", "--pipeline-model-parallel-size", "1", "--micro-batch-size", "1", "--top", "1"]


def _tp_seconds(capsys, *extra: str) -> float:
    from hybrid.planner.cli import main
    assert main(TP_FLAGS + ["--explain", *extra]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    return next(float(r[1]) for r in rows if r[0] == "tp")


def test_hybrid_plan_takes_the_tp_plan_and_emit_args_refuses_another_runtimes(capsys):
    """`hybrid plan --tp-plan projection` prices the per-projection gathers (more TP seconds than the default
    block plan); --emit-args (this runtime's flags: its TP gathers once per block) refuses it in one line."""
    from hybrid.planner.cli import main
    block, projection = _tp_seconds(capsys), _tp_seconds(capsys, "--tp-plan", "projection")
    assert 0 < block < projection
    assert main(TP_FLAGS + ["--tp-plan", "projection", "--emit-args"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--tp-plan projection" in err and "--emit-args" in err and len(err.splitlines()) == 1
