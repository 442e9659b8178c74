"""Test-only crash points inside a save, through the one test-only fault hook (hybrid/fault/inject.py, which
reads HYBRID_FAULT): a no-op unless it holds a `crash` fault naming the point.

    HYBRID_FAULT="crash:point=after_rank_files"  this rank's .distcp files written and fsynced; DCP's .metadata
                                                 not yet (the other ranks may still be writing theirs)
    HYBRID_FAULT="crash:point=after_data"        every rank's files and .metadata written; no manifest, no rename
    HYBRID_FAULT="crash:point=before_rename"     manifest written, directory not yet renamed (rank 0 only: it
                                                 alone finalizes)
    HYBRID_FAULT="crash:point=before_latest"     directory renamed (complete); `latest`'s new text written and
                                                 fsynced under its temporary name, not yet renamed onto `latest`
                                                 (rank 0 only)
    ...,rank=1          only on global rank 1 (default: every rank)
    ...,iteration=4     only in the save of iteration 4 (default: every save)
    ...,restart=1       only in torchrun's attempt 1 (TORCHELASTIC_RESTART_COUNT)
    ...,signal=SIGKILL  the process sends itself that signal there -- a real kill, nothing unwinds, no
                        handler runs -- instead of raising SimulatedCrash (which a test catches in-process)
"""

from __future__ import annotations

import os
import signal
import time

from hybrid.fault.inject import ENV, parse  # ENV: re-exported for tests that set or clear it

__all__ = ["ENV", "POINTS", "SimulatedCrash", "crash_point"]

POINTS = ("after_rank_files", "after_data", "before_rename", "before_latest")  # in the order a save passes them


class SimulatedCrash(RuntimeError):
    """Raised at the crash point a HYBRID_FAULT `crash` fault names (without signal=)."""


def crash_point(name: str, iteration: int) -> None:
    """Inside the save of `iteration`: crash here if HYBRID_FAULT says so for this rank."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    rank = int(os.environ.get("RANK", "0"))
    for f in parse(spec):
        if f.kind != "crash" or f.point != name or f.rank not in (-1, rank) or f.iteration not in (0, iteration):
            continue
        if not f.in_this_attempt():  # restart=K: only in torchrun's attempt K
            continue
        if f.signal:
            print(f"inject: {f.signal} to rank {rank} at crash point {name} of the save of iteration {iteration}, "
                  f"t={time.time():.3f}", flush=True)
            # delivered before kill() returns (POSIX, for a signal to oneself): SIGKILL ends the process here;
            # a signal with a handler that returns falls through to the raise
            os.kill(os.getpid(), getattr(signal, f.signal))
        raise SimulatedCrash(f"{ENV}: crash:point={name}: simulated crash during a checkpoint save")
