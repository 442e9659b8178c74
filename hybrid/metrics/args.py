"""Metrics flags of train.py: `add_arguments`, and `check` (outputs writable, numbers sane, MFU's peak resolved)
before any process group."""

from __future__ import annotations

import argparse
import glob
import importlib
import json
import os
from dataclasses import dataclass

from hybrid.cliutil import check_number, check_output_dir, check_output_file


@dataclass(frozen=True)
class MetricsConfig:
    """Attributes:
        tensorboard_dir: TensorBoard event directory (`--tensorboard-dir`; None: off).
        metrics_file: JSON-lines file, appended (`--metrics-file`; None: off).
        peak_tflops: one rank's peak TFLOP/s for MFU: `--peak-tflops`, or derived from a `hybrid calibrate`
            profile (`--hardware`, `profile_peak_tflops`); None: the known-GPU table on CUDA, else no MFU.
        peak_source: where peak_tflops came from, for the run's header line.
        timing_log_interval: print the per-rank step times, the time split and the straggler verdict every this
            many log intervals (`--timing-log-interval`; 1: at every one, the verbose form); they are printed at
            once, whatever this is, for an interval where a straggler was named or a step was skipped.
    """

    tensorboard_dir: str | None
    metrics_file: str | None
    peak_tflops: float | None
    peak_source: str | None = None
    timing_log_interval: int = 10


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("metrics")
    g.add_argument("--tensorboard-dir", default=None, metavar="PATH",
                   help="write TensorBoard scalars here (Megatron's names: lm loss, learning-rate, grad-norm, ...)")
    g.add_argument("--metrics-file", default=None, metavar="PATH",
                   help="append one JSON object per log interval and evaluation to this file")
    g.add_argument("--peak-tflops", type=float, default=None, metavar="X",
                   help="one device's peak TFLOP/s for MFU; None: the --hardware profile's, else the bf16 peak "
                        "of a known GPU, else (CPU) no MFU")
    g.add_argument("--timing-log-interval", type=int, default=MetricsConfig.timing_log_interval, metavar="N",
                   help="per-rank step times, time split and straggler verdict every N log intervals (1: every "
                        "interval, the verbose form); at once when a straggler is named or a step skipped")
    # --hardware (a `hybrid calibrate` profile) is defined with --auto-parallel in hybrid/train/args.py; it also
    # gives MFU's peak here (profile_peak_tflops)


def missing_profile(path: str) -> str:
    """--hardware PATH that is no file: the line, naming --peak-tflops with the preset's peak when PATH is a device
    preset's name (h100, h200-...: train.py has no --gpu; the presets are hybrid/planner/hardware.py's)."""
    from hybrid.planner.hardware import GpuKind, hardware
    line = f"--hardware {path!r} is not a file; write one with `hybrid calibrate --out FILE`"
    preset = [k for k in GpuKind if path.lower() in (k.value, k.value.split("-")[0])]
    if preset:
        line += (f" (for the {preset[0].value} preset's peak in MFU: --peak-tflops "
                 f"{hardware(preset[0]).peak_tflops:g})")
    return line


def profile_peak_tflops(path: str, fp32: bool, local_ranks: int) -> float:
    """One rank's peak TFLOP/s from a `hybrid calibrate` profile: its fitted matmul rate R for the run's
    precision (fp32; else bf16 where measured, else fp32), times min(1, cores / local ranks) when the profile's
    ranks share a CPU's cores (`compute_units`, set by calibrate on gloo). R is one rank's rate with the cores to
    itself, so ranks beyond the cores split them: 8 ranks on 2 cores have R x 2 / 8 each, and MFU =
    (model FLOP/s of all ranks) / (R x cores) -- the share of the machine's matmul rate the run achieves. On
    GPUs (no compute_units) R is per device, measured with every device busy."""
    from hybrid.planner import calibrate
    from hybrid.planner.model import Precision as PlanPrecision
    if not os.path.isfile(path):
        raise ValueError(missing_profile(path))
    hw = calibrate.load_hardware(path, PlanPrecision.FP32 if fp32 else PlanPrecision.MIXED)
    share = min(1.0, hw.compute_units / local_ranks) if hw.compute_units else 1.0
    return hw.peak_tflops * share


def check_appendable(path: str) -> None:
    """--metrics-file is appended to (a resumed run continues its file), so an existing non-empty file must be one a
    run wrote: its first line a JSON object with an "iteration" (hybrid/metrics/writer.py). Anything else -- a
    `hybrid calibrate` profile meant for --hardware, a data file, a script -- would get JSON lines added at its end;
    ValueError naming the flag instead."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    with open(path, "rb") as f:
        first = f.readline(1 << 20)
    try:
        record = json.loads(first)
    except (ValueError, UnicodeDecodeError):
        record = None
    if not (isinstance(record, dict) and "iteration" in record):
        raise ValueError(f"--metrics-file {path!r} exists and is not a metrics file (its first line is not a JSON "
                         f"record with an \"iteration\"); the run appends to it: give a new file, or the "
                         f"--metrics-file of the run this one resumes")


def check_not_another_run(path: str | None, tensorboard_dir: str | None, continues: bool) -> None:
    """A run that continues no checkpoint starts at iteration 1. Appended to another run's --metrics-file, its records
    follow that run's, and plot_run (the later record of a repeated iteration wins) draws one curve of two runs: this
    run's iterations up to its end, the other's after it; beside another run's event files in a --tensorboard-dir,
    TensorBoard and plot_run merge the two the same way. ValueError naming the output instead. `continues`: the run
    resumes a checkpoint, or is `--save D --load D` before D's first one (the same command again after a kill: its
    own files); a torchrun restart (TORCHELASTIC_RESTART_COUNT > 0) continues its attempt's files too."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")  # torchrun's; anything else is no restart
    if continues or (restart.isdigit() and int(restart) > 0):
        return
    fix = "and this run resumes no checkpoint: it starts at iteration 1"
    if path is not None and os.path.isfile(path) and os.path.getsize(path) > 0:
        last = _last_iteration(path)
        held = f" (up to iteration {last})" if last is not None else ""
        raise ValueError(f"--metrics-file {path!r} holds another run's records{held}, {fix} and would append after "
                         f"them (plot_run.py would draw the two runs as one); give a new file, or --load the "
                         f"checkpoint of the run that wrote it")
    if tensorboard_dir is not None and glob.glob(os.path.join(glob.escape(tensorboard_dir), "events.out.tfevents.*")):
        raise ValueError(f"--tensorboard-dir {tensorboard_dir!r} holds another run's event files, {fix} beside them "
                         f"(TensorBoard and plot_run.py would draw the two runs as one); give a new folder, or --load "
                         f"the checkpoint of the run that wrote them")


def _last_iteration(path: str, tail: int = 1 << 16) -> int | None:
    """The "iteration" of the last whole record in the file's last `tail` bytes; None if none reads."""
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - tail))
        lines = f.read().splitlines()
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(record, dict) and isinstance(record.get("iteration"), int):
            return record["iteration"]
    return None


def check(args: argparse.Namespace, world: int = 1) -> MetricsConfig:
    """Needs args.zero (the precision) set; `world` gives the local ranks when LOCAL_WORLD_SIZE is unset."""
    if args.tensorboard_dir is not None:
        check_output_dir("--tensorboard-dir", args.tensorboard_dir)
        try:
            importlib.import_module("tensorboard")  # SummaryWriter needs it
        except ImportError:
            raise ValueError("--tensorboard-dir needs the tensorboard package; pip install tensorboard") from None
    if args.metrics_file is not None:
        check_output_file("--metrics-file", args.metrics_file)
        check_appendable(args.metrics_file)
    every = getattr(args, "timing_log_interval", MetricsConfig.timing_log_interval)  # a Namespace built by hand
    if every < 1:
        raise ValueError(f"--timing-log-interval must be >= 1 (1: every log interval), got {every}")
    if args.peak_tflops is not None:
        check_number("--peak-tflops", args.peak_tflops, 0, low_open=True)
    peak, source = args.peak_tflops, "--peak-tflops" if args.peak_tflops is not None else None
    hardware = getattr(args, "hardware", None)
    if hardware:  # an empty one is rejected by hybrid/train/args.py's check_files
        if peak is not None:
            raise ValueError("--peak-tflops and --hardware both set MFU's peak; give one of them")
        local = os.environ.get("LOCAL_WORLD_SIZE", "")
        local_ranks = int(local) if local.isdigit() and int(local) > 0 else world
        fp32 = args.zero.precision.value == "fp32"
        peak = profile_peak_tflops(hardware, fp32, local_ranks)
        source = f"--hardware {hardware}, {'fp32' if fp32 else 'mixed-precision'} matmul rate, {local_ranks} local ranks"
    return MetricsConfig(args.tensorboard_dir, args.metrics_file, peak, source, every)
