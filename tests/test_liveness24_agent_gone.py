"""A rank whose torchrun agent was SIGKILLed stops with one line (hybrid/liveness.py, Heartbeat._stop_if_orphaned).

torch 2.13 starts each worker in a session of its own with no parent-death signal: round 24 measured a 2-rank
train.py run whose agent was SIGKILLed at iteration 20 still training at iteration 820 a minute later. The fault is
injected as it happens: an agent in miniature (a fork) hosts the rendezvous store as torchrun's agent does and
starts a worker as its child (os.fork: the worker's parent is the agent, as with torchrun's Popen) with the
agent-store environment; the worker's heartbeat runs; the agent is SIGKILLed. The worker must be gone within
BOUND_S with the line naming the agent. Without the check the worker sleeps on (the test fails).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from hybrid import testing

# The heartbeat polls its parent every second (interval 0.5 s at a 5 s timeout); the rest is being scheduled on a
# loaded machine. Far below the minutes a lost agent's ranks would run on.
BOUND_S = 15.0
READY_S = 120.0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _agent_like(argv: list[str]) -> None:
    """Hosts a TCPStore as torchrun's agent does, forks one worker that starts hybrid's heartbeat, then waits."""
    import torch.distributed as dist
    folder = argv[0]
    port = testing.free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True")
    pid = os.fork()
    if pid == 0:  # the worker
        from hybrid import liveness
        heartbeat = liveness.Heartbeat(1, 2, timeout_s=5.0)
        with open(os.path.join(folder, "worker.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.replace(os.path.join(folder, "worker.tmp"), os.path.join(folder, "worker"))
        time.sleep(600)  # training, as far as the test is concerned
        heartbeat.stop()
        os._exit(0)
    time.sleep(600)
    del store


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_rank_stops_with_one_line_when_its_torchrun_agent_is_sigkilled(tmp_path):
    folder = str(tmp_path)
    agent = testing.start([folder], entry=_agent_like)
    worker = None
    try:
        end = time.monotonic() + READY_S
        note = tmp_path / "worker"
        while not (note.exists() and note.stat().st_size) and time.monotonic() < end:
            assert agent.poll() is None, agent.stderr()[-3000:]
            time.sleep(0.05)
        worker = int(note.read_text())
        time.sleep(1.5)  # a few beats into the store
        assert _alive(worker)
        agent.kill()
        agent.wait(30)
        end = time.monotonic() + BOUND_S
        while _alive(worker) and time.monotonic() < end:
            time.sleep(0.05)
        assert not _alive(worker), f"the rank outlived its SIGKILLed agent by {BOUND_S:.0f} s"
        err = agent.stderr()
        assert f"rank 1: stopped: torchrun's agent (pid {agent.pid}) is gone" in err, err[-2000:]
        assert "start the job again" in err
    finally:
        agent.kill()
        if worker is not None and _alive(worker):
            os.kill(worker, signal.SIGKILL)
