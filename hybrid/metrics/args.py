"""Metrics flags of train.py: `add_arguments`, and `check` (outputs writable, numbers sane) before any process
group."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from hybrid.cliutil import check_output_dir, check_output_file


@dataclass(frozen=True)
class MetricsConfig:
    """Attributes:
        tensorboard_dir: TensorBoard event directory (`--tensorboard-dir`; None: off).
        metrics_file: JSON-lines file, appended (`--metrics-file`; None: off).
        peak_tflops: one device's peak TFLOP/s for MFU (`--peak-tflops`; None: the known-GPU table, else no MFU).
    """

    tensorboard_dir: str | None
    metrics_file: str | None
    peak_tflops: float | None


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("metrics")
    g.add_argument("--tensorboard-dir", default=None, metavar="PATH",
                   help="write TensorBoard scalars here (Megatron's names: lm loss, learning-rate, grad-norm, ...)")
    g.add_argument("--metrics-file", default=None, metavar="PATH",
                   help="append one JSON object per log interval and evaluation to this file")
    g.add_argument("--peak-tflops", type=float, default=None, metavar="X",
                   help="one device's peak TFLOP/s for MFU; None: bf16 peak of a known GPU, none on CPU "
                        "(measure it with `hybrid calibrate`)")


def check(args: argparse.Namespace) -> MetricsConfig:
    if args.tensorboard_dir is not None:
        check_output_dir("--tensorboard-dir", args.tensorboard_dir)
        try:
            import tensorboard  # noqa: F401  (SummaryWriter needs it)
        except ImportError:
            raise ValueError("--tensorboard-dir needs the tensorboard package; pip install tensorboard") from None
    if args.metrics_file is not None:
        check_output_file("--metrics-file", args.metrics_file)
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        raise ValueError(f"--peak-tflops must be > 0, got {args.peak_tflops}")
    return MetricsConfig(args.tensorboard_dir, args.metrics_file, args.peak_tflops)
