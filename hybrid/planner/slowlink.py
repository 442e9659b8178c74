"""Training over a slow link between sites: the DP bytes and the step time of each communication method.

The methods are what the runtime runs (docs/comm-efficient.md, docs/diloco.md):

    synchronous   the ZeRO engine's collectives (stage 0 all-reduce, 1-2 reduce-scatter + all-gather, ...)
    powersgd      rank-r factors of each gradient matrix: r (n + m) numbers per matrix, 1-D and small tensors whole
    onebit        1-bit Adam after the freeze: momentum signs + one fp32 scale per chunk, twice (onebit.py); at
                  ZeRO 1-2 (server chunk = ZeRO shard) also the all-gather of the updated parameters, and once, at
                  the freeze step, of the momentum (4 bytes an element: each worker's whole momentum)
    diloco        the replicas' parameter deltas (fp32 master) all-reduced every H steps, ZeRO inside a replica
    streaming     Streaming DiLoCo: one of K fragments every H / K steps (the same bytes over a round)

**Bytes** (`run_ledger`, `steady_ledger`): per rank of pipeline rank `pp_rank`, in the runtime's ledger convention
(hybrid/comm.py: nccl-tests' size S), keyed "op@group" ("dp": the gradient traffic a SimulatedLink counts,
hybrid/compress/link.py; "diloco": the outer sync). They come from the planner's model of the rank's parameters
(`param_shapes`, `predicted_comm.zero_units`), never from the runtime's objects; tests/test_planner_slowlink.py
checks them against the ledger of real runs, byte for byte.

**The link** (`SlowLink`). The DP replicas are split evenly over `sites` sites (2); inside a site the DP traffic
runs on the node links as the planner prices it (a group of dp / sites ranks), between sites on one link of
`gbps` GB/s per direction with `latency_s` a message, shared by every DP group of the job (tp x pp of them run
their collectives at once). A collective is hierarchical: reduce inside the site, exchange across, spread inside.
The bytes crossing per direction, for one DP group with S its ledger size and n its ranks:

    all-reduce  S        (each site's partial sums, once: a reduce-scatter in the site, the shards across)
    all-gather  S / 2    (each site fetches the other's half; reduce-scatter alike)
    all-to-all  n S / 4  (each of the n / 2 ranks of a site sends the half of its S bound for the other site)

and each call waits `latency_s` once per cross-site phase (an all-reduce two: reduce-scatter and all-gather).
Link time = (calls x phases x latency) + (bytes of every group) / gbps.

**Step time** (`predict`): the planner's step (time.py) without its DP term, plus the method's DP traffic inside
the sites (planner's collective model over dp / sites ranks) and across them, plus the compressor's own work:
PowerSGD's three matmuls per matrix on the planner's GEMM curve, its orthogonalisation and error-feedback passes
as memory-bound bytes; 1-bit Adam's sign packing and error feedback as memory-bound bytes; DiLoCo's outer step
(delta, Nesterov SGD, copy) as memory-bound bytes every H steps. Nothing of the cross-site traffic is overlapped,
because the runtime overlaps none of it: PowerSGD reduces after the backward, 1-bit Adam inside the optimizer
step, DiLoCo's outer sync blocks -- except Streaming DiLoCo's overlap (`--diloco-fragment-sync-delay` tau > 0,
hybrid/diloco/outer.py): a fragment's all-reduce is posted after its step and applied tau inner steps later, the
inner steps running meanwhile, so of each fragment's sync only

    exposed = max(0, t_fragment - tau x t_inner)

is on the step (`overlapped_seconds`; t_fragment: the fragment's link time, latencies included; t_inner: the
planner's step without its DP term plus the replica's own DP traffic inside the site). The synchronous
all-reduce the engine posts from backward hooks could hide under the backward; the planner prices ZeRO 0-1's
gradient sync exposed, and so does this. Before PowerSGD's start iteration and 1-bit Adam's freeze the traffic is
synchronous: the table is the steady state after them.
"""

from __future__ import annotations

import enum
import math
import textwrap
from collections import Counter
from dataclasses import dataclass, replace

from hybrid.cliutil import check_number, is_integer
from hybrid.compress.volume import PowerSGDConfig, matrix_rank, padded_length
from hybrid.planner.hardware import GB, Collective, Gemm, GroupPlacement, Hardware, collective_seconds
from hybrid.planner.layout import Cluster, Layout, Workload, ZeroStage, dp_placement, stage_layers
from hybrid.planner.predicted_comm import zero_ledger, zero_units
from hybrid.planner.time import _context

MASTER_BYTES = 4  # DiLoCo syncs the fp32 master weights (hybrid/diloco/outer.py)
SITES = 2
# memory-bound passes over the data, counted from the runtime's code (each pass: one read or one write of a tensor)
POWERSGD_PASSES = 10  # + e (r r w), clone M' (r w), e = M' - M~ (r r w), x n (r w): 10 passes over the bucket
ONEBIT_PASSES = 14  # worker: + e (3), norm (1), sign bits (2), pack (1), decompress (1), e = x - C(x) (3); final
# decompress + copy out (3); the server's 11 over len / n are added separately
ONEBIT_SERVER_PASSES = 11
DILOCO_PASSES = 15  # delta = theta - theta_r (3), cat + div (4), Nesterov SGD with momentum (6), copy back (2)
PAYS = 1.05  # a speed-up above this "pays"; below 1 / PAYS it "does not pay"; between, "about even"


class Method(enum.Enum):
    """How the DP replicas exchange what they learned."""

    SYNC = "synchronous"
    POWERSGD = "powersgd"
    ONEBIT = "1-bit adam"
    DILOCO = "diloco"
    STREAMING = "streaming diloco"


@dataclass(frozen=True)
class MethodConfig:
    """One method with its settings, named by train.py's flags.

    Attributes:
        method: which one.
        powersgd_rank: r (`--powersgd-rank`).
        powersgd_start_iter: plain steps before compressing (`--powersgd-start-iter`).
        onebit_freeze_iters: Adam steps before the momentum is sent as signs (`--onebit-freeze-iters`).
        inner_steps: DiLoCo's H (`--diloco-inner-steps`).
        fragments: Streaming DiLoCo's K (`--diloco-fragments`; 1 for plain DiLoCo).
        replicas: DiLoCo's R (`--diloco-replicas`); None: dp (every DP rank its own replica).
        fragment_sync_delay: DiLoCo's tau (`--diloco-fragment-sync-delay`): inner steps a fragment's outer sync
            runs under before it must land; 0: the sync blocks. 0 <= tau < H / K, as the runtime requires.
    """

    method: Method
    powersgd_rank: int = 4
    powersgd_start_iter: int = 2
    onebit_freeze_iters: int = 100
    inner_steps: int = 100
    fragments: int = 1
    replicas: int | None = None
    fragment_sync_delay: int = 0

    def __post_init__(self) -> None:
        for flag, value in (("--powersgd-rank", self.powersgd_rank), ("--diloco-inner-steps", self.inner_steps),
                            ("--diloco-fragments", self.fragments), ("--onebit-freeze-iters",
                                                                      self.onebit_freeze_iters)):
            check_number(flag, value, 1, integer=True)
        check_number("--powersgd-start-iter", self.powersgd_start_iter, 0, integer=True)
        if self.replicas is not None:
            check_number("--diloco-replicas", self.replicas, 1, integer=True)
        if self.inner_steps % self.fragments:
            raise ValueError(f"--diloco-fragments {self.fragments} must divide --diloco-inner-steps "
                             f"{self.inner_steps}")
        tau, per = self.fragment_sync_delay, self.inner_steps // self.fragments
        if not is_integer(tau) or not 0 <= tau < per:
            raise ValueError(f"--diloco-fragment-sync-delay must be an integer in [0, H / K) = [0, {per}) "
                             f"(one fragment in flight at a time, as the runtime), got {tau!r}")
        if tau and self.method not in (Method.DILOCO, Method.STREAMING):
            raise ValueError(f"--diloco-fragment-sync-delay applies to DiLoCo, not {self.method.value}")

    @property
    def label(self) -> str:
        m = self.method
        if m is Method.POWERSGD:
            return f"powersgd r {self.powersgd_rank}"
        tau = f" tau {self.fragment_sync_delay}" if self.fragment_sync_delay else ""
        if m is Method.DILOCO:
            return f"diloco H {self.inner_steps}{tau}"
        if m is Method.STREAMING:
            return f"streaming H {self.inner_steps} K {self.fragments}{tau}"
        return m.value

    def zero_stages(self) -> tuple[ZeroStage, ...]:
        """The ZeRO stages the runtime runs it with (hybrid/compress/args.py, hybrid/diloco/args.py: DiLoCo at every
        stage since round 16)."""
        if self.method in (Method.SYNC, Method.DILOCO, Method.STREAMING):
            return tuple(ZeroStage)
        return (ZeroStage.NONE, ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS)


@dataclass(frozen=True)
class SlowLink:
    """The link between sites (`--inter-dc-bandwidth`, `--inter-dc-latency`, or the hardware profile's
    `inter_dc_gbps` / `inter_dc_latency_s`).

    Attributes:
        gbps: GB/s (1e9 bytes/s) per direction between two sites, shared by all the job's traffic across them.
        latency_s: seconds one message takes to cross (the one-way latency), >= 0.
        sites: sites the DP replicas are split over, evenly (2).
    """

    gbps: float
    latency_s: float = 0.0
    sites: int = SITES

    def __post_init__(self) -> None:
        check_number("--inter-dc-bandwidth", self.gbps, 0, low_open=True, note=" (GB/s between the sites)")
        check_number("--inter-dc-latency", self.latency_s, 0, note=" (milliseconds)", show=_as_ms)
        if self.sites != SITES:
            raise ValueError(f"SlowLink.sites: only {SITES} sites are modelled, got {self.sites!r}")


def _as_ms(seconds) -> str:
    """A latency in seconds as the flag gives it, milliseconds (a value of another type as it is)."""
    return repr(seconds * 1e3) if isinstance(seconds, float) or is_integer(seconds) else repr(seconds)


# --- the rank's parameters, from the model (not from the runtime) -------------------------------------------------
def layer_shapes(work: Workload, tp: int) -> list[tuple[int, ...]]:
    """One Transformer block's parameter shapes on a TP rank: norms, q k v o (and biases), the MLP's matrices."""
    cfg, shard, h = work.model, work.shard(tp), work.model.hidden_size
    norm = [(h,), (h,)] if shard.is_gpt2 else [(h,)]
    q, kv, f = shard.q_width, shard.kv_width, shard.ffn_width
    attn = [(q, h)] + [(q,)] * cfg.qkv_bias + ([(kv, h)] + [(kv,)] * cfg.qkv_bias) * 2
    attn += [(h, q)] + [(h,)] * cfg.out_bias
    ups = shard.mlp_matrices - 1  # c_fc; gate and up
    mlp = ([(f, h)] + [(f,)] * cfg.mlp_bias) * ups + [(h, f)] + [(h,)] * cfg.mlp_bias
    return norm + attn + norm + mlp


def param_shapes(work: Workload, layout: Layout, pp_rank: int) -> list[tuple[int, ...]]:
    """Every parameter this rank holds, as the model builds it (models/): per chunk the embedding table (and
    GPT-2's positions) on the first stage, the blocks, the final norm and the LM head on the last (a tied head
    is the table itself on a one-stage model, a copy on the last stage otherwise)."""
    cfg, shard, h = work.model, work.shard(layout.tp), work.model.hidden_size
    layers = stage_layers(cfg, layout.pp, layout.v, work.seq_length, work.pipeline_split)
    table = (shard.vocab // shard.t, h)
    shapes: list[tuple[int, ...]] = []
    for c in range(layout.v):
        stage = c * layout.pp + pp_rank
        first, last = stage == 0, stage == layout.pp * layout.v - 1
        if first:
            shapes += [table] + ([(cfg.max_position_embeddings, h)] if shard.is_gpt2 else [])
        shapes += layer_shapes(work, layout.tp) * layers[stage]
        if last:
            shapes += [(h,), (h,)] if shard.is_gpt2 else [(h,)]
            if not (cfg.tie_embeddings and first):
                shapes.append(table)
    return shapes


# --- bytes ----------------------------------------------------------------------------------------------------------
Bytes = dict[str, float]  # "op@group" -> bytes (the ledger's size S summed over calls)


def _dp_only(ledger: dict[str, dict[str, float]]) -> Bytes:
    return {k: v["bytes"] for k, v in ledger.items() if k.endswith("@dp") and v["bytes"]}


def _add(*parts: Bytes, times: float = 1) -> Bytes:
    out: Counter[str] = Counter()
    for p in parts:
        for k, v in p.items():
            out[k] += times * v
    return {k: (int(v) if float(v).is_integer() else v) for k, v in out.items() if v}


def _inner(layout: Layout, method: MethodConfig) -> int:
    """The DP group a step's gradient traffic runs over: dp, or a DiLoCo replica's dp / R ranks."""
    if method.method in (Method.DILOCO, Method.STREAMING):
        return layout.dp // (method.replicas or layout.dp)
    return layout.dp


def sync_bytes(work: Workload, layout: Layout, pp_rank: int, dp: int | None = None,
               per_micro_batch: bool = True) -> Bytes:
    """One synchronous step's DP bytes (the engine's collectives by ZeRO stage), over `dp` ranks (None: the
    layout's); per_micro_batch False: ZeRO 2 reduce-scatters once a step (a compressor before it starts)."""
    dp = layout.dp if dp is None else dp
    m = work.num_microbatches(layout) if per_micro_batch else 1
    units = zero_units(work, layout, pp_rank)
    return _dp_only(zero_ledger(units, layout.zero, dp, layout.tp, m, work.grad_bytes, work.precision.param_bytes))


def powersgd_bytes(work: Workload, layout: Layout, pp_rank: int, rank: int) -> Bytes:
    """A compressed step: r (n + m) numbers per compressed matrix (P then Q) and the whole tensors, all-reduced
    in the gradient dtype; at ZeRO 1-2 the engine's all-gather of the updated parameters as before."""
    cfg = PowerSGDConfig(rank=rank)
    numbers = 0
    for shape in param_shapes(work, layout, pp_rank):
        r = matrix_rank(shape, cfg)
        numbers += r * (shape[0] + math.prod(shape) // shape[0]) if r else math.prod(shape)
    if layout.dp <= 1:
        return {}
    gathers = {k: v for k, v in sync_bytes(work, layout, pp_rank, per_micro_batch=False).items()
               if k.startswith("all_gather")}
    return _add({"all_reduce@dp": numbers * work.grad_bytes}, gathers)


def onebit_lengths(work: Workload, layout: Layout, pp_rank: int) -> list[int]:
    """Each unit padded to a multiple of 8 n: the compressed all-reduce's buffer, and at ZeRO 1-2 the engine's
    unit too (OneBitAdamReduction.shard_align: server chunk k = ZeRO shard k)."""
    return [padded_length(u.numel, layout.dp) for u in zero_units(work, layout, pp_rank)]


def onebit_bytes(work: Workload, layout: Layout, pp_rank: int, freeze_step: bool = False) -> Bytes:
    """A step after the freeze: no gradient traffic; each unit's momentum (padded to L, a multiple of 8 n) sent as
    signs twice (all-to-all, then all-gather: L / 8 each) with 2 n fp32 scales (all-gathers). At ZeRO 1-2 also the
    engine's all-gather of the updated parameters (b L, b the parameter bytes) and, at the freeze step only
    (`freeze_step`), the all-gather that makes each worker's momentum whole (fp32: 4 L; OneBitAdamReduction._whole)."""
    n = layout.dp
    if n <= 1:
        return {}
    lengths = onebit_lengths(work, layout, pp_rank)
    signs = sum(length // 8 for length in lengths)
    gathers = signs + 8 * n * len(lengths)
    if layout.zero in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS):
        gathers += (work.precision.param_bytes + (4 if freeze_step else 0)) * sum(lengths)
    return {"all_to_all@dp": signs, "all_gather@dp": gathers}


def onebit_warmup_bytes(work: Workload, layout: Layout, pp_rank: int) -> Bytes:
    """A step before the freeze: ZeRO (0-2) AdamW's collectives, the gradient reduced once a step (ZeRO 2 too: the
    reduction is not per micro-batch) and, at ZeRO 1-2, the units padded as `onebit_lengths`."""
    if layout.zero is ZeroStage.NONE or layout.dp <= 1:
        return sync_bytes(work, layout, pp_rank, per_micro_batch=False)
    total = sum(onebit_lengths(work, layout, pp_rank))
    return {"reduce_scatter@dp": work.grad_bytes * total, "all_gather@dp": work.precision.param_bytes * total}


def diloco_shard_numel(work: Workload, layout: Layout, pp_rank: int, inner: int) -> int:
    """Master elements on inner rank 0 of a replica of `inner` ranks: every unit's (ZeRO 0), else its shard (the
    unit padded to a multiple of `inner`, rank 0's slice, the padding not a parameter)."""
    total = 0
    for u in zero_units(work, layout, pp_rank):
        if layout.zero is ZeroStage.NONE or inner == 1:
            total += u.numel
        else:
            total += min(u.numel, -(-u.numel // inner))
    return total


def steady_bytes(work: Workload, layout: Layout, method: MethodConfig, pp_rank: int) -> Bytes:
    """DP bytes per step after the warm-up (PowerSGD's start, 1-bit Adam's freeze); DiLoCo: the average over a
    round of H steps (its outer sync / H, plus the replica's own synchronous traffic every step)."""
    m = method.method
    if m is Method.SYNC:
        return sync_bytes(work, layout, pp_rank)
    if m is Method.POWERSGD:
        return powersgd_bytes(work, layout, pp_rank, method.powersgd_rank)
    if m is Method.ONEBIT:
        return onebit_bytes(work, layout, pp_rank)
    replicas = method.replicas or layout.dp
    inner = _inner(layout, method)
    outer = MASTER_BYTES * diloco_shard_numel(work, layout, pp_rank, inner) if replicas > 1 else 0
    step = sync_bytes(work, layout, pp_rank, dp=inner)
    # after each step with a sync the engine rebuilds the parameters from the master (ZeRO 1-2: an all-gather in
    # the replica, hybrid/diloco/outer.py's sync_params_from_master): K of them per H steps
    gathers = {k: v for k, v in step.items() if k.startswith("all_gather")} \
        if layout.zero in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS) else {}
    return _add(step, _add(gathers, times=method.fragments / method.inner_steps),
                {"all_reduce@diloco": outer / method.inner_steps})


def run_bytes(work: Workload, layout: Layout, method: MethodConfig, pp_rank: int, steps: int) -> Bytes:
    """DP bytes of a run's first `steps` steps, exactly as the ledger counts them: synchronous steps before
    PowerSGD's start iteration or 1-bit Adam's freeze; DiLoCo needs whole rounds (steps a multiple of H: every
    fragment then synced steps / H times)."""
    m = method.method
    if m is Method.POWERSGD:
        plain = min(steps, method.powersgd_start_iter)
        return _add(_add(sync_bytes(work, layout, pp_rank, per_micro_batch=False), times=plain),
                    _add(steady_bytes(work, layout, method, pp_rank), times=steps - plain))
    if m is Method.ONEBIT:  # warm-up, the freeze step (ZeRO 1-2: + the momentum made whole), the steady steps
        warm = min(steps, method.onebit_freeze_iters)
        first = onebit_bytes(work, layout, pp_rank, freeze_step=True) if steps > warm else {}
        return _add(_add(onebit_warmup_bytes(work, layout, pp_rank), times=warm), first,
                    _add(steady_bytes(work, layout, method, pp_rank), times=max(0, steps - warm - 1)))
    if m in (Method.DILOCO, Method.STREAMING) and steps % method.inner_steps:
        raise ValueError(f"run_bytes: {steps} steps are not whole DiLoCo rounds of H {method.inner_steps}")
    return _add(steady_bytes(work, layout, method, pp_rank), times=steps)


# --- time -------------------------------------------------------------------------------------------------------------
CROSS_SHARE = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5}  # x S; all-to-all: n S / 4
CROSS_PHASES = {"all_reduce": 2}  # latencies per call across the sites (others: 1)


@dataclass(frozen=True)
class LinkTime:
    """Seconds of one step's DP traffic.

    Attributes:
        intra: inside the sites, on the node links (the slowest pipeline rank).
        cross: across the sites: latencies + all groups' bytes / bandwidth.
        cross_bytes: bytes crossing per direction per step, all the job's DP groups together.
        exposed: the part of `cross` the step waits for: all of it (`link_time`) but under DiLoCo's overlap
            (`price`: `overlapped_seconds`).
    """

    intra: float
    cross: float
    cross_bytes: float
    exposed: float


def _calls(work: Workload, layout: Layout, method: MethodConfig, pp_rank: int) -> dict[str, float]:
    """Cross-site collective calls per step of each op (for the latency), steady state."""
    units = len(zero_units(work, layout, pp_rank))
    m, z, mb = method.method, layout.zero, work.num_microbatches(layout)
    if m is Method.POWERSGD:  # uncompressed, P, Q per unit; ZeRO 1-2's all-gather per unit
        return {"all_reduce": 3 * units, "all_gather": units if z is not ZeroStage.NONE else 0}
    if m is Method.ONEBIT:  # all-to-all + 3 all-gathers per unit; ZeRO 1-2's parameter all-gather per unit
        return {"all_to_all": units, "all_gather": (3 + (z is not ZeroStage.NONE)) * units}
    if m is Method.SYNC:
        reductions = mb if z >= ZeroStage.GRADIENTS else 1
        gathers = {ZeroStage.NONE: 0, ZeroStage.OPTIMIZER: 1, ZeroStage.GRADIENTS: 1, ZeroStage.PARAMETERS: 2 * mb}[z]
        return {"all_reduce" if z is ZeroStage.NONE else "reduce_scatter": reductions * units,
                "all_gather": gathers * units}
    per_round = method.fragments  # one all-reduce a fragment, every fragment once per H steps
    return {"all_reduce": per_round / method.inner_steps}


def _cross_bytes(key: str, size: float, n: int) -> float:
    op = key.split("@")[0]
    if op == "all_to_all":
        return n * size / 4
    return CROSS_SHARE[op] * size


def link_time(work: Workload, cluster: Cluster, layout: Layout, method: MethodConfig, link: SlowLink) -> LinkTime:
    """One step's DP traffic of `method` (steady state) with the replicas split over the link's sites."""
    hw, sites = cluster.hw, link.sites
    diloco = method.method in (Method.DILOCO, Method.STREAMING)
    inner = _inner(layout, method)
    placed = dp_placement(cluster, layout)
    intra, total, latency = 0.0, 0.0, 0.0
    for pp_rank in range(layout.pp):
        steady = steady_bytes(work, layout, method, pp_rank)
        t_intra = 0.0
        for key, size in steady.items():
            op, group = key.split("@")
            if group == "dp":  # inside the sites: the group's dp / sites ranks (a DiLoCo replica stays in its site)
                local = inner if diloco else inner // sites
                here = GroupPlacement(local, min(local, placed.per_node))
                t_intra += _intra_seconds(hw, op, size, here)
                if not diloco:
                    total += layout.tp * _cross_bytes(key, size, inner)
            else:  # the outer sync: dp / R cross groups per (tp, pp) coordinate, one member per replica
                total += layout.tp * inner * _cross_bytes(key, size, method.replicas or layout.dp)
        intra = max(intra, t_intra)
        calls = _calls(work, layout, method, pp_rank)
        latency = max(latency, sum(c * CROSS_PHASES.get(op, 1) for op, c in calls.items()) * link.latency_s)
    cross = latency + total / (link.gbps * 1e9)
    return LinkTime(intra=intra, cross=cross, cross_bytes=total, exposed=cross)


def overlapped_seconds(cross: float, inner_s: float, method: MethodConfig) -> float:
    """Seconds per step of DiLoCo's outer sync left on the step when each fragment's sync runs under the next tau
    inner steps (`--diloco-fragment-sync-delay`): K / H fragment syncs a step, each t_f = cross H / K on the link,
    each hiding up to tau x inner_s:  K / H x max(0, t_f - tau inner_s). `cross` (link_time's, per step) is all
    outer sync for DiLoCo (its replicas' own traffic stays inside the sites); tau 0: all of it."""
    tau = method.fragment_sync_delay
    if not tau:
        return cross
    per_step = method.fragments / method.inner_steps
    return per_step * max(0.0, cross / per_step - tau * inner_s)


def _intra_seconds(hw: Hardware, op: str, size: float, group: GroupPlacement) -> float:
    """Node-link time of one step's `size` bytes of `op` over `group` (all-to-all: the half that stays in the
    site, priced as an all-gather of S / 2)."""
    if op == "all_to_all":
        return collective_seconds(hw, Collective.ALL_GATHER, size / 2, group)
    return collective_seconds(hw, Collective(op), size, group)


def state_bytes(work: Workload, layout: Layout, method: MethodConfig) -> float:
    """Device bytes the method keeps beyond the planner's model states, on the fullest pipeline rank: PowerSGD's
    error feedback (the gradient, g a parameter) and at ZeRO 2 the full gradient buffer it reduces from (as stage
    1's); 1-bit Adam's worker and server errors (4 bytes a parameter, and 4 / n), at ZeRO 1-2 also the whole
    momentum beyond the planner's shard of it (4 (1 - 1/n)) and at ZeRO 2 the full gradient buffer; DiLoCo's
    last synced weights and outer momentum (4 + 4 bytes a master element of the shard)."""
    worst = 0.0
    for pp_rank in range(layout.pp):
        psi = sum(math.prod(s) for s in param_shapes(work, layout, pp_rank))
        n, g = layout.dp, work.grad_bytes
        if method.method is Method.POWERSGD:
            extra = g * psi + (g * psi * (n - 1) / n if layout.zero is ZeroStage.GRADIENTS else 0.0)
        elif method.method is Method.ONEBIT and layout.zero is ZeroStage.NONE:
            extra = 4 * psi * (1 + 1 / n)
        elif method.method is Method.ONEBIT:  # + the whole momentum over its 4 / n share, the worker and server
            # errors: 4 (1 - 1/n) + 4 + 4 / n = 8; ZeRO 2 also keeps a whole gradient buffer (as stage 1)
            extra = 8 * psi + (g * psi * (n - 1) / n if layout.zero is ZeroStage.GRADIENTS else 0.0)
        elif method.method in (Method.DILOCO, Method.STREAMING):
            extra = 2 * MASTER_BYTES * diloco_shard_numel(work, layout, pp_rank, _inner(layout, method))
        else:
            extra = 0.0
        worst = max(worst, extra)
    return worst


def compress_seconds(work: Workload, cluster: Cluster, layout: Layout, method: MethodConfig) -> float:
    """The compressor's own work per step on the busiest pipeline rank (see the module docstring); its
    memory-bound passes priced as the planner prices every such kernel (ops.py: bytes / bandwidth + kernels x
    overhead, time.py's hbm_seconds and launch_seconds)."""
    hw, gb = cluster.hw, work.grad_bytes
    ctx = _context(work, cluster, layout)

    def _memory_seconds(nbytes: float, kernels: int) -> float:
        return ctx.hbm_seconds(nbytes) + ctx.launch_seconds(kernels)

    worst = 0.0
    for pp_rank in range(layout.pp):
        shapes = param_shapes(work, layout, pp_rank)
        numel = sum(math.prod(s) for s in shapes)
        if method.method is Method.POWERSGD and layout.dp > 1:
            cfg, t = PowerSGDConfig(rank=method.powersgd_rank), 0.0
            for s in shapes:
                r = matrix_rank(s, cfg)
                if r:
                    n, k = s[0], math.prod(s) // s[0]
                    for g in (Gemm(n, r, k), Gemm(k, r, n), Gemm(n, k, r)):  # P = M Q, Q = M^T P, M~ = P Q^T
                        t += hw.gemm_seconds(g, gb)
                    t += _memory_seconds(2 * r * (n + k) * r * gb, 2 * r)  # Gram-Schmidt / QR of P and Q
            t += _memory_seconds(POWERSGD_PASSES * numel * gb, 5)
        elif method.method is Method.ONEBIT and layout.dp > 1:
            t = _memory_seconds((ONEBIT_PASSES + ONEBIT_SERVER_PASSES / layout.dp) * numel * 4, 20)
        elif method.method in (Method.DILOCO, Method.STREAMING) and (method.replicas or layout.dp) > 1:
            inner = _inner(layout, method)
            shard = diloco_shard_numel(work, layout, pp_rank, inner)
            t = _memory_seconds(DILOCO_PASSES * shard * MASTER_BYTES, 10 * method.fragments) / method.inner_steps
        else:
            t = 0.0
        worst = max(worst, t)
    return worst


@dataclass(frozen=True)
class MethodRow:
    """One method's prediction.

    Attributes:
        method: the method and its settings.
        layout: the layout it is priced at (its fastest that fits: `predict`).
        dp_bytes: DP bytes per step of one rank (the largest pipeline rank's; ledger sizes), steady state.
        link: its DP traffic's time.
        compress_s: the compressor's own seconds per step.
        step_s: the predicted step.
        speedup: the synchronous step / this one.
        fits: the layout fits the device memory.
        verdict: one line.
    """

    method: MethodConfig
    layout: Layout
    dp_bytes: float
    link: LinkTime
    compress_s: float
    step_s: float
    speedup: float
    fits: bool
    verdict: str


def check_layout(layout: Layout, method: MethodConfig | None = None) -> None:
    """What the model needs of the layout: an even DP split over the sites, and DiLoCo replicas dividing dp."""
    if layout.dp % SITES:
        raise ValueError(f"--inter-dc-bandwidth: the layout's data-parallel size {layout.dp} does not split over "
                         f"{SITES} sites; plan an even DP size (--gpus, or pin the other dimensions)")
    if method is not None and method.replicas is not None and layout.dp % method.replicas:
        raise ValueError(f"--diloco-replicas {method.replicas} must divide the data-parallel size {layout.dp}")


def price(work: Workload, cluster: Cluster, layout: Layout, method: MethodConfig, link: SlowLink,
          evaluate) -> tuple[LinkTime, float, float, bool]:
    """(its DP traffic's time, the compressor's seconds, the step, whether it fits the device with the method's
    own state, `state_bytes`) of one method at one layout. The step: the planner's without its DP term, the DP
    traffic inside the sites, the exposed link time and the compressor's work. `evaluate` is the planner's
    (search.evaluate), passed in so that this module stays apart from the search."""
    check_layout(layout, method)
    plan = evaluate(work, cluster, layout)
    local = plan.time.total - plan.time.dp_comm  # the planner's step without its DP term
    lt = link_time(work, cluster, layout, method, link)
    lt = replace(lt, exposed=overlapped_seconds(lt.cross, local + lt.intra, method))
    comp = compress_seconds(work, cluster, layout, method)
    fits = plan.memory_gb * GB + state_bytes(work, layout, method) <= cluster.hw.capacity_bytes
    return lt, comp, local + lt.intra + lt.exposed + comp, fits


def predict(work: Workload, cluster: Cluster, layouts: list[Layout], methods: list[MethodConfig], link: SlowLink,
            evaluate) -> list[MethodRow]:
    """Each method's row at its fastest layout that fits the device: `layouts` (the search's best ones with an
    even DP size) at each ZeRO stage the runtime runs the method with -- over a slow link the stage that moves
    fewer bytes can win. The first method must be synchronous (the speed-ups are over it)."""
    if not methods or methods[0].method is not Method.SYNC:
        raise ValueError("slowlink.predict: the first method must be synchronous (the speed-ups are over it)")
    # an HSDP plan (Layout.dp_replicate) is priced as its ZeRO-over-all twin: these methods replace the DP sync
    layouts = list(dict.fromkeys(replace(layout, dp_replicate=1) for layout in layouts))
    layouts = [layout for layout in layouts if layout.dp % SITES == 0] or layouts[:1]
    check_layout(layouts[0])  # none splits over the sites: say so
    rows: list[MethodRow] = []
    base_s = None
    for method in methods:
        tried = list(dict.fromkeys(replace(layout, zero=z) for layout in layouts for z in method.zero_stages()))
        priced = [(lay, *price(work, cluster, lay, method, link, evaluate)) for lay in tried]
        fitting = [p for p in priced if p[4]] or priced[:1]
        lay, lt, comp, step, fits = min(fitting, key=lambda p: p[3])
        base_s = step if base_s is None else base_s
        per_rank = max(sum(steady_bytes(work, lay, method, r).values()) for r in range(lay.pp))
        rows.append(MethodRow(method, lay, per_rank, lt, comp, step, base_s / step, fits,
                              _verdict(method, lay, base_s / step, fits, lt, step)))
    return rows


def _verdict(method: MethodConfig, lay: Layout, speedup: float, fits: bool, lt: LinkTime, step: float) -> str:
    if not fits:
        stages = "/".join(str(int(z)) for z in method.zero_stages())
        return f"does not fit the device at ZeRO {stages} (the stages the runtime runs it with) in these layouts"
    if method.method is Method.SYNC:
        return f"baseline: the link is {lt.cross / step:.0%} of the step"
    if speedup >= PAYS:
        return f"pays: {speedup:.2f}x the synchronous throughput"
    if speedup > 1 / PAYS:
        return "about even with synchronous"
    return f"does not pay: {1 / speedup:.2f}x slower than synchronous"


def methods_from(powersgd_rank: int, inner_steps: int, fragments: int,
                 fragment_sync_delay: int = 0) -> list[MethodConfig]:
    """The table's methods: synchronous first, then PowerSGD, 1-bit Adam, DiLoCo and Streaming DiLoCo with one
    replica per site (`--diloco-replicas 2`: ZeRO inside the site, only the outer sync crosses); the streaming row
    with the overlap tau (`--diloco-fragment-sync-delay`)."""
    diloco = dict(inner_steps=inner_steps, replicas=SITES)
    return [MethodConfig(Method.SYNC), MethodConfig(Method.POWERSGD, powersgd_rank=powersgd_rank),
            MethodConfig(Method.ONEBIT), MethodConfig(Method.DILOCO, **diloco),
            MethodConfig(Method.STREAMING, fragments=fragments, fragment_sync_delay=fragment_sync_delay, **diloco)]


def table(rows: list[MethodRow], link: SlowLink) -> str:
    """The printed table."""
    head = (f"inter-DC link {link.gbps:g} GB/s ({link.gbps * 8:g} Gbit/s), {link.latency_s * 1e3:g} ms, DP replicas "
            f"over {link.sites} sites:")
    width = max(len(r.layout.short()) for r in rows)
    lines = [head, f"  {'method':<22} {'layout':<{width}} {'DP bytes/step':>13} {'across/step':>12} {'link s':>9} "
                   f"{'step s':>9} {'speed-up':>8}  verdict"]
    for r in rows:
        lines.append(f"  {r.method.label:<22} {r.layout.short():<{width}} {_size(r.dp_bytes):>13} "
                     f"{_size(r.link.cross_bytes):>12} {r.link.cross:>9.4g} {r.step_s:>9.4g} {r.speedup:>7.2f}x  "
                     f"{r.verdict}")
    legend = ("layout: the method's fastest among the search's top layouts, at each ZeRO stage the runtime runs it "
              "with; DP bytes/step: one rank's DP traffic (ledger sizes, its largest pipeline rank; DiLoCo: its "
              "replica's own sync + the outer sync / H); across/step: the bytes all DP groups send over the link per "
              "direction; link s: their time over it (latencies included); step s: the planner's step without its "
              "DP term + the DP traffic inside the sites + link s (with tau: only what tau inner steps do not "
              "hide of each fragment's sync) + the compressor's work. Steady state (after "
              "PowerSGD's start, 1-bit Adam's freeze); compression and local updates change the optimisation too "
              "(docs/comm-efficient.md, docs/diloco.md).")
    lines += textwrap.wrap(legend, 118, initial_indent="  ", subsequent_indent="  ")
    return "\n".join(lines)


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"
