"""Gradient-compression flags of train.py: `add_arguments` builds them, `check` validates them (before any process
group) into a `CompressConfig`; hybrid/train/args.py calls both. docs/comm-efficient.md."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from hybrid.compress.powersgd import PowerSGDConfig

TORCH_START_ITER = 1_000  # torch's PowerSGDState default start_powerSGD_iter


@dataclass(frozen=True)
class CompressConfig:
    """Attributes:
        powersgd: PowerSGD of the DP gradients (`--powersgd-rank`, `--powersgd-start-iter`); rank 0: off.
        simulated_dp_bandwidth: GB/s of a simulated slow DP link (`--simulated-dp-bandwidth`): every gradient
            collective on the DP group is followed by a sleep of its ledger bytes / this; 0: off.
    """

    powersgd: PowerSGDConfig = field(default_factory=PowerSGDConfig)
    simulated_dp_bandwidth: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.powersgd.enabled


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("gradient compression over data parallelism (docs/comm-efficient.md)")
    g.add_argument("--powersgd-rank", type=int, default=0, metavar="R",
                   help="PowerSGD: all-reduce rank-R factors of each gradient matrix (error feedback, warm start; "
                        "1-D tensors sent whole), as torch's powerSGD_hook; 0: off")
    g.add_argument("--powersgd-start-iter", type=int, default=TORCH_START_ITER, metavar="N",
                   help="optimizer steps of plain all-reduce before PowerSGD starts (torch's start_powerSGD_iter)")
    g.add_argument("--simulated-dp-bandwidth", type=float, default=0.0, metavar="GBPS",
                   help="simulate a slow DP link: sleep bytes / GBPS after each DP gradient collective; 0: off")


def check(args: argparse.Namespace) -> CompressConfig:
    """ValueError naming the flag and the fix."""
    rank, start = args.powersgd_rank, args.powersgd_start_iter
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"--powersgd-rank must be a non-negative integer (0: off), got {rank!r}")
    if rank and (isinstance(start, bool) or not isinstance(start, int) or start < 2):
        raise ValueError(f"--powersgd-start-iter must be >= 2 (error feedback and warm start need plain steps "
                         f"first, as torch's hook), got {start!r}")
    bw = args.simulated_dp_bandwidth
    if not bw >= 0 or bw == float("inf"):
        raise ValueError(f"--simulated-dp-bandwidth must be a finite number >= 0 (GB/s; 0: off), got {bw!r}")
    if rank and getattr(args, "zero_stage", 0) == 3:
        raise ValueError("--powersgd-rank does not run with --zero-stage 3 (stage 3 reduce-scatters per layer and "
                         "keeps no full gradient to compress); use --zero-stage 0, 1 or 2")
    return CompressConfig(powersgd=PowerSGDConfig(rank=rank, start_iter=start), simulated_dp_bandwidth=bw)
