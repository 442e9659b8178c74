"""Issue 26, seventh round: more published runs as CHECK rows (hybrid/planner/published_more.py). Each row is
predicted and its error reported (docs/planner/rounds.md "More check rows, round 7" is the code's table); nothing is
fitted to them. What holds now is asserted as a ratchet: every published layout is predicted to fit, and every
row outside
KNOWN_MISSES stays within +-15 %. A physics change that brings a miss inside may drop it from KNOWN_MISSES; one
that pushes a row out must say why. The table's numbers move with the planner's physics: regenerate the docs
section with `python -m hybrid.planner.published_more`."""

from __future__ import annotations

import os

import pytest

from hybrid.planner.published import Role, all_runs, more_check_runs
from hybrid.planner.layout import ZeroStage
from hybrid.planner.published_more import (GROUPS, MCORE_VOCAB, MCORE_WEAK, MPT_A100_MORE, MPT_H100_MORE,
                                           MPT_MORE_SIZES, NEMO_2407_ROWS, NEMO_LONG_ROWS, ContextRun, evaluate,
                                           miss_table, more_runs, nemo_long_runs, role_summaries, table)
from hybrid.planner.time import model_flops

# rows outside +-15 % at this commit (docs/planner/rounds.md "More check rows, round 7" gives each one's reading)
KNOWN_MISSES = {
    # Megatron-Core r0.8.0 weak scaling, planned with the --overlap-grad-reduce it states (round 8): small models
    # optimistic, and the pipeline at p 16 (the 177B +14.5 -> +16.0 % when its DP reduction hid); the 32B at
    # t 8 (-19.8 %) came in (-2.1 %); round 10: the hidden ZeRO 1-2 parameter all-gather pays the overlap cost too
    # (--overlap-param-gather), which brought in the 177B (+15.4 -> +14.8 %); round 19's H100 GEMM ceiling (every
    # linear of these rows lies beyond XLA's table) brought in the 462B at p 16 (+17.6 -> +13.9 %)
    # round 25 priced the loss the rows' code ran (Megatron-core's unfused vocab-parallel loss, its in-place softmax
    # pass: Workload.megatron_unfused_loss), which brought in the 7.1B (+15.6 -> +14.8 %); the 1.7B +26.2 -> +23.1 %
    "Megatron-Core 1.7B, 48 H100, t1 p1 d48",
    # (NeMo 24.07 GPT3-5B, FP8 at h 4096 optimistic, came in at round 21's review: +15.3 -> +14.4 %, its container
    # runs Megatron's MLP, which pays fc1's bias gradient; NeMo 24.07's Nemotron-340B, -22.2 % with the planner's
    # 4-byte optimizer states and the MLP recomputed to fit, came in at round 24 planned with its config's bf16
    # optimizer states and selective recomputation: -7.1 %, published24b_pipelines)
    # context parallelism, ring steps as half blocks at the flash rate (round 8): NeMo's CP 4-32 and torchtitan's CP 2
    # came in; round 9 priced torch's own ring (one K, V all-gather under one step, fp32 merges, repeated K, V:
    # RingSchedule.TORCH_ALLGATHER), which brought in the 405B at CP 8 (+25.5 -> +13.5 %); the 8B at CP 4-8 on one
    # node still runs ~1.3x slower a ring step than planned (+17.5 / +21.1 %; no term of torch's code left explains it)
    "torchtitan Llama 3.1 8B, 8 H100 500W, FSDP 2 x CP 4, s 131072, b1, full",
    "torchtitan Llama 3.1 8B, 8 H100 500W, FSDP 1 x CP 8, s 262144, b1, full",
    # round 19 pushed the 405B at CP 8 out (+14.2 -> +16.6 %): the GEMM ceiling's refit raised H100_EAGER_CLOCK
    # 0.708 -> 0.735 (its fit rows' GEMMs all lie beyond XLA's table), and the clock scales the flash rate too, which
    # the ceiling does not slow; this row's step is ring attention at s 262144 (docs/planner/round19-gemm-ceiling.md)
    "torchtitan Llama 3.1 405B, 512 H100 500W, TP 8 x PP 8 x FSDP 1 x CP 8, s 262144, b1 x 8, full",
    # MosaicML: round 8 priced the A100 rows' Triton kernel at FlashAttention-1's bars (long rows -15 to -18 %) and
    # the H100 rows' at FlashAttention-2's x the clock (s >= 16384 +18 to +29 %); round 18's one Triton rate
    # (AttentionKernel.TRITON, docs/planner/rounds.md "Round 18") brought all of them in, and the 760M at s 2048 on one
    # H100 node (+15.2 %). Left: the 30B at s 8192 on A100 (+19.6 -> +25.5 %), the 83 GB row of the H100 table's
    # reading
    "MPT-30b, s 8192, 8 A100, FSDP z3, b1 x 21, AC"}
# published layouts the planner rejects as not fitting (none at this commit)
KNOWN_REJECTED: set[str] = set()


@pytest.fixture(scope="module")
def results():
    return {r.run.name: r for r in (evaluate(run) for run in more_runs())}


def test_rows_are_check_rows_new_to_the_repository_and_reachable_from_published():
    """Held-out discipline: every row is a CHECK row that fits no constant but MosaicML's H100 rows that
    published.mpt_fits names (round 18: the FlashAttention-2 rows fit H100_EAGER_CLOCK, the bf16 Triton rows at
    s >= 8192 TRITON_FLASH2_SHARE), none repeats a row of published.all_runs() (by name, or by model, sequence,
    batch, GPUs and card), and published.py reaches them."""
    runs = more_runs()
    assert all((r.role is Role.FIT) == bool(r.fits) for r in runs)
    fit = [r for r in runs if r.role is Role.FIT]
    assert all(r.name.startswith("MPT-") and r.gpu == "h100-80g" for r in fit)
    assert sorted(r.fits.split()[0] for r in fit).count("H100_EAGER_CLOCK") == 6 and len(fit) == 6 + 13
    assert [r.name for r in more_check_runs()] == [r.name for r in runs]
    assert len({r.name for r in runs}) == len(runs)

    def key(r):
        w = r.workload
        return (w.model.num_layers, w.model.hidden_size, w.seq_length, w.global_batch, r.gpus, r.gpu, w.fp8,
                r.space.recompute, getattr(r, "cp", 1))
    old = all_runs()
    assert not {r.name for r in runs} & {r.name for r in old}
    assert not {key(r) for r in runs} & {key(r) for r in old}


def test_mcore_rows_hang_together_with_the_published_table():
    """Megatron-Core's table: each size is 12 L h^2 + 13 L h + 2 V h (untied) + s h + 2 h at V 131072, s 4096 --
    the planned model's own count -- within the table's loose rounding (1.75 is printed 1.7, 31.5 as 32; tied
    embeddings would miss 1.7B and 7.1B by 30 % and 15 %), t p d = GPUs with d 48, and TFLOP/s x GPUs is the
    aggregate column."""
    aggregate = (19.6, 44.7, 93.9, 176.5, 322.3, 645.9, 997.2, 1457.4, 2825.6)
    runs = [r for r in more_runs() if r.name.startswith("Megatron-Core")]
    for (billions, heads, h, layers, tp, pp, gpus, batch, tflops, mfu), pflops, run in zip(MCORE_WEAK, aggregate,
                                                                                            runs):
        params = 12 * layers * h * h + 13 * layers * h + 2 * MCORE_VOCAB * h + 4096 * h + 2 * h
        assert params / 1e9 == pytest.approx(billions, rel=0.035)
        assert run.workload.model.num_parameters == params
        assert tp * pp * 48 == gpus and batch % 48 == 0 and h % heads == 0
        assert tflops * gpus / 1e3 == pytest.approx(pflops, abs=0.1)
        assert 100 * tflops / 989 == pytest.approx(mfu, abs=0.6)


def test_mpt_rows_plan_the_benchmarked_models():
    """Each added MosaicML row's model has the table's NumParams exactly (12 L d^2 + 13 L d + (V + s) d + 2 d,
    V 50368), its card and FSDP sharding are the table's, and (by the first test) no row is one published.py
    already plans."""
    for size, seq, gpus, mb, accum, tokens, zero, ac, fp32, numparams in MPT_A100_MORE + MPT_H100_MORE:
        layers, d, _ = MPT_MORE_SIZES[size]
        assert 12 * layers * d * d + 13 * layers * d + (50368 + seq) * d + 2 * d == numparams
    runs = [r for r in more_runs() if r.name.startswith("MPT-")]
    rows = MPT_A100_MORE + MPT_H100_MORE
    assert [r.workload.model.num_parameters for r in runs] == [row[-1] for row in rows]
    assert [r.gpu for r in runs] == ["a100-80g"] * len(MPT_A100_MORE) + ["h100-80g"] * len(MPT_H100_MORE)
    assert [r.space.zero for r in runs] == [(ZeroStage(row[6]),) for row in rows]


def test_nemo_and_torchtitan_layouts_are_the_published_ones(results):
    """The plan keeps each stated t, p, v, micro-batch and CP size; CP rows go through the CP planner; torchtitan's
    CP rows keep their FSDP and CP sizes, one (8B) or eight (405B) sequences a DP rank."""
    nemo = [r for r in more_runs() if r.name.startswith("NeMo 24.07")]
    assert len(nemo) == len(NEMO_2407_ROWS) == 12
    for run, (_, gpus, gbs, mbs, seq, tp, pp, cp, vp, _) in zip(nemo, NEMO_2407_ROWS):
        assert (run.gpus, run.workload.global_batch, run.workload.seq_length) == (gpus, gbs, seq)
        assert isinstance(run, ContextRun) == (cp > 1)
        layout = results[run.name].layout
        assert layout.startswith(f"tp{tp} pp{pp} dp{gpus // (tp * pp * cp)} v{vp} b{mbs} ")
        assert (f"cp{cp}" in layout) == (cp > 1)
    titan = [r for r in more_runs() if r.name.startswith("torchtitan") and isinstance(r, ContextRun)]
    assert len(titan) == 8
    for run in titan:
        fsdp = int(run.name.split("FSDP ")[1].split(" ")[0])
        layout = results[run.name].layout
        assert f" dp{fsdp} " in layout and (f"cp{run.cp}" in layout) == (run.cp > 1)
        assert run.workload.global_batch == fsdp * (8 if "405B" in run.name else 1)


def test_nemo_long_sequence_rows_are_compared_on_nemos_own_flop_count(results):
    """NeMo's 2024 model-FLOP count for Llama (nemo/utils/flops_formulas.py before its August 2025 causal discount:
    B s L h^2 (12 + 12 g / a + 18 f / h + 12 s / h + 6 V / (L h))) is the planner's model FLOPs exactly, so its
    TFLOP/s column compares like for like; each row keeps its stated t, p, d and cp and 4M tokens a step."""
    for run, (k, gpus, batch, tp, pp, dp, cp, _) in zip(nemo_long_runs(), NEMO_LONG_ROWS):
        w, c = run.workload, run.workload.model
        s, L, h = w.seq_length, c.num_layers, c.hidden_size
        nemo = batch * s * L * h * h * (12 + 12 * c.num_kv_heads / c.num_heads + 18 * c.ffn_hidden_size / h
                                        + 12 * s / h + 6 * c.vocab_size / (L * h))
        assert nemo == pytest.approx(model_flops(w), rel=1e-12)
        assert (s, batch * s, tp * pp * dp * cp) == (1024 * k, 4 * 2**20, gpus)
        layout = results[run.name].layout
        assert layout.startswith(f"tp{tp} pp{pp} dp{dp} ") and (f"cp{cp}" in layout) == (cp > 1)


def test_megatron_core_r080_flop_count_is_the_planners():
    """The Megatron-Core rows' metric (round 10, checked at its source): `num_floating_point_operations` in
    megatron/training/training.py at f2e5db4, the README's commit, written out here from that file --
    12 B s L h^2 ((1 + g/a + s/h) q/h + f/h x experts x gated + V / (2 L h)), full s^2 attention, no recomputation --
    equals the planner's model FLOPs for all nine rows (GELU MLP of 4h, no GQA, q = h, V = 131072 already a
    multiple of 128)."""
    from hybrid.planner.published_more import mcore_weak_runs
    runs = mcore_weak_runs()
    assert len(runs) == len(MCORE_WEAK) == 9
    for run, (_, heads, h, layers, *_rest) in zip(runs, MCORE_WEAK):
        w = run.workload
        s, batch = w.seq_length, w.global_batch
        groups, q_ratio, ffn, experts, gated = heads, 1.0, 4 * h, 1, 1  # no GQA, kv_channels a = h, GELU, dense
        attention = (1 + groups / heads + s / h) * q_ratio
        mlp = ffn / h * experts * gated
        logit = MCORE_VOCAB / (2 * layers * h)
        megatron = 12 * batch * s * layers * h * h * (attention + mlp + logit)
        assert megatron == pytest.approx(model_flops(w), rel=1e-12), run.name


def test_every_published_layout_is_predicted_to_fit(results):
    """Issue 26's acceptance: the layouts that ran are predicted to fit."""
    assert {name for name, r in results.items() if r.error is None} == KNOWN_REJECTED


def test_rows_within_15_percent_stay_there_and_the_misses_are_the_known_ones(results):
    """The ratchet: every row outside KNOWN_MISSES is within +-15 %; each known miss is still a row here."""
    assert KNOWN_MISSES <= set(results)
    outside = {name for name, r in results.items() if r.error is not None and abs(r.error) > 0.15}
    assert outside <= KNOWN_MISSES, f"rows that left +-15 %: {sorted(outside - KNOWN_MISSES)}"


def test_docs_section_is_the_table_the_module_prints(results):
    """docs/planner/rounds.md "More check rows, round 7" holds each group's table and summary as the code computes them
    (regenerate: python -m hybrid.planner.published_more)."""
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "planner", "rounds.md")) as f:
        docs = f.read()
    everything = []
    for what, rows in GROUPS:
        group = [results[r.name] for r in rows()]
        everything += group
        for line in table(group).splitlines()[2:] + role_summaries(what, group):
            assert line in docs, line
    for line in role_summaries("all round-7 check rows", everything):
        assert line in docs, line


def test_docs_miss_decomposition_is_the_codes(results):
    """docs/planner/rounds.md's miss table (python -m hybrid.planner.published_more --misses): one line per known miss,
    each the code's -- the terms, the DP-hidden what-if and the flash rate the reading in the docs rests on."""
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "planner", "rounds.md")) as f:
        docs = f.read()
    lines = miss_table([results[r.name] for r in more_runs()]).splitlines()
    assert len(lines) == 2 + len(KNOWN_MISSES)
    for line in lines:
        assert line in docs, line


def test_nemotron_340b_fits_as_its_config_states_not_with_the_planners_optimizer(results):
    """The memory / fit miss the docs report, and round 24's reading of it: NeMo's Nemotron-340B layout (t 8 p 8 v 12,
    b 1, GBS 32) with the planner's 4-byte optimizer states and no recomputation is planned at 87.0 GB -- over the
    80 GB card -- so the planner's picks recompute the MLP (selective-op) and were 22 % pessimistic; the 340B's
    config states bf16 optimizer states and selective recomputation (published24b_pipelines.as_stated), with which
    the row is planned: selective, 68.6 GB."""
    from dataclasses import replace

    from hybrid.planner.layout import Cluster, Recompute
    from hybrid.planner.search import search
    run = next(r for r in more_runs() if "Nemotron-340B" in r.name)
    assert results[run.name].layout.endswith(" selective") and 68 < results[run.name].memory_gb < 69.5
    four_byte = replace(run.workload, optimizer_dtype_bytes=4)
    plain = search(four_byte, Cluster(gpus=run.gpus, hw=run.hardware()),
                   replace(run.space, recompute=(Recompute.NONE,), zero=(ZeroStage.OPTIMIZER,)), top=1)
    assert not plain.plans and "87.0 GB" in plain.rejected[0].reason
