"""Issue 26, round 16: the family report (hybrid/planner/families.py) and MosaicML's A100 40GB check rows
(hybrid/planner/published16.py). The report's numbers move with the planner's physics (docs/planner/rounds.md "Round 16:
held-out families" is regenerated with `python -m hybrid.planner.families`); what is asserted here is that every
row lands in a family, that the statistics and slices count what they say, and that the new rows are the table's."""

from __future__ import annotations

import pytest

from hybrid.planner.families import (FAMILY_OF_SOURCE, SLICES, FamilyRow, all_published_runs, family_of, plan_row,
                                     stats)
from hybrid.planner.hardware import MIB, hardware
from hybrid.planner.layout import Recompute, ZeroStage
from hybrid.planner.ops import Stack
from hybrid.planner.published import Role
from hybrid.planner.published16 import (FMS_FSDP_A100_ROWS, MPT_A100_40G_ROWS, MPT_A100_40G_SOURCE,
                                        fms_fsdp_a100_runs, mpt_a100_40g_runs, runs16)
from hybrid.planner.published_more import MPT_MORE_SIZES, Result


def test_every_published_row_has_a_family_read_from_its_source():
    """Each of the 523 rows of the table modules maps to one family by its source, and a source nobody mapped is
    refused by name rather than lumped in."""
    runs = all_published_runs()
    families = {family_of(r.source) for r in runs}
    assert families <= {f for _, f in FAMILY_OF_SOURCE}
    assert {"MosaicML llm-foundry (Composer, FSDP1)", "torchtitan (FSDP2, DTensor TP / PP)",
            "Megatron-DeepSpeed / DeepSpeed pipeline (BLOOM, MT-NLG)"} <= families
    assert family_of("Smith et al. 2022, Megatron-Turing NLG") == family_of("bigscience-workshop/bigscience x")
    with pytest.raises(ValueError, match="FAMILY_OF_SOURCE"):
        family_of("somebody's blog")


def _row(error, role=Role.CHECK, gpus=8, tp=1, pp=1, zero=3, card="A100", family="MosaicML llm-foundry (Composer, "
         "FSDP1)"):
    return FamilyRow("r", family, card, gpus, tp, pp, 1, gpus // (tp * pp), zero, role, error,
                     "" if error is not None else "does not fit")


def test_stats_count_check_rows_apart_and_rejected_layouts():
    """Signed mean, median |error|, spread and the band over the CHECK rows only; a FIT row is counted, not
    averaged; a rejected row is counted as rejected and has no error."""
    rows = [_row(0.10), _row(-0.20), _row(0.04), _row(0.50, role=Role.FIT), _row(None)]
    assert stats(rows) == "4 | 1 | -2.0 % | 10.0 % | -20.0 % to +10.0 % | 2 of 3 | 1"
    assert stats([_row(None)]) == "1 | 0 | - | - | - | - | 1"


def test_slices_are_the_held_out_kinds():
    """A Megatron pipeline at 2,240 GPUs is in the first slice and not an FSDP one; an FSDP run at 8 GPUs without
    TP is in its card's FSDP slice; TP moves it to the TP slice; a 3-way layout (tp, pp, dp > 1) counts as one."""
    by_name = dict(SLICES)
    mtnlg = _row(0.05, gpus=2240, tp=8, pp=35, zero=1,
                 family="Megatron-DeepSpeed / DeepSpeed pipeline (BLOOM, MT-NLG)")
    fsdp = _row(0.05, gpus=8, card="A100 40GB")
    with_tp = _row(0.05, gpus=16, tp=4, card="H200", family="KempnerForge (FSDP2, DTensor TP)")
    first = "Megatron / DeepSpeed / NeMo pipelines at 2,000-3,400 GPUs"
    assert by_name[first](mtnlg) and not by_name[first](fsdp)
    assert by_name["FSDP (ZeRO 3) at 8-64 GPUs, no TP, A100 (80 and 40 GB)"](fsdp)
    assert not by_name["FSDP (ZeRO 3) at 8-64 GPUs, no TP, A100 (80 and 40 GB)"](mtnlg)
    assert by_name["FSDP (ZeRO 3) at 8-64 GPUs with TP (any card)"](with_tp)
    assert not by_name["FSDP (ZeRO 3) at 8-64 GPUs, no TP, H200"](with_tp)
    assert mtnlg.ways == 3 and fsdp.ways == 1 and with_tp.ways == 2


def test_plan_row_reads_the_layout_of_the_plan_or_of_a_rejected_row():
    """A rejected row (no plan) keeps the layout it states and no error; its family and card are its own."""
    run = mpt_a100_40g_runs()[0]
    rejected = plan_row(run, evaluate=lambda r: Result(r, rejected="over memory"))
    assert (rejected.card, rejected.tp, rejected.pp, rejected.dp, rejected.zero) == ("A100 40GB", 1, 1, 128, 3)
    assert rejected.error is None and rejected.rejected == "over memory"
    assert rejected.family == "MosaicML llm-foundry (Composer, FSDP1)"


def test_a100_40g_rows_are_the_table_rows():
    """Each of the table's 78 rows: its model has the table's NumParams exactly (12 L d^2 + 13 L d + (V + s) d + 2 d,
    V 50368 -- a size or a sequence read wrong fails it), FULL_SHARD as ZeRO 3, the stated micro-batch and
    checkpointing, bf16 gradient reduction (PURE), tokens a GPU compared; a CHECK row, no name repeated or already
    held by another module."""
    runs = mpt_a100_40g_runs()
    assert len(runs) == len(MPT_A100_40G_ROWS) == 78 and runs == runs16()[:78]
    for run, (size, seq, gpus, mb, accum, tokens, ac, params) in zip(runs, MPT_A100_40G_ROWS):
        layers, d, _ = MPT_MORE_SIZES[size]
        assert 12 * layers * d * d + 13 * layers * d + (50368 + seq) * d + 2 * d == params
        assert run.workload.model.num_parameters == params
        assert (run.gpus, run.workload.seq_length, run.workload.global_batch) == (gpus, seq, mb * accum * gpus)
        assert run.space.micro_batch == (mb,) and run.space.zero == (ZeroStage.PARAMETERS,)
        assert run.space.recompute == ((Recompute.FULL if ac else Recompute.NONE),)
        assert not run.workload.fp32_grads and run.published == tokens and run.role is Role.CHECK
        assert run.source == MPT_A100_40G_SOURCE and "A100 40GB" in run.name
    names = [r.name for r in runs]
    others = {r.name for r in all_published_runs()} - set(names)
    assert len(set(names)) == len(names) and not set(names) & others


def test_a100_40g_card_is_the_80g_chip_with_its_own_memory():
    """40960 MiB and 1.555 TB/s (the data sheet), everything the chip sets (GEMM, flash, network) as the 80 GB."""
    hw, ref = mpt_a100_40g_runs()[0].hardware(), hardware("a100-80g")
    assert (hw.name, hw.memory_bytes, hw.hbm_tbps) == ("a100-40g", 40960 * MIB, 1.555)
    assert hw.elementwise_tbps == pytest.approx(ref.elementwise_tbps * 1.555 / ref.hbm_tbps)
    assert (hw.peak_tflops, hw.compute_efficiency, hw.flash_efficiency, hw.inter_node_gbps) == (
        ref.peak_tflops, ref.compute_efficiency, ref.flash_efficiency, ref.inter_node_gbps)


def test_fms_fsdp_a100_rows_are_the_readme_rows():
    """The README's four A100 rows: 128 GPUs, s 4096, ZeRO 3, the stated batch a GPU (no accumulation) and
    checkpointing, eager on the PyTorch stack, the token/gpu/sec compared; Llama 2 shapes at their known sizes."""
    runs = fms_fsdp_a100_runs()
    assert runs == runs16()[78:82] and len(runs) == len(FMS_FSDP_A100_ROWS) == 4
    for run, (_, _, mb, ac, tokens) in zip(runs, FMS_FSDP_A100_ROWS):
        assert (run.gpus, run.gpu, run.workload.seq_length, run.workload.global_batch) == (128, "a100-80g", 4096,
                                                                                              128 * mb)
        assert run.space.micro_batch == (mb,) and run.space.zero == (ZeroStage.PARAMETERS,)
        assert run.space.recompute == ((Recompute.FULL if ac else Recompute.NONE),)
        assert run.published == tokens and run.role is Role.CHECK and run.workload.stack is Stack.PYTORCH
    billions = [round(r.workload.model.num_parameters / 1e9, 1) for r in runs]
    assert billions == [6.7, 13.0, 33.7, 69.0]


def test_table_pairs_key_reads_model_sequence_and_gpus():
    """The 80 / 40 GB side-by-side (`published16 --pairs`) matches rows by (model, sequence, GPUs) read from names."""
    from hybrid.planner.published16 import _key
    assert _key("MPT-13b, s 8192, 8 A100 40GB, FSDP z3, b1 x 16, AC") == ("13b", "8192", "8")
    assert _key("MPT-13b, s 8192, 8 A100, FSDP z3, b5 x 3, AC") == ("13b", "8192", "8")
    assert _key("MPT-70b, s 2048, 64 A100 40GB, FSDP z3, b2 x 1, AC") != _key("MPT-70b, s 2048, 128 A100, x")


@pytest.mark.slow
def test_docs_round16_rows_table_is_the_one_published16_computes():
    """docs/planner/rounds.md "Round 16: held-out families" holds published16's table and summary line as the code
    prints them (~4 s of CPU: 82 plans), so the page cannot drift from the model."""
    from pathlib import Path

    from hybrid.planner.published16 import evaluate_all
    from hybrid.planner.published_more import summary_line, table
    docs = (Path(__file__).resolve().parents[1] / "docs" / "planner" / "rounds.md").read_text()
    section = docs[docs.index("## Round 16: held-out families"):]
    results = evaluate_all()
    assert table(results) in section
    assert summary_line("Round 16 check rows (MosaicML A100 40GB, fms-fsdp A100, Nemotron-4 340B)",
                        results) in section


def test_nemotron4_340b_row_is_the_reported_stage():
    """6,144 H100 at t 8 x p 12 x d 64, GBS 2,304 of 4,096 tokens, 8.0 s compared as a step; the 340B shape's
    parameter count (the report's 340B class) and a check row of the NeMo family."""
    from hybrid.planner.published16 import nemotron4_340b_run
    run = nemotron4_340b_run()
    assert run == runs16()[-1] and run.role is Role.CHECK and run.published == 8.0
    assert (run.gpus, run.space.tp, run.space.pp, run.workload.global_batch, run.workload.seq_length) == (
        6144, (8,), (12,), 2304, 4096)
    assert 6144 // (8 * 12) == 64 and not run.workload.fp8
    assert 330e9 < run.workload.model.num_parameters < 350e9
    assert family_of(run.source).startswith("NeMo")
