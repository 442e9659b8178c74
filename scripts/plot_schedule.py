"""Draw a pipeline schedule as a PNG: one row per pipeline rank, one box per forward / backward (B / W).

    python scripts/plot_schedule.py --schedule 1f1b --pp 4 --microbatches 8 [--v 2] [--tb-ratio 2] [--out FILE.png]
    python scripts/plot_schedule.py --schedule zbh1 --pp 4 --microbatches 8 --tb-ratio 2   # tF = tB = tW
    python scripts/plot_schedule.py --all --pp 4 --microbatches 8 --tb-ratio 2   # the pictures in docs/pipeline.md
    python scripts/plot_schedule.py --trace timeline.json [--out FILE.png]

Two sources:

* a schedule: `build_schedule(kind, pp, m, v)` run through `simulate` with a forward of 1 time unit and a
  backward of `--tb-ratio` units (per model chunk), messages free -- the same lists the executor runs; the
  zero-bubble schedules (zbh1, zbv) split each backward into B and W, half of it each (so --tb-ratio 2 gives
  the paper's tF = tB = tW);
* `--all`: every schedule of `ALL` (GPipe, 1F1B, interleaved v = 2, ZB-H1, ZBV) at the same pp, m and costs, one PNG
  each under `--out-dir` (default docs/img) with the default names below;
* a measured run: the Chrome trace `scripts/train.py --timeline` writes (events with cat "forward" /
  "backward", pid = pipeline stage, tid = global rank, ts / dur in microseconds, args.microbatch and
  args.chunk). One row per global rank; communication batches are drawn as a thin grey strip.

Boxes read F3 / B3 (forward / backward of micro-batch 3; under zbh1 / zbv B3 is the input gradient and W3 the
weight gradients), with the model chunk as a letter when v > 1 (F3a = chunk 0, F3b = chunk 1). Each micro-batch
has its own hue: forward light, backward dark, W hatched; white is
idle (the bubble, or waiting on a message). The title gives the bubble fraction, 1 - busy / (ranks x
makespan); for a simulated schedule the right margin gives each rank's peak of (micro-batch, chunk)
activation sets held.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

try:  # without matplotlib, --help and the flag checks still work; main() then says how to install it
    import matplotlib  # noqa: E402

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: E402
    from matplotlib.colors import to_rgb  # noqa: E402
    from matplotlib.patches import Patch, Rectangle  # noqa: E402
    from matplotlib.transforms import offset_copy  # noqa: E402
except ImportError:
    matplotlib = None

from hybrid.pipeline.schedules import ScheduleKind, build_schedule, validate  # noqa: E402
from hybrid.pipeline.simulate import Costs, simulate  # noqa: E402
from hybrid.cliutil import OneLineParser, atomic_output, positive_int  # noqa: E402

ALL = (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED, ScheduleKind.ZB_H1, ScheduleKind.ZBV)
COMPUTE = ("forward", "backward", "backward_input", "backward_weight")
LETTER = {"forward": "F", "backward": "B", "backward_input": "B", "backward_weight": "W"}


@dataclass(frozen=True)
class Box:
    """One compute (or communication) interval on one row."""

    row: int
    start: float
    end: float
    kind: str  # "forward", "backward", "backward_input", "backward_weight" or "comm"
    microbatch: int = 0
    chunk: int = 0


@dataclass
class Picture:
    """What is drawn: rows top to bottom, boxes, the time unit of the x axis, and notes per row."""

    rows: list[str]
    boxes: list[Box]
    v: int
    unit: str
    title: str
    right_notes: list[str] | None = None  # one per row, in the right margin
    right_header: str = ""  # above the right notes


# --- sources ------------------------------------------------------------------------------------

def from_schedule(kind: ScheduleKind, pp: int, m: int, v: int, tb_ratio: float) -> Picture:
    result = simulate(build_schedule(kind, pp, m, v), Costs(forward=1.0, backward=tb_ratio), placement=kind.placement)
    boxes = [Box(rank, s.start, s.end, s.action.op.value, s.action.microbatch, s.action.chunk)
             for rank, spans in enumerate(result.timelines) for s in spans]
    name = {ScheduleKind.ONE_F_ONE_B: "1F1B", ScheduleKind.GPIPE: "GPipe",
            ScheduleKind.INTERLEAVED: f"interleaved 1F1B, v={v}", ScheduleKind.ZB_H1: "ZB-H1",
            ScheduleKind.ZBV: "ZBV (V placement: chunk a = stage r, chunk b = stage 2pp-1-r)"}[kind]
    unit = "time (one chunk forward = 1" + (f", backward = {tb_ratio:g}" if tb_ratio != 1 else ", backward = 1")
    unit += f": B = W = {tb_ratio / 2:g})" if kind.splits_backward else ")"
    title = (f"{name}, pp={pp}, m={m}: makespan {result.makespan:g}, "
             f"bubble {100 * result.bubble_fraction:.0f}%")
    notes = [str(p) for p in result.peak_in_flight]
    header = "peak held\n(mb, chunk)" if v > 1 else "peak held\n(micro-batches)"
    if kind.splits_backward:
        header += "\nF to W"
    return Picture([f"rank {r}" for r in range(pp)], boxes, v, unit, title, notes, header)


def from_trace(path: str) -> Picture:
    """A Chrome trace of hybrid's executor (hybrid.pipeline.timeline). ValueError if it is not one."""
    try:
        with open(path) as f:
            trace = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--trace {path}: cannot read a JSON trace ({e})") from None
    events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    complete = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e and "dur" in e]
    compute = [e for e in complete if e.get("cat") in COMPUTE]
    if not compute:
        raise ValueError(f"--trace {path}: no complete events with cat 'forward', 'backward' (or B / W) "
                         "(expected the output of scripts/train.py --timeline)")
    keys = sorted({(e.get("pid", 0), e.get("tid", 0)) for e in compute})
    row_of = {k: i for i, k in enumerate(keys)}
    t0 = min(e["ts"] for e in complete)
    boxes = []
    for e in complete:
        key = (e.get("pid", 0), e.get("tid", 0))
        if key not in row_of:
            continue
        args = e.get("args", {})
        kind = e["cat"] if e.get("cat") in COMPUTE else "comm"
        start = (e["ts"] - t0) / 1e3
        boxes.append(Box(row_of[key], start, start + e["dur"] / 1e3, kind,
                         int(args.get("microbatch", 0)), int(args.get("chunk", 0))))
    v = 1 + max(b.chunk for b in boxes if b.kind in COMPUTE)
    busy = [0.0] * len(keys)
    for b in boxes:
        if b.kind in COMPUTE:
            busy[b.row] += b.end - b.start
    span = max(b.end for b in boxes)
    bubble = 1 - sum(busy) / (len(keys) * span) if span else 0.0
    m = 1 + max(b.microbatch for b in boxes if b.kind in COMPUTE)
    title = (f"measured: {os.path.basename(path)}, {len(keys)} ranks, m={m}" + (f", v={v}" if v > 1 else "")
             + f": step {span:.1f} ms, idle {100 * bubble:.0f}%")
    rows = [f"stage {pid} (rank {tid})" if len({p for p, _ in keys}) != len(keys) else f"stage {pid}"
            for pid, tid in keys]
    return Picture(rows, boxes, v, "time (ms)", title)


# --- drawing ------------------------------------------------------------------------------------

def _palette(n: int) -> list[tuple[float, float, float]]:
    """n distinct mid-saturation hues (tab10 without its grey, kept for communication; then tab20's
    lighter hues; then cycling)."""
    base = [to_rgb(c) for i, c in enumerate(plt.get_cmap("tab10").colors) if i != 7]
    extra = [to_rgb(c) for c in plt.get_cmap("tab20").colors[1::2]]
    colours = base + extra
    return [colours[i % len(colours)] for i in range(n)]


def _mix(rgb: tuple[float, float, float], other: tuple[float, float, float], t: float) -> tuple[float, ...]:
    return tuple((1 - t) * a + t * b for a, b in zip(rgb, other))


def _label(box: Box, v: int) -> str:
    chunk = chr(ord("a") + box.chunk) if v > 1 else ""
    return f"{LETTER[box.kind]}{box.microbatch}{chunk}"


def draw(pic: Picture, out: str) -> None:
    compute = [b for b in pic.boxes if b.kind in COMPUTE]
    m = 1 + max(b.microbatch for b in compute)
    hues = _palette(m)
    light = [_mix(h, (1, 1, 1), 0.55) for h in hues]
    dark = [_mix(h, (0, 0, 0), 0.25) for h in hues]
    makespan = max(b.end for b in pic.boxes)
    shortest = min(b.end - b.start for b in compute if b.end > b.start)
    n = len(pic.rows)
    # about 0.42 inch per shortest box so labels fit, within sane page bounds
    width = min(max(8.0, 0.42 * makespan / shortest + 2.5), 26.0)
    fig, ax = plt.subplots(figsize=(width, 0.62 * n + 1.2))
    height = 0.8
    for r in range(n):  # row frame: white inside = idle
        ax.add_patch(Rectangle((0, r - height / 2), makespan, height, facecolor="white", edgecolor="#b0b0b0",
                               linewidth=0.6, zorder=0))
    fits = (width - 2.5) / makespan * shortest > 0.3  # inches per shortest box
    for b in pic.boxes:
        y = b.row
        if b.kind == "comm":
            ax.add_patch(Rectangle((b.start, y + height / 2 - 0.1), max(b.end - b.start, 1e-9), 0.08,
                                   facecolor="#9a9a9a", edgecolor="none", zorder=1))
            continue
        weight = b.kind == "backward_weight"  # W: the backward's hue, lighter, hatched
        face = light[b.microbatch] if b.kind == "forward" else _mix(dark[b.microbatch], (1, 1, 1), 0.35) \
            if weight else dark[b.microbatch]
        ax.add_patch(Rectangle((b.start, y - height / 2), b.end - b.start, height, facecolor=face,
                               edgecolor="#303030", linewidth=0.6, zorder=2, hatch="///" if weight else None))
        if fits or b.end - b.start >= 1.5 * shortest:
            ax.text((b.start + b.end) / 2, y, _label(b, pic.v), ha="center", va="center", zorder=3,
                    fontsize=8 if pic.v == 1 else 7, color="black" if b.kind == "forward" else "white",
                    fontweight="normal" if b.kind == "forward" else "bold")
    ax.set_xlim(0, makespan)
    ax.set_ylim(n - 0.5, -0.5)  # rank 0 on top
    ax.set_yticks(range(n), pic.rows)
    ax.set_xlabel(pic.unit)
    ax.set_title(pic.title, fontsize=11, loc="left")
    ax.spines[["top", "right", "left"]].set_visible(False)
    ax.tick_params(axis="y", length=0)
    if pic.right_notes:
        for r, note in enumerate(pic.right_notes):
            ax.annotate(note, (1.02, r), xycoords=("axes fraction", "data"), ha="center", va="center",
                        fontsize=9, color="#303030", annotation_clip=False)
        ax.annotate(pic.right_header, (1.02, -0.5), xycoords=("axes fraction", "data"), ha="center",
                    va="bottom", fontsize=7, color="#404040", annotation_clip=False)
    split = any(b.kind == "backward_weight" for b in pic.boxes)
    handles = [Patch(facecolor=light[0], edgecolor="#303030", label="forward (light)"),
               Patch(facecolor=dark[0], edgecolor="#303030", label="B: input grad (dark)" if split else
                     "backward (dark)")]
    if split:
        handles.append(Patch(facecolor=_mix(dark[0], (1, 1, 1), 0.35), edgecolor="#303030", hatch="///",
                             label="W: weight grads"))
    handles.append(Patch(facecolor="white", edgecolor="#b0b0b0", label="idle"))
    if any(b.kind == "comm" for b in pic.boxes):
        handles.append(Patch(facecolor="#9a9a9a", label="send / recv batch"))
    note = "one hue per micro-batch" + ("; a / b = model chunk" if pic.v > 1 else "")
    # under the x label, a fixed distance in points whatever the figure's size (savefig crops to fit)
    below = offset_copy(ax.transAxes, fig=fig, y=-34, units="points")
    ax.legend(handles=[Patch(visible=False, label=note + ":")] + handles, loc="upper center",
              bbox_to_anchor=(0.5, 0), bbox_transform=below, ncol=len(handles) + 1, frameon=False, fontsize=8,
              handletextpad=0.5, columnspacing=1.5)
    fig.tight_layout()
    with atomic_output(out, suffix=".png") as tmp:  # a failed draw leaves no half-written picture
        fig.savefig(tmp, dpi=130, bbox_inches="tight")
    plt.close(fig)


# --- command line ------------------------------------------------------------------------------

_Parser, _positive = OneLineParser, positive_int


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def default_out(args: argparse.Namespace, folder: str = os.path.join("docs", "img")) -> str:
    if args.trace:
        return os.path.splitext(args.trace)[0] + ".png"
    name = f"pipeline_{args.schedule}_pp{args.pp}_m{args.microbatches}"
    name += f"_v{args.v}" if args.schedule == "interleaved" else ""  # zbv: always 2
    name += f"_tb{args.tb_ratio:g}" if args.tb_ratio != 1 else ""
    return os.path.join(folder, name + ".png")


def all_pictures(args: argparse.Namespace) -> list[tuple[argparse.Namespace, str]]:
    """`--all`: (the arguments of one schedule, its output path) for each schedule of ALL."""
    out = []
    for kind in ALL:
        one = argparse.Namespace(**{**vars(args), "schedule": kind.value, "trace": None,
                                    "v": 2 if kind in (ScheduleKind.INTERLEAVED, ScheduleKind.ZBV) else 1})
        out.append((one, default_out(one, args.out_dir)))
    return out


def _simulation_flags(args: argparse.Namespace) -> tuple[tuple[str, bool], ...]:
    """(flag, given) of the flags that shape a simulated schedule (given: not its default)."""
    return (("--schedule", args.schedule != "1f1b"), ("--pp", args.pp != 4), ("--microbatches", args.microbatches != 8),
            ("--v", args.v is not None), ("--tb-ratio", args.tb_ratio != 1.0))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _Parser(prog="plot_schedule.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--schedule", choices=[k.value for k in ScheduleKind], default="1f1b",
                   help="schedule to simulate (default 1f1b)")
    p.add_argument("--pp", type=_positive, default=4, help="pipeline ranks (default 4)")
    p.add_argument("--microbatches", "-m", type=_positive, default=8, help="micro-batches per step (default 8)")
    p.add_argument("--v", type=_positive, default=None,
                   help="model chunks per rank: interleaved (default 2); zbv holds exactly 2")
    p.add_argument("--tb-ratio", type=_ratio, default=1.0,
                   help="backward time / forward time (default 1; 2 is typical)")
    p.add_argument("--trace", metavar="timeline.json",
                   help="plot a measured run (scripts/train.py --timeline) instead")
    p.add_argument("--out", metavar="FILE.png",
                   help="output (default docs/img/pipeline_<schedule>_pp<p>_m<m>[_v<v>][_tb<r>].png)")
    p.add_argument("--all", action="store_true",
                   help="draw every schedule (gpipe, 1f1b, interleaved v 2, zbh1, zbv) at these pp, m, tb-ratio, "
                        "one PNG each under --out-dir, named as --out's default")
    p.add_argument("--out-dir", metavar="DIR", default=os.path.join("docs", "img"),
                   help="folder for --all's pictures (default docs/img)")
    args = p.parse_args(argv)
    if args.all:
        for flag, given in (("--schedule", args.schedule != "1f1b"), ("--v", args.v is not None),
                            ("--trace", args.trace), ("--out", args.out)):
            if given:
                p.error(f"{flag} does not go with --all (it draws every schedule under --out-dir); drop one")
        if not os.path.isdir(args.out_dir):
            p.error(f"--out-dir {args.out_dir}: no such folder")
        for one, _ in all_pictures(args):  # every schedule checked before the first picture is drawn
            try:
                validate(ScheduleKind(one.schedule), one.pp, one.microbatches, one.v)
            except ValueError as e:
                p.error(f"--all: {e}")
        if matplotlib is None:
            p.error("drawing needs matplotlib, which is not installed: pip install matplotlib")
        return args
    if args.trace:  # a measured run's own schedule, pp and micro-batches: a simulation flag would be ignored
        for flag, given in _simulation_flags(args):
            if given:
                p.error(f"{flag} does not go with --trace (the trace draws the run's own schedule, ranks and "
                        f"micro-batches, as timed); drop one")
    if args.v is None:
        args.v = 2 if args.schedule in ("interleaved", "zbv") else 1
    if args.schedule == "zbv" and args.v != 2:
        p.error(f"--v {args.v}: --schedule zbv holds exactly 2 chunks a rank")
    if args.v != 1 and args.schedule not in ("interleaved", "zbv"):
        p.error(f"--v {args.v}: chunks per rank need --schedule interleaved")
    if args.trace and not os.path.isfile(args.trace):
        p.error(f"--trace {args.trace}: no such file")
    args.out = args.out or default_out(args)
    if not args.out.lower().endswith(".png"):
        p.error(f"--out {args.out}: must end in .png")
    p.check_out("--out", args.out)  # a regular file in an existing, writable directory
    if matplotlib is None:
        p.error("drawing needs matplotlib, which is not installed: pip install matplotlib")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.all:
        for one, out in all_pictures(args):
            draw(from_schedule(ScheduleKind(one.schedule), one.pp, one.microbatches, one.v, one.tb_ratio), out)
            print(f"wrote {out}")
        return
    try:
        if args.trace:
            pic = from_trace(args.trace)
        else:
            pic = from_schedule(ScheduleKind(args.schedule), args.pp, args.microbatches, args.v, args.tb_ratio)
    except ValueError as e:  # build_schedule names the bad parameter and the fix
        print(f"plot_schedule.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    draw(pic, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
