"""hybrid.testing.agent_run / fork_service: the real torchrun agent with each worker a fork of the forkserver
(hybrid/testing_worker.py stands for it). What torchrun sees of a worker is what it would see of `python -u ARGV`:
the rank's environment and output, its exit status, its death by a signal; and a worker killed takes its rank
with it, as torchrun's killpg would."""

from __future__ import annotations

import os
import re
import time

import pytest

from hybrid import testing

RANK = """
import os, signal, sys, time
print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} pid {os.getpid()} argv {sys.argv[1:]}", flush=True)
if sys.argv[1] == "die" and os.environ["RANK"] == "1":
    os.kill(os.getpid(), signal.SIGKILL)
if sys.argv[1] == "sleep":
    time.sleep(600)
sys.exit(int(os.environ["RANK"]) * 3)
"""


@pytest.mark.slow  # the forkserver's start and two torchrun agents: ~9 s of CPU
def test_torchrun_sees_each_forked_workers_output_status_and_signal():
    """Two jobs under one service: rank 1 exits 3 (the summary's root cause, exit code 3), then rank 1 SIGKILLs
    itself (SIGKILL in the summary). Each rank is a fork (not a child of the agent) with torchrun's env."""
    out = testing.agent_run(["--nproc-per-node", "2"], ["-c", RANK, "exit"], timeout=120)
    assert out.returncode != 0
    pids = re.findall(r"rank (\d) of 2 pid (\d+) argv \['exit'\]", out.stdout)
    assert sorted(r for r, _ in pids) == ["0", "1"], out.stdout + out.stderr[-2000:]
    root = out.stderr.split("Root Cause (first observed failure):")[1]
    assert re.search(r"rank +: 1 \(local_rank: 1\)\n +exitcode +: 3 ", root), root
    out = testing.agent_run(["--nproc-per-node", "2"], ["-c", RANK, "die"], timeout=120)
    assert "exitcode  : -9" in out.stderr and "Signal 9 (SIGKILL)" in out.stderr, out.stderr[-3000:]


def _printed_pid(agent: testing.Forked, seconds: float = 120) -> int:
    """The pid the rank prints first (its line reaches the agent's stdout through the worker's fds)."""
    deadline = time.monotonic() + seconds
    while not (m := re.search(r"pid (\d+)", agent.stdout())):
        assert agent.poll() is None and time.monotonic() < deadline, agent.stderr()[-3000:]
        time.sleep(0.05)
    return int(m.group(1))


@pytest.mark.slow  # a real torchrun agent is the subject (itself a fork, as agent_run's: torchrun's own code)
def test_a_killed_worker_takes_its_rank_with_it():
    psutil = pytest.importorskip("psutil")
    with testing.fork_service() as service:
        agent = testing.start(["-m", "torch.distributed.run", "--nproc-per-node", "1",
                               *testing.worker_command(["-c", RANK, "sleep"])], env=service)
        try:
            rank = psutil.Process(_printed_pid(agent))
            (worker,) = psutil.Process(agent.pid).children()
            assert rank.pid != worker.pid and rank.ppid() != agent.pid, "the rank is a fork, not the worker"
            worker.kill()
            rank.wait(timeout=30)  # raises if the rank outlives its worker
        finally:
            agent.kill()
            agent.wait()
    assert not os.path.exists(service["HYBRID_FORK_SERVICE"]), "the service's socket is removed"

