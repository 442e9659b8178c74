"""The committed reference loss curve of the README's quick-start run (tests/data/quickstart_losses.json).

    python scripts/reference_losses.py            # run the quick start's first ITERATIONS steps, compare
    python scripts/reference_losses.py --write    # run them and overwrite the reference (an intended change)

The run is the README's main command exactly as written (read from README.md, so the two cannot drift apart),
with two flags appended that leave its numbers alone: `--exit-interval N` stops after N steps (the learning-rate
schedule and the data order still follow the command's --train-iters) and `--log-interval 1` logs every step
(logging reads the loss, it does not change it). Every later part of the command (the plot) runs too. The first N
losses are kept as logged twice: the JSON-lines file's full-precision decimal (Python's shortest round-trip repr,
so equal strings mean equal floats) and the log line's 4 decimals. tests/test_training.py compares a fresh run's
strings with these for equality, so any numeric change to training shows up (torchtitan's loss-curve check, on CPU).

The numbers are this CPU's kernels': another torch version, CPU instruction set or threads per rank may round
differently. The reference records all three; on a mismatch the test names them, and --write makes a new
reference for the new environment.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "tests", "data", "quickstart_losses.json")
ITERATIONS = 20  # about 10 s of the run on 2 cores; the loss falls from 5.5 to 4.2 in them
LOG = re.compile(r"^ iteration +(\d+)/\d+ \| lm loss (\S+) \|", re.M)


def _one_line_parser():
    """hybrid.cliutil's OneLineParser (a bad flag is one line naming it), imported from this checkout."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from hybrid.cliutil import OneLineParser
    return OneLineParser


def readme_main_command() -> str:
    """The quick start's command line: the first README.md line starting `bash scripts/setup.sh && torchrun`."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("bash scripts/setup.sh && torchrun"):
                return line.strip()
    raise RuntimeError("README.md has no quick-start line starting 'bash scripts/setup.sh && torchrun'")


def command_parts(command: str) -> list[list[str]]:
    """The command's `&&` parts as argv lists, setup.sh dropped (it installs; the checkout is installed),
    torchrun and python run by this interpreter, scripts/ paths made absolute (the run's directory is a fresh
    one, where its relative outputs land)."""
    parts = []
    for part in command.split("&&"):
        words = shlex.split(part)
        if words[:2] == ["bash", "scripts/setup.sh"]:
            continue
        if words[0] == "torchrun":
            words = [sys.executable, "-m", "torch.distributed.run"] + words[1:]
        elif words[0] in ("python", "python3"):
            words = [sys.executable] + words[1:]
        parts.append([os.path.join(ROOT, w) if w.startswith("scripts/") else w for w in words])
    return parts


def flag_value(words: list[str], flag: str) -> str | None:
    return words[words.index(flag) + 1] if flag in words else None


def environment() -> dict:
    """What the losses' last bits depend on besides the code: torch, the CPU's kernels, threads per rank (as
    hybrid/train/main.py sets them: the CPU count over the local ranks)."""
    ranks = int(flag_value(command_parts(readme_main_command())[0], "--nproc-per-node") or 1)
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads_per_rank": max(1, (os.cpu_count() or 1) // ranks)}


def run_parts(argv: list[str], cwd: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """One part of the command, as a new process (tests pass hybrid.testing's forked equivalent instead)."""
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def run_quickstart(workdir: str, iterations: int = ITERATIONS, timeout: float = 600, runner=run_parts) -> dict:
    """Run every part of the README command in `workdir`, training stopped after `iterations` steps. Returns
    {"stdout": train's stdout, "outputs": [each later part's stdout], "metrics_file": path, "losses": ...,
    "logged": ...}; raises RuntimeError with the output's tail if a part fails. `runner(argv, cwd, env, timeout)`
    runs one part (argv from command_parts) and returns a subprocess.CompletedProcess."""
    parts = command_parts(readme_main_command())
    parts[0] = parts[0] + ["--exit-interval", str(iterations), "--log-interval", "1"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    outs = []
    for argv in parts:
        out = runner(argv, cwd=workdir, env=env, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)} failed ({out.returncode}):\n{out.stdout[-2000:]}\n"
                               f"{out.stderr[-3000:]}")
        outs.append(out.stdout)
    metrics = os.path.join(workdir, flag_value(parts[0], "--metrics-file"))
    with open(metrics, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    return {"stdout": outs[0], "outputs": outs[1:], "metrics_file": metrics, "records": records,
            "losses": [repr(r["lm_loss"]) for r in records if "lm_loss" in r][:iterations],
            "logged": [loss for _, loss in LOG.findall(outs[0])][:iterations]}


def reference_record(run: dict) -> dict:
    return {"command": readme_main_command(), "iterations": len(run["losses"]),
            "appended": ["--exit-interval", str(len(run["losses"])), "--log-interval", "1"],
            "environment": environment(),
            "lm_loss": run["losses"], "lm_loss_logged": run["logged"]}


def load_reference() -> dict:
    with open(REFERENCE, encoding="utf-8") as f:
        return json.load(f)


def differences(run: dict, reference: dict) -> list[str]:
    """Why a run's curve is not the reference's (empty when equal)."""
    diffs = []
    if reference["command"] != readme_main_command():
        diffs.append("README's quick-start command changed since the reference was written")
    for name, got, want in (("lm_loss", run["losses"], reference["lm_loss"]),
                            ("log line", run["logged"], reference["lm_loss_logged"])):
        bad = [(i + 1, g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w]
        if len(got) != len(want):
            diffs.append(f"{name}: {len(got)} losses, the reference has {len(want)}")
        if bad:
            diffs.append(f"{name}: first difference at iteration {bad[0][0]}: {bad[0][1]} vs {bad[0][2]} "
                         f"({len(bad)} of {len(want)} differ)")
    if diffs and reference["environment"] != environment():
        diffs.append(f"environment differs: reference {reference['environment']}, here {environment()}")
    return diffs


def main(argv: list[str] | None = None) -> None:
    import tempfile
    p = _one_line_parser()(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", action="store_true", help="overwrite tests/data/quickstart_losses.json")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quickstart.") as d:
        run = run_quickstart(d)
    if args.write:
        from hybrid.cliutil import write_text  # whole or not at all, never through a link
        write_text(REFERENCE, json.dumps(reference_record(run), indent=1) + "\n")
        print(f"wrote {REFERENCE}: {len(run['losses'])} losses, {run['losses'][0]} ... {run['losses'][-1]}")
        return
    diffs = differences(run, load_reference())
    print("\n".join(diffs) if diffs else f"equal to {REFERENCE} ({len(run['losses'])} losses)")
    sys.exit(1 if diffs else 0)


if __name__ == "__main__":
    main()
