"""Round 23 (planner23, issue 26): does the planner's error grow with the DP size, and what grows with it.

    python -m hybrid.planner.published23_dp     # the tables of docs/planner/round23-fp8-dp.md

The DGXC recipe tables are weak scaling: one model and layout at up to eight DP sizes (published_recipes), so a
series of rows that differ only in dp shows what the planner misses as dp grows. `trend_table` fits each such series'
error against log2(dp) (points per doubling of dp) in every family; `family_trends` counts them.

Then the candidates the runtime's code gives for a cost that grows with dp, each priced from its source, no constant
fitted (`latency_what_if`, the what-if of `what_if_table`):

* NCCL's ring latency. The planner charges every collective a flat Hardware.inter_latency_s (30 us on the H100
  preset). NCCL's own cost model (src/graph/tuning.cc at v2.25.1-1, ncclTopoTuneModel; NVIDIA/nccl read with
  `fetch`) charges a ring reduce-scatter / all-gather over n ranks on N nodes
      baseLat + (n - N) x intraLat + (N - 1) x interLat
  (nsteps = n - 1, nInterSteps = N - 1; Simple protocol, the one large buckets use: baseLat 8.4 us, NVLink ring
  hwLat 3.4 us -- at least 3 x the 1 us network overhead on a multi-node ring --, NET ring hwLat 14 us;
  tuning.cc:120-142, 296-323). PAT is off with more than one GPU a node (ncclPatEnable: nNodes != nRanks) and NeMo's
  performance scripts set NCCL_NVLS_ENABLE=0 (scripts/performance/utils.py PERF_ENV_VARS), so the DP collectives
  of these rows are rings: at dp 1,024 on 256 nodes one call is 6.2 ms, at dp 8 on 2 nodes 43 us. Megatron-core
  grows its buckets with dp to keep the calls bandwidth-bound (distributed_data_parallel.py at ee6737da, lines
  52-59: bucket_size = max(4e7, 1e6 x dp) parameters), so the calls a step makes fall as their latency rises and
  their sum stays ~0.1 s from dp 64 on -- but only where `bucket_size` is unset: NeMo 2.0's MegatronCommOverlapCallback
  sets it to 128 Mi parameters at dp > 1 (megatron_comm_overlap.py:185-192 at d2b21556; round 23b), so the NeMo 2.0
  rows' buckets do not grow with dp; what is exposed after the last backward is the last reduce-scatter bucket and
  the first all-gather bucket: 2 calls either way. The what-if charges those 2 calls NCCL's ring latency instead of the
  planner's 30 us.
* FP8 delayed scaling's amax reduction. Megatron-core's TransformerBlock enters TE's fp8_autocast with
  fp8_group = parallel_state.get_amax_reduction_group(with_context_parallel=True) (transformer_block.py:488-494 at
  ee6737da), the TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP (parallel_state.py:1345-1353): every GPU of a pipeline
  stage. TE reduces the amaxes over it with a blocking MAX all-reduce at each autocast exit (forward) and at the end
  of the region's backward (transformer_engine/pytorch/fp8.py:314-348 and 422-429, module/linear.py:625-626 at
  v2.1): 2 a micro-batch and model chunk, on the compute stream. The message is a few kB, so NCCL picks its tree
  with LL: baseLat 6.8 + 2 ((ppn - 1) x 0.6 + log2(N) x 5.0) us (tuning.cc:325-329). The planner charges none.
* The loss's all-reduce. NeMo 2.0's MaskedTokenLossReduction.forward averages each micro-batch's loss over the DP
  group for logging (nemo/lightning/megatron_parallel.py:1780 at d2b21556 -> nemo/collections/nlp/modules/common/
  megatron/utils.py:195-203, a blocking all_reduce on get_data_parallel_group()); NeMo 1.0's megatron_gpt_model
  and Megatron-LM's loss_func do the same: one small tree all-reduce over dp a micro-batch.
* Not priced, with why: the grad-norm all-reduce (one a step, ~0.1 ms), the data loader (the DGXC runs read mock
  data, each rank its own: nothing grows with dp), Megatron-core's larger buckets at large dp (the last
  reduce-scatter bucket holds the 0.79 B-parameter embedding of a TP rank at every dp below 790, so it grows only
  at dp 1,024: ~+2.6 ms), and stragglers (the step waits at each DP-wide barrier for the slowest rank: no source
  gives these clusters' per-GPU jitter).

`what_if_table` prints the three terms on the Nemotron4-15B series and `report` the families table with them added
(`what_if_rows`). A what-if, not landed (docs/planner/round23-fp8-dp.md).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, replace

from hybrid.planner.families import FamilyRow, family_table, narayanan_reference_rows, plan_row, slice_table
from hybrid.planner.ops import Fp8Scaling, Stack
from hybrid.planner.published import PublishedRun
from hybrid.planner.published_more import Result, evaluate

NCCL_COMMIT = "v2.25.1-1"  # src/graph/tuning.cc read at this tag
RING_SIMPLE_US = {"base": 8.4, "intra": 3.4, "inter": 14.0}  # baseLat / hwLat[NVLINK|NET][RING][SIMPLE]
TREE_LL_US = {"base": 6.8, "intra": 0.6, "inter": 5.0}  # baseLat / hwLat[NVLINK|NET][TREE][LL]
GPUS_PER_NODE = 8  # DGX H100
EXPOSED_DP_CALLS = 2  # the last reduce-scatter bucket and the first all-gather bucket (module doc)


def ring_latency_s(n: int, per_node: int) -> float:
    """NCCL's latency of one ring reduce-scatter / all-gather (Simple) over n ranks, per_node of them a node."""
    if n <= 1:
        return 0.0
    nodes = math.ceil(n / per_node)
    inter_steps = nodes - 1
    us = RING_SIMPLE_US["base"] + (n - 1 - inter_steps) * RING_SIMPLE_US["intra"] + inter_steps * RING_SIMPLE_US[
        "inter"]
    return us * 1e-6


def tree_allreduce_latency_s(n: int, per_node: int) -> float:
    """NCCL's latency of one small tree all-reduce (LL) over n ranks, per_node of them a node."""
    if n <= 1:
        return 0.0
    nodes = math.ceil(n / per_node)
    us = TREE_LL_US["base"] + 2 * ((min(n, per_node) - 1) * TREE_LL_US["intra"]
                                   + int(math.log2(nodes)) * TREE_LL_US["inter"])
    return us * 1e-6


@dataclass(frozen=True)
class Shape:
    """A planned row's groups: tp, pp, cp, the DP x CP group the gradients are reduced over (dp_cp), its members a
    node, micro-batches a step (ga) and model chunks a rank (v)."""

    tp: int
    pp: int
    cp: int
    dp_cp: int
    dp_per_node: int
    ga: int
    v: int


def shape(run: PublishedRun, result: Result) -> Shape:
    lay = result.plan.layout
    cp = getattr(run, "cp", 1)
    dp_cp = run.gpus // (lay.tp * lay.pp)
    dp = dp_cp // cp
    per_node = max(1, min(dp_cp, GPUS_PER_NODE // min(GPUS_PER_NODE, lay.tp)))
    return Shape(lay.tp, lay.pp, cp, dp_cp, per_node, run.workload.global_batch // (dp * lay.micro_batch), lay.v)


def applies(run: PublishedRun, result: Result) -> bool:
    """Megatron-core's distributed optimizer (ZeRO 1) with DP: the rows the what-if prices."""
    return (result.plan is not None and run.workload.stack is Stack.MEGATRON and int(result.plan.layout.zero) == 1
            and run.gpus // (result.plan.layout.tp * result.plan.layout.pp) > 1)


def latency_what_if(run: PublishedRun, result: Result) -> tuple[float, float, float]:
    """Seconds the candidates add to the planned step: (NCCL's ring latency on the exposed DP calls beyond the
    planner's flat latency, FP8 delayed scaling's amax all-reduces, the loss's all-reduces)."""
    if not applies(run, result):
        return 0.0, 0.0, 0.0
    s, hw = shape(run, result), run.hardware()
    flat = hw.inter_latency_s if s.dp_cp > s.dp_per_node else hw.intra_latency_s
    ring = EXPOSED_DP_CALLS * max(0.0, ring_latency_s(s.dp_cp, s.dp_per_node) - flat)
    amax = 0.0
    if run.workload.fp8 and run.workload.fp8_scaling is Fp8Scaling.DELAYED:
        group = s.tp * s.dp_cp
        amax = 2 * s.ga * s.v * tree_allreduce_latency_s(group, min(group, GPUS_PER_NODE))
    dp = s.dp_cp // s.cp
    loss = s.ga * tree_allreduce_latency_s(dp, max(1, min(dp, GPUS_PER_NODE // min(GPUS_PER_NODE, s.tp * s.cp))))
    return ring, amax, loss


def error_with(result: Result, extra_s: float) -> float:
    """error' for a step `extra_s` longer: the published step is the planned one x (1 + error)."""
    step = planned_step_s(result)
    return (1.0 + result.error) * step / (step + extra_s) - 1.0


def planned_step_s(result: Result) -> float:
    """The plan's step seconds (a ContextPlan's total_s, a Plan's step time)."""
    plan = result.plan
    return float(plan.total_s) if hasattr(plan, "total_s") else float(plan.time.total)


def series_key(name: str) -> str:
    """A row's name without its GPU count, GBS and dp: the rows of one weak-scaling table share it."""
    key = re.sub(r"\b\d+ (x )?(H100|A100|H200)[^,]*", "N GPUs", name)
    return re.sub(r"\bdp ?\d+", "", re.sub(r"GBS \d+", "GBS ~", key))


def slope(rows: list[FamilyRow]) -> float:
    """Least-squares points of error per doubling of dp."""
    xs = [math.log2(r.dp) for r in rows]
    ys = [100 * r.error for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0


def series(rows: list[FamilyRow], min_sizes: int = 3) -> dict[tuple, list[FamilyRow]]:
    """The fixed model / layout series with at least `min_sizes` DP sizes, rows sorted by dp."""
    out = defaultdict(list)
    for r in rows:
        if r.error is not None:
            out[(r.family, series_key(r.name), r.tp, r.pp, r.cp)].append(r)
    return {k: sorted(v, key=lambda r: r.dp) for k, v in out.items() if len({r.dp for r in v}) >= min_sizes}


def trend_table(rows: list[FamilyRow]) -> str:
    lines = ["| family | series | rows | dp | error at the smallest -> largest dp | points per doubling of dp |",
             "|---|---|---|---|---|---|"]
    for (family, key, *_), rs in sorted(series(rows).items()):
        lines.append(f"| {family.split(' (')[0]} | {key} | {len(rs)} | {rs[0].dp}-{rs[-1].dp} | "
                     f"{100 * rs[0].error:+.1f} -> {100 * rs[-1].error:+.1f} % | {slope(rs):+.2f} |")
    return "\n".join(lines)


def family_trends(rows: list[FamilyRow]) -> str:
    """Per family: series, how many rise with dp (slope > 0.1 point a doubling), the median slope."""
    by = defaultdict(list)
    for (family, *_), rs in series(rows).items():
        by[family.split(" (")[0]].append(slope(rs))
    lines = ["| family | series | rising (> +0.1 point a doubling) | falling (< -0.1) | median points per doubling |",
             "|---|---|---|---|---|"]
    for family, slopes in sorted(by.items()):
        slopes.sort()
        lines.append(f"| {family} | {len(slopes)} | {sum(s > 0.1 for s in slopes)} | {sum(s < -0.1 for s in slopes)} "
                     f"| {slopes[len(slopes) // 2]:+.2f} |")
    return "\n".join(lines)


def _evaluated() -> list[tuple[PublishedRun, Result]]:
    from hybrid.planner.families import all_published_runs
    return [(run, evaluate(run)) for run in all_published_runs()]


NEMOTRON15 = "DGXC 25.04.01 Nemotron4-15B"


def what_if_table(evaluated: list[tuple[PublishedRun, Result]]) -> str:
    """The two terms on the Nemotron4-15B t2 p1 series (both precisions): published step, planned step, the terms'
    milliseconds and the error with and without them."""
    lines = ["| row | dp | published step, s | planned, s | NCCL ring latency, ms | FP8 amax all-reduces, ms | "
             "loss all-reduces, ms | error | with all three |", "|---|---|---|---|---|---|---|---|---|"]
    for run, res in evaluated:
        if not run.name.startswith(NEMOTRON15) or res.error is None:
            continue
        ring, amax, loss = latency_what_if(run, res)
        step = planned_step_s(res)
        lines.append(f"| {run.name} | {shape(run, res).dp_cp} | {step * (1 + res.error):.3f} | {step:.3f} | "
                     f"{1000 * ring:.1f} | {1000 * amax:.2f} | {1000 * loss:.2f} | {100 * res.error:+.1f} % | "
                     f"{100 * error_with(res, ring + amax + loss):+.1f} % |")
    return "\n".join(lines)


def what_if_rows(evaluated: list[tuple[PublishedRun, Result]]) -> list[FamilyRow]:
    """Every row planned with both terms added (the what-if's families input)."""
    out = []
    for run, res in evaluated:
        extra = sum(latency_what_if(run, res))
        moved = res if res.error is None or extra == 0.0 else replace(res, error=error_with(res, extra))
        out.append(plan_row(run, lambda _run, r=moved: r))
    return out + narayanan_reference_rows()  # shared/reference's rows (ZeRO 0: the what-if leaves them)


def report() -> str:
    evaluated = _evaluated()
    rows = [plan_row(run, lambda _run, r=res: r) for run, res in evaluated] + narayanan_reference_rows()
    moved = what_if_rows(evaluated)
    # round 23's gpt3_what_if / overlap_what_if are the plan since round 23b: published23b_stated prints both ways
    return "\n\n".join([family_trends(rows), trend_table(rows), what_if_table(evaluated),
                        family_table(moved), slice_table(moved)])


def main() -> None:
    from hybrid.cliutil import HelpFormatter, OneLineParser
    parser = OneLineParser(prog="python -m hybrid.planner.published23_dp", description=__doc__.split("\n\n")[0],
                           formatter_class=HelpFormatter)
    parser.parse_args()
    print(report())


if __name__ == "__main__":
    main()
