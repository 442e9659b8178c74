"""The machines the planner plans for: one typed record per accelerator kind, and the time of a collective.

The GPU numbers are published peaks or achievable figures from a named benchmark; the collective latencies,
the CPU-Adam throughput and the cpu preset are orders of magnitude. None is fitted to the validation rows.
GB = 1e9 bytes, GB/s = 1e9 bytes per second, TFLOP/s = 1e12 FLOP per second.

| preset   | bf16 peak   | memory          | HBM       | NVLink busbw (8 GPUs)        | inter-node per GPU       | PCIe    |
|----------|-------------|-----------------|-----------|------------------------------|--------------------------|---------|
| a100-80g | 312 TFLOP/s | 80 GB (85.9e9)  | 2.04 TB/s | 230 GB/s (NVLink 3, 300/dir) | 23.5 GB/s (HDR 200 Gb/s) | 25 GB/s |
| h100-80g | 989 TFLOP/s | 80 GB (85.5e9)  | 3.35 TB/s | 450 GB/s (NVLink 4, 450/dir) | 47 GB/s (NDR 400 Gb/s)   | 50 GB/s |
| h200     | 989 TFLOP/s | 141 GB (150.8e9)| 4.8 TB/s  | 450 GB/s                     | 47 GB/s                  | 50 GB/s |
| cpu      | 1 TFLOP/s   | 64 GB           | 0.1 TB/s  | 5 GB/s (gloo, shared memory) | 1.2 GB/s (10 GbE)        | --      |

Sources: peaks, memory sizes and HBM bandwidths from NVIDIA's A100 (2020), H100 (2022) and H200 (2023) data
sheets (SXM parts, dense -- no 2:4 sparsity). Intra-node bandwidths are nccl-tests `all_reduce_perf` bus
bandwidth at large sizes on one 8-GPU NVSwitch node: 230-250 GB/s on A100 SXM4, 460-480 GB/s on H100 SXM5
(the lower ends taken). Inter-node: DGX A100 / DGX H100 have one 200 / 400 Gb/s InfiniBand NIC per GPU (8 per
node; 25 / 50 GB/s line rate); we take 94 % of line rate (what ib_write_bw typically reaches), 23.5 and 47 GB/s
per GPU. The cpu preset is an order-of-magnitude stand-in for a gloo process, for dry runs.

Matrix multiplies are timed by shape on each preset's GEMM curve (below: a roofline plus a fixed cost per
kernel, with an asymptotic efficiency e per GPU); memory-bound work is timed from the HBM bandwidth
(hybrid/planner/time.py). Bandwidths are already achievable figures, so they carry no efficiency factor.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace

from hybrid.cliutil import check_number

GB = 1e9
MIB = 2**20  # nvidia-smi's MiB

# A matrix multiply of W = 2 b m n k FLOPs over operands and output of Q bytes takes (a roofline plus a fixed
# cost per kernel, the GEMM curve)
#
#     t(m, n, k) = max(W / (peak x e), Q / HBM bandwidth) + t0
#
# so its achieved rate W / t rises with size towards peak x e: e is the asymptotic fraction of peak a large GEMM
# sustains, t0 the fixed cost of one kernel (launch, the first and the last wave). Fitted per GPU (docs/planner.md
# "GEMM efficiency by shape"):
#
# * H100 / H200: least squares (in log rate) over the 72 bf16 shapes of XLA's measured H100 GEMM table
#   (openxla/xla, xla/service/gpu/model/matmul_interpolator_data.h, key sm_90; copied in data/gemm_h100_xla.csv):
#   e = 0.789 (780 TFLOP/s), t0 = 6.4 us, rms error 11 % (8 % on shapes of >= 1e10 FLOPs).
# * H200 (the same GH100 chip, more and faster HBM): least squares (in log rate) over 16 bf16 shapes measured on
#   an H200 by scripts/gpu_check.py on 2026-12-04 (data/gemm_h200_measured.csv: the 15 GEMM shapes of a 1.2B Llama
#   at s 4096, forward and backward, and an 8192^3 product; each the median of 10 calls timed one by one between
#   CUDA events, the geometric mean of two runs): e = 0.796, t0 = 21.4 us, rms error 10 %. The larger t0 than
#   XLA's H100 table is partly the method: a call alone between two events includes the idle GPU's launch gap,
#   which a full training stream hides.
# * A100: no per-shape table at hand. t0 is the H100's (a per-kernel cost, assumed alike); e is fitted to one
#   published training layer, Korthikanti et al. 2022 (arXiv 2205.05198) Table 4: a 22B-model layer (h 6144,
#   a 64, s 2048, b 4, t 8, no recomputation, no SP) takes 7.7 ms forward + 11.9 ms backward on A100 80GB; the
#   planner's own layer model (GEMMs, memory-bound bytes, TP all-reduces) gives 19.6 ms at e = A100_EFFICIENCY.
#   The shape of that row (b 4) was recalled, not re-read from the paper. None of the Narayanan rows the
#   validation checks is used.
# * cpu: the order-of-magnitude dry-run preset keeps the old round figure, no fixed cost; `hybrid calibrate`
#   measures a CPU's own curve.
GEMM_OVERHEAD_S = 6.4e-6
H100_EFFICIENCY = 0.789
H200_EFFICIENCY, H200_GEMM_OVERHEAD_S = 0.796, 21.4e-6
H200_CUDA_BYTES = 150_109_880_320  # total_memory measured on an H200 (nvidia-smi says 143771 MiB: 615 MiB more)
A100_EFFICIENCY = 0.700
COMPUTE_EFFICIENCY = 0.6  # the cpu preset and the default of a Hardware built by hand

# Whole-layer terms beyond the GEMMs (ops.py prices each memory-bound op by its bytes and kernels). Where each
# number comes from -- hybrid/planner/fit.py re-derives every fitted one from the rows that fitted it, and
# tests/test_planner_fit.py checks the presets hold what it derives:
#
# * ELEMENTWISE_FRACTION: the achievable share of the data sheet's HBM bandwidth, **measured** on our H200 (a
#   2 GiB device copy, read + write: 4.16 TB/s of 4.8, docs/results/gpu_h200.md, run 2); assumed alike on the A100
#   and the H100 (same kind of HBM controller; not measured there).
# * KERNEL_OVERHEAD_S: seconds per memory-bound kernel beyond its bytes, **fitted** to one row: our H200 run 3
#   (a 1.2B Llama, s 4096, 8 micro-batches: forward + backward 0.7152 s; fit.fit_kernel_overhead; 7.78 us before
#   round 8's flash rates by sequence length, 5.37 with them), with the
#   H200's GEMM curve, flash rate and copy rate fixed. Assumed the same on every GPU.
# * FLASH_EFFICIENCY: FlashAttention-2's sustained share of the bf16 peak at its longest benchmarked length, causal,
#   head dimension 128, forward + backward, **published**: Dao 2023 (arXiv 2307.08691) Figure 4(d), A100 80GB, 189
#   TFLOP/s of 312 at 16k; Figure 7(d), H100 80GB SXM5, 328 of 989 (FLASH_FWD_BWD_TFLOPS below; the abstracts'
#   "50-73% ... on A100" and FlashAttention-3's "only 35% utilization on the H100" bracket them). Shorter sequences,
#   head width 64 and other kernels run at the table's ratio to that point (AttentionKernel.efficiency).
# * FP8 peaks: data sheets (dense, no sparsity): H100 / H200 SXM 1979 TFLOP/s; the A100 has no FP8 tensor cores.
# * h100-96g-500w: the H100s torchtitan's published numbers ran on (pytorch/torchtitan docs/performance.md:
#   Grand Teton hosts, "96GB HBM2e with 2.4 TB/sec", "the default 500W power limit", 400 Gb/s RDMA per GPU; their
#   own note: its peak is "between SXM and NVL"). Its sustained clock relative to a 700 W H100 on the same stack
#   (H100_500W_CLOCK, the 500 W factor, scaling the GEMM asymptote and the flash rate) is **fitted** to one row,
#   torchtitan's Table 1 (Llama 3.1 8B, eager FSDP on 8 GPUs, 5,762 tokens/s a GPU; fit.fit_h100_500w_clock), on
#   top of the PyTorch stack's H100_EAGER_CLOCK, which it keeps (0.978 x 0.735 = 0.719 since round 20, when
#   selective-op's rerun stopped before the block's last residual add, as torch's checkpoint does: the fit row
#   runs selective-op; 0.982 x 0.735 = 0.722 since round 19's GEMM
#   ceiling below, H100_LARGE_GEMM_RATIO, which the clocks no longer carry; 0.988 x 0.708 = 0.700 before it;
#   0.991 x 0.689 = 0.683 before round 8's flash rates by sequence length (FLASH_FWD_BWD_TFLOPS); 0.670 before the
#   overlap cost
#   and the checkpoint's early stop, the constant this factor replaced when it carried both); torchtitan's compiled
#   rows then check the stack clock; its capacity assumes the 80 GB part's ratio of usable to nominal bytes (81559
#   MiB of 80 GiB) for 96 GiB.
# * H100_EAGER_CLOCK: the sustained tensor-core rate of PyTorch-native (eager-profile) training on an H100 80 GB SXM
#   relative to the curve above and FlashAttention-2's published rate: it scales the GEMM asymptote and the flash
#   rate of an `--kernels eager` workload (Hardware.eager_clock), not its memory-bound kernels. **Fitted** (least
#   squares in log throughput) to the six single-node rows of MosaicML's H100 table (MPT 1B-30B on 8 GPUs, Composer +
#   PyTorch FSDP; fit.fit_h100_eager_clock) and, since round 18, the 12 rows of its ">= 128 GPUs" table that ran
#   FlashAttention-2 (0.7346 with TRITON_FLASH2_SHARE below and round 19's GEMM ceiling, shipped 0.735; 0.7075 /
#   0.708 before the ceiling), with OVERLAP_SLOWDOWN and the checkpoint's early stop (time._stops_early) in the
#   model (0.681 without both, 0.716 with
#   the first: the clock had absorbed the b 2 row's ZeRO 3 overlap cost and the checkpointed rows' unrun down
#   projection); until round 18 the table's ten 16-512 GPU rows and every
#   other row only check (with flash kernels' head-width padding, AttentionKernel, the same fit gives 0.690 and
#   H100_500W_CLOCK's 0.9895: within tests/test_planner_fit.py's 0.002, kept; round 8's flash rates by sequence
#   length and head width, which run FlashAttention-2 slower at s 2048-8192 than the flat 0.35 did, refit it
#   0.689 -> 0.708 with KERNEL_OVERHEAD_S 7.78 -> 5.37 us and A100_EFFICIENCY 0.706 -> 0.700). Why a clock and not
#   a term of its own (docs/planner/rounds.md "Why eager FSDP on H100 was optimistic"): the loss is the same fraction of the step at 1B
#   and 70B, 8 and 512 GPUs, with attention 5-27 % of
#   the step -- a uniform slowdown of tensor-core work -- and the same software on A100 is priced right by an
#   asymptote that was itself fitted to a sustained training step, where XLA's H100 table is a kernel benchmark (a
#   power-limited H100 runs matmuls on real data slower than on benchmark data: thonking.ai, "Matrix Multiplications
#   on GPUs Run Faster When Given 'Predictable' Data", 2024).
# * OVERLAP_SLOWDOWN: how many times longer a compute kernel takes while a collective it overlaps is in flight
#   (ZeRO 2/3's per-layer all-gathers and reduce-scatters run under the layers' compute). NCCL runs one CTA per
#   channel on an SM of its own (it shares no SM with compute: NVIDIA/nccl issue 689) and moves each byte through
#   HBM 2-3 times (nccl issue 1428); the GEMM then loses SMs (a persistent cuBLAS GEMM sized to 132 SMs splits into
#   two waves) and bandwidth. **Published** measurements of a GEMM with and without an overlapping all-gather:
#   A100-SXM4-80GB, GPT training under Nsight: 1.18 -> 2.08 ms (x 1.76; nccl issue 1428, 2024-09); H100, FSDP-like
#   GEMM + all-gather of 24 CTAs: 80 % -> 47 % MFU (x 1.70; NVIDIA developer forum "Compute-Communication Overlap
#   Causes Severe GEMM Performance Degradation because of Tail Effect", 2025); pytorch/pytorch issue 143988 (H100
#   FSDP: "matmuls take 2x as long", not timed). The two timed ones' mean, 1.73: a hidden collective second costs
#   the compute under it 1 - 1/1.73 = 0.42 s (time._overlapped; and time._dp_step_seconds for the hidden part of
#   ZeRO 0-1's overlapped gradient reduction and of ZeRO 1-2's post-step parameter all-gather). Not fitted.
OVERLAP_SLOWDOWN = (1.76 + 1.70) / 2
H100_500W_CLOCK = 0.978
H100_EAGER_CLOCK = 0.735
H100_96G_BYTES = round(96 * 2**30 * 81559 / 81920)
ELEMENTWISE_FRACTION = 4.16 / 4.8
KERNEL_OVERHEAD_S = 5.37e-6
A100_FLASH, HOPPER_FLASH = 189.0 / 312.0, 328.0 / 989.0
# * FLASH_FWD_BWD_TFLOPS (after GpuKind): the kernels' published forward + backward rates by card, kernel, head
#   dimension, causal mask and sequence length -- the data every flash rate is shaped by. AttentionKernel.FLASH1 is
#   FlashAttention-1 (CUDA) there: the kernel llm-foundry's `attn_impl: triton` ran is HazyResearch's
#   flash_attn_triton.py (copied at eff9fe6), whose docstring says "Overall Triton forward + backward is slightly
#   slower than CUDA forward + backward" (its forward faster, its backward slower); the figure's "FlashAttention
#   Triton" bar is a different kernel, OpenAI's `triton.ops.flash_attention` (the repository's
#   benchmarks/benchmark_flash_attention.py at 60499ab imports it), and has no H100 bar. Not fitted
#   (docs/planner/rounds.md "Attention kernels of the published runs").
FLASH1_A100 = 83.0 / 312.0  # FLASH1's share of the A100's peak at 16k, causal, head 128 (Figure 4(d))
# * TRITON_FLASH2_SHARE: llm-foundry's `attn_impl: triton` (AttentionKernel.TRITON, the kernel every MosaicML row
#   but the ">= 128 GPUs" table's 1B / 3B / 7B / 70B ran) has no published rate on any card; it runs at this share
#   of FlashAttention-2's published rate (FLASH_FWD_BWD_TFLOPS) on every card, 0.541 x 328 = 178 TFLOP/s on H100
#   and 0.541 x 189 = 102 on A100 at 16k, causal, head 128. **Fitted** (mean log throughput error 0) on MosaicML's
#   16 bf16 H100 Triton rows at s >= 8192 (attention a large share of the step; fit.fit_triton_flash2_share, the
#   rows naming it in published.py / published_more.py), with H100_EAGER_CLOCK fixed; the two are fitted
#   alternately to a joint point (docs/planner/rounds.md "Round 18"). The share is of the unclocked rate: it was fitted
#   on PyTorch-native rows, so the stack's clock is in it (AttentionKernel.stack_clocked). The A100 rows were not
#   fitted: they check that the kernel scales between the cards as FlashAttention-2's bars do.
TRITON_FLASH2_SHARE = 0.5424
HOPPER_FP8_TFLOPS = 1979.0
# * The H100 curve beyond XLA's table (LARGE_GEMM_FLOPS, H100_LARGE_GEMM_RATIO; round 19). XLA's 72 shapes stop at
#   2 x 4096^3 = 1.37e11 FLOPs (no m, n or k above 4096): a larger product on the H100 curve is an extrapolation
#   towards its asymptote. The GH100 timings this repository holds beyond that point are four of our H200's
#   (data/gemm_h200_measured.csv: 8192^3 and the three 128256-wide vocabulary products of a 1.2B Llama; the H200
#   is the H100 SXM's chip at the same 700 W and clocks); **measured** over the H100 curve they run 0.999, 0.986,
#   0.907, 0.949 of it, geometric mean 0.959 (published18.large_ratio; no training row in it). So an H100 GEMM of
#   more FLOPs than XLA's largest takes 1 / 0.959 of its curve seconds (bf16 and FP8, every stack;
#   Hardware.large_gemm_flops / large_gemm_ratio). The h200 preset's curve was fitted on those shapes themselves
#   (its table reaches 2.15e12 FLOPs), so nothing is extrapolated there and it carries no ceiling.
LARGE_GEMM_FLOPS = 2.0 * 4096 ** 3
H100_LARGE_GEMM_RATIO = 0.959
# * In-kernel attention dropout on Hopper (round 20; docs/planner/round20-selective-op-dropout.md). Megatron-Core +
#   Transformer Engine runs the attention core in cuDNN's fused kernel (F16_arbitrary_seqlen) with or without
#   dropout: TE's get_attention_backend disables FlashAttention 3 under dropout and prefers FusedAttention over
#   flash-attn 2 on sm90. Its published cost: NVIDIA/TransformerEngine issue 3312, one DotProductAttention forward +
#   backward on H200 (sm90, the H100's SM; TE 2.15.0), bf16, 4096 tokens in 4 sequences, 16 heads, head 128, the
#   fused backend forced, Megatron's sbhd layout: 0.594 ms at p 0, 0.614 ms at p 0.1. Published, not fitted; keyed
#   by the flash rates a preset uses (every Hopper preset uses the H100's); no A100 or PyTorch-SDPA figure.
HOPPER_ATTENTION_DROPOUT = 0.614 / 0.594
ATTENTION_DROPOUT_COST = {"h100-80g": HOPPER_ATTENTION_DROPOUT}


@dataclass(frozen=True)
class Gemm:
    """One matrix multiply, `batch` independent (m x k) (k x n) products in one kernel (attention's per-head
    products are one batched kernel).

    Attributes:
        m, n, k: output rows, output columns, reduction length.
        batch: products in the kernel.
    """

    m: int
    n: int
    k: int
    batch: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    @property
    def operand_elements(self) -> float:
        """Elements read (both operands) and written (the output): the kernel's minimum HBM traffic."""
        return float(self.batch) * (self.m * self.k + self.k * self.n + self.m * self.n)

    def backward(self) -> tuple["Gemm", "Gemm"]:
        """The two products of its backward: the input gradient dY W^T (m x n)(n x k) and the weight (or second
        operand) gradient X^T dY (k x m)(m x n)."""
        return Gemm(self.m, self.k, self.n, self.batch), Gemm(self.k, self.n, self.m, self.batch)


FLASH_SEQS = (512, 1024, 2048, 4096, 8192, 16384)  # the FlashAttention-2 paper's benchmark lengths


class AttentionKernel(enum.Enum):
    """Which flash-attention kernel a run's attention core uses (Workload.attention_kernel): its rate and the head
    width its tiles compute.

    FLASH2: FlashAttention-2 (flash-attn >= 2, PyTorch's SDPA flash backend; the presets' flash_efficiency),
        head dimension rounded up to its compiled tile widths 32, 64, 96, ..., 256 (flash-attn v2.4.2
        csrc/flash_attn/src/static_switch.h, HEADDIM_SWITCH: 80 -> 96, 112 -> 128).
    FLASH1: FlashAttention-1 (flash-attn 1.x, CUDA) at its published rate (FLASH_FWD_BWD_TFLOPS), head dimension
        rounded up to a power of two.
    TRITON: llm-foundry's `attn_impl: triton` (its default until 0.7; llmfoundry/models/layers/flash_attn_triton.py,
        HazyResearch's FlashAttention-1-class Triton kernel), which MosaicML's published MPT tables ran, at
        TRITON_FLASH2_SHARE x FlashAttention-2's published rate on every card (fitted: no published rate of it
        exists), head dimension rounded up to a power of two (`BLOCK_HEADDIM = max(triton.next_power_of_2(d),
        16)`: 80 -> 128, 112 -> 128).
    """

    FLASH2 = "flash2"
    FLASH1 = "flash1"
    TRITON = "triton"

    def padded_head_dim(self, d: int) -> int:
        """The head width the kernel's tiles compute for a head of width d (the FLOPs it runs: x padded / d)."""
        if self is not AttentionKernel.FLASH2:
            return max(16, 1 << (d - 1).bit_length())
        return max(32, -(-d // 32) * 32)

    @property
    def stack_clocked(self) -> bool:
        """Does the PyTorch stack's clock (Hardware.eager_clock) scale this kernel's rate? The published kernel
        benchmarks (FLASH1, FLASH2) are a kernel alone, so yes; TRITON's share was fitted on PyTorch-native
        training steps, so the stack's clock is in it already."""
        return self is not AttentionKernel.TRITON

    def efficiency(self, hw: "Hardware", head_dim: int = 128, seq: int = FLASH_SEQS[-1],
                   causal: bool = True) -> float | None:
        """Its share of hw's peak on the FLOPs it executes (causal: half the square; its padded head width), forward
        and backward alike, for heads of width head_dim over seq tokens: hw.flash_efficiency (FlashAttention-2 at
        16k, causal, head 128; the stack clock included) times the kernel's published rate at (head_dim, seq,
        causal) over that point's, from the table of hw.flash_rates. Without a table (a device built by hand)
        FLASH2 runs at hw.flash_efficiency flat and FLASH1 is refused (no published rate). TRITON runs at
        TRITON_FLASH2_SHARE x FlashAttention-2's rate at its padded width (flat without a table)."""
        if hw.flash_efficiency is None:
            return None
        share, rated = (TRITON_FLASH2_SHARE, AttentionKernel.FLASH2) if self is AttentionKernel.TRITON else (1.0, self)
        if hw.flash_rates is None:
            if rated is AttentionKernel.FLASH2:
                return share * hw.flash_efficiency
            raise ValueError(f"Workload.attention_kernel flash1 has no published rate on {hw.name} (no kernel "
                             f"benchmark table: Hardware.flash_rates); plan flash2 (the default)")
        return share * hw.flash_efficiency * flash_tflops(hw.flash_rates, rated, self.padded_head_dim(head_dim), seq,
                                                          causal) / flash_tflops(hw.flash_rates, AttentionKernel.FLASH2,
                                                                                 128, FLASH_SEQS[-1], True)


class GpuKind(enum.Enum):
    """Accelerator presets (`--gpu`)."""

    A100_80G = "a100-80g"
    H100_80G = "h100-80g"
    H100_96G_500W = "h100-96g-500w"  # torchtitan's Grand Teton H100: 96 GB HBM2e, 2.4 TB/s, 500 W power limit
    H200 = "h200"
    CPU = "cpu"


# Forward + backward TFLOP/s of the flash kernels, **published**: FlashAttention-2 paper (Dao 2023, arXiv 2307.08691)
# Figure 4 (A100 80GB SXM4) and Figure 7 (H100 80GB SXM5), read off the figures' images in Dao-AILab/flash-attention
# assets/flash2_{a100,h100}_fwd_bwd_benchmark.png (4f285b3), at FLASH_SEQS (batch x sequence = 16k tokens, hidden
# 2048: 32 / 16 heads of 64 / 128; fp16). Key: (card, kernel, head dimension, causal mask). FLASH1 is the bar
# "FlashAttention" (flash-attn 1.x, CUDA; see FLASH1_A100 for why not the "FlashAttention Triton" bar). The FLOPs
# the rates count (benchmarks/benchmark_flash_attention.py at 60499ab, `flops`): 4 x batch x s^2 x heads x head_dim
# for the forward, halved with a causal mask, the backward 2.5x the forward, forward + backward 3.5x -- the count
# time.py's flash_seconds uses (ops: attention_core_flops / 2, FLASH_BACKWARD). A100 FlashAttention-2 without the
# mask is left out: the legend covers its 512 and 1k labels.
FLASH_FWD_BWD_TFLOPS: dict[tuple[GpuKind, AttentionKernel, int, bool], tuple[float, ...]] = {
    (GpuKind.A100_80G, AttentionKernel.FLASH2, 128, True): (99.0, 133.0, 155.0, 173.0, 182.0, 189.0),  # 4(d)
    (GpuKind.A100_80G, AttentionKernel.FLASH2, 64, True): (88.0, 119.0, 140.0, 156.0, 165.0, 171.0),  # 4(c)
    (GpuKind.A100_80G, AttentionKernel.FLASH1, 128, True): (55.0, 62.0, 69.0, 76.0, 80.0, 83.0),  # 4(d)
    (GpuKind.A100_80G, AttentionKernel.FLASH1, 64, True): (58.0, 70.0, 77.0, 87.0, 92.0, 97.0),  # 4(c)
    (GpuKind.A100_80G, AttentionKernel.FLASH1, 128, False): (76.0, 72.0, 76.0, 80.0, 82.0, 83.0),  # 4(b)
    (GpuKind.A100_80G, AttentionKernel.FLASH1, 64, False): (91.0, 92.0, 104.0, 108.0, 110.0, 110.0),  # 4(a)
    (GpuKind.H100_80G, AttentionKernel.FLASH2, 128, True): (163.0, 221.0, 265.0, 294.0, 308.0, 328.0),  # 7(d)
    (GpuKind.H100_80G, AttentionKernel.FLASH2, 64, True): (141.0, 192.0, 232.0, 257.0, 273.0, 284.0),  # 7(c)
    (GpuKind.H100_80G, AttentionKernel.FLASH2, 128, False): (248.0, 294.0, 320.0, 326.0, 335.0, 338.0),  # 7(b)
    (GpuKind.H100_80G, AttentionKernel.FLASH2, 64, False): (215.0, 254.0, 274.0, 288.0, 294.0, 296.0),  # 7(a)
    (GpuKind.H100_80G, AttentionKernel.FLASH1, 128, True): (98.0, 109.0, 108.0, 126.0, 135.0, 137.0),  # 7(d)
    (GpuKind.H100_80G, AttentionKernel.FLASH1, 64, True): (104.0, 123.0, 136.0, 138.0, 149.0, 156.0),  # 7(c)
    (GpuKind.H100_80G, AttentionKernel.FLASH1, 128, False): (127.0, 127.0, 128.0, 131.0, 137.0, 139.0),  # 7(b)
    (GpuKind.H100_80G, AttentionKernel.FLASH1, 64, False): (157.0, 159.0, 161.0, 161.0, 166.0, 168.0),  # 7(a)
}


def flash_tflops(card: GpuKind | str, kernel: AttentionKernel, head_dim: int, seq: int, causal: bool = True) -> float:
    """The published forward + backward TFLOP/s of `kernel` on `card` for heads of (padded) width head_dim over seq
    tokens: the row of head dimension 64 for widths <= 64, else 128's (the figures have no other; FlashAttention-3's
    Figure 5 has FlashAttention-2's forward at 256 within 11 % of 128's); linear in log2(seq) between the benchmark
    lengths, flat beyond them (the rates level off by 8k-16k)."""
    card = GpuKind(card)
    key = (card, kernel, 64 if head_dim <= 64 else 128, causal)
    if key not in FLASH_FWD_BWD_TFLOPS:
        raise ValueError(f"Workload.attention_kernel {kernel.value} has no published rate on {card.value} "
                         f"({'causal' if causal else 'no mask'}, head {head_dim}); plan flash2 (the default)")
    rates = FLASH_FWD_BWD_TFLOPS[key]
    x = min(max(math.log2(seq), math.log2(FLASH_SEQS[0])), math.log2(FLASH_SEQS[-1])) - math.log2(FLASH_SEQS[0])
    i = min(int(x), len(rates) - 2)
    return rates[i] + (x - i) * (rates[i + 1] - rates[i])


# Hardware's fields that may be 0 (costs a device or an old profile does not have) but never negative: checked in
# Hardware itself and, with inter_dc_latency_s, in a profile file (calibrate._check_field).
ZERO_OK_FIELDS = ("gemm_overhead_s", "layer_forward_overhead_s", "layer_backward_overhead_s",
                  "tp_layer_forward_overhead_s", "tp_layer_backward_overhead_s",
                  "tp_embedding_forward_overhead_s", "tp_embedding_backward_overhead_s",
                  "tp_head_forward_overhead_s", "tp_head_backward_overhead_s",
                  "embedding_forward_overhead_s", "embedding_backward_overhead_s",
                  "head_forward_overhead_s", "head_backward_overhead_s", "kernel_overhead_s",
                  "collective_cpu_s", "p2p_cpu_s", "comm_cpu_s_per_byte",
                  "collective_skew_s", "collective_skew_per_s", "executor_forward_cpu_s", "executor_backward_cpu_s",
                  "optimizer_tensor_cpu_s", "optimizer_step_cpu_s")


_POSITIVE = {"low": 0, "low_open": True}
_FRACTION = {"low": 0, "high": 1, "low_open": True}  # (0, 1]
# Each number field of Hardware and its rule (check_number's arguments); a field added to Hardware needs a rule
# here (tests/test_inputs15_hardware.py asks). Latencies may be 0 (the planner's what-ifs of a free link).
FIELD_RULES: dict[str, dict] = {
    **{name: _POSITIVE for name in ("peak_tflops", "memory_gb", "hbm_tbps", "intra_node_gbps", "inter_node_gbps",
                                    "pcie_gbps", "host_memory_gb", "cpu_adam_params_per_s", "memory_bytes",
                                    "elementwise_tbps", "fp8_tflops", "inter_dc_gbps", "large_gemm_flops")},
    **{name: {"low": 1, "integer": True} for name in ("gpus_per_node", "compute_units")},
    **{name: _FRACTION for name in ("compute_efficiency", "flash_efficiency", "eager_clock", "large_gemm_ratio")},
    **{name: {"low": 0} for name in ("intra_latency_s", "inter_latency_s", "inter_dc_latency_s") + ZERO_OK_FIELDS},
    "overlap_slowdown": {"low": 1},
}
NULLABLE_FIELDS = ("compute_units", "memory_bytes", "elementwise_tbps", "flash_efficiency", "fp8_tflops",
                   "inter_dc_gbps", "inter_dc_latency_s", "large_gemm_flops")
# the flag that sets a field, named in its error (`hybrid plan`'s overrides; the inter-DC link's seconds are
# --inter-dc-latency's milliseconds / 1000)
FIELD_FLAGS = {"peak_tflops": "--gpu-tflops", "memory_gb": "--gpu-memory", "gpus_per_node": "--gpus-per-node",
               "intra_node_gbps": "--intra-node-bandwidth", "inter_node_gbps": "--inter-node-bandwidth",
               "compute_efficiency": "--compute-efficiency", "gemm_overhead_s": "--gemm-overhead",
               "inter_dc_gbps": "--inter-dc-bandwidth",
               "inter_dc_latency_s": "inter_dc_latency_s (--inter-dc-latency / 1000)"}


def check_field(label: str, name: str, value, show=repr) -> None:
    """ValueError "{label} must be {kind}, got {show(value)}" unless `value` meets Hardware field `name`'s rule
    (FIELD_RULES; None is not a number: the caller lets a nullable field's None through)."""
    check_number(label, value, **FIELD_RULES[name], show=show)


@dataclass(frozen=True)
class Hardware:
    """One accelerator and the links around it.

    Attributes:
        name: preset name, for tables.
        peak_tflops: dense bf16 peak of one device, TFLOP/s (`--gpu-tflops`).
        memory_gb: device memory, GB (`--gpu-memory`).
        hbm_tbps: device memory bandwidth, TB/s (times memory-bound work: elementwise ops, the optimizer).
        gpus_per_node: devices sharing one NVLink domain and one host (`--gpus-per-node`).
        intra_node_gbps: achievable NVLink bandwidth inside a node, GB/s, as nccl-tests bus bandwidth: a
            collective moving W wire bytes per rank takes W / this (`--intra-node-bandwidth`).
        inter_node_gbps: achievable network bandwidth per device (one NIC per GPU), GB/s, per direction
            (`--inter-node-bandwidth`).
        pcie_gbps: achievable host <-> device bandwidth per device, GB/s (offload traffic).
        host_memory_gb: host memory per node, GB (holds offloaded optimizer states and parameters).
        cpu_adam_params_per_s: parameters per second one node's CPUs update with Adam (DeepSpeed CPU-Adam,
            ZeRO-Offload, Ren et al. 2021: ~1e9 parameters in ~0.2 s on a two-socket server).
        intra_latency_s: fixed cost of one collective or message inside a node, seconds.
        inter_latency_s: fixed cost of one collective or message across nodes, seconds.
        compute_efficiency: asymptotic fraction of `peak_tflops` a large matmul sustains (`--compute-efficiency`),
            the e of the GEMM curve above.
        gemm_overhead_s: fixed seconds of one matmul kernel, the t0 of the GEMM curve (`--gemm-overhead`):
            what makes small matmuls run below peak x e.
        memory_bytes: what the device really holds, bytes: an "80 GB" A100 or H100 has 80 GiB-class HBM (81920 /
            81559 MiB by nvidia-smi = 85.9e9 / 85.5e9 bytes); an H200 "141 GB" shows 143771 MiB in nvidia-smi but
            gives CUDA 150,109,880,320 bytes (143156 MiB: torch.cuda.get_device_properties().total_memory on the
            H200 of docs/results/gpu_h200.md), which is what allocations can use. None: memory_gb x 1e9 (a
            `--gpu-memory` value is taken as stated).
            The planner's demand already carries the reserve (memory.WORKSPACE_BYTES, 2 GB: CUDA context,
            cuBLAS / NCCL workspaces, buckets; plus memory.FRAGMENTATION of the tensors).
        elementwise_tbps: the rate a Transformer layer's memory-bound kernels (norms, activations, softmax,
            residual adds) and the optimizer reach, TB/s of the traffic the planner counts for them; None:
            hbm_tbps (a GPU, where they are bandwidth-bound). `hybrid calibrate` measures it from one real layer
            (on a CPU core GELU's tanh and softmax's exp are slower than moving their bytes).
        layer_forward_overhead_s, layer_backward_overhead_s: fixed seconds of one layer's forward / backward
            pass beyond its kernels' work (framework overhead on a CPU: Python, the dispatcher, autograd),
            calibrated with elementwise_tbps on a CPU; 0 on GPUs, where kernel_overhead_s prices it per kernel.
        tp_layer_forward_overhead_s, tp_layer_backward_overhead_s: what one layer's forward / backward pass at
            tp > 1 costs beyond the same pass unsharded, less what the sharded GEMMs and bytes already change
            (on a CPU: the TP autograd Functions and their Python, the first touches after each blocking
            all-reduce); `hybrid calibrate`'s pair probe times a 1-token layer at tp 2 and unsharded on each pair
            (calibrate.fit_tp_pass). Read only at tp > 1; 0 on GPUs and in profiles older than the field.
        tp_embedding_forward_overhead_s, tp_embedding_backward_overhead_s, tp_head_forward_overhead_s,
            tp_head_backward_overhead_s: the same for a pipeline stage's edges, one micro-batch's pass: the first
            stage's vocab-parallel embedding (its masks, its exit all-reduce's wake-up) and the last's final norm,
            vocab-parallel LM head and cross-entropy (an autograd Function of ~15 ops and three all-reduces where
            unsharded runs torch's fused loss); `hybrid calibrate`'s pair probe times the runtime's edge-only GPT-2
            stages at one token, tp 2 and unsharded (calibrate.fit_edge_pass). Read only at tp > 1 (time._edge_cost);
            0 on GPUs and in profiles older than the fields.
        embedding_forward_overhead_s, embedding_backward_overhead_s, head_forward_overhead_s,
            head_backward_overhead_s: fixed seconds of a pipeline stage's edge pass at any tp beyond its kernels'
            work (the stage's Python around them, the dispatcher, autograd), as layer_*_overhead_s for a layer:
            the unsharded edge-only stage's pass at one token less the planner's kernels for it
            (calibrate.fit_edge_pass, round 25; the tp_* fields above are what tp > 1 adds beyond it). 0 on GPUs
            and in profiles older than the fields.
        kernel_overhead_s: seconds each memory-bound kernel costs beyond its bytes (launch, the first and last
            wave of a kernel too small to fill the device; ops.py counts the kernels), `hybrid calibrate`'s layer
            fit on a GPU; 0 on CPUs (the per-pass costs above).
        flash_efficiency: fraction of `peak_tflops` FlashAttention-2 sustains on the FLOPs it executes (causal:
            half the s x s square) at 16k tokens, head 128, forward and backward alike (flash_rates: its shape);
            None: the attention core is timed as its batched GEMMs on the curve (a materialised softmax, or a CPU,
            whose calibrated layer fit includes it).
        flash_rates: the card (its `--gpu` name) whose published kernel benchmarks (FLASH_FWD_BWD_TFLOPS) shape
            the flash rate by kernel, head width and sequence length around flash_efficiency
            (AttentionKernel.efficiency); None (a device built by hand, a CPU): flash_efficiency flat,
            FlashAttention-2 only. The H200 and the 500 W H100
            take the H100's (same SMs; no published figure of their own).
        fp8_tflops: dense FP8 tensor-core peak, TFLOP/s (`--fp8`); None: the device has no FP8 GEMMs.
        compute_units: processors the devices of one node share, when they share (a CPU's cores, with one
            gloo rank per device and one thread per rank); None when each device computes on its own (GPUs).
            With more devices than units, `peak_tflops` is one device's rate while the others idle, and the
            node's devices together compute at most compute_units x that (time.py: the shared-compute bound).
        collective_cpu_s, p2p_cpu_s, comm_cpu_s_per_byte: with shared compute units (a CPU, gloo), the CPU
            seconds a rank's process burns per 2-rank all-reduce call, per point-to-point message (a send or a
            receive), and per wire byte (`hybrid calibrate`'s pair probe): copying, reducing and gloo's threads.
            With more ranks than cores that is work the cores do besides compute (time.py: the shared-compute
            bound). 0: not measured (presets, GPUs).
        collective_skew_s, collective_skew_per_s: with a core per rank (gloo on a CPU, no more ranks than cores),
            what a synchronous collective waits beyond its back-to-back time (latency + bytes / bandwidth, the
            fields above) for its ranks to meet after c seconds of compute since their last sync:
            wait(c) = collective_skew_s + collective_skew_per_s x c, the ranks' skew -- one finishes its compute
            later, the other waits inside the call, and a rank blocked in the call must be woken
            (`sync_wait_seconds`; `hybrid calibrate`'s skew probe: 8-byte all-reduces after matmul bursts of
            three lengths). 0: not measured (presets, GPUs, ranks sharing cores: there the shared-compute bound
            prices the waiting).
        executor_forward_cpu_s, executor_backward_cpu_s: a calibrated CPU's pipeline executor (hybrid/pipeline/
            executor.py) per forward / backward action, beyond the model's call and the messages: its Python (the
            schedule walk, the op trail's phase switch, requires_grad_, the loss's 1/m, the input gradient's
            hand-over), priced per chunk pass whenever the executor runs (pp > 1 or v > 1; time._stage_cost,
            `hybrid plan --explain`'s "executor"). `hybrid calibrate`'s pair probe runs the executor over a pair
            as pp 2 (calibrate.executor_action_cpu). 0: not measured (presets, GPUs, older profiles).
        optimizer_tensor_cpu_s, optimizer_step_cpu_s: a calibrated CPU's optimizer work beyond its bytes, per
            parameter tensor of the rank and per step (the ZeroOptimizer's Python around torch's fused AdamW, the
            clip norm's, the gradient buckets' bookkeeping): `hybrid calibrate` times the runtime's optimizer on
            one-token GPT-2 stages of two sizes (calibrate.optimizer_step_cpu). Added to the optimizer term
            (time._optimizer_seconds). 0: not measured (presets, GPUs, older profiles).
        inter_dc_gbps: GB/s per direction of the link between two sites the DP replicas are split over
            (`--inter-dc-bandwidth`; hybrid/planner/slowlink.py); None: one site, no such link.
        inter_dc_latency_s: one-way seconds of a message over that link (`--inter-dc-latency`, in ms there);
            None: 0.
        eager_clock: the sustained tensor-core rate of PyTorch-native training (`--stack pytorch`, eager or
            torch.compile'd; Workload.pytorch_native) relative to `compute_efficiency` and `flash_efficiency`, which
            then both scale by it (`for_stack`); 1: the same rate as Megatron / TE. Fitted for h100-80g
            (H100_EAGER_CLOCK; the name is the fit rows' kernels, eager); a
            `--compute-efficiency` or a calibrated curve replaces it (with_overrides resets it to 1).
        overlap_slowdown: how many times longer compute kernels take while a ZeRO 2/3 collective runs under them
            (OVERLAP_SLOWDOWN on GPUs: NCCL's CTAs take SMs and HBM bandwidth from them); 1: overlap is free (a CPU,
            whose collectives' own work `collective_cpu_s` and the shared-compute bound price instead).
        large_gemm_flops, large_gemm_ratio: a matmul of more FLOPs than large_gemm_flops runs at large_gemm_ratio of
            the curve's rate (gemm_seconds: its seconds / the ratio): where the curve's table stops and the
            measured large products run below its extrapolation (H100 presets: LARGE_GEMM_FLOPS,
            H100_LARGE_GEMM_RATIO). None / 1: the curve everywhere.
    """

    name: str
    peak_tflops: float
    memory_gb: float
    hbm_tbps: float
    gpus_per_node: int
    intra_node_gbps: float
    inter_node_gbps: float
    pcie_gbps: float
    host_memory_gb: float
    cpu_adam_params_per_s: float
    intra_latency_s: float = 10e-6
    inter_latency_s: float = 30e-6
    compute_efficiency: float = COMPUTE_EFFICIENCY
    compute_units: int | None = None
    memory_bytes: float | None = None
    gemm_overhead_s: float = 0.0
    elementwise_tbps: float | None = None
    layer_forward_overhead_s: float = 0.0
    layer_backward_overhead_s: float = 0.0
    tp_layer_forward_overhead_s: float = 0.0
    tp_layer_backward_overhead_s: float = 0.0
    tp_embedding_forward_overhead_s: float = 0.0
    tp_embedding_backward_overhead_s: float = 0.0
    tp_head_forward_overhead_s: float = 0.0
    tp_head_backward_overhead_s: float = 0.0
    embedding_forward_overhead_s: float = 0.0
    embedding_backward_overhead_s: float = 0.0
    head_forward_overhead_s: float = 0.0
    head_backward_overhead_s: float = 0.0
    kernel_overhead_s: float = 0.0
    flash_efficiency: float | None = None
    flash_rates: str | None = None
    fp8_tflops: float | None = None
    inter_dc_gbps: float | None = None
    inter_dc_latency_s: float | None = None
    eager_clock: float = 1.0
    overlap_slowdown: float = 1.0
    collective_cpu_s: float = 0.0
    p2p_cpu_s: float = 0.0
    comm_cpu_s_per_byte: float = 0.0
    collective_skew_s: float = 0.0
    collective_skew_per_s: float = 0.0
    executor_forward_cpu_s: float = 0.0
    executor_backward_cpu_s: float = 0.0
    optimizer_tensor_cpu_s: float = 0.0
    optimizer_step_cpu_s: float = 0.0
    large_gemm_flops: float | None = None
    large_gemm_ratio: float = 1.0

    def __post_init__(self) -> None:
        """Every number field by its rule in FIELD_RULES (check_number, the typed configs' one check: a bool, NaN
        and the infinities fail every rule); the name a string, flash_rates a card with published rates. The
        error names the field by the flag that sets it where one does (`hybrid plan --gpu-memory`)."""
        if not isinstance(self.name, str):
            raise ValueError(f"Hardware.name must be a string, got {self.name!r}")
        for name in FIELD_RULES:
            value = getattr(self, name)
            if not (value is None and name in NULLABLE_FIELDS):
                check_field(FIELD_FLAGS.get(name, f"Hardware.{name}"), name, value)
        cards = sorted({key[0].value for key in FLASH_FWD_BWD_TFLOPS})
        if self.flash_rates is not None and self.flash_rates not in cards:
            raise ValueError(f"flash_rates must be None or a card with published flash rates ({', '.join(cards)}), "
                             f"got {self.flash_rates!r}")

    def shared_compute_factor(self, devices_per_node: int) -> float:
        """How many times longer all devices of a node take to compute together than one alone: devices /
        compute units when they oversubscribe the units, else 1."""
        if self.compute_units is None or devices_per_node <= self.compute_units:
            return 1.0
        return devices_per_node / self.compute_units

    @property
    def capacity_bytes(self) -> float:
        """Device bytes a plan may fill (see memory_bytes)."""
        return self.memory_bytes if self.memory_bytes is not None else self.memory_gb * GB

    @property
    def on_host(self) -> bool:
        """CPU hardware (the cpu preset, a gloo calibration: compute_units set): its ranks are processes of one
        host, whose memory train.py measures as peak RSS in MiB (2^20 bytes), not a GPU's in GB (1e9 bytes)."""
        return self.compute_units is not None or self.name == "cpu"

    @property
    def elementwise_bytes_per_s(self) -> float:
        """Bytes/s of memory-bound kernels: elementwise_tbps when measured, else the HBM bandwidth."""
        return (self.elementwise_tbps or self.hbm_tbps) * 1e12

    @property
    def streaming_bytes_per_s(self) -> float:
        """Bytes/s of a plain streaming pass with no arithmetic to speak of (a gradient added into the accumulated
        one): on a calibrated CPU (shared compute units) the copy rate `hbm_tbps` measured there -- its
        `elementwise_tbps` is the layer's mix, where GELU's tanh and softmax's exp run 3-4x below the copy rate
        (calibrate.py), and an add of two fp32 tensors ran at the copy rate on this VM (49 against 45 GB/s
        read + written, 4.2M parameters in the 4-layer ranking model's tensors, CPU clock); on a GPU
        elementwise_bytes_per_s, the achievable share of the data sheet's HBM (ELEMENTWISE_FRACTION: a copy)."""
        return self.hbm_tbps * 1e12 if self.compute_units is not None else self.elementwise_bytes_per_s

    @property
    def overlap_cost(self) -> float:
        """Seconds of compute lost per second a collective runs under it: 1 - 1 / overlap_slowdown (in those
        seconds the compute advances 1 / overlap_slowdown of a second)."""
        return 1.0 - 1.0 / self.overlap_slowdown

    @property
    def achievable_flops(self) -> float:
        """FLOP/s a large matmul approaches: peak x compute_efficiency (the GEMM curve's asymptote)."""
        return self.peak_tflops * 1e12 * self.compute_efficiency

    def gemm_seconds(self, gemm: "Gemm", dtype_bytes: int, fp8: bool = False) -> float:
        """Seconds of one (batched) matmul: max(compute, operand traffic) + the fixed cost (the GEMM curve). With
        `fp8` the product runs at the FP8 peak (same asymptotic efficiency) on 1-byte operands. A product beyond
        large_gemm_flops takes 1 / large_gemm_ratio of that (the ratio is measured rate over the curve's, fixed
        cost included)."""
        if fp8 and self.fp8_tflops is None:
            raise ValueError(f"--fp8: {self.name} has no FP8 tensor cores (plan bf16, or an h100 / h200)")
        peak = self.fp8_tflops if fp8 else self.peak_tflops
        compute = gemm.flops / (peak * 1e12 * self.compute_efficiency)
        traffic = (1 if fp8 else dtype_bytes) * gemm.operand_elements / (self.hbm_tbps * 1e12)
        seconds = max(compute, traffic) + self.gemm_overhead_s
        if self.large_gemm_flops is not None and gemm.flops > self.large_gemm_flops:
            return seconds / self.large_gemm_ratio
        return seconds

    def gemm_flops(self, gemm: "Gemm", dtype_bytes: int) -> float:
        """Achieved FLOP/s of `gemm`: its FLOPs over gemm_seconds."""
        return gemm.flops / self.gemm_seconds(gemm, dtype_bytes)

    def with_overrides(self, **changes: float | int | None) -> "Hardware":
        """A copy with the given fields replaced; None values are ignored (unset CLI flags). A stated GEMM
        asymptote or flash rate is the rate the workload runs at: it drops the preset's eager_clock."""
        changes = {k: v for k, v in changes.items() if v is not None}
        if "memory_gb" in changes and "memory_bytes" not in changes:
            changes["memory_bytes"] = None  # a stated --gpu-memory replaces the preset's measured capacity
        if ("compute_efficiency" in changes or "flash_efficiency" in changes) and "eager_clock" not in changes:
            changes["eager_clock"] = 1.0
        return replace(self, **changes)

    def for_stack(self, pytorch: bool, flash_clocked: bool = True) -> "Hardware":
        """The device as a workload of that software stack sees it (Workload.pytorch_native): for PyTorch-native
        training, eager or torch.compile'd, the GEMM asymptote and (flash_clocked: its attention kernel's
        AttentionKernel.stack_clocked) the flash rate times eager_clock; for Megatron / Transformer Engine,
        itself."""
        if not pytorch or self.eager_clock == 1.0:
            return self
        clock = self.eager_clock if flash_clocked else 1.0
        flash = None if self.flash_efficiency is None else self.flash_efficiency * clock
        return replace(self, compute_efficiency=self.compute_efficiency * self.eager_clock, flash_efficiency=flash,
                       eager_clock=1.0)


PRESETS: dict[GpuKind, Hardware] = {
    GpuKind.A100_80G: Hardware(name="a100-80g", peak_tflops=312.0, memory_gb=80.0, hbm_tbps=2.039,
                               gpus_per_node=8, intra_node_gbps=230.0, inter_node_gbps=23.5, pcie_gbps=25.0,
                               host_memory_gb=2000.0, cpu_adam_params_per_s=5e9,
                               memory_bytes=81920 * MIB, compute_efficiency=A100_EFFICIENCY,
                               gemm_overhead_s=GEMM_OVERHEAD_S, elementwise_tbps=2.039 * ELEMENTWISE_FRACTION,
                               kernel_overhead_s=KERNEL_OVERHEAD_S, flash_efficiency=A100_FLASH,
                               flash_rates=GpuKind.A100_80G.value,
                               overlap_slowdown=OVERLAP_SLOWDOWN),
    GpuKind.H100_80G: Hardware(name="h100-80g", peak_tflops=989.0, memory_gb=80.0, hbm_tbps=3.35,
                               gpus_per_node=8, intra_node_gbps=450.0, inter_node_gbps=47.0, pcie_gbps=50.0,
                               host_memory_gb=2000.0, cpu_adam_params_per_s=5e9,
                               memory_bytes=81559 * MIB, compute_efficiency=H100_EFFICIENCY,
                               gemm_overhead_s=GEMM_OVERHEAD_S, elementwise_tbps=3.35 * ELEMENTWISE_FRACTION,
                               kernel_overhead_s=KERNEL_OVERHEAD_S, flash_efficiency=HOPPER_FLASH,
                               flash_rates=GpuKind.H100_80G.value,
                               fp8_tflops=HOPPER_FP8_TFLOPS, eager_clock=H100_EAGER_CLOCK,
                               overlap_slowdown=OVERLAP_SLOWDOWN, large_gemm_flops=LARGE_GEMM_FLOPS,
                               large_gemm_ratio=H100_LARGE_GEMM_RATIO),
    GpuKind.H100_96G_500W: Hardware(name="h100-96g-500w", peak_tflops=989.0, memory_gb=96.0, hbm_tbps=2.4,
                                    gpus_per_node=8, intra_node_gbps=450.0, inter_node_gbps=47.0, pcie_gbps=50.0,
                                    host_memory_gb=2000.0, cpu_adam_params_per_s=5e9,
                                    memory_bytes=H100_96G_BYTES,
                                    compute_efficiency=H100_EFFICIENCY * H100_500W_CLOCK,
                                    gemm_overhead_s=GEMM_OVERHEAD_S, elementwise_tbps=2.4 * ELEMENTWISE_FRACTION,
                                    kernel_overhead_s=KERNEL_OVERHEAD_S,
                                    flash_efficiency=HOPPER_FLASH * H100_500W_CLOCK, fp8_tflops=HOPPER_FP8_TFLOPS,
                                    flash_rates=GpuKind.H100_80G.value,
                                    overlap_slowdown=OVERLAP_SLOWDOWN,
                                    eager_clock=H100_EAGER_CLOCK, large_gemm_flops=LARGE_GEMM_FLOPS,
                                    large_gemm_ratio=H100_LARGE_GEMM_RATIO),
    GpuKind.H200: Hardware(name="h200", peak_tflops=989.0, memory_gb=141.0, hbm_tbps=4.8,
                           gpus_per_node=8, intra_node_gbps=450.0, inter_node_gbps=47.0, pcie_gbps=50.0,
                           host_memory_gb=2000.0, cpu_adam_params_per_s=5e9, memory_bytes=H200_CUDA_BYTES,
                           compute_efficiency=H200_EFFICIENCY, gemm_overhead_s=H200_GEMM_OVERHEAD_S,
                           elementwise_tbps=4.8 * ELEMENTWISE_FRACTION, kernel_overhead_s=KERNEL_OVERHEAD_S,
                           flash_efficiency=HOPPER_FLASH, fp8_tflops=HOPPER_FP8_TFLOPS,
                           flash_rates=GpuKind.H100_80G.value,
                           overlap_slowdown=OVERLAP_SLOWDOWN),
    GpuKind.CPU: Hardware(name="cpu", peak_tflops=1.0, memory_gb=64.0, hbm_tbps=0.1, gpus_per_node=8,
                          intra_node_gbps=5.0, inter_node_gbps=1.2, pcie_gbps=100.0, host_memory_gb=512.0,
                          cpu_adam_params_per_s=1e9, intra_latency_s=50e-6, inter_latency_s=100e-6),
}


def hardware(kind: GpuKind | str) -> Hardware:
    """The preset for `kind` (a GpuKind or its `--gpu` name)."""
    if isinstance(kind, str):
        try:
            kind = GpuKind(kind)
        except ValueError:
            raise ValueError(f"--gpu {kind!r} is not a preset; choose one of "
                             f"{', '.join(k.value for k in GpuKind)}") from None
    return PRESETS[kind]


class Collective(enum.Enum):
    """Collectives the planner times. Sizes follow the ledger (hybrid/comm.py, nccl-tests' size S)."""

    ALL_REDUCE = "all_reduce"  # S = tensor bytes; ring wire bytes per rank 2(n-1)/n S
    ALL_GATHER = "all_gather"  # S = gathered output bytes; wire (n-1)/n S
    REDUCE_SCATTER = "reduce_scatter"  # S = full input bytes; wire (n-1)/n S


def wire_bytes(op: Collective, size_bytes: float, n: int) -> float:
    """Bytes each rank sends in a ring implementation (nccl-tests doc/PERFORMANCE.md)."""
    if n <= 1:
        return 0.0
    factor = 2.0 if op is Collective.ALL_REDUCE else 1.0
    return factor * (n - 1) / n * size_bytes


@dataclass(frozen=True)
class GroupPlacement:
    """Where the members of one process group sit.

    Attributes:
        size: ranks in the group.
        per_node: members of the group in one node (= size when the group fits in a node).
    """

    size: int
    per_node: int

    @property
    def spans_nodes(self) -> bool:
        return self.size > self.per_node


def group_bandwidth(hw: Hardware, group: GroupPlacement) -> float:
    """Achievable bus bandwidth (bytes/s) of a collective over `group`, with every group of its kind
    running at once (all TP groups reduce together, all DP groups too).

    Inside a node: NVLink bus bandwidth. Across nodes, the ring crosses each node boundary once per ring;
    NCCL runs one ring per NIC, and the node's gpus_per_node NICs are shared evenly by the
    gpus_per_node / per_node groups that have members there, so this group gets per_node NICs:
    busbw = min(NVLink, per_node x NIC bandwidth).
    """
    if not group.spans_nodes:
        return hw.intra_node_gbps * GB
    return min(hw.intra_node_gbps, group.per_node * hw.inter_node_gbps) * GB


def collective_seconds(hw: Hardware, op: Collective, size_bytes: float, group: GroupPlacement) -> float:
    """Time of one collective: latency + wire bytes per rank / bus bandwidth. 0 for a group of one."""
    if group.size <= 1 or size_bytes <= 0:
        return 0.0
    latency = hw.inter_latency_s if group.spans_nodes else hw.intra_latency_s
    return latency + wire_bytes(op, size_bytes, group.size) / group_bandwidth(hw, group)


def sync_wait_seconds(hw: Hardware, calls: int, compute: float) -> float:
    """Seconds `calls` synchronous collectives wait for their ranks to meet when `compute` seconds of compute run
    between them (the i-th after c_i of it, sum c_i = compute): sum_i wait(c_i) = calls x collective_skew_s +
    collective_skew_per_s x compute (wait is affine, so how the compute splits between the calls does not
    matter). 0 without calls or where the skew was not measured."""
    if calls <= 0:
        return 0.0
    return calls * hw.collective_skew_s + hw.collective_skew_per_s * compute


def p2p_seconds(hw: Hardware, size_bytes: float, crosses_nodes: bool) -> float:
    """One point-to-point message between pipeline neighbours: NVLink inside a node, the sender's NIC across."""
    if size_bytes <= 0:
        return 0.0
    if crosses_nodes:
        return hw.inter_latency_s + size_bytes / (hw.inter_node_gbps * GB)
    return hw.intra_latency_s + size_bytes / (hw.intra_node_gbps * GB)
