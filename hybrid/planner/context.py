"""Context parallelism in the planner: a CP layout is, per rank, the plain layout it reduces to, plus the two
things CP adds -- longer attention and the CP transfers (hybrid/cp/, docs/context-parallel.md).

Reduction. CP c on (global batch G, sequence s) at (tp, pp, dp): every rank holds G/dp sequences' s/c tokens
(load-balanced: two chunks of s/2c), gradients are reduced -- and ZeRO shards -- over the dp x c ranks of the
runtime's dp_cp group. Per rank that is the plain layout (tp, pp, dp c) on (G c, s/c): the same parameters and
ZeRO partition, activations of b s/c tokens a micro-batch, the same micro-batches, the same linear-layer FLOPs,
TP and PP traffic at s/c tokens. So memory and everything but attention come from the plain planner on the
reduced problem (`reduce`); what differs is added here:

  attention   a rank's s/c queries see keys of all c ranks, not only their own: c - 1 more ring steps per layer and
              micro-batch. Causal and load-balanced (Megatron's 2c chunks, rank r holding chunks r and 2c - 1 - r:
              TransformerEngine AttnFuncWithCPAndKVP2P.forward, torch's _templated_ring_attention, hybrid/cp/ring.py),
              every step is half an (s/c)^2 block -- the diagonal step causal; of an earlier rank's block both query
              chunks see its first key chunk, of a later rank's only the second query chunk sees it whole -- so a
              rank does 1/c of the sequence's causal attention, as much as a plain rank with the same tokens. A step
              is priced as the plain step prices its own causal attention (time.ring_step_seconds: flash attention
              at the workload's kernel rate, FLASH_BACKWARD x in backward, once more when recomputed).
  CP traffic  per layer and micro-batch, kv = 2 b (s/c) g d / t x 2 bytes (a rank's bf16 K and V); each transfer is
              posted before a ring step's compute and waited after it (send block i + 1 while computing block i),
              so a step exposes max(0, transfer - the step's compute):
              p2p        forward c - 1 transfers of kv; backward by the stack's ring (RingSchedule): Transformer
                         Engine's (Megatron) sends dK, dV in bf16 with the next K, V -- kv, then c - 2 of 2 kv,
                         then the last dK, dV, each under a step; the runtime's (PyTorch stack) c - 1 steps of
                         kv + an fp32 dK, dV accumulator (2 kv), and the last accumulator after the loop, exposed;
                         torch's context_parallel (Workload.cp_ring, torchtitan: `_torch_ring`) one all-gather of
                         c kv a pass hidden under the diagonal step only, the fp32 accumulator permuted after each
                         backward step, and its fp32 merges as memory-bound bytes (`torch_ring_merge_bytes`).
                         kv is at the query width where the model repeats K, V first (Workload.kv_repeated)
              a2a        Ulysses: 4 all-to-alls forward (q, k, v, out) and 4 backward, each moving
                         (c - 1)/c of its tensor, not overlapped
              allgather  an all-gather of kv (c kv) forward and a reduce-scatter of its gradient backward, not
                         overlapped
              Recomputation (every mode: the CP paths are autograd Functions and collectives, which op-level
              recomputation cannot keep either) reruns the forward's transfers in backward, as the runtime's
              ledger counts them (tests/test_cp_models.py).
              The CP group is c ranks tp apart (rank order tp-cp-dp-pp): inside a node when tp c <= GPUs per
              node (NVLink), else the ring crosses nodes (the NIC).
  memory      flash attention's (no s x s scores; Megatron's CP requires flash kernels): the reduced plan's,
              plus the ring's buffers in backward: 4 kv either way (kv + the fp32 accumulator + the next kv; TE's
              two bf16 (K, V; dK, dV) buffers).

The extra seconds per micro-batch of a pipeline rank (its layers, over all its chunks, x the above) enter the step as
a 1F1B pipeline's critical path does: m + (pp - 1)/v times (m micro-batches, v chunks a rank).

Mixture of Experts. The reduction holds for the expert layers as they run (hybrid/moe/parallel.py: the expert
layers fold each stage's tp x cp x dp ranks as expert-TP x EP x expert-DP, Megatron's expert-DP carved from
DP x CP): per rank the reduced layout's stage has tp x (dp c) ranks in the same order (tp-cp-dp is tp-dp' with
dp' = cp + c dp), a rank routes b s / (c t) tokens (its all-to-all bytes, expert compute and imbalance), and the
experts' gradients are synced and ZeRO-sharded over the same expert-DP group. So the reduced search prices EP,
expert-TP and their memory (hybrid/planner/moe.py) exactly as for a plain layout, and a CP plan's step and memory
are the reduced plan's -- experts included -- plus CP's terms above (attention's ring is the only CP cost: the
balancing loss's counts over TP x CP are E floats a layer, priced as nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hybrid.cp.comm_type import CommType
from hybrid.cp.volume import ring_bytes
from hybrid.planner.hardware import Collective, GroupPlacement, collective_seconds, p2p_seconds
from hybrid.planner import moe
from hybrid.planner.layout import Cluster, Layout, Recompute, RingSchedule, Workload, stage_layers
from hybrid.planner.search import Plan, Rejection, SearchSpace, evaluate, search
from hybrid.planner.time import model_flops, ring_step_seconds

BF16 = 2  # bytes of K, V on the wire (GPU runs: bf16)
# CP's terms of a step (`hybrid plan --explain`, the plan JSON), after the reduced plan's attention (time.TERMS)
CP_TERMS = (("cp_attention", "the ring's c - 1 more steps: the other ranks' key blocks, half an (s/c)^2 block each, "
                             "at the flash rate (rerun under recomputation)"),
            ("cp_exchange", "CP transfers not hidden under a ring step's compute (p2p: max(0, transfer - step); "
                            "a2a, allgather: all of them)"),
            ("cp_merge", "torch's ring (torchtitan): its fp32 output merges and concatenations, memory-bound "
                         "(0 for the other rings)"))
SEARCH_MARGIN = 4  # plans asked of each reduced search per plan wanted (some reduced layouts are no CP layout)


def reduce(work: Workload, layout: Layout, cp: int) -> tuple[Workload, Layout]:
    """The plain problem a CP layout equals per rank (see the module doc)."""
    if work.seq_length % (2 * cp):
        raise ValueError(f"--seq-length {work.seq_length} is not divisible by 2 x --context-parallel-size {cp} = "
                         f"{2 * cp}")
    return (replace(work, global_batch=work.global_batch * cp, seq_length=work.seq_length // cp),
            replace(layout, dp=layout.dp * cp))


def cp_placement(cluster: Cluster, tp: int, cp: int) -> GroupPlacement:
    """CP group = c ranks tp apart: inside a node when tp c divides into the node, else spread over nodes."""
    g = cluster.hw.gpus_per_node
    return GroupPlacement(size=cp, per_node=cp if tp * cp <= g else max(1, g // tp))


def ring_schedule(work: Workload, layout: Layout) -> RingSchedule:
    """The ring a workload runs: the one it names (Workload.cp_ring: torch's all-gather ring for torchtitan), else
    its stack's (Workload.stack; ops.Stack): Megatron's is Transformer Engine's, a PyTorch-native stack's this
    runtime's."""
    if work.cp_ring is not None:
        return work.cp_ring
    return RingSchedule.ACCUMULATOR if work.pytorch_native(layout) else RingSchedule.TRAVELLING


@dataclass(frozen=True)
class CPCost:
    """Seconds CP adds to one layer's forward + backward on one micro-batch, on one rank.

    Attributes:
        attention: the extra attention compute (c - 1 more ring steps, half a block each), recomputation included.
        transfer: the CP transfers' time.
        exposed: the part of `transfer` not hidden under attention compute (all of it for a2a, allgather).
        buffer_bytes: the ring's receive buffers held during a layer's backward (memory).
        merge: memory-bound seconds of the ring's own bookkeeping between its attention calls (torch's ring:
            the fp32 output merges, concatenations and gradient accumulations, `torch_ring_merge_bytes`; 0 where
            not priced).
    """

    attention: float
    transfer: float
    exposed: float
    buffer_bytes: float
    merge: float = 0.0

    @property
    def added(self) -> float:
        """Seconds on the critical path: the extra attention, its exposed transfers and the ring's merges."""
        return self.attention + self.exposed + self.merge


def layer_cost(work: Workload, cluster: Cluster, layout: Layout, cp: int, comm: CommType) -> CPCost:
    """What CP adds to one layer and micro-batch (module doc)."""
    hw, shard = work.device(cluster.hw, layout), work.shard(layout.tp)
    b, s = layout.micro_batch, work.seq_length // cp
    fwd, bwd = ring_step_seconds(work, cluster, layout, s)  # one step: half an (s/c)^2 block (load-balanced)
    recomputed = layout.recompute is not Recompute.NONE  # every mode reruns the CP core (and its transfers)
    attention = (cp - 1) * (fwd + bwd + (fwd if recomputed else 0.0))
    kv_elements = 2 * b * s * (shard.q_width if work.kv_repeated else shard.kv_width)  # K and V as they travel
    kv = kv_elements * BF16
    group = cp_placement(cluster, layout.tp, cp)
    if comm is CommType.P2P:
        schedule = ring_schedule(work, layout)
        if schedule is RingSchedule.TORCH_ALLGATHER:
            buffers = 4 * 2 * b * s * shard.kv_width * BF16  # memory as the ACCUMULATOR ring's (_torch_ring)
            f_bytes, b_bytes = torch_ring_merge_bytes(b * s * shard.q_width, kv_elements // 2, cp)
            merge = ((2 if recomputed else 1) * f_bytes + b_bytes) / hw.elementwise_bytes_per_s
            transfer, exposed = _torch_ring(hw, group, kv_elements, cp, fwd, bwd, recomputed)
            return CPCost(attention, transfer, exposed, buffers, merge)
        transfer, exposed, buffers = _ring(hw, group.spans_nodes, kv_elements, cp, fwd, bwd, recomputed, schedule)
        return CPCost(attention, transfer, exposed, buffers)
    if comm is CommType.A2A:
        q = b * s * shard.q_width * BF16
        one = [collective_seconds(hw, Collective.ALL_GATHER, t, group) for t in (q, kv / 2, kv / 2, q)]
        # all-to-all wire bytes (c - 1)/c S, as an all-gather's; recomputation reruns the forward's (selective:
        # q, k, v only -- torch's checkpoint stops before the output's, which backward does not need)
        rerun_a2a = sum(one[:3]) if layout.recompute is Recompute.SELECTIVE else sum(one) if recomputed else 0.0
        transfer = 2 * sum(one) + rerun_a2a
        return CPCost(attention, transfer, transfer, 0.0)
    gather = collective_seconds(hw, Collective.ALL_GATHER, cp * kv, group)
    transfer = (2 if recomputed else 1) * gather + collective_seconds(hw, Collective.REDUCE_SCATTER, cp * kv, group)
    return CPCost(attention, transfer, transfer, cp * kv)


def _ring(hw, crosses: bool, kv_elements: int, cp: int, fwd: float, bwd: float, recomputed: bool,
          schedule: RingSchedule) -> tuple[float, float, float]:
    """(transfer, exposed, buffer bytes) of the p2p ring for one layer and micro-batch. Every transfer is posted
    before the compute of a ring step and waited after it (send block i + 1 while computing block i), so a step
    exposes max(0, transfer - that step's compute) -- `fwd`, `bwd` a step's seconds (ring_step_seconds).
    Forward (rerun once more under recomputation): c - 1 transfers of K, V. Backward: ACCUMULATOR -- c - 1 steps
    of K, V + the fp32 dK, dV accumulator (the runtime's ledger, ring_bytes), and the last accumulator after the
    loop, exposed; TRAVELLING -- step 0 K, V, steps 1 .. c - 2 K, V + dK, dV, step c - 1 dK, dV (compute dtype)."""
    kv = kv_elements * BF16
    step_f = p2p_seconds(hw, kv, crosses)
    forwards = 2 if recomputed else 1
    f_transfer, f_exposed = forwards * (cp - 1) * step_f, forwards * (cp - 1) * max(0.0, step_f - fwd)
    if schedule is RingSchedule.ACCUMULATOR:
        sent_f, sent_b = ring_bytes(kv_elements, cp, BF16)  # the runtime's ledger formula (hybrid/cp/ring.py)
        acc = (sent_b - sent_f) // cp  # one step's fp32 dK, dV accumulator
        step_b, last = p2p_seconds(hw, kv + acc, crosses), p2p_seconds(hw, acc, crosses)
        return (f_transfer + (cp - 1) * step_b + last, f_exposed + (cp - 1) * max(0.0, step_b - bwd) + last,
                kv + kv + acc)  # forward's next block; backward's kv + acc
    steps = [kv] + [2 * kv] * (cp - 2) + [kv]  # K, V / K, V + dK, dV / dK, dV, one a ring step
    seconds = [p2p_seconds(hw, n, crosses) for n in steps]
    return (f_transfer + sum(seconds), f_exposed + sum(max(0.0, t - bwd) for t in seconds),
            2 * (2 * kv))  # backward's two buffers of K, V + dK, dV (one sent, one received)


def _torch_ring(hw, group: GroupPlacement, kv_elements: int, cp: int, fwd: float, bwd: float,
                recomputed: bool) -> tuple[float, float]:
    """torch's context_parallel ring as torchtitan runs it (RingSchedule.TORCH_ALLGATHER; torch/distributed/tensor/
    experimental/_attention.py, `_templated_ring_attention` and its backward), one layer and micro-batch.

    Forward (rerun under recomputation): `_AllGatherRotater.exchange_buffers` all-gathers the c ranks' K, V once
    (c kv gathered, (c - 1)/c of it on the wire a rank) before the diagonal step's compute and `next_buffer` waits
    for it before step 1: the gather hides under ONE step's compute, `fwd`, where a p2p ring has c - 1 steps for
    c - 1 transfers of kv. Backward: the kv rotater gathers K, V again the same way (under the diagonal step's
    backward, `bwd`); the fp32 dK, dV accumulator (2 kv) goes to the next rank by an all-to-all permute after each of
    the c steps, waited after the next step's compute, and the last one after the loop: exposed.
    (transfer, exposed) seconds. Time only: the caller keeps the ACCUMULATOR ring's buffer bytes (4 kv of the kv
    heads); the gathered c kv and the repeated heads' bytes are not on the memory side (docs/planner/rounds.md,
    round 9)."""
    kv = kv_elements * BF16
    gather = collective_seconds(hw, Collective.ALL_GATHER, cp * kv, group)
    acc = p2p_seconds(hw, kv_elements * 4, group.spans_nodes)  # the fp32 dK, dV of one step (permute_tensor)
    forwards = 2 if recomputed else 1
    transfer = forwards * gather + gather + cp * acc
    exposed = (forwards * max(0.0, gather - fwd) + max(0.0, gather - bwd)
               + (cp - 1) * max(0.0, acc - bwd) + acc)
    return transfer, exposed


def torch_ring_merge_bytes(x: int, y: int, cp: int) -> tuple[float, float]:
    """HBM bytes (forward, backward) of torch's ring bookkeeping around its attention calls, one layer and
    micro-batch on the busiest rank (cp rank c - 1, whose steps 1 .. c - 1 all take the whole query: `i <= rank`),
    read off torch/distributed/tensor/experimental/_attention.py (pytorch/pytorch f2127dbd). `x`: elements of a
    rank's query (= output), b (s/c) a d / t; `y`: elements of its K (= V) as they travel. Bytes read + written, bf16
    2, fp32 4 (`convert_to_f32` defaults True); row-wise logsumexp work (1/d of these) left out.

    Forward (`_templated_ring_attention`, `_SDPAMerger`):
      c - 1 x  torch.cat([key.flatten(), value.flatten()]) before each rotation: 2 y bf16 read + written   8 y
      every step: the block output cast to fp32 (`step`: .to(float32))                                     6 x
      c - 1 x  the merge out - sigmoid(lse_b - lse) (out - out_b): three fp32 elementwise kernels       32 x
      once: the merged output cast back to bf16 (`results`)                                              6 x
    Backward (`_templated_ring_attention_backward`):
      once: fp32 zeros for dq, dk, dv                                                              4 x + 8 y
      c - 1 x  the K, V concatenation                                                                   8 y
      step 0: dk, dv += the bf16 block gradients (fp32 += bf16: 4 + 2 read, 4 written)                 20 y
      c - 1 x  dk, dv `_partial_update` (add into the first half, 10 y / 2 each, then torch.cat the
               halves, 8 y each)                                                                       26 y
      every step: torch.cat of the fp32 dk, dv for the next rank                                       16 y
      every step: dq += the block's dq (fp32 += bf16)                                                  10 x
      once: dq and the received dk, dv cast back to bf16                                         6 x + 12 y
    """
    n = cp - 1
    forward = n * 8 * y + cp * 6 * x + n * 32 * x + 6 * x
    backward = (4 * x + 8 * y) + n * 8 * y + 20 * y + n * 26 * y + cp * 16 * y + cp * 10 * x + (6 * x + 12 * y)
    return float(forward), float(backward)


@dataclass(frozen=True)
class ContextPlan:
    """A CP layout with its prediction.

    Attributes:
        cp: context-parallel size; comm: `--cp-comm-type`.
        base: the plain plan of the reduced problem (its layout's dp is dp x cp).
        extra_s: seconds CP adds to the step (attention + exposed transfers on the critical path).
        total_s: the step.
        tokens_per_s: global batch x sequence / step.
        mfu: model FLOPs (of the unreduced workload) per GPU per second / peak.
        memory_gb: the fullest rank's device memory (the reduced plan's + the ring's buffers).
        cost: what CP adds to one layer and micro-batch (None at cp 1).
        passes: layers x micro-batch passes on the critical path, (m + (pp - 1)/v) x the busiest rank's layers:
            extra_s = passes x cost.added.
    """

    cp: int
    comm: CommType
    base: Plan
    extra_s: float
    total_s: float
    tokens_per_s: float
    mfu: float
    memory_gb: float
    cost: CPCost | None = None
    passes: float = 0.0

    @property
    def seconds(self) -> float:
        """The step, as Plan.seconds: the reduced plan's (an MoE model's experts included) + CP's terms."""
        return self.total_s

    @property
    def world(self) -> int:
        """Ranks: tp x pp x dp x cp (the reduced layout's world)."""
        return self.base.layout.world

    @property
    def ring_bytes(self) -> float:
        """The ring's buffers held in a layer's backward (CPCost.buffer_bytes), in memory_gb beside the reduced
        plan's peak."""
        return self.cost.buffer_bytes if self.cost is not None else 0.0

    @property
    def hidden_s(self) -> float:
        """Seconds of CP transfers hidden under the ring steps' compute (transfer - exposed, over the step)."""
        return self.passes * (self.cost.transfer - self.cost.exposed) if self.cost is not None else 0.0

    def cp_terms(self) -> tuple[tuple[str, float], ...]:
        """CP's part of the step by CP_TERMS (they add up to extra_s)."""
        c = self.cost or CPCost(0.0, 0.0, 0.0, 0.0)
        return (("cp_attention", self.passes * c.attention), ("cp_exchange", self.passes * c.exposed),
                ("cp_merge", self.passes * c.merge))

    def terms(self) -> tuple[tuple[str, float], ...]:
        """The step's terms in --explain's order: the reduced plan's (time.TERMS: a rank's own work at s/c
        tokens) with CP's after its attention; they add up to base.time.total + extra_s (the step less an MoE
        model's expert seconds, as StepTime.terms)."""
        out: list[tuple[str, float]] = []
        for name, seconds in self.base.time.terms:
            out.append((name, seconds))
            if name == "attention":
                out += self.cp_terms()
        return tuple(out)

    @property
    def layout(self) -> Layout:
        """The layout with the true dp (the base plan's dp is dp x cp)."""
        return replace(self.base.layout, dp=self.base.layout.dp // self.cp)

    def short(self) -> str:
        ep = moe.layout_suffix(self.base.experts)  # an MoE model: the EP (and expert-TP) the reduced plan chose
        return (f"{self.layout.short()} cp{self.cp} {self.comm.value}" if self.cp > 1 else self.layout.short()) + ep


def with_cp(work: Workload, cluster: Cluster, base: Plan, cp: int, comm: CommType) -> ContextPlan:
    """A reduced problem's plan, completed with CP's attention and transfers."""
    layout = base.layout  # reduced: dp x cp
    if cp == 1:
        cost, passes, extra, buffers = None, 0.0, 0.0, 0.0
    else:
        cost = layer_cost(work, cluster, layout, cp, comm)
        # rank r's chunks: layout.rank_stages(r)
        stages = stage_layers(work.model, layout.pp, layout.v, work.seq_length, work.pipeline_split)
        layers = max(sum(stages[s] for s in layout.rank_stages(r)) for r in range(layout.pp))
        m = work.global_batch // (layout.dp // cp * layout.micro_batch)
        passes = (m + (layout.pp - 1) / layout.v) * layers
        extra = passes * cost.added
        buffers = cost.buffer_bytes
    total = base.seconds + extra  # an MoE model's expert terms (base.experts) included
    experts = base.experts.extra_bytes if base.experts is not None else 0.0
    return ContextPlan(cp=cp, comm=comm, base=base, extra_s=extra, total_s=total,
                       tokens_per_s=work.global_batch * work.seq_length / total,
                       mfu=model_flops(work) / (cluster.gpus * total) / (cluster.hw.peak_tflops * 1e12),
                       memory_gb=(base.memory.peak.total + experts + buffers) / 1e9, cost=cost, passes=passes)


def evaluate_cp(work: Workload, cluster: Cluster, layout: Layout, cp: int = 1,
                comm: CommType = CommType.P2P, space: SearchSpace = SearchSpace()) -> ContextPlan:
    """Predict one CP layout (`layout.dp` is the true dp: world = tp cp pp dp); `space` pins an MoE model's EP
    and expert-TP (SearchSpace.expert_parallel, expert_tensor_parallel), else the fastest that fits."""
    reduced_work, reduced = reduce(work, layout, cp)
    return with_cp(work, cluster, evaluate(reduced_work, cluster, reduced, space=space), cp, comm)


def search_cp(work: Workload, cluster: Cluster, space: SearchSpace = SearchSpace(), cps: tuple[int, ...] = (1,),
              comms: tuple[CommType, ...] = (CommType.P2P,), top: int = 5,
              rejected: list[Rejection] | None = None) -> list[ContextPlan]:
    """The `top` fastest layouts over CP sizes and comm types too: each CP size searches its reduced problem
    with the plain planner (hybrid/planner/search.py) and completes the best plans with CP's costs. A CP size
    the sequence or the GPUs cannot take, or a2a beyond the kv-heads, is skipped. `rejected`, when given, collects
    why: a skipped size, and each reduced search's rejections (named by their CP size: the reduced layout's dp is
    dp x cp)."""
    out: list[ContextPlan] = []
    for cp in cps:
        if work.seq_length % (2 * cp) or cluster.gpus % cp:
            if rejected is not None:
                rejected.append(Rejection(f"cp {cp}", _skipped(work, cluster, cp)))
            continue
        reduced, rspace = (replace(work, global_batch=work.global_batch * cp, seq_length=work.seq_length // cp),
                           _reduced_space(space, cp, cluster.gpus))
        if rspace.tp == ():  # a pinned tp whose tp x cp ranks do not divide the GPUs
            if rejected is not None:
                rejected.append(Rejection(f"cp {cp}", f"tp {space.tp[0]} x cp {cp} does not divide {cluster.gpus} "
                                                      f"GPUs"))
            continue
        result = search(reduced, cluster, rspace, top=top * SEARCH_MARGIN)
        if rejected is not None:
            rejected.extend(Rejection(f"cp {cp}'s reduced {r.what}" if cp > 1 else r.what, r.reason)
                            for r in result.rejected)
        for comm in (comms if cp > 1 else (CommType.P2P,)):
            for plan in result.plans:
                if plan.layout.dp % cp or (comm is CommType.A2A and not _ulysses_fits(work, plan.layout.tp, cp)):
                    continue  # a reduced dp that is no multiple of cp is not a CP layout
                out.append(with_cp(work, cluster, plan, cp, comm))
    out.sort(key=lambda p: p.total_s)
    return out[:top]


def _skipped(work: Workload, cluster: Cluster, cp: int) -> str:
    """Why search_cp skips a CP size, as a Rejection's reason."""
    if cluster.gpus % cp:
        return f"cp {cp} does not divide {cluster.gpus} GPUs (the GPUs split into CP groups of that size)"
    return (f"--seq-length {work.seq_length} is not divisible by 2 x cp = {2 * cp} (the load-balanced chunks of "
            f"s / 2c tokens)")


def parse_sizes(text: str) -> tuple[int, ...]:
    """`hybrid plan --context-parallel-size 1,2,4,8`: the CP sizes to search (one pins it); ValueError naming the
    flag."""
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or any(c < 1 for c in sizes):
        raise ValueError(f"--context-parallel-size {text!r}: give one or more comma-separated positive sizes, "
                         f"e.g. 1,2,4,8")
    return tuple(sorted(set(sizes)))


def report(work: Workload, cluster: Cluster, plans: list[ContextPlan], host_baseline: float | None = None) -> str:
    """`hybrid plan --context-parallel-size ...`: the fastest layouts over CP sizes and comm types, with what CP
    adds to each step (its extra attention blocks and exposed transfers) and the fullest rank's memory. On a CPU
    (host_baseline: this process's resident bytes, cli._baseline) the memory is the plain table's "RSS MiB" -- the
    rank's tensors without the GPU reserve, plus the process, as train.py's log line measures it -- not GB."""
    width = max(len(p.short()) for p in plans)
    lines = [f"global batch {work.global_batch} x {work.seq_length} tokens on {cluster.gpus} x {cluster.hw.name}; "
             f"context parallelism searched (hybrid/planner/context.py; docs/context-parallel.md)",
             header(width, host_baseline is not None)]
    lines += [row(i + 1, p, width, host_baseline) for i, p in enumerate(plans)]
    return "\n".join(lines + [legend(host_baseline)])


def header(width: int, host: bool) -> str:
    """The CP table's column heads (report; `--scan-gpus` prints them after its GPUs column)."""
    mem = "RSS MiB" if host else "mem GB"
    return f"{'#':>2}  {'layout':<{width}} {mem:>7} {'step s':>8} {'CP s':>8} {'tokens/s':>10} {'MFU':>6}"


def row(i: int, plan: ContextPlan, width: int, host_baseline: float | None) -> str:
    """One plan's line of the CP table, numbered i."""
    return (f"{i:>2}  {plan.short():<{width}} {_memory(plan, host_baseline)} {plan.total_s:>8.4g} "
            f"{plan.extra_s:>8.4g} {plan.tokens_per_s:>10.4g} {100 * plan.mfu:>5.1f}%")


def legend(host_baseline: float | None) -> str:
    """What the CP table's CP s and memory columns are."""
    what = ("mem GB: the fullest rank, the ring's buffers included" if host_baseline is None else
            f"RSS MiB: the fullest rank's peak resident memory as train.py's log line measures it: its tensors, the "
            f"ring's buffers included, + {host_baseline / 2**20:,.0f} MiB, this process's size now")
    return (f"CP s: seconds CP adds to the step (attention over the other ranks' keys + exposed CP transfers); "
            f"{what}")


def _memory(plan: ContextPlan, host_baseline: float | None) -> str:
    """The memory column: GB of the device (the 2 GB reserve in the workspace), or a host's RSS MiB."""
    if host_baseline is None:
        return f"{plan.memory_gb:>7.1f}"
    return f"{(plan.memory_gb * 1e9 - plan.base.memory.peak.workspace + host_baseline) / 2**20:>7,.0f}"


def _reduced_space(space: SearchSpace, cp: int, gpus: int) -> SearchSpace:
    """The space of the reduced problem: tp x pp must leave dp x cp with cp dividing it (a pinned tp too: an
    empty tp when tp x cp does not divide the GPUs, which search_cp skips)."""
    return space if cp == 1 else replace(space, tp=tuple(t for t in (space.tp or range(1, gpus + 1))
                                                         if gpus % (t * cp) == 0))


def _ulysses_fits(work: Workload, tp: int, cp: int) -> bool:
    cfg = work.model
    kv = cfg.num_kv_heads // tp if cfg.num_kv_heads % tp == 0 else 1
    return (cfg.num_heads // tp) % cp == 0 and kv % cp == 0


def attention_memory_per_rank(work: Workload, layout: Layout, cp: int) -> float:
    """Bytes one rank keeps for attention's backward per layer and micro-batch under flash attention (q, k, v,
    out and the fp32 log-sum-exp of its s/c tokens): falls as 1/c."""
    shard = work.shard(layout.tp)
    b, s, nb = layout.micro_batch, work.seq_length // cp, work.precision.activation_bytes
    return b * s * (nb * (2 * shard.q_width + 2 * shard.kv_width) + 4 * shard.q_width // work.model.head_dim)


# --- a published long-context run -----------------------------------------------------------------------
LLAMA3_131K_SOURCE = "Llama 3 Herd of Models (arXiv 2407.21783) Table 4, third row"
LLAMA3_131K_PUBLISHED_TFLOPS = 380.0  # BF16 MFU 38 % of 989; the paper's FLOP count is not stated


def llama3_405b_131k() -> tuple[Workload, Cluster, SearchSpace, int]:
    """Llama 3 405B's long-context stage: 16,384 H100, TP 8, CP 16, PP 16, DP 8, sequence 131,072, 16 sequences
    per DP rank (128 a step, 16M tokens); flash attention assumed (bf16-flash profile), as for the 8k rows of
    hybrid/planner/published.py. Returns (workload, cluster, the published sizes, cp)."""
    from hybrid.planner.hardware import hardware
    from hybrid.planner.layout import Offload
    from hybrid.planner.model import ActivationProfile
    from hybrid.planner.published import llama3_405b
    cfg = replace(llama3_405b(), max_position_embeddings=131072)
    from hybrid.planner.ops import KernelProfile
    work = Workload(cfg, global_batch=128, seq_length=131072, activations=ActivationProfile.BF16_FLASH,
                    kernels=KernelProfile.FUSED, fp32_grads=False)  # Meta's stack, fused, as published.py's 8k rows
    return work, Cluster(gpus=16384, hw=hardware("h100-80g")), SearchSpace(tp=(8,), pp=(16,), offload=(Offload.NONE,)), 16
