"""`scripts/plot_run.py`: loss, throughput and peak-memory curves of one or more training runs, to one PNG.

    python scripts/plot_run.py run.jsonl --out loss.png                  # a --metrics-file
    python scripts/plot_run.py tb/ other.jsonl --label tp2 --label tp4 --out cmp.png   # runs side by side

A run is what train.py wrote: its `--metrics-file` (JSON lines) or its `--tensorboard-dir` (read with
tensorboard's EventAccumulator, Megatron's tags). Three panels, one curve per run in each: lm loss per logged
iteration (validation losses as markers on a dashed line of the same colour), tokens/s over all ranks, and the
peak memory of the fullest rank (CUDA max allocated, or CPU peak RSS: hybrid/metrics/peak_memory.py). A metrics file
appended to by a resumed run holds some iterations twice; the later record wins. matplotlib draws with its Agg
backend (no display needed); the PNG is written atomically.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import json
import os
from dataclasses import dataclass, field

from hybrid.cliutil import (HelpFormatter, OneLineParser, atomic_output, check_output_file,
                            check_replaces_an_image, fail)
from hybrid.metrics.peak_memory import CPU_MEASURE, CUDA_MEASURE
from hybrid.metrics.writer import TB_NAMES

MEMORY = (CPU_MEASURE, CUDA_MEASURE)


@dataclass
class Run:
    """One run's curves, each {iteration: value}.

    Attributes:
        label: the legend entry.
        loss: training lm loss at each logged iteration.
        valid: validation lm loss at each evaluation.
        tokens_per_s: tokens/s over all ranks at each logged iteration.
        memory: peak memory of the fullest rank, bytes; memory_label names the measure.
    """

    label: str
    loss: dict[int, float] = field(default_factory=dict)
    valid: dict[int, float] = field(default_factory=dict)
    tokens_per_s: dict[int, float] = field(default_factory=dict)
    memory: dict[int, float] = field(default_factory=dict)
    memory_label: str = ""


def read_jsonl(path: str, label: str) -> Run:
    """A --metrics-file: one JSON object per log interval (lm_loss, ...) or evaluation (lm loss validation)."""
    run = Run(label)
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if not any(line.strip() for line in lines):
        raise ValueError(f"{path} is empty: no records yet (train.py writes one per --log-interval)")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} line {n} is not JSON ({e.msg}); give a train.py --metrics-file") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("iteration"), int):
            raise ValueError(f"{path} line {n} has no integer \"iteration\"; give a train.py --metrics-file")
        it = rec["iteration"]
        for key, curve in (("lm_loss", run.loss), ("lm loss validation", run.valid),
                           ("tokens_per_s", run.tokens_per_s)):
            if _number(rec.get(key)):
                curve[it] = float(rec[key])
        for m in MEMORY:
            if _number(rec.get(m.key)):
                run.memory[it], run.memory_label = float(rec[m.key]), m.label
    return _checked(run, path)


def read_tensorboard(path: str, label: str) -> Run:
    """A --tensorboard-dir: the scalars under Megatron's tags (hybrid/metrics/writer.py's TB_NAMES)."""
    if not glob.glob(os.path.join(path, "events.out.tfevents.*")):
        raise ValueError(f"{path} holds no TensorBoard event files (events.out.tfevents.*); give the run's "
                         f"--tensorboard-dir")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(path, size_guidance={"scalars": 0})  # 0: every event, not a sample
    acc.Reload()
    tags = set(acc.Tags()["scalars"])

    def curve(tag: str) -> dict[int, float]:
        return {e.step: e.value for e in acc.Scalars(tag)} if tag in tags else {}
    run = Run(label, loss=curve(TB_NAMES["lm_loss"]), valid=curve("lm loss validation"),
              tokens_per_s=curve(TB_NAMES["tokens_per_s"]))
    for m in MEMORY:
        if m.tag in tags:
            run.memory, run.memory_label = curve(m.tag), m.label
    return _checked(run, path)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _checked(run: Run, path: str) -> Run:
    if not run.loss:
        raise ValueError(f"{path} has no training loss (lm_loss / 'lm loss'); did the run reach its first "
                         f"--log-interval?")
    return run


def _not_a_checkpoint(path: str) -> None:
    """A RUN naming a checkpoint (train.py's --save, one iteration of it, a file of one; DeepSpeed's, Megatron-LM's)
    that did not read as a run got "holds no TensorBoard event files" or "line 1 is not JSON": say what it is and
    where the run's curves are. Called only once reading failed, so a metrics file or event files kept beside
    checkpoints still plot."""
    from hybrid.checkpoint import store
    root = store.enclosing_checkpoint(path)
    if root is None:
        return
    parent = os.path.dirname(os.path.realpath(path))
    if os.path.isfile(path) and not (parent != root or os.path.basename(path) == store.LATEST):
        return  # a file of the checkpoint root that is not `latest`: not a checkpoint's own
    what = "is a checkpoint directory" if os.path.realpath(path) == root else \
        f"is inside the checkpoint directory {root}"
    raise ValueError(f"{path} {what} (a run's --save), which holds no curves: give the run's --metrics-file FILE "
                     f"or --tensorboard-dir DIR")


def read_run(path: str, label: str) -> Run:
    try:
        return _read_run(path, label)
    except ValueError:
        _not_a_checkpoint(path)  # the clearer line, when that is what it is
        raise


def _read_run(path: str, label: str) -> Run:
    if os.path.isdir(path):
        return read_tensorboard(path, label)
    if not os.path.exists(path):
        raise ValueError(f"{path} does not exist; give a train.py --metrics-file or --tensorboard-dir")
    if not os.path.isfile(path):
        raise ValueError(f"{path} is not a regular file or directory; give a --metrics-file or --tensorboard-dir")
    return read_jsonl(path, label)


def draw(runs: list[Run]):
    """The figure: loss, tokens/s and peak memory panels, one curve per run in each (same colour per run)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, tps_ax, mem_ax) = plt.subplots(1, 3, figsize=(15, 4.5))
    for i, run in enumerate(runs):
        colour = f"C{i % 10}"
        xs = sorted(run.loss)
        loss_ax.plot(xs, [run.loss[x] for x in xs], color=colour, label=run.label)
        if run.valid:
            vx = sorted(run.valid)
            loss_ax.plot(vx, [run.valid[x] for x in vx], "o--", color=colour, markersize=4,
                         label=f"{run.label} (validation)")
        if run.tokens_per_s:
            tx = sorted(run.tokens_per_s)
            tps_ax.plot(tx, [run.tokens_per_s[x] for x in tx], color=colour, label=run.label)
        if run.memory:
            mx = sorted(run.memory)
            mem_ax.plot(mx, [run.memory[x] / 2**20 for x in mx], color=colour,
                        label=f"{run.label} ({run.memory_label})")
    for ax, title, ylabel in ((loss_ax, "lm loss", "loss"), (tps_ax, "throughput", "tokens/s (all ranks)"),
                              (mem_ax, "peak memory of the fullest rank", "MiB (2^20 bytes)")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("iteration")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
            if ax is not loss_ax:  # rates and memory from 0: a 2 MiB drift on 400 MiB is not a leak
                ax.set_ylim(bottom=0)
        else:
            ax.text(0.5, 0.5, "not in these runs", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    return fig


# the flags a run was written with, which users bring from train.py or TensorBoard (`tensorboard --logdir`): here the
# run's file or folder is a RUN itself (round 16: "see --help" for --tensorboard-dir)
RUN_HINTS = {flag: f"{flag}: give the {what} as a RUN, without the flag (plot_run.py {example} --out run.png)"
             for flag, what, example in (("--tensorboard-dir", "TensorBoard folder", "tb/"),
                                         ("--logdir", "TensorBoard folder", "tb/"),
                                         ("--metrics-file", "metrics file", "run.jsonl"))}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="plot_run.py", description=__doc__, formatter_class=HelpFormatter, hints=RUN_HINTS)
    p.add_argument("runs", nargs="+", metavar="RUN", help="a train.py --metrics-file or --tensorboard-dir")
    p.add_argument("--out", default="run.png", metavar="FILE", help="image to write (PNG)")
    p.add_argument("--label", action="append", default=None, metavar="NAME",
                   help="legend name of each RUN in order (repeat); None: the paths")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        labels = args.label or list(args.runs)
        if len(labels) != len(args.runs):
            raise ValueError(f"--label given {len(labels)} times for {len(args.runs)} runs; give one per RUN")
        if not args.out.lower().endswith(".png"):
            raise ValueError(f"--out {args.out!r}: plot_run.py writes PNG; give a FILE.png")
        check_output_file("--out", args.out)
        check_replaces_an_image(args.out, "--out")
        try:
            importlib.import_module("matplotlib")
        except ImportError:
            raise ValueError("needs matplotlib: pip install matplotlib (pip install -e . installs it)") from None
        runs = [read_run(path, label) for path, label in zip(args.runs, labels)]
    except (ValueError, OSError) as e:
        raise fail(f"plot_run.py: error: {e}") from None
    import matplotlib.pyplot as plt
    fig = draw(runs)
    with atomic_output(args.out, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    last = ", ".join(f"{r.label}: lm loss {r.loss[max(r.loss)]:.4f} at iteration {max(r.loss)}" for r in runs)
    print(f"plot_run.py: wrote {args.out} ({len(runs)} run{'s' if len(runs) > 1 else ''}; {last})")


if __name__ == "__main__":
    main()
