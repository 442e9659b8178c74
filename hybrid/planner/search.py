"""Search the layouts of a model on a cluster and rank them by predicted throughput.

    from hybrid.planner import Cluster, SearchSpace, Workload, hardware, search
    result = search(Workload(load_config("llama-3-8b"), global_batch=512, seq_length=4096),
                    Cluster(gpus=64, hw=hardware("h100-80g")), top=5)
    result.plans[0].layout, result.plans[0].tokens_per_s, result.rejected[:3]

Enumeration: tp over the divisors of the GPU count (must divide the heads and the MLP width, be compatible with
the kv-heads, stay inside a node unless allowed), pp over the divisors of GPUs / tp (at most the layers; uneven
splits balanced by hybrid.partition), v (chunks per rank) with pp v dividing the layers, dp = GPUs / (tp pp),
micro-batch sizes dividing the per-replica batch, ZeRO 0-3, offload, recomputation, sequence parallelism.

Dominance. For fixed sizes, more recomputation and more offload never make a step faster and always need
less memory, so of those variants only the fitting ones not dominated by another fitting one (less
recomputation and less offload) are timed; the rest are counted as `dominated`.

Ranking. Each timed candidate needs a pipeline simulation; candidates are taken in order of a lower bound on
their step time (time.lower_bound_seconds: no bubble) and the search stops once the bound exceeds the K-th best
simulated time, which is then exact for the top K. Everything rejected keeps its reason (`Rejection`).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field, replace

from hybrid.planner import moe
from hybrid.planner.hardware import GB
from hybrid.planner.moe import ExpertPlan
from hybrid.planner.layout import (Cluster, Layout, Offload, Recompute, Workload, ZeroStage, layout_problems,
                                   pp_problems, recompute_at_most, tp_problems)
from hybrid.planner.predicted_memory import (MIB, MemoryPlan, ModelStates, RankMemory, demand_text, needs_of,
                                            peak_memory, plan_memory)
from hybrid.planner.schedule import SIM_BUDGET, SimulationTooLarge
from hybrid.planner.time import FlopsFormula, StepTime, lower_bound_seconds, model_flops, step_flops, step_time

MAX_MICRO_BATCH = 16  # largest micro-batch tried unless pinned
MAX_V = 4  # most chunks per pipeline rank tried unless pinned


@dataclass(frozen=True)
class SearchSpace:
    """Which values each dimension may take; None = search it (the CLI pins with the train.py flags).

    Attributes:
        tp, pp, v, micro_batch: sizes to try.
        zero, offload, recompute, sequence_parallel: switches to try.
        layers_per_chunk: layers per virtual pipeline stage (`--num-layers-per-virtual-pipeline-stage`): pins
            v = layers / (pp x this) for each pp; overrides `v`.
        max_micro_batch: largest micro-batch tried when `micro_batch` is None.
        max_v: most chunks per rank tried when `v` is None.
        zero_bubble: whether to try the zero-bubble schedules, ZB-H1 and ZBV (`--pipeline-schedule zbh1 / zbv`),
            beside each 1F1B layout the search times (v = 1, pp >= 2, no full or selective-op recomputation;
            ZBV where the space also allows v = 2: v unpinned or listing 2, 2 pp <= layers, max_v >= 2); None
            or (True,): try them.
        expert_parallel: an MoE model's EP sizes to try (`--expert-model-parallel-size`; hybrid/planner/moe.py);
            None: every size the layout allows.
        expert_tensor_parallel: an MoE model's expert-TP sizes to try (`--expert-tensor-parallel-size`); None: every
            size the layout allows.
        moe_imbalance: an MoE model's load imbalance lambda, max / mean tokens per expert (`--moe-imbalance`).
        dp_replicate: HSDP's replica counts to try at ZeRO 3 (Layout.dp_replicate, `--data-parallel-replicate-
            degree`); None: 1 (ZeRO 3 over all the DP ranks), and where the ZeRO stage is searched (`zero` None
            or more than one stage) also the replicas of a node-sized shard group (`hsdp_replicas`). A pinned
            `--zero-stage 3` alone is FSDP's full sharding (the published FSDP rows pin it so).
    """

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    v: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    zero: tuple[ZeroStage, ...] | None = None
    offload: tuple[Offload, ...] | None = None
    recompute: tuple[Recompute, ...] | None = None
    sequence_parallel: tuple[bool, ...] | None = None
    layers_per_chunk: int | None = None
    max_micro_batch: int = MAX_MICRO_BATCH
    max_v: int = MAX_V
    zero_bubble: tuple[bool, ...] | None = None
    expert_parallel: tuple[int, ...] | None = None
    expert_tensor_parallel: tuple[int, ...] | None = None
    moe_imbalance: float = moe.IMBALANCE
    dp_replicate: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Rejection:
    """A layout (or a family of them, e.g. 'tp 3') that cannot run, and why."""

    what: str
    reason: str

    def __str__(self) -> str:
        return f"{self.what}: {self.reason}"


@dataclass(frozen=True)
class Plan:
    """A layout with its predicted memory and time.

    Attributes:
        layout: the sizes and switches.
        memory: per-pipeline-rank memory.
        time: the step time and its parts.
        tokens_per_s: global batch x sequence / step time.
        tflops_per_gpu: hardware FLOPs (recomputation included, by `flops_formula`) per GPU per second / 1e12.
        mfu: model FLOPs (no recomputation) per GPU per second / peak.
        flops_formula: how `tflops_per_gpu` counts FLOPs.
        experts: an MoE model's expert layers at their chosen EP size (hybrid/planner/moe.py; None for a dense
            model): their seconds are in tokens_per_s, their memory in memory_gb.
    """

    layout: Layout
    memory: MemoryPlan
    time: StepTime
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    flops_formula: FlopsFormula
    experts: ExpertPlan | None = None

    @property
    def seconds(self) -> float:
        """The step: the time model's, plus an MoE model's expert compute and all-to-all (`experts`)."""
        return self.time.total + (self.experts.seconds if self.experts else 0.0)

    @property
    def memory_gb(self) -> float:
        """Device memory of the fullest pipeline rank, GB (an MoE model's experts included)."""
        return (self.memory.peak.total + (self.experts.extra_bytes if self.experts else 0.0)) / GB

    def short(self) -> str:
        """The layout and an MoE model's chosen EP (and expert-TP): 'tp1 pp2 dp4 v2 b1 z0 none zbv ep1', as the
        plan tables (cli's, context's), --explain's first line and --plot's bars name it; a dense model's layout
        alone."""
        return self.layout.short() + moe.layout_suffix(self.experts)

    @property
    def fullest_rank(self) -> RankMemory:
        """The fullest pipeline rank's memory part by part, an MoE model's experts' states in its parameters,
        gradients and optimizer states (ExpertPlan.extra_states): the bytes of memory_gb, for --plot's bars
        (round 22: they left the experts out). Their workspace is the dense plan's, as memory_gb's."""
        peak = self.memory.peak
        if self.experts is None:
            return peak
        s, e = peak.states, self.experts.extra_states
        return replace(peak, states=ModelStates(s.params + e.params, s.grads + e.grads,
                                                s.optimizer + e.optimizer, s.host + e.host))

    @property
    def bubble_fraction(self) -> float:
        return self.time.bubble_fraction


@dataclass
class SearchResult:
    """What `search` found.

    Attributes:
        plans: the best layouts, fastest first (at most K).
        rejected: every layout or family that cannot run, with its reason.
        considered: complete layouts enumerated.
        dominated: fitting layouts skipped because a variant with less recomputation / offload also fits.
        timed: layouts whose step was simulated.
        notes: layout (short) -> why its schedule was chosen over the 1F1B twin (zero-bubble plans), or, for a
            1F1B layout whose zero-bubble twins were tried and not kept, why not.
    """

    plans: list[Plan] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    considered: int = 0
    dominated: int = 0
    timed: int = 0
    notes: dict[str, str] = field(default_factory=dict)


def summarize_rejections(rejected: list[Rejection], limit: int = 8) -> list[tuple[int, Rejection]]:
    """Group rejections whose reasons differ only in numbers; per group (count, an example), biggest groups
    first. The OOM example is the layout that came closest to fitting."""
    groups: dict[str, list[Rejection]] = {}
    for r in rejected:
        groups.setdefault(re.sub(r"\d+(\.\d+)?(e[+-]?\d+)?", "#", r.reason), []).append(r)
    out = []
    for members in groups.values():
        example = min(members, key=_needed_gb) if members[0].reason.startswith("OOM") else members[0]
        out.append((len(members), example))
    out.sort(key=lambda item: -item[0])
    return out[:limit]


def _needed_gb(r: Rejection) -> float:
    """The need an OOM reason names (needs_of: GB, or MiB with thousands' commas on CPU hardware; one unit in a
    search), inf for another reason."""
    match = re.search(r"needs ([\d,.]+) (GB|MiB)", r.reason)
    return float(match.group(1).replace(",", "")) if match else float("inf")


def evaluate(work: Workload, cluster: Cluster, layout: Layout, formula: FlopsFormula = FlopsFormula.EXACT,
             budget: float = SIM_BUDGET, space: SearchSpace = SearchSpace()) -> Plan:
    """Predict memory and time of one layout. ValueError naming every problem when it cannot run at all
    (memory is reported, not enforced: compare `plan.memory_gb` with the device)."""
    problems = layout_problems(work, cluster, layout) + moe.layout_problems(work, layout, space.expert_parallel,
                                                                                space.expert_tensor_parallel)
    if problems:
        raise ValueError(f"layout {layout.short()} cannot run: " + "; ".join(problems))
    memory = plan_memory(work, cluster, layout)
    return _plan(work, cluster, layout, memory, step_time(work, cluster, layout, budget), formula, space)


def _plan(work: Workload, cluster: Cluster, layout: Layout, memory: MemoryPlan, time: StepTime,
          formula: FlopsFormula, space: SearchSpace) -> Plan:
    experts = (moe.choose(work, cluster, layout, memory.peak.total, space.moe_imbalance, space.expert_parallel,
                          space.expert_tensor_parallel)
               if work.model.num_experts else None)  # MoE: the EP size
    n, t = cluster.gpus, time.total + (experts.seconds if experts else 0.0)
    return Plan(layout=layout, memory=memory, time=time, experts=experts,
                tokens_per_s=work.global_batch * work.seq_length / t,
                tflops_per_gpu=step_flops(work, layout, formula) / (n * t) / 1e12,
                mfu=model_flops(work) / (n * t) / (cluster.hw.peak_tflops * 1e12),
                flops_formula=formula)


def memory_problem(cluster: Cluster, rank: int, device_bytes: float, host_bytes: float) -> str | None:
    """'OOM on stage 0: needs 93.1 GB of 85.9' (or the host-memory equivalent), None when it fits. The device
    holds hw.capacity_bytes (an 80 GB card: 85.9e9 bytes); CPU hardware's figures are MiB (needs_of)."""
    hw = cluster.hw
    if device_bytes > hw.capacity_bytes:
        return f"OOM on stage {rank}: {needs_of(device_bytes, hw)}"  # MiB on CPU hardware
    if host_bytes > hw.host_memory_gb * GB:
        return f"host OOM: offload needs {host_bytes / GB:.0f} GB per node of {hw.host_memory_gb:g}"
    return None


def search(work: Workload, cluster: Cluster, space: SearchSpace = SearchSpace(), top: int = 5,
           formula: FlopsFormula = FlopsFormula.EXACT, budget: float = SIM_BUDGET) -> SearchResult:
    """The `top` fastest layouts that fit, and the reasons for the rest."""
    if top < 1:
        raise ValueError(f"--top must be >= 1, got {top}")
    result = SearchResult()
    fitting: list[tuple[float, Layout]] = []
    for base in _sizes(work, cluster, space, result.rejected):
        fitting += _fitting_variants(work, cluster, space, base, result)
    fitting.sort(key=lambda item: item[0])
    for bound, layout in fitting:
        if len(result.plans) >= top and bound > result.plans[top - 1].seconds:
            break
        try:
            time = step_time(work, cluster, layout, budget)
        except SimulationTooLarge as e:
            result.rejected.append(Rejection(layout.short(), str(e)))
            continue
        result.timed += 1
        plan = _plan(work, cluster, layout, plan_memory(work, cluster, layout), time, formula, space)
        if work.model.num_experts and plan.experts is None:  # MoE: no EP size fits the experts beside it
            result.rejected.append(Rejection(layout.short(), moe.memory_problem(
                work, cluster, layout, plan.memory.peak.total, space.moe_imbalance, space.expert_parallel,
                space.expert_tensor_parallel)))
            continue
        result.plans.append(plan)
        result.plans += [p for p in _zero_bubble_twin(work, cluster, space, plan, formula, budget, result.notes)
                         if p.experts is not None or not work.model.num_experts]
        result.plans.sort(key=lambda p: p.seconds)
        del result.plans[top:]
    return result


def _zero_bubble_twin(work: Workload, cluster: Cluster, space: SearchSpace, plan: Plan, formula: FlopsFormula,
                      budget: float, notes: dict[str, str]) -> list[Plan]:
    """The zero-bubble twins of a timed 1F1B layout (ZB-H1: v = 1; ZBV: v = 2 in a V) that fit and are faster:
    their plans, each with the reason in `notes`; a twin tried and not kept leaves the reason under the 1F1B
    layout's key. ZB-H1 moves the (p - 1)-stage start-up bubble into deferred weight passes, every rank then
    holding pp micro-batches (F to W) plus the output gradients its B's keep for the W's; ZBV's V also turns the
    pipeline at rank pp - 1 in memory and brings the gradient back to rank 0 as the forwards go on, removing most
    of what is left, at 2 pp chunk sets in flight on every rank (as many bytes as 1F1B's rank 0: half-size chunks)
    with the embedding and the LM head both on rank 0 (hybrid/planner/schedule.py, predicted_memory.py)."""
    lay = plan.layout
    if not _zero_bubble_applies(space, lay):
        return []
    out, kept_1f1b = [], []
    twins = [replace(lay, zero_bubble=True)]
    if 2 in _chunk_counts(work.model.num_layers, lay.pp, space):  # ZBV's two chunks a rank: allowed by the space
        twins.append(replace(lay, zero_bubble=True, v=2))
    for zb in twins:
        name = zb.schedule.value
        rank, need, host = peak_memory(work, cluster, zb)
        problem = memory_problem(cluster, rank, need, host)
        if problem is not None:
            kept_1f1b.append(f"{name} does not fit ({problem}; 1f1b {demand_text(plan.memory_gb * GB, cluster.hw)})")
            continue
        try:
            time = step_time(work, cluster, zb, budget)
        except SimulationTooLarge:
            kept_1f1b.append(f"{name} is beyond the simulation budget")
            continue
        if time.total >= plan.time.total:
            kept_1f1b.append(f"{name} is not faster (step {time.total:.4g} vs {plan.time.total:.4g} s, bubble "
                             f"{100 * time.bubble_fraction:.1f}% vs {100 * plan.bubble_fraction:.1f}%)")
            continue
        twin = _plan(work, cluster, zb, plan_memory(work, cluster, zb), time, formula, space)
        if work.model.num_experts and twin.experts is None:  # its experts fit at no EP size (round 21: kept silent)
            problem = moe.memory_problem(work, cluster, zb, twin.memory.peak.total, space.moe_imbalance,
                                         space.expert_parallel, space.expert_tensor_parallel)
            kept_1f1b.append(f"{name} does not fit ({problem})")
            continue
        notes[zb.short()] = (f"{name} over 1f1b on this layout: bubble {100 * time.bubble_fraction:.1f}% vs "
                             f"{100 * plan.bubble_fraction:.1f}%, step {time.total:.4g} vs {plan.time.total:.4g} s, "
                             f"fullest stage {_versus(twin, plan, cluster.hw)} (" + _WHY[name] + ")")
        out.append(twin)
    if kept_1f1b:
        notes[lay.short()] = "1f1b on this layout: " + "; ".join(kept_1f1b)
    return out


def _versus(twin: Plan, plan: Plan, hw) -> str:
    """The two plans' fullest ranks, an MoE model's experts in both (round 21 compared the twin's dense plan with
    the 1F1B plan's experts included): '2.1 vs 2.0 GB' of the device, or on CPU hardware the MiB of tensors the
    table's RSS counts ('8.1 vs 10.2 MiB of tensors': that column less this process, no GPU reserve)."""
    if not hw.on_host:
        return f"{twin.memory_gb:.1f} vs {plan.memory_gb:.1f} GB"
    a, b = ((p.memory_gb * GB - p.memory.peak.workspace) / MIB for p in (twin, plan))
    return f"{a:,.1f} vs {b:,.1f} MiB of tensors"


_WHY = {"zbh1": "every stage holds pp micro-batches until their W, and the gradients kept for it",
        "zbv": "two half-size chunks a rank in a V, 2 pp chunk sets in flight until their W, embedding and LM "
               "head both on rank 0"}


def _zero_bubble_applies(space: SearchSpace, lay: Layout) -> bool:
    """Zero-bubble twins are tried for a 1F1B layout (v = 1, pp >= 2) unless pinned off, without full
    recomputation (a W would redo it) or selective-op (train.py refuses it: its W reruns a block whose stored
    outputs torch's selective checkpoint has freed)."""
    return (lay.v == 1 and lay.pp >= 2 and lay.recompute not in (Recompute.FULL, Recompute.SELECTIVE_OP)
            and False not in (space.zero_bubble or (True,)))


def _sizes(work: Workload, cluster: Cluster, space: SearchSpace, rejected: list[Rejection]):
    """Layouts with sizes set (tp, pp, dp, v, b, sp, zero) and no recomputation / offload; bad families are
    rejected once, at the first size that rules them out."""
    cfg, n = work.model, cluster.gpus
    for tp in space.tp or _divisors(n):
        problems = tp_problems(cfg, cluster, tp) + ([] if n % tp == 0 else [f"tp {tp} does not divide {n} GPUs"])
        if problems:
            rejected.append(Rejection(f"tp {tp}", "; ".join(problems)))
            continue
        for pp in space.pp or _divisors(n // tp):
            yield from _sizes_for(work, cluster, space, tp, pp, rejected)


def _sizes_for(work: Workload, cluster: Cluster, space: SearchSpace, tp: int, pp: int,
               rejected: list[Rejection]):
    cfg, n = work.model, cluster.gpus
    if n % (tp * pp) or pp_problems(cfg, pp, 1):
        reason = "; ".join(pp_problems(cfg, pp, 1) or [f"tp {tp} x pp {pp} does not divide {n} GPUs"])
        rejected.append(Rejection(f"tp {tp} pp {pp}", reason))
        return
    dp = n // (tp * pp)
    if work.global_batch % dp:
        rejected.append(Rejection(f"tp {tp} pp {pp} dp {dp}",
                                  f"global batch {work.global_batch} is not divisible by dp {dp}"))
        return
    vs = _chunk_counts(cfg.num_layers, pp, space)
    if not vs:
        rejected.append(Rejection(f"tp {tp} pp {pp}", f"pp {pp} x {space.layers_per_chunk} layers per virtual "
                                                       f"stage does not divide the {cfg.num_layers} layers"))
        return
    per_replica = work.global_batch // dp
    bs = space.micro_batch or tuple(b for b in _divisors(per_replica) if b <= space.max_micro_batch)
    sps = space.sequence_parallel or ((False, True) if tp > 1 else (False,))
    zeros = space.zero or (tuple(ZeroStage) if dp > 1 else (ZeroStage.NONE,))
    pinned_v = space.v is not None or space.layers_per_chunk is not None
    for v, b, sp, zero in itertools.product(vs, bs, sps, zeros):
        if v > 1 and (per_replica // b) % pp and not pinned_v:
            continue  # interleaving needs m to be a multiple of pp: not a layout, unless asked for
        for r in _replicas(space, cluster, tp, dp, zero):
            yield Layout(tp=tp, pp=pp, dp=dp, v=v, micro_batch=b, zero=zero, sequence_parallel=sp, dp_replicate=r)


def hsdp_replicas(cluster: Cluster, tp: int, dp: int) -> int | None:
    """The replica count of HSDP with a node-sized shard group -- gpus_per_node / tp DP ranks, FSDP1's
    HYBRID_SHARD default (a node's GPUs) -- when that splits dp into 2 or more groups of 2 or more; else None."""
    g = cluster.hw.gpus_per_node
    if g % tp:
        return None
    shard = g // tp
    return dp // shard if 1 < shard < dp and dp % shard == 0 else None


def _replicas(space: SearchSpace, cluster: Cluster, tp: int, dp: int, zero: ZeroStage) -> tuple[int, ...]:
    """HSDP replica counts to try for one ZeRO stage (SearchSpace.dp_replicate): 1 below ZeRO 3; at ZeRO 3 the
    pinned ones, else 1 and, where the ZeRO stage is searched, the node-sized shard group's."""
    if zero is not ZeroStage.PARAMETERS:
        return (1,)
    if space.dp_replicate is not None:
        return space.dp_replicate
    node = hsdp_replicas(cluster, tp, dp)
    searched = space.zero is None or len(space.zero) > 1
    return (1, node) if searched and node is not None else (1,)


def _fitting_variants(work: Workload, cluster: Cluster, space: SearchSpace, base: Layout,
                      result: SearchResult) -> list[tuple[float, Layout]]:
    """The Pareto-minimal (offload, recompute) variants of `base` that fit, with their time lower bounds."""
    offloads = space.offload or _offloads_for(base.zero)
    recomputes = space.recompute or tuple(Recompute)
    fits: list[tuple[int, int, Layout]] = []
    for i, offload in enumerate(offloads):
        for j, recompute in enumerate(recomputes):
            layout = _variant(base, offload, recompute)
            result.considered += 1
            problems = layout_problems(work, cluster, layout) + moe.layout_problems(work, layout, space.expert_parallel,
                                                                                space.expert_tensor_parallel)
            if problems:
                result.rejected.append(Rejection(layout.short(), "; ".join(problems)))
                continue
            peak = peak_memory(work, cluster, layout)
            problem = memory_problem(cluster, *peak) or moe.memory_problem(work, cluster, layout, peak[1],
                                                                           space.moe_imbalance, space.expert_parallel,
                                                                           space.expert_tensor_parallel)
            if problem:
                result.rejected.append(Rejection(layout.short(), problem))
            elif any(fi <= i and recompute_at_most(fitting.recompute, recompute) for fi, _, fitting in fits):
                result.dominated += 1  # (selective and selective-op do not dominate each other)
            else:
                fits.append((i, j, layout))
    return [(lower_bound_seconds(work, cluster, layout), layout) for _, _, layout in fits]


def _variant(base: Layout, offload: Offload, recompute: Recompute) -> Layout:
    """`replace(base, offload=offload, recompute=recompute)` without running Layout's checks again: `base` passed
    them and both values are members of their enums (a whole-space search makes ~10^5 variants; the checks were
    ~6 % of its time)."""
    layout = object.__new__(Layout)
    layout.__dict__.update(base.__dict__, offload=offload, recompute=recompute)
    return layout


def _offloads_for(zero: ZeroStage) -> tuple[Offload, ...]:
    """Offload choices that exist at this ZeRO stage: the CPU updates a partition (ZeRO >= 1), parameters are
    fetched per use only under ZeRO 3 (ZeRO-Offload / ZeRO-Infinity)."""
    if zero is ZeroStage.NONE:
        return (Offload.NONE,)
    if zero is ZeroStage.PARAMETERS:
        return tuple(Offload)
    return (Offload.NONE, Offload.OPTIMIZER)


def _chunk_counts(num_layers: int, pp: int, space: SearchSpace) -> tuple[int, ...]:
    """The v to try at this pp: pinned by layers per chunk, listed, or every v <= max_v that gives each of the pp v
    chunks a layer; a v that does not split the layers evenly gets the balanced uneven split (layout.stage_layers:
    Llama 3 405B's 126 layers on 16 ranks x 4 chunks)."""
    if space.layers_per_chunk is not None:
        n = space.layers_per_chunk
        return (num_layers // (pp * n),) if num_layers % (pp * n) == 0 else ()
    if space.v is not None:
        return space.v
    return tuple(v for v in range(1, space.max_v + 1) if v == 1 or (pp > 1 and pp * v <= num_layers))


def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)
