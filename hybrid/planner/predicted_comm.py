"""Predicted communication, in the runtime's ledger convention (hybrid/comm.py: `CommLedger.summary()`),

    {"all_reduce@tp": {"calls": n, "bytes": S}, ...}

with S the nccl-tests size: all_reduce the tensor bytes, all_gather the gathered output, reduce_scatter the full
input. The time model (time.py) prices exactly these entries, so a runtime ledger and the planner's time are
compared on the same numbers.

Tensor parallelism, per micro-batch on a stage holding n layers (Megatron, as tests/test_comm_volume.py
measures on the runtime):

* each layer: 2 all-reduces of b s h elements forward (attention and MLP outputs) and 2 backward (their
  inputs); under SP each becomes an all-gather + reduce-scatter pair of the same size S;
* full recomputation reruns the layer's forward inside the backward, as torch's non-reentrant checkpoint does:
  it stops once the last tensor the backward needs is re-saved (early stop), so the MLP's output collective,
  whose result no op in the layer saves, is not rerun -- 1 more all-reduce per layer (under SP the two
  all-gathers and the attention output's reduce-scatter: 2 + 1), where Megatron's reentrant checkpoint reruns 2;
* first stage, the embedding: forward all-reduce (SP: reduce-scatter; backward all-gather);
* last stage, the LM-head input: backward all-reduce (SP: forward all-gather, backward reduce-scatter), and the
  vocab-parallel cross-entropy: 3 all-reduces of b s fp32 values, forward;
* once per step, one all-reduce of the partial gradients (hybrid.tp.sync_partial_grads): under SP those of the
  parameters applied on sequence shards (norms, row-parallel biases, GPT-2's positions); when t exceeds the
  kv-heads, the replicated key/value projections (full size: every rank adds its head at its own rows).

Data parallelism and ZeRO, by the units hybrid/zero/engine.py communicates (`zero_units`): each chunk's tied
embedding (first and last stage of a tied model) is a unit of its own, reduced once per step after the whole
backward; stage 3 makes one unit per Transformer block plus one of the chunk's other parameters (embedding,
final norm, head); stages 0-2 bucket those into ~25 MiB units. Each unit is padded to a multiple of the DP
size for stages 1-3 (its reduce-scatter and all-gather sizes). Per step (`zero_ledger`, m micro-batches):

    stage 0   all-reduce every unit once
    stage 1   reduce-scatter every unit once, all-gather every unit once (the updated parameters)
    stage 2   reduce-scatter every unit m times (tied: once), all-gather every unit once
    stage 3   reduce-scatter as stage 2, all-gather every unit 2 m times (before its forward and its backward)

and the TP partial-gradient all-reduce runs once per reduction of each unit holding partial gradients (per
micro-batch at stages 2-3). The time model (time.py) prices DP volume by Psi in buckets (the same bytes up to
padding; the tied unit's separate call is one collective latency). Gradient collectives move `Workload.grad_bytes`
an element: 4 with fp32 gradients (`Workload.fp32_grads`: `hybrid plan`'s mixed-precision default, train.py's
--bf16; twice the bytes of bf16 gradients, `--grad-reduce-in-bf16`).

`step_ledger` puts it all together for one pipeline rank and one step -- TP, pipeline send/recv, DP, the
tied-embedding all-reduce -- and tests/test_planner_runtime.py checks it equals the runtime's ledger exactly.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from dataclasses import dataclass

from hybrid.planner.hardware import Collective, GroupPlacement, Hardware, collective_seconds
from hybrid.planner.layout import Layout, Recompute, TpPlan, Workload, ZeroStage, stage_layers
from hybrid.planner.model import ACT_BYTES, Shard

Ledger = dict[str, dict[str, float]]  # "op@group" -> {"calls": n, "bytes": S}

BUCKET_BYTES = 25 * 2**20  # hybrid/dp.py DEFAULT_BUCKET_BYTES
CE_ALL_REDUCES = 3  # vocab-parallel cross-entropy: max, sum of exponentials, target logit
LOSS_BYTES = 4  # the cross-entropy's statistics are fp32


class Message(enum.Enum):
    """Pipeline point-to-point traffic, as hybrid/comm.py records it: by the sender and by the receiver."""

    SEND = "send"
    RECV = "recv"


class _Book:
    """Accumulates (op, group) -> calls, bytes."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()

    def add(self, op: Collective | Message, group: str, size: float, calls: int = 1) -> None:
        if calls <= 0:
            return
        key = f"{op.value}@{group}"
        self.calls[key] += calls
        self.bytes[key] += calls * size

    def ledger(self) -> Ledger:
        return {k: {"calls": self.calls[k], "bytes": _exact(self.bytes[k])} for k in sorted(self.calls)}


def _exact(x: float) -> float | int:
    """Whole byte counts as int, as the runtime's ledger has them."""
    return int(x) if float(x).is_integer() else x


def tp_ledger(shard: Shard, b: int, s: int, layers: int, first: bool, last: bool, sp: bool,
              recompute: Recompute = Recompute.NONE, elem_bytes: int = ACT_BYTES,
              plan: TpPlan = TpPlan.BLOCK, gather_bytes: int | None = None,
              gathered_logits: bool = False) -> dict[str, Ledger]:
    """{"forward": ..., "backward": ...} TP entries of one micro-batch on a stage (empty at t = 1).

    Per layer, with c = tp_gathers(shard, plan) column-parallel inputs (2 under BLOCK) and the 2 row-parallel
    outputs (attention projection, MLP down projection): under SP the forward all-gathers c inputs and
    reduce-scatters 2 outputs, the backward all-gathers the 2 outputs' gradients and reduce-scatters the c
    inputs' gradients; without SP the forward all-reduces the 2 outputs and the backward the c input gradients.
    The recomputed forward (full, early-stopped; selective-op) reruns the c all-gathers (without SP nothing) and
    the attention output's collective. `gather_bytes` (None: `elem_bytes`): bytes an element of a layer's
    all-gathers (Workload.float8_tp_gathers: 1); the edges' collectives keep `elem_bytes`. `gathered_logits`
    (Workload.gathered_logits): the last stage all-gathers the b s V_p logits for a loss on every rank instead of
    the vocab-parallel loss's all-reduces."""
    fwd, bwd = _Book(), _Book()
    if shard.t > 1:
        bsh = b * s * shard.cfg.hidden_size * elem_bytes
        gathered = bsh if gather_bytes is None else b * s * shard.cfg.hidden_size * gather_bytes
        c = tp_gathers(shard, plan)
        if sp:
            fwd.add(Collective.ALL_GATHER, "tp", gathered, c * layers)
            fwd.add(Collective.REDUCE_SCATTER, "tp", bsh, 2 * layers)
            bwd.add(Collective.ALL_GATHER, "tp", gathered, 2 * layers)
            bwd.add(Collective.REDUCE_SCATTER, "tp", bsh, c * layers)
        else:
            fwd.add(Collective.ALL_REDUCE, "tp", bsh, 2 * layers)
            bwd.add(Collective.ALL_REDUCE, "tp", bsh, c * layers)
        if recompute in (Recompute.FULL, Recompute.SELECTIVE_OP):  # the rerun forward, up to the attention
            # output's collective (selective-op reruns o_proj, whose reduced output the MLP's norm reads)
            bwd.add(Collective.ALL_GATHER if sp else Collective.ALL_REDUCE, "tp", gathered if sp else bsh,
                    (c if sp else 1) * layers)
            if sp:
                bwd.add(Collective.REDUCE_SCATTER, "tp", bsh, layers)
        if first:
            fwd.add(Collective.REDUCE_SCATTER if sp else Collective.ALL_REDUCE, "tp", bsh)
            if sp:
                bwd.add(Collective.ALL_GATHER, "tp", bsh)
        if last:
            if gathered_logits:  # the head's output gathered to every rank, the loss on the whole vocabulary
                fwd.add(Collective.ALL_GATHER, "tp", b * s * shard.vocab * elem_bytes)
            else:
                fwd.add(Collective.ALL_REDUCE, "tp", b * s * LOSS_BYTES, CE_ALL_REDUCES)
            if sp:
                fwd.add(Collective.ALL_GATHER, "tp", bsh)
                bwd.add(Collective.REDUCE_SCATTER, "tp", bsh)
            else:
                bwd.add(Collective.ALL_REDUCE, "tp", bsh)
    return {"forward": fwd.ledger(), "backward": bwd.ledger()}


def tp_gathers(shard: Shard, plan: TpPlan = TpPlan.BLOCK) -> int:
    """Collectives a layer's column-parallel inputs take (Workload.tp_plan): 2 under BLOCK (the attention's input
    and the MLP's); under PROJECTION one per column-parallel projection -- q, k and v, and the MLP's up
    projections (SwiGLU: gate and up; GELU: one) -- 5 for a Llama layer, 4 for GPT-2's."""
    if plan is TpPlan.BLOCK:
        return 2
    return 3 + shard.mlp_matrices - 1


def partial_grad_ledger(shard: Shard, layers: int, first: bool, last: bool, sp: bool, grad_bytes: int) -> Ledger:
    """One all-reduce of all the partial gradients (hybrid.tp.sync_partial_grads) of `layers` layers and the
    stage's edges, when there are any (`partial_grad_numel`); the runtime runs one per ZeRO unit that holds
    some (`zero_ledger`), the time model prices this one."""
    numel = partial_grad_numel(shard, layers, first, last, sp)
    book = _Book()
    if shard.t > 1 and numel:
        book.add(Collective.ALL_REDUCE, "tp", numel * grad_bytes)
    return book.ledger()


def partial_grad_numel(shard: Shard, layers: int, first: bool, last: bool, sp: bool) -> int:
    """Elements of the partial gradients -- under SP each layer's norms and row-parallel biases, the final
    norm, GPT-2's positions; when t exceeds the kv-heads, each layer's key and value projections (weights and
    biases) at full size."""
    cfg, h = shard.cfg, shard.cfg.hidden_size
    numel = 0
    if sp:
        numel += layers * shard.layer_replicated_params()
        if first and shard.is_gpt2:
            numel += cfg.max_position_embeddings * h
        if last:
            numel += 2 * h if shard.is_gpt2 else h
    if cfg.num_kv_heads % shard.t:  # kv-heads replicated over t / g ranks: gradients summed over TP
        kv = cfg.num_kv_heads * cfg.head_dim
        numel += layers * 2 * (kv * h + (kv if cfg.qkv_bias else 0))
    return numel if shard.t > 1 else 0


def sp_grad_sync_ledger(shard: Shard, layers: int, first: bool, last: bool, grad_bytes: int) -> Ledger:
    """`partial_grad_ledger` under SP."""
    return partial_grad_ledger(shard, layers, first, last, True, grad_bytes)


def dp_step_ledger(psi: float, zero: ZeroStage, dp: int, grad_bytes: int = 2, param_bytes: int = 2) -> Ledger:
    """DP collectives after the last backward, for a rank holding `psi` parameters (bucketed):
    ZeRO 0 all-reduce of the gradients; ZeRO 1 reduce-scatter of the gradients and all-gather of the updated
    parameters (same wire bytes: the paper's 2 Psi); ZeRO 2 only the all-gather (its gradients were
    reduce-scattered per micro-batch); ZeRO 3 nothing (parameters are gathered where used)."""
    book = _Book()
    if dp > 1:
        grads, params = grad_bytes * psi, param_bytes * psi
        if zero is ZeroStage.NONE:
            _bucketed(book, Collective.ALL_REDUCE, grads)
        if zero is ZeroStage.OPTIMIZER:
            _bucketed(book, Collective.REDUCE_SCATTER, grads)
        if zero in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS):
            _bucketed(book, Collective.ALL_GATHER, params)
    return book.ledger()


def dp_microbatch_ledger(psi: float, zero: ZeroStage, dp: int, grad_bytes: int = 2,
                         param_bytes: int = 2) -> dict[str, Ledger]:
    """DP collectives inside one micro-batch for `psi` parameters: ZeRO 2 reduce-scatters the gradients in the
    backward; ZeRO 3 also all-gathers the parameters in the forward and again in the backward (3 Psi per
    micro-batch, the paper's 3 Psi at m = 1)."""
    fwd, bwd = _Book(), _Book()
    if dp > 1:
        if zero >= ZeroStage.GRADIENTS:
            _bucketed(bwd, Collective.REDUCE_SCATTER, grad_bytes * psi)
        if zero is ZeroStage.PARAMETERS:
            _bucketed(fwd, Collective.ALL_GATHER, param_bytes * psi)
            _bucketed(bwd, Collective.ALL_GATHER, param_bytes * psi)
    return {"forward": fwd.ledger(), "backward": bwd.ledger()}


def hsdp_replicate_ledger(psi: float, shard: int, replicate: int, grad_bytes: int = 2) -> Ledger:
    """HSDP's replica traffic inside one micro-batch's backward for `psi` parameters (Layout.dp_replicate): each
    reduce-scatter over the `shard` ranks of a shard group leaves a rank grad_bytes x psi / shard reduced bytes,
    which it all-reduces over the `replicate` ranks holding the same shard (FSDP1's `_reduce_grad`: all_reduce of
    the new sharded gradient over `_inter_node_pg`; FSDP2's HSDP likewise), bucketed as the shard group's traffic:

        all_reduce@dp_replicate: grad_bytes psi / shard bytes     (nothing at replicate 1)"""
    book = _Book()
    if replicate > 1:
        _bucketed(book, Collective.ALL_REDUCE, grad_bytes * psi / shard, "dp_replicate")
    return book.ledger()


def _bucketed(book: _Book, op: Collective, size: float, group: str = "dp") -> None:
    calls = max(1, math.ceil(size / BUCKET_BYTES))
    book.add(op, group, size / calls, calls)


@dataclass(frozen=True)
class ZeroUnit:
    """One hybrid.zero FlatUnit of a rank.

    Attributes:
        numel: parameters in the unit (before padding).
        deferred: the tied embedding: reduced once per step, after the whole backward (engine.py).
        partial: elements its TP partial-gradient all-reduce carries (full tensors; 0: none).
        lookup: stage 3, an embedding lookup's unit: gathered for the forward only (its backward reads no weight;
            engine.py's Stage3Chunk).
    """

    numel: int
    deferred: bool = False
    partial: int = 0
    lookup: bool = False


def zero_units(work: Workload, layout: Layout, pp_rank: int, bucket_bytes: int = BUCKET_BYTES) -> list[ZeroUnit]:
    """The units ZeroOptimizer builds on pipeline rank `pp_rank`, chunk by chunk. Stages 0-2 bucket a chunk's
    parameters greedily; here into ceil(bytes / bucket_bytes) equal buckets, the partial gradients in as many
    of them as there are layers holding some (exact when a chunk fits one bucket, as in the runtime test)."""
    cfg, shard, h, sp = work.model, work.shard(layout.tp), work.model.hidden_size, layout.sequence_parallel
    pp, v = layout.pp, layout.v
    layers = stage_layers(cfg, pp, v, work.seq_length, work.pipeline_split)
    table = shard.vocab // shard.t * h
    norm = 2 * h if shard.is_gpt2 else h
    positions = cfg.max_position_embeddings * h if shard.is_gpt2 else 0
    layer_partial = partial_grad_numel(shard, 1, False, False, sp)
    units: list[ZeroUnit] = []
    for c in reversed(range(v)):
        stage = layout.rank_stages(pp_rank)[c]  # c pp + r; r or 2 pp - 1 - r under ZBV's V
        first, last, n = stage == 0, stage == pp * v - 1, layers[stage]
        tied = cfg.tie_embeddings and (first or last)
        if tied:
            units.append(ZeroUnit(table, deferred=True))
        root = (positions + (0 if tied else table) if first else 0) + (norm + (0 if tied else table) if last else 0)
        root_partial = partial_grad_numel(shard, 0, first, last, sp)
        if layout.zero is ZeroStage.PARAMETERS:  # the engine's Stage3Chunk: lookups, blocks, the output unit
            # under SP GPT-2's positions are a partial gradient (their lookup unit's), the final norm the output's
            pos_partial = partial_grad_numel(shard, 0, first, False, sp)
            lookups = [(x, p) for x, p in (((0 if tied else table), 0), (positions, pos_partial)) if x] if first else []
            output = norm + (0 if tied else table) if last else 0
            units += [ZeroUnit(x, partial=p, lookup=True) for x, p in lookups]
            units += [ZeroUnit(shard.layer_params(), partial=layer_partial)] * n
            units += [ZeroUnit(output, partial=root_partial - pos_partial)] if output else []
            continue
        rest = n * shard.layer_params() + root
        buckets = max(1, math.ceil(rest * work.grad_bytes / bucket_bytes))  # the runtime buckets gradient bytes
        holders = min(buckets, (n if layer_partial else 0) + (1 if root_partial else 0))
        partial = n * layer_partial + root_partial
        units += [ZeroUnit(rest // buckets + (1 if i < rest % buckets else 0),
                           partial=(partial // holders + (1 if i < partial % holders else 0)) if i < holders else 0)
                  for i in range(buckets)]
    return units


def zero_ledger(units: list[ZeroUnit], zero: ZeroStage, dp: int, t: int, m: int, grad_bytes: int,
                param_bytes: int, replicate: int = 1) -> Ledger:
    """DP (and TP partial-gradient) collectives of one step over `units` (see the module docstring); `dp` the
    ranks ZeRO shards over (Layout.dp_shard). HSDP (`replicate` > 1, ZeRO 3): after each reduce-scatter the
    rank's reduced shard, padded / dp x grad_bytes, is all-reduced over the replicas (all_reduce@dp_replicate)."""
    book = _Book()
    parts = dp if zero >= ZeroStage.OPTIMIZER else 1
    for u in units:
        padded = -(-u.numel // parts) * parts
        reductions = m if zero >= ZeroStage.GRADIENTS and not u.deferred else 1
        if dp > 1:
            if zero is ZeroStage.NONE:
                book.add(Collective.ALL_REDUCE, "dp", u.numel * grad_bytes)
            else:
                book.add(Collective.REDUCE_SCATTER, "dp", padded * grad_bytes, reductions)
                if replicate > 1:
                    book.add(Collective.ALL_REDUCE, "dp_replicate", padded // dp * grad_bytes, reductions)
            if zero in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS):
                book.add(Collective.ALL_GATHER, "dp", padded * param_bytes)
            if zero is ZeroStage.PARAMETERS:  # forward and backward, a lookup's forward only
                book.add(Collective.ALL_GATHER, "dp", padded * param_bytes, m if u.lookup else 2 * m)
        if t > 1 and u.partial and not u.deferred:
            book.add(Collective.ALL_REDUCE, "tp", u.partial * grad_bytes, reductions)
    return book.ledger()


def merge(*ledgers: Ledger, times: int = 1) -> Ledger:
    """Sum of ledgers (each counted `times` times), in the summary's format."""
    book = _Book()
    for ledger in ledgers:
        for key, entry in ledger.items():
            book.calls[key] += times * entry["calls"]
            book.bytes[key] += times * entry["bytes"]
    return book.ledger()


def step_ledger(work: Workload, layout: Layout, pp_rank: int) -> Ledger:
    """Every collective and message one rank of pipeline rank `pp_rank` records in one training step, in
    `CommLedger.summary()`'s format (traffic tagged ":metrics" -- the logged loss -- excluded):

    * TP, per micro-batch and chunk (`tp_ledger`), and the per-step partial-gradient all-reduce;
    * pipeline: each chunk sends its output and receives its input gradient (unless it is the last global
      stage), receives its input and sends its input gradient (unless it is the first): b s h elements, b s h / t
      under SP, one message each, counted as send@pp by the sender and recv@pp by the receiver; chunks on one
      rank (pp = 1) hand over in memory;
    * DP and the TP partial-gradient all-reduces, unit by unit (`zero_units`, `zero_ledger`);
    * tied embeddings, pp > 1: the first and last stage all-reduce the embedding's gradient (V_p/t x h) over
      the embedding group (not under ZBV: both stages are rank 0's, which sums its two copies in memory)."""
    cfg, b, s = work.model, layout.micro_batch, work.seq_length
    pr, shard = work.precision, work.shard(layout.tp)
    m, pp, v = work.num_microbatches(layout), layout.pp, layout.v
    layers = stage_layers(cfg, pp, v, s, work.pipeline_split)
    last_stage = pp * v - 1
    per_mb, pipe = [], _Book()
    message = b * s * cfg.hidden_size * pr.activation_bytes // (layout.tp if layout.sequence_parallel else 1)
    for c in range(v):
        stage = layout.rank_stages(pp_rank)[c]  # c pp + r; r or 2 pp - 1 - r under ZBV's V
        first, last = stage == 0, stage == last_stage
        book = tp_ledger(shard, b, s, layers[stage], first, last, layout.sequence_parallel, layout.recompute,
                         pr.activation_bytes, work.tp_plan, work.tp_gather_bytes, work.gathered_logits)
        per_mb += [book["forward"], book["backward"]]
        if pp > 1:
            # output forward + gradient back, input + its gradient; none across ZBV's turn (pp - 1 to itself)
            hops = sum(0 <= n <= last_stage and layout.stage_rank(n) != pp_rank for n in (stage - 1, stage + 1))
            pipe.add(Message.SEND, "pp", message, m * hops)
            pipe.add(Message.RECV, "pp", message, m * hops)
    units = zero_units(work, layout, pp_rank)
    per_step = [pipe.ledger(), zero_ledger(units, layout.zero, layout.dp_shard, layout.tp, m, work.grad_bytes,
                                           work.param_gather_bytes, layout.dp_replicate)]
    if cfg.tie_embeddings and pp > 1 and layout.stage_rank(last_stage) != 0 and pp_rank in (0, pp - 1):
        tied = _Book()
        tied.add(Collective.ALL_REDUCE, "embedding", shard.vocab // shard.t * cfg.hidden_size * work.grad_bytes)
        per_step.append(tied.ledger())
    return merge(merge(*per_mb, times=m), *per_step)


def ledger_seconds(ledger: Ledger, hw: Hardware, group: GroupPlacement) -> float:
    """Time of every entry on `group`: calls x latency + wire bytes / bus bandwidth (collective_seconds is
    affine in the size, so each entry is priced at its mean size)."""
    total = 0.0
    for key, entry in ledger.items():
        calls = int(entry["calls"])
        if calls:
            op = Collective(key.split("@")[0])
            total += calls * collective_seconds(hw, op, entry["bytes"] / calls, group)
    return total
