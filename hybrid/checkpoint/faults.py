"""Test-only crash points inside a save: a no-op unless HYBRID_TEST_CKPT_CRASH names the point.

    HYBRID_TEST_CKPT_CRASH=after_data      every rank's files written, before the manifest and the rename
    HYBRID_TEST_CKPT_CRASH=before_rename   manifest written, directory not yet renamed

The process raises SimulatedCrash there (a test catches it; under torchrun the rank dies as a killed one
would, having written exactly what a crash at that point leaves on disk)."""

from __future__ import annotations

import os

ENV = "HYBRID_TEST_CKPT_CRASH"  # read here only


class SimulatedCrash(RuntimeError):
    """Raised at the crash point HYBRID_TEST_CKPT_CRASH names."""


def crash_point(name: str) -> None:
    if os.environ.get(ENV) == name:
        raise SimulatedCrash(f"{ENV}={name}: simulated crash during a checkpoint save")
