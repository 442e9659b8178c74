"""`time pytest ...` counts the forked ranks' CPU: the session's end stops hybrid.testing's forkserver and waits
for it (tests/conftest.py), and the forkserver reaps the ranks it forked, so their CPU reaches this process's
children. The suite's CPU budget is measured that way (per file, `time` user + sys)."""

from __future__ import annotations

import os
import resource
import time

import pytest

from hybrid import testing


@pytest.fixture(autouse=True, scope="module")
def no_inductor_preload():
    """This file stops the forkserver and starts new ones; none of its ranks compiles, so those start without the
    suite's inductor warm-up (tests/conftest.py, hybrid/testing_preload_inductor.py: ~2.5 s of CPU a start)."""
    saved = list(testing.PRELOAD)
    testing.PRELOAD[:] = [m for m in saved if m != "hybrid.testing_preload_inductor"]
    yield
    testing.PRELOAD[:] = saved


def _burn(rank: int, world: int, seconds: float) -> float:
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass
    return time.process_time() - start


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


def test_the_per_worker_balance_counts_each_workers_files_seconds_and_end():
    """tests/conftest.py's worker lines (whether one xdist worker finished long before the other): reports as the
    controller gets them (report.node.gateway.id), summed per worker; a report without a node (no xdist) counts in
    no worker's line."""
    from types import SimpleNamespace as NS

    from conftest import _Durations, balance_lines
    durations = _Durations(config=None)
    for nodeid, duration, worker in [("tests/test_a.py::t1", 2.0, "gw0"), ("tests/test_a.py::t2", 3.0, "gw0"),
                                     ("tests/test_b.py::t1", 4.5, "gw1"), ("tests/test_c.py::t1", 1.0, None)]:
        node = NS(gateway=NS(id=worker)) if worker else None
        durations.report(NS(nodeid=nodeid, duration=duration, when="teardown", user_properties=[], node=node))
    balance = durations.balance()
    assert {w: (v["files"], v["seconds"]) for w, v in balance.items()} == {"gw0": (1, 5.0), "gw1": (1, 4.5)}
    assert balance["gw0"]["end"] <= balance["gw1"]["end"]  # gw1 reported last
    balance = {"gw0": {"files": 3, "seconds": 700.0, "end": 760.0}, "gw1": {"files": 9, "seconds": 640.0, "end": 700.0}}
    assert balance_lines(balance) == ["worker gw0: 3 files, 700.0 s of tests, its last ended at 760.0 s",
                                      "worker gw1: 9 files, 640.0 s of tests, its last ended at 700.0 s",
                                      "workers' ends differ by 60.0 s (one worker idle that long at the end)"]


# the two stopping tests come last: the file's other launches run on the forkserver they found
@pytest.mark.slow  # stops the forkserver: the next file's launch starts a new one (~5 s of preload CPU)
def test_stopping_the_forkserver_brings_its_ranks_cpu_into_this_process_children():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    burned = sum(testing.run_distributed(_burn, 2, args=(0.5,), timeout=120))
    testing.stop_forkserver()  # the next launch starts a new one
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    counted = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert burned >= 1.0 and counted >= burned, (burned, counted)
    testing.stop_forkserver()  # none running: nothing to do


@pytest.mark.slow  # starts a forkserver of its own (the test above stopped the file's) and stops it
def test_a_fork_left_running_does_not_hang_the_sessions_end(monkeypatch):
    """The forkserver outlives a fork still holding its `alive` fd (here one stopped with SIGSTOP): stopping it
    waits at most `wait` seconds, then leaves it to exit after that fork, as before. Its one fork runs a sleep:
    the forkserver preloads only hybrid.testing (the fork's entry), not the ranks' PRELOAD (~2 s of CPU less)."""
    import signal
    monkeypatch.setattr(testing, "PRELOAD", ["hybrid.testing"])  # read when the forkserver starts
    p = testing.start(["-c", "import time; time.sleep(600)"])
    try:
        p.send_signal(signal.SIGSTOP)
        t = time.monotonic()
        testing.stop_forkserver(wait=1.0)
        assert time.monotonic() - t < 5.0
    finally:
        p.kill()
        p.wait(timeout=30)
