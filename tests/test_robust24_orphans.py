"""No process hybrid.testing starts outlives the process that started it (round 23's CI: a crashed pytest-xdist worker
left its forkserver and two gloo ranks polling for 40 minutes).

The fault is injected as it happened: a pytest worker in miniature (a fork) starts its own forkserver, a 2-rank gloo
run (run_distributed: rank 0 waiting in a barrier for rank 1) and a command (`start`), and is SIGKILLed; then every
process it left -- the forkserver and the three forks -- must be gone within BOUND_S. The same for a new interpreter
started and waited for (torchrun_cli's real torchrun): SIGTERMed by the kernel when its parent dies.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from hybrid import testing

# Each link of the chain is one blocked process woken by an EOF or a signal (no poll interval, no timeout): the
# forks' watch reads EOF, they SIGKILL themselves, the forkserver's select reads EOF on `alive`. What takes time is
# being scheduled on a loaded machine (2 cores, load up to ~30): 10 s is far above that and far below the 40 min.
BOUND_S = 10.0
READY_S = 120.0  # the miniature worker's own forkserver imports torch (~2 s of CPU; minutes of wall at worst)


def _alive(pid: int) -> bool:
    """Running and not a zombie (an exited process its new parent has not reaped is gone for this purpose)."""
    try:
        import psutil
    except ImportError:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except OSError:
            return False
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def _left_after(pids: list[int], bound: float) -> list[int]:
    end = time.monotonic() + bound
    while any(_alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _wait_for_files(folder: str, names: list[str], proc) -> dict[str, int]:
    end = time.monotonic() + READY_S
    while time.monotonic() < end:
        if all(os.path.exists(os.path.join(folder, n)) and os.path.getsize(os.path.join(folder, n)) for n in names):
            return {n: int(open(os.path.join(folder, n)).read()) for n in names}
        assert proc.poll() is None, proc.stderr()[-3000:]
        time.sleep(0.1)
    raise AssertionError(f"not ready within {READY_S:.0f} s: {os.listdir(folder)}\n{proc.stderr()[-3000:]}")


def _note_pid(folder: str, name: str) -> None:
    with open(os.path.join(folder, name + ".tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))


def _blocked_rank(rank: int, world: int, folder: str) -> None:
    import torch.distributed as dist
    _note_pid(folder, f"rank{rank}")
    if rank == 0:
        dist.barrier()  # waits for rank 1, which never comes: a gloo rank polling, as in round 23's CI
    time.sleep(600)


def _sleeping_command(argv: list[str]) -> None:
    _note_pid(argv[0], "command")
    time.sleep(600)


def _pytest_worker_like(argv: list[str]) -> None:
    """Starts a forkserver of its own (as a pytest worker's first launch does), a command and a 2-rank run."""
    from multiprocessing import forkserver
    folder = argv[0]
    fs = forkserver._forkserver
    vars(fs).pop("ensure_running", None)  # forget the forkserver this fork came from (hybrid.testing._forkserver)
    fs._forkserver_address = fs._forkserver_alive_fd = fs._forkserver_pid = None
    testing.PRELOAD = ["hybrid.testing"]  # enough for the forks below; the full PRELOAD is ~5 s of CPU
    testing._forkserver()
    forkserver.ensure_running()
    with open(os.path.join(folder, "forkserver"), "w") as f:
        f.write(str(fs._forkserver_pid))
    testing.start([folder], entry=_sleeping_command)
    testing.run_distributed(_blocked_rank, 2, args=(folder,), timeout=600)


def _kill_all(pids) -> None:
    for pid in pids:  # only what this test started, by pid
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_sigkilled_launcher_leaves_no_forkserver_and_no_rank(tmp_path):
    folder = str(tmp_path)
    worker = testing.start([folder], entry=_pytest_worker_like)
    pids: dict[str, int] = {}
    try:
        pids = _wait_for_files(folder, ["forkserver", "command", "rank0", "rank1"], worker)
        time.sleep(0.5)  # rank 0 into its barrier
        assert all(_alive(p) for p in pids.values()), pids
        worker.kill()
        worker.wait(30)
        left = _left_after(list(pids.values()), BOUND_S)
        assert not left, f"left running {BOUND_S:.0f} s after their launcher was SIGKILLed: " \
                         f"{[n for n, p in pids.items() if p in left]}"
    finally:
        worker.kill()
        _kill_all(pids.values())


def _runs_a_child(argv: list[str]) -> None:
    """Waits in testing._run_child (torchrun_cli's real torchrun) for an interpreter that sleeps."""
    code = f"import os, time; open({argv[0]!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    testing._run_child([sys.executable, "-S", "-c", code], argv[1], dict(os.environ), 600)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_an_interpreter_run_and_waited_for_ends_with_its_parent(tmp_path):
    """torchrun_cli's real torchrun is a new interpreter (a kernel child): SIGTERMed when its parent dies."""
    note = str(tmp_path / "child")
    parent = testing.start([note, str(tmp_path)], entry=_runs_a_child)
    child = None
    try:
        end = time.monotonic() + READY_S
        while not (os.path.exists(note) and os.path.getsize(note)) and time.monotonic() < end:
            assert parent.poll() is None, parent.stderr()[-3000:]
            time.sleep(0.05)
        child = int(open(note).read())
        parent.kill()
        parent.wait(30)
        assert not _left_after([child], BOUND_S), f"the child outlived its parent by {BOUND_S:.0f} s"
    finally:
        parent.kill()
        if child is not None:
            _kill_all([child])
