"""Mixture of Experts in the planner: each layout's expert-parallel size, by expert memory, all-to-all time on the
links the EP group uses, and a load-imbalance factor -- explained.

The dense model of the planner (model.Shard) sees an MoE layer's MLP as one SwiGLU of ModelConfig.ffn_hidden_size
(the dense width; Mixtral's is the expert width). For a layout (tp, pp, dp), an EP size ep and an expert-TP size
etp, folded over each stage's S = tp dp ranks as expert-TP x EP x expert-DP (hybrid/moe/parallel.py), this module
prices what MoE changes, per rank of the fullest pipeline stage (its L_s MoE layers). With context parallelism the
layout here is the CP search's reduced one (hybrid/planner/context.py: dp stands for dp x cp, the sequence for s /
cp), which is how the runtime folds the experts over tp x cp x dp ranks routing b s / (cp t) tokens each:

    expert parameters  Psi_e = L_s (E / ep) 3 h f_e / etp                    each expert's width split etp ways
    their states       model_states(Psi_e, zero, S / (ep etp), ...)          ZeRO shards them over expert-DP
    the dense part     Psi_d = L_s (3 h f_s / t + E h): the shared expert (width f_s, TP-split like the dense MLP)
                       and the router, over DP, in place of the dense MLP L_s 3 h f / t the base plan counted
    expert compute     3 x 2 N (k lambda_ep f_e + f_s - f) 3 h per layer and micro-batch (forward + backward =
                       3 forwards), N = micro_batch x seq / t tokens a rank routes (sequence parallelism; the
                       dense MLP the base plan counted ran all t N tokens at width f / t: the same N f);
                       lambda_ep = lambda >= 1 the load imbalance at ep > 1 (the busiest EP rank sets the pace),
                       1 at ep = 1 (a rank runs its own N k rows, however they spread). Expert-TP leaves it
                       unchanged: a rank runs etp times the rows at 1 / etp of the width
    expert-DP sync     the DP / ZeRO collectives of Psi_e over the expert-DP group (ranks ep apart), less those
                       of the dense MLP (net of Psi_d) over DP the base plan priced: the planner's own ledgers
                       (predicted_comm.dp_step_ledger / dp_microbatch_ledger) at the group's bandwidth, not
                       overlapped. This is what makes ep > 1 pay when the experts fit anyway: a rank syncs
                       1 / ep of the expert gradients (and under ZeRO 3 gathers 1 / ep of the expert weights
                       each micro-batch)
    all-to-all         dispatch + combine forward, the same backward: 4 N k h b (ep - 1) / ep bytes a rank sends
                       per layer and micro-batch (the ledger's all_to_all_v, hybrid/comm.py), times lambda; the
                       share for peers in the node goes over NVLink, the rest over the NIC, at once
                       (max of the two), plus 5 collective latencies (counts, dispatch, combine and the two
                       backward exchanges)
    expert-TP          the rows a rank holds after the all-to-all (N k, times lambda) are all-gathered to the
                       other etp - 1 ranks and their partial outputs reduce-scattered back: 4 N k h b (etp - 1)
                       bytes a rank sends per layer and micro-batch, forward + backward (the ledger's all_to_all_v
                       on the etp group, tests/test_moe_etp.py), over NVLink when etp divides the GPUs of a node
                       (etp is innermost), plus 5 latencies (the counts' all-gather and the four exchanges)

lambda is max / mean tokens per expert -- what train.py's log line prints as "imbalance"; 1.0 is perfect balance.
The default 1.2 is a planning margin, not a measurement: pass the run's own (`hybrid plan --moe-imbalance`).

Every (layout, ep, etp) is priced; `choose` keeps the fastest (ep, etp) whose added memory fits the device beside
the base plan (ep need not divide dp: EP folds over the stage's tp x dp ranks; ep x etp divides tp x dp, ep the
experts, etp their width). Expert-TP splits the experts further where E limits ep, and its ranks share every
row of their experts, so the imbalance does not pace them (lambda applies at ep > 1 only): the model can prefer
ep 1 x etp 2 to ep 2 when the imbalance costs more than the expert-TP traffic. The narrower GEMMs' lower
efficiency at width f_e / etp is not modelled (Megatron recommends etp 1 for that reason); pin
`expert_tensor_parallel` (train.py --expert-tensor-parallel-size with --auto-parallel) to keep it out. A larger ep
sends a larger share (ep - 1) / ep of the rows off-rank and pays the imbalance, and syncs fewer expert gradients
over a smaller expert-DP group; fuller expert GEMMs are not modelled. --explain lists every ep with its terms.
`alltoall_bytes` is what the runtime's ledger counts on the ep group (all_to_all_v) for a routing that gives every
EP rank N k / ep slots (tests/test_moe_planner.py); the per-expert counts exchanged first (E / ep int64 to each
peer) are priced as latency only. The alltoall dispatcher (the default) is priced, not allgather. The step adds
these seconds to the dense plan's (no overlap assumed: Megatron overlaps the all-to-all only with its shared-expert
compute).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hybrid.planner.hardware import GB, GroupPlacement
from hybrid.planner.layout import Cluster, Layout, Workload, dp_placement, stage_layers
from hybrid.planner.predicted_comm import Ledger, dp_microbatch_ledger, dp_step_ledger, ledger_seconds, merge
from hybrid.planner.predicted_memory import MIB, ModelStates, model_states, needs_of

IMBALANCE = 1.2  # the default planning margin lambda (module docstring)
COLLECTIVES_PER_LAYER = 5  # counts, dispatch, combine forward; combine and dispatch backward
ETP_COLLECTIVES_PER_LAYER = 5  # counts' all-gather, gather and reduce-scatter forward; their two backwards


@dataclass(frozen=True)
class ExpertPlan:
    """The expert layers of one layout at one EP size, per rank of the fullest stage.

    Attributes:
        ep, edp: expert-parallel and expert-data-parallel sizes (etp x ep x edp = tp x dp).
        moe_layers: MoE layers on the fullest stage.
        expert_params: expert parameters a rank holds, Psi_e.
        extra_bytes: device bytes added to the dense plan: the experts' states less the dense MLP's.
        extra_states: extra_bytes as parameters, gradients and optimizer states (the --plot bars' parts).
        compute_s: added expert compute per step (seconds), imbalance included.
        dp_sync_s: added DP / ZeRO collective seconds per step (expert-DP sync less the dense MLP's).
        alltoall_bytes: bytes a rank sends to other ranks per step (the ledger's all_to_all_v sum).
        alltoall_s: their seconds, imbalance and latencies included, plus etp_s.
        intra_node: the EP group lives inside one node (NVLink only).
        imbalance: lambda.
        etp: expert-tensor-parallel size (each expert's width split etp ways).
        etp_bytes: bytes a rank sends to its expert-TP peers per step (the ledger's all_to_all_v on etp).
        etp_s: their seconds, imbalance and latencies included (in alltoall_s too).
    """

    ep: int
    edp: int
    moe_layers: int
    expert_params: float
    extra_bytes: float
    compute_s: float
    dp_sync_s: float
    alltoall_bytes: float
    alltoall_s: float
    intra_node: bool
    imbalance: float
    etp: int = 1
    etp_bytes: float = 0.0
    etp_s: float = 0.0
    fabric: str = "NVLink"  # the node's links by name: a GPU node's NVLink, a host's own (round 21: on a CPU
    #                         the line said "over NVLink")
    extra_states: ModelStates = ModelStates(0.0, 0.0, 0.0, 0.0)

    @property
    def seconds(self) -> float:
        return self.compute_s + self.alltoall_s + self.dp_sync_s

    def explain(self, host: bool = False) -> str:
        """--explain's experts line; host: CPU hardware, where the plan table's memory is RSS in MiB (2^20
        bytes), so is the experts' (the wire's bytes stay GB = 1e9, as every traffic figure)."""
        link = self.fabric if self.intra_node else f"{self.fabric} + network"
        tp = f"expert-tp {self.etp} x " if self.etp > 1 else ""
        etp = (f", expert-TP gather / reduce-scatter {self.etp_bytes / GB:.3g} GB {self.etp_s:.3g} s"
               if self.etp > 1 else "")
        extra = (f"{self.extra_bytes / MIB:+.3g} MiB of RSS beside the dense plan's tensors" if host else
                 f"{self.extra_bytes / GB:+.3g} GB beside the dense plan")
        return (f"experts: {tp}ep {self.ep} x expert-dp {self.edp}, {_count(self.expert_params)} expert parameters a "
                f"rank ({extra}), all-to-all "
                f"{self.alltoall_bytes / GB:.3g} GB a step over {link} {self.alltoall_s - self.etp_s:.3g} s{etp}, "
                f"expert compute "
                f"{self.compute_s:+.3g} s, expert-DP sync {self.dp_sync_s:+.3g} s, imbalance {self.imbalance:g}")


def _count(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def ep_placement(cluster: Cluster, ep: int, etp: int = 1) -> GroupPlacement:
    """An EP group is ep ranks etp apart (order etp-ep-edp inside a stage's tp-dp block): consecutive at etp 1."""
    g, span = cluster.hw.gpus_per_node, ep * etp
    return GroupPlacement(size=ep, per_node=ep if g % span == 0 else max(1, math.gcd(span, g) // etp))


def etp_placement(cluster: Cluster, etp: int) -> GroupPlacement:
    """An expert-TP group is etp consecutive ranks (innermost)."""
    g = cluster.hw.gpus_per_node
    return GroupPlacement(size=etp, per_node=etp if g % etp == 0 else math.gcd(etp, g))


def edp_placement(cluster: Cluster, layout: Layout, ep: int, etp: int = 1) -> GroupPlacement:
    """An expert-DP group is S / (ep etp) ranks ep etp apart inside a stage's block of S = tp dp consecutive ranks
    (as layout.dp_placement with ep etp in place of tp)."""
    block, g, inner = layout.tp * layout.dp, cluster.hw.gpus_per_node, ep * etp
    edp = block // inner
    return GroupPlacement(size=edp, per_node=edp if g % block == 0 else max(1, math.gcd(block, g) // inner))


def sync_ledger(work: Workload, layout: Layout, psi: float, size: int) -> Ledger:
    """A step's DP / ZeRO collectives for `psi` parameters over a group of `size` (the planner's ledgers: per
    micro-batch for ZeRO 2-3, after the last backward for all stages). For the experts (Psi_e over expert-DP) the
    bytes are the runtime ledger's on its edp group (tests/test_moe_planner.py)."""
    g, b, m = work.grad_bytes, work.precision.param_bytes, work.num_microbatches(layout)
    per_mb = dp_microbatch_ledger(psi, layout.zero, size, g, b)
    return merge(merge(per_mb["forward"], per_mb["backward"], times=m), dp_step_ledger(psi, layout.zero, size, g, b))


def _sync_seconds(work: Workload, cluster: Cluster, layout: Layout, psi: float, size: int,
                  group: GroupPlacement) -> float:
    return ledger_seconds(sync_ledger(work, layout, psi, size), cluster.hw, group)


def _moe_layers_on_fullest_stage(work: Workload, layout: Layout) -> int:
    cfg = work.model
    counts = stage_layers(cfg, layout.pp, layout.v, work.seq_length, work.pipeline_split)
    per_rank, start = [0] * layout.pp, 0
    for stage, n in enumerate(counts):  # global stage = chunk pp + rank
        per_rank[stage % layout.pp] += sum(cfg.is_moe_layer(i) for i in range(start, start + n))
        start += n
    return max(per_rank)


def expert_plan(work: Workload, cluster: Cluster, layout: Layout, ep: int, imbalance: float = IMBALANCE,
                etp: int = 1) -> ExpertPlan:
    """The experts of `layout` at EP `ep` and expert-TP `etp`: every term of the module docstring, per rank of the
    fullest stage."""
    cfg, hw = work.model, work.device(cluster.hw, layout)
    h, f_e, E, k = cfg.hidden_size, cfg.moe_ffn_hidden_size, cfg.num_experts, cfg.moe_top_k
    stage = layout.tp * layout.dp
    edp = stage // (ep * etp)
    layers = _moe_layers_on_fullest_stage(work, layout)
    f, f_s = cfg.ffn_hidden_size, cfg.moe_shared_expert_ffn_hidden_size
    psi_e = layers * (E // ep) * 3 * h * (f_e // etp)
    psi_d = layers * (3 * h * f_s // layout.tp + E * h)  # shared expert and router (module docstring)
    dense_mlp = layers * 3 * h * (f // layout.tp)

    def states(psi: float, shards: int) -> ModelStates:
        return model_states(psi, layout.zero, shards, layout.offload, work.precision, work.fp32_grads,
                            work.optimizer_bytes)

    experts, dense, mlp = states(psi_e, edp), states(psi_d, layout.dp), states(dense_mlp, layout.dp)
    extra = experts.device + dense.device - mlp.device
    parts = ModelStates(*(getattr(experts, k) + getattr(dense, k) - getattr(mlp, k)
                          for k in ("params", "grads", "optimizer", "host")))  # extra, part by part
    dp_group = dp_placement(cluster, layout)
    sync = (_sync_seconds(work, cluster, layout, psi_e, edp, edp_placement(cluster, layout, ep, etp))
            + _sync_seconds(work, cluster, layout, psi_d, layout.dp, dp_group)
            - _sync_seconds(work, cluster, layout, dense_mlp, layout.dp, dp_group))
    m = work.num_microbatches(layout)
    tokens = layout.micro_batch * work.seq_length // layout.tp  # a rank's tokens (sequence parallel)
    pace = imbalance if ep > 1 else 1.0  # lambda_ep (module docstring)
    flops = 3 * 2.0 * tokens * 3 * h * (k * pace * f_e + f_s - f)
    compute = layers * m * flops / hw.achievable_flops
    b = work.precision.param_bytes
    sent = 4.0 * tokens * k * h * b * (ep - 1) / ep * layers * m  # per rank per step, to other ranks
    place = ep_placement(cluster, ep, etp)
    seconds = _exchange_seconds(hw, place, sent, imbalance, COLLECTIVES_PER_LAYER * layers * m) if ep > 1 else 0.0
    etp_sent = etp_bytes(tokens, k, h, b, etp) * layers * m  # per rank per step, to its expert-TP peers
    etp_place = etp_placement(cluster, etp)
    etp_s = (_exchange_seconds(hw, etp_place, etp_sent, pace, ETP_COLLECTIVES_PER_LAYER * layers * m)
             if etp > 1 else 0.0)
    return ExpertPlan(ep=ep, edp=edp, moe_layers=layers, expert_params=psi_e, extra_bytes=extra,
                      compute_s=compute, dp_sync_s=sync, alltoall_bytes=sent, alltoall_s=seconds + etp_s,
                      intra_node=not place.spans_nodes and not etp_place.spans_nodes, imbalance=imbalance,
                      etp=etp, etp_bytes=etp_sent, etp_s=etp_s, fabric=node_fabric(hw), extra_states=parts)


def node_fabric(hw) -> str:
    """What the ranks of one node talk over, for the explain line: CPU hardware (the cpu preset, a gloo
    calibration: compute_units set) has no NVLink -- its ranks are processes of one host."""
    return "the host's links" if hw.on_host else "NVLink"


def etp_bytes(tokens: int, k: int, h: int, b: int, etp: int) -> float:
    """Bytes a rank sends to its expert-TP peers per MoE layer and micro-batch, forward + backward, for a routing
    that gives every EP rank N k / ep slots (so each rank holds N k rows after the all-to-all): the all-gather-v
    sends them to etp - 1 peers, the reduce-scatter-v returns the peers' rows' partials, both again backward."""
    return 4.0 * tokens * k * h * b * (etp - 1)


def _exchange_seconds(hw, place: GroupPlacement, sent: float, pace: float, latencies: int) -> float:
    """`sent` bytes to a group's peers: the share in the node over NVLink, the rest over the NIC, at once (the max),
    paced by the imbalance, plus the collectives' latencies."""
    in_node = (place.per_node - 1) / max(place.size - 1, 1)
    over_nvlink = sent * in_node / (hw.intra_node_gbps * GB)
    over_nic = sent * (1 - in_node) / (hw.inter_node_gbps * GB)
    latency = hw.inter_latency_s if place.spans_nodes else hw.intra_latency_s
    return pace * max(over_nvlink, over_nic) + latencies * latency


def ep_sizes(work: Workload, layout: Layout, pinned: tuple[int, ...] | None = None) -> list[int]:
    """The EP sizes the layout allows (of `pinned`, when given): ep divides the stage's tp x dp ranks and the
    experts, as hybrid/moe/args.py requires."""
    stage, E = layout.tp * layout.dp, work.model.num_experts
    return [ep for ep in (pinned or range(1, stage + 1)) if stage % ep == 0 and E % ep == 0]


def expert_sizes(work: Workload, layout: Layout, pinned: tuple[int, ...] | None = None,
                 pinned_etp: tuple[int, ...] | None = None) -> list[tuple[int, int]]:
    """The (ep, etp) pairs the layout allows: ep as `ep_sizes`, etp (of `pinned_etp`) dividing the stage's ranks
    left to it and the experts' width (hybrid/moe/args.py)."""
    stage, f_e = layout.tp * layout.dp, work.model.moe_ffn_hidden_size
    return [(ep, etp) for ep in ep_sizes(work, layout, pinned)
            for etp in (pinned_etp or range(1, stage // ep + 1)) if (stage // ep) % etp == 0 and f_e % etp == 0
            and stage % (ep * etp) == 0]


def expert_plans(work: Workload, cluster: Cluster, layout: Layout, imbalance: float = IMBALANCE,
                 pinned: tuple[int, ...] | None = None, pinned_etp: tuple[int, ...] | None = None) -> list[ExpertPlan]:
    """Every (ep, etp) the layout allows (`expert_sizes`), priced."""
    return [expert_plan(work, cluster, layout, ep, imbalance, etp)
            for ep, etp in expert_sizes(work, layout, pinned, pinned_etp)]


def choose(work: Workload, cluster: Cluster, layout: Layout, base_bytes: float, imbalance: float = IMBALANCE,
           pinned: tuple[int, ...] | None = None, pinned_etp: tuple[int, ...] | None = None) -> ExpertPlan | None:
    """The fastest (ep, etp) whose experts fit the device beside the dense plan's `base_bytes`; None when none does
    (ties: less memory, then the smaller etp)."""
    fitting = [p for p in expert_plans(work, cluster, layout, imbalance, pinned, pinned_etp)
               if base_bytes + p.extra_bytes <= cluster.hw.capacity_bytes]
    return min(fitting, key=lambda p: (p.seconds, p.extra_bytes, p.etp), default=None)


def layout_problems(work: Workload, layout: Layout, pinned: tuple[int, ...] | None = None,
                    pinned_etp: tuple[int, ...] | None = None) -> list[str]:
    """What train.py refuses for an MoE model on this layout (hybrid/moe/args.py), before any memory: TP without
    sequence parallelism (each TP rank must route its own tokens), no allowed EP size."""
    if not work.model.num_experts:
        return []
    problems = []
    if layout.tp > 1 and not layout.sequence_parallel:
        problems.append("MoE with tp > 1 needs sequence parallelism (each TP rank routes its own tokens)")
    if not ep_sizes(work, layout, pinned):
        problems.append(f"no ep of {list(pinned or [])} divides both the stage's tp x dp = {layout.tp * layout.dp} "
                        f"ranks and the {work.model.num_experts} experts")
    elif not expert_sizes(work, layout, pinned, pinned_etp):
        problems.append(f"no expert-tp of {list(pinned_etp or [])} divides both the stage's ranks left to it and the "
                        f"experts' width {work.model.moe_ffn_hidden_size}")
    return problems


def memory_problem(work: Workload, cluster: Cluster, layout: Layout, base_bytes: float,
                   imbalance: float = IMBALANCE, pinned: tuple[int, ...] | None = None,
                   pinned_etp: tuple[int, ...] | None = None) -> str | None:
    """Why no (ep, etp) lets the experts fit beside the dense plan's `base_bytes`; None when one does (or for a
    dense model, or a layout with no allowed EP: layout_problems says that)."""
    plans = expert_plans(work, cluster, layout, imbalance, pinned, pinned_etp) if work.model.num_experts else []
    if not plans or any(base_bytes + p.extra_bytes <= cluster.hw.capacity_bytes for p in plans):
        return None
    best = min(plans, key=lambda p: p.extra_bytes)
    tp = f" x expert-tp {best.etp}" if best.etp > 1 else ""
    return f"OOM on the experts: even ep {best.ep}{tp} {needs_of(base_bytes + best.extra_bytes, cluster.hw)}"


def why(work: Workload, cluster: Cluster, layout: Layout, base_bytes: float, chosen: ExpertPlan,
        rss_offset: float | None = None) -> list[str]:
    """--explain: every (ep, etp) of the layout, its seconds and memory, and why `chosen` won. Memory: GB of the
    device's demand (base_bytes + the experts', the planner's reserve in it); on CPU hardware (rss_offset: the
    process's resident bytes less that reserve, as cli._memory) the plan table's peak RSS in MiB."""
    lines = [f"experts: ep {chosen.ep} x expert-tp {chosen.etp} chosen of {expert_sizes(work, layout)} (ep, etp) "
             f"(fastest that fits; imbalance {chosen.imbalance:g}; docs/moe.md \"The planner\")"]
    for p in expert_plans(work, cluster, layout, chosen.imbalance):
        fits = base_bytes + p.extra_bytes <= cluster.hw.capacity_bytes
        lines.append(f"    ep {p.ep:<3} etp {p.etp:<2} all-to-all (+ expert-TP) {p.alltoall_s:.3g} s + expert compute {p.compute_s:+.3g} s + "
                     f"expert-DP sync {p.dp_sync_s:+.3g} s = {p.seconds:.3g} s, "
                     f"{_memory(base_bytes + p.extra_bytes, rss_offset)}" + ("" if fits else " -- does not fit"))
    return lines


def _memory(demand: float, rss_offset: float | None) -> str:
    """A rank's memory as the plan table prints it: the device's demand in GB, or on a host its RSS in MiB."""
    return f"{demand / GB:.3g} GB" if rss_offset is None else f"RSS {(demand + rss_offset) / MIB:,.0f} MiB"


def layout_suffix(plan: ExpertPlan | None) -> str:
    """' ep2', ' ep1 etp2': an MoE plan's sizes after its layout in the plan tables (cli's, context's); '' for a
    dense model."""
    if plan is None:
        return ""
    return f" ep{plan.ep}" + (f" etp{plan.etp}" if plan.etp > 1 else "")


def train_argv(plan: ExpertPlan | None) -> list[str]:
    """train.py's flags for the chosen EP and expert-TP (hybrid/moe/args.py; `hybrid plan --emit-args`); none for a
    dense model. An MoE plan names both, sizes 1 too (train.py's defaults, but the plan's choice: round 21, a plan
    at ep 1 said nothing of EP)."""
    if plan is None:
        return []
    return ["--expert-model-parallel-size", str(plan.ep), "--expert-tensor-parallel-size", str(plan.etp)]
