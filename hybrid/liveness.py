"""Which rank was lost: heartbeats in the rendezvous store, read after a collective fails.

gloo reports a killed peer as "Connection closed by peer" and a stalled one only when the collective times out
(`--distributed-timeout-minutes`, given to init_process_group and to every group of the mesh); neither says which
rank. So each rank bumps its own counter in the rendezvous store (torchrun's agent store, or rank 0's TCPStore
without torchrun) every `interval` seconds from a daemon thread. The thread keeps beating while the main thread
waits in a collective (the c10d bindings release the GIL) and stops when the process is killed or stopped. After a
collective fails, a survivor reads every counter, waits three intervals and reads again: the ranks whose counter
did not move are the lost ones. The job then ends with one line naming them, within the timeout plus that window.
Without torchrun's agent store the store lives in rank 0's process, so rank 0, told to stop by another rank's
failure, stays until that rank is done with the store (`Heartbeat._outlive_the_claimant`).

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
        # env:// without torchrun's agent store: rank 0's process is the store (init_process_group's TCPStore)
        self.hosts_store = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        self._prefix = f"hybrid/heartbeat/{attempt_id()}"
        # under torchrun this process is its agent's child: a parent pid that changes means the agent is gone
        self._agent = os.getppid() if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" else None
        self._store = self._connect()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="hybrid-heartbeat")
        self._thread.start()

    def _connect(self) -> dist.TCPStore:
        host, port = self.address.rsplit(":", 1)
        return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=5 + 3 * self.interval))

    def _beat(self) -> None:
        """Bump this rank's counter every `interval`; every second, stop this process (exit 0) if another rank
        has claimed the job's first failure (end_after_failure) -- the main thread may be blocked in a
        collective with that rank, which only a timeout would end."""
        key, last = f"{self._prefix}/{self.rank}", 0.0
        while not self._stop.is_set():
            self._stop_if_orphaned()
            try:
                if time.monotonic() - last >= self.interval:
                    self._store.add(key, 1)
                    last = time.monotonic()
                if self._store.check([self._claim_key]):
                    self._stop_for(self._store.get(self._claim_key).decode())
            except Exception:  # the store is gone; the post-mortem reports it -- or the agent that hosted it died
                while not self._stop.wait(1.0):
                    self._stop_if_orphaned()
                return
            self._stop.wait(min(1.0, self.interval))

    def _stop_if_orphaned(self) -> None:
        """Exit 1 with one line if torchrun's agent, this rank's parent, is gone. torch 2.13 starts each worker in
        a session of its own with no parent-death signal, so a SIGKILLed agent (the OOM killer, `kill -9` of
        torchrun's pid) left its ranks training with nothing to restart or stop them -- 800 iterations in 60 s, and
        still writing checkpoints into --save where a restarted job would write too (round 24,
        docs/operations.md). The kernel re-parents an orphan at once, so os.getppid() is the test (a rank polls
        it every second; PR_SET_PDEATHSIG would fire on the death of the agent's forking thread instead)."""
        if self._agent is None or os.getppid() == self._agent:
            return
        print(f"{os.path.basename(sys.argv[0]) or 'hybrid'}: rank {self.rank}: stopped: torchrun's agent (pid "
              f"{self._agent}) is gone -- nothing is left to restart or stop this rank; start the job again (it "
              f"resumes from --save's latest checkpoint)", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)

    @property
    def _claim_key(self) -> str:
        return f"{self._prefix}/first_failure"

    def _stop_for(self, claim: str, quiet: bool = False) -> None:
        """Exit 0 because rank `claim` failed first (not this one): its error is the job's."""
        rank, kind = claim.split(":")
        if int(rank) == self.rank:
            return
        if kind != "exit" and not quiet:  # an "exit" is the one-line error every rank reached: said once
            print(f"train.py: rank {self.rank}: stopped: rank {rank} failed first (its error is torchrun's root "
                  f"cause)", file=sys.stderr, flush=True)
        try:
            store = self._connect()
            store.add(f"{self._prefix}/stopped", 1)
            if self.hosts_store:
                self._outlive_the_claimant(store)
        except Exception:
            pass
        sys.stdout.flush()
        os._exit(0)

    @property
    def claim_deadline_s(self) -> float:
        """How long the claimant waits for the others to stop themselves (`_exit_after_others`)."""
        return max(10.0, 2 * self.interval + 2)

    def _outlive_the_claimant(self, store: dist.TCPStore) -> None:
        """Rank 0 hosting the store (no torchrun agent store) stays until the claimant is done with it: the
        claimant and the ranks still to stop connect to it afresh, and a connection to a store whose process has
        exited is not refused at once but retried until the client's timeout (5 s + 3 intervals: 35 s at the
        default 10-minute timeout; measured 35-66 s with torch 2.13's connect retry). Rank 0 leaving first made a
        4-rank one-line error (tests/test_diloco_checkpoint.py's replica mismatch) end after 99 s instead of 4 s,
        1 run in 8 (rank 0 exited 0 at 4.5 s, the claimant at 98.8 s). Bounded: the claimant's own wait, plus 2 s."""
        store.wait([self._released_key], timedelta(seconds=self.claim_deadline_s + 2))

    @property
    def _released_key(self) -> str:
        return f"{self._prefix}/released"

    def release(self) -> None:
        """The claimant is done with the store (the others stopped, or its wait ended): rank 0 may exit."""
        try:
            self._connect().set(self._released_key, "1")
        except Exception:
            pass

    def claim_failure(self, kind: str) -> None:
        """Claim the attempt's first failure for this rank (atomic in the store); if another rank holds it, stop
        (exit 0). `kind`: "exit" (a one-line error every rank reaches) or "error". StoreLost if the store is gone."""
        try:
            got = self._connect().compare_set(self._claim_key, "", f"{self.rank}:{kind}").decode()
        except Exception as e:
            raise StoreLost(str(e)) from None
        self._stop_for(got, quiet=kind == "exit")

    def wait_for_others(self, ranks: int, deadline_s: float) -> None:
        """The rank that failed first waits (at most `deadline_s`) until `ranks` others have stopped themselves."""
        end = time.monotonic() + deadline_s
        try:
            store = self._connect()
            while time.monotonic() < end and store.add(f"{self._prefix}/stopped", 0) < ranks:
                time.sleep(0.1)
        except Exception:
            pass

    def stop(self) -> None:
        """Stop beating and wait for the beat thread to end (it wakes at least every second; a store call in
        flight ends within the store's timeout): no Python thread but the main one may be left running while the
        process group is destroyed and the interpreter finalizes -- a rank of README's main job once aborted
        there ("terminate called without an active exception" in a non-main thread collecting garbage, round
        17's CI run)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5 + 3 * self.interval)

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


def _is_comm_error(error: BaseException) -> bool:
    """An error a collective raises when a peer is gone or silent (gloo/NCCL, a store or a timeout): then the lost
    rank, not this one, is the cause."""
    text = str(error)
    return isinstance(error, dist.DistError) or any(
        w in text for w in ("Connection closed", "Connection reset", "Timed out", "timed out", "gloo", "NCCL",
                            "Broken pipe", "DistStoreError"))


def _one_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:200]


def end_after_failure(heartbeat: Heartbeat | None, error: BaseException, prog: str = "train.py") -> None:
    """After `error` ended this rank's run (an exception, or a SystemExit with a non-zero status), under a
    launcher: make the launcher's summary name the rank that failed first, and let the others exit by themselves.

    torchrun stops every worker with SIGTERM as soon as one exits non-zero and calls the earliest failure the
    root cause -- to the second, so a rank it terminated often took the place of the one that failed. So the
    first rank to fail claims it in the rendezvous store (compare_set); every other rank's heartbeat thread sees
    the claim within a second, prints one line naming that rank and exits 0, even while its main thread waits in
    a collective with the failed rank. The claimant waits for them (bounded), then exits non-zero with its error
    recorded: the only failure torchrun sees. When this rank's own error is a failed collective, the heartbeats
    are asked first whether a peer was lost (killed or stalled); the line then names it (the lost rank cannot
    claim anything). Returns (the caller re-raises) without a heartbeat (one process, no launcher) or for a
    SystemExit of 0."""
    if heartbeat is None or (isinstance(error, SystemExit) and error.code in (0, None)):
        return
    lost: list[int] = []
    if _is_comm_error(error) and not isinstance(error, SystemExit):
        lost, message = _lost(heartbeat, error, prog)
        if lost:
            _claim_or_stop(heartbeat, "error")
            record_error(message)
            print(message, file=sys.stderr, flush=True)
            _exit_after_others(heartbeat, len(lost), 1)
    _claim_or_stop(heartbeat, "exit" if isinstance(error, SystemExit) else "error")
    _exit_as_the_failure(heartbeat, error, prog)


def _claim_or_stop(heartbeat: Heartbeat, kind: str) -> None:
    try:
        heartbeat.claim_failure(kind)  # exits 0 when another rank failed first
    except StoreLost:
        pass  # nobody to coordinate with: report it ourselves


def _exit_after_others(heartbeat: Heartbeat, lost: int, status: int) -> None:
    heartbeat.wait_for_others(heartbeat.world - 1 - lost, deadline_s=heartbeat.claim_deadline_s)
    heartbeat.release()  # rank 0, when it hosts the store, waits for this before it exits
    time.sleep(1.0)  # they counted themselves stopped just before exiting: let the launcher (its poll: 0.1 s) see it
    heartbeat.stop()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _exit_as_the_failure(heartbeat: Heartbeat, error: BaseException, prog: str) -> None:
    """This rank failed first: print and record its error, let the others stop, exit non-zero."""
    import traceback

    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler
    if isinstance(error, SystemExit):  # a one-line error (cliutil.fail, recorded already) or the NaN guard's stop
        status = error.code if isinstance(error.code, int) else 1
        message = getattr(error, "message", None) or (error.code if isinstance(error.code, str) else None)
        if message:  # cliutil.fail prints on rank 0 only, which may be one of the ranks that stop quietly
            print(message, file=sys.stderr, flush=True)
    else:
        status = 1
        traceback.print_exception(error)
        ErrorHandler().record_exception(error)  # the traceback in torchrun's summary, as `record` writes it
        print(f"{prog}: error: rank {heartbeat.rank} failed: {type(error).__name__}: {_one_line(error)}",
              file=sys.stderr, flush=True)
    _exit_after_others(heartbeat, 0, status)


def _lost(heartbeat: Heartbeat, error: BaseException, prog: str) -> tuple[list[int], str]:
    """(the other ranks that are gone, the one line naming them) -- ([], "") when every rank is alive."""
    try:
        lost = heartbeat.lost_ranks()
        what = (f"rank{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))} of {heartbeat.world} stopped "
                f"responding (killed or stalled)")
    except StoreLost:
        lost = [0]
        what = (f"the rendezvous store at {heartbeat.address} is gone (without torchrun it lives in rank 0: "
                f"rank 0 was lost)")
    if not lost:
        return [], ""
    return lost, (f"{prog}: error: {what}; rank {heartbeat.rank} stopped with {type(error).__name__}: "
                  f"{_one_line(error)}. See the lost rank's log (docs/troubleshooting.md)")
