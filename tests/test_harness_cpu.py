"""`time pytest ...` counts the forked ranks' CPU: the session's end stops hybrid.testing's forkserver and waits
for it (tests/conftest.py), and the forkserver reaps the ranks it forked, so their CPU reaches this process's
children. The suite's CPU budget is measured that way (per file, `time` user + sys)."""

from __future__ import annotations

import os
import resource
import time

import pytest

from hybrid import testing


def _burn(rank: int, world: int, seconds: float) -> float:
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass
    return time.process_time() - start


@pytest.mark.slow  # restarts the forkserver for the next test (its ~4 s of preload CPU): the full suite runs it
def test_stopping_the_forkserver_brings_its_ranks_cpu_into_this_process_children():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    burned = sum(testing.run_distributed(_burn, 2, args=(0.5,), timeout=120))
    testing.stop_forkserver()  # the next launch starts a new one
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    counted = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert burned >= 1.0 and counted >= burned, (burned, counted)
    testing.stop_forkserver()  # none running: nothing to do


def _parent(rank: int, world: int) -> int:
    return os.getppid()


def _launches_ranks(argv: list[str]) -> None:
    """A command run as a fork that launches ranks of its own (as `hybrid calibrate` and the benchmark scripts do)."""
    from multiprocessing import forkserver
    parents = testing.run_distributed(_parent, 2, timeout=120)
    print(f"parents {parents} own forkserver {forkserver._forkserver._forkserver_pid}")


def test_a_forked_command_launches_its_ranks_from_the_same_forkserver():
    """Its ranks are forks of the forkserver that forked the command: no second forkserver (nor its ~5 s of PRELOAD
    imports) -- the command's own `run_distributed` starts none."""
    from multiprocessing import forkserver
    out = testing.run([], entry=_launches_ranks, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    server = forkserver._forkserver._forkserver_pid
    assert f"parents [{server}, {server}] own forkserver None" in out.stdout, (server, out.stdout)


def test_a_file_without_a_duration_record_goes_out_at_the_median_not_last():
    """tests/conftest.py's longest-first order: a new file (no record yet) is placed at the median known file's
    weight, so a heavy new file never starts last and sets the run's tail alone."""
    from conftest import _unknown_weight
    assert _unknown_weight({"a.py": 120.0, "b.py": 40.0, "c.py": 1.0}) == 40.0
    assert _unknown_weight({}) == 0.0


@pytest.mark.slow  # restarts the forkserver for the next test, as above
def test_a_fork_left_running_does_not_hang_the_sessions_end():
    """The forkserver outlives a fork still holding its `alive` fd (here one stopped with SIGSTOP): stopping it
    waits at most `wait` seconds, then leaves it to exit after that fork, as before."""
    import signal
    p = testing.start(["-c", "import time; time.sleep(600)"])
    try:
        p.send_signal(signal.SIGSTOP)
        t = time.monotonic()
        testing.stop_forkserver(wait=1.0)
        assert time.monotonic() - t < 5.0
    finally:
        p.kill()
        p.wait(timeout=30)
