"""Test-only crash points inside a save, through the one test-only fault hook (hybrid/fault_hook.py, which
reads HYBRID_FAULT and holds every writer's crash points): a no-op unless it holds a `crash` fault naming the point.

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

from hybrid.fault_hook import ENV, SimulatedCrash, crash_point  # ENV: re-exported for tests that set or clear it

__all__ = ["ENV", "POINTS", "SimulatedCrash", "crash_point"]

POINTS = ("after_rank_files", "after_data", "before_rename", "before_latest")  # in the order a save passes them
