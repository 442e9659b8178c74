"""Is the planner's step for the README's main job within 10 % of what this machine measures? (issue 26)

    python scripts/bench_planner_mainjob.py [--iters 200] [--out docs/results/bench_planner_mainjob.md]
    python scripts/bench_planner_mainjob.py --quick --out /tmp/mainjob.md      # a smoke run, no claim

1. `hybrid calibrate --ranks 8 --out PROFILE` (this machine, the main job's 8 gloo ranks), seconds before the run.
2. The main job (README: tiny-gpt2, tp 2 x pp 2 x dp 2 on 8 ranks, micro-batch 2, global batch 16, seq 128) with
   `--hardware PROFILE`: train.py prints the planner's prediction for its own layout at the start
   (`planner: predicted X s/step ...`, hybrid/metrics/split.py) and the measured step times every log interval
   (`step time ms p50/p90/max`).
3. The measured median is the median of the logged p50s after the first interval (warm-up); the error is
   predicted / measured - 1. The load average before and after goes in the report: on a loaded machine the
   number says nothing about the planner (the acceptance asks for a quiet machine).

`--account DIR` is item (1)'s accounting instead of the timing: each rank runs train.py with the op trail's phase
clock read twice -- wall (time.monotonic) and this process's CPU seconds (user + sys of all its threads, gloo's
included: time.process_time) -- and writes DIR/rank<r>.json at exit (per phase, summed over the iterations
after --warmup, plus getrusage's context switches). With 8 processes on 2 cores the step is at least the CPU
seconds all ranks burn a step / the cores; `account_table` puts that beside the planner's terms, and
`install_components` splits the compute phases by model part (embedding, layers, head and loss, the executor's own
Python) beside the planner's parts (`components_table`).

Each run keeps the calibrated profile it planned with (beside `--out`: REPORT.hw8.json) and reports which Hardware
fields set the plan (`drivers`: each field alone +10 %), so a rerun's moved prediction can be attributed.

Not a timed test: a script that writes a results file.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN_JOB = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--micro-batch-size", "2",
            "--global-batch-size", "16", "--seq-length", "128"]
PREDICTED = re.compile(r"planner: predicted ([0-9.eE+-]+) s/step")
STEP_P50 = re.compile(r"step time ms p50/p90/max, iterations (\d+)-(\d+): r\d+ ([0-9.]+)/")


def _one_line_parser():
    """hybrid.cliutil's OneLineParser from this checkout, imported when parsing (`python scripts/...`)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from hybrid.cliutil import OneLineParser
    return OneLineParser


def parse(log: str) -> tuple[float | None, list[float]]:
    """(the planner's predicted seconds a step, the logged per-interval median step times in seconds)."""
    predicted = PREDICTED.search(log)
    p50s = [float(m.group(3)) / 1e3 for m in STEP_P50.finditer(log)]
    return (float(predicted.group(1)) if predicted else None), p50s


def run(cmd: list[str], env: dict, timeout: float) -> str:
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed (exit {proc.returncode}):\n{out[-3000:]}")
    return out


def rank_entry(out_dir: str, warmup: int, train_argv: list[str]) -> None:
    """One torchrun rank: train.py with `install_accounting`'s file written at exit."""
    import atexit
    import runpy
    atexit.register(install_accounting(out_dir, warmup))
    atexit.register(install_components(out_dir, warmup))
    sys.argv = [os.path.join(ROOT, "scripts", "train.py"), *train_argv]
    runpy.run_path(sys.argv[0], run_name="__main__")


def install_accounting(out_dir: str, warmup: int):
    """Time the op trail's phase switches in wall and process-CPU seconds; returns the function that writes
    DIR/rank<r>.json: per phase {wall, cpu, thread_cpu} summed over iterations > warmup (thread_cpu: the
    main thread alone, so cpu - thread_cpu is gloo's own threads), the iterations counted, and getrusage. The step
    is from the trail's begin_iteration to the straggler record's take_phase_seconds; what runs between two steps
    (logging, evaluation) is kept apart as "between"."""
    import json
    import resource

    from hybrid import trail
    acc: dict[str, dict[str, float]] = {}
    counted = set()
    state = {"open": False, "wall": time.monotonic(), "cpu": time.process_time(), "thread_cpu": time.thread_time()}
    switch0, begin0, take0 = trail.Trail._switch, trail.Trail.begin_iteration, trail.Trail.take_phase_seconds

    def now() -> dict[str, float]:
        return {"wall": time.monotonic(), "cpu": time.process_time(), "thread_cpu": time.thread_time()}

    def switch(self, phase: str) -> str:  # the step's phases: from begin_iteration to the step's end
        t = now()
        if state["open"] and self.iteration > warmup:
            counted.add(self.iteration)
            row = acc.setdefault(self.phase, dict.fromkeys(t, 0.0))
            for k in t:
                row[k] += t[k] - state[k]
        state.update(t)
        return switch0(self, phase)

    def begin(self, iteration: int) -> None:  # between two steps (logging, evaluation): not the step's
        t = now()
        if state["open"] is False and iteration - 1 > warmup:
            row = acc.setdefault("between", dict.fromkeys(t, 0.0))
            for k in t:
                row[k] += t[k] - state[k]
        state.update(t, open=True)
        begin0(self, iteration)

    def take(self) -> dict[str, float]:
        out = take0(self)
        state["open"] = False
        return out

    def dump() -> None:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        rank = int(os.environ.get("RANK", "0"))
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "iterations": len(counted), "phases": acc, "ru_utime": ru.ru_utime,
                       "ru_stime": ru.ru_stime, "ru_nvcsw": ru.ru_nvcsw, "ru_nivcsw": ru.ru_nivcsw}, f)
    trail.Trail._switch, trail.Trail.begin_iteration, trail.Trail.take_phase_seconds = switch, begin, take
    _finish_backward_is_optimizer()
    return dump


def _finish_backward_is_optimizer() -> None:
    """The gradients' end-of-backward work (ZeroOptimizer.finish_backward: the buckets, the TP / embedding / DP
    gradient syncs' Python) counted in the "optimizer" phase, where the planner prices it (calibrate's optimizer
    probe times it: hybrid/planner/calibrate.py optimizer_step_cpu). The runtime enters no phase for it, so it fell
    in whichever phase the executor's last action left: "backward" on the first stage (its last action is a
    backward), "p2p" on the last (a send) -- round 24 read 2.5 ms a step on each first-stage rank of the main job
    as "executor backward", 1.0 on the last stage's (docs/results/bench_planner_mainjob.md, "Twenty-fourth round")."""
    from hybrid import trail
    from hybrid.zero.engine import ZeroOptimizer
    finish0 = ZeroOptimizer.finish_backward

    def finish_backward(self, *a, **kw):
        trail.TRAIL.enter("optimizer")
        return finish0(self, *a, **kw)
    ZeroOptimizer.finish_backward = finish_backward


COMPONENTS = ("embedding forward", "layers forward", "head and loss forward", "head and loss backward",
              "layers backward", "embedding backward", "executor forward", "executor backward")


def install_components(out_dir: str, warmup: int):
    """Split the step's compute phases by model part: the calling thread's CPU (time.thread_time) outside the
    collectives and messages (the op trail's comm / p2p phases, priced apart by comm_cpu_seconds), summed over
    iterations > warmup. Forward: GPT2.embed, each GPT2Block.forward, and the rest of GPT2.forward (final norm, LM
    head, loss). Backward (autograd runs a CPU graph on the calling thread, so tensor hooks read the same clock):
    from the executor's `_backward` to the grad of the last block's output (head and loss), from there to the grad of
    the first block's input (the layers), from there to `_backward`'s return (the embedding and its weight-gradient
    accumulation). "executor forward / backward" are the compute phases' main-thread CPU outside the model's calls:
    the schedule's Python, detach / requires_grad_, the loss's division, x.grad hand-over. Returns the function that
    writes DIR/components<r>.json."""
    import json

    import torch

    from hybrid import trail
    from hybrid.pipeline import executor
    from models import gpt2
    acc = dict.fromkeys(COMPONENTS, 0.0) | {"model forward": 0.0, "model backward": 0.0}
    st = {"comm": 0.0, "since": time.thread_time(), "hooks": [], "depth": 0}
    switch0 = trail.Trail._switch

    def switch(self, phase: str) -> str:  # the thread's CPU inside comm / p2p phases, kept apart
        t = time.thread_time()
        if self.phase in ("comm", "p2p"):
            st["comm"] += t - st["since"]
        st["since"] = t
        return switch0(self, phase)

    def clock() -> float:
        return time.thread_time() - st["comm"]

    def counted() -> bool:  # a training step after warm-up (evaluation runs under no_grad)
        return trail.TRAIL.iteration > warmup and torch.is_grad_enabled()

    def add(name: str, seconds: float) -> None:
        if counted():
            acc[name] += seconds

    forward0, embed0, block0, backward0 = gpt2.GPT2.forward, gpt2.GPT2.embed, gpt2.GPT2Block.forward, executor._backward

    def forward(self, x, *a, **kw):
        st["layers"], st["embed"], t0 = 0.0, 0.0, clock()
        y = forward0(self, x, *a, **kw)
        total = clock() - t0
        add("model forward", total)
        add("embedding forward", st["embed"])
        add("layers forward", st["layers"])
        add("head and loss forward", total - st["embed"] - st["layers"])
        return y

    def embed(self, *a, **kw):
        t0 = clock()
        y = embed0(self, *a, **kw)
        st["embed"] += clock() - t0
        return y

    def block(self, x, *a, **kw):
        t0 = clock()
        y = block0(self, x, *a, **kw)
        st["layers"] += clock() - t0
        if torch_grad(x) and torch_grad(y):  # the backward's marks: grad of this block's output, then its input
            y.register_hook(lambda g: st["hooks"].append(("out", clock())))
            x.register_hook(lambda g: st["hooks"].append(("in", clock())))
        return y

    def backward(output, grad):
        st["hooks"], t0 = [], clock()
        backward0(output, grad)
        t1 = clock()
        add("model backward", t1 - t0)
        outs = [t for k, t in st["hooks"] if k == "out"]
        ins = [t for k, t in st["hooks"] if k == "in"]
        if outs and ins:
            add("head and loss backward", outs[0] - t0)  # the last block's output gets its grad first
            add("layers backward", ins[-1] - outs[0])
            add("embedding backward", t1 - ins[-1])

    def dump() -> None:
        rank = int(os.environ.get("RANK", "0"))
        with open(os.path.join(out_dir, f"components{rank}.json"), "w") as f:
            json.dump(acc, f)
    trail.Trail._switch = switch
    gpt2.GPT2.forward, gpt2.GPT2.embed, gpt2.GPT2Block.forward, executor._backward = forward, embed, block, backward
    return dump


def torch_grad(t) -> bool:
    return getattr(t, "requires_grad", False)


PHASES = ("forward", "backward", "comm", "p2p", "optimizer", "other")


def read_account(out_dir: str, world: int) -> list[dict]:
    """Each rank's DIR/rank<r>.json (rank_entry): per phase {wall, cpu, thread_cpu} seconds a step."""
    import json
    rows = []
    for r in range(world):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            d = json.load(f)
        n = max(1, d["iterations"])
        zero = dict.fromkeys(("wall", "cpu", "thread_cpu"), 0.0)
        rows.append({ph: {k: v / n for k, v in d["phases"].get(ph, zero).items()} for ph in PHASES}
                    | {"iterations": d["iterations"], "nivcsw": d["ru_nivcsw"], "nvcsw": d["ru_nvcsw"]})
    return rows


def main_job(profile: str):
    """train.py's own Workload for the main job (fp32, eager, 1F1B), its layout, and the cluster on `profile`."""
    from hybrid.planner import ActivationProfile, Cluster, Layout, Precision, Workload
    from hybrid.planner.calibrate import load_hardware
    from hybrid.planner.ops import KernelProfile
    from models import PRESETS
    work = Workload(PRESETS["tiny-gpt2"], global_batch=16, seq_length=128, precision=Precision.FP32,
                    activations=ActivationProfile.FP32_FLASH, kernels=KernelProfile.EAGER)
    hw = load_hardware(profile, Precision.FP32)
    return work, Layout(tp=2, pp=2, dp=2, micro_batch=2), Cluster(gpus=8, hw=hw)


def planned_cpu(profile: str) -> dict[str, float]:
    """The planner's CPU seconds a step on the node (all 8 ranks) for the main job, by the accounting's phases:
    compute (forward + backward: every rank's stage compute, m micro-batches), comm (collectives and messages:
    time.comm_cpu_seconds), optimizer; and its step."""
    from hybrid.planner import evaluate
    from hybrid.planner.time import comm_cpu_seconds, stage_times
    work, lay, cluster = main_job(profile)
    t = evaluate(work, cluster, lay).time
    times = stage_times(work, cluster, lay)[0]
    m, replicas = work.num_microbatches(lay), lay.tp * lay.dp
    cores = cluster.hw.compute_units or 1
    return {"compute": replicas * m * sum(times.rank_compute),
            "comm": replicas * sum(comm_cpu_seconds(work, cluster, lay, r) for r in range(lay.pp)),
            "optimizer": t.optimizer * cores, "step": t.total, "makespan": t.run.makespan, "cores": cores,
            "pipeline": t.pipeline}


def drivers(profile: str, rel: float = 0.1, top: int = 8) -> list[str]:
    """Which Hardware fields set the main job's plan on `profile`: each numeric field > 0 moved by +`rel` alone
    (a rate or a latency alike), the planned pipeline term's (the schedule on the shared cores: time.step_time)
    and step's relative change; the `top` fields that move the
    step most, largest first. A rerun's plan then says where it moved (round 11: the makespan went
    0.256 -> 0.249 -> 0.231 s over three calibrations, and the profiles were not kept)."""
    import dataclasses

    from hybrid.planner import evaluate
    work, lay, cluster = main_job(profile)
    base = evaluate(work, cluster, lay).time
    rows = []
    for f in dataclasses.fields(cluster.hw):
        value = getattr(cluster.hw, f.name)
        if isinstance(value, bool) or not isinstance(value, float) or value <= 0:  # counts (cores, GPUs) kept
            continue
        try:
            hw = dataclasses.replace(cluster.hw, **{f.name: value * (1 + rel)})
            moved = evaluate(work, dataclasses.replace(cluster, hw=hw), lay).time
        except ValueError:  # a field bounded above (an efficiency at 1)
            continue
        rows.append((moved.total / base.total - 1, moved.pipeline / base.pipeline - 1, f.name, value))
    rows.sort(key=lambda r: -abs(r[0]))
    lines = [f"| Hardware field (profile) | value | step change, field +{100 * rel:.0f} % | pipeline change |",
             "|---|---|---|---|"]
    lines += [f"| {name} | {value:.4g} | {100 * d_step:+.2f} % | {100 * d_mk:+.2f} % |"
              for d_step, d_mk, name, value in rows[:top]]
    return lines


def planned_components(profile: str) -> dict[str, float]:
    """The planner's compute CPU seconds a step, all ranks, by install_components' parts: a layer's passes
    (time.layer_passes) x layers x micro-batches x TP x DP ranks, the first stage's edge (embedding) and the last's
    (final norm, LM head, loss: time._edge_cost) x micro-batches x TP x DP; the executor's own CPU a chunk pass
    (time._executor_glue: Hardware.executor_*_cpu_s, calibrate's executor probe; 0 on profiles before round 14) x
    stages x micro-batches x TP x DP."""
    from hybrid.planner.time import _context, _edge_cost, _executor_glue, layer_passes
    work, lay, cluster = main_job(profile)
    ctx = _context(work, cluster, lay)
    per = work.num_microbatches(lay) * lay.tp * lay.dp
    fwd, bwd = layer_passes(ctx)
    emb, head = _edge_cost(ctx, True, False), _edge_cost(ctx, False, True)
    glue_f, glue_b = _executor_glue(ctx)
    layers, stages = work.model.num_layers, lay.pp * lay.v
    return {"embedding forward": per * emb.forward.total, "layers forward": per * layers * fwd.total,
            "head and loss forward": per * head.forward.total, "head and loss backward": per * head.backward.total,
            "layers backward": per * layers * bwd.total, "embedding backward": per * emb.backward.total,
            "executor forward": per * stages * glue_f.total, "executor backward": per * stages * glue_b.total}


def read_components(out_dir: str, world: int, rows: list[dict]) -> dict[str, float]:
    """install_components' parts, seconds a step summed over the ranks; the executor's glue from `rows`
    (read_account: the compute phases' main-thread CPU) less the model's calls."""
    import json
    total = dict.fromkeys(COMPONENTS, 0.0)
    for r in range(world):
        with open(os.path.join(out_dir, f"components{r}.json")) as f:
            d = json.load(f)
        n = max(1, rows[r]["iterations"])
        for k in COMPONENTS[:6]:
            total[k] += d[k] / n
        total["executor forward"] += rows[r]["forward"]["thread_cpu"] - d["model forward"] / n
        total["executor backward"] += rows[r]["backward"]["thread_cpu"] - d["model backward"] / n
    return total


def components_table(measured: dict[str, float], planned: dict[str, float]) -> list[str]:
    """Component, measured CPU ms a step (all ranks' main threads), planned, missing (measured - planned)."""
    lines = ["| component (main threads, outside collectives) | measured CPU ms/step, all ranks | planned | missing |",
             "|---|---|---|---|"]
    for k in COMPONENTS:
        missing = measured[k] - planned[k]
        lines.append(f"| {k} | {1e3 * measured[k]:.1f} | {1e3 * planned[k]:.1f} | {1e3 * missing:+.1f} |")
    m, p = sum(measured.values()), sum(planned.values())
    lines.append(f"| **compute** | **{1e3 * m:.1f}** | **{1e3 * p:.1f}** | **{1e3 * (m - p):+.1f}** |")
    return lines


def account_table(rows: list[dict], cores: int) -> list[str]:
    """Per phase: CPU ms a step summed over the ranks (and gloo's threads' part of it), wall ms a step (mean
    rank); the node's CPU ms a step / cores is what the step cannot undercut with more ranks than cores."""
    lines = ["| phase | CPU ms/step, all ranks | of it gloo's threads | wall ms/step, mean rank |", "|---|---|---|---|"]
    tot = dict.fromkeys(("cpu", "gloo", "wall"), 0.0)
    for ph in PHASES:
        cpu = 1e3 * sum(r[ph]["cpu"] for r in rows)
        gloo = 1e3 * sum(r[ph]["cpu"] - r[ph]["thread_cpu"] for r in rows)
        wall = 1e3 * sum(r[ph]["wall"] for r in rows) / len(rows)
        tot["cpu"], tot["gloo"], tot["wall"] = tot["cpu"] + cpu, tot["gloo"] + gloo, tot["wall"] + wall
        lines.append(f"| {ph} | {cpu:.1f} | {gloo:.1f} | {wall:.1f} |")
    lines.append(f"| **step** | **{tot['cpu']:.1f}** (/ {cores} cores: {tot['cpu'] / cores:.1f}) | {tot['gloo']:.1f} "
                 f"| **{tot['wall']:.1f}** |")
    return lines


def account(args: argparse.Namespace) -> int:
    """--account DIR: calibrate (unless --hardware), run the main job with rank_entry's accounting, and print the
    measured CPU seconds a step by phase beside the planner's."""
    iters = 8 if args.quick else min(args.iters, 40)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    os.makedirs(args.account, exist_ok=True)
    profile = args.hardware or os.path.join(args.account, "hw8.json")
    if not args.hardware:
        run([sys.executable, "-m", "hybrid.cli", "calibrate", "--ranks", "8", "--out", profile]
            + (["--seconds", "0.1"] if args.quick else []), env, 1800)
    warmup = 2 if args.quick else args.warmup
    run(["torchrun", "--nproc-per-node", "8", os.path.abspath(__file__), "--rank-entry", args.account, str(warmup),
         *MAIN_JOB, "--train-iters", str(iters), "--log-interval", str(iters), "--hardware", profile], env, 7200)
    rows = read_account(args.account, 8)
    plan = planned_cpu(profile)
    measured = {"compute": sum(r[ph]["cpu"] for r in rows for ph in ("forward", "backward")),
                "comm": sum(r[ph]["cpu"] for r in rows for ph in ("comm", "p2p")),
                "optimizer": sum(r["optimizer"]["cpu"] for r in rows)}
    lines = [f"# Where the main job's CPU goes ({iters} iterations, {warmup} left out; load average "
             f"{os.getloadavg()[0]:.2f} after; profile {profile})", "", *account_table(rows, plan["cores"]), "",
             "| CPU ms/step, all ranks | measured | planned |", "|---|---|---|"]
    lines += [f"| {k} | {1e3 * measured[k]:.1f} | {1e3 * plan[k]:.1f} |" for k in measured]
    node = sum(measured.values())
    lines += [f"| total / {plan['cores']} cores | {1e3 * node / plan['cores']:.1f} | "
              f"{1e3 * sum(plan[k] for k in measured) / plan['cores']:.1f} |", "",
              f"planner's step {1e3 * plan['step']:.1f} ms (makespan {1e3 * plan['makespan']:.1f})", "",
              *components_table(read_components(args.account, 8, rows), planned_components(profile))]
    return _emit(lines, args.out)


def kept_profile(out: str | None) -> str:
    """Where the calibrated profile is kept: beside the report (REPORT.md -> REPORT.hw8.json), else a new
    temporary directory that is not removed."""
    if out:
        return os.path.splitext(out)[0] + ".hw8.json"
    return os.path.join(tempfile.mkdtemp(prefix="mainjob-"), "hw8.json")


def _emit(lines: list[str], out: str | None) -> int:
    """Print the report and write it to `out` (the Markdown file) when given."""
    report = "\n".join(lines) + "\n"
    print(report)
    if out:
        from hybrid.cliutil import write_text  # whole or not at all, never through a link
        write_text(out, report)
    return 0


def _check(p, args: argparse.Namespace) -> None:
    """What used to fail only after the calibration and the 8-rank run (minutes), as the parser's one line: a
    --hardware profile the planner cannot read, too few logged intervals for a measurement (the first is warm-up),
    an --account folder that cannot be made, a --warmup leaving out every accounted iteration."""
    from hybrid.cliutil import check_output_dir
    from hybrid.planner.calibrate import load_hardware
    if args.hardware:
        try:
            load_hardware(args.hardware)
        except ValueError as e:
            p.error(str(e))
    if args.account:
        try:
            check_output_dir("--account", args.account)
        except ValueError as e:
            p.error(str(e))
        iters = 8 if args.quick else min(args.iters, 40)
        if not args.quick and args.warmup >= iters:
            p.error(f"--warmup {args.warmup} leaves out all {iters} accounted iterations (--account runs "
                    f"min(--iters, 40)); give --warmup < {iters}")
    elif not args.quick and args.iters < 2 * args.log_interval:
        p.error(f"--iters {args.iters} logs {args.iters // args.log_interval} step-time lines at --log-interval "
                f"{args.log_interval}; the report needs 2 (the first is warm-up): give --iters >= "
                f"{2 * args.log_interval} or a smaller --log-interval")


def main(argv: list[str] | None = None) -> int:
    p = _one_line_parser()(prog="bench_planner_mainjob.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    from hybrid.cliutil import nonnegative_int, positive_int
    p.add_argument("--iters", type=positive_int, default=200,
                   help="training iterations (the README's main job: 200)")
    p.add_argument("--log-interval", type=positive_int, default=20, help="iterations per logged p50")
    p.add_argument("--hardware", help="an existing profile (default: calibrate 8 ranks now)")
    p.add_argument("--quick", action="store_true", help="8 iterations, a short calibration: checks the script runs")
    p.add_argument("--out", help="write the Markdown report here")
    p.add_argument("--account", metavar="DIR", help="per rank per phase CPU seconds into DIR beside the planner's")
    p.add_argument("--warmup", type=nonnegative_int, default=5, help="--account: iterations left out at the start")
    p.add_argument("--rank-entry", metavar="DIR", help=argparse.SUPPRESS)  # torchrun's ranks under --account
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--rank-entry"]:  # DIR WARMUP train.py flags...
        rank_entry(argv[1], int(argv[2]), argv[3:])
        return 0
    args = p.parse_args(argv)
    p.check_out("--out", args.out)
    _check(p, args)
    if args.account:
        return account(args)
    iters, interval = (8, 2) if args.quick else (args.iters, args.log_interval)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        profile = args.hardware or os.path.join(tmp, "hw8.json")
        kept = args.hardware or kept_profile(args.out)
        if not args.hardware:
            run([sys.executable, "-m", "hybrid.cli", "calibrate", "--ranks", "8", "--out", profile]
                + (["--seconds", "0.1"] if args.quick else []), env, 1800)
        start = time.time()
        log = run(["torchrun", "--nproc-per-node", "8", os.path.join(ROOT, "scripts", "train.py"), *MAIN_JOB,
                   "--train-iters", str(iters), "--log-interval", str(interval), "--timing-log-interval", "1",
                   "--hardware", profile], env, 7200)  # the per-rank step-time line at every log interval
        wall = time.time() - start
        plan = planned_cpu(profile)  # the pipeline on the shared cores, against the two bounds it replaced
        table = drivers(profile)
        if not args.hardware:
            shutil.copyfile(profile, kept)  # the profile this prediction used, for a rerun to attribute
    predicted, p50s = parse(log)
    if predicted is None or len(p50s) < 2:
        raise SystemExit(f"no prediction or too few step-time lines in train.py's log:\n{log[-3000:]}")
    measured = statistics.median(p50s[1:])  # the first interval is warm-up
    error = predicted / measured - 1
    lines = ["# The planner on the main job (tp 2 x pp 2 x dp 2, tiny-gpt2, 8 gloo ranks)", "",
             f"- date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {load_before:.2f} before, "
             f"{os.getloadavg()[0]:.2f} after; {os.cpu_count()} CPUs; {iters} iterations ({wall:.0f} s)"
             + ("; --quick: no claim" if args.quick else ""), "",
             "| predicted s/step | measured median s/step | per-interval p50s | error |", "|---|---|---|---|",
             f"| {predicted:.4g} | {measured:.4g} | {', '.join(f'{x:.4g}' for x in p50s)} | {100 * error:+.1f} % |",
             "", f"planner: the pipeline on the {plan['cores']} shared cores {plan['pipeline']:.4g} s (a core per "
             f"rank, the makespan: {plan['makespan']:.4g} s); the node's CPU a step / {plan['cores']} cores "
             f"{sum(plan[k] for k in ('compute', 'comm', 'optimizer')) / plan['cores']:.4g} s (compute "
             f"{plan['compute']:.4g}, collectives and messages {plan['comm']:.4g}, optimizer {plan['optimizer']:.4g} "
             "CPU s; `--account DIR` measures the same)", "",
             f"The profile it used: {kept}. What sets the plan there (each field alone +10 %):", "", *table]
    return _emit(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
