"""Eager vs `--compile` on CPU: train.py's step time on README's main command, the runs interleaved.

    python scripts/bench_compile.py                  # README's main layout (8 ranks: tp 2, pp 2, dp 2), 3 pairs
    python scripts/bench_compile.py --pairs 5 --out docs/results/bench_compile.md
    python scripts/bench_compile.py --extra "--recompute-granularity full"   # both runs with these flags too
    python scripts/bench_compile.py --extra "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1"  # dp 8
    python scripts/bench_compile.py --quick          # 1 rank, 1 pair of a few steps: the smoke test

Each run is `torchrun scripts/train.py` (OMP_NUM_THREADS=1, as torchrun sets it for several ranks) with the main
command's layout and batch (`--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --micro-batch-size 2
--global-batch-size 16 --seq-length 128`, tiny-gpt2) and no checkpoint, evaluation or timeline. Its metrics file
gives the mean step time of every logged interval; the first interval (the compilation, the first steps' warm-up)
is left out and reported apart, the median of the others is the run's step time. Eager and compiled runs alternate
(E C E C ...) so a change in the machine's load falls on both; each pair gives a ratio eager / compiled (> 1: the
compiled run is faster), reported as the median and the range over pairs. The load average is recorded: on a
shared machine the ratios mean little.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--micro-batch-size", "2",
        "--global-batch-size", "16", "--seq-length", "128"]  # README's main command, its layout and batch
QUICK = ["--micro-batch-size", "2", "--global-batch-size", "2", "--seq-length", "32"]


def _one_line_parser():
    """hybrid.cliutil's OneLineParser from this checkout, imported when parsing (`python scripts/...`)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from hybrid.cliutil import OneLineParser
    return OneLineParser


def run_once(flags: list[str], ranks: int, iters: int, interval: int, quick: bool = False) -> tuple[float, float]:
    """(median step s after the first interval, the first interval's step s) of one train.py run. `quick` (the
    smoke test): the same torchrun command with its ranks forked from hybrid.testing's forkserver, no new
    interpreters (their ~3 s of CPU each measure nothing here)."""
    with tempfile.TemporaryDirectory() as cwd:
        metrics = os.path.join(cwd, "m.jsonl")
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                os.path.join(ROOT, "scripts", "train.py"), *flags, "--train-iters", str(iters),
                "--log-interval", str(interval), "--eval-iters", "0", "--metrics-file", metrics]
        env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
        if quick:
            sys.path.insert(0, ROOT)
            from hybrid import testing
            out = testing.torchrun_cli(argv[3:], env=env, cwd=cwd)
        else:
            out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"bench_compile: {shlex.join(argv[3:])} failed:\n{out.stdout[-2000:]}{out.stderr[-3000:]}")
        with open(metrics) as f:
            steps = [r["iteration_time_s"] for r in map(json.loads, f) if "iteration_time_s" in r]
    if len(steps) < 2:
        raise SystemExit(f"bench_compile: {len(steps)} logged intervals; raise --iters")
    return statistics.median(steps[1:]), steps[0]


def table(rows: list[tuple[float, float, float, float]], flags: list[str], ranks: int) -> str:
    """The markdown report: one line per pair, then the ratio's median and range."""
    ratios = [e / c for e, _, c, _ in rows]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [f"train.py `{shlex.join(flags)}` on {ranks} ranks, eager vs `--compile`, interleaved; "
             f"load average {load} (1, 5, 15 min)", "",
             "| pair | eager step s | eager first interval s | compiled step s | compiled first interval s | "
             "eager / compiled |", "|---|---|---|---|---|---|"]
    lines += [f"| {i} | {e:.4f} | {ef:.3f} | {c:.4f} | {cf:.3f} | {e / c:.3f} |" for i, (e, ef, c, cf) in
              enumerate(rows)]
    lines += ["", f"eager / compiled: median {statistics.median(ratios):.3f}, range {min(ratios):.3f} - "
              f"{max(ratios):.3f} over {len(ratios)} pairs (> 1: compile faster)"]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = _one_line_parser()(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=3, help="eager / compiled pairs, interleaved")
    p.add_argument("--iters", type=int, default=60, help="steps per run")
    p.add_argument("--interval", type=int, default=10, help="steps per logged interval (the first is left out)")
    p.add_argument("--extra", default="", help="more train.py flags for both runs, one quoted string")
    p.add_argument("--quick", action="store_true", help="1 rank, 1 pair of a few steps: the smoke test")
    p.add_argument("--out", help="also write the table (markdown) to this file")
    a = p.parse_args()
    p.check_out("--out", a.out)
    flags, ranks = (QUICK, 1) if a.quick else (MAIN, 8)
    iters, interval, pairs = (4, 2, 1) if a.quick else (a.iters, a.interval, a.pairs)
    flags = flags + shlex.split(a.extra)
    rows = []
    for i in range(pairs):
        eager = run_once(flags, ranks, iters, interval, a.quick)
        compiled = run_once(flags + ["--compile"], ranks, iters, interval, a.quick)
        rows.append((*eager, *compiled))
        print(f"pair {i}: eager {eager[0]:.4f} s, compiled {compiled[0]:.4f} s a step", flush=True)
    text = table(rows, flags, ranks)
    print(text)
    if a.out:
        from hybrid.cliutil import write_text  # whole or not at all, never through a link
        write_text(a.out, text)


if __name__ == "__main__":
    main()
