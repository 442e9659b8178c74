"""Test-only crash points inside a save, through the one test-only fault hook (hybrid/fault/inject.py, which
reads HYBRID_FAULT): a no-op unless it holds a `crash` fault naming the point.

    HYBRID_FAULT="crash:point=after_data"      every rank's files written, before the manifest and the rename
    HYBRID_FAULT="crash:point=before_rename"   manifest written, directory not yet renamed
    HYBRID_FAULT="crash:point=after_data,rank=1"   only on global rank 1

The process raises SimulatedCrash there (a test catches it; under torchrun the rank dies as a killed one
would, having written exactly what a crash at that point leaves on disk)."""

from __future__ import annotations

import os

from hybrid.fault.inject import ENV, parse  # ENV: re-exported for tests that set or clear it

__all__ = ["ENV", "SimulatedCrash", "crash_point"]


class SimulatedCrash(RuntimeError):
    """Raised at the crash point a HYBRID_FAULT `crash` fault names."""


def crash_point(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    rank = int(os.environ.get("RANK", "0"))
    if any(f.kind == "crash" and f.point == name and f.rank in (-1, rank) for f in parse(spec)):
        raise SimulatedCrash(f"{ENV}: crash:point={name}: simulated crash during a checkpoint save")
