"""The planner on published runs outside shared/reference (hybrid/planner/published.py): the numbers
docs/planner/validation.md reports ("Published runs") are the ones the code computes, each layout is the published one,
the fit / check split holds (only the rows that fitted a constant are FIT rows, and each names it), and the Llama 3
405B layout's 126 layers go on 16 ranks with the edge stages one layer short, as the paper ran."""

from __future__ import annotations

import math
import os

import pytest

from hybrid.planner.layout import Recompute, stage_layers
from hybrid.planner.model import ActivationProfile
from hybrid.planner.published import (MPT_FP8_ROWS, MPT_FP8_TABLE_ROWS, MPT_MORE_ROWS, MPT_ROWS, MPT_SIZES, NARAYANAN_REST, Metric, Role, all_runs, check,
                                      korthikanti_runs, mpt_model, narayanan_runs, published_runs, shown, summaries,
                                      summary, table, torchtitan_runs)

RUNS = published_runs()
KORTHIKANTI = korthikanti_runs()
# name -> (layout the planner reports, prediction as the table shows it, throughput error in %: + optimistic)
DOCUMENTED = {
    'BLOOM-176B, 384 A100 80GB, t4 p12 d8': ('tp4 pp12 dp8 v1 b2 z1 full', '104.5', 0.2),
    'Llama 3 405B, 8192 H100, t8 p16 d64': ('tp8 pp16 dp64 v4 b1 z1 sp full', '400.7', -6.8),
    'Llama 3 405B, 16384 H100, t8 p16 d128': ('tp8 pp16 dp128 v4 b1 z1 sp selective-op', '414.7', 3.7),
    '22B, 8 A100 80GB, t8 p1 d1 v1, full recompute': ('tp8 pp1 dp1 v1 b4 z0 full', '1.42', -0.1),
    '22B, 8 A100 80GB, t8 p1 d1 v1, selective + SP': ('tp8 pp1 dp1 v1 b4 z0 sp selective', '1.07', 3.1),
    '175B, 64 A100 80GB, t8 p8 d1 v3, full recompute': ('tp8 pp8 dp1 v3 b1 z0 full', '18.3', -0.8),
    '175B, 64 A100 80GB, t8 p8 d1 v3, selective + SP': ('tp8 pp8 dp1 v3 b1 z0 sp selective', '13.5', 1.9),
    '530B, 280 A100 80GB, t8 p35 d1 v3, full recompute': ('tp8 pp35 dp1 v3 b1 z0 full', '52.9', -7.4),
    '530B, 280 A100 80GB, t8 p35 d1 v3, selective + SP': ('tp8 pp35 dp1 v3 b1 z0 sp selective', '39.3', -3.8),
    '1T, 512 A100 80GB, t8 p64 d1 v1, full recompute': ('tp8 pp64 dp1 v1 b1 z0 full', '102.8', -8.1),
    '1T, 512 A100 80GB, t8 p64 d1 v1, selective + SP': ('tp8 pp64 dp1 v1 b1 z0 sp selective', '77.2', -7.4),
    'MT-NLG 530B, 2240 A100 80GB, t8 p35 d8': ('tp8 pp35 dp8 v1 b2 z1 full', '56.8', 5.8),
    'MT-NLG 530B, 2800 A100 80GB, t8 p35 d10': ('tp8 pp35 dp10 v1 b2 z1 full', '48.0', 4.6),
    'MT-NLG 530B, 3360 A100 80GB, t8 p35 d12': ('tp8 pp35 dp12 v1 b2 z1 full', '42.1', 5.5),
    'torchtitan Llama 3 8B, 64 A100, FSDP, b1, selective-op': ('tp1 pp1 dp64 v1 b1 z3 selective-op', '2966.7', -0.2),
    'torchtitan Llama 3 70B, 64 A100, FSDP, b1, full': ('tp1 pp1 dp64 v1 b1 z3 full', '333.1', 0.6),
    'torchtitan Llama 2 13B, 64 A100, FSDP, b2, no AC': ('tp1 pp1 dp64 v1 b2 z3 none', '2109.8', -2.4),
    'torchtitan Llama 2 13B, 64 A100, FSDP, b2, selective-op': ('tp1 pp1 dp64 v1 b2 z3 selective-op', '1861.3', -2.2),
    'torchtitan Llama 2 70B, 64 A100, FSDP, b1, selective-op': ('tp1 pp1 dp64 v1 b1 z3 selective-op', '364.3', 2.6),
    'torchtitan Llama 2 70B, 64 A100, FSDP, b2, full': ('tp1 pp1 dp64 v1 b2 z3 full', '350.6', -0.7),
    'torchtitan Llama 3.1 8B, 8 H100 500W, FSDP, b2, selective-op': ('tp1 pp1 dp8 v1 b2 z3 selective-op', '5759.9', -0.0),
    'torchtitan Llama 3.1 8B, 8 H100 500W, FSDP + compile, b2, selective-op': ('tp1 pp1 dp8 v1 b2 z3 selective-op', '6898.4', 3.5),
    'torchtitan Llama 3.1 8B, 8 H100 500W, FSDP + compile + Float8, b2, selective-op': ('tp1 pp1 dp8 v1 b2 z3 selective-op', '8815.5', 3.3),
    'torchtitan Llama 3.1 8B, 128 H100 500W, FSDP, b2, selective-op': ('tp1 pp1 dp128 v1 b2 z3 selective-op', '5753.2', 2.6),
    'torchtitan Llama 3.1 8B, 128 H100 500W, FSDP + compile, b2, selective-op': ('tp1 pp1 dp128 v1 b2 z3 selective-op', '6897.6', 5.9),
    'torchtitan Llama 3.1 70B, 256 H100 500W, FSDP 32 x TP 8 + compile + Float8, b16, full': ('tp8 pp1 dp32 v1 b16 z3 sp full', '833.3', 0.5),
    'torchtitan Llama 3.1 405B, 512 H100 500W, FSDP 8 x TP 8 x PP 8 1F1B + compile + Float8, b4 x 8, full': ('tp8 pp8 dp8 v1 b4 z3 sp full', '96.1', -3.9),
    'torchtitan Llama 3.1 405B, 512 H100 500W, FSDP 8 x TP 8 x PP 8 interleaved 1F1B + compile + Float8, b4 x 8, full': ('tp8 pp8 dp8 v2 b4 z3 sp full', '125.9', -1.7),
    'NeMo Llama 3 8B FP8, 8 H100, FSDP, b1': ('tp1 pp1 dp8 v1 b1 z3 none', '12965.4', -7.9),
    'NeMo Llama 3 70B FP8, 64 H100, t4 p8 v5, b1': ('tp4 pp8 dp2 v5 b1 z1 sp none', '1495.4', -7.6),
    'Narayanan 3.6B, 64 A100 80GB, t2 p1 d32': ('tp2 pp1 dp32 v1 b16 z0 full', '147.1', 6.6),
    'Narayanan 18.4B, 256 A100 80GB, t8 p1 d32': ('tp8 pp1 dp32 v1 b16 z0 full', '140.7', 4.2),
    'Narayanan 76.1B, 1024 A100 80GB, t8 p4 d32': ('tp8 pp4 dp32 v4 b2 z0 full', '153.2', 9.4),
    'Narayanan 310.1B, 1920 A100 80GB, t8 p16 d15': ('tp8 pp16 dp15 v3 b1 z0 full', '164.9', 6.4),
    'Narayanan 529.6B, 2520 A100 80GB, t8 p35 d9': ('tp8 pp35 dp9 v1 b1 z0 full', '159.7', -2.0),
    'MPT-70b, s 2048, 512 H100, FSDP z3, b8 x 1, AC': ('tp1 pp1 dp512 v1 b8 z3 full', '982.2', -2.5),
    'MPT-70b, s 2048, 128 H100, FSDP z3, b8 x 1, AC': ('tp1 pp1 dp128 v1 b8 z3 full', '982.1', -7.2),
    'MPT-30b, s 2048, 256 H100, FSDP z3, b8 x 1, AC': ('tp1 pp1 dp256 v1 b8 z3 full', '2019.9', -6.0),
    'MPT-13b, s 2048, 512 H100, FSDP z3, b16 x 1, AC': ('tp1 pp1 dp512 v1 b16 z3 full', '4647.8', -6.1),
    'MPT-7b, s 2048, 512 H100, FSDP z3, b6 x 1': ('tp1 pp1 dp512 v1 b6 z3 none', '10271.9', 6.2),
    'MPT-7b, s 2048, 128 H100, FSDP z3, b6 x 1': ('tp1 pp1 dp128 v1 b6 z3 none', '10269.6', -2.0),
    'MPT-3b, s 2048, 256 H100, FSDP z2, b8 x 1': ('tp1 pp1 dp256 v1 b8 z2 none', '23821.7', 4.6),
    'MPT-1b, s 2048, 128 H100, FSDP z2, b12 x 1': ('tp1 pp1 dp128 v1 b12 z2 none', '45601.0', 3.3),
    'MPT-70b, s 2048, 64 H100, FSDP z3, b8 x 4, AC': ('tp1 pp1 dp64 v1 b8 z3 full', '962.8', -7.3),
    'MPT-30b, s 2048, 8 H100, FSDP z3, b3 x 21, AC': ('tp1 pp1 dp8 v1 b3 z3 full', '1949.6', -2.6),
    'MPT-13b, s 2048, 8 H100, FSDP z3, b2 x 1': ('tp1 pp1 dp8 v1 b2 z3 none', '4827.9', 0.7),
    'MPT-13b, s 4096, 8 H100, FSDP z3, b10 x 3, AC': ('tp1 pp1 dp8 v1 b10 z3 full', '4281.7', -9.2),
    'MPT-7b, s 2048, 8 H100, FSDP z3, b6 x 1': ('tp1 pp1 dp8 v1 b6 z3 none', '10089.3', -5.2),
    'MPT-7b, s 8192, 8 H100, FSDP z3, b8 x 2, AC': ('tp1 pp1 dp8 v1 b8 z3 full', '6436.1', -7.2),
    'MPT-3b, s 2048, 16 H100, FSDP z3, b10 x 3': ('tp1 pp1 dp16 v1 b10 z3 none', '22924.2', -5.0),
    'MPT-1b, s 2048, 8 H100, FSDP z3, b14 x 1': ('tp1 pp1 dp8 v1 b14 z3 none', '43355.3', -4.6),
    'MPT-70b, s 2048, 64 A100, FSDP z3, b8 x 4, AC': ('tp1 pp1 dp64 v1 b8 z3 full', '408.5', -0.4),
    'MPT-30b, s 2048, 8 A100, FSDP z3, b3 x 21, AC': ('tp1 pp1 dp8 v1 b3 z3 full', '833.6', -9.0),
    'MPT-13b, s 2048, 8 A100, FSDP z3, b2 x 3': ('tp1 pp1 dp8 v1 b2 z3 none', '2187.5', -3.3),
    'MPT-13b, s 4096, 8 A100, FSDP z3, b10 x 3, AC': ('tp1 pp1 dp8 v1 b10 z3 full', '1866.1', -9.4),
    'MPT-7b, s 2048, 8 A100, FSDP z3, b6 x 2': ('tp1 pp1 dp8 v1 b6 z3 none', '4428.5', -4.6),
    'MPT-7b, s 8192, 8 A100, FSDP z3, b8 x 2, AC': ('tp1 pp1 dp8 v1 b8 z3 full', '2982.6', -7.0),
    'MPT-3b, s 2048, 8 A100, FSDP z3, b10 x 2': ('tp1 pp1 dp8 v1 b10 z3 none', '10349.9', -4.3),
    'MPT-1b, s 2048, 8 A100, FSDP z3, b14 x 4': ('tp1 pp1 dp8 v1 b14 z3 none', '19923.5', -2.9),
    'MPT-70b, s 2048, 32 H100, FSDP z3, b2 x 16, AC': ('tp1 pp1 dp32 v1 b2 z3 full', '837.3', -5.1),
    'MPT-30b, s 4096, 8 H100, FSDP z3, b1 x 21, AC': ('tp1 pp1 dp8 v1 b1 z3 full', '1738.7', -3.5),
    'MPT-30b, s 2048, 32 H100, FSDP z3, b14 x 3, AC': ('tp1 pp1 dp32 v1 b14 z3 full', '2067.8', -10.4),
    'MPT-30b, s 2048, 16 H100, FSDP z3, b10 x 3, AC': ('tp1 pp1 dp16 v1 b10 z3 full', '2044.0', -9.7),
    'MPT-13b, s 2048, 64 H100, FSDP z3, b2 x 1': ('tp1 pp1 dp64 v1 b2 z3 none', '4606.1', -4.0),
    'MPT-13b, s 2048, 16 H100, FSDP z3, b2 x 1': ('tp1 pp1 dp16 v1 b2 z3 none', '4585.1', -3.8),
    'MPT-7b, s 4096, 8 H100, FSDP z3, b16 x 2, AC': ('tp1 pp1 dp8 v1 b16 z3 full', '7823.1', -9.2),
    'MPT-3b, s 4096, 8 H100, FSDP z3, b5 x 6': ('tp1 pp1 dp8 v1 b5 z3 none', '20181.7', -3.7),
    'MPT-3b, s 2048, 64 H100, FSDP z3, b6 x 3': ('tp1 pp1 dp64 v1 b6 z3 none', '22191.6', -1.5),
    'MPT-1b, s 4096, 8 H100, FSDP z3, b7 x 4': ('tp1 pp1 dp8 v1 b7 z3 none', '37411.5', -2.9),
    'MPT-30b, s 8192, 8 H100, FSDP z3, b1 x 21, AC': ('tp1 pp1 dp8 v1 b1 z3 full', '1599.6', 15.6),
    'MPT-13b, s 16384, 8 H100, FSDP z3, b3 x 3, AC': ('tp1 pp1 dp8 v1 b3 z3 full', '2813.5', -5.7),
    'MPT-3b, s 8192, 8 H100, FSDP z3, b3 x 6': ('tp1 pp1 dp8 v1 b3 z3 none', '15951.8', -3.8),
    'MPT-1b, s 2048, 64 H100, FSDP z3, b20 x 1': ('tp1 pp1 dp64 v1 b20 z3 none', '43687.6', -1.6),
    'MPT-1b, s 2048, 16 H100, FSDP z3, b20 x 1': ('tp1 pp1 dp16 v1 b20 z3 none', '43667.1', -5.1),
    'MPT-3b, s 8192, 8 H100, FSDP z3, b3 x 6, FP8': ('tp1 pp1 dp8 v1 b3 z3 none', '19613.1', 2.4),
    'MPT-3b, s 2048, 8 H100, FSDP z3, b10 x 6, FP8': ('tp1 pp1 dp8 v1 b10 z3 none', '31914.6', 4.3),
    'MPT-1b, s 8192, 8 H100, FSDP z3, b2 x 4, FP8': ('tp1 pp1 dp8 v1 b2 z3 none', '33440.5', 4.5),
    'MPT-3b, s 32768, 8 H100, FSDP z3, b3 x 6, AC, FP8': ('tp1 pp1 dp8 v1 b3 z3 full', '6093.3', 4.1),
    'MPT-3b, s 512, 8 H100, FSDP z3, b40 x 6, FP8': ('tp1 pp1 dp8 v1 b40 z3 none', '37759.0', 3.4),
    'MPT-1b, s 32768, 8 H100, FSDP z3, b1 x 4, FP8': ('tp1 pp1 dp8 v1 b1 z3 none', '13196.9', 4.9),
    'MPT-1b, s 512, 8 H100, FSDP z3, b56 x 4, FP8': ('tp1 pp1 dp8 v1 b56 z3 none', '69022.5', -1.8),
    'OLMo-core 7B, 8 H100, FSDP2 + compile, b2, no AC': ('tp1 pp1 dp8 v1 b2 z3 none', '9514.7', -4.9),
    'OLMo-core 13B, 8 H100, FSDP2 + compile, b1, no AC': ('tp1 pp1 dp8 v1 b1 z3 none', '4949.7', 7.6),
    # round 25: the 7B ran HSDP (fms-fsdp README at 5e522b4; was 'FSDP', ZeRO 3 over 96: 8139.3, +8.5 %)
    'fms-fsdp Llama 2 7B, 96 H100, HSDP 8 x 12, b2, no AC': ('tp1 pp1 dp96 v1 b2 z3 hsdp8x12 none', '7999.3', 6.7),
    'fms-fsdp CodeLlama-34B shape, 96 H100, FSDP, b2, full AC': ('tp1 pp1 dp96 v1 b2 z3 full', '1552.2', 0.1),
    'fms-fsdp Llama 2 70B, 96 H100, FSDP, b2, full AC': ('tp1 pp1 dp96 v1 b2 z3 full', '788.5', -1.4),
    "float8 blog Llama 3 8B bf16, 128 H100, FSDP2 + compile (batch, AC: planner's)": ('tp1 pp1 dp128 v1 b1 z3 none', '7578.9', -5.3),
    'torchtitan Llama 3.1 405B, 128 H100 94GB, FSDP 16 x TP 8, b2, full (2024)': ('tp8 pp1 dp16 v1 b2 z3 sp full', '107.0', -1.8),
}
# check rows the model misses by more than 15 % (docs/planner/validation.md and rounds.md say why); a fix must move them
# here MT-NLG's three rows left it in issue 26's second round; MosaicML's 16 MPT rows on H100 (eager FSDP) left it in
# the fifth, with the H100's eager clock (hardware.H100_EAGER_CLOCK) fitted on the six single-node ones
# the rows added for item 3 of the fifth round (more of MosaicML's H100 tables, all CHECK) that miss: the 13B at
# b 2 without checkpointing on 16 and 64 GPUs (like its 8-GPU fit row, +14.3 %) and two of the three FP8 rows
# MPT-13B at b 2 on 16 / 64 H100 and OLMo-core 13B left this set with the ZeRO 3 overlap cost (sixth round:
# +16.4 / +17.0 / +16.0 % -> +0.2 / -0.0 / +10.5 %, docs/planner/rounds.md "Overlapped ZeRO 3 collectives are not free")
# round 18 priced llm-foundry's Triton attention at its own rate (AttentionKernel.TRITON): the two FP8 rows at s 8192
# (+17.8 / +20.4 %) and the FP8 table's two at s 32768 (+29.1 / +30.5 %) came in (docs/planner/rounds.md "Round 18");
# the 30B at s 8192 (+24.0 %, round 7's unexplained 83.4 GB row) is now one of the Triton share's 16 fit rows, still
# out (+15.9 %)
KNOWN_MISSES = {"MPT-30b, s 8192, 8 H100, FSDP z3, b1 x 21, AC"}
LONG_SEQUENCE_MISSES: set[str] = set()
KNOWN_MISSES = KNOWN_MISSES | LONG_SEQUENCE_MISSES

_CHECKED: dict[str, tuple] = {}


def _check(run):
    """check(run) once per run for the whole module (the 530B and 1T simulations take seconds)."""
    if run.name not in _CHECKED:
        _CHECKED[run.name] = check(run)
    return _CHECKED[run.name]


def _id(run) -> str:
    return run.name.replace(" ", "-").replace(",", "")


@pytest.mark.parametrize("run", all_runs(), ids=_id)
def test_each_published_run_predicts_what_the_docs_report(run):
    plan, got, err = _check(run)
    layout, value, error = DOCUMENTED[run.name]
    assert plan.layout.short() == layout
    assert shown(got) == value and round(100 * err, 1) == error
    assert (plan.layout.tp, plan.layout.pp, plan.layout.dp) == (run.space.tp[0], run.space.pp[0],
                                                                run.gpus // (run.space.tp[0] * run.space.pp[0]))
    assert (abs(err) > 0.15) == (run.name in KNOWN_MISSES)


def test_docs_table_and_summary_are_the_ones_the_module_prints():
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "planner", "validation.md")) as f:
        docs = f.read()
    runs = all_runs()
    for run in runs:  # warm the cache so table() and summaries() reuse the plans
        _check(run)
    for line in table(runs).splitlines()[2:]:
        assert line in docs
    for line in summaries(runs).splitlines():
        assert line in docs


def test_fit_rows_name_their_constant_and_check_rows_fit_nothing():
    """Held-out discipline in code: the A100's GEMM asymptote is fitted on Korthikanti's 22B step, the 500 W H100's
    clock on torchtitan's Table 1, the 700 W H100's eager clock on MosaicML's six single-node H100 rows and six of its
    FlashAttention-2 rows at 128-512 GPUs (six more in published_more.py) and the Triton kernel's share on three
    long-sequence H100 rows here (13 there; fit.py re-derives each) and they say so; every other row only checks."""
    fit = {r.name: r.fits for r in all_runs() if r.role is Role.FIT}
    eager = "H100_EAGER_CLOCK (fit.fit_h100_eager_clock)"
    triton = "TRITON_FLASH2_SHARE (fit.fit_triton_flash2_share)"
    assert fit == {"22B, 8 A100 80GB, t8 p1 d1 v1, full recompute": "A100_EFFICIENCY (fit.fit_a100_efficiency)",
                   "torchtitan Llama 3.1 8B, 8 H100 500W, FSDP, b2, selective-op":
                       "H100_500W_CLOCK (fit.fit_h100_500w_clock)",
                   "MPT-30b, s 2048, 8 H100, FSDP z3, b3 x 21, AC": eager,
                   "MPT-13b, s 2048, 8 H100, FSDP z3, b2 x 1": eager,
                   "MPT-13b, s 4096, 8 H100, FSDP z3, b10 x 3, AC": eager,
                   "MPT-7b, s 2048, 8 H100, FSDP z3, b6 x 1": eager,
                   "MPT-7b, s 8192, 8 H100, FSDP z3, b8 x 2, AC": eager,
                   "MPT-1b, s 2048, 8 H100, FSDP z3, b14 x 1": eager,
                   "MPT-70b, s 2048, 512 H100, FSDP z3, b8 x 1, AC": eager,
                   "MPT-70b, s 2048, 128 H100, FSDP z3, b8 x 1, AC": eager,
                   "MPT-7b, s 2048, 512 H100, FSDP z3, b6 x 1": eager,
                   "MPT-7b, s 2048, 128 H100, FSDP z3, b6 x 1": eager,
                   "MPT-3b, s 2048, 256 H100, FSDP z2, b8 x 1": eager,
                   "MPT-1b, s 2048, 128 H100, FSDP z2, b12 x 1": eager,
                   "MPT-30b, s 8192, 8 H100, FSDP z3, b1 x 21, AC": triton,
                   "MPT-13b, s 16384, 8 H100, FSDP z3, b3 x 3, AC": triton,
                   "MPT-3b, s 8192, 8 H100, FSDP z3, b3 x 6": triton}
    assert all(not r.fits for r in all_runs() if r.role is Role.CHECK)


def test_check_row_errors_lean_both_ways_and_summary_counts_them():
    check_runs = [r for r in all_runs() if r.role is Role.CHECK]
    errors = [_check(r)[2] for r in check_runs]
    assert min(errors) < 0 < max(errors)
    s = summary(errors)
    assert s.rows == len(errors) and s.within_15 == len(errors) - len(KNOWN_MISSES & {r.name for r in check_runs})
    assert s.low == min(errors) and s.high == max(errors)


def test_torchtitan_selective_op_run_is_predicted_to_fit_near_what_it_used():
    """torchtitan's Table 1 (op-level SAC, 8 GPUs, b 2 at s 8192) used 82.4 GiB (88.5 GB) of a 96 GB card; the
    planner's selective-op puts it within 10 % of that and under the card -- Megatron's selective (attention core
    only) would not fit."""
    run = next(r for r in torchtitan_runs() if r.role is Role.FIT)
    plan = _check(run)[0]
    assert plan.layout.recompute is Recompute.SELECTIVE_OP
    assert plan.memory_gb == pytest.approx(run.memory_gib * 2**30 / 1e9, rel=0.10)
    assert plan.memory.peak.total <= run.hardware().capacity_bytes


def test_korthikanti_table5_is_both_recomputation_modes_on_each_table3_layout():
    """Full recomputation without SP, and selective with SP, on the same layout of each of the four models;
    the paper gains 29-32 % from the second, and the planner's ratio falls within 29-38 %."""
    assert [r.space.recompute for r in KORTHIKANTI] == [(Recompute.FULL,), (Recompute.SELECTIVE,)] * 4
    assert [r.space.sequence_parallel for r in KORTHIKANTI] == [(False,), (True,)] * 4
    for full, selective in zip(KORTHIKANTI[::2], KORTHIKANTI[1::2]):
        assert full.workload == selective.workload and full.space.pp == selective.space.pp
        predicted = _check(full)[1] / _check(selective)[1]
        assert 1.29 <= full.published / selective.published <= 1.33 and 1.29 <= predicted <= 1.38


def test_bloom_is_compared_on_step_time_and_llama_on_model_flops():
    assert [r.metric for r in RUNS] == [Metric.STEP_S, Metric.MODEL_TFLOPS, Metric.MODEL_TFLOPS]
    assert [r.workload.fp32_grads for r in RUNS] == [True, False, False]  # BLOOM's BF16_Optimizer: fp32 gradients
    assert RUNS[0].workload.global_batch * RUNS[0].workload.seq_length == 2048 * 2048


def test_llama_is_planned_with_flash_attention_and_bloom_with_the_materialised_softmax():
    """BLOOM's Megatron-DeepSpeed (2022) materialised the s x s softmax; at s 8192 the Llama rows assume flash
    attention (docs/planner/validation.md says so): without it the planner counts 2.1 GB of scores per layer."""
    assert RUNS[0].workload.activations is ActivationProfile.KORTHIKANTI
    assert {r.workload.activations for r in RUNS[1:]} == {ActivationProfile.BF16_FLASH}


def test_llama_405b_stages_have_fewer_layers_at_both_ends():
    cfg = RUNS[1].workload.model
    assert stage_layers(cfg, 16, 1, 8192) == (7,) + (8,) * 14 + (7,)


def test_docs_held_out_tables_are_the_ones_heldout_computes():
    """docs/planner/validation.md "Held-out error": the summary over every source (these runs, shared/reference's
    Narayanan rows, our H200, this CPU) and the H200 rows, recomputed here so the page cannot drift from the code."""
    from hybrid.planner import heldout
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "planner", "validation.md")) as f:
        docs = f.read()
    rows = heldout.all_rows(check=_check)
    for line in heldout.summary_table(rows).splitlines() + heldout.detail_table(rows).splitlines()[2:]:
        assert line in docs


def test_narayanan_rows_are_the_other_five_of_table_1_and_hang_together():
    """The five rows added to shared/reference's five: none repeats one of those; each row's GPUs = t p d, its
    batch splits over d, its parameter count by eq. (2) is the stated size, and TFLOP/s x GPUs / 1e3 is the
    paper's aggregate PFLOP/s column (4.4 ... 502.0 for all ten, these five: 8.8, 34.6, 143.8, 297.4, 410.2)."""
    from hybrid.planner.reference import megatron_rows
    assert not {r.params_billion for r in megatron_rows()} & {row[0] for row in NARAYANAN_REST}
    aggregate = (8.8, 34.6, 143.8, 297.4, 410.2)
    for (billions, heads, h, layers, tp, pp, gpus, batch, tflops, peak), pflops in zip(NARAYANAN_REST, aggregate):
        dp = gpus // (tp * pp)
        assert tp * pp * dp == gpus and batch % dp == 0 and h % heads == 0 and layers % pp == 0
        params = 12 * layers * h * h * (1 + 13 / (12 * h) + (51200 + 2048) / (12 * layers * h))
        assert params / 1e9 == pytest.approx(billions, abs=0.06)
        assert tflops * gpus / 1e3 == pytest.approx(pflops, abs=0.6)
        assert tflops / 312 == pytest.approx(peak / 100, abs=0.006)
    assert all(r.metric is Metric.MEGATRON_TFLOPS and r.role is Role.CHECK for r in narayanan_runs())


def test_mpt_rows_plan_the_benchmarked_models_and_the_h100_check_rows_hold_with_the_eager_clock():
    """Each MPT row's model has the table's NumParams exactly -- 12 L d^2 + 13 L d + (V + s) d + 2 d, a GPT-2
    block with learned positions of the row's length, V = 50368. With the H100's eager clock fitted on the six
    single-node rows and the 12 FlashAttention-2 rows (six of them here; their mean log error 0, the Triton share
    beside it: docs/planner/rounds.md "Round 18"), the four 16-512 GPU H100 rows that fit nothing (Triton) are within 15
    %, leaning low as round 18's short Triton rows do, and so are the 8 A100 rows."""
    for _, size, seq, gpus, mb, accum, tokens, zero, checkpointing, _, numparams in MPT_ROWS + MPT_MORE_ROWS + \
            MPT_FP8_ROWS + MPT_FP8_TABLE_ROWS:
        layers, d, _ = MPT_SIZES[size]
        assert 12 * layers * d * d + 13 * layers * d + (50368 + seq) * d + 2 * d == numparams
        cfg = mpt_model(size, seq)
        assert (cfg.num_layers, cfg.hidden_size, cfg.max_position_embeddings, cfg.dropout) == (layers, d, seq, 0.0)
    mpt = [r for r in all_runs() if r.name.startswith("MPT-")][:len(MPT_ROWS)]
    assert len(MPT_ROWS) == 24
    fit = [r for r in mpt if r.role is Role.FIT and r.gpus == 8]
    assert {(r.gpu, r.gpus) for r in fit} == {("h100-80g", 8)} and len(fit) == 6
    flash2 = [r for r in mpt if r.role is Role.FIT and r.gpus > 8]
    assert len(flash2) == 6 and all(r.gpus >= 128 and r.fits.startswith("H100_EAGER_CLOCK") for r in flash2)
    # their clock is fitted on them and the 12 FlashAttention-2 rows together (round 18), the Triton share beside it:
    # these six alone sit at -4.5 % mean, each within 10 %
    assert sum(math.log1p(_check(r)[2]) for r in fit) / 6 == pytest.approx(-0.045, abs=0.01)
    assert all(abs(_check(r)[2]) < 0.10 for r in fit)
    h100 = [_check(r)[2] for r in mpt if r.gpu == "h100-80g" and r.role is Role.CHECK]
    assert len(h100) == 4 and all(-0.10 < e < 0 for e in h100)  # -4.8 to -7.0 %
    assert all(abs(_check(r)[2]) <= 0.15 for r in mpt if r.gpu == "a100-80g")  # 8 A100 rows: all within


def test_docs_mpt_decomposition_is_the_one_the_module_prints():
    """docs/planner/rounds.md "Why eager FSDP on H100 was optimistic": every MPT row's step at the curve's full rate,
    taken apart into --explain's terms, with the clock (tensor-core work) and the GEMM-only asymptote that would
    make it exact -- the table the cause is read from, recomputed so it cannot drift."""
    from hybrid.planner.published import mpt_decomposition
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "planner", "rounds.md")) as f:
        docs = f.read()
    lines = mpt_decomposition().splitlines()
    assert len(lines) == 2 + len(MPT_ROWS)
    for line in lines:
        assert line in docs


def test_more_mpt_h100_rows_are_check_rows_planned_as_published():
    """Item 3 of the fifth round: fifteen more rows of MosaicML's H100 BF16 table (16-64 GPUs, s 4096-16384) and three of
    its FP8 table (Transformer Engine linears: --fp8), every one a CHECK row on its published layout, FP8 only
    where the table says amp_fp8; their errors are what docs/planner/validation.md reports, misses included
    (KNOWN_MISSES)."""
    extra = [r for r in all_runs() if r.name.startswith("MPT-")][len(MPT_ROWS):len(MPT_ROWS) + 18]
    assert len(extra) == len(MPT_MORE_ROWS) + len(MPT_FP8_ROWS) == 18
    assert all(r.gpu == "h100-80g" and (r.role is Role.FIT) == r.fits.startswith("TRITON_FLASH2_SHARE")
               for r in extra)
    assert sum(r.role is Role.FIT for r in extra) == 3  # the bf16 rows at s >= 8192 (round 18: the Triton share's)
    assert [r.workload.fp8 for r in extra] == [False] * 15 + [True] * 3
    assert {r.name for r in extra if abs(_check(r)[2]) > 0.15} == {n for n in KNOWN_MISSES if n.startswith("MPT-")} \
        - LONG_SEQUENCE_MISSES


def test_the_checkpointing_lean_table_is_the_codes():
    """docs/planner/rounds.md "Overlapped ZeRO 3 collectives are not free": the FSDP rows' (ZeRO 2/3) mean error and
    spread without and with full checkpointing, fit and check rows apart -- the last column of its table, from the
    plans this module checks (each error rounded as the published table shows it)."""
    import statistics
    from hybrid.planner.layout import ZeroStage
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "planner", "rounds.md")) as f:
        lines = f.read().splitlines()

    mpt = [r for r in all_runs() if r.name.startswith("MPT-")]  # the table is the sixth round's rows
    seventh = {r.name for r in mpt[-len(MPT_FP8_TABLE_ROWS):]}

    def cell(role: Role, recompute: Recompute) -> tuple[int, str]:
        errors = []
        for run in all_runs():
            plan, _, err = _check(run)
            if run.name not in seventh and run.role is role and plan.layout.zero >= ZeroStage.GRADIENTS and plan.layout.recompute is recompute:
                errors.append(round(100 * err, 1))
        return len(errors), (f"{statistics.fmean(errors):+.1f} ({min(errors):+.1f}..{max(errors):+.1f})")

    for role in (Role.FIT, Role.CHECK):
        (n_none, none), (n_full, full) = cell(role, Recompute.NONE), cell(role, Recompute.FULL)
        head = f"| {role.value}, no AC ({n_none}) / full AC ({n_full}): mean (spread) |"
        row = next(line for line in lines if line.startswith(head))
        assert row.endswith(f"| {none} / {full} % |"), row
