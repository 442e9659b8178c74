"""Time of one training step: compute, communication, the pipeline bubble (from the schedule simulation),
the data-parallel gradient synchronisation, the optimizer and offload traffic.

FLOPs (multiply-add = 2). Narayanan et al. 2021, eq. (3), per step with full recomputation:

    F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))

(4 layer passes -- forward, recomputed forward, 2 x backward -- of 24 b s h^2 + 4 b s^2 h each, and 3 passes
of the 2 b s h V logits). Without recomputation 72 B s l h^2 (1 + s/(6h) + V/(12 l h)). `FlopsFormula.EXACT`
counts the model's own shapes instead (GQA, SwiGLU, any f, the padded vocabulary, kv heads replicated when
t exceeds them); for GPT shapes the two agree exactly.

Per micro-batch, per global stage (what the simulation is fed):

    forward  = sum over its layers of [ sum over its matmuls of t(m, n, k)      (the GEMM curve, hardware.py:
                                            max(FLOPs / (peak x e), operand bytes / HBM) + t0)
                                        + 2 x saved bytes / HBM bandwidth + TP collectives ]
    backward = each forward matmul's two backward products (input and weight gradient, hardware.Gemm.backward),
               plus the recomputed forward's matmuls (full: all -- on the PyTorch stack all but the down
               projection, where torch's checkpoint stops early, _stops_early; selective: the attention core;
               bf16-flash: + QK^T, which flash attention's backward recomputes), and
               3 x the saved bytes (+ 2 x the recomputed ones) at HBM speed.

Memory-bound bytes of a layer = the activation bytes it saves (model.Shard.layer_activation_terms), each
written by the elementwise kernel that makes it and read by the next (forward, 2x); read with its incoming
gradient while the outgoing one is written (backward, 3x). This, and the GEMM curve (small matmuls run below
peak x e), is what makes a 2304-wide model slower per FLOP than a 25600-wide one: its s x s attention scores are
a large share of its bytes, its matmuls are small.

Communication (sizes in the ledger convention of hybrid/comm.py; time = latency + wire bytes / bus bandwidth,
hardware.collective_seconds):

* TP, on the critical path (Megatron runs them synchronously): per layer 2 all-reduces of b s h x 2 bytes in
  the forward and 2 in the backward (under SP an all-gather + reduce-scatter pair each, the same wire bytes),
  1 more in the backward under full recomputation (the rerun forward stops at the last tensor the backward needs:
  torch's non-reentrant checkpoint; under SP 3, predicted_comm.py); the embedding's forward all-reduce
  (stage 0), the LM-head input's backward all-reduce (last stage) and the vocab-parallel cross-entropy's 3
  all-reduces of b s fp32 values; under SP one all-reduce per step of the sequence-split parameters' gradients.
  A runtime whose plan gathers the input once per column-parallel projection (Workload.tp_plan PROJECTION:
  KempnerForge's DTensor plan) pays 5 all-gathers (forward, rerun) and 5 reduce-scatters (backward) a Llama layer
  where Megatron pays 2 (predicted_comm.tp_gathers). SP through torch DTensor on batch-first activations
  (Workload.sp_copies: torchtitan, KempnerForge) also copies each all-gathered and each reduce-scattered tensor
  through HBM on the compute stream (tp_copy_bytes), and torchao's Float8 TP all-gathers move float8
  (Workload.float8_tp_gathers).
* PP: one b s h x 2-byte message per stage boundary per micro-batch each way (/t under SP, where hidden states
  between stages are sequence-split), over NVLink or the sender's NIC; the simulation places them.
* DP: ZeRO 0 all-reduces the rank's 2 Psi gradient bytes (4 Psi with fp32 gradients, Workload.fp32_grads: every
  gradient byte count here doubles) and ZeRO 1 reduce-scatters them, counted after the last backward and not
  overlapped (the runtime's ZeroOptimizer posts them from backward hooks as buckets fill, so the model is
  conservative there) -- under Workload.overlap_grad_reduce (Megatron-core's flag) hidden under the last
  micro-batch's backward but for its last bucket, at the overlap's compute cost (`_dp_step_seconds`); ZeRO 1-2
  all-gather the updated 2 Psi parameter bytes (Psi bytes of FP8 weights, Workload.fp8_param_gather: round 22),
  overlapped with the next step's forward except the first bucket and what does not fit under the first forward,
  the hidden part at the overlap's compute cost as every hidden collective (`_dp_step_seconds`; the same wire
  bytes: the paper's 2 Psi). ZeRO 2 keeps only a gradient partition, so it reduce-scatters each micro-batch's
  gradients during that micro-batch's backward and all-gathers the parameters once per step;
  ZeRO 3 also all-gathers the parameters in each micro-batch's forward and backward: 3 Psi per micro-batch
  (the paper's 3 Psi at m = 1). Those per-micro-batch collectives overlap the stage's compute (prefetching),
  except what has nothing to run under (`_overlapped`): the first layer's all-gather of each forward and the
  last layer's reduce-scatter of each backward are exposed, and when the DP and TP rings share NVLink the DP
  traffic overlaps only the compute, not the TP collectives on the same link.
* Tied embeddings with pp > 1: one all-reduce of the embedding gradient between the first and the last stage.

Optimizer: Adam is memory-bound, 28 bytes per parameter of the rank's partition (read and write the fp32
master, momentum and variance, read the gradient, write the fp16 parameter) / HBM bandwidth. Offloaded, the
partition's gradients go down and its parameters come up over PCIe (4 bytes per parameter) and the node's
CPUs run Adam (hardware.cpu_adam_params_per_s, shared by the node's GPUs); parameter offload also fetches
each chunk's 2 Psi / Nd parameter bytes over PCIe in every micro-batch's forward and backward (overlapped).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from functools import lru_cache

from hybrid.pipeline import Placement
from hybrid.planner.hardware import (ATTENTION_DROPOUT_COST, GB, Collective, Gemm, GroupPlacement, Hardware,
                                     collective_seconds, p2p_seconds, sync_wait_seconds, wire_bytes)
from hybrid.planner.layout import (Cluster, Layout, Offload, PipelineP2P, Recompute, Workload, Zero3Runtime, ZeroStage,
                                   pipeline_crosses_nodes, rank_stages, replicate_placement, shard_placement,
                                   stage_layers, tp_placement)
from hybrid.planner.predicted_comm import (BUCKET_BYTES, Ledger, dp_microbatch_ledger, dp_step_ledger,
                                           hsdp_replicate_ledger, ledger_seconds, partial_grad_ledger, step_ledger,
                                           tp_ledger)
from hybrid.planner.predicted_memory import rank_parameters
from hybrid.planner.model import ActivationProfile, Precision, Shard
from hybrid.planner.ops import KernelProfile, Traffic, embedding_ops, fp8_casts, head_ops, layer_ops

MLP_ACTIVATIONS = ("gelu", "swiglu")  # ops.layer_ops' names of the op whose output the down projection reads
from hybrid.planner.schedule import SIM_BUDGET, PipelineRun, StageTimes, run_pipeline, run_shared



class FlopsFormula(enum.Enum):
    """How FLOPs are counted for TFLOP/s (`--flops-formula`)."""

    MEGATRON = "megatron"  # Narayanan et al. 2021 eq. (3) (GPT shapes: f = 4h, no GQA)
    EXACT = "exact"  # the model's own shapes


def megatron_step_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int, recompute: bool = True) -> float:
    """FLOPs of one step, Narayanan et al. 2021 eq. (3) (with full recomputation) or its 72-factor form."""
    B, s, l, h, V = batch, seq, layers, hidden, vocab
    if recompute:
        return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def exact_step_flops(work: Workload, tp: int = 1, recompute: Recompute = Recompute.NONE,
                     stops_early: bool = False) -> float:
    """FLOPs all GPUs execute in one step, from the model's shapes at tensor-parallel size `tp`; `stops_early`
    (recompute_stops_early): selective-op's rerun ends before a non-gated MLP's last matmul."""
    shard = work.shard(tp)
    s = work.seq_length
    layer = 3 * shard.layer_forward_flops(1, s) + _recompute_flops(shard, 1, s, recompute, stops_early)
    head = 3 * shard.head_forward_flops(1, s)
    return work.global_batch * tp * (work.model.num_layers * layer + head)


def step_flops(work: Workload, layout: Layout, formula: FlopsFormula) -> float:
    """Hardware FLOPs of one step (recomputation included), by `formula`."""
    if formula is FlopsFormula.EXACT:
        return exact_step_flops(work, layout.tp, layout.recompute, recompute_stops_early(work, layout))
    cfg = work.model
    full = megatron_step_flops(work.global_batch, work.seq_length, cfg.num_layers, cfg.hidden_size,
                               work.padded_vocab(layout.tp), recompute=layout.recompute is Recompute.FULL)
    if layout.recompute is Recompute.SELECTIVE:  # + the attention core once more: 4 B s^2 h per layer
        full += 4.0 * work.global_batch * work.seq_length ** 2 * cfg.hidden_size * cfg.num_layers
    if layout.recompute is Recompute.SELECTIVE_OP:  # + the rerun matmuls (k, o; c_proj unless stopped early)
        rerun = work.shard(1).selective_op_rerun_gemms(1, work.seq_length, recompute_stops_early(work, layout))
        full += work.global_batch * cfg.num_layers * sum(g.flops for g in rerun)
    return full


def model_flops(work: Workload) -> float:
    """FLOPs of the model itself (no recomputation, tp = 1): the numerator of MFU."""
    return exact_step_flops(work, 1, Recompute.NONE)


def _recompute_flops(shard: Shard, b: int, s: int, recompute: Recompute, stops_early: bool = False) -> float:
    if recompute is Recompute.FULL:
        return shard.layer_forward_flops(b, s)
    if recompute is Recompute.SELECTIVE:
        return shard.attention_core_flops(b, s)
    if recompute is Recompute.SELECTIVE_OP:
        return sum(g.flops for g in shard.selective_op_rerun_gemms(b, s, stops_early))
    return 0.0


@dataclass(frozen=True)
class StepTime:
    """Seconds of one step, and where they go.

    Attributes:
        total: the step: pipeline makespan + DP synchronisation + optimizer + embedding / SP syncs.
        pipeline: the simulated makespan of all micro-batches (compute, TP and PP communication, bubble).
        compute: per-rank compute of the busiest rank (matmuls and memory-bound kernels, no communication).
        tp_comm: TP collectives of the busiest rank, per step (inside `pipeline`).
        pp_comm: one point-to-point message.
        dp_comm: data-parallel synchronisation after the backward (slowest pipeline rank).
        overlapped_dp: per-step seconds of ZeRO 2/3 collectives hidden under compute (0 when none).
        optimizer: the optimizer step, offload transfers and CPU Adam included (slowest rank).
        other: tied-embedding and SP partial-gradient all-reduces.
        bubble_fraction: idle share of the pipeline, from the simulation.
        run: the simulation summary.
    """

    total: float
    pipeline: float
    compute: float
    tp_comm: float
    pp_comm: float
    dp_comm: float
    overlapped_dp: float
    optimizer: float
    other: float
    bubble_fraction: float
    run: PipelineRun
    terms: tuple[tuple[str, float], ...] = ()

    def term(self, name: str) -> float:
        return dict(self.terms)[name]


# The parts of a step, in the order `hybrid plan --explain` prints them; they add up to StepTime.total.
TERMS = (("gemm", "matmuls on the GEMM curve (recomputed ones included)"),
         ("attention", "flash attention at the GPU's flash rate"),
         ("memory_bound", "non-matmul ops: their bytes at the achievable bandwidth (ops.py), and each micro-batch's "
                          "gradient add without gradient-accumulation fusion"),
         ("launches", "their kernels x the per-kernel latency (+ a calibrated CPU's per-pass costs)"),
         ("executor", "a calibrated CPU's pipeline executor per forward / backward action, beyond the model's call "
                      "and the messages (Hardware.executor_*_cpu_s; 0 on GPUs and without a pipeline)"),
         ("zero3_copies", "the named ZeRO 3 runtime's HBM copies on the compute stream (--zero3-runtime; none "
                          "priced by default): FSDP2's copy-out at each unshard and reduce-scatter copy-in; this "
                          "runtime's gradient copy into its unit's buffer; none for FSDP1 / Megatron-FSDP"),
         ("tp", "tensor-parallel collectives (synchronous): latency + bytes / bandwidth"),
         ("tp_wait", "TP collectives waiting for their ranks to meet: the ranks' skew after the compute since the "
                     "last sync (a calibrated CPU's collective_skew_s per call + collective_skew_per_s x compute)"),
         ("pp_p2p", "pipeline messages a blocking schedule waits out (0: overlapped, inside the bubble)"),
         ("dp_in_passes", "ZeRO 2/3 gathers / reduce-scatters not hidden under compute"),
         ("overlap", "compute slowed by the ZeRO 2/3 collectives hidden under it: (1 - 1/overlap_slowdown) x their "
                     "seconds (NCCL's CTAs take SMs and HBM bandwidth; hardware.OVERLAP_SLOWDOWN)"),
         ("bubble", "pipeline idle time: fill, drain, imbalance, waits for messages (simulated)"),
         ("dp_exposed", "DP / ZeRO gradient sync after the last backward, and the ZeRO 1-2 parameter all-gather "
                        "the next forward does not hide (all of it without --overlap-param-gather)"),
         ("optimizer", "the optimizer step: its passes over the states and its launches (or offload); on a "
                       "calibrated CPU its Python per tensor and per step (Hardware.optimizer_*_cpu_s)"),
         ("other", "tied-embedding and sequence-parallel partial-gradient all-reduces"))


@dataclass(frozen=True)
class _Context:
    """Everything the per-stage cost functions share."""

    work: Workload
    cluster: Cluster
    layout: Layout
    shard: Shard
    tp_group: GroupPlacement
    dp_group: GroupPlacement  # the ranks ZeRO shards over: the DP group, or HSDP's shard group
    replicate_group: GroupPlacement = GroupPlacement(size=1, per_node=1)  # HSDP's replicas (size 1: none)

    def tp_seconds(self, ledger: Ledger) -> float:
        return ledger_seconds(ledger, self.cluster.hw, self.tp_group)

    def dp_seconds(self, ledger: Ledger) -> float:
        return ledger_seconds(ledger, self.cluster.hw, self.dp_group)

    def replicate_seconds(self, ledger: Ledger) -> float:
        return ledger_seconds(ledger, self.cluster.hw, self.replicate_group)

    def gemm_seconds(self, gemms: tuple[Gemm, ...], fp8: bool = False) -> float:
        """Forward seconds of `gemms` on the GEMM curve (roofline + fixed cost, in the activation dtype; at the
        FP8 peak when `fp8`)."""
        hw, nbytes = self.cluster.hw, self.work.precision.activation_bytes
        return sum(hw.gemm_seconds(g, nbytes, fp8) for g in gemms)

    def backward_gemm_seconds(self, gemms: tuple[Gemm, ...], fp8: bool = False) -> float:
        """Their backward: an input-gradient and a weight-gradient product per forward matmul (Gemm.backward)."""
        return self.gemm_seconds(tuple(g2 for g in gemms for g2 in g.backward()), fp8)

    def hbm_seconds(self, nbytes: float) -> float:
        """Seconds of memory-bound kernels moving `nbytes` (Hardware.elementwise_bytes_per_s)."""
        return nbytes / self.cluster.hw.elementwise_bytes_per_s

    def launch_seconds(self, kernels: float) -> float:
        """Per-kernel latency of `kernels` memory-bound kernels (Hardware.kernel_overhead_s)."""
        return kernels * self.cluster.hw.kernel_overhead_s

    @property
    def flash(self) -> bool:
        """Is the attention core flash attention timed at its own rate (not as GEMMs on the curve)?"""
        return self.shard.profile is not ActivationProfile.KORTHIKANTI and self.cluster.hw.flash_efficiency is not None

    def flash_seconds(self, b: int, s: int) -> float:
        """Forward seconds of causal flash attention: half of QK^T and softmax(.)V's s x s FLOPs, the head width
        padded to the kernel's tile (AttentionKernel.padded_head_dim), at the workload's kernel's share of the
        peak for that head width and s (Workload.attention_kernel; hardware.FLASH_FWD_BWD_TFLOPS: the published
        forward + backward rate, which counts these FLOPs and a backward of 2.5x, five products instead of two:
        forward and backward both run at it, so forward + backward takes 3.5 x FLOPs / rate, as benchmarked).
        With attention dropout on the Megatron stack (TE's fused cuDNN kernel) x its measured cost where one is
        published (hardware.ATTENTION_DROPOUT_COST: Hopper 1.034, forward + backward)."""
        hw, kernel, d = self.cluster.hw, self.work.attention_kernel, self.work.model.head_dim
        flops = self.shard.attention_core_flops(b, s) / 2 * kernel.padded_head_dim(d) / d
        return flops / (kernel.efficiency(hw, d, s) * hw.peak_tflops * 1e12) * self.attention_dropout_cost()

    def attention_dropout_cost(self) -> float:
        """hardware.ATTENTION_DROPOUT_COST for a Megatron-stack workload with attention dropout; else 1."""
        if self.work.model.attention_dropout == 0 or self.work.pytorch_native(self.layout):
            return 1.0
        return ATTENTION_DROPOUT_COST.get(self.cluster.hw.flash_rates, 1.0)


def _context(work: Workload, cluster: Cluster, layout: Layout) -> _Context:
    """The shared state of one layout's costs, on the device as this workload's stack sees it
    (Hardware.for_stack: PyTorch-native training's sustained tensor-core rate, Workload.pytorch_native)."""
    cluster = replace(cluster, hw=work.device(cluster.hw, layout))
    return _Context(work=work, cluster=cluster, layout=layout,
                    shard=work.shard(layout.tp),
                    tp_group=tp_placement(cluster, layout), dp_group=shard_placement(cluster, layout),
                    replicate_group=replicate_placement(cluster, layout))


FLASH_BACKWARD = 2.5  # flash attention's backward runs five s x s products to the forward's two (Dao et al.)


def ring_step_seconds(work: Workload, cluster: Cluster, layout: Layout, s: int) -> tuple[float, float]:
    """(forward, backward) seconds of one step of load-balanced causal ring attention over a rank's `s` tokens a
    sequence (context-parallel: hybrid/planner/context.py), the backward without recomputation.

    Each step's work is half of an s x s block: the diagonal step is causal; of another rank's block either both
    query chunks see its first key chunk or only the second query chunk sees it whole (Megatron's 2 cp chunks;
    TransformerEngine AttnFuncWithCPAndKVP2P.forward, torch's _templated_ring_attention, hybrid/cp/ring.py). So a
    step is priced as the plain step prices its own causal s x s attention: flash attention at the workload's
    kernel rate on half the block's FLOPs (`_Context.flash_seconds`, FLASH_BACKWARD x in backward); where the core
    is timed as GEMMs, QK^T and PV over half the keys (and flash backward's recomputed QK^T)."""
    ctx = _context(work, cluster, layout)
    b = layout.micro_batch
    if ctx.flash:
        fwd = ctx.flash_seconds(b, s)
        return fwd, FLASH_BACKWARD * fwd
    qk, pv = ctx.shard.attention_core_gemms(b, s)
    half = (Gemm(qk.m, qk.n // 2, qk.k, qk.batch), Gemm(pv.m, pv.n, pv.k // 2, pv.batch))
    rerun = half[:1] if ctx.shard.flash_backward_gemms(b, s) else ()
    return ctx.gemm_seconds(half), ctx.backward_gemm_seconds(half) + ctx.gemm_seconds(rerun)


@dataclass(frozen=True)
class Pass:
    """Seconds of one pass (a forward or a backward) of some layers for one micro-batch, by kind of work.

    Attributes:
        gemm: matmuls on the GEMM curve (recomputed ones included in a backward).
        attention: flash attention at Hardware.flash_efficiency (0 when its products are GEMMs).
        memory: memory-bound kernels: their bytes (ops.py) at Hardware.elementwise_bytes_per_s.
        launches: their kernels x Hardware.kernel_overhead_s, plus a calibrated CPU's per-pass costs.
        glue: a calibrated CPU's pipeline executor around the pass (Hardware.executor_*_cpu_s; 0 elsewhere).
        copies: the ZeRO 3 runtime's copies on the compute stream around its gathers and reduce-scatters
            (_zero3_copies; 0 below ZeRO 3 or at dp 1).
    """

    gemm: float = 0.0
    attention: float = 0.0
    memory: float = 0.0
    launches: float = 0.0
    glue: float = 0.0
    copies: float = 0.0

    @property
    def total(self) -> float:
        return self.gemm + self.attention + self.memory + self.launches + self.glue + self.copies

    def __add__(self, other: "Pass") -> "Pass":
        return Pass(self.gemm + other.gemm, self.attention + other.attention, self.memory + other.memory,
                    self.launches + other.launches, self.glue + other.glue, self.copies + other.copies)

    def scaled(self, k: float) -> "Pass":
        return Pass(k * self.gemm, k * self.attention, k * self.memory, k * self.launches, k * self.glue,
                    k * self.copies)


@dataclass(frozen=True)
class _Cost:
    """Seconds of one micro-batch: compute (matmuls and memory-bound kernels) and TP communication (its ranks'
    waits to meet, `wait`, included)."""

    forward: Pass
    backward: Pass
    forward_comm: float
    backward_comm: float
    wait: float = 0.0

    @property
    def forward_compute(self) -> float:
        return self.forward.total

    @property
    def backward_compute(self) -> float:
        return self.backward.total


def _tp_cost(ctx: _Context, layers: int, first: bool, last: bool, forward: Pass = Pass(),
             backward: Pass = Pass()) -> tuple[float, float, float]:
    """(forward, backward, waits) seconds of the TP ledger of `layers` layers and the stage's edges, whose passes
    compute `forward` and `backward`: each collective's time plus its wait for the ranks to meet after the compute
    before it (hardware.sync_wait_seconds; 0 but on a calibrated CPU), the waits also on their own."""
    lay = ctx.layout
    book = tp_ledger(ctx.shard, lay.micro_batch, ctx.work.seq_length, layers, first, last,
                     lay.sequence_parallel, lay.recompute, ctx.work.precision.activation_bytes, ctx.work.tp_plan,
                     ctx.work.tp_gather_bytes, ctx.work.gathered_logits)
    hw = ctx.cluster.hw
    waits = [sync_wait_seconds(hw, sum(int(e["calls"]) for e in book[k].values()), p.total)
             for k, p in (("forward", forward), ("backward", backward))]
    copies = [_tp_copy_seconds(ctx, book[k]) for k in ("forward", "backward")]
    return (ctx.tp_seconds(book["forward"]) + waits[0] + copies[0],
            ctx.tp_seconds(book["backward"]) + waits[1] + copies[1], sum(waits))


def tp_copy_bytes(work: Workload, ledger: Ledger) -> tuple[float, int]:
    """(HBM bytes, kernels) of the copies DTensor SP adds around a pass's TP collectives (Workload.sp_copies;
    0 otherwise, and under tp_comm_overlap, whose fused all-gather-matmul is not priced): each all-gather's output
    and each reduce-scatter's input is the whole b s h tensor (the ledger's bytes a call), read and written once
    by its torch.cat -- 2 x the ledger's bytes, one kernel a collective."""
    if not work.sp_copies or work.tp_comm_overlap:
        return 0.0, 0
    entries = [e for key, e in ledger.items()
               if key in (f"{Collective.ALL_GATHER.value}@tp", f"{Collective.REDUCE_SCATTER.value}@tp")]
    return 2.0 * sum(e["bytes"] for e in entries), sum(int(e["calls"]) for e in entries)


def _tp_copy_seconds(ctx: _Context, ledger: Ledger) -> float:
    nbytes, kernels = tp_copy_bytes(ctx.work, ledger)
    return ctx.hbm_seconds(nbytes) + ctx.launch_seconds(kernels) if kernels else 0.0


def _ops_pass(ctx: _Context, traffic: Traffic, tokens: int, backward: bool) -> Pass:
    """The memory-bound part of a pass: `traffic` (per token) over `tokens` tokens."""
    nbytes = traffic.bwd_bytes if backward else traffic.fwd_bytes
    kernels = traffic.bwd_kernels if backward else traffic.fwd_kernels
    return Pass(memory=ctx.hbm_seconds(nbytes * tokens), launches=ctx.launch_seconds(kernels))


def _fp8_traffic(ctx: _Context) -> Traffic:
    """--fp8, per token: the casts Transformer Engine / torchao float8 add to a layer (ops.fp8_casts: each
    distinct linear input cast and transposed in the forward, each output gradient in the backward, the weights
    once per micro-batch; an amax pass more under Workload.fp8_scaling CURRENT)."""
    if not ctx.work.fp8:
        return Traffic()
    tokens = ctx.layout.micro_batch * ctx.work.seq_length
    return fp8_casts(ctx.shard, tokens, ctx.work.precision.activation_bytes, ctx.work.fp8_scaling)


def pass_overheads(ctx: _Context) -> tuple[float, float]:
    """Fixed seconds of one layer's (forward, backward) pass beyond its kernels' work: the per-pass cost
    (Hardware.layer_*_overhead_s), plus at tp > 1 what a sharded pass costs beyond that (tp_layer_*_overhead_s:
    on a CPU the TP autograd Functions and the first touches after each blocking all-reduce, which the halved
    GEMMs and bytes do not pay for -- calibrate's pair probe measures it; 0 on GPUs and in older profiles)."""
    hw, tp = ctx.cluster.hw, ctx.layout.tp > 1
    return (hw.layer_forward_overhead_s + (hw.tp_layer_forward_overhead_s if tp else 0.0),
            hw.layer_backward_overhead_s + (hw.tp_layer_backward_overhead_s if tp else 0.0))


def layer_passes(ctx: _Context) -> tuple[Pass, Pass]:
    """One Transformer layer, one micro-batch: (forward, backward), recomputation included in the backward."""
    lay, work, shard = ctx.layout, ctx.work, ctx.shard
    b, s, fp8 = lay.micro_batch, work.seq_length, work.fp8
    tokens = b * s
    linears = shard.layer_linear_gemms(b, s)
    core = () if ctx.flash else shard.attention_core_gemms(b, s)
    ops = layer_ops(shard, s, lay.sequence_parallel, work.precision.activation_bytes, work.kernel_profile,
                    work.fc1_bias_grad_in_kernel)
    everything, core_ops = Traffic.of(ops), Traffic.of([o for o in ops if o.core])
    fp8_ops = _fp8_traffic(ctx)
    attention = ctx.flash_seconds(b, s) if ctx.flash else 0.0
    fixed_fwd, fixed_bwd = pass_overheads(ctx)
    forward = (Pass(gemm=ctx.gemm_seconds(linears, fp8) + ctx.gemm_seconds(core), attention=attention,
                    launches=fixed_fwd)
               + _ops_pass(ctx, everything, tokens, False) + _ops_pass(ctx, fp8_ops, tokens, False))
    backward = (Pass(gemm=ctx.backward_gemm_seconds(linears, fp8) + ctx.backward_gemm_seconds(core)
                     + (0.0 if ctx.flash else ctx.gemm_seconds(shard.flash_backward_gemms(b, s))),
                     attention=FLASH_BACKWARD * attention, launches=fixed_bwd)
                + _ops_pass(ctx, everything, tokens, True) + _ops_pass(ctx, fp8_ops, tokens, True))
    return forward, backward + _rerun(ctx, forward, core_ops, fp8_ops, attention)


def _rerun(ctx: _Context, forward: Pass, core_ops: Traffic, fp8_ops: Traffic, attention: float) -> Pass:
    """What the backward reruns: full -- the whole forward; selective -- the attention core (its GEMMs or flash
    attention, its softmax and dropout); selective-op -- every op but the matmuls whose outputs the policy keeps
    and the attention."""
    lay, shard, b, s = ctx.layout, ctx.shard, ctx.layout.micro_batch, ctx.work.seq_length
    tokens = b * s
    if lay.recompute is Recompute.FULL:
        return _early_stopped_rerun(ctx, attention) if _stops_early(ctx) else forward
    if lay.recompute is Recompute.SELECTIVE:
        core = () if ctx.flash else shard.attention_core_gemms(b, s)
        return Pass(gemm=ctx.gemm_seconds(core), attention=attention) + _ops_pass(ctx, core_ops, tokens, False)
    if lay.recompute is Recompute.SELECTIVE_OP:
        ops = layer_ops(shard, s, lay.sequence_parallel, ctx.work.precision.activation_bytes, ctx.work.kernel_profile,
                        ctx.work.fc1_bias_grad_in_kernel)
        stops = _stops_early(ctx)
        if stops:  # the rerun ends at the down projection's input, as full recomputation's (_early_stopped_rerun)
            ops = ops[:max(i for i, o in enumerate(ops) if o.name in MLP_ACTIVATIONS) + 1]
        cheap = Traffic.of([o for o in ops if not (o.core and ctx.flash)])  # flash attention's output is kept
        core = () if ctx.flash else shard.attention_core_gemms(b, s)
        return (Pass(gemm=ctx.gemm_seconds(shard.selective_op_rerun_gemms(b, s, stops), ctx.work.fp8)
                     + ctx.gemm_seconds(core))
                + _ops_pass(ctx, cheap, tokens, False) + _ops_pass(ctx, fp8_ops, tokens, False))
    return Pass()


def _stops_early(ctx: _Context) -> bool:
    return recompute_stops_early(ctx.work, ctx.layout)


def recompute_stops_early(work: Workload, layout: Layout) -> bool:
    """Does full recomputation stop before the layer's last linear? torch's non-reentrant checkpoint (this runtime,
    models/common.py; torchtitan, Composer, OLMo-core, FSDP's checkpoint_wrapper: the PyTorch stack) stops its rerun
    as soon as the last tensor the backward needs is saved again (torch.utils.checkpoint `early_stop`, on by
    default since pytorch/pytorch PR 96866, March 2023: PyTorch 2.1; MosaicML's H100 sweep ran a 2.1 nightly).
    Autograd saves an op's inputs before it runs the op (the generated VariableType code builds the node, packing
    self and mat2, then dispatches), so the last saved tensor is the down projection's input: its GEMM and the ops
    after it (the residual add) are not rerun -- checked on torch in tests/test_planner_noac.py. Not with hidden
    dropout: the mask the dropout after the down projection saves is the last saved tensor, so the rerun runs the
    down projection too (counted on torch in tests/test_planner20_selective_op.py). Selective-op (op-level SAC)
    stops the same way (Shard.selective_op_rerun_gemms). Megatron's reentrant checkpoint reruns the whole layer;
    TE / torchao FP8 linears are autograd Functions that save after their GEMM: the whole layer too."""
    return work.pytorch_native(layout) and not work.fp8 and work.model.dropout == 0


def _early_stopped_rerun(ctx: _Context, attention: float) -> Pass:
    """The forward up to the down projection's input (_stops_early): every linear but the last, the attention,
    every memory-bound op up to the MLP's activation."""
    lay, work, shard = ctx.layout, ctx.work, ctx.shard
    b, s = lay.micro_batch, work.seq_length
    ops = layer_ops(shard, s, lay.sequence_parallel, work.precision.activation_bytes, work.kernel_profile,
                    work.fc1_bias_grad_in_kernel)
    last = max(i for i, o in enumerate(ops) if o.name in MLP_ACTIVATIONS)
    core = () if ctx.flash else shard.attention_core_gemms(b, s)
    return (Pass(gemm=ctx.gemm_seconds(shard.layer_linear_gemms(b, s)[:-1]) + ctx.gemm_seconds(core),
                 attention=attention, launches=pass_overheads(ctx)[0])
            + _ops_pass(ctx, Traffic.of(ops[:last + 1]), b * s, False))


def _layer_cost(ctx: _Context) -> _Cost:
    """One Transformer layer, one micro-batch: its passes and its TP collectives (overlapped with its GEMMs under
    Workload.tp_comm_overlap: Megatron's userbuffers _tp_overlapped, torch's async TP on the PyTorch stack
    async_tp.seconds)."""
    forward, backward = layer_passes(ctx)
    f_tp, b_tp, wait = _tp_cost(ctx, 1, False, False, forward, backward)
    if ctx.work.tp_comm_overlap and ctx.layout.sequence_parallel and ctx.layout.tp > 1:
        if ctx.work.pytorch_native(ctx.layout):
            from hybrid.planner import async_tp
            f_tp, b_tp = async_tp.seconds(ctx)
        else:
            f_tp, b_tp = _tp_overlapped(ctx, f_tp, forward.gemm), _tp_overlapped(ctx, b_tp, backward.gemm)
        wait = 0.0  # on GPUs: no calibrated CPU's rank skew (sync_wait_seconds is 0 there anyway)
    return _Cost(forward, backward, f_tp, b_tp, wait)


def _tp_overlapped(ctx: _Context, comm: float, gemm: float) -> float:
    """Seconds a pass's TP collectives cost when Megatron-core overlaps them with its GEMMs (`--tp-comm-overlap`,
    Transformer Engine's userbuffers, SP only): in the forward the all-gather of the QKV and FC1 inputs runs ring-
    chunk by chunk under those GEMMs and the reduce-scatter of the projection and FC2 outputs under theirs; in the
    backward the input-gradient GEMMs hide the all-gathers and the weight-gradient GEMMs the reduce-scatters
    (TE's "bulk" overlaps). So every layer collective has a GEMM of its own pass to run under, and a pass hides up
    to its GEMM seconds; what does not fit stays exposed. Hidden is not free: the GEMM under a collective advances
    1 / sigma of a second a second (Hardware.overlap_slowdown: the communication kernels take SMs and HBM
    bandwidth, as ZeRO's hidden collectives do; hardware.OVERLAP_SLOWDOWN, published, not fitted), so a hidden
    second costs overlap_cost = 1 - 1/sigma:

        cost = (comm - hidden) + overlap_cost x hidden,    hidden = min(comm, gemm)

    The stage's edges (embedding, head, the loss's all-reduces) stay synchronous: Megatron overlaps only the
    linear layers' collectives."""
    hidden = min(comm, gemm)
    return comm - hidden + ctx.cluster.hw.overlap_cost * hidden


@dataclass(frozen=True)
class LayerParts:
    """One layer, one micro-batch, no recomputation, in the units `hybrid calibrate` fits (calibrate.fit_layer):
    compute seconds (GEMMs and flash attention), memory-bound bytes and kernels, per pass."""

    forward_s: float
    backward_s: float
    forward_bytes: float
    backward_bytes: float
    forward_kernels: int
    backward_kernels: int


def layer_parts(work: Workload, cluster: Cluster, layout: Layout) -> LayerParts:
    """The parts `_layer_cost` adds up for one layer without recomputation: `hybrid calibrate` measures a real
    layer and solves for the bandwidth and the per-kernel (or per-pass) cost that make them reproduce it."""
    ctx = _context(work, cluster, replace(layout, recompute=Recompute.NONE))
    fwd, bwd = layer_passes(ctx)
    ops = Traffic.of(layer_ops(ctx.shard, work.seq_length, layout.sequence_parallel,
                               work.precision.activation_bytes, work.kernel_profile,
                               work.fc1_bias_grad_in_kernel))
    tokens = layout.micro_batch * work.seq_length
    return LayerParts(fwd.gemm + fwd.attention, bwd.gemm + bwd.attention, ops.fwd_bytes * tokens,
                      ops.bwd_bytes * tokens, ops.fwd_kernels, ops.bwd_kernels)


def _edge_cost(ctx: _Context, first: bool, last: bool) -> _Cost:
    """The embedding (first stage: a gather) and the final norm, LM head and loss (last stage), each with a
    calibrated CPU's fixed cost a pass (_edge_fixed)."""
    fwd, bwd = Pass(), Pass()
    lay, work = ctx.layout, ctx.work
    b, s, sp, e = lay.micro_batch, work.seq_length, lay.sequence_parallel, work.precision.activation_bytes
    if first:
        emb = Traffic.of(embedding_ops(ctx.shard, sp, e, work.kernel_profile))
        fixed_f, fixed_b = _edge_fixed(ctx, "embedding")
        fwd = fwd + _ops_pass(ctx, emb, b * s, False) + Pass(launches=fixed_f)
        bwd = bwd + _ops_pass(ctx, emb, b * s, True) + Pass(launches=fixed_b)
    if last:
        head = (ctx.shard.head_gemm(b, s),)
        loss = Traffic.of(head_ops(ctx.shard, sp, e, work.kernel_profile, work.gathered_logits,
                                   work.megatron_unfused_loss))
        fixed_f, fixed_b = _edge_fixed(ctx, "head")
        fwd = fwd + Pass(gemm=ctx.gemm_seconds(head), launches=fixed_f) + _ops_pass(ctx, loss, b * s, False)
        bwd = bwd + Pass(gemm=ctx.backward_gemm_seconds(head), launches=fixed_b) + _ops_pass(ctx, loss, b * s, True)
    return _Cost(fwd, bwd, *_tp_cost(ctx, 0, first, last, fwd, bwd))


def _edge_fixed(ctx: _Context, edge: str) -> tuple[float, float]:
    """(forward, backward) fixed seconds a pass of a stage edge ("embedding" or "head") beyond its kernels: the
    unsharded edge's own (Hardware.{edge}_*_overhead_s: the stage's Python, the dispatcher, autograd -- round 25:
    ~0.12-0.16 ms a pass on the 2-core VM where the kernels plan ~0, 16 passes of each a step in the main job)
    plus, at tp > 1, what sharding adds beyond it (tp_{edge}_*_overhead_s). Both from calibrate.fit_edge_pass; 0
    on presets."""
    hw, tp = ctx.cluster.hw, ctx.layout.tp > 1
    return tuple(getattr(hw, f"{edge}_{d}_overhead_s") + (getattr(hw, f"tp_{edge}_{d}_overhead_s") if tp else 0.0)
                 for d in ("forward", "backward"))


def _chunk_dp_overlap(ctx: _Context, chunk_params: float) -> tuple[float, float, float, float]:
    """Per-micro-batch (forward, backward) seconds of ZeRO 2/3 collectives and parameter fetches of one chunk on
    the shard group's link, the collectives' share of all its DP seconds, and the backward's seconds on HSDP's
    replica link (the reduced shards' all-reduce, hsdp_replicate_ledger; 0 without HSDP); they run under the
    chunk's compute (prefetching), so the chunk takes the longer of the two. A fetch over PCIe runs on the copy
    engines and takes no SM (no overlap cost)."""
    lay, hw = ctx.layout, ctx.cluster.hw
    pr = ctx.work.precision
    book = dp_microbatch_ledger(chunk_params, lay.zero, lay.dp_shard, ctx.work.grad_bytes, pr.param_bytes)
    fwd, bwd = ctx.dp_seconds(book["forward"]), ctx.dp_seconds(book["backward"])
    replica = ctx.replicate_seconds(hsdp_replicate_ledger(chunk_params, lay.dp_shard, lay.dp_replicate,
                                                          ctx.work.grad_bytes))
    collectives = fwd + bwd + replica
    if lay.offload is Offload.OPTIMIZER_AND_PARAMS:  # this rank's parameter partition over PCIe, each way
        fetch = pr.param_bytes * chunk_params / lay.dp_shard / (hw.pcie_gbps * GB)
        fwd, bwd = fwd + fetch, bwd + fetch
    total = fwd + bwd + replica
    return fwd, bwd, collectives / total if total > 0 else 0.0, replica


@dataclass(frozen=True)
class _StageCost:
    """One global stage, one micro-batch: what the simulation gets (forward, backward) and its parts."""

    forward: float
    backward: float
    compute: float  # matmuls and memory-bound kernels, forward + backward
    comm: float  # TP collectives, forward + backward
    hidden: float  # ZeRO 2/3 collective seconds that run under the compute
    parts: Pass = Pass()  # the compute by kind of work, forward + backward
    lost: float = 0.0  # compute seconds the hidden collectives slow it by (Hardware.overlap_slowdown)
    wait: float = 0.0  # of comm: the TP collectives' waits for their ranks to meet (sync_wait_seconds)
    forward_compute: float = 0.0  # of compute: the forward's


def _overlapped(compute: float, tp: float, dp: float, layers: int, contended: bool,
                pp_link: float = 0.0, cost: float = 0.0, replica: float = 0.0) -> tuple[float, float]:
    """(seconds, hidden DP seconds) of one pass of a stage whose `layers` layers compute for `compute` seconds,
    spend `tp` in synchronous TP collectives and move `dp` seconds of ZeRO 2/3 traffic (or parameter fetches).

    Only what has compute to run under is hidden: the first layer's all-gather of a forward (nothing runs
    before it) and the last layer's reduce-scatter of a backward (nothing runs after it) are exposed, one
    layer's share dp / layers each. When the DP and TP groups share a link (both inside a node, on NVLink) the
    link carries both, so the rest overlaps only the compute, not the TP collectives:
        contended:  exposed + tp + max(compute + cost x rest, rest + pp_link)
        otherwise:  exposed + max(compute + tp + cost x rest, rest + pp_link),   rest = dp - exposed
    Hidden is not free: while a collective runs, the compute under it advances 1 / sigma of a second a second
    (sigma = Hardware.overlap_slowdown: NCCL's CTAs hold SMs of their own and move their bytes through HBM). Compute
    C under D seconds of collectives then ends at C + (1 - 1/sigma) D when that is after D (else at D, inside the
    collectives): cost = 1 - 1/sigma, 0 when overlap is free.
    `pp_link`: seconds of this pass's outgoing pipeline message when it leaves on the DP ring's link (both on
    NVLink, or both on the NICs): the link carries it too, so it takes from the window the DP traffic runs in.
    The message's own transfer stays where the pipeline simulation places it.
    `replica`: HSDP's replica all-reduce seconds in this pass (another link: the NICs where the shard group's
    traffic is on NVLink), on a stream of its own (FSDP1's `_all_reduce_stream`), so the two links run at once:
    the last layer's reduce-scatter and then its all-reduce are exposed, one layer's share of both, (dp +
    replica) / layers; the rest needs the busier link's time, max(dp, replica) (1 - 1/layers); every hidden
    collective second costs the compute under it (cost x (dp + replica)(1 - 1/layers)). At replica 0 this is
    the formula above."""
    if dp <= 0 and replica <= 0:
        return compute + tp, 0.0
    both, busier = dp + replica, max(dp, replica)
    exposed = both / max(1, layers)
    rest = busier - busier / max(1, layers)  # the busier link's time to move the rest
    slowed = cost * (both - exposed)  # every hidden collective second slows the compute under it
    if contended:
        return exposed + tp + max(compute + slowed, rest + pp_link), min(compute, rest)
    return exposed + max(compute + tp + slowed, rest + pp_link), min(compute + tp, rest)


def _grad_accumulation(ctx: _Context, params: float) -> Pass:
    """Per micro-batch, a runtime without gradient-accumulation fusion (`Workload.fused_grad_accumulation`:
    eager PyTorch, DeepSpeed's pipeline engine) adds each new weight gradient into the accumulated one in a pass
    of its own (AccumulateGrad, or a hook into an fp32 buffer): it reads the new gradient (the parameter's dtype)
    and the accumulated one (`grad_bytes`) and writes the sum,

        (param_bytes + 2 grad_bytes) x params      (3 x 2 bytes for bf16 gradients, 2 + 2 x 4 into fp32)

    none for the first of the m micro-batches, so (m - 1) / m on average; on the rank's shard only under ZeRO
    2-3, which reduce-scatter every micro-batch. Fused stacks accumulate inside the weight-gradient GEMM
    (Megatron's gradient-accumulation fusion): nothing here."""
    if ctx.work.fused_grad_accumulation:
        return Pass()
    m = ctx.work.num_microbatches(ctx.layout)
    share = 1.0 / ctx.layout.dp_shard if ctx.layout.zero >= ZeroStage.GRADIENTS else 1.0
    per_param = ctx.work.precision.param_bytes + 2 * ctx.work.grad_bytes
    nbytes = per_param * params * share * (m - 1) / m
    return Pass(memory=nbytes / ctx.cluster.hw.streaming_bytes_per_s)  # an add: the copy rate (a CPU's too)


def zero3_copy_bytes(work: Workload, layout: Layout, layer_params: float, edge_params: float = 0.0
                     ) -> tuple[float, float]:
    """(forward, backward) HBM bytes one rank's ZeRO 3 runtime copies on its compute stream in one micro-batch,
    for a stage holding `layer_params` parameters of its layers and `edge_params` of the embedding / final norm /
    head (both before DP sharding: the model over TP and PP), as each runtime's code runs it (layout.Zero3Runtime):

    FSDP2 (torch 2.13 `_fsdp_collectives.py`): each unshard copies every gathered parameter out of the all-gather
    buffer, read + write 2 p bytes a parameter (p = the parameter dtype's bytes); the blocks unshard in the forward
    and again in the backward (resharded after forward), the root group (the edges) once; each reduce-scatter
    first copies every gradient into its input, read p + write g bytes (g = the reduce dtype: Workload.grad_bytes):

        forward  2p (L + E)          backward  2p L + (p + g)(L + E)

    Under a pipeline (pp > 1 or v > 1; torchtitan keeps a stage's parameters gathered across its micro-batches and
    reduce-scatters once a step) one unshard and one reduce-scatter a step, spread over the m micro-batches:
    forward 2p (L + E) / m, backward (p + g)(L + E) / m.
    HYBRID (this runtime, hybrid/zero): no copy-out (the parameters are views of the gathered flat buffer); the
    gradient hook copies each gradient into its unit's full-gradient buffer every micro-batch (FlatUnit.add_grad):
    backward (p + g)(L + E).  FSDP1, MEGATRON_FSDP: nothing (in place).  0 below ZeRO 3, at dp 1, or with no runtime
    named (Workload.zero3_runtime None, the default: round 16's what-if was not landed)."""
    if layout.zero is not ZeroStage.PARAMETERS or layout.dp == 1 or work.zero3_runtime is None:
        return 0.0, 0.0
    p, g = work.precision.param_bytes, work.grad_bytes
    params = layer_params + edge_params
    runtime = work.zero3_runtime
    if runtime is Zero3Runtime.HYBRID:
        return 0.0, (p + g) * params
    if runtime is not Zero3Runtime.FSDP2:
        return 0.0, 0.0
    if layout.pp > 1 or layout.v > 1:
        m = work.num_microbatches(layout)
        return 2 * p * params / m, (p + g) * params / m
    return 2 * p * params, 2 * p * layer_params + (p + g) * params


def _zero3_copies(ctx: _Context, layer_params: float, edge_params: float) -> tuple[Pass, Pass]:
    """One micro-batch's (forward, backward) ZeRO 3 copies (zero3_copy_bytes) at the card's streaming rate
    (Hardware.streaming_bytes_per_s: a copy), on the pass's critical path: both runtimes issue them on the compute
    stream, before the layer's compute (copy-out) or between its backward and its reduce-scatter (copy-in)."""
    fwd, bwd = zero3_copy_bytes(ctx.work, ctx.layout, layer_params, edge_params)
    if not (fwd or bwd):
        return Pass(), Pass()
    rate = ctx.cluster.hw.streaming_bytes_per_s
    return Pass(copies=fwd / rate), Pass(copies=bwd / rate)


def _executor_glue(ctx: _Context) -> tuple[Pass, Pass]:
    """The pipeline executor's own CPU around one chunk's (forward, backward) pass: Hardware.executor_forward_cpu_s /
    executor_backward_cpu_s (calibrate.executor_action_cpu: the schedule walk, the op trail's switch, taking the
    input, the loss's 1/m, the input gradient's hand-over) -- on the pass's critical path and on a core, so it adds
    to the stage's compute (and its CPU on shared cores). Only where the executor runs (train/loop.py: pp > 1 or
    v > 1; a single stage runs LocalForwardBackward); 0 on GPUs and in profiles without the probe. A zero-bubble
    split backward is priced as one action (B and W: the probe times a whole BACKWARD)."""
    lay, hw = ctx.layout, ctx.cluster.hw
    if lay.pp == 1 and lay.v == 1:
        return Pass(), Pass()
    return Pass(glue=hw.executor_forward_cpu_s), Pass(glue=hw.executor_backward_cpu_s)


def _stage_cost(ctx: _Context, cost: _Cost, n: int, first: bool, last: bool) -> _StageCost:
    edge = _edge_cost(ctx, first, last)
    params = n * ctx.shard.layer_params() + (ctx.shard.embedding_params() if first else 0) + (
        ctx.shard.head_params(shares_embedding=first) if last else 0)
    glue_f, glue_b = _executor_glue(ctx)
    copy_f, copy_b = _zero3_copies(ctx, n * ctx.shard.layer_params(), params - n * ctx.shard.layer_params())
    edge = _Cost(edge.forward + glue_f + copy_f, edge.backward + _grad_accumulation(ctx, params) + glue_b + copy_b,
                 edge.forward_comm, edge.backward_comm, edge.wait)
    f_comp = n * cost.forward_compute + edge.forward_compute
    b_comp = n * cost.backward_compute + edge.backward_compute
    f_tp = n * cost.forward_comm + edge.forward_comm
    b_tp = n * cost.backward_comm + edge.backward_comm
    dp_f, dp_b, share, replica = _chunk_dp_overlap(ctx, n * ctx.shard.layer_params())
    contended = ctx.layout.tp > 1 and not ctx.dp_group.spans_nodes  # TP and DP rings on the same NVLink
    send = _pp_send_on_dp_link(ctx)  # forward: to the next stage (not the last); backward: to the previous
    loss = ctx.cluster.hw.overlap_cost * share  # per hidden second (the collectives' part of it)
    f, f_hidden = _overlapped(f_comp, f_tp, dp_f, n, contended, 0.0 if last else send, loss)
    b, b_hidden = _overlapped(b_comp, b_tp, dp_b, n, contended, 0.0 if first else send, loss, replica)
    lost = (f - _overlapped(f_comp, f_tp, dp_f, n, contended, 0.0 if last else send)[0]
            + b - _overlapped(b_comp, b_tp, dp_b, n, contended, 0.0 if first else send, 0.0, replica)[0])
    parts = (cost.forward + cost.backward).scaled(n) + edge.forward + edge.backward
    return _StageCost(forward=f, backward=b, compute=f_comp + b_comp, comm=f_tp + b_tp, hidden=f_hidden + b_hidden,
                      parts=parts, lost=lost, wait=n * cost.wait + edge.wait, forward_compute=f_comp)


def _pp_send_on_dp_link(ctx: _Context) -> float:
    """Seconds of one pipeline message (b s h, / t under SP) when it leaves on the link the DP ring uses: both
    inside a node (NVLink) or both across nodes (the NICs); 0 without a pipeline or when they use different
    links. Links are full duplex: only the outgoing message competes with the ring's outgoing traffic."""
    lay, work = ctx.layout, ctx.work
    crosses = pipeline_crosses_nodes(ctx.cluster, lay)
    if lay.pp == 1 or crosses != ctx.dp_group.spans_nodes:
        return 0.0
    message = lay.micro_batch * work.seq_length * work.model.hidden_size * work.precision.activation_bytes
    return p2p_seconds(ctx.cluster.hw, message / (lay.tp if lay.sequence_parallel else 1), crosses)


@dataclass(frozen=True)
class _Stages:
    """The per-micro-batch stage costs the simulation gets, and the busiest pipeline rank's parts of them."""

    times: StageTimes
    compute: float  # busiest rank, per micro-batch: matmuls, flash attention, memory-bound kernels
    comm: float  # its TP collectives
    hidden: float  # the most ZeRO 2/3 seconds any rank hides under its compute
    parts: Pass  # its compute by kind of work
    lost: float  # its compute seconds lost to the collectives hidden under it (Hardware.overlap_slowdown)
    p2p: float  # its blocking point-to-point seconds (0 when the messages overlap: the simulation places them)
    busy: float  # its stage costs, everything it does per micro-batch
    wait: float = 0.0  # of comm: its TP collectives' waits for their ranks to meet
    cpu: StageTimes | None = None  # per global stage, the CPU seconds a process runs of each pass (stage_cpu)


def stage_times(work: Workload, cluster: Cluster, layout: Layout) -> tuple[StageTimes, float, float, float]:
    """Per-global-stage seconds of one micro-batch for the simulation, plus (busiest rank's compute per
    micro-batch, its TP seconds per micro-batch, ZeRO seconds hidden under compute per micro-batch)."""
    st = _stages(work, cluster, layout)
    return st.times, st.compute, st.comm, st.hidden


def _stages(work: Workload, cluster: Cluster, layout: Layout, ctx: _Context | None = None) -> _Stages:
    ctx = ctx or _context(work, cluster, layout)  # `ctx`: the caller's _context of the same three
    pp, v = layout.pp, layout.v
    layers = stage_layers(work.model, pp, v, work.seq_length, work.pipeline_split)
    cost = _layer_cost(ctx)
    kinds: dict[tuple[int, bool, bool], _StageCost] = {}  # stages alike in (layers, first, last) cost alike
    fwd, bwd, compute, comm, hidden, lost = [], [], [0.0] * pp, [0.0] * pp, [0.0] * pp, [0.0] * pp
    paid, wait = [0.0] * pp, [0.0] * pp
    f_comp, b_comp, of_stage = [], [], []
    owner = _stage_owners(pp, v, layout.schedule.placement)
    for stage, n in enumerate(layers):
        key = (n, stage == 0, stage == pp * v - 1)
        if key not in kinds:
            kinds[key] = _stage_cost(ctx, cost, *key)
        c, r = kinds[key], owner[stage]
        of_stage.append(c)
        fwd.append(c.forward)
        bwd.append(c.backward)
        f_comp.append(c.forward_compute)
        b_comp.append(c.compute - c.forward_compute)
        compute[r] += c.compute
        comm[r] += c.comm
        hidden[r] += c.hidden
        lost[r] += c.lost
        wait[r] += c.wait
    message = layout.micro_batch * work.seq_length * work.model.hidden_size * work.precision.activation_bytes
    message /= layout.tp if layout.sequence_parallel else 1  # SP: hidden states between stages are (b, s/t, h)
    p2p = p2p_seconds(cluster.hw, message, pipeline_crosses_nodes(cluster, layout)) if pp > 1 else 0.0
    if work.p2p is PipelineP2P.BLOCKING_SCATTER and pp > 1 and layout.tp > 1 and not layout.sequence_parallel:
        gather = GroupPlacement(size=layout.tp, per_node=layout.tp)
        p2p = (p2p_seconds(cluster.hw, message / layout.tp, pipeline_crosses_nodes(cluster, layout))
               + collective_seconds(cluster.hw, Collective.ALL_GATHER, message, gather))
    if work.p2p.blocking and pp > 1:  # each pass waits out the messages it exchanges
        edges = [(stage > 0) + (stage < pp * v - 1) for stage in range(pp * v)]
        fwd = [f + p2p * k for f, k in zip(fwd, edges)]
        bwd = [b + p2p * k for b, k in zip(bwd, edges)]
        for stage, k in enumerate(edges):
            paid[owner[stage]] += 2 * p2p * k
        p2p = 0.0  # the hand-off itself is then immediate: both ends have already paid for the transfer
    busy = [sum(fwd[s] + bwd[s] for s in stages) for stages in rank_stages(pp, v, layout.schedule.placement)]
    busiest = max(range(pp), key=lambda r: busy[r])
    parts = Pass()  # the busiest rank's compute by kind: its stages' parts, added in stage order
    for stage, c in enumerate(of_stage):
        if owner[stage] == busiest:
            parts = parts + c.parts
    cpu = _stage_cpu(ctx, layers, f_comp, b_comp, message) if _shares_cores(cluster) else None
    return _Stages(StageTimes(tuple(fwd), tuple(bwd), p2p, tuple(compute)), compute[busiest], comm[busiest],
                   max(hidden), parts, lost[busiest], paid[busiest], busy[busiest], wait[busiest], cpu)


@lru_cache(maxsize=1024)
def _stage_owners(pp: int, v: int, placement: Placement) -> tuple[int, ...]:
    """The pipeline rank of each global stage (Layout.stage_rank for every stage, once per shape)."""
    owner = [0] * (pp * v)
    for r, stages in enumerate(rank_stages(pp, v, placement)):
        for s in stages:
            owner[s] = r
    return tuple(owner)


def _shares_cores(cluster: Cluster) -> bool:
    """Do the node's devices share compute units (more gloo ranks than a CPU's cores: Hardware.compute_units)?"""
    return cluster.hw.shared_compute_factor(_devices_per_node(cluster)) != 1.0


def _stage_cpu(ctx: _Context, layers: list[int], f_comp: list[float], b_comp: list[float],
               message: float) -> StageTimes:
    """Per global stage, the CPU seconds one process runs in a micro-batch's forward / backward: its compute
    (kernels and the calibrated per-pass costs), its TP collectives' CPU and its pipeline messages' (a receive and
    a send a pass, less at the ends; calibrate's pair probe: collective_cpu_s, p2p_cpu_s, comm_cpu_s_per_byte,
    priced as comm_cpu_seconds prices them). The rest of a pass's wall time it waits, off the cores
    (hybrid/pipeline/shared_cores.py)."""
    lay, hw = ctx.layout, ctx.cluster.hw
    last = len(layers) - 1
    msg = hw.p2p_cpu_s + message * hw.comm_cpu_s_per_byte
    fwd, bwd = [], []
    for stage, n in enumerate(layers):
        book = tp_ledger(ctx.shard, lay.micro_batch, ctx.work.seq_length, n, stage == 0, stage == last,
                         lay.sequence_parallel, lay.recompute, ctx.work.precision.activation_bytes, ctx.work.tp_plan,
                         ctx.work.tp_gather_bytes, ctx.work.gathered_logits)
        p2p = msg * ((stage > 0) + (stage < last)) if lay.pp > 1 else 0.0
        fwd.append(f_comp[stage] + _ledger_cpu(hw, book["forward"], {"tp": lay.tp}) + p2p)
        bwd.append(b_comp[stage] + _ledger_cpu(hw, book["backward"], {"tp": lay.tp}) + p2p)
    return StageTimes(tuple(fwd), tuple(bwd), 0.0)


def _dp_step_seconds(ctx: _Context, psi: float, forward_s: float = 0.0, backward_s: float = 0.0) -> float:
    """DP synchronisation after the last backward for a rank holding `psi` parameters (ledger.dp_step_ledger).

    ZeRO 1-2's all-gather of the updated parameters overlaps the next step's forward (the runtime's default,
    ZeroConfig.overlap_param_gather: each bucket is waited for by the first block that uses it; Megatron-core's
    --overlap-param-gather). Exposed: the first of its n buckets (nothing runs before it) and whatever the rest
    does not fit under the first micro-batch's forward on this rank (`forward_s`, the only compute before the last
    bucket is needed); the hidden rest slows that forward by (1 - 1/sigma) of its seconds, as every hidden
    collective does (NCCL's CTAs take SMs and HBM bandwidth from the GEMMs under them: Hardware.overlap_cost; round
    10 -- until then this was the one hidden collective the planner priced free):

        gather / n + max(0, gather (1 - 1/n) - forward_s) + overlap_cost x hidden

    Under Workload.overlap_grad_reduce the gradient reduction (ZeRO 0's all-reduce, ZeRO 1's reduce-scatter) runs
    likewise under the last micro-batch's backward (`backward_s`; Megatron-core's DistributedDataParallel posts a
    bucket's collective when its last gradient is ready, and only in the last micro-batch: the others run under
    no_sync): its last bucket is exposed (nothing runs after it), and so is what does not fit under that backward;
    the hidden part still costs the compute under it (1 - 1/sigma) of its seconds (Hardware.overlap_cost, as for
    ZeRO 2/3's hidden collectives in _overlapped):

        reduce / n + max(0, reduce (1 - 1/n) - backward_s) + overlap_cost x hidden

    Ignored: the gathers share the link with the forward's TP collectives (contention), and a rank whose first
    forward waits for its pipeline input has more time to hide them."""
    lay = ctx.layout
    param_bytes = ctx.work.param_gather_bytes  # 1 under fp8_param_gather (round 22)
    total = ctx.dp_seconds(dp_step_ledger(psi, lay.zero, lay.dp, ctx.work.grad_bytes, param_bytes))
    gather = 0.0
    if lay.zero in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS) and lay.dp > 1:
        gather = ctx.dp_seconds(dp_step_ledger(psi, ZeroStage.GRADIENTS, lay.dp, ctx.work.grad_bytes, param_bytes))
    if gather and ctx.work.overlap_param_gather:
        n = max(1, math.ceil(param_bytes * psi / BUCKET_BYTES))
        exposed = gather / n + max(0.0, gather * (1 - 1 / n) - forward_s)
        total -= (gather - exposed) * (1 - ctx.cluster.hw.overlap_cost)
    if lay.zero in (ZeroStage.NONE, ZeroStage.OPTIMIZER) and lay.dp > 1 and ctx.work.overlap_grad_reduce:
        reduce = ctx.dp_seconds(dp_step_ledger(psi, lay.zero, lay.dp, ctx.work.grad_bytes, param_bytes)) - gather
        n = max(1, math.ceil(ctx.work.grad_bytes * psi / BUCKET_BYTES))
        exposed = reduce / n + max(0.0, reduce * (1 - 1 / n) - backward_s)
        total -= (reduce - exposed) * (1 - ctx.cluster.hw.overlap_cost)
    return total


# The optimizer step's passes over a partition, bytes per parameter read + written (docs/planner.md "Optimizer"):
# the fp32 master gradient made from the 2-byte one (read 2, write 4; none with fp32 gradients or in fp32), the
# clip norm (read 4) and scale (read 4, write 4), Adam (read master, m, v and the gradient, write master, m, v:
# 28) and the bf16 parameter written back (read 4, write 2; none in fp32).
OPTIMIZER_PASSES = {"master_grad": 6, "clip_norm": 4, "clip_scale": 8, "adam": 28, "write_back": 6}
OPTIMIZER_KERNELS_PER_TENSOR = 4  # eager: norm, scale, Adam (foreach / fused groups aside), write-back per tensor


def optimizer_bytes_per_param(work: Workload) -> float:
    """HBM bytes the optimizer step moves per parameter of the rank's partition (OPTIMIZER_PASSES)."""
    passes = dict(OPTIMIZER_PASSES)
    if work.fp32_grads or work.precision is not Precision.MIXED:
        del passes["master_grad"]
    if work.precision is not Precision.MIXED:
        del passes["write_back"]
    passes["adam"] -= 6 * (4 - work.optimizer_dtype_bytes)  # bf16 states: master, m, v read and written at 2
    return float(sum(passes.values()))


def _optimizer_seconds(ctx: _Context, psi: float) -> float:
    """The optimizer step on this rank's partition: its passes' bytes at the memory-bound rate plus its kernels
    (eager: OPTIMIZER_KERNELS_PER_TENSOR a parameter tensor; fused multi-tensor kernels: that many per 25 MiB
    bucket) -- or, offloaded, the partition over PCIe and Adam on the host CPUs."""
    lay, hw = ctx.layout, ctx.cluster.hw
    part = psi / (lay.dp_shard if lay.zero >= ZeroStage.OPTIMIZER else 1)
    pr, grad = ctx.work.precision, ctx.work.grad_bytes
    if lay.offload is Offload.NONE:
        nbytes = optimizer_bytes_per_param(ctx.work) * part
        if ctx.work.kernel_profile is KernelProfile.EAGER:
            units = _parameter_tensors(ctx)
        else:
            units = math.ceil(4 * part / BUCKET_BYTES)
        return ctx.hbm_seconds(nbytes) + ctx.launch_seconds(OPTIMIZER_KERNELS_PER_TENSOR * units) + _optimizer_cpu(ctx)
    pcie = (grad + pr.param_bytes) * part / (hw.pcie_gbps * GB)
    cpu = part * min(hw.gpus_per_node, ctx.cluster.gpus) / hw.cpu_adam_params_per_s
    return pcie + cpu


def _optimizer_cpu(ctx: _Context) -> float:
    """A calibrated CPU's optimizer work beyond its bytes (calibrate.optimizer_step_cpu: the runtime's ZeroOptimizer
    timed on two stage sizes): Hardware.optimizer_tensor_cpu_s x the fullest rank's parameter tensors
    + optimizer_step_cpu_s. 0 on GPUs and in profiles without the probe (nothing else computed then)."""
    hw = ctx.cluster.hw
    if not (hw.optimizer_tensor_cpu_s or hw.optimizer_step_cpu_s):
        return 0.0
    return hw.optimizer_tensor_cpu_s * _parameter_tensors(ctx) + hw.optimizer_step_cpu_s


def _parameter_tensors(ctx: _Context) -> int:
    """Parameter tensors of the fullest pipeline rank: per layer its linears' weights and biases and its norms'
    weights (and LayerNorm biases), plus the embedding / head / final norm."""
    cfg, lay = ctx.work.model, ctx.layout
    shard = ctx.shard
    linears = 4 + shard.mlp_matrices
    biases = 3 * cfg.qkv_bias + cfg.out_bias + shard.mlp_matrices * cfg.mlp_bias
    norms = 2 * (2 if shard.is_gpt2 else 1)
    layers = stage_layers(cfg, lay.pp, lay.v, ctx.work.seq_length, ctx.work.pipeline_split)
    most = max(sum(layers[s] for s in lay.rank_stages(r)) for r in range(lay.pp))
    return most * (linears + biases + norms) + 3


def _other_seconds(ctx: _Context) -> float:
    """Tied-embedding gradient all-reduce (the V_p/t x h table) between the first and last stage (pp > 1), and
    the partial-gradient all-reduce (SP, replicated kv-heads) of the fullest pipeline rank."""
    lay, cfg, hw, grad_bytes = ctx.layout, ctx.work.model, ctx.cluster.hw, ctx.work.grad_bytes
    out = 0.0
    if cfg.tie_embeddings and lay.pp > 1 and lay.stage_rank(lay.pp * lay.v - 1) != 0:  # ZBV: both on rank 0
        pair = GroupPlacement(size=2, per_node=1 if pipeline_crosses_nodes(ctx.cluster, lay) else 2)
        table = ctx.shard.vocab // ctx.shard.t * cfg.hidden_size
        out += collective_seconds(hw, Collective.ALL_REDUCE, grad_bytes * table, pair)
    if lay.tp > 1:
        layers = stage_layers(cfg, lay.pp, lay.v, ctx.work.seq_length, ctx.work.pipeline_split)
        head = lay.stage_rank(lay.pp * lay.v - 1)
        # ranks alike in (layers, embedding, head) send alike: each distinct one priced once (pp 64 has ~3)
        kinds = {(sum(layers[s] for s in lay.rank_stages(r)), r == 0, r == head) for r in range(lay.pp)}
        out += max(ctx.tp_seconds(partial_grad_ledger(ctx.shard, n, first, last, lay.sequence_parallel, grad_bytes))
                   for n, first, last in kinds)
    return out


def step_time(work: Workload, cluster: Cluster, layout: Layout, budget: float = SIM_BUDGET) -> StepTime:
    """Seconds of one step of `layout` (assumed valid: see layout.check_layout)."""
    ctx = _context(work, cluster, layout)
    m = work.num_microbatches(layout)
    st = _stages(work, cluster, layout, ctx)
    times, compute, tp_comm, hidden = st.times, st.compute, st.comm, st.hidden
    run = run_pipeline(layout.schedule, layout.pp, m, layout.v, times, budget)
    psi = max(rank_parameters(work, layout))  # both grow with Psi: the fullest rank finishes last
    first_forward = min(sum(times.forward[s] for s in layout.rank_stages(r)) for r in range(layout.pp))
    last_backward = min(sum(times.backward[s] for s in layout.rank_stages(r)) for r in range(layout.pp))
    dp = _dp_step_seconds(ctx, psi, first_forward, last_backward)
    opt = _optimizer_seconds(ctx, psi) * cluster.hw.shared_compute_factor(_devices_per_node(cluster))
    other = _other_seconds(ctx)
    comm_cpu = sum(comm_cpu_seconds(work, cluster, layout, r) for r in range(layout.pp))
    bound = shared_compute_bound(cluster, layout, run, m, times, comm_cpu)
    if comm_cpu:  # the bound holds the DP / embedding syncs' CPU: the step is max(makespan + tail, bound + opt)
        bound -= dp + other
    makespan = run.makespan
    if st.cpu is not None:  # ranks share the cores: the schedule simulated on them (shared_cores.py)
        makespan = run_shared(layout.schedule, layout.pp, m, layout.v, times, st.cpu, layout.tp * layout.dp,
                              max(1, cluster.nodes) * cluster.hw.compute_units, budget)
    pipeline = max(makespan, bound)
    p = st.parts.scaled(m)
    in_passes = m * (st.busy - st.compute - st.comm - st.p2p - st.lost)
    terms = (("gemm", p.gemm), ("attention", p.attention), ("memory_bound", p.memory), ("launches", p.launches),
             ("executor", p.glue), ("zero3_copies", p.copies),
             ("tp", m * (tp_comm - st.wait)), ("tp_wait", m * st.wait), ("pp_p2p", m * st.p2p),
             ("dp_in_passes", in_passes), ("overlap", m * st.lost),
             ("bubble", pipeline - m * st.busy), ("dp_exposed", dp), ("optimizer", opt), ("other", other))
    return StepTime(total=pipeline + dp + opt + other, pipeline=pipeline, compute=m * compute,
                    tp_comm=m * tp_comm, pp_comm=times.comm, dp_comm=dp, overlapped_dp=m * hidden,
                    optimizer=opt, other=other, bubble_fraction=run.bubble_fraction, run=run, terms=terms)


def hsdp_traffic(work: Workload, cluster: Cluster, layout: Layout) -> dict | None:
    """HSDP's two groups' traffic in one step (Layout.dp_replicate > 1; None otherwise), for the plan's JSON and
    --explain: per group its ranks, where they sit, and the fullest pipeline rank's ledger entries on it
    (predicted_comm.step_ledger: the shard group's all-gathers and reduce-scatters, the replica group's
    all-reduces of the reduced shards) -- calls, bytes (nccl-tests sizes) and their seconds on that group's link
    if run alone (ledger_seconds; the step overlaps them with the compute and with each other: _overlapped)."""
    if layout.dp_replicate == 1:
        return None
    rank = max(range(layout.pp), key=lambda r: rank_parameters(work, layout)[r])
    ledger = step_ledger(work, layout, rank)
    out = {}
    for name, group, place in (("shard", "dp", shard_placement(cluster, layout)),
                               ("replicate", "dp_replicate", replicate_placement(cluster, layout))):
        mine = {k: e for k, e in ledger.items() if k.endswith("@" + group)}
        out[name] = {"ranks": place.size, "per_node": place.per_node,
                     "link": "across nodes" if place.spans_nodes else "inside a node",
                     "calls": sum(int(e["calls"]) for e in mine.values()),
                     "bytes": sum(e["bytes"] for e in mine.values()),
                     "seconds": ledger_seconds(mine, cluster.hw, place)}
    return out


def _devices_per_node(cluster: Cluster) -> int:
    return min(cluster.gpus, cluster.hw.gpus_per_node)


def shared_compute_bound(cluster: Cluster, layout: Layout, run: PipelineRun, m: int = 0,
                         times: StageTimes | None = None, comm_cpu: float = 0.0) -> float:
    """Devices that share compute units (a CPU's cores: `Hardware.compute_units`) cannot together be busy
    longer than the units allow: the pipeline takes at least the compute seconds of every device of a node
    (t d ranks per pipeline rank, each m x its per-micro-batch compute, priced at one device's uncontended
    rate) / the units. A bubble is then not lost -- an idle rank's core serves the others -- and neither is
    time a rank waits in a TP collective: only compute occupies a core (`times.rank_compute`; without it, the
    simulated busy time, TP collectives included). The cores also do the collectives' own CPU work (gloo copies,
    reduces and runs its threads): `comm_cpu`, the step's CPU seconds of it summed over one rank of each pipeline
    rank (comm_cpu_seconds). 0 when devices compute on their own (GPUs)."""
    hw = cluster.hw
    if hw.shared_compute_factor(_devices_per_node(cluster)) == 1.0:
        return 0.0
    nodes = max(1, cluster.nodes)
    work = m * sum(times.rank_compute) if times is not None and times.rank_compute else sum(run.busy)
    return layout.tp * layout.dp * (work + comm_cpu) / (nodes * hw.compute_units)


# train.py's per-step scalar all-reduces beside the gradients (not in predicted_comm's ledger): the NaN guard's world
# sum (tp, pp, dp: hybrid/fault/nan_guard.world_sum), the clip norm's (tp, pp: ZeroOptimizer._all_ranks_sum, on by
# default, --clip-grad 1.0) and the logged loss (pp, dp: train_step's ":metrics"). A few bytes each: only their
# per-call CPU counts, and only on a CPU (comm_cpu_seconds).
STEP_SCALAR_ALL_REDUCES = ("tp", "pp", "dp", "tp", "pp", "pp", "dp")


def comm_cpu_seconds(work: Workload, cluster: Cluster, layout: Layout, pp_rank: int) -> float:
    """CPU seconds a rank of pipeline rank `pp_rank` burns a step in its collectives and pipeline messages (every
    entry of predicted_comm.step_ledger), on a CPU whose gloo costs `hybrid calibrate` measured on pairs: a ring
    all-reduce over n ranks takes 2(n - 1) steps (a pair's: 2), an all-gather / reduce-scatter n - 1, so a call
    costs collective_cpu_s x steps / 2 + comm_cpu_s_per_byte x its wire bytes; a send or a receive p2p_cpu_s +
    comm_cpu_s_per_byte x its bytes; and train.py's scalar all-reduces (STEP_SCALAR_ALL_REDUCES). 0 unless the
    hardware shares its compute units (GPUs: the copy engines and NCCL's kernels are not the compute)."""
    hw = cluster.hw
    if hw.shared_compute_factor(_devices_per_node(cluster)) == 1.0 or not (
            hw.collective_cpu_s or hw.p2p_cpu_s or hw.comm_cpu_s_per_byte):
        return 0.0
    sizes = {"tp": layout.tp, "dp": layout.dp_shard, "dp_replicate": layout.dp_replicate, "embedding": 2, "pp": 2}
    scalars = {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp}
    total = sum(hw.collective_cpu_s * (scalars[g] - 1) for g in STEP_SCALAR_ALL_REDUCES)
    return total + _ledger_cpu(hw, step_ledger(work, layout, pp_rank), sizes)


def _ledger_cpu(hw: Hardware, ledger: Ledger, sizes: dict[str, int]) -> float:
    """CPU seconds of a ledger's entries (comm_cpu_seconds' pricing; a group missing from `sizes` has 2 ranks)."""
    total = 0.0
    for key, entry in ledger.items():
        op, group = key.split("@")
        calls, nbytes, n = entry["calls"], entry["bytes"], sizes.get(group, 2)
        if op in ("send", "recv"):
            total += calls * hw.p2p_cpu_s + nbytes * hw.comm_cpu_s_per_byte
            continue
        coll = Collective(op)
        steps = 2 * (n - 1) if coll is Collective.ALL_REDUCE else n - 1
        total += calls * hw.collective_cpu_s * steps / 2 + wire_bytes(coll, nbytes, n) * hw.comm_cpu_s_per_byte
    return total


def lower_bound_seconds(work: Workload, cluster: Cluster, layout: Layout) -> float:
    """A step can take no less than this (no simulation); the search ranks candidates by it and simulates
    only those that could still make the top K. Whatever the schedule, rank r computes m x its stage costs,
    cannot start before micro-batch 0 has gone forward through the stages before it, and its last backward's
    gradient must still go back through them:

        T >= max_r [ sum_{s<r} (f_s + b_s + 2 comm) + m sum_{s of rank r} (f_s + b_s) ] + per-step tail

    (rank r's stages: c pp + r, or r and 2 pp - 1 - r under ZBV's V; stage r is its first either way)."""
    ctx = _context(work, cluster, layout)
    m = work.num_microbatches(layout)
    times = _stages(work, cluster, layout, ctx).times
    pp = layout.pp
    fill = 0.0
    busiest = 0.0
    for r, stages in enumerate(rank_stages(pp, layout.v, layout.schedule.placement)):
        work_r = m * sum(times.forward[s] + times.backward[s] for s in stages)
        busiest = max(busiest, fill + work_r)
        fill += times.forward[r] + times.backward[r] + 2 * times.comm
    psi = max(rank_parameters(work, layout))
    tail = _dp_step_seconds(ctx, psi, math.inf, math.inf) + _optimizer_seconds(ctx, psi)  # the least exposed
    return busiest + tail + _other_seconds(ctx)
