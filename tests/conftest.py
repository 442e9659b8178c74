"""Suite-wide pytest hooks: running the suite on two pytest-xdist workers (scripts/test.sh passes `-n 2 --dist
loadfile`) without changing what any test sees.

* `--dist loadfile` keeps each file on one worker, so a module-scoped fixture (one spawn shared by a file's
  tests) still runs once, and files that share a working directory in document order (test_docs_commands) keep
  their order.
* Under xdist the files go out longest first (HEAVY, measured wall times on 2 cores): the longest file starts at
  once instead of last, and the short files fill in at the end (longest-processing-time-first scheduling).
  Without xdist the order is pytest's own.
* Tests marked `serial` measure time -- a verdict within the watchdog timeout, a straggler named against its
  peers, a collective timeout -- and their bounds were set for one test at a time on a loaded machine. Under
  xdist such a test runs alone: it takes a lock the other worker's tests share, so the other worker waits between
  two tests until it is done (and a serial test waiting for the lock keeps new tests from starting, so it is not
  starved). Without xdist every test already runs alone.
"""

from __future__ import annotations

import fcntl
import os

import pytest

# file -> seconds (--durations=0 summed per file: setup + call + teardown), one process on 2 cores under other
# jobs' load, before hybrid.testing's forkserver start, 2026-12-03. Only the order matters; files under 5 s
# (and new files) keep pytest's order, after these.
HEAVY = {"test_checkpoint.py": 226, "test_docs_commands.py": 222, "test_fault_nodes.py": 196,
         "test_fault_resume.py": 144, "test_convert.py": 108, "test_fault_hang.py": 101, "test_zero.py": 89,
         "test_data_train.py": 89, "test_pipeline_executor.py": 75, "test_bench_smoke.py": 66,
         "test_training.py": 57, "test_fp32_grads.py": 60, "test_compile.py": 60, "test_gpu_check.py": 110, "test_checkpoint_kill.py": 50, "test_zero_flags.py": 45,
         "test_inputs_launch.py": 43, "test_planner_runtime.py": 42, "test_parallel_adamw.py": 30,
         "test_harness.py": 24, "test_generate.py": 22, "test_zero_param_overlap.py": 19, "test_comm_volume.py": 19,
         "test_fault_nan.py": 14, "test_tp_models.py": 13, "test_planner_uneven.py": 10, "test_inputs.py": 9,
         "test_planner_reference.py": 8, "test_dropout.py": 8, "test_pipeline_memory.py": 7, "test_calibrate.py": 7,
         "test_data_metrics.py": 7, "test_pipeline_schedules.py": 6}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "serial: measures time; under pytest-xdist it runs with no other test "
                                       "alongside (tests/conftest.py)")


def _xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _xdist_worker(config):  # stable: a file's tests keep their order
        items.sort(key=lambda item: -HEAVY.get(os.path.basename(item.path), 0.0))


class _RunAloneLock:
    """A readers-writer lock over two files shared by the workers (flock): every test holds `room` shared, a
    serial test holds it exclusive. `turn` is the turnstile: a waiting serial test holds it, so no test starts
    until the serial one has run."""

    def __init__(self, directory: str) -> None:
        self.turn = open(os.path.join(directory, "hybrid-run-alone.turn"), "a")
        self.room = open(os.path.join(directory, "hybrid-run-alone.room"), "a")

    def acquire(self, alone: bool) -> None:
        fcntl.flock(self.turn, fcntl.LOCK_EX)
        fcntl.flock(self.room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(self.turn, fcntl.LOCK_UN)

    def release(self, alone: bool) -> None:
        fcntl.flock(self.room, fcntl.LOCK_UN)
        if alone:
            fcntl.flock(self.turn, fcntl.LOCK_UN)


_LOCK: list[_RunAloneLock] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    """Setup (module fixtures included), call and teardown of one test, under the lock when under xdist."""
    if not _xdist_worker(item.config):
        yield
        return
    if not _LOCK:  # the workers' basetemps are <run's basetemp>/gw0, gw1: their parent is this run's, shared
        _LOCK.append(_RunAloneLock(os.path.dirname(str(item.config.option.basetemp))))
    alone = item.get_closest_marker("serial") is not None
    _LOCK[0].acquire(alone)
    try:
        yield
    finally:
        _LOCK[0].release(alone)
