"""CPU a training rank spends starting up: importing the entry point, and a whole one-step run on a preset.

    python scripts/bench_startup.py                         # this checkout, 7 repetitions each, medians
    python scripts/bench_startup.py --checkout /tmp/old     # another checkout (an earlier commit), to compare
    python scripts/bench_startup.py --quick                 # one repetition (the suite's smoke test)

Each measurement is a fresh interpreter (`python -c ...`, PYTHONPATH at the checkout, OMP_NUM_THREADS=1, one
thread as under torchrun with several ranks), timed as user + sys CPU of the child (resource.RUSAGE_CHILDREN), so
other jobs on the machine change it little; wall time is printed too but means little on a shared machine.
Rows: `import hybrid.train.main` (what torchrun's every rank pays before its first line), and `python -m
hybrid.train` for one step of tiny-gpt2 (the import, the model, one optimizer step; torch imports torch._dynamo
at the first optimizer's construction). Each row says whether transformers and torch.distributed.checkpoint were
imported.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORT = ("import json, sys; print(json.dumps({m: m in sys.modules for m in "
          "('transformers', 'torch.distributed.checkpoint', 'torch._dynamo')}))")
ROWS = {
    "import hybrid.train.main": "import hybrid.train.main; " + REPORT,
    "one step of tiny-gpt2 (python -m hybrid.train)": (
        "from hybrid.train.main import main; main(['--train-iters', '1', '--seq-length', '32', "
        "'--micro-batch-size', '2', '--global-batch-size', '2', '--eval-iters', '0']); " + REPORT),
}


def _one_line_parser():
    """hybrid.cliutil's OneLineParser from this checkout, imported when parsing (`python scripts/...`)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from hybrid.cliutil import OneLineParser
    return OneLineParser


def measure(code: str, checkout: str) -> tuple[float, float, dict]:
    """(CPU s, wall s, heavy modules imported) of one fresh interpreter running `code`."""
    env = dict(os.environ, PYTHONPATH=checkout, OMP_NUM_THREADS="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as cwd:
        out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"bench_startup: {code[:60]}... failed:\n{out.stderr[-2000:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return cpu, wall, json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = _one_line_parser()(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkout", default=ROOT, help="the checkout to measure (default: this one)")
    p.add_argument("--repeats", type=int, default=7, help="repetitions per row (the median is reported)")
    p.add_argument("--quick", action="store_true", help="one repetition")
    p.add_argument("--out", help="also write the table (markdown) to this file")
    a = p.parse_args()
    p.check_out("--out", a.out)
    repeats = 1 if a.quick else a.repeats
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    lines = [f"checkout {a.checkout}; {repeats} repetition(s); load average {load} before the first row", "",
             "| what | CPU s (median) | CPU s (min-max) | wall s (median) | transformers | "
             "torch.distributed.checkpoint |", "|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for name, code in ROWS.items():
        runs = [measure(code, a.checkout) for _ in range(repeats)]
        cpu = [r[0] for r in runs]
        mods = runs[-1][2]
        lines.append(f"| {name} | {statistics.median(cpu):.2f} | {min(cpu):.2f}-{max(cpu):.2f} | "
                     f"{statistics.median(r[1] for r in runs):.2f} | "
                     f"{'imported' if mods['transformers'] else 'no'} | "
                     f"{'imported' if mods['torch.distributed.checkpoint'] else 'no'} |")
        print(lines[-1], flush=True)
    if a.out:
        from hybrid.cliutil import write_text  # whole or not at all, never through a link
        write_text(a.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
