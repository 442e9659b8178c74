"""Issue 26, round 16: new CHECK rows of the held-out kind "FSDP runs at 8-64 GPUs, A100" -- MosaicML's A100 40GB
table, which rounds 7 and 14 left out for want of a 40 GB card, and IBM fms-fsdp's A100 rows.

    python -m hybrid.planner.published16        # the rows, planned (docs/planner/rounds.md "Round 16: held-out families")
    python -m hybrid.planner.published16 --pairs   # the rows the 80 GB and 40 GB tables share, side by side
    python -m hybrid.planner.published16 --flash1-what-if   # the A100 Triton flash rate: fit 80 GB, check 40 GB
    python -m hybrid.planner.published16 --h100-triton-what-if  # the H100 Triton flash rate: fit bf16, check FP8
    python -m hybrid.planner.published16 --h100-triton-refit-what-if  # the same with the eager clock refitted
    python -m hybrid.planner.published16 --network-what-if  # fms-fsdp's misses at slower node links
    python -m hybrid.planner.published16 --nemotron-what-if # the 340B at 6,144 GPUs by recomputation and v

Every row is a `Role.CHECK` row, entered from its source and committed before its error was read (the commit that
added the rows ran no prediction); nothing was fitted to it.

Source, read at the commit named: mosaicml/llm-foundry scripts/train/benchmarking/README.md at commit 061f2c7 (the
version the search index holds; published.py reads the same file's other tables at c90b9b3 and its FP8 table at
061f2c7), table "A100 40GB with 1600 Gbps node-node interconnect (RoCE)": all 78 rows -- MPT 125M-70B, s 512-32768,
8-128 GPUs, Composer + PyTorch FSDP (FULL_SHARD), micro-batch and gradient accumulation stated, activation
checkpointing stated, precision `bf16` with FSDP mixed precision `PURE` (parameters, gradient reduction and buffers
in bf16: planned with bf16 gradients, as published_more.py plans the 80 GB table's one PURE row), Throughput
(T/s/GPU). The table's header lacks the "Model TFLOP" column its rows carry; the columns were read by the rows'
own arithmetic (micro-batch x accumulation x GPUs = GlobalBatchSize, T/s / GPUs = T/s/GPU on the rows checked by
hand), and tests/test_planner16_families.py checks each row's NumParams against the planned model (a size or a
sequence read wrong fails it).

The card: the a100-80g preset with the A100 40GB SXM4's own memory (40960 MiB, nvidia-smi's size, as the 80 GB
preset takes 81920) and HBM2 bandwidth (1.555 TB/s, NVIDIA's A100 data sheet; the elementwise rate scaled with it
by hardware.ELEMENTWISE_FRACTION, as every preset's); the same SMs and clocks, so the same GEMM and flash rates.
The network: the table's 1600 Gbps a node = 25 GB/s a GPU, as for the 80 GB table (the preset's 23.5 is kept, as
published.py keeps it for that table).

Planned exactly as published_more._mpt_runs plans MosaicML's other rows: FULL_SHARD as ZeRO 3, the stated
micro-batch, checkpointing as full recomputation, llm-foundry's triton flash attention (FLASH1 on A100), eager
PyTorch kernels, flash-attn's fused cross-entropy.

Second source (added after the first's rows were committed, before either was planned): foundation-model-stack/
fms-fsdp README.md at commit 0d31998, its throughput table: Llama 2 7B / 13B / CodeLlama-34B shape / Llama 2 70B on
128 A100, sharding HSDP (7B, 13B) or FSDP (34B, 70B), activation checkpointing False / False / True / True, batch
size 2 / 1 / 8 / 6 a GPU, "Training Throughput (128 GPUs)" 3760 / 1700 / 772 / 380 token/gpu/sec. Planned as
published.py plans the same project's H100 rows (heldout_h100_runs, published._fsdp): s 4096, ZeRO 3 over all the
GPUs (HSDP too, as published.py plans the H100 7B's HSDP), eager, SDPA flash, the PyTorch stack, no accumulation
(global batch = batch size x 128). Assumed, not stated: A100 80GB (the 34B at batch 8 and the 70B at 6 a GPU need
it) and the a100-80g preset's network (IBM's cluster link is not stated in the README).

Third source (added after the first two were planned, before it was): Nemotron-4 340B's production run, the
held-out kind "Megatron pipelines at scale" on H100 -- the technical report (NVIDIA, arXiv 2406.11704) Table 2's
last stage as quoted by aiportalx.com/nvidia/nemotron-4-340b (the report itself is not in the stored corpora):
"the largest stage used all 6144 GPUs with a batch size of 2304 and an iteration time (time per batch) of 8.0
seconds", MFU 41-42 %; the layout, 8-way tensor and 12-way pipeline parallelism on 768 DGX H100 nodes, from the
report's summary (a paper-notes repository found by the search index: 96 layers, h 18432, 96 heads, 8 KV heads,
s 4096, vocabulary 256000, squared ReLU, untied, no biases, dropout 0). DP = 6144 / 96 = 64. Compared on the step
time. Planned as published_more._nemo plans NeMo's rows (Megatron-core + TE: fused kernels, flash attention, the
Megatron stack; the same 340B shape, published_more's "Nemotron-340B"), in bf16 (the report trains in bf16);
micro-batch, interleaving, ZeRO 0 / 1 and recomputation the planner's (not stated). The 8.0 s is one stage's
iteration time as quoted, not a logged median; the secondary source is the caveat.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, fields, replace

from hybrid.planner.hardware import ELEMENTWISE_FRACTION, FLASH1_A100, MIB, AttentionKernel
from hybrid.planner.layout import Recompute
from hybrid.planner.ops import KernelProfile
from hybrid.planner.published import CODELLAMA_34B, LLAMA2_7B, LLAMA2_13B, LLAMA2_70B, PublishedRun, _fsdp
from hybrid.planner.published_more import Result, _mpt_runs, evaluate, summary_line, table

MPT_A100_40G_SOURCE = ("mosaicml/llm-foundry scripts/train/benchmarking/README.md at commit 061f2c7, table 'A100 "
                       "40GB with 1600 Gbps node-node interconnect (RoCE)' (bf16, FSDP PURE, FULL_SHARD; "
                       "Throughput (T/s/GPU))")
A100_40G_MEMORY_BYTES = 40960 * MIB  # nvidia-smi's size of the A100-SXM4-40GB (the 80 GB preset: 81920 MiB)
A100_40G_HBM_TBPS = 1.555  # NVIDIA A100 data sheet, A100 40GB SXM


# (model, s, GPUs, micro-batch, gradient accumulation, T/s/GPU, activation checkpointing, NumParams), the table's
# order; every row FULL_SHARD (ZeRO 3), bf16 PURE (bf16 gradient reduction)
MPT_A100_40G_ROWS = (("70b", 2048, 128, 4, 1, 376, True, 64862437376),
                     ("70b", 2048, 64, 2, 1, 276, True, 64862437376),
                     ("30b", 2048, 128, 6, 1, 865, True, 29975214080),
                     ("30b", 2048, 32, 4, 1, 857, True, 29975214080),
                     ("13b", 8192, 8, 1, 16, 1407, True, 12885411840),
                     ("13b", 4096, 8, 2, 16, 1603, True, 12864440320),
                     ("13b", 2048, 128, 16, 1, 1972, True, 12853954560),
                     ("13b", 2048, 64, 16, 1, 1976, True, 12853954560),
                     ("13b", 2048, 32, 14, 1, 1998, True, 12853954560),
                     ("13b", 2048, 16, 10, 1, 1993, True, 12853954560),
                     ("13b", 2048, 8, 4, 16, 1668, True, 12853954560),
                     ("13b", 1024, 8, 8, 16, 1727, True, 12848711680),
                     ("13b", 512, 8, 16, 16, 1763, True, 12846090240),
                     ("7b", 16384, 8, 1, 4, 2249, True, 6717579264),
                     ("7b", 8192, 8, 3, 4, 2887, True, 6684024832),
                     ("7b", 4096, 8, 6, 4, 3366, True, 6667247616),
                     ("7b", 2048, 128, 18, 1, 3623, True, 6658859008),
                     ("7b", 2048, 64, 18, 1, 3665, True, 6658859008),
                     ("7b", 2048, 32, 18, 1, 3725, True, 6658859008),
                     ("7b", 2048, 16, 16, 1, 3645, True, 6658859008),
                     ("7b", 2048, 8, 12, 4, 3679, True, 6658859008),
                     ("7b", 1024, 8, 24, 4, 3854, True, 6654664704),
                     ("7b", 512, 8, 48, 4, 3895, True, 6652567552),
                     ("3b", 32768, 8, 1, 4, 2955, True, 2730480640),
                     ("3b", 16384, 8, 2, 8, 4465, True, 2688537600),
                     ("3b", 8192, 8, 1, 8, 7149, False, 2667566080),
                     ("3b", 4096, 8, 2, 8, 8777, False, 2657080320),
                     ("3b", 2048, 128, 6, 1, 9538, False, 2651837440),
                     ("3b", 2048, 64, 6, 1, 9736, False, 2651837440),
                     ("3b", 2048, 32, 6, 1, 9914, False, 2651837440),
                     ("3b", 2048, 16, 5, 1, 9750, False, 2651837440),
                     ("3b", 2048, 8, 5, 8, 10065, False, 2651837440),
                     ("3b", 1024, 8, 10, 8, 10731, False, 2649216000),
                     ("3b", 512, 8, 20, 8, 11324, False, 2647905280),
                     ("1b", 32768, 8, 1, 4, 5095, True, 1378865152),
                     ("1b", 16384, 8, 1, 8, 9715, False, 1345310720),
                     ("1b", 8192, 8, 2, 8, 13474, False, 1328533504),
                     ("1b", 4096, 8, 4, 8, 16856, False, 1320144896),
                     ("1b", 2048, 128, 10, 1, 18647, False, 1315950592),
                     ("1b", 2048, 64, 10, 1, 19001, False, 1315950592),
                     ("1b", 2048, 32, 10, 1, 15555, False, 1315950592),
                     ("1b", 2048, 16, 8, 1, 19085, False, 1315950592),
                     ("1b", 2048, 8, 8, 8, 19271, False, 1315950592),
                     ("1b", 1024, 8, 16, 8, 20959, False, 1313853440),
                     ("1b", 512, 8, 32, 8, 21782, False, 1312804864),
                     ("760m", 32768, 8, 1, 4, 7183, True, 807656448),
                     ("760m", 16384, 8, 1, 4, 13914, False, 782490624),
                     ("760m", 8192, 8, 3, 4, 20106, False, 769907712),
                     ("760m", 4096, 8, 6, 4, 25863, False, 763616256),
                     ("760m", 2048, 128, 12, 1, 28940, False, 760470528),
                     ("760m", 2048, 64, 12, 1, 29344, False, 760470528),
                     ("760m", 2048, 32, 12, 1, 29648, False, 760470528),
                     ("760m", 2048, 16, 12, 1, 29607, False, 760470528),
                     ("760m", 2048, 8, 12, 4, 30173, False, 760470528),
                     ("760m", 1024, 8, 24, 4, 33422, False, 758897664),
                     ("760m", 512, 8, 48, 4, 34938, False, 758111232),
                     ("350m", 32768, 8, 1, 4, 13416, False, 387442688),
                     ("350m", 16384, 8, 2, 4, 22896, False, 370665472),
                     ("350m", 8192, 8, 4, 4, 34933, False, 362276864),
                     ("350m", 4096, 8, 8, 4, 46833, False, 358082560),
                     ("350m", 2048, 128, 18, 1, 51934, False, 355985408),
                     ("350m", 2048, 64, 18, 1, 52689, False, 355985408),
                     ("350m", 2048, 32, 18, 1, 53811, False, 355985408),
                     ("350m", 2048, 16, 18, 1, 55413, False, 355985408),
                     ("350m", 2048, 8, 16, 4, 55995, False, 355985408),
                     ("350m", 1024, 8, 32, 4, 62523, False, 354936832),
                     ("350m", 512, 8, 64, 4, 66284, False, 354412544),
                     ("125m", 32768, 8, 1, 4, 32651, False, 148904448),
                     ("125m", 16384, 8, 2, 3, 55484, False, 136321536),
                     ("125m", 8192, 8, 5, 3, 86858, False, 130030080),
                     ("125m", 4096, 8, 13, 3, 115162, False, 126884352),
                     ("125m", 2048, 128, 26, 1, 123936, False, 125311488),
                     ("125m", 2048, 64, 26, 1, 125234, False, 125311488),
                     ("125m", 2048, 32, 26, 1, 127122, False, 125311488),
                     ("125m", 2048, 16, 26, 1, 130535, False, 125311488),
                     ("125m", 2048, 8, 26, 3, 136334, False, 125311488),
                     ("125m", 1024, 8, 52, 3, 148289, False, 124525056),
                     ("125m", 512, 8, 104, 3, 156735, False, 124131840))


@dataclass(frozen=True)
class A100_40GRun(PublishedRun):
    """A PublishedRun on A100 40GB SXM4: the a100-80g preset with the 40 GB card's memory and HBM bandwidth."""

    def hardware(self):
        return super().hardware().with_overrides(name="a100-40g", memory_bytes=A100_40G_MEMORY_BYTES,
                                                 memory_gb=40.0, hbm_tbps=A100_40G_HBM_TBPS,
                                                 elementwise_tbps=A100_40G_HBM_TBPS * ELEMENTWISE_FRACTION)


def mpt_a100_40g_runs() -> list[PublishedRun]:
    """The A100 40GB table's 78 rows, planned as published_more._mpt_runs plans the 80 GB table's."""
    rows = tuple((size, seq, gpus, mb, accum, tokens, 3, ac, False, params)
                 for size, seq, gpus, mb, accum, tokens, ac, params in MPT_A100_40G_ROWS)
    runs = []
    for run in _mpt_runs(rows, "a100-80g", MPT_A100_40G_SOURCE):
        values = {f.name: getattr(run, f.name) for f in fields(run)}
        values["name"] = run.name.replace(" A100,", " A100 40GB,")
        runs.append(A100_40GRun(**values))
    return runs


FMS_FSDP_A100_SOURCE = ("foundation-model-stack/fms-fsdp README.md at commit 0d31998, throughput table (128 A100, "
                        "HSDP / FSDP, token/gpu/sec)")
# (name, shape, micro-batch, activation checkpointing, token/gpu/sec), the README's order
FMS_FSDP_A100_ROWS = (("Llama 2 7B", LLAMA2_7B, 2, False, 3760), ("Llama 2 13B", LLAMA2_13B, 1, False, 1700),
                      ("CodeLlama-34B shape", CODELLAMA_34B, 8, True, 772), ("Llama 2 70B", LLAMA2_70B, 6, True, 380))
FMS_FSDP_A100_GPUS = 128


def fms_fsdp_a100_runs() -> list[PublishedRun]:
    """fms-fsdp's four A100 rows, planned as published.heldout_h100_runs plans its H100 rows; the two the README
    states HSDP (7B, 13B) as HSDP over node-sized shard groups (round 25: published25_hsdp.as_run)."""
    from hybrid.planner.published25_hsdp import as_run
    runs = []
    for name, shape, mb, ac, tokens in FMS_FSDP_A100_ROWS:
        recompute = Recompute.FULL if ac else Recompute.NONE
        run = _fsdp(f"fms-fsdp {name}, {FMS_FSDP_A100_GPUS} A100, FSDP, b{mb}, {'full AC' if ac else 'no AC'}",
                    FMS_FSDP_A100_SOURCE, shape, 4096, FMS_FSDP_A100_GPUS, mb * FMS_FSDP_A100_GPUS, mb, recompute,
                    KernelProfile.EAGER, gpu="a100-80g")
        runs.append(as_run(replace(run, published=float(tokens))))  # the 7B / 13B ran HSDP (round 25)
    return runs


NEMOTRON4_340B_SOURCE = ("Nemotron-4 340B Technical Report (arXiv 2406.11704) Table 2, last stage, via "
                         "aiportalx.com/nvidia/nemotron-4-340b (6144 H100, GBS 2304, 8.0 s an iteration)")


def nemotron4_340b_run(stated: bool = True) -> PublishedRun:
    """Nemotron-4 340B's production stage on 6,144 H100: t 8, p 12, d 64, GBS 2,304 x 4,096, 8.0 s a step; `stated`
    (round 24): with its pretraining config's settings, v 8 included (published24b_pipelines.as_stated,
    LAUNCHER_340B); False: the planner's picks, as rounds 16-23 planned it."""
    from hybrid.planner.layout import Offload, Workload, ZeroStage
    from hybrid.planner.model import ActivationProfile
    from hybrid.planner.ops import Stack
    from hybrid.planner.published import Metric
    from hybrid.planner.published_more import _nemo_models
    from hybrid.planner.search import SearchSpace
    work = Workload(_nemo_models()["Nemotron-340B"], global_batch=2304, seq_length=4096,
                    activations=ActivationProfile.BF16_FLASH, kernels=KernelProfile.FUSED, stack=Stack.MEGATRON,
                    fp32_grads=False)
    space = SearchSpace(tp=(8,), pp=(12,), zero=(ZeroStage.NONE, ZeroStage.OPTIMIZER), offload=(Offload.NONE,),
                        sequence_parallel=(True,))
    run = PublishedRun("Nemotron-4 340B pretraining, 6144 H100, t8 p12 d64, GBS 2304 (bf16)", NEMOTRON4_340B_SOURCE,
                       work, "h100-80g", 6144, space, Metric.STEP_S, 8.0)
    if not stated:
        return run
    from hybrid.planner.published24b_pipelines import PRODUCTION_VP, as_stated
    return as_stated(run, vp=PRODUCTION_VP)


def runs16() -> list[PublishedRun]:
    """Every round-16 check row."""
    return mpt_a100_40g_runs() + fms_fsdp_a100_runs() + [nemotron4_340b_run()]


def _key(name: str) -> tuple[str, str, str]:
    """(model, sequence, GPUs) of a MosaicML row's name: 'MPT-7b, s 2048, 8 A100 40GB, ...' -> ('7b', '2048', '8')."""
    model, seq, gpus = name.split(", ")[:3]
    return model.removeprefix("MPT-"), seq.removeprefix("s "), gpus.split()[0]


def table_pairs() -> str:
    """The same model, sequence and GPU count in MosaicML's A100 80GB table (published.py / published_more.py) and
    its 40GB table: the published tokens-a-GPU ratio (80 GB / 40 GB) against the planned one. The two tables ran
    other micro-batches, accumulation and precision (amp_bf16 DEFAULT against bf16 PURE), and maybe other
    software (the 40 GB table's date is not established here): a reading, not a controlled pair."""
    from hybrid.planner.published import all_runs
    from hybrid.planner.published_more import more_runs
    big = {_key(r.name): r for r in all_runs() + more_runs() if r.name.startswith("MPT-") and " A100," in r.name}
    lines = ["| model, s, GPUs | 80 GB row | 40 GB row | published 80 / 40 | planned 80 / 40 | error 80 GB | "
             "error 40 GB |", "|---|---|---|---|---|---|---|"]
    for small in mpt_a100_40g_runs():
        other = big.get(_key(small.name))
        if other is None:
            continue
        a, b = evaluate(other), evaluate(small)
        lines.append(f"| {', '.join(_key(small.name))} | {other.name.split(', ', 3)[3]} | "
                     f"{small.name.split(', ', 3)[3]} | {other.published / small.published:.3f} | "
                     f"{a.predicted / b.predicted:.3f} | {100 * a.error:+.1f} % | {100 * b.error:+.1f} % |")
    return "\n".join(lines)


def _flash_scale_to_match(run: PublishedRun) -> float:
    """The factor on the card's flash share at which the row's prediction is exact (GEMM rate and stack clock
    kept; published_more.flash_rate_to_match's bisection, as a factor)."""
    from hybrid.planner.fit import solve
    from hybrid.planner.published import _plan_on
    hw = run.hardware()
    share = hw.flash_efficiency

    def error(k: float) -> float:
        return run.throughput_error(_plan_on(run, hw.with_overrides(flash_efficiency=min(1.0, k * share),
                                                                    eager_clock=hw.eager_clock)))
    return solve(error, 0.0, 0.2, 1.0 / share, iters=16)


def _with_flash_scale(run: PublishedRun, k: float) -> float:
    from hybrid.planner.published import _plan_on
    hw = run.hardware()
    return run.throughput_error(_plan_on(run, hw.with_overrides(flash_efficiency=min(1.0, k * hw.flash_efficiency),
                                                                eager_clock=hw.eager_clock)))


LONG = 8192  # the sequence from which a MosaicML row's attention is a large share of its step (round 7)


def flash1_what_if() -> str:
    """A what-if, landed nowhere: the A100's FlashAttention-1 Triton rate (FLASH1_A100, the published figure's)
    set from the 80 GB table's long-sequence rows (s >= 8192: the median factor that makes each exact) and checked
    on the 40 GB table's rows, which nothing set -- the held-out split of issue 26 across the two tables."""
    from hybrid.planner.published import all_runs
    from hybrid.planner.published_more import more_runs
    fit_rows = [r for r in all_runs() + more_runs()
                if r.name.startswith("MPT-") and " A100," in r.name and r.workload.seq_length >= LONG]
    scales = sorted(_flash_scale_to_match(r) for r in fit_rows)
    k = statistics.median(scales)
    check = mpt_a100_40g_runs()
    before = [evaluate(r).error for r in check]
    after = [_with_flash_scale(r, k) for r in check]
    long_before = [e for r, e in zip(check, before) if r.workload.seq_length >= LONG]
    long_after = [e for r, e in zip(check, after) if r.workload.seq_length >= LONG]
    fit_after = [_with_flash_scale(r, k) for r in fit_rows]
    fit_before = [evaluate(r).error for r in fit_rows]
    rate = k * FLASH1_A100 * 312.0
    return "\n".join([
        f"fit: {len(fit_rows)} A100 80 GB rows at s >= {LONG}: factor on the flash share, median {k:.3f} "
        f"(range {scales[0]:.3f}-{scales[-1]:.3f}), FLASH1 at 16k / head 128 {FLASH1_A100 * 312:.0f} -> {rate:.0f} "
        "TFLOP/s",
        _line("fit rows (80 GB, s >= 8192), as shipped", fit_before),
        _line("fit rows (80 GB, s >= 8192), with the factor", fit_after),
        _line("check rows (40 GB, all 78), as shipped", before),
        _line("check rows (40 GB, all 78), with the factor", after),
        _line(f"check rows (40 GB, s >= {LONG}), as shipped", long_before),
        _line(f"check rows (40 GB, s >= {LONG}), with the factor", long_after)])


NETWORK_GBPS = (23.5, 12.5, 6.25, 3.125)  # a GPU's share of the node's NICs: the preset, then halvings


def _ran_triton(run: PublishedRun) -> bool:
    """Did this MosaicML H100 row run llm-foundry's Triton kernel? Its workload's kernel says
    (published.mpt_attention_kernel: all of the 8-64 GPU tables did; the ">= 128 GPUs" table ran FlashAttention-2
    for 1B, 3B, 7B and 70B)."""
    return run.workload.attention_kernel is AttentionKernel.TRITON


def h100_triton_what_if() -> str:
    """A what-if, landed nowhere: MosaicML's H100 rows ran Triton FlashAttention-1 (round 8), planned at
    FlashAttention-2's rate for want of a published H100 rate of that kernel. The factor on the flash share that
    makes each bf16 row at s >= 8192 exact, its median applied to the FP8 rows at s >= 8192 (nothing set them), to
    the six rows that fit H100_EAGER_CLOCK (which a landed rate would have to be refitted with) and to the other
    bf16 rows that ran Triton (the ">= 128 GPUs" table's FlashAttention-2 rows left out)."""
    from hybrid.planner.published import all_runs
    from hybrid.planner.published_more import more_runs
    mpt = [r for r in all_runs() + more_runs() if r.name.startswith("MPT-") and r.gpu == "h100-80g" and _ran_triton(r)]
    fit_rows = [r for r in mpt if not r.workload.fp8 and r.workload.seq_length >= LONG]
    check = [r for r in mpt if r.workload.fp8 and r.workload.seq_length >= LONG]
    clock = [r for r in mpt if r.fits]
    short = [r for r in mpt if not r.fits and not r.workload.fp8 and r.workload.seq_length < LONG]
    k = statistics.median(_flash_scale_to_match(r) for r in fit_rows)
    out = [f"fit: {len(fit_rows)} bf16 H100 rows at s >= {LONG}: median factor on the flash share {k:.3f}"]
    for what, rows in (("bf16 rows at s >= 8192 (fit)", fit_rows), ("FP8 rows at s >= 8192 (check)", check),
                       ("H100_EAGER_CLOCK's six fit rows", clock), (f"the other bf16 rows at s < {LONG}", short)):
        out.append(_line(f"{what}, as shipped", [evaluate(r).error for r in rows]))
        out.append(_line(f"{what}, with the factor", [_with_flash_scale(r, k) for r in rows]))
    return "\n".join(out)


def _on_h100(run: PublishedRun, clock: float, flash_factor: float):
    """The run planned with H100_EAGER_CLOCK replaced by `clock` and its flash share times `flash_factor`."""
    from hybrid.planner.published import _plan_on
    hw = run.hardware()
    return _plan_on(run, hw.with_overrides(flash_efficiency=hw.flash_efficiency * flash_factor, eager_clock=clock))


def h100_triton_refit_what_if() -> str:
    """The --h100-triton-what-if factor with H100_EAGER_CLOCK refitted over it on its six rows (mean log error 0,
    as fit.fit_h100_eager_clock), then every PyTorch-native row on the h100-80g preset: MosaicML's (Triton: with
    the factor) and the FlashAttention-2 ones (OLMo-core, fms-fsdp, torchtitan on 80 GB, the float8 blog: without).
    torchtitan's 500 W rows are left out: H100_500W_CLOCK is refitted against the eager clock on torchtitan's
    Table 1, which keeps their product, so they do not move. A what-if, landed nowhere."""
    import math

    from hybrid.planner.families import all_published_runs, family_of
    from hybrid.planner.fit import mpt_h100_fit_runs, solve
    from hybrid.planner.hardware import H100_EAGER_CLOCK
    from hybrid.planner.published import Role
    mpt = [r for r in all_published_runs() if r.name.startswith("MPT-") and r.gpu == "h100-80g"]
    k = statistics.median(_flash_scale_to_match(r) for r in mpt
                          if not r.workload.fp8 and r.workload.seq_length >= LONG)
    fit_rows = mpt_h100_fit_runs()

    def log_error(clock: float) -> float:
        return statistics.fmean(math.log1p(r.throughput_error(_on_h100(r, clock, k))) for r in fit_rows)
    clock = solve(log_error, 0.0, 0.3, 1.0, iters=20)
    fa2 = [r for r in all_published_runs() if r.gpu == "h100-80g" and not r.name.startswith("MPT-")
           and family_of(r.source).split()[0] in ("OLMo-core", "IBM", "torchtitan")]
    out = [f"factor {k:.3f}; H100_EAGER_CLOCK refitted over it on its six rows: {H100_EAGER_CLOCK:.4f} -> {clock:.4f}"]
    fa2 += [r for r in mpt if not _ran_triton(r)]
    triton = [r for r in mpt if _ran_triton(r) and r.role is Role.CHECK]
    for what, rows, factor in (("MosaicML H100 check rows that ran Triton", triton, k),
                               ("FlashAttention-2 PyTorch-native h100-80g rows (MosaicML's included)", fa2, 1.0)):
        out.append(_line(f"{what}, as shipped", [evaluate(r).error for r in rows]))
        out.append(_line(f"{what}, factor + refitted clock",
                         [r.throughput_error(_on_h100(r, clock, factor)) for r in rows]))
    return "\n".join(out)


def network_what_if() -> str:
    """A what-if, landed nowhere: fms-fsdp's A100 rows and MosaicML's 70B at 64 GPUs at lower inter-node rates
    than the preset's (fms-fsdp's README states no network; MosaicML's table states 1600 Gbps a node, 25 GB/s a
    GPU, the preset's 23.5)."""
    from hybrid.planner.published import _plan_on
    rows = [r for r in runs16() if r.name.startswith("fms-fsdp") or r.name.startswith("MPT-70b, s 2048, 64 ")]
    lines = ["| row | " + " | ".join(f"{g:g} GB/s a GPU" for g in NETWORK_GBPS) + " |",
             "|---|" + "---|" * len(NETWORK_GBPS)]
    for run in rows:
        hw = run.hardware()
        errors = [run.throughput_error(_plan_on(run, hw.with_overrides(inter_node_gbps=g))) for g in NETWORK_GBPS]
        lines.append(f"| {run.name} | " + " | ".join(f"{100 * e:+.1f} %" for e in errors) + " |")
    return "\n".join(lines)


def nemotron_what_if() -> str:
    """A what-if, landed nowhere: the Nemotron-4 340B row under each recomputation and interleaving depth (neither
    is stated by the source this row reads), the planner's pick being the fastest that fits."""
    from hybrid.planner.layout import Recompute
    run = nemotron4_340b_run()
    lines = ["| recomputation | " + " | ".join(f"v {v}" for v in NEMOTRON_V) + " |", "|---|" + "---|" * len(NEMOTRON_V)]
    for recompute in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL):
        cells = []
        for v in NEMOTRON_V:
            r = evaluate(replace(run, space=replace(run.space, recompute=(recompute,), v=(v,))))
            cells.append("rejected" if r.error is None else f"{r.predicted:.2f} s ({100 * r.error:+.1f} %)")
        lines.append(f"| {recompute.value} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


NEMOTRON_V = (1, 2, 4, 8)


def _line(what: str, errors: list[float]) -> str:
    from hybrid.planner.published import summary
    return summary(errors).line(what)


def evaluate_all() -> list[Result]:
    return [evaluate(r) for r in runs16()]


def main() -> None:
    if sys.argv[1:] == ["--pairs"]:
        print(table_pairs())
        return
    if sys.argv[1:] == ["--flash1-what-if"]:
        print(flash1_what_if())
        return
    if sys.argv[1:] == ["--h100-triton-what-if"]:
        print(h100_triton_what_if())
        return
    if sys.argv[1:] == ["--h100-triton-refit-what-if"]:
        print(h100_triton_refit_what_if())
        return
    if sys.argv[1:] == ["--network-what-if"]:
        print(network_what_if())
        return
    if sys.argv[1:] == ["--nemotron-what-if"]:
        print(nemotron_what_if())
        return
    results = evaluate_all()
    print(table(results))
    print()
    print(summary_line("Round 16 check rows (MosaicML A100 40GB, fms-fsdp A100, Nemotron-4 340B)", results))
    if sys.argv[1:] == ["--by-size"]:
        for size in dict.fromkeys(r.run.name.split(",")[0] for r in results):
            print(summary_line(size, [r for r in results if r.run.name.split(",")[0] == size]))


if __name__ == "__main__":
    main()
