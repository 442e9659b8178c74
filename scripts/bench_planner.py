"""Does the planner order layouts as this machine runs them? Predicted against measured step time on CPU.

    python scripts/bench_planner.py [--hardware FILE] [--ranks 4] [--steps 3] [--warmup 1] [--out FILE.md]

1. Calibrate this machine (`hybrid calibrate`: matmul FLOP/s, memory bandwidth, gloo all-reduce bus bandwidth
   and latency, every rank at once with one thread), unless `--hardware` gives a profile.
2. Predict the step time of each layout of a small GPT-2 (no dropout, fp32) on `--ranks` ranks with that
   profile: `evaluate` with Precision.FP32 and ActivationProfile.FP32_FLASH.
3. Measure it: every layout in one spawn of `--ranks` gloo processes (one intra-op thread each), built once
   and stepped in rounds -- `--warmup` untimed rounds, then `--steps` timed ones, one training step of each
   layout per round (`train_step`, GradAverager DP, AdamW; the step's time is the slowest rank's, after a
   barrier), so a shared machine's load falls on every layout alike; the median and the minimum are reported.
4. Report predicted vs measured seconds per step and Spearman's rho between the two orders (1 = the planner
   ranks the layouts exactly as measured).

The time model has no per-kernel overhead term; at these sizes Python and dispatcher overheads (tens of
microseconds per op) and gloo's latency are a visible share of a step, so the absolute error is expected to
be large while the order is what the planner is used for.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from transformers import GPT2Config  # noqa: E402

from hybrid.cliutil import (HelpFormatter, OneLineParser, check_output_file, int_in,  # noqa: E402
                            nonnegative_int, positive_int, write_text)
from hybrid.dp import GradAverager  # noqa: E402
from hybrid.mesh import Mesh, ParallelDims  # noqa: E402
from hybrid.pipeline import ScheduleKind, build_schedule  # noqa: E402
from hybrid.pipeline.executor import PipelineExecutor, StageIO  # noqa: E402
from hybrid.planner import Cluster, Layout, evaluate  # noqa: E402
from hybrid.planner.calibrate import CalibrationConfig, calibrate, load_hardware, save_profile  # noqa: E402
from hybrid.planner.layout import Workload  # noqa: E402
from hybrid.planner.model import ActivationProfile, Precision  # noqa: E402
from hybrid.testing import run_distributed  # noqa: E402
from hybrid.tp import TPContext  # noqa: E402
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, build_optimizer, train_step  # noqa: E402
from models import Recompute, build_pipeline_chunks, from_hf, shift_labels  # noqa: E402

LAYOUTS = [(1, 1), (2, 1), (4, 1), (1, 2), (1, 4), (2, 2)]  # (tp, pp); dp = ranks / (tp pp)


def model_config(layers: int, hidden: int, heads: int, vocab: int, seq: int):
    return from_hf(GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab, n_positions=seq,
                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))


def _build(world: int, cfg, tp: int, pp: int, b: int, seq: int, global_batch: int, v: int = 1,
           recompute: str = "none"):
    """One layout's mesh, model, optimizer and batches on this rank; returns a function running one step.
    v > 1: the interleaved schedule with v chunks per rank; recompute: models.Recompute's value."""
    dims = ParallelDims.from_world(world, tp=tp, pp=pp)
    mesh = Mesh.build(dims)
    chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp), mesh.coords.pp, pp, v, seed=0,
                                   recompute=Recompute(recompute))
    m = global_batch // (dims.dp * b)
    if pp == 1 and v == 1:
        runner = LocalForwardBackward(chunks[0], mesh.device)
    else:
        kind = ScheduleKind.INTERLEAVED if v > 1 else ScheduleKind.ONE_F_ONE_B
        schedule = build_schedule(kind, pp, m, v)[mesh.coords.pp]
        runner = PipelineExecutor(chunks, schedule, mesh.pp, StageIO((b, seq, cfg.hidden_size)), mesh.device)
    optimizer = build_optimizer(chunks, OptimizerConfig())
    averager = GradAverager(chunks.parameters(), mesh.dp)
    gen = torch.Generator().manual_seed(mesh.coords.dp)
    batches = [(x, shift_labels(x)) for x in (torch.randint(0, cfg.vocab_size, (b, seq), generator=gen)
                                              for _ in range(m))]
    return lambda: train_step(chunks, batches, optimizer, mesh, averager, runner=runner)


def _measure_all(rank: int, world: int, cfg, layouts, b, seq, global_batch, warmup, steps) -> dict:
    """Every layout built once, then stepped in rounds (one step of each layout per round), so load from other
    programs on a shared machine falls on all layouts alike. A step's time is the slowest rank's."""
    step = {key: _build(world, cfg, *key, b, seq, global_batch) for key in layouts}
    out: dict = {key: [] for key in layouts}
    for i in range(warmup + steps):
        for key in layouts:
            dist.barrier()
            start = time.perf_counter()
            step[key]()
            took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            if i >= warmup:
                out[key].append(took.item())
        if rank == 0 and i >= warmup:
            print(f"bench_planner: round {i - warmup + 1}/{steps}: "
                  + ", ".join(f"tp{t} pp{p} {out[(t, p)][-1] * 1e3:.0f} ms" for t, p in layouts), flush=True)
    return out


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (ties get their average rank)."""
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else float("nan")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, each checked before the calibration and the spawn (one error line naming it)."""
    p = OneLineParser(prog="bench_planner.py", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--hardware", help="a `hybrid calibrate` profile (default: calibrate now)")
    p.add_argument("--save-hardware", help="where to keep the profile measured now")
    p.add_argument("--ranks", type=int_in(2, 64), default=4, help="gloo ranks (>= 2: the calibration times "
                                                                 "collectives)")
    p.add_argument("--layers", type=positive_int, default=8, help="GPT-2 blocks")
    p.add_argument("--hidden", type=positive_int, default=256, help="model width, a multiple of --heads")
    p.add_argument("--heads", type=positive_int, default=8, help="attention heads")
    p.add_argument("--vocab", type=positive_int, default=4096, help="vocabulary")
    p.add_argument("--seq", type=int_in(2), default=128, help="tokens per sequence")
    p.add_argument("--micro-batch", type=positive_int, default=4, help="sequences per micro-batch")
    p.add_argument("--global-batch", type=positive_int, default=32, help="sequences per step")
    p.add_argument("--warmup", type=nonnegative_int, default=1, help="untimed rounds first")
    p.add_argument("--steps", type=positive_int, default=3, help="timed rounds")
    p.add_argument("--out", help="write the Markdown table here")
    args = p.parse_args(argv)
    if args.hidden % args.heads:
        p.error(f"--hidden {args.hidden} is not divisible by --heads {args.heads}")
    if args.global_batch % args.micro_batch:
        p.error(f"--global-batch {args.global_batch} is not a multiple of --micro-batch {args.micro_batch}")
    check_paths(p, args, ("--save-hardware", "--out"))
    return args


def two_rank_parser(prog: str, doc: str, layers: int, hidden: int, seq: int) -> OneLineParser:
    """The flags the 2-rank planner checks share (bench_planner_ranking, bench_interleaved): the profile, the
    GPT-2's size (8 heads), the rounds, the report. Callers add their own and check --hidden % 8."""
    p = OneLineParser(prog=prog, description=doc, formatter_class=HelpFormatter)
    p.add_argument("--hardware", help="a `hybrid calibrate` profile (default: calibrate now, 2 ranks)")
    p.add_argument("--layers", type=positive_int, default=layers, help="GPT-2 blocks")
    p.add_argument("--hidden", type=positive_int, default=hidden, help="model width (8 heads)")
    p.add_argument("--seq", type=positive_int, default=seq, help="tokens per sequence")
    p.add_argument("--warmup", type=nonnegative_int, default=2, help="untimed rounds first")
    p.add_argument("--steps", type=positive_int, default=10, help="timed rounds (>= 10 for issue 14's checks)")
    p.add_argument("--out", help="write the Markdown report here")
    return p


def two_rank_args(p: OneLineParser, args: argparse.Namespace) -> argparse.Namespace:
    """Checks of two_rank_parser's flags: 8 heads divide --hidden, the paths (check_paths)."""
    if args.hidden % 8:
        p.error(f"--hidden {args.hidden} must be a multiple of the 8 heads")
    check_paths(p, args)
    return args


def two_rank_setup(args: argparse.Namespace, name: str):
    """(the fp32 profile -- --hardware, or calibrated now on 2 ranks and kept in /tmp --, the GPT-2 config of
    --layers / --hidden / --seq, 8 heads, vocabulary 4096)."""
    path = args.hardware or f"/tmp/hybrid_{name}_hardware.json"
    if not args.hardware:
        print(f"{name}: calibrating (2 ranks) ...", flush=True)
        save_profile(calibrate(CalibrationConfig(ranks=2)), path)
    return load_hardware(path, Precision.FP32), model_config(args.layers, args.hidden, 8, 4096, args.seq)


def check_paths(p: argparse.ArgumentParser, args: argparse.Namespace, outputs: tuple[str, ...] = ("--out",)) -> None:
    """The planner benchmarks' --hardware profile readable and complete, and their output files writable,
    before any work: one error line naming the flag."""
    try:
        if args.hardware is not None:
            load_hardware(args.hardware, Precision.FP32)
        for flag in outputs:
            value = getattr(args, flag[2:].replace("-", "_"))
            if value is not None:
                check_output_file(flag, value)
    except ValueError as e:
        p.error(str(e))


def write_report(path: str | None, report: str) -> None:
    """Print the report and, with --out, write it atomically (no half-written file on a failure)."""
    print(report)
    if path:
        write_text(path, report + "\n")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    t0 = time.perf_counter()

    if args.hardware:
        path = args.hardware
    else:
        path = args.save_hardware or "/tmp/hybrid_bench_planner_hardware.json"
        print(f"bench_planner: calibrating ({args.ranks} ranks) ...", flush=True)
        save_profile(calibrate(CalibrationConfig(ranks=args.ranks)), path)
    hw = load_hardware(path, Precision.FP32)

    cfg = model_config(args.layers, args.hidden, args.heads, args.vocab, args.seq)
    work = Workload(cfg, global_batch=args.global_batch, seq_length=args.seq, precision=Precision.FP32,
                    activations=ActivationProfile.FP32_FLASH)
    cluster = Cluster(gpus=args.ranks, hw=hw)
    layouts = [(tp, pp) for tp, pp in LAYOUTS if args.ranks % (tp * pp) == 0]
    predicted = {}
    for tp, pp in layouts:
        layout = Layout(tp=tp, pp=pp, dp=args.ranks // (tp * pp), micro_batch=args.micro_batch)
        predicted[(tp, pp)] = (layout, evaluate(work, cluster, layout))

    print(f"bench_planner: measuring {len(layouts)} layouts ({args.warmup} + {args.steps} steps each) ...", flush=True)
    measured = run_distributed(_measure_all, args.ranks, timeout=600,
                               args=(cfg, layouts, args.micro_batch, args.seq, args.global_batch, args.warmup,
                                     args.steps))[0]
    rows = []
    for key in layouts:
        layout, plan = predicted[key]
        rows.append((layout, plan, statistics.median(measured[key]), min(measured[key])))
    rho = (spearman([r[1].time.total for r in rows], [r[2] for r in rows]),
           spearman([r[1].time.total for r in rows], [r[3] for r in rows]))
    write_report(args.out, report(args, cfg, hw, rows, rho, time.perf_counter() - t0))


def report(args, cfg, hw, rows, rho: tuple[float, float], seconds: float) -> str:
    by_pred = sorted(range(len(rows)), key=lambda i: rows[i][1].time.total)
    by_meas = sorted(range(len(rows)), key=lambda i: rows[i][2])
    rank_p = {i: r + 1 for r, i in enumerate(by_pred)}
    rank_m = {i: r + 1 for r, i in enumerate(by_meas)}
    lines = [
        f"GPT-2 {cfg.num_parameters / 1e6:.2f}M parameters (l {cfg.num_layers}, h {cfg.hidden_size}, a "
        f"{cfg.num_heads}, V {cfg.vocab_size}, no dropout, fp32), seq {args.seq}, micro-batch {args.micro_batch}, "
        f"global batch {args.global_batch}, {args.ranks} gloo ranks x 1 thread; profile: {hw.name}, fp32 matmul "
        f"{hw.peak_tflops * 1e3:.1f} GFLOP/s per rank, memory {hw.hbm_tbps * 1e3:.2f} GB/s, all-reduce busbw "
        f"{hw.intra_node_gbps:.3f} GB/s, latency {hw.intra_latency_s * 1e6:.0f} us. Measured: median of "
        f"{args.steps} steps after {args.warmup} warm-up (min in brackets). Run took {seconds:.0f} s.",
        "",
        "| layout | m | predicted s/step | (compute, TP, DP, bubble) | measured s/step | measured / predicted "
        "| predicted rank | measured rank |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, (layout, plan, med, low) in enumerate(rows):
        t = plan.time
        m = args.global_batch // (layout.dp * layout.micro_batch)
        lines.append(f"| tp{layout.tp} pp{layout.pp} dp{layout.dp} | {m} | {t.total:.3f} | ({t.compute:.3f}, "
                     f"{t.tp_comm:.3f}, {t.dp_comm:.3f}, {100 * t.bubble_fraction:.0f} %) | {med:.3f} ({low:.3f}) | "
                     f"{med / t.total:.2f} | {rank_p[i]} | {rank_m[i]} |")
    lines += ["", f"Spearman's rho, predicted vs measured order of the {len(rows)} layouts: **{rho[0]:.2f}** "
                  f"(medians), {rho[1]:.2f} (minima)"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
