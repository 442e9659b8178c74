"""Device memory of each pipeline rank: model states, activations, buffers.

Model states (Rajbhandari et al. 2020, "ZeRO", Sec. 3.1 and Table 1): mixed-precision Adam keeps fp16
parameters (2 bytes), fp16 gradients (2) and K = 12 bytes of optimizer state (fp32 master weights, momentum,
variance) per parameter. With Psi the parameters of this rank (its TP shard of its pipeline stage's layers,
plus the embedding on the first stage and the final norm and LM head on the last) and Nd the data-parallel
size, bytes per device:

    ZeRO 0   (2 + 2 + K) Psi
    ZeRO 1   4 Psi + K Psi / Nd                  (optimizer states partitioned)
    ZeRO 2   2 Psi + (2 + K) Psi / Nd            (+ gradients)
    ZeRO 3   (2 + 2 + K) Psi / Nd                (+ parameters)

Precision.FP32 (this runtime on CPU) keeps fp32 parameters and gradients and two fp32 Adam moments, no master
copy: 4 + 4 + 8 bytes (`model_states(..., precision)`).

fp32 gradients (`Workload.fp32_grads`: Megatron's main grads, train.py's --bf16 default and `hybrid plan`'s with
--precision mixed; `--grad-reduce-in-bf16` turns them off) price the
gradient at 4 bytes instead of 2: ZeRO 0 (2 + 4 + 12) Psi = 18 Psi, ZeRO 1 6 Psi + 12 Psi / Nd, ZeRO 2
2 Psi + 16 Psi / Nd, ZeRO 3 18 Psi / Nd -- and the step needs no separate fp32 master gradient
(`step_transient_bytes`), the reduced fp32 shard being it.

A ZeRO 3 runtime that skips the reduce-scatter on all but the last micro-batch (FSDP2 without gradient sync:
`Workload.unsharded_grad_accumulation`, `grads_unsharded`) holds the whole unsharded gradient instead: 4 Psi with
fp32 reduction (FSDP2 upcasts to accumulate), 2 Psi without, not / Nd (round 24,
docs/planner/round24-kempner-memory.md).

Offload (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity, Rajbhandari et al. 2021) moves the K Psi / Nd optimizer
bytes to the host, and with parameter offload (ZeRO 3) the 2 Psi / Nd parameters too.

Activations (Korthikanti et al. 2022, Table 2; hybrid/planner/model.py generalises it to GQA and SwiGLU):
bytes per layer per micro-batch, GPT shapes,

    no parallelism            sbh (34 + 5as/h)
    tensor parallel           sbh (10 + 24/t + 5as/(ht))
    tensor + sequence par.    sbh (34/t + 5as/(ht))
    selective recomputation   drops the 5as/(ht) term
    full recomputation        2sbh (the layer input; 2sbh/t under SP), plus, while one layer is
                              recomputed, its full set less the input it shares (the last rank: after
                              one micro-batch's head set is freed)

(the Korthikanti profile; BF16_FLASH swaps the 5as/(ht) term for flash attention's logsumexp, FP32_FLASH
counts what this runtime saves instead, model.py),
times the activation sets in flight on the rank, from the schedule simulation (hybrid/planner/schedule.py),
plus the embedding dropout mask on rank 0 and the LM-head input and logits on the last rank
(model.Shard.head_activation_bytes) for the micro-batches their chunks hold.

Buffers: ZeRO 3 gathers the parameters of the unit being computed and prefetches the next: 2 x 2 bytes x the
largest unit (a layer, the embedding, the head). Workspace: a fixed WORKSPACE_BYTES (CUDA context, cuBLAS and
NCCL workspaces, DP gradient buckets, pipeline receive buffers) plus FRAGMENTATION of everything else for
the caching allocator's fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from hybrid.planner.hardware import GB, Hardware
from hybrid.planner.layout import (Cluster, Layout, Offload, Recompute, Workload, ZeroStage, rank_stages,
                                   stage_layers)
from hybrid.planner.model import Precision, Shard
from hybrid.pipeline import Placement, ScheduleKind
from hybrid.planner.schedule import InFlight, in_flight, kept_gradient_bytes, peak_held

ADAM_K = 12  # bytes of optimizer state per parameter: fp32 master, momentum, variance
PARAM_BYTES = 2  # fp16 / bf16 parameters (Precision.MIXED)
GRAD_BYTES = 2  # fp16 / bf16 gradients (Precision.MIXED)
WORKSPACE_BYTES = 2.0 * GB  # CUDA context ~0.5 GB, cuBLAS + NCCL workspaces and buckets ~1 GB, headroom
FRAGMENTATION = 0.05  # caching-allocator fragmentation, as a share of the tensors' bytes
MIB = 2**20  # a host's unit: train.py's peak RSS, the plan table's "RSS MiB" on CPU hardware


def model_state_bytes(psi: float, zero: ZeroStage, dp: int, k: int = ADAM_K) -> float:
    """Bytes per device of parameters + gradients + optimizer states (ZeRO paper, Table 1 formulas)."""
    zero = ZeroStage(zero)
    if zero is ZeroStage.NONE:
        return (2 + 2 + k) * psi
    if zero is ZeroStage.OPTIMIZER:
        return 4 * psi + k * psi / dp
    if zero is ZeroStage.GRADIENTS:
        return 2 * psi + (2 + k) * psi / dp
    return (2 + 2 + k) * psi / dp


@dataclass(frozen=True)
class ModelStates:
    """Model-state bytes of one device, and what it keeps in host memory.

    Attributes:
        params: fp16 parameters on the device.
        grads: fp16 gradients on the device.
        optimizer: fp32 master weights and Adam moments on the device.
        host: bytes offloaded to host memory.
    """

    params: float
    grads: float
    optimizer: float
    host: float

    @property
    def device(self) -> float:
        return self.params + self.grads + self.optimizer


def needs_of(demand: float, hw: Hardware) -> str:
    """An OOM reason's figures, 'needs 93.1 GB of 85.9': a rank's device demand (WORKSPACE_BYTES in it) and what
    it may fill (hw.capacity_bytes), in GB = 1e9 bytes; on CPU hardware in MiB = 2^20 bytes, the plan table's unit
    there, naming the reserve (the table's RSS column leaves it out). A need that would print as the capacity or
    below ('85.9 GB of 85.9' for 85.94) shows its excess."""
    if hw.on_host:
        need, cap = demand / MIB, hw.capacity_bytes / MIB
        digits = next((d for d in range(3) if round(need, d) > round(cap, d)), 3)  # both to as many places
        return (f"needs {need:,.{digits}f} MiB of {cap:,.{digits}f} (with the planner's {WORKSPACE_BYTES / MIB:,.0f} "
                f"MiB workspace reserve)")
    capacity = hw.capacity_bytes / GB
    need = f"{demand / GB:.1f}"
    if float(need) <= round(capacity, 1):
        need = f"{demand / GB:.3f}"
    return f"needs {need} GB of {capacity:.4g}"


def demand_text(demand: float, hw: Hardware) -> str:
    """A rank's device demand as needs_of writes it, '2.0 GB' or on CPU hardware '1,918 MiB' (the schedule notes
    beside an OOM reason: one unit in a line)."""
    return f"{demand / MIB:,.0f} MiB" if hw.on_host else f"{demand / GB:.1f} GB"


def step_transient_bytes(psi: float, zero: ZeroStage, dp: int, offload: Offload = Offload.NONE,
                         precision: Precision = Precision.MIXED, fp32_grads: bool = False) -> float:
    """The fp32 master gradient of this rank's shard, made in the optimizer step (hybrid/zero/engine.py
    `_make_master_grads`) from the bf16 / fp16 gradient the runtime accumulates and reduces: 4 Psi / Nd bytes
    (Nd = 1 at ZeRO 0) on the device, while the activations are already freed. By default hybrid keeps
    2 + 2 + 12 bytes a parameter; with fp32 gradients (Megatron's main grads, 18 without ZeRO) they are in
    model_states instead. None in fp32 or with fp32 gradients (the reduced gradient is the master gradient) or
    with the optimizer offloaded (the copy is made on the host)."""
    if precision is not Precision.MIXED or fp32_grads or offload is not Offload.NONE:
        return 0.0
    return 4.0 * psi / (dp if ZeroStage(zero) >= ZeroStage.OPTIMIZER else 1)


def model_states(psi: float, zero: ZeroStage, dp: int, offload: Offload = Offload.NONE,
                 precision: Precision = Precision.MIXED, fp32_grads: bool = False,
                 optimizer_bytes: int | None = None, unsharded_grads: bool = False) -> ModelStates:
    """Split of `model_state_bytes` into parameters, gradients and optimizer, with offload applied.
    Precision.FP32 (this runtime on CPU): 4 + 4 + 8 bytes per parameter instead of 2 + 2 + 12; `fp32_grads`
    (mixed precision with fp32 main grads): 2 + 4 + 12; `optimizer_bytes` overrides the precision's K
    (Workload.optimizer_bytes: 6 with bf16 optimizer states); `unsharded_grads` (grads_unsharded): the
    gradients are the whole Psi's at any ZeRO stage."""
    zero = ZeroStage(zero)
    params = precision.param_bytes * psi / (dp if zero >= ZeroStage.PARAMETERS else 1)
    sharded = zero >= ZeroStage.GRADIENTS and not unsharded_grads
    grads = (4 if fp32_grads else precision.grad_bytes) * psi / (dp if sharded else 1)
    k = precision.optimizer_bytes if optimizer_bytes is None else optimizer_bytes
    optimizer = k * psi / (dp if zero >= ZeroStage.OPTIMIZER else 1)
    host = 0.0
    if offload in (Offload.OPTIMIZER, Offload.OPTIMIZER_AND_PARAMS):
        host, optimizer = optimizer, 0.0
    if offload is Offload.OPTIMIZER_AND_PARAMS:
        host, params = host + params, 0.0
    return ModelStates(params=params, grads=grads, optimizer=optimizer, host=host)


def grads_unsharded(work: Workload, layout: Layout) -> bool:
    """Workload.unsharded_grad_accumulation in force: ZeRO 3 over dp > 1 with more than one micro-batch a
    step, where the runtime accumulates each rank's whole unsharded gradient (FSDP2 without gradient sync,
    in the reduce dtype) through every micro-batch's backward but the last, and no sharded gradient exists
    meanwhile: grads 4 Psi (fp32_grads, else 2 Psi) where ZeRO 3 plans 4 Psi / Nd. The backward's peak holds
    them; the optimizer step's sharded gradients are fewer, so the step's peak is no higher."""
    return (work.unsharded_grad_accumulation and layout.zero is ZeroStage.PARAMETERS and layout.dp > 1
            and work.num_microbatches(layout) > 1)


def _states_unit(work: Workload, layout: Layout) -> ModelStates:
    """The model states of one parameter of a rank of `layout` (states are linear in Psi)."""
    return model_states(1.0, layout.zero, layout.dp_shard, layout.offload, work.precision, work.fp32_grads,
                        work.optimizer_bytes, grads_unsharded(work, layout))


@dataclass(frozen=True)
class RankMemory:
    """Device memory of one pipeline rank (every TP and DP rank of a stage holds the same).

    Attributes:
        rank: pipeline rank.
        parameters: parameter count Psi of this rank (its TP share of its stages).
        states: model states (params, grads, optimizer) and the host bytes.
        activations: bytes of activations held at the peak (in-flight sets x per-set bytes, embedding and
            logits included, plus the recomputation working set).
        buffers: ZeRO 3 gathered-parameter buffers.
        workspace: fixed workspace plus fragmentation.
        step_transient: bytes the optimizer step adds while no activation is held (`step_transient_bytes`).
        backward_transient: bytes the last rank's first backward adds to its activations for a moment, beyond
            what the recomputation working set already adds: the loss's gradients over the logits
            (`Shard.head_backward_transient_bytes`; 0 on other ranks).
    """

    rank: int
    parameters: float
    states: ModelStates
    activations: float
    buffers: float
    workspace: float
    step_transient: float = 0.0
    backward_transient: float = 0.0

    @property
    def total(self) -> float:
        """Device bytes at the peak: the backward's (activations, gathered buffers, the loss's gradient) or the
        optimizer step's."""
        backward = self.activations + self.buffers + self.backward_transient
        return self.states.device + max(backward, self.step_transient) + self.workspace


@dataclass(frozen=True)
class MemoryPlan:
    """Memory of every pipeline rank of a layout.

    Attributes:
        ranks: one RankMemory per pipeline rank.
        in_flight: the activation sets in flight, from the schedule simulation.
        host_per_node: offloaded bytes one node's host memory must hold.
    """

    ranks: tuple[RankMemory, ...]
    in_flight: InFlight
    host_per_node: float

    @property
    def peak(self) -> RankMemory:
        """The pipeline rank that needs the most device memory."""
        return max(self.ranks, key=lambda r: r.total)


def rank_parameters(work: Workload, layout: Layout) -> tuple[float, ...]:
    """Psi of each pipeline rank: its layers' TP shares, plus the embedding (rank 0) and head (the last stage's
    rank: pp - 1, or rank 0 under ZBV's V, whose two chunks each hold a copy of a tied table)."""
    return _rank_parameters(work, layout.tp, layout.pp, layout.v, layout.schedule.placement)


@lru_cache(maxsize=4096)
def _rank_parameters(work: Workload, tp: int, pp: int, v: int, placement: Placement) -> tuple[float, ...]:
    shard = work.shard(tp)
    layers = stage_layers(work.model, pp, v, work.seq_length, work.pipeline_split)
    head_rank = placement.rank_chunk(pp * v - 1, pp)[0]
    out = []
    for r, stages in enumerate(rank_stages(pp, v, placement)):
        n = sum(layers[s] for s in stages) * shard.layer_params()
        if r == 0:
            n += shard.embedding_params()
        if r == head_rank:
            n += shard.head_params(shares_embedding=pp == 1)  # ZBV: two modules on rank 0, two tied copies
        out.append(float(n))
    return tuple(out)


def layer_activation_bytes(shard: Shard, b: int, s: int, sp: bool, recompute: Recompute) -> tuple[float, float]:
    """(bytes one layer keeps per micro-batch in flight, bytes its recomputation adds on top at the peak).

    Full: the layer input stays (Korthikanti et al.: 2sbh); the rerun forward re-saves the layer's whole set,
    of which the input is already held (the first norm saves that very tensor), so it adds set - input.
    Selective: the attention core re-saves its own tensors during its backward, after the same layer's MLP
    backward has freed the MLP intermediates: it adds only what exceeds them (nothing for flash attention,
    whose core is a logsumexp; the materialised softmax of the Korthikanti profile can exceed them).
    Selective-op (torchtitan's SAC): the layer input, every other matmul's output and the attention output stay
    (Shard.selective_op_kept_bytes); the backward reruns the rest of the layer, which exists again while that
    layer's backward runs, as under full recomputation."""
    replicated, split, core = shard.layer_activation_terms(b, s, sp)
    if recompute is Recompute.NONE:
        return replicated + split + core, 0.0
    if recompute is Recompute.SELECTIVE:
        return replicated + split, max(0.0, core - shard.mlp_activation_bytes(b, s))
    if recompute is Recompute.SELECTIVE_OP:  # the outputs the policy stores; the rest is rerun one layer at a time
        kept = shard.selective_op_kept_bytes(b, s, sp)
        return kept, max(0.0, replicated + split + core - kept) + shard.selective_op_extra_bytes(b, s, sp)
    kept = shard.layer_input_bytes(b, s, sp)
    return kept, replicated + split + core - kept


def plan_memory(work: Workload, cluster: Cluster, layout: Layout, schedule: ScheduleKind | None = None) -> MemoryPlan:
    """Per-pipeline-rank device memory of `layout` (assumed valid: see layout.check_layout). `schedule`
    overrides the layout's (1F1B, or interleaved when v > 1), e.g. GPipe to compare with a runtime run."""
    flight, psis, acts, bufs, extra = _rank_parts(work, layout, schedule)
    ranks = tuple(_rank_memory(work, layout, r, psi, act, buf, more)
                  for r, (psi, act, buf, more) in enumerate(zip(psis, acts, bufs, extra)))
    unit = _states_unit(work, layout)
    return MemoryPlan(ranks=ranks, in_flight=flight, host_per_node=_host_per_node(cluster, unit, max(psis)))


def peak_memory(work: Workload, cluster: Cluster, layout: Layout) -> tuple[int, float, float]:
    """(fullest pipeline rank, its device bytes, host bytes per node) without building every RankMemory:
    the search's fast path. Equal to plan_memory's peak (states are linear in Psi)."""
    _, psis, acts, bufs, extra = _rank_parts(work, layout)
    unit = _states_unit(work, layout)
    step = step_transient_bytes(1.0, layout.zero, layout.dp_shard, layout.offload, work.precision, work.fp32_grads)
    device = unit.device  # (a property: read once, not twice a rank)
    totals = [psi * device + max(act + buf + more, step * psi) + FRAGMENTATION * (psi * device + act + buf)
              + WORKSPACE_BYTES for psi, act, buf, more in zip(psis, acts, bufs, extra)]
    rank = max(range(len(totals)), key=totals.__getitem__)
    return rank, totals[rank], _host_per_node(cluster, unit, max(psis))


def _host_per_node(cluster: Cluster, unit: ModelStates, psi: float) -> float:
    """Offloaded bytes one host holds: the fullest rank's (`unit` = states of one parameter) x its GPUs."""
    return unit.host * psi * min(cluster.hw.gpus_per_node, cluster.gpus)


def _rank_parts(work: Workload, layout: Layout, schedule: ScheduleKind | None = None):
    """In-flight peaks, and per pipeline rank: Psi, activation bytes, ZeRO-3 buffer bytes, backward transient."""
    flight, acts, extra = _activations(work, layout.tp, layout.pp, layout.dp, layout.v, layout.micro_batch,
                                       layout.sequence_parallel, layout.recompute, schedule or layout.schedule)
    bufs = _zero3_buffers(work, layout) if layout.zero is ZeroStage.PARAMETERS else (0.0,) * layout.pp
    if work.fp8:
        bufs = tuple(b + f for b, f in zip(bufs, _fp8_buffers(work, layout)))
    return flight, rank_parameters(work, layout), acts, bufs, extra


FP8_AMAX_HISTORY = 1024  # Transformer Engine's default amax history, fp32, per scaled tensor


def _fp8_buffers(work: Workload, layout: Layout) -> tuple[float, ...]:
    """--fp8: the FP8 casts of a layer's linear weights and their transposes (1 + 1 bytes a weight), made as the
    layer runs (torchao float8's dynamic scaling, Megatron's FP8 parameters: no persistent second copy) -- the
    layer computing and the next one, as ZeRO 3 buffers -- and three scaled tensors' amax histories and scales
    per linear (input, weight, output gradient)."""
    shard = work.shard(layout.tp)
    layers = stage_layers(work.model, layout.pp, layout.v, work.seq_length, work.pipeline_split)
    linears = 4 + shard.mlp_matrices
    out = []
    for stages in rank_stages(layout.pp, layout.v, layout.schedule.placement):
        n = sum(layers[s] for s in stages)
        weights = shard.layer_matmul_params() * min(2, n)
        out.append(2.0 * weights + n * linears * 3 * 4 * (FP8_AMAX_HISTORY + 1))
    return tuple(out)


@lru_cache(maxsize=4096)
def _activations(work: Workload, tp: int, pp: int, dp: int, v: int, b: int, sp: bool,
                 recompute: Recompute, kind: ScheduleKind
                 ) -> tuple[InFlight, tuple[float, ...], tuple[float, ...]]:
    """Peak activation bytes of each pipeline rank (shared by every ZeRO / offload variant), and what the last
    rank's first backward adds for a moment beyond them (the loss's gradients over the logits)."""
    m = work.global_batch // (dp * b)
    flight = in_flight(kind, pp, m, v)
    if kind is ScheduleKind.ZBV:
        return (flight, *_zbv_activations(work, tp, pp, m, b, sp, recompute))
    shard = work.shard(tp)
    layers = stage_layers(work.model, pp, v, work.seq_length, work.pipeline_split)
    s = work.seq_length
    per_layer, working = layer_activation_bytes(shard, b, s, sp, recompute)
    acts = []
    for r in range(pp):
        chunk_layers = max(layers[c * pp + r] for c in range(v))
        per_chunk = chunk_layers * per_layer + (shard.chunk_activation_bytes(b, s) if chunk_layers else 0.0)
        acts.append(flight.chunks[r] * per_chunk + (working if chunk_layers else 0.0))
    acts[0] += flight.first_chunk * shard.embedding_activation_bytes(b, s, sp)
    head = shard.head_activation_bytes(b, s, sp)
    # the last rank's first backward runs the head's (its loss gradients over the logits exist for a moment on top
    # of everything held; then one micro-batch's head set is freed) before any layer of that micro-batch is
    # recomputed: the peak is end-of-forward plus the larger of the two
    rerun = working if layers[-1] else 0.0
    acts[-1] += flight.last_chunk * head - min(head, rerun)
    for r in range(1, pp) if kind.splits_backward else ():  # zero bubble: what B keeps for W (stage 0 keeps none)
        acts[r] += flight.weight_pending[r] * kept_gradient_bytes(shard, b, s, sp, layers[r], r == pp - 1)
    extra = [0.0] * pp
    extra[-1] = max(0.0, shard.head_backward_transient_bytes(b, s) - max(0.0, rerun - head))
    return flight, tuple(acts), tuple(extra)


def _zbv_activations(work: Workload, tp: int, pp: int, m: int, b: int, sp: bool, recompute: Recompute
                     ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """ZBV's activation bytes per rank and the head rank's backward transient. Its two chunks differ (rank 0's
    chunk 0 is the first stage, with the embedding and no kept gradients; its chunk 1 the last, with the LM
    head), so the peak is the running maximum of the paper's accounting over the rank's compute order (Qi et
    al. 2024, Table 1; tests/test_pipeline_memory.py measures the runtime against it): F adds the chunk's set
    A_c, B adds the output gradients it keeps for W (K_c, `kept_gradient_bytes`; none on the first stage, whose
    B defers everything), W frees A_c + K_c. The recomputation and head terms are 1F1B's, on the head's rank."""
    shard, s = work.shard(tp), work.seq_length
    layers = stage_layers(work.model, pp, 2, s)
    per_layer, working = layer_activation_bytes(shard, b, s, sp, recompute)
    head, last = shard.head_activation_bytes(b, s, sp), 2 * pp - 1
    acts = []
    for r, stages in enumerate(rank_stages(pp, 2, Placement.V)):
        held = [layers[st] * per_layer + (shard.chunk_activation_bytes(b, s) if layers[st] else 0.0)
                + (shard.embedding_activation_bytes(b, s, sp) if st == 0 else 0.0) + (head if st == last else 0.0)
                for st in stages]
        kept = [0.0 if st == 0 else kept_gradient_bytes(shard, b, s, sp, layers[st], st == last) for st in stages]
        acts.append(peak_held(ScheduleKind.ZBV, pp, m, 2, r, tuple(held), tuple(kept))
                    + (working if any(layers[st] for st in stages) else 0.0))
    rerun = working if layers[last] else 0.0
    acts[0] -= min(head, rerun)  # rank 0 holds the last stage: its first B runs the head's before any rerun
    extra = [0.0] * pp
    extra[0] = max(0.0, shard.head_backward_transient_bytes(b, s) - max(0.0, rerun - head))
    return tuple(acts), tuple(extra)


def _zero3_buffers(work: Workload, layout: Layout) -> tuple[float, ...]:
    """ZeRO 3 gathers the unit being computed and prefetches the next: 2 x 2 bytes x the largest unit."""
    shard = work.shard(layout.tp)
    units = [shard.layer_params()] * layout.pp
    head_rank = layout.stage_rank(layout.pp * layout.v - 1)
    units[0] = max(units[0], shard.embedding_params())
    units[head_rank] = max(units[head_rank], shard.head_params(layout.pp == 1))
    return tuple(2.0 * work.precision.param_bytes * u for u in units)


def _rank_memory(work: Workload, layout: Layout, r: int, psi: float, activations: float,
                 buffers: float, backward_transient: float) -> RankMemory:
    states = model_states(psi, layout.zero, layout.dp_shard, layout.offload, work.precision, work.fp32_grads,
                          work.optimizer_bytes, grads_unsharded(work, layout))  # HSDP: over a shard group
    workspace = WORKSPACE_BYTES + FRAGMENTATION * (states.device + activations + buffers)
    return RankMemory(rank=r, parameters=psi, states=states, activations=activations, buffers=buffers,
                      workspace=workspace, step_transient=step_transient_bytes(psi, layout.zero, layout.dp_shard,
                                                                               layout.offload, work.precision,
                                                                               work.fp32_grads),
                      backward_transient=backward_transient)
