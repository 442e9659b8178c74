"""hybrid/zero/cpu_adam_build.py: a process that has already loaded DeepSpeed's CPU Adam from the build directory
(every rank forked from hybrid.testing's forkserver: hybrid.testing_preload) constructs it without taking the
machine-wide build lock -- nothing is built or loaded then, and the lock would only queue it behind any other
process of the machine that holds it. A process that has not loaded it (or loaded another build) still waits."""

from __future__ import annotations

import fcntl
import os
import threading
import types

import pytest

builder = pytest.importorskip("deepspeed.ops.op_builder.builder")


def _enter(directory: str) -> threading.Thread:
    """cpu_adam_build(directory=...) entered and left in a thread (a daemon: a wrong wait cannot hang the suite)."""
    from hybrid.zero.cpu_adam_build import cpu_adam_build

    def body() -> None:
        with cpu_adam_build(log=lambda _: None, directory=directory):
            pass
    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("loaded_here", [True, False])
def test_a_process_with_the_op_loaded_from_the_build_takes_no_build_lock(tmp_path, monkeypatch, loaded_here):
    build, other = tmp_path / "cpu_adam", tmp_path / "another_build"
    build.mkdir()
    monkeypatch.setattr("hybrid.zero.cpu_adam_build._prebuilt", lambda name="cpu_adam": False)
    so = (build if loaded_here else other) / "cpu_adam.so"
    monkeypatch.setitem(builder.OpBuilder._loaded_ops, "cpu_adam", types.SimpleNamespace(__file__=str(so)))
    with open(build / "hybrid.flock", "a") as held:  # another holder (its own open file: flock conflicts)
        fcntl.flock(held, fcntl.LOCK_EX)
        t = _enter(str(build))
        t.join(timeout=0.5 if not loaded_here else 30)
        assert t.is_alive() != loaded_here, "loaded here: no wait; loaded elsewhere or not at all: waits its turn"
        fcntl.flock(held, fcntl.LOCK_UN)
    t.join(timeout=30)
    assert not t.is_alive()
    assert not os.path.exists(build / "lock")
