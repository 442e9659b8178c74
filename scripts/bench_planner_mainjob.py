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

Not a timed test: a script that writes a results file.
"""

from __future__ import annotations

import argparse
import os
import re
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=200, help="training iterations (the README's main job: 200)")
    p.add_argument("--log-interval", type=int, default=20, help="iterations per logged p50")
    p.add_argument("--hardware", help="an existing profile (default: calibrate 8 ranks now)")
    p.add_argument("--quick", action="store_true", help="8 iterations, a short calibration: checks the script runs")
    p.add_argument("--out", help="write the Markdown report here")
    args = p.parse_args(argv)
    iters, interval = (8, 2) if args.quick else (args.iters, args.log_interval)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        profile = args.hardware or os.path.join(tmp, "hw8.json")
        if not args.hardware:
            run([sys.executable, "-m", "hybrid.cli", "calibrate", "--ranks", "8", "--out", profile]
                + (["--seconds", "0.1"] if args.quick else []), env, 1800)
        start = time.time()
        log = run(["torchrun", "--nproc-per-node", "8", os.path.join(ROOT, "scripts", "train.py"), *MAIN_JOB,
                   "--train-iters", str(iters), "--log-interval", str(interval), "--hardware", profile], env, 7200)
        wall = time.time() - start
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
             f"| {predicted:.4g} | {measured:.4g} | {', '.join(f'{x:.4g}' for x in p50s)} | {100 * error:+.1f} % |"]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
