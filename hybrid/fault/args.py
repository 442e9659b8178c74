"""Flags of the fault-tolerance features; hybrid/train/args.py calls `add_arguments` and `check`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from hybrid.cliutil import check_number, is_finite


@dataclass(frozen=True)
class FaultConfig:
    """What the watchdog, the NaN guard and the straggler report do.

    Attributes:
        watchdog_timeout: seconds a training step may make no progress (no op started or finished,
            no phase change) before every rank prints a hang verdict and exits; 0 disables
            (`--watchdog-timeout`).
        check_nan: skip the step on every rank when any rank has a non-finite loss or gradient
            (`--check-for-nan-in-loss-and-grad`, on by default).
        max_skipped_steps: stop the run (exit code 65) after this many consecutive skipped steps
            (`--max-skipped-steps`).
        straggler_factor: name a rank whose median phase time per step exceeds its peers' median by
            this factor (`--straggler-factor`).
    """

    watchdog_timeout: float = 300.0
    check_nan: bool = True
    max_skipped_steps: int = 10
    straggler_factor: float = 1.5


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fault tolerance")
    g.add_argument("--watchdog-timeout", type=float, default=FaultConfig.watchdog_timeout,
                   help="seconds without progress in a step before every rank prints a hang verdict and exits "
                        "(code 75); 0: off")
    g.add_argument("--check-for-nan-in-loss-and-grad", action=argparse.BooleanOptionalAction, default=True,
                   help="skip the step on every rank when any rank's loss or gradient is not finite")
    g.add_argument("--max-skipped-steps", type=int, default=FaultConfig.max_skipped_steps,
                   help="stop (exit code 65) after this many consecutive skipped steps")
    g.add_argument("--straggler-factor", type=float, default=FaultConfig.straggler_factor,
                   help="name a rank slower than its peers by this factor in a phase, every log interval")


MAX_WATCHDOG_S = 7 * 24 * 3600  # a week, as --distributed-timeout-minutes: longer is a typo, not a timeout


def _outlived_minutes(args: argparse.Namespace) -> float | None:
    """--distributed-timeout-minutes (given or its default) when the watchdog is on and not below it -- a rank
    waiting in a collective for a hung peer is then ended by the collective's timeout before the watchdog's verdict
    (docs/operations.md: the timeouts nest); None when the two nest or the watchdog is off."""
    minutes = getattr(args, "distributed_timeout_minutes", None)
    if minutes is None or not 0 < args.watchdog_timeout or args.watchdog_timeout < 60 * minutes:
        return None
    return minutes


def _check_nested_timeouts(args: argparse.Namespace) -> None:
    """A --watchdog-timeout given not below the collectives' timeout (--distributed-timeout-minutes, given or its
    default 10): a rank waiting in a collective for a hung peer is ended by the collective's timeout first, so the
    verdict the watchdog was set for never prints (docs/operations.md: the timeouts nest). ValueError naming both.
    The default watchdog beside a shorter collective timeout is not refused (the user did not ask for it) but
    warned about: `timeout_warnings`."""
    minutes = _outlived_minutes(args)
    if minutes is not None and "watchdog_timeout" in getattr(args, "explicit", set()):
        raise ValueError(f"--watchdog-timeout {args.watchdog_timeout:g} s is not below --distributed-timeout-minutes "
                         f"{minutes:g} ({60 * minutes:g} s): a hung collective times out first and the hang verdict "
                         f"never prints; give a --watchdog-timeout below {60 * minutes:g} or a longer "
                         f"--distributed-timeout-minutes (--watchdog-timeout 0 turns the watchdog off)")


def timeout_warnings(args: argparse.Namespace, world: int) -> tuple[str, ...]:
    """The start-up warning (printed once, on rank 0: hybrid/train/main.py) for the default --watchdog-timeout left
    beside a --distributed-timeout-minutes at or below it: the collective then times out first and the verdict
    never prints, the case `_check_nested_timeouts` refuses when the watchdog is given. A warning, not a lower
    default: the watchdog also fires on a rank that computes in one phase that long without waiting on anyone, which
    the collective timeout lets run, so a watchdog the user did not set must not end a run the flags allow. No
    watchdog runs at world 1 (hybrid/fault/session.py): nothing to warn about there."""
    minutes = _outlived_minutes(args)
    if world < 2 or minutes is None or "watchdog_timeout" in getattr(args, "explicit", set()):
        return ()
    return (f"--distributed-timeout-minutes {minutes:g} ({60 * minutes:g} s) is not above the default "
            f"--watchdog-timeout {args.watchdog_timeout:g} s: a hung collective times out first and the hang verdict "
            f"never prints; give a --watchdog-timeout below {60 * minutes:g} (e.g. {30 * minutes:g}), or "
            f"--watchdog-timeout 0 to turn the watchdog off",)


def check(args: argparse.Namespace) -> FaultConfig:
    """ValueError naming the flag: NaN and infinity are refused everywhere (NaN compares false, so `nan < 0`
    would let a NaN timeout through and disable the watchdog without a word; inf would do the same)."""
    if not is_finite(args.watchdog_timeout) or not 0 <= args.watchdog_timeout <= MAX_WATCHDOG_S:
        raise ValueError(f"--watchdog-timeout must be a number of seconds in [0, {MAX_WATCHDOG_S}] (0 disables "
                         f"it), got {args.watchdog_timeout}")
    _check_nested_timeouts(args)
    if args.max_skipped_steps < 1:
        raise ValueError(f"--max-skipped-steps must be >= 1, got {args.max_skipped_steps}")
    if not args.check_for_nan_in_loss_and_grad and "max_skipped_steps" in getattr(args, "explicit", set()):
        raise ValueError("--max-skipped-steps counts the steps the NaN check skips, which "
                         "--no-check-for-nan-in-loss-and-grad turns off; drop one of them")
    check_number("--straggler-factor", args.straggler_factor, 1, low_open=True,
                 note=" (a rank this many times slower than its peers)")
    return FaultConfig(watchdog_timeout=args.watchdog_timeout, check_nan=args.check_for_nan_in_loss_and_grad,
                       max_skipped_steps=args.max_skipped_steps, straggler_factor=args.straggler_factor)
