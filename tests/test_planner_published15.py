"""Issue 26, round 15: KempnerForge's H200 runs as CHECK rows and the PyTorch-native family's mechanisms
(hybrid/planner/published15.py).

The fast tests check the rows as entered (roles, no repeat, the report's own arithmetic, the stated settings
reaching the workload) and the FSDP2 copy ledger's arithmetic, without planning; the slow ones plan the 14 rows
(~3 s of CPU) and hold docs/planner/rounds.md "Round 15" to what the code prints, with a ratchet on the misses."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from hybrid.planner.layout import Recompute, ZeroStage
from hybrid.planner.ops import KernelProfile, Stack
from hybrid.planner.published import Role, all_runs
from hybrid.planner.published14 import runs14
from hybrid.planner.published15 import (KEMPNER_GPUS_PER_NODE, KEMPNER_MODELS, KEMPNER_ROWS, KEMPNER_SEQ,
                                        KEMPNER_VALIDATION_ROWS, KEMPNER_WEAK_BATCH, KEMPNER_WEAK_ROWS,
                                        evaluate_all, kempner_weak_setting, fsdp2_copy_bytes,
                                        kempner_runs, kempner_weak_runs, report, runs15, summary_line,
                                        tp_missing)
from hybrid.planner.published_more import more_runs
from hybrid.planner.published import llama_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# rows outside +-15 % with the model as it stands: every KempnerForge row with TP but the 13B weak-scaling ones
# (docs/planner/rounds.md "Round 15" takes them apart)
KNOWN_MISSES = {r.name for r in runs15() if " TP " in r.name and "13B weak scaling" not in r.name}


def test_rows_are_check_rows_new_to_the_repository():
    """Held-out discipline: 28 CHECK rows fitting nothing, each named once, none repeating a row of the older
    modules."""
    runs = runs15()
    assert len(runs) == 28 and all(r.role is Role.CHECK and not r.fits for r in runs)
    names = [r.name for r in runs]
    assert len(set(names)) == len(names)
    assert not set(names) & {r.name for r in all_runs() + more_runs() + runs14()}


def test_the_report_hangs_together():
    """The report's own arithmetic: tok/s (all GPUs) x step time = micro-batch x accumulation x 4096 x DP within
    1 % on every row, TP x DP = GPUs, and the models' parameter counts are the report's 8.03B / 14.84B / 70.55B."""
    for exp, gpus, size, tp, b, accum, compiled, tok, mem, step in KEMPNER_ROWS:
        dp = gpus // tp
        assert dp * tp == gpus
        assert tok * step == pytest.approx(b * accum * KEMPNER_SEQ * dp, rel=0.01), exp
    for size, gpus, tok, mem, step in KEMPNER_WEAK_ROWS:
        b, accum, _compiled = kempner_weak_setting(size, gpus)
        assert tok * step == pytest.approx(b * accum * KEMPNER_SEQ * gpus // 4, rel=0.01), (size, gpus)
    for config, gpus, tp, b, accum, tok, mem, step in KEMPNER_VALIDATION_ROWS:
        assert tok * step == pytest.approx(b * accum * KEMPNER_SEQ * gpus // tp, rel=0.01), config
    counts = {k: llama_model(*v, KEMPNER_SEQ).num_parameters / 1e9 for k, v in KEMPNER_MODELS.items()}
    assert counts == pytest.approx({"7B": 8.03, "13B": 14.84, "70B": 70.55}, abs=0.006)


def test_stated_settings_reach_the_workload():
    """mfu_bench.sh's layout and KempnerForge's code at 01b461a: FSDP2 (ZeRO 3) over dp_shard and none without it,
    TP with SP, full AC, compile but for experiment 08, the PyTorch stack, fp32 reduction where there is DP, bf16
    AdamW states, 4 H200 a node; the published number is tok/s over the GPUs."""
    for run, (exp, gpus, size, tp, b, accum, compiled, tok, mem, step) in zip(kempner_runs(), KEMPNER_ROWS,
                                                                            strict=True):
        w, dp = run.workload, gpus // tp
        assert run.gpu == "h200" and run.gpus == gpus and run.hardware().gpus_per_node == KEMPNER_GPUS_PER_NODE
        assert run.space.tp == (tp,) and run.space.micro_batch == (b,) and w.global_batch == b * accum * dp
        assert run.space.zero == ((ZeroStage.PARAMETERS,) if dp > 1 else (ZeroStage.NONE,))
        assert run.space.sequence_parallel == (tp > 1,) and run.space.recompute == (Recompute.FULL,)
        assert w.kernel_profile is (KernelProfile.FUSED if exp != 8 else KernelProfile.EAGER)
        assert w.stack is Stack.PYTORCH and w.fp32_grads == (dp > 1) and w.optimizer_dtype_bytes == 2
        assert w.seq_length == KEMPNER_SEQ and run.published == tok / gpus
    for run, (size, gpus, tok, mem, step) in zip(kempner_weak_runs(), KEMPNER_WEAK_ROWS, strict=True):
        b, accum, compiled = kempner_weak_setting(size, gpus)
        assert run.space.tp == (4,) and run.space.zero == (ZeroStage.PARAMETERS,) and run.space.micro_batch == (b,)
        assert run.workload.global_batch == b * accum * gpus // 4 and run.workload.fp32_grads
        assert run.workload.kernel_profile is (KernelProfile.FUSED if compiled else KernelProfile.EAGER)
        assert run.hardware().gpus_per_node == 4
    # the driver's B13 / B70 everywhere but the 70B pre-flight, whose log ran b1 x 8 eager (round 24)
    assert [kempner_weak_setting(size, gpus) for size, gpus, *_rest in KEMPNER_WEAK_ROWS] == [
        (*KEMPNER_WEAK_BATCH[size], True) if (size, gpus) != ("70B", 8) else (1, 8, False)
        for size, gpus, *_rest in KEMPNER_WEAK_ROWS]


def test_fsdp2_copy_ledger():
    """The FSDP2 copies a step puts on the compute stream: two unshards a micro-batch (forward, backward re-gather)
    each reading and writing every bf16 parameter of the rank's shard (4 psi bytes), one reduce-scatter copy-in a
    micro-batch reading the bf16 gradient and writing the reduce dtype (2 + 4 psi with fp32 reduction) -- once a
    step where KempnerForge skips the others' sync, once a step (and one unshard) under torchtitan's pipeline;
    torchtitan reduces in fp32 (its default) even where the row plans bf16; nothing without FSDP."""
    kempner = kempner_runs()[7]  # 13B, FSDP 8, b4 x 4, fp32 reduction, maybe_no_sync
    psi = kempner.workload.model.num_parameters
    plan = SimpleNamespace(layout=SimpleNamespace(zero=ZeroStage.PARAMETERS, dp=8, tp=1, pp=1, micro_batch=4))
    assert fsdp2_copy_bytes(kempner, plan) == pytest.approx((4 * 2 * 4 * psi, 6 * psi))
    plan.layout.tp = 4
    assert fsdp2_copy_bytes(kempner, plan) == pytest.approx((4 * 2 * 4 * psi / 4, 6 * psi / 4))
    titan = next(r for r in all_runs() if r.name.startswith("torchtitan Llama 3.1 8B, 8 H100 500W, FSDP, b2"))
    psi = titan.workload.model.num_parameters
    plan = SimpleNamespace(layout=SimpleNamespace(zero=ZeroStage.PARAMETERS, dp=8, tp=1, pp=1, micro_batch=2))
    assert not titan.workload.fp32_grads and fsdp2_copy_bytes(titan, plan) == pytest.approx((2 * 4 * psi, 6 * psi))
    plan.layout.pp, plan.layout.dp, plan.layout.micro_batch = 2, 4, 1  # 4 micro-batches, one stage of two
    assert fsdp2_copy_bytes(titan, plan) == pytest.approx((4 * psi / 2, 6 * psi / 2))
    plan.layout.zero = ZeroStage.NONE
    assert fsdp2_copy_bytes(titan, plan) == (0.0, 0.0)


@pytest.fixture(scope="module")
def evaluated():
    return evaluate_all()


@pytest.mark.slow
def test_layouts_are_the_published_ones_and_the_misses_are_the_known_ones(evaluated):
    """Each plan keeps its row's t, dp and micro-batch; no layout is rejected; the rows outside +-15 % are the known
    ones (the ratchet), and every FSDP-only / one-GPU row is within +-15 % (the H200 preset with no stack clock)."""
    layouts = [(gpus, tp, b) for exp, gpus, size, tp, b, *_rest in KEMPNER_ROWS]
    layouts += [(gpus, 4, kempner_weak_setting(size, gpus)[0]) for size, gpus, *_rest in KEMPNER_WEAK_ROWS]
    layouts += [(gpus, tp, b) for config, gpus, tp, b, *_rest in KEMPNER_VALIDATION_ROWS]
    for r, (gpus, tp, b) in zip(evaluated, layouts, strict=True):
        assert r.error is not None and r.layout.startswith(f"tp{tp} pp1 dp{gpus // tp} v1 b{b} "), r.layout
    outside = {r.run.name for r in evaluated if abs(r.error) > 0.15}
    assert outside <= KNOWN_MISSES, f"rows that left +-15 %: {sorted(outside - KNOWN_MISSES)}"
    assert all(abs(r.error) <= 0.15 for r in evaluated if " TP " not in r.run.name)


@pytest.mark.slow
def test_docs_hold_what_the_module_prints(evaluated):
    """docs/planner/rounds.md "Round 15" holds every row and summary line as the code computes them, and the TP rows'
    missing-time table (regenerate: python -m hybrid.planner.published15 [--tp-missing])."""
    with open(os.path.join(ROOT, "docs", "planner", "rounds.md")) as f:
        docs = f.read()
    for line in report(evaluated).splitlines():
        if line.startswith("| KempnerForge") or ": " in line and "rows" in line:
            assert line in docs, line
    assert summary_line("all round-15 check rows", evaluated) in docs
    for line in tp_missing(evaluated).splitlines():
        assert line in docs, line
