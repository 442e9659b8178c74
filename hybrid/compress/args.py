"""Gradient-compression flags of train.py: `add_arguments` builds them, `check` validates them (before any process
group) into a `CompressConfig`; hybrid/train/args.py calls both. docs/comm-efficient.md."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

from hybrid.cliutil import check_number, is_integer
from hybrid.compress.powersgd import PowerSGDConfig

TORCH_START_ITER = 1_000  # torch's PowerSGDState default start_powerSGD_iter
# DeepSpeed's 1-bit Adam tutorial: a warm-up (freeze_step) of 15-25 % of the run; below its lower end a start-up
# warning. Our own proxy agrees: frozen at 20 % of 600 steps it ended +0.3 % from AdamW, at 20 % of 300 +6.2 %
# (docs/comm-efficient.md).
ONEBIT_WARMUP_FRACTION = (0.15, 0.25)


@dataclass(frozen=True)
class CompressConfig:
    """Attributes:
        powersgd: PowerSGD of the DP gradients (`--powersgd-rank`, `--powersgd-start-iter`); rank 0: off.
        onebit_freeze_iters: 1-bit Adam (`--optimizer onebit-adam`, a choice of train.py's --optimizer): Adam
            warm-up steps before the variance freezes and the momentum is sent as signs (`--onebit-freeze-iters`;
            DeepSpeed's `freeze_step`); None: the optimizer --optimizer names.
        simulated_dp_bandwidth: GB/s of a simulated slow DP link (`--simulated-dp-bandwidth`): every gradient
            collective on the DP group is followed by a sleep of its ledger bytes / this; 0: off.
        onebit_powersgd: 1-bit Adam's momentum all-reduced as PowerSGD factors of this rank instead of signs
            (`--onebit-compressor powersgd --powersgd-rank R`; hybrid/compress/momentum.py); rank 0 (default): signs.
            `powersgd` (the gradient's) is then off.
    """

    powersgd: PowerSGDConfig = field(default_factory=PowerSGDConfig)
    onebit_freeze_iters: int | None = None
    simulated_dp_bandwidth: float = 0.0
    onebit_powersgd: PowerSGDConfig = field(default_factory=PowerSGDConfig)

    @property
    def enabled(self) -> bool:
        return self.powersgd.enabled or self.onebit_freeze_iters is not None


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("gradient compression over data parallelism (docs/comm-efficient.md)")
    g.add_argument("--powersgd-rank", type=int, default=0, metavar="R",
                   help="PowerSGD: all-reduce rank-R factors of each gradient matrix (error feedback, warm start; "
                        "1-D tensors sent whole), as torch's powerSGD_hook; 0: off")
    g.add_argument("--powersgd-start-iter", type=int, default=TORCH_START_ITER, metavar="N",
                   help="optimizer steps of plain all-reduce before PowerSGD starts (torch's start_powerSGD_iter)")
    g.add_argument("--onebit-freeze-iters", type=int, default=100, metavar="N",
                   help="1-bit Adam: Adam warm-up steps before the variance freezes (DeepSpeed's freeze_step)")
    g.add_argument("--onebit-compressor", choices=("sign", "powersgd"), default="sign",
                   help="1-bit Adam's momentum compressor: sign (DeepSpeed's 1-bit Adam) or powersgd (rank "
                        "--powersgd-rank factors of each momentum matrix, error feedback, warm start; 1-D exact). "
                        "Experimental: powersgd diverged on the DP 2 proxy at r 4 and r 16 (docs/comm-efficient.md)")
    g.add_argument("--simulated-dp-bandwidth", type=float, default=0.0, metavar="GBPS",
                   help="simulate a slow DP link: sleep bytes / GBPS after each DP gradient collective; 0: off")


def check(args: argparse.Namespace, dp_cp: int | None = None, resuming: bool = False,
          moe: bool = False) -> CompressConfig:
    """ValueError naming the flag and the fix. `dp_cp`: the ranks the DP gradients are reduced over (dp x cp), when
    the layout is known: a simulated DP link at 1 has no gradient collective to slow down, PowerSGD none to compress
    (unless `resuming`: the flag then carries a loaded checkpoint's PowerSGD state through the dp 1 run). `moe`: the
    model has experts, which 1-bit Adam does not run with (refused here rather than when the engine is built, after
    the process group: reduction.py's build_optimizer)."""
    rank, start = args.powersgd_rank, args.powersgd_start_iter
    _check_unused(args, dp_cp, resuming)
    momentum_rank = _check_momentum_compressor(args)
    if momentum_rank:  # --powersgd-rank is the momentum's (1-bit Adam's compressor), not the gradient's
        rank = 0
    if not is_integer(rank) or rank < 0:
        raise ValueError(f"--powersgd-rank must be a non-negative integer (0: off), got {rank!r}")
    if rank and (not is_integer(start) or start < 2):
        raise ValueError(f"--powersgd-start-iter must be >= 2 (error feedback and warm start need plain steps "
                         f"first, as torch's hook), got {start!r}")
    bw = args.simulated_dp_bandwidth
    check_number("--simulated-dp-bandwidth", bw, 0, note=" (GB/s; 0: off)")
    if rank and getattr(args, "zero_stage", 0) == 3:
        raise ValueError("--powersgd-rank does not run with --zero-stage 3 (stage 3 reduce-scatters per layer and "
                         "keeps no full gradient to compress); use --zero-stage 0, 1 or 2")
    freeze = _check_onebit(args, rank)
    if freeze is not None and dp_cp == 1 and not resuming:  # as PowerSGD's below: no DP traffic to compress
        raise ValueError("--optimizer onebit-adam compresses the DP momentum all-reduce, and at dp 1 there is none "
                         "(it would run Adam with a frozen variance): run with dp > 1 (more ranks than tp x pp x cp) "
                         "or use --optimizer adam")
    if freeze is not None and moe:
        raise ValueError("--optimizer onebit-adam does not run with an MoE model (the experts' gradients are reduced "
                         "over the expert-DP group, not the DP group 1-bit Adam compresses); use --optimizer adam")
    if (rank or freeze is not None) and getattr(args, "diloco_inner_steps", None) is not None:
        which = "--powersgd-rank" if rank else "--optimizer onebit-adam"
        raise ValueError(f"{which} does not run with --diloco-inner-steps (compression inside DiLoCo replicas is "
                         f"untested); drop one of them")
    _check_reach(args, rank, freeze)
    momentum = PowerSGDConfig(rank=momentum_rank, start_iter=freeze) if momentum_rank else PowerSGDConfig()
    return CompressConfig(powersgd=PowerSGDConfig(rank=rank, start_iter=start), onebit_freeze_iters=freeze,
                          simulated_dp_bandwidth=bw, onebit_powersgd=momentum)


def _check_momentum_compressor(args: argparse.Namespace) -> int:
    """`--onebit-compressor powersgd`: the momentum's PowerSGD rank (--powersgd-rank), else 0. Needs 1-bit Adam and a
    rank; --powersgd-start-iter is refused (the compression starts at --onebit-freeze-iters)."""
    compressor = getattr(args, "onebit_compressor", "sign")
    given = "onebit_compressor" in getattr(args, "explicit", set())  # `sign` is the default: given, it is asked for
    if compressor == "sign" and not given:
        return 0
    if getattr(args, "optimizer", "adam") != "onebit-adam" and _deepspeed_freeze(args) is None:
        raise ValueError(f"--onebit-compressor {compressor} is 1-bit Adam's momentum compressor; the run's optimizer "
                         f"is {getattr(args, 'optimizer', 'adam')}: add --optimizer onebit-adam or drop "
                         f"--onebit-compressor")
    if compressor == "sign":
        return 0
    rank = args.powersgd_rank
    if not is_integer(rank) or rank < 1:
        raise ValueError(f"--onebit-compressor powersgd needs --powersgd-rank R >= 1 (the rank of each momentum "
                         f"matrix's factors), got {rank!r}")
    if "powersgd_start_iter" in getattr(args, "explicit", set()):
        raise ValueError(f"--powersgd-start-iter {args.powersgd_start_iter} does nothing with --onebit-compressor "
                         f"powersgd (the momentum is compressed from --onebit-freeze-iters on); drop "
                         f"--powersgd-start-iter")
    return rank


def _check_unused(args: argparse.Namespace, dp_cp: int | None, resuming: bool = False) -> None:
    """A flag given on the command line that its method would never read does nothing: one line naming it and the
    fix. --powersgd-start-iter with PowerSGD off is refused whether the rank was left at its default or given as 0
    (a flag list that turns PowerSGD off drops its start step too)."""
    given = getattr(args, "explicit", set())
    if "powersgd_start_iter" in given and not args.powersgd_rank:
        off = " (given as 0)" if "powersgd_rank" in given else ""
        raise ValueError(f"--powersgd-start-iter {args.powersgd_start_iter} does nothing without --powersgd-rank"
                         f"{off} (PowerSGD is off): add --powersgd-rank R > 0 or drop --powersgd-start-iter")
    if ("onebit_freeze_iters" in given and getattr(args, "optimizer", "adam") != "onebit-adam"
            and _deepspeed_freeze(args) is None):
        raise ValueError(f"--onebit-freeze-iters {args.onebit_freeze_iters} is 1-bit Adam's; the run's optimizer is "
                         f"{getattr(args, 'optimizer', 'adam')}: add --optimizer onebit-adam or drop "
                         f"--onebit-freeze-iters")
    # PowerSGDReduction.reduce returns at a group of one: nothing is compressed. With --load the flag still carries
    # a checkpoint's PowerSGD state (error feedback, Q) through a dp 1 stretch to the next save (test_compress_reshard).
    if dp_cp == 1 and args.powersgd_rank and not resuming:
        raise ValueError(f"--powersgd-rank {args.powersgd_rank} compresses the DP gradient all-reduce, and at dp 1 "
                         f"there is none: run with dp > 1 (more ranks than tp x pp x cp) or drop --powersgd-rank")
    if dp_cp == 1 and args.simulated_dp_bandwidth and args.simulated_dp_bandwidth > 0:
        raise ValueError(f"--simulated-dp-bandwidth {args.simulated_dp_bandwidth:g} slows the DP gradient "
                         f"collectives, and at dp 1 there are none: run with dp > 1 (more ranks than tp x pp x cp) "
                         f"or drop --simulated-dp-bandwidth")


def _check_reach(args: argparse.Namespace, rank: int, freeze: int | None) -> None:
    """PowerSGD compresses from step --powersgd-start-iter on and 1-bit Adam from step --onebit-freeze-iters on
    (steps 0 .. --train-iters - 1): one that starts at or after --train-iters would never engage -- a plain
    all-reduce and AdamW all run long. Refused unless the run --save's (a later run with a higher --train-iters then
    continues into the compressed steps)."""
    n = getattr(args, "train_iters", None)
    if not isinstance(n, int) or getattr(args, "save", None):
        return
    given = getattr(args, "explicit", set())
    if rank and args.powersgd_start_iter >= n:
        start = args.powersgd_start_iter
        default = "" if "powersgd_start_iter" in given else " (the default, torch's start_powerSGD_iter)"
        # N runs from 2 (PowerSGDConfig: torch's warm start needs plain steps first): at --train-iters <= 2 no N
        # fits, and "2 <= N < 2" offered none (round 21)
        fix = (f"give --powersgd-start-iter N with 2 <= N < {n} (or a longer --train-iters)" if n > 2 else
               f"give --train-iters above 2 (--powersgd-start-iter is at least 2)")
        raise ValueError(f"--powersgd-rank {rank}: PowerSGD starts after --powersgd-start-iter {start}{default} plain "
                         f"steps and --train-iters {n} ends first, so nothing would be compressed; {fix}, or drop "
                         f"--powersgd-rank")
    if freeze is not None and freeze >= n:
        where = f"--onebit-freeze-iters {freeze}" + ("" if "onebit_freeze_iters" in given else " (the default)")
        fix = f"give --onebit-freeze-iters N < {n}"
        if _deepspeed_freeze(args) is not None:
            where, fix = f"--deepspeed-config's freeze_step {freeze}", f"write a freeze_step < {n}"
        raise ValueError(f"--optimizer onebit-adam: 1-bit Adam compresses from step {where} on and --train-iters "
                         f"{n} ends first, so the run would be plain Adam; {fix}, or use --optimizer adam")


def _deepspeed_freeze(args: argparse.Namespace) -> int | None:
    """A DeepSpeed config's `"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": N, ...}}`: N, or None
    without one. Read from the settings the file was parsed into once (hybrid/zero/ds_config.py, kept by
    hybrid/train/args.deepspeed_settings as `args.ds_settings`), never from the file again."""
    ds = getattr(args, "ds_settings", None)
    return None if ds is None else ds.freeze_step


def _onebit_conflicts(args: argparse.Namespace, powersgd_rank: int) -> list[str]:
    """What 1-bit Adam does not run with among the flags given, each as its refusal and fix, all of them."""
    from hybrid.compress.reduction import CLIP_REFUSED
    stage, found = getattr(args, "zero_stage", 0), []
    if stage == 3:
        found.append("--optimizer onebit-adam does not run with --zero-stage 3 (each worker compresses its whole "
                     "momentum, which stage 3 never holds); use --zero-stage 0, 1 or 2")
    if stage in (1, 2) and getattr(args, "clip_grad", 0.0) > 0:
        found.append(CLIP_REFUSED)
    if powersgd_rank:
        found.append("--optimizer onebit-adam and --powersgd-rank are exclusive (both compress the DP traffic); "
                     "drop one")
    for flag, on in (("--fp16", getattr(args, "fp16", False)),
                     ("--offload-optimizer", getattr(args, "offload_optimizer", False))):
        if on:
            found.append(f"--optimizer onebit-adam does not run with {flag}; drop {flag}")
    return found


def _check_onebit(args: argparse.Namespace, powersgd_rank: int) -> int | None:
    """1-bit Adam's flags (or a DeepSpeed config's OneBitAdam, which sets them): the freeze step, or None for
    AdamW. What it does not run with is refused by name."""
    ds_freeze = _deepspeed_freeze(args)
    if ds_freeze is not None:
        given = getattr(args, "explicit", set())
        if "optimizer" in given and args.optimizer != "onebit-adam":
            raise ValueError(f"--deepspeed-config sets optimizer OneBitAdam, but --optimizer {args.optimizer} was "
                             f"given; remove one of them")
        if "onebit_freeze_iters" in given and args.onebit_freeze_iters != ds_freeze:
            raise ValueError(f"--deepspeed-config freeze_step {ds_freeze} != --onebit-freeze-iters "
                             f"{args.onebit_freeze_iters}; remove one of them")
        args.optimizer, args.onebit_freeze_iters = "onebit-adam", ds_freeze
    if getattr(args, "optimizer", "adam") != "onebit-adam":
        return None
    freeze = args.onebit_freeze_iters
    check_number("--onebit-freeze-iters", freeze, 1, integer=True,
                 note=" (Adam warm-up steps before the variance freezes; at 0 it would freeze at zero)")
    conflicts = _onebit_conflicts(args, powersgd_rank)
    if conflicts:  # every one in the one line: a user fixing the first must not meet the next on the second try
        raise ValueError("; also ".join(conflicts))
    return freeze


def onebit_warnings(cfg: CompressConfig, args: argparse.Namespace) -> tuple[str, ...]:
    """Legal but risky 1-bit Adam warm-ups, one start-up line each (printed once, by rank 0: hybrid/train/main.py).
    The variance v is frozen after k = freeze Adam steps and divides every later step, without bias correction
    (as DeepSpeed): at k = 1 it is one gradient's square, (1 - b2) g0^2 -- no estimate at all -- and below 15 % of
    the run it is frozen before DeepSpeed's recommended warm-up. A run that --save's with k >= --train-iters (not
    refused: _check_reach) is plain Adam throughout; the compression starts only in a continuation."""
    k, n = cfg.onebit_freeze_iters, getattr(args, "train_iters", None)
    if k is None or not isinstance(n, int):
        return ()
    flag = (f"--deepspeed-config's freeze_step {k}" if _deepspeed_freeze(args) is not None
            else f"--onebit-freeze-iters {k}")
    if k >= n:
        return (f"{flag} >= --train-iters {n}: this run is plain Adam (1-bit Adam compresses from step {k} on); a "
                f"run resumed from --save {args.save} with a larger --train-iters compresses",)
    low, high = (max(2, math.ceil(f * n)) for f in ONEBIT_WARMUP_FRACTION)
    if k > 1 and k >= low:
        return ()
    why = ("the variance frozen after one step is one gradient's square, (1 - beta2) g^2" if k == 1 else
           f"a warm-up of {100 * k / n:.0f} % of --train-iters {n}")
    return (f"{flag}: {why}; DeepSpeed recommends a warm-up of 15-25 % of the run (docs/comm-efficient.md): give "
            f"{'freeze_step' if flag.startswith('--deepspeed') else '--onebit-freeze-iters'} {low}"
            f"{f'-{high}' if high > low else ''}",)


def describe(cfg: CompressConfig, diloco: bool = False) -> str:
    """The start-up line of a compressing run ("" when off), as DiLoCo's `diloco: ...`: which scheme runs from
    which optimizer step, so a user sees that the flags took (round 21: the run printed nothing of them). Under
    DiLoCo the simulated link is on the diloco line."""
    parts = []
    if cfg.powersgd.enabled:
        p = cfg.powersgd
        parts.append(f"PowerSGD rank {p.rank} on the DP gradients from optimizer step {p.start_iter + 1} (steps "
                     f"1-{p.start_iter} plain all-reduce; 1-D tensors and small matrices sent whole)")
    if cfg.onebit_freeze_iters is not None:
        sent = (f"rank {cfg.onebit_powersgd.rank} PowerSGD factors" if cfg.onebit_powersgd.enabled else
                "signs with error feedback")
        parts.append(f"1-bit Adam: Adam for steps 1-{cfg.onebit_freeze_iters}, then the variance frozen and the "
                     f"momentum sent as {sent}")
    if cfg.simulated_dp_bandwidth > 0 and not diloco:
        parts.append(f"simulated DP link {cfg.simulated_dp_bandwidth:g} GB/s (each step sleeps its DP bytes / "
                     f"that)")
    return "compress: " + " | ".join(parts) if parts else ""
