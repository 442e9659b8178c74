"""torch's async TP (torchtitan's `--parallelism.enable_async_tensor_parallel`): what its micro-pipelined collectives
cost a layer (issue 26, round 20; docs/planner/round20-async-tp.md).

With async TP on, inductor's post-grad pass (torch/_inductor/fx_passes/micro_pipeline_tp.py, `micro_pipeline_tp_pass`)
rewrites two graph patterns into symmetric-memory ops that split the matmul into tp chunks and move each chunk with
p2p copies on a second stream (torch/distributed/_symmetric_memory/__init__.py):

* `all_gather -> mm` (every mm whose first operand is the gathered tensor) -> `fused_all_gather_matmul`: the local
  chunk's product runs first, each remote shard is copied and then consumed (`_pipelined_multi_all_gather_and_consume`),
  so the copies hide under the products of the other chunks, tp - 1 of them: a collective hides under at most
  (tp - 1) / tp of the products it feeds, not under the pass's GEMMs at large. Before the pipeline each rank copies
  its shard into its symmetric buffer ("mv": 2 x gathered / tp bytes of HBM).
* `mm -> reduce_scatter` (the reduce-scatter's input is the mm's output, nothing else) -> `fused_matmul_reduce_scatter`:
  each remote rank's chunk is produced and pulled (`_pipelined_produce_and_all2all`), the last pull after the last
  product (1 / (tp - 1) of the collective exposed), then one kernel sums the tp stacked partials (bsh read, bsh / tp
  written).

What it does not fuse is what autograd builds in the backward: the gradient of a gathered layer input is the SUM of
the input gradients of the projections that read it (q, k and v; gate and up: torchtitan's block plan),
`add(mm, mm, mm) -> reduce_scatter`, so `_find_producer_matmul` finds no producer and those reduce-scatters stay
NCCL collectives on the critical path, with DTensor's `torch.cat` before each (Workload.sp_copies). An input read
by one projection (TpPlan.PROJECTION; GELU's MLP) reduce-scatters that product's output: fused. The backward's all-gathers (the row-parallel outputs'
gradients) feed the input-gradient products of o and down and are fused.

Megatron's userbuffers (Transformer Engine) are priced by time._tp_overlapped; this module is the PyTorch stack's.
The model is the code's; no constant is fitted here (Hardware.overlap_cost prices a hidden second, as everywhere).
"""

from __future__ import annotations

from dataclasses import dataclass

from hybrid.planner.hardware import Collective, Gemm
from hybrid.planner.layout import Recompute, TpPlan
from hybrid.planner.predicted_comm import _Book, tp_gathers


@dataclass(frozen=True)
class Step:
    """One TP collective of a layer under async TP.

    Attributes:
        op: ALL_GATHER or REDUCE_SCATTER.
        under: the matmuls its fused op splits and runs (empty: not fused, an NCCL collective).
        passname: "forward" or "backward" (the rerun forward belongs to the backward).
    """

    op: Collective
    under: tuple[Gemm, ...]
    passname: str


def schedule(shard, b: int, s: int, recompute: Recompute, plan: TpPlan) -> list[Step]:
    """A layer's TP collectives under async TP and SP, one micro-batch, in predicted_comm.tp_ledger's counts:
    forward c gathers (c = tp_gathers) and 2 reduce-scatters; backward 2 gathers and c reduce-scatters (unfused
    where several projections read the gathered input);
    the rerun forward (FULL, SELECTIVE_OP) c gathers and the attention output's reduce-scatter.

    A rerun gather is fused with the rerun products that read it: all of its group under FULL, the policy's every
    second matmul under SELECTIVE_OP (Shard.selective_op_rerun_gemms); a group none of whose products rerun
    gathers only for the weight gradients (the gathered tensor is the mm's second operand there): not fused."""
    order = shard.linear_gemms_in_order(b, s)  # q, k, v, o, the MLP's up projection(s), down
    cols = list(range(3)) + list(range(4, len(order) - 1))
    groups = [cols[:3], cols[3:]] if plan is TpPlan.BLOCK else [[i] for i in cols]
    if len(groups) != tp_gathers(shard, plan):
        raise AssertionError(f"{len(groups)} column-parallel groups, tp_gathers says {tp_gathers(shard, plan)}")
    o, down = order[3], order[-1]
    ag, rs = Collective.ALL_GATHER, Collective.REDUCE_SCATTER
    steps = [Step(ag, tuple(order[i] for i in g), "forward") for g in groups]
    steps += [Step(rs, (o,), "forward"), Step(rs, (down,), "forward")]
    # the row-parallel outputs' gradients, gathered under their input-gradient products (o's, down's: dY W^T)
    steps += [Step(ag, (o.backward()[0],), "backward"), Step(ag, (down.backward()[0],), "backward")]
    # a gathered input read by several projections: its gradient is add(mm, mm, ...) -> reduce_scatter, not fused;
    # read by one (a projection plan, GELU's MLP): that projection's input-gradient product feeds it, fused
    steps += [Step(rs, () if len(g) > 1 else (order[g[0]].backward()[0],), "backward") for g in groups]
    if recompute in (Recompute.FULL, Recompute.SELECTIVE_OP):
        rerun = set(range(len(order))) if recompute is Recompute.FULL else set(range(1, len(order), 2))
        steps += [Step(ag, tuple(order[i] for i in g if i in rerun), "backward") for g in groups]
        steps.append(Step(rs, (o,), "backward"))
    return steps


def seconds(ctx) -> tuple[float, float]:
    """(forward, backward) seconds of a layer's TP collectives under async TP, one micro-batch (time._layer_cost):
    step_seconds of each step of its schedule."""
    lay = ctx.layout
    total = {"forward": 0.0, "backward": 0.0}
    for step in schedule(ctx.shard, lay.micro_batch, ctx.work.seq_length, lay.recompute, ctx.work.tp_plan):
        total[step.passname] += step_seconds(ctx, step)
    return total["forward"], total["backward"]


def step_seconds(ctx, step: Step) -> float:
    """One collective of c seconds (its NCCL price on the TP group), t = tp. Fused, under products of g seconds
    run in t chunks ((t - 1) more kernels' fixed cost each), k = Hardware.overlap_cost a hidden second:

        all-gather:      max(0, c - g') + k min(c, g') + HBM(2 x gathered / t),                  g' = g (t - 1) / t
        reduce-scatter:  c / (t - 1) + max(0, c' - g') + k min(c', g') + HBM(bsh (1 + 1/t)),  c' = c (t - 2) / (t - 1)

    Unfused: c, plus DTensor's copy (2 bsh of HBM and a kernel) under Workload.sp_copies."""
    lay, work, shard, hw = ctx.layout, ctx.work, ctx.shard, ctx.cluster.hw
    t, tokens = lay.tp, lay.micro_batch * work.seq_length
    act = work.precision.activation_bytes
    bsh = tokens * shard.cfg.hidden_size * act
    nbytes = tokens * shard.cfg.hidden_size * (work.tp_gather_bytes or act) if step.op is Collective.ALL_GATHER \
        else bsh
    c = _one(ctx, step.op, nbytes)
    if not step.under:
        return c + (ctx.hbm_seconds(2.0 * bsh) + ctx.launch_seconds(1) if work.sp_copies else 0.0)
    g = ctx.gemm_seconds(step.under, work.fp8) * (t - 1) / t
    chunks = (t - 1) * len(step.under) * hw.gemm_overhead_s
    if step.op is Collective.ALL_GATHER:
        return _hidden(hw, c, g) + ctx.hbm_seconds(2.0 * nbytes / t) + chunks
    return c / (t - 1) + _hidden(hw, c * (t - 2) / (t - 1), g) + ctx.hbm_seconds(bsh * (1 + 1 / t)) + chunks


def _hidden(hw, comm: float, gemm: float) -> float:
    """Seconds `comm` adds under `gemm` seconds of products: what does not fit, plus the hidden part's cost to the
    products under it (time._tp_overlapped's rule)."""
    hidden = min(comm, gemm)
    return comm - hidden + hw.overlap_cost * hidden


def _one(ctx, op: Collective, nbytes: float) -> float:
    book = _Book()
    book.add(op, "tp", nbytes)
    return ctx.tp_seconds(book.ledger())
