"""Launch `python -m hybrid.train` as N rank processes with the env:// variables torchrun would set,
for fault tests that need each rank's exit code, output and exit time (torchrun tears the others down
as soon as one rank fails, which hides exactly what a hang test checks).

    ranks = launch(["--tensor-model-parallel-size", "2", ...], world=4, env={"HYBRID_FAULT": "..."})
    ranks[2].returncode, ranks[2].stderr, ranks[2].exited - ranks[2].injected
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from hybrid.testing import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class RankRun:
    rank: int
    returncode: int | None
    stdout: str
    stderr: str
    exited: float | None  # time.monotonic() when it was seen to exit (None: killed at the deadline)
    injected: float | None  # when its stdout first showed "inject:" (None: it injected nothing)


def launch(argv: list[str], world: int, env: dict[str, str] | None = None, timeout: float = 120.0,
           kill_stopped: bool = True, teardown_after: float | None = None) -> list[RankRun]:
    """Run the ranks to completion (or `timeout`, then SIGKILL); poll 10 times a second. `teardown_after`:
    SIGKILL the rest this many seconds after the first rank exits non-zero, as torchrun tears a job down
    (None: wait for every rank)."""
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="hybrid-fault-")
    procs, files = [], []
    for r in range(world):
        out, err = open(os.path.join(tmp, f"{r}.out"), "w+"), open(os.path.join(tmp, f"{r}.err"), "w+")
        e = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(world),
                 LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world), PYTHONPATH=ROOT, OMP_NUM_THREADS="1", **(env or {}))
        procs.append(subprocess.Popen([sys.executable, "-m", "hybrid.train", *argv], cwd=ROOT, env=e,
                                      stdout=out, stderr=err))
        files.append((out, err))
    exited: dict[int, float] = {}
    injected: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(exited) < world and time.monotonic() < deadline:
        for r, p in enumerate(procs):
            if r not in exited and p.poll() is not None:
                exited[r] = time.monotonic()
                if p.returncode != 0 and teardown_after is not None:
                    deadline = min(deadline, exited[r] + teardown_after)
            if r not in injected and "inject:" in open(files[r][0].name).read():
                injected[r] = time.monotonic()
        if kill_stopped and injected and all(r in exited or _stopped(procs[r].pid) for r in range(world)):
            break  # only SIGSTOPped ranks are left
        time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
    runs = []
    for r, p in enumerate(procs):
        out, err = (open(f.name).read() for f in files[r])
        runs.append(RankRun(r, p.returncode if r in exited else None, out, err, exited.get(r), injected.get(r)))
    return runs


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False
