"""Mixture of Experts in the planner: each layout's expert-parallel size, by expert memory, all-to-all time on the
links the EP group uses, and a load-imbalance factor -- explained.

The dense model of the planner (model.Shard) sees an MoE layer's MLP as one SwiGLU of ModelConfig.ffn_hidden_size
(the dense width; Mixtral's is the expert width). For a layout (tp, pp, dp) and an EP size ep, folded over each
stage's S = tp dp ranks as EP x expert-DP (hybrid/moe/parallel.py; expert-TP 1), this module prices what MoE
changes, per rank of the fullest pipeline stage (its L_s MoE layers):

    expert parameters  Psi_e = L_s (E / ep) 3 h f_e                          (router and shared expert: dense)
    their states       model_states(Psi_e, zero, S / ep, ...)                ZeRO shards them over expert-DP
    less the dense MLP the base plan counted: L_s 3 h f / t
    expert compute     3 x 2 (N k lambda) 3 h f_e per layer and micro-batch (forward + backward = 3 forwards),
                       N = micro_batch x seq / t tokens a rank routes (sequence parallelism), less the one dense
                       MLP pass counted; lambda >= 1 the load imbalance: the busiest EP rank sets the pace
    all-to-all         dispatch + combine forward, the same backward: 4 N k h b (ep - 1) / ep bytes a rank sends
                       per layer and micro-batch (the ledger's all_to_all_v, hybrid/comm.py), times lambda; the
                       share for peers in the node goes over NVLink, the rest over the NIC, at once
                       (max of the two), plus 5 collective latencies (counts, dispatch, combine and the two
                       backward exchanges)

lambda is max / mean tokens per expert -- what train.py's log line prints as "imbalance"; 1.0 is perfect balance.
The default 1.2 is a planning margin, not a measurement: pass the run's own.

Every (layout, ep) is priced; `choose` keeps the fastest ep whose added memory fits the device beside the base plan.
The step adds these seconds to the dense plan's (no overlap assumed: Megatron overlaps the all-to-all only with
its shared-expert compute).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hybrid.planner.hardware import GB, GroupPlacement
from hybrid.planner.layout import Cluster, Layout, Workload, stage_layers
from hybrid.planner.predicted_memory import model_states

IMBALANCE = 1.2  # the default planning margin lambda (module docstring)
COLLECTIVES_PER_LAYER = 5  # counts, dispatch, combine forward; combine and dispatch backward


@dataclass(frozen=True)
class ExpertPlan:
    """The expert layers of one layout at one EP size, per rank of the fullest stage.

    Attributes:
        ep, edp: expert-parallel and expert-data-parallel sizes (ep x edp = tp x dp).
        moe_layers: MoE layers on the fullest stage.
        expert_params: expert parameters a rank holds, Psi_e.
        extra_bytes: device bytes added to the dense plan: the experts' states less the dense MLP's.
        compute_s: added expert compute per step (seconds), imbalance included.
        alltoall_bytes: bytes a rank sends to other ranks per step (the ledger's all_to_all_v sum).
        alltoall_s: their seconds, imbalance and latencies included.
        intra_node: the EP group lives inside one node (NVLink only).
        imbalance: lambda.
    """

    ep: int
    edp: int
    moe_layers: int
    expert_params: float
    extra_bytes: float
    compute_s: float
    alltoall_bytes: float
    alltoall_s: float
    intra_node: bool
    imbalance: float

    @property
    def seconds(self) -> float:
        return self.compute_s + self.alltoall_s

    def explain(self) -> str:
        link = "NVLink" if self.intra_node else "NVLink + network"
        return (f"experts: ep {self.ep} x expert-dp {self.edp}, {self.expert_params / 1e9:.3g}B expert parameters a "
                f"rank ({self.extra_bytes / GB:+.3g} GB beside the dense plan), all-to-all "
                f"{self.alltoall_bytes / GB:.3g} GB a step over {link} {self.alltoall_s:.3g} s, expert compute "
                f"{self.compute_s:+.3g} s, imbalance {self.imbalance:g}")


def ep_placement(cluster: Cluster, ep: int) -> GroupPlacement:
    """An EP group is ep consecutive ranks (order etp-ep-edp inside a stage's tp-dp block)."""
    g = cluster.hw.gpus_per_node
    return GroupPlacement(size=ep, per_node=ep if g % ep == 0 else math.gcd(ep, g))


def _moe_layers_on_fullest_stage(work: Workload, layout: Layout) -> int:
    cfg = work.model
    counts = stage_layers(cfg, layout.pp, layout.v, work.seq_length)
    per_rank, start = [0] * layout.pp, 0
    for stage, n in enumerate(counts):  # global stage = chunk pp + rank
        per_rank[stage % layout.pp] += sum(cfg.is_moe_layer(i) for i in range(start, start + n))
        start += n
    return max(per_rank)


def expert_plan(work: Workload, cluster: Cluster, layout: Layout, ep: int, imbalance: float = IMBALANCE) -> ExpertPlan:
    cfg, hw = work.model, cluster.hw
    h, f_e, E, k = cfg.hidden_size, cfg.moe_ffn_hidden_size, cfg.num_experts, cfg.moe_top_k
    stage = layout.tp * layout.dp
    edp = stage // ep
    layers = _moe_layers_on_fullest_stage(work, layout)
    psi_e = layers * (E // ep) * 3 * h * f_e
    dense_mlp = layers * 3 * h * (cfg.ffn_hidden_size // layout.tp)
    states = model_states(psi_e, layout.zero, edp, layout.offload, work.precision, work.fp32_grads).device
    dense = model_states(dense_mlp, layout.zero, layout.dp, layout.offload, work.precision, work.fp32_grads).device
    m = work.num_microbatches(layout)
    tokens = layout.micro_batch * work.seq_length // layout.tp  # a rank's tokens (sequence parallel)
    flops = 3 * 2.0 * tokens * 3 * h * (k * imbalance * f_e - cfg.ffn_hidden_size / layout.tp)
    compute = layers * m * flops / hw.achievable_flops
    b = work.precision.param_bytes
    sent = 4.0 * tokens * k * h * b * (ep - 1) / ep * layers * m  # per rank per step, to other ranks
    place = ep_placement(cluster, ep)
    in_node = (place.per_node - 1) / max(ep - 1, 1)
    seconds = 0.0
    if ep > 1:
        over_nvlink = sent * in_node / (hw.intra_node_gbps * GB)
        over_nic = sent * (1 - in_node) / (hw.inter_node_gbps * GB)
        latency = hw.inter_latency_s if place.spans_nodes else hw.intra_latency_s
        seconds = imbalance * max(over_nvlink, over_nic) + COLLECTIVES_PER_LAYER * layers * m * latency
    return ExpertPlan(ep=ep, edp=edp, moe_layers=layers, expert_params=psi_e, extra_bytes=states - dense,
                      compute_s=compute, alltoall_bytes=sent, alltoall_s=seconds, intra_node=not place.spans_nodes,
                      imbalance=imbalance)


def expert_plans(work: Workload, cluster: Cluster, layout: Layout, imbalance: float = IMBALANCE) -> list[ExpertPlan]:
    """Every EP size the layout allows: ep divides the stage's tp x dp ranks and the experts."""
    stage, E = layout.tp * layout.dp, work.model.num_experts
    return [expert_plan(work, cluster, layout, ep, imbalance) for ep in range(1, stage + 1)
            if stage % ep == 0 and E % ep == 0]


def choose(work: Workload, cluster: Cluster, layout: Layout, base_bytes: float,
           imbalance: float = IMBALANCE) -> ExpertPlan | None:
    """The fastest EP whose experts fit the device beside the dense plan's `base_bytes`; None when none does."""
    fitting = [p for p in expert_plans(work, cluster, layout, imbalance)
               if base_bytes + p.extra_bytes <= cluster.hw.capacity_bytes]
    return min(fitting, key=lambda p: (p.seconds, p.extra_bytes), default=None)


def memory_problem(work: Workload, cluster: Cluster, layout: Layout, base_bytes: float) -> str | None:
    """Why no EP size lets the experts fit beside the dense plan's `base_bytes`; None when one does (or for a dense
    model)."""
    if not work.model.num_experts:
        return None
    plans = expert_plans(work, cluster, layout)
    if any(base_bytes + p.extra_bytes <= cluster.hw.capacity_bytes for p in plans):
        return None
    best = min(plans, key=lambda p: p.extra_bytes)
    return (f"OOM on the experts: even ep {best.ep} needs {(base_bytes + best.extra_bytes) / GB:.1f} GB of "
            f"{cluster.hw.capacity_bytes / GB:.4g}")
