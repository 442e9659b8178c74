"""Does the pipeline run as predicted? Measured step time and bubble of 1F1B, interleaved 1F1B and GPipe on CPU
against the planner's prediction and against the schedule simulation fed with the measured stage costs (issue 14).

    python scripts/bench_interleaved.py [--hardware FILE] [--steps 10] [--warmup 2] [--out FILE.md]

pp = 2 gloo ranks (no more ranks than this machine's 2 cores), one thread each, a GPT-2 (fp32, no dropout) of
`--layers` blocks, m = `--micro-batches` micro-batches of `--micro-batch` sequences. Schedules: 1F1B (v = 1),
interleaved with v = 2 and v = 4 chunks per rank, GPipe.

1. Calibrate (`hybrid calibrate --ranks 2`) unless `--hardware` gives a profile; predict each schedule's step
   (`evaluate`: step time, pipeline makespan, bubble). The planner has no GPipe layout, so GPipe gets only (3).
2. Measure: every schedule built once in one spawn and stepped in rounds (one training step of each per round,
   AdamW included, the slowest rank's time after a barrier); `--warmup` rounds untimed. Each step records the
   executor's timeline (wall-clock start/end of every forward, backward and wait, on one host's clock). From it:
   makespan T = last end - first start over both ranks, busy_r = rank r's forward + backward seconds, bubble =
   1 - sum_r busy_r / (pp T) -- the definition `SimResult.bubble_fraction` uses.
3. Simulate the same lists (`simulate`, Transfer.LAZY: what the executor does) with the measured median
   forward and backward time of each global stage and the median message time (the waits of a rank whose
   partner was already done): how far the schedule model alone is from the run, compute model aside.

Reports medians of `--steps` rounds with their spread (interquartile range / median). Not a timed test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bench_planner import two_rank_args, two_rank_parser, two_rank_setup, write_report  # noqa: E402
from hybrid.cliutil import positive_int  # noqa: E402
from hybrid.dp import GradAverager  # noqa: E402
from hybrid.mesh import Mesh, ParallelDims  # noqa: E402
from hybrid.pipeline import Costs, ScheduleKind, build_schedule, simulate, stage_of  # noqa: E402
from hybrid.pipeline.executor import PipelineExecutor, StageIO  # noqa: E402
from hybrid.planner import Cluster, Layout, evaluate  # noqa: E402
from hybrid.planner.layout import Workload  # noqa: E402
from hybrid.planner.model import ActivationProfile, Precision  # noqa: E402
from hybrid.planner.time import stage_times  # noqa: E402
from hybrid.testing import run_distributed  # noqa: E402
from hybrid.tp import TPContext  # noqa: E402
from hybrid.train_step import OptimizerConfig, build_optimizer, train_step  # noqa: E402
from models import build_pipeline_chunks, shift_labels  # noqa: E402

PP = 2
SCHEDULES = [(ScheduleKind.ONE_F_ONE_B, 1), (ScheduleKind.INTERLEAVED, 2), (ScheduleKind.INTERLEAVED, 4),
             (ScheduleKind.GPIPE, 1)]


def _name(kind: ScheduleKind, v: int) -> str:
    return {ScheduleKind.ONE_F_ONE_B: "1F1B", ScheduleKind.GPIPE: "GPipe"}.get(kind, f"interleaved v{v}")


def _build(cfg, kind: ScheduleKind, v: int, b: int, m: int, seq: int):
    mesh = Mesh.build(ParallelDims(pp=PP))
    chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp), mesh.coords.pp, PP, v, seed=0)
    lists = build_schedule(kind, PP, m, v)
    ex = PipelineExecutor(chunks, lists[mesh.coords.pp], mesh.pp, StageIO((b, seq, cfg.hidden_size)), mesh.device,
                          record_timeline=True)
    optimizer = build_optimizer(chunks, OptimizerConfig())
    averager = GradAverager(chunks.parameters(), mesh.dp)
    gen = torch.Generator().manual_seed(0)
    batches = [(x, shift_labels(x)) for x in (torch.randint(0, cfg.vocab_size, (b, seq), generator=gen)
                                              for _ in range(m))]
    return ex, lambda: train_step(chunks, batches, optimizer, mesh, averager, runner=ex)


def _measure(rank: int, world: int, cfg, b: int, m: int, seq: int, warmup: int, steps: int) -> dict:
    built = {key: _build(cfg, *key, b, m, seq) for key in SCHEDULES}
    out: dict = {key: {"step": [], "events": []} for key in SCHEDULES}
    for i in range(warmup + steps):
        for key, (ex, step) in built.items():
            dist.barrier()
            start = time.perf_counter()
            step()
            took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            events = [None] * world
            dist.all_gather_object(events, [(e.name, e.microbatch, e.chunk, e.start, e.end) for e in ex.events])
            if i >= warmup:
                out[key]["step"].append(took.item())
                out[key]["events"].append(events)
        if rank == 0:
            print(f"bench_interleaved: round {i + 1}/{warmup + steps}", flush=True)
    return out


def timeline_numbers(events: list[list[tuple]], v: int) -> dict:
    """Makespan, bubble and per-stage compute of one step from every rank's executor events."""
    spans = [e for rank in events for e in rank if e[0] in ("forward", "backward")]
    t0, t1 = min(e[3] for e in spans), max(e[4] for e in spans)
    busy = [sum(e[4] - e[3] for e in rank if e[0] in ("forward", "backward")) for rank in events]
    per_stage: dict[tuple[str, int], list[float]] = {}
    for r, rank in enumerate(events):
        for name, _mb, chunk, start, end in rank:
            if name in ("forward", "backward"):
                per_stage.setdefault((name, stage_of(r, chunk, PP)), []).append(end - start)
    return {"makespan": t1 - t0, "bubble": 1 - sum(busy) / (PP * (t1 - t0)), "per_stage": per_stage}


def _spread(xs: list[float]) -> float:
    q = statistics.quantiles(xs, n=4)
    return (q[2] - q[0]) / statistics.median(xs)


def simulated(kind: ScheduleKind, v: int, m: int, steps: list[dict]) -> tuple[float, float]:
    """(makespan, bubble) of the lists under Transfer.LAZY with the measured median cost of each stage."""
    stages = PP * v
    med = {key: statistics.median([t for s in steps for t in s["per_stage"][key]])
           for key in steps[0]["per_stage"]}
    costs = Costs(stage_forward=tuple(med[("forward", s)] for s in range(stages)),
                  stage_backward=tuple(med[("backward", s)] for s in range(stages)))
    result = simulate(build_schedule(kind, PP, m, v), costs)
    return result.makespan, result.bubble_fraction


def stage_table(stages: dict, measured: dict) -> str:
    """Per global stage, one micro-batch's forward and backward: the median measured on the timeline against the
    planner's stage costs (`stage_times`), to show which part of the compute model is off."""
    lines = ["Per stage, one micro-batch (ms): measured median / planner, forward and backward:", "",
             "| schedule | stage | forward measured | forward planner | backward measured | backward planner |",
             "|---|---|---|---|---|---|"]
    for (kind, v), st in stages.items():
        steps = [timeline_numbers(e, v) for e in measured[(kind, v)]["events"]]
        for s in range(PP * v):
            f, b = (statistics.median([t for x in steps for t in x["per_stage"][(n, s)]]) for n in
                    ("forward", "backward"))
            lines.append(f"| {_name(kind, v)} | {s} | {f * 1e3:.1f} | {st.forward[s] * 1e3:.1f} | {b * 1e3:.1f} | "
                         f"{st.backward[s] * 1e3:.1f} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = two_rank_parser("bench_interleaved.py", __doc__, layers=8, hidden=512, seq=256)  # layers: 8 k (pp 2 x v 4)
    p.add_argument("--micro-batch", type=positive_int, default=2, help="sequences per micro-batch")
    p.add_argument("--micro-batches", type=positive_int, default=8, help="m, a multiple of pp = 2")
    args = p.parse_args(argv)
    if args.layers % (PP * 4):
        p.error(f"--layers {args.layers} must be a multiple of 8 (pp 2 x v 4 chunks); use --layers 8")
    if args.micro_batches % PP:
        p.error(f"--micro-batches {args.micro_batches} must be a multiple of pp = 2 (interleaved); "
                f"use --micro-batches {args.micro_batches + 1}")
    return two_rank_args(p, args)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    start, load_before = time.perf_counter(), os.getloadavg()
    hw, cfg = two_rank_setup(args, "bench_interleaved")
    b, m = args.micro_batch, args.micro_batches
    work = Workload(cfg, global_batch=b * m, seq_length=args.seq, precision=Precision.FP32,
                    activations=ActivationProfile.FP32_FLASH)
    cluster = Cluster(gpus=PP, hw=hw)
    plans = {(k, v): evaluate(work, cluster, Layout(pp=PP, v=v, micro_batch=b)).time
             for k, v in SCHEDULES if k is not ScheduleKind.GPIPE}
    stages = {(k, v): stage_times(work, cluster, Layout(pp=PP, v=v, micro_batch=b))[0]
              for k, v in SCHEDULES if k is not ScheduleKind.GPIPE}
    measured = run_distributed(_measure, PP, timeout=3600,
                               args=(cfg, b, m, args.seq, args.warmup, args.steps))[0]
    report = _report(args, cfg, hw, plans, measured, load_before, os.getloadavg(), time.perf_counter() - start)
    report += "\n\n" + stage_table(stages, measured)
    write_report(args.out, report)


def _report(args, cfg, hw, plans, measured, load_before, load_after, seconds) -> str:
    lines = [
        f"GPT-2 {cfg.num_parameters / 1e6:.1f}M (l {cfg.num_layers}, h {cfg.hidden_size}, a 8, V 4096, fp32, no "
        f"dropout), seq {args.seq}, micro-batch {args.micro_batch}, m = {args.micro_batches}, pp {PP} gloo ranks x 1 "
        f"thread on {os.cpu_count()} cores. Profile: {hw.name}, fp32 GEMM R {hw.peak_tflops * 1e3:.1f} GFLOP/s. "
        f"Medians of {args.steps} rounds after {args.warmup} warm-up (spread = IQR / median). Load average before "
        f"{', '.join(f'{x:.2f}' for x in load_before)}, after {', '.join(f'{x:.2f}' for x in load_after)}. "
        f"Run took {seconds:.0f} s.",
        "",
        "| schedule | measured step s (spread) | planner step s | measured / planner | measured pipeline s | "
        "planner pipeline s | measured / planner | measured bubble | planner bubble | simulated (measured "
        "costs) pipeline s, bubble | measured / simulated |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, v in SCHEDULES:
        got = measured[(kind, v)]
        steps = [timeline_numbers(e, v) for e in got["events"]]
        step, pipe = statistics.median(got["step"]), statistics.median(s["makespan"] for s in steps)
        bubble = statistics.median(s["bubble"] for s in steps)
        sim_t, sim_b = simulated(kind, v, args.micro_batches, steps)
        plan = plans.get((kind, v))
        planned = (f"{plan.total:.3f} | {step / plan.total:.3f} | {pipe:.3f} | {plan.pipeline:.3f} | "
                   f"{pipe / plan.pipeline:.3f} | {bubble:.1%} | {plan.bubble_fraction:.1%}" if plan else
                   f"- | - | {pipe:.3f} | - | - | {bubble:.1%} | -")
        lines.append(f"| {_name(kind, v)} | {step:.3f} ({_spread(got['step']):.0%}) | {planned} | "
                     f"{sim_t:.3f}, {sim_b:.1%} | {pipe / sim_t:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
