"""Which rank was lost: heartbeats in the rendezvous store, read after a collective fails.

gloo reports a killed peer as "Connection closed by peer" and a stalled one only when the collective times out
(`--distributed-timeout-minutes`, given to init_process_group and to every group of the mesh); neither says which
rank. So each rank bumps its own counter in the rendezvous store (torchrun's agent store, or rank 0's TCPStore
without torchrun) every `interval` seconds from a daemon thread. The thread keeps beating while the main thread
waits in a collective (the c10d bindings release the GIL) and stops when the process is killed or stopped. After a
collective fails, a survivor reads every counter, waits three intervals and reads again: the ranks whose counter
did not move are the lost ones. The job then ends with one line naming them, within the timeout plus that window.

Tests make a rank die or stall through the one test-only hook, hybrid/fault/inject.py (HYBRID_FAULT="signal:...").
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from hybrid.cliutil import record_error
from hybrid.fault.attempt import attempt_id

class StoreLost(RuntimeError):
    """The rendezvous store no longer answers (without torchrun it lives in rank 0's process)."""


class Heartbeat:
    """This rank's heartbeat thread and the post-mortem that names the lost ranks.

    Attributes:
        rank, world: this rank and the world size.
        interval: seconds between beats: a tenth of the distributed timeout, within [0.5, 10] s.
    """

    def __init__(self, rank: int, world: int, timeout_s: float):
        self.rank, self.world = rank, world
        self.interval = min(10.0, max(0.5, timeout_s / 10))
        self.address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        self._prefix = f"hybrid/heartbeat/{attempt_id()}"
        self._store = self._connect()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="hybrid-heartbeat")
        self._thread.start()

    def _connect(self) -> dist.TCPStore:
        host, port = self.address.rsplit(":", 1)
        return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=5 + 3 * self.interval))

    def _beat(self) -> None:
        key = f"{self._prefix}/{self.rank}"
        while not self._stop.is_set():
            try:
                self._store.add(key, 1)
            except Exception:  # the store is gone; the post-mortem reports it
                return
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()

    @property
    def window(self) -> float:
        """Seconds the post-mortem watches the counters: three beats of a live rank, at least 3 s."""
        return max(3.0, 3 * self.interval)

    def lost_ranks(self) -> list[int]:
        """The other ranks whose heartbeat did not advance within `window`; StoreLost if the store is gone."""
        try:
            reader = self._connect()
            keys = [f"{self._prefix}/{r}" for r in range(self.world)]
            before = [reader.add(k, 0) for k in keys]
            time.sleep(self.window)
            after = [reader.add(k, 0) for k in keys]
        except Exception as e:  # DistStoreError, connection refused/reset, store timeout
            raise StoreLost(str(e)) from None
        return [r for r in range(self.world) if r != self.rank and after[r] == before[r]]


def exit_if_ranks_lost(heartbeat: Heartbeat | None, error: BaseException, prog: str = "train.py") -> None:
    """After `error` ended this rank's run: if other ranks are gone, the lowest survivor prints one line naming
    them, every survivor records it for torchrun's summary, and the process exits 1 (os._exit: a process group
    with a dead peer cannot be torn down reliably). Returns when every rank is alive (a real bug: re-raise)."""
    if heartbeat is None:
        return
    try:
        lost = heartbeat.lost_ranks()
        what = (f"rank{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))} of {heartbeat.world} stopped "
                f"responding (killed or stalled)")
    except StoreLost:
        lost = [0]
        what = (f"the rendezvous store at {heartbeat.address} is gone (without torchrun it lives in rank 0: "
                f"rank 0 was lost)")
    if not lost:
        return
    cause = (str(error).strip().splitlines() or [""])[0][:200]
    message = (f"{prog}: error: {what}; rank {heartbeat.rank} stopped with {type(error).__name__}: {cause}. "
               f"See the lost rank's log (docs/troubleshooting.md)")
    record_error(message)
    survivors = [r for r in range(heartbeat.world) if r not in lost]
    if heartbeat.rank == survivors[0]:
        print(message, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)
