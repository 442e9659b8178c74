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
               plus the recomputed forward's matmuls (full: all; selective: the attention core; bf16-flash:
               + QK^T, which flash attention's backward recomputes), and
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
  2 more in the backward under full recomputation (the rerun forward); the embedding's forward all-reduce
  (stage 0), the LM-head input's backward all-reduce (last stage) and the vocab-parallel cross-entropy's 3
  all-reduces of b s fp32 values; under SP one all-reduce per step of the sequence-split parameters' gradients.
* PP: one b s h x 2-byte message per stage boundary per micro-batch each way (/t under SP, where hidden states
  between stages are sequence-split), over NVLink or the sender's NIC; the simulation places them.
* DP, after the last backward, not overlapped (as the runtime's GradAverager does): ZeRO 0 all-reduces the
  rank's 2 Psi gradient bytes (4 Psi with fp32 gradients, Workload.fp32_grads: every gradient byte count here
  doubles); ZeRO 1 reduce-scatters them and all-gathers the updated 2 Psi parameter bytes
  (the same wire bytes: the paper's 2 Psi). ZeRO 2 keeps only a gradient partition, so it reduce-scatters each
  micro-batch's gradients during that micro-batch's backward and all-gathers the parameters once per step;
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
from dataclasses import dataclass

from hybrid.planner.hardware import GB, Collective, Gemm, GroupPlacement, collective_seconds, p2p_seconds
from hybrid.planner.layout import (Cluster, Layout, Offload, Recompute, Workload, ZeroStage, dp_placement,
                                   pipeline_crosses_nodes, stage_layers, tp_placement)
from hybrid.planner.predicted_comm import (BUCKET_BYTES, Ledger, dp_microbatch_ledger, dp_step_ledger, ledger_seconds,
                                   partial_grad_ledger, tp_ledger)
from hybrid.planner.predicted_memory import rank_parameters
from hybrid.planner.model import Shard
from hybrid.planner.schedule import SIM_BUDGET, PipelineRun, StageTimes, run_pipeline



# HBM traffic of the memory-bound kernels per byte a layer saves: in the forward each saved tensor is written by
# the kernel that makes it and read by the next one (2); in the backward a kernel reads the saved tensor and the
# incoming gradient and writes the outgoing one (3). (It was 1 and 2 -- writes only -- before the GEMM curve.)
FWD_TRAFFIC = 2.0
BWD_TRAFFIC = 3.0


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


def exact_step_flops(work: Workload, tp: int = 1, recompute: Recompute = Recompute.NONE) -> float:
    """FLOPs all GPUs execute in one step, from the model's shapes at tensor-parallel size `tp`."""
    shard = work.shard(tp)
    s = work.seq_length
    layer = 3 * shard.layer_forward_flops(1, s) + _recompute_flops(shard, 1, s, recompute)
    head = 3 * shard.head_forward_flops(1, s)
    return work.global_batch * tp * (work.model.num_layers * layer + head)


def step_flops(work: Workload, layout: Layout, formula: FlopsFormula) -> float:
    """Hardware FLOPs of one step (recomputation included), by `formula`."""
    if formula is FlopsFormula.EXACT:
        return exact_step_flops(work, layout.tp, layout.recompute)
    cfg = work.model
    full = megatron_step_flops(work.global_batch, work.seq_length, cfg.num_layers, cfg.hidden_size,
                               work.padded_vocab(layout.tp), recompute=layout.recompute is Recompute.FULL)
    if layout.recompute is Recompute.SELECTIVE:  # + the attention core once more: 4 B s^2 h per layer
        full += 4.0 * work.global_batch * work.seq_length ** 2 * cfg.hidden_size * cfg.num_layers
    return full


def model_flops(work: Workload) -> float:
    """FLOPs of the model itself (no recomputation, tp = 1): the numerator of MFU."""
    return exact_step_flops(work, 1, Recompute.NONE)


def _recompute_flops(shard: Shard, b: int, s: int, recompute: Recompute) -> float:
    if recompute is Recompute.FULL:
        return shard.layer_forward_flops(b, s)
    if recompute is Recompute.SELECTIVE:
        return shard.attention_core_flops(b, s)
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


@dataclass(frozen=True)
class _Context:
    """Everything the per-stage cost functions share."""

    work: Workload
    cluster: Cluster
    layout: Layout
    shard: Shard
    tp_group: GroupPlacement
    dp_group: GroupPlacement

    def tp_seconds(self, ledger: Ledger) -> float:
        return ledger_seconds(ledger, self.cluster.hw, self.tp_group)

    def dp_seconds(self, ledger: Ledger) -> float:
        return ledger_seconds(ledger, self.cluster.hw, self.dp_group)

    def gemm_seconds(self, gemms: tuple[Gemm, ...]) -> float:
        """Forward seconds of `gemms` on the GEMM curve (roofline + fixed cost, in the activation dtype)."""
        hw, nbytes = self.cluster.hw, self.work.precision.activation_bytes
        return sum(hw.gemm_seconds(g, nbytes) for g in gemms)

    def backward_gemm_seconds(self, gemms: tuple[Gemm, ...]) -> float:
        """Their backward: an input-gradient and a weight-gradient product per forward matmul (Gemm.backward)."""
        return self.gemm_seconds(tuple(g2 for g in gemms for g2 in g.backward()))

    def hbm_seconds(self, nbytes: float) -> float:
        """Seconds of memory-bound kernels moving `nbytes` (Hardware.elementwise_bytes_per_s)."""
        return nbytes / self.cluster.hw.elementwise_bytes_per_s


def _context(work: Workload, cluster: Cluster, layout: Layout) -> _Context:
    return _Context(work=work, cluster=cluster, layout=layout,
                    shard=work.shard(layout.tp),
                    tp_group=tp_placement(cluster, layout), dp_group=dp_placement(cluster, layout))


@dataclass(frozen=True)
class _Cost:
    """Seconds of one micro-batch: compute (matmuls and memory-bound kernels) and TP communication."""

    forward_compute: float
    backward_compute: float
    forward_comm: float
    backward_comm: float


def _tp_cost(ctx: _Context, layers: int, first: bool, last: bool) -> tuple[float, float]:
    """(forward, backward) seconds of the TP ledger of `layers` layers and the stage's edges."""
    lay = ctx.layout
    book = tp_ledger(ctx.shard, lay.micro_batch, ctx.work.seq_length, layers, first, last,
                     lay.sequence_parallel, lay.recompute, ctx.work.precision.activation_bytes)
    return ctx.tp_seconds(book["forward"]), ctx.tp_seconds(book["backward"])


def _layer_cost(ctx: _Context) -> _Cost:
    """One Transformer layer, one micro-batch: its matmuls on the GEMM curve, its saved bytes at HBM speed."""
    lay, b, s = ctx.layout, ctx.layout.micro_batch, ctx.work.seq_length
    gemms = ctx.shard.layer_gemms(b, s)
    rerun = {Recompute.NONE: (), Recompute.SELECTIVE: ctx.shard.attention_core_gemms(b, s),
             Recompute.FULL: gemms}[lay.recompute] + ctx.shard.flash_backward_gemms(b, s)
    rep, split, core = ctx.shard.layer_activation_terms(b, s, lay.sequence_parallel)
    saved = rep + split + core
    recompute_bytes = {Recompute.NONE: 0.0, Recompute.SELECTIVE: core, Recompute.FULL: saved}[lay.recompute]
    hw = ctx.cluster.hw  # + a layer pass's fixed cost (calibrated on CPUs; 0 on the GPU presets)
    forward = ctx.gemm_seconds(gemms) + ctx.hbm_seconds(FWD_TRAFFIC * saved) + hw.layer_forward_overhead_s
    backward = (ctx.backward_gemm_seconds(gemms) + ctx.gemm_seconds(rerun)
                + ctx.hbm_seconds(BWD_TRAFFIC * saved + FWD_TRAFFIC * recompute_bytes) + hw.layer_backward_overhead_s
                + (hw.layer_forward_overhead_s if lay.recompute is Recompute.FULL else 0.0))
    return _Cost(forward, backward, *_tp_cost(ctx, 1, False, False))


def layer_parts(work: Workload, cluster: Cluster, layout: Layout) -> tuple[float, float, float]:
    """One layer, one micro-batch, no recomputation: (forward GEMM seconds, backward GEMM seconds, bytes of
    memory-bound traffic forward + backward), the parts `_layer_cost` adds up. `hybrid calibrate` measures a
    real layer and solves for the rate that makes these reproduce it (Hardware.elementwise_tbps)."""
    ctx = _context(work, cluster, layout)
    gemms = ctx.shard.layer_gemms(layout.micro_batch, work.seq_length)
    saved = sum(ctx.shard.layer_activation_terms(layout.micro_batch, work.seq_length, layout.sequence_parallel))
    return ctx.gemm_seconds(gemms), ctx.backward_gemm_seconds(gemms), (FWD_TRAFFIC + BWD_TRAFFIC) * saved


def _edge_cost(ctx: _Context, first: bool, last: bool) -> _Cost:
    """The embedding (first stage: a gather, no matmul) and the LM head + loss (last stage)."""
    fwd = bwd = 0.0
    if last:
        b, s, sp = ctx.layout.micro_batch, ctx.work.seq_length, ctx.layout.sequence_parallel
        head = (ctx.shard.head_gemm(b, s),)
        logits = ctx.shard.head_activation_bytes(b, s, sp)
        fwd = ctx.gemm_seconds(head) + ctx.hbm_seconds(FWD_TRAFFIC * logits)
        bwd = ctx.backward_gemm_seconds(head) + ctx.hbm_seconds(BWD_TRAFFIC * logits)
    return _Cost(fwd, bwd, *_tp_cost(ctx, 0, first, last))


def _chunk_dp_overlap(ctx: _Context, chunk_params: float) -> tuple[float, float]:
    """Per-micro-batch (forward, backward) seconds of ZeRO 2/3 collectives and parameter fetches of one chunk;
    they run under the chunk's compute (prefetching), so the chunk takes the longer of the two."""
    lay, hw = ctx.layout, ctx.cluster.hw
    pr = ctx.work.precision
    book = dp_microbatch_ledger(chunk_params, lay.zero, lay.dp, ctx.work.grad_bytes, pr.param_bytes)
    fwd, bwd = ctx.dp_seconds(book["forward"]), ctx.dp_seconds(book["backward"])
    if lay.offload is Offload.OPTIMIZER_AND_PARAMS:  # this rank's parameter partition over PCIe, each way
        fetch = pr.param_bytes * chunk_params / lay.dp / (hw.pcie_gbps * GB)
        fwd, bwd = fwd + fetch, bwd + fetch
    return fwd, bwd


@dataclass(frozen=True)
class _StageCost:
    """One global stage, one micro-batch: what the simulation gets (forward, backward) and its parts."""

    forward: float
    backward: float
    compute: float  # matmuls and memory-bound kernels, forward + backward
    comm: float  # TP collectives, forward + backward
    hidden: float  # ZeRO 2/3 collective seconds that run under the compute


def _overlapped(compute: float, tp: float, dp: float, layers: int, contended: bool,
                pp_link: float = 0.0) -> tuple[float, float]:
    """(seconds, hidden DP seconds) of one pass of a stage whose `layers` layers compute for `compute` seconds,
    spend `tp` in synchronous TP collectives and move `dp` seconds of ZeRO 2/3 traffic (or parameter fetches).

    Only what has compute to run under is hidden: the first layer's all-gather of a forward (nothing runs
    before it) and the last layer's reduce-scatter of a backward (nothing runs after it) are exposed, one
    layer's share dp / layers each. When the DP and TP groups share a link (both inside a node, on NVLink) the
    link carries both, so the rest overlaps only the compute, not the TP collectives:
        contended:  exposed + tp + max(compute, dp - exposed + pp_link)
        otherwise:  exposed + max(compute + tp, dp - exposed + pp_link)
    `pp_link`: seconds of this pass's outgoing pipeline message when it leaves on the DP ring's link (both on
    NVLink, or both on the NICs): the link carries it too, so it takes from the window the DP traffic runs in.
    The message's own transfer stays where the pipeline simulation places it."""
    if dp <= 0:
        return compute + tp, 0.0
    exposed = dp / max(1, layers)
    rest = dp - exposed
    if contended:
        return exposed + tp + max(compute, rest + pp_link), min(compute, rest)
    return exposed + max(compute + tp, rest + pp_link), min(compute + tp, rest)


def _stage_cost(ctx: _Context, cost: _Cost, n: int, first: bool, last: bool) -> _StageCost:
    edge = _edge_cost(ctx, first, last)
    f_comp = n * cost.forward_compute + edge.forward_compute
    b_comp = n * cost.backward_compute + edge.backward_compute
    f_tp = n * cost.forward_comm + edge.forward_comm
    b_tp = n * cost.backward_comm + edge.backward_comm
    dp_f, dp_b = _chunk_dp_overlap(ctx, n * ctx.shard.layer_params())
    contended = ctx.layout.tp > 1 and not ctx.dp_group.spans_nodes  # TP and DP rings on the same NVLink
    send = _pp_send_on_dp_link(ctx)  # forward: to the next stage (not the last); backward: to the previous
    f, f_hidden = _overlapped(f_comp, f_tp, dp_f, n, contended, 0.0 if last else send)
    b, b_hidden = _overlapped(b_comp, b_tp, dp_b, n, contended, 0.0 if first else send)
    return _StageCost(forward=f, backward=b, compute=f_comp + b_comp, comm=f_tp + b_tp, hidden=f_hidden + b_hidden)


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


def stage_times(work: Workload, cluster: Cluster, layout: Layout) -> tuple[StageTimes, float, float, float]:
    """Per-global-stage seconds of one micro-batch for the simulation, plus (busiest rank's compute per
    micro-batch, its TP seconds per micro-batch, ZeRO seconds hidden under compute per micro-batch)."""
    ctx = _context(work, cluster, layout)
    pp, v = layout.pp, layout.v
    layers = stage_layers(work.model, pp, v, work.seq_length)
    cost = _layer_cost(ctx)
    kinds: dict[tuple[int, bool, bool], _StageCost] = {}  # stages alike in (layers, first, last) cost alike
    fwd, bwd, compute, comm, hidden = [], [], [0.0] * pp, [0.0] * pp, [0.0] * pp
    for stage, n in enumerate(layers):
        key = (n, stage == 0, stage == pp * v - 1)
        if key not in kinds:
            kinds[key] = _stage_cost(ctx, cost, *key)
        c, r = kinds[key], stage % pp
        fwd.append(c.forward)
        bwd.append(c.backward)
        compute[r] += c.compute
        comm[r] += c.comm
        hidden[r] += c.hidden
    message = layout.micro_batch * work.seq_length * work.model.hidden_size * work.precision.activation_bytes
    message /= layout.tp if layout.sequence_parallel else 1  # SP: hidden states between stages are (b, s/t, h)
    p2p = p2p_seconds(cluster.hw, message, pipeline_crosses_nodes(cluster, layout)) if pp > 1 else 0.0
    busiest = max(range(pp), key=lambda r: compute[r] + comm[r])
    return StageTimes(tuple(fwd), tuple(bwd), p2p, tuple(compute)), compute[busiest], comm[busiest], max(hidden)


def _dp_step_seconds(ctx: _Context, psi: float, forward_s: float = 0.0) -> float:
    """DP synchronisation after the last backward for a rank holding `psi` parameters (ledger.dp_step_ledger).

    ZeRO 1-2's all-gather of the updated parameters overlaps the next step's forward (the runtime's default,
    ZeroConfig.overlap_param_gather: each bucket is waited for by the first block that uses it). Exposed: the
    first of its n buckets (nothing runs before it) and whatever the rest does not fit under the first
    micro-batch's forward on this rank (`forward_s`, the only compute before the last bucket is needed):

        gather / n + max(0, gather (1 - 1/n) - forward_s)

    Ignored: the gathers share the link with the forward's TP collectives (contention), and a rank whose first
    forward waits for its pipeline input has more time to hide them."""
    lay = ctx.layout
    pr = ctx.work.precision
    total = ctx.dp_seconds(dp_step_ledger(psi, lay.zero, lay.dp, ctx.work.grad_bytes, pr.param_bytes))
    if lay.zero in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS) and lay.dp > 1:
        gather = ctx.dp_seconds(dp_step_ledger(psi, ZeroStage.GRADIENTS, lay.dp, ctx.work.grad_bytes,
                                               pr.param_bytes))
        n = max(1, math.ceil(pr.param_bytes * psi / BUCKET_BYTES))
        exposed = gather / n + max(0.0, gather * (1 - 1 / n) - forward_s)
        total -= gather - exposed
    return total


def _optimizer_seconds(ctx: _Context, psi: float) -> float:
    """Adam on this rank's partition: on the GPU (HBM-bound) or, offloaded, over PCIe and on the host CPUs."""
    lay, hw = ctx.layout, ctx.cluster.hw
    part = psi / (lay.dp if lay.zero >= ZeroStage.OPTIMIZER else 1)
    pr, grad = ctx.work.precision, ctx.work.grad_bytes  # fp32 gradients: Adam reads 4 bytes, not 2
    if lay.offload is Offload.NONE:
        return ctx.hbm_seconds((pr.adam_bytes + grad - pr.grad_bytes) * part)
    pcie = (grad + pr.param_bytes) * part / (hw.pcie_gbps * GB)
    cpu = part * min(hw.gpus_per_node, ctx.cluster.gpus) / hw.cpu_adam_params_per_s
    return pcie + cpu


def _other_seconds(ctx: _Context) -> float:
    """Tied-embedding gradient all-reduce (the V_p/t x h table) between the first and last stage (pp > 1), and
    the partial-gradient all-reduce (SP, replicated kv-heads) of the fullest pipeline rank."""
    lay, cfg, hw, grad_bytes = ctx.layout, ctx.work.model, ctx.cluster.hw, ctx.work.grad_bytes
    out = 0.0
    if cfg.tie_embeddings and lay.pp > 1:
        pair = GroupPlacement(size=2, per_node=1 if pipeline_crosses_nodes(ctx.cluster, lay) else 2)
        table = ctx.shard.vocab // ctx.shard.t * cfg.hidden_size
        out += collective_seconds(hw, Collective.ALL_REDUCE, grad_bytes * table, pair)
    if lay.tp > 1:
        layers = stage_layers(cfg, lay.pp, lay.v, ctx.work.seq_length)
        out += max(ctx.tp_seconds(partial_grad_ledger(
            ctx.shard, sum(layers[c * lay.pp + r] for c in range(lay.v)), r == 0, r == lay.pp - 1,
            lay.sequence_parallel, grad_bytes)) for r in range(lay.pp))
    return out


def step_time(work: Workload, cluster: Cluster, layout: Layout, budget: float = SIM_BUDGET) -> StepTime:
    """Seconds of one step of `layout` (assumed valid: see layout.check_layout)."""
    ctx = _context(work, cluster, layout)
    m = work.num_microbatches(layout)
    times, compute, tp_comm, hidden = stage_times(work, cluster, layout)
    run = run_pipeline(layout.schedule, layout.pp, m, layout.v, times, budget)
    psi = max(rank_parameters(work, layout))  # both grow with Psi: the fullest rank finishes last
    first_forward = min(sum(times.forward[c * layout.pp + r] for c in range(layout.v)) for r in range(layout.pp))
    dp = _dp_step_seconds(ctx, psi, first_forward)
    opt = _optimizer_seconds(ctx, psi) * cluster.hw.shared_compute_factor(_devices_per_node(cluster))
    other = _other_seconds(ctx)
    pipeline = max(run.makespan, shared_compute_bound(cluster, layout, run, m, times))
    return StepTime(total=pipeline + dp + opt + other, pipeline=pipeline, compute=m * compute,
                    tp_comm=m * tp_comm, pp_comm=times.comm, dp_comm=dp, overlapped_dp=m * hidden,
                    optimizer=opt, other=other, bubble_fraction=run.bubble_fraction, run=run)


def _devices_per_node(cluster: Cluster) -> int:
    return min(cluster.gpus, cluster.hw.gpus_per_node)


def shared_compute_bound(cluster: Cluster, layout: Layout, run: PipelineRun, m: int = 0,
                         times: StageTimes | None = None) -> float:
    """Devices that share compute units (a CPU's cores: `Hardware.compute_units`) cannot together be busy
    longer than the units allow: the pipeline takes at least the compute seconds of every device of a node
    (t d ranks per pipeline rank, each m x its per-micro-batch compute, priced at one device's uncontended
    rate) / the units. A bubble is then not lost -- an idle rank's core serves the others -- and neither is
    time a rank waits in a TP collective: only compute occupies a core (`times.rank_compute`; without it, the
    simulated busy time, TP collectives included). 0 when devices compute on their own (GPUs)."""
    hw = cluster.hw
    if hw.shared_compute_factor(_devices_per_node(cluster)) == 1.0:
        return 0.0
    nodes = max(1, cluster.nodes)
    work = m * sum(times.rank_compute) if times is not None and times.rank_compute else sum(run.busy)
    return layout.tp * layout.dp * work / (nodes * hw.compute_units)


def lower_bound_seconds(work: Workload, cluster: Cluster, layout: Layout) -> float:
    """A step can take no less than this (no simulation); the search ranks candidates by it and simulates
    only those that could still make the top K. Whatever the schedule, rank r computes m x its stage costs,
    cannot start before micro-batch 0 has gone forward through the stages before it, and its last backward's
    gradient must still go back through them:

        T >= max_r [ sum_{s<r} (f_s + b_s + 2 comm) + m sum_c (f_{c pp + r} + b_{c pp + r}) ] + per-step tail."""
    ctx = _context(work, cluster, layout)
    m = work.num_microbatches(layout)
    times, _, _, _ = stage_times(work, cluster, layout)
    pp, v = layout.pp, layout.v
    fill = 0.0
    busiest = 0.0
    for r in range(pp):
        work_r = m * sum(times.forward[c * pp + r] + times.backward[c * pp + r] for c in range(v))
        busiest = max(busiest, fill + work_r)
        fill += times.forward[r] + times.backward[r] + 2 * times.comm
    psi = max(rank_parameters(work, layout))
    tail = _dp_step_seconds(ctx, psi, math.inf) + _optimizer_seconds(ctx, psi)  # ZeRO 1-2: the least exposed
    return busiest + tail + _other_seconds(ctx)
