"""Hang verdicts: a watchdog thread per rank that names the op a stuck job waits in, and who is missing.

Every `interval` seconds each rank's watchdog writes its op trail (hybrid/trail.py: per-group
sequence numbers, per-peer p2p counters, the ops in flight, iteration, micro-batch, phase) and a
wall-clock heartbeat to the rendezvous store -- a TCPStore, which keeps answering while the process
groups are wedged (under torchrun it lives in the agent; under env:// in rank 0's process). When
this rank has made no progress for `timeout` seconds inside a training step, or another rank has
raised the alarm, it reads every rank's trail and prints ONE line:

    hang verdict: rank 0 waited 9.8s in dp all_reduce #5 (group dp ranks [0, 2]) at iteration 5
    micro-batch 1; not arrived: rank 2 (in backward at iteration 5 micro-batch 1, started dp all_reduce
    4 times, heartbeat 0.4s ago)

then exits with EXIT_HANG so torchrun can restart the job. "Not arrived" compares sequence numbers:
in a collective, a member that has started fewer ops on that group than the waiter's number; in a
p2p batch, a peer whose matching counter (its receives from us for our k-th send, and vice versa)
is below k. A rank whose heartbeat is older than `stale_after` is reported as stopped or dead
(SIGSTOP, a kernel hang holding the GIL, a lost node).
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import sys
import threading
import time

import torch.distributed as dist

from hybrid.fault.attempt import attempt_id
from hybrid.trail import TRAIL

EXIT_HANG = 75  # sysexits EX_TEMPFAIL: try again (torchrun --max-restarts restarts the job)


def open_store(timeout_s: float) -> "dist.Store":
    """A fresh client of the rendezvous store (MASTER_ADDR:MASTER_PORT: torchrun's agent store, or the
    env:// store rank 0 hosts), keys under hybrid/fault/<attempt id>/ so a restarted job starts clean."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port:
        store = dist.TCPStore(addr, int(port), is_master=False, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
    else:
        store = dist.distributed_c10d._get_default_store()
    return dist.PrefixStore(f"hybrid/fault/{attempt_id()}/", store)


# --- the verdict: a pure function of every rank's published state --------------------------------
def not_arrived(rec: dict, owner: int, states: dict[int, dict | None]) -> list[int]:
    """Ranks that have not yet started their side of `owner`'s op `rec`."""
    if rec["op"] == "p2p":
        out = []
        for d, q, k, _ in rec["p2p"]:
            s = states.get(q)
            other = "recv" if d == "send" else "send"
            if (s is None or s["p2p"].get(f"{other}:{owner}", 0) < k) and q not in out:
                out.append(q)
        return out
    return [q for q in rec["ranks"] if q != owner and
            (states.get(q) is None or states[q]["seq"].get(rec["group"], 0) < rec["seq"])]


def _where(rec_or_state: dict) -> str:
    return f"iteration {rec_or_state['iteration']} micro-batch {rec_or_state['microbatch']}"


def _describe_op(rec: dict) -> str:
    group = f"(group {rec['group']} ranks {list(rec['ranks'])})"
    if rec["op"] == "p2p":
        items = ", ".join(f"{what} #{k} {'->' if d == 'send' else '<-'} rank {q}" for d, q, k, what in rec["p2p"])
        return f"{rec['group']} p2p [{items}] {group}"
    return f"{rec['group']} {rec['op']} #{rec['seq']} {group}"


def _describe_rank(q: int, states: dict, now: float, stale_after: float, group: str | None) -> str:
    s = states.get(q)
    if s is None:
        return f"rank {q} (never reported: did it start?)"
    age = now - s["t"]
    where = f"in {s['phase']} at {_where(s)}"
    if group:
        where += f", started {group} ops {s['seq'].get(group, 0)} times"
    if age > stale_after:
        return f"rank {q} (no heartbeat for {age:.1f}s: stopped or dead; last seen {where})"
    waited = _waited_op(s)
    if waited and (missing := not_arrived(waited, q, states)):  # a cascade: whom q waits for, so every line
        where += f", itself waiting in {_describe_op(waited)} for ranks {missing}"  # leads to the root
    return f"rank {q} ({where}, heartbeat {age:.1f}s ago)"


def _waited_op(state: dict) -> dict | None:
    """The op a rank waits for right now, or None. Other pending ops (the lazy pipeline's posted sends and
    receives, ZeRO's async collectives) are not waited for yet: a partner missing there may only be early.
    A state without the "blocked" field (written by a blocking-only trail) waits for its newest op."""
    pending = state["pending"]
    blocked = state.get("blocked", len(pending) - 1 if pending else None)
    return None if blocked is None else pending[blocked]


def verdict(me: int, states: dict[int, dict | None], now: float, stale_after: float) -> str:
    """The one line rank `me` prints, from every rank's state (None: never published)."""
    st = states[me]
    rec = _waited_op(st)
    if rec is not None:
        missing = not_arrived(rec, me, states)
        group = rec["group"] if rec["op"] != "p2p" else None
        who = "; ".join(_describe_rank(q, states, now, stale_after, group) for q in missing) or "none (all started it)"
        line = f"hang verdict: rank {me} waited {now - rec['started']:.1f}s in {_describe_op(rec)} at {_where(rec)}"
        if rec["op"] == "p2p":  # name the transfers that are blocked, each with its micro-batch
            line += "; blocked on " + ", ".join(f"{what} {'->' if d == 'send' else '<-'} rank {q}"
                                                for d, q, _, what in rec["p2p"] if q in missing)
        line += f"; not arrived: {who}"
        peers = rec["ranks"] if rec["op"] != "p2p" else [q for _, q, _, _ in rec["p2p"]]
        stale = [q for q in peers if q != me and q not in missing and states.get(q) and now - states[q]["t"] > stale_after]
        if stale:
            line += "; stopped heart-beating: " + "; ".join(_describe_rank(q, states, now, stale_after, group) for q in stale)
        return line
    behind = _behind(me, states)
    if behind:  # e.g. NCCL: collectives return before they complete, the host blocks later (loss.item())
        return (f"hang verdict: rank {me} is in no communication op ({st['phase']} at {_where(st)}, no progress for "
                f"{st['idle']:.1f}s); not arrived: " + "; ".join(behind))
    waiters = []
    for q, s in sorted(states.items()):
        r = _waited_op(s) if s else None
        if r and me in not_arrived(r, q, states):
            waiters.append(f"rank {q} in {_describe_op(r)} at {_where(r)}")
    return (f"hang verdict: rank {me} is in no communication op ({st['phase']} at {_where(st)}, no progress for "
            f"{st['idle']:.1f}s); not arrived: rank {me} (this rank), awaited by: {'; '.join(waiters) or 'nobody'}")


def _behind(me: int, states: dict[int, dict | None]) -> list[str]:
    """Collectives this rank started that a member of its group has not (sequence numbers alone): the
    verdict of a rank that waits outside any op, as under NCCL, whose collectives return at launch."""
    out = []
    for group, last in sorted(states[me].get("last", {}).items()):
        lag = [q for q in last["ranks"] if q != me and states.get(q) and states[q]["seq"].get(group, 0) < last["seq"]]
        if lag:
            out.append(f"{group} {last['op']} #{last['seq']} at {_where(last)} not started by ranks {lag}")
    return out


# --- the thread ------------------------------------------------------------------------------------
class HangWatchdog:
    """Heart-beats into the store and turns a stall into a verdict and an exit (see the module docstring).

    `armed` is set only inside a training step (the loop's begin/end), so a long save or evaluation
    between steps is not a hang; heart-beats continue throughout."""

    def __init__(self, rank: int, world: int, timeout: float, store=None, interval: float | None = None):
        self.rank, self.world, self.timeout = rank, world, timeout
        self.interval = interval or max(0.2, min(5.0, timeout / 10))
        self.stale_after = min(timeout / 2, 3 * self.interval + 1.0)
        self.store = store if store is not None else open_store(max(5.0, self.interval * 4))
        self.armed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hybrid-watchdog", daemon=True)

    def start(self) -> "HangWatchdog":
        self.publish()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval * 2 + 1)

    def publish(self) -> None:
        state = TRAIL.snapshot()
        state.update(rank=self.rank, t=time.time())
        self.store.set(f"state/{self.rank}", json.dumps(state))

    def read_states(self) -> dict[int, dict | None]:
        keys = [f"state/{r}" for r in range(self.world)]
        return {r: json.loads(self.store.get(k)) if self.store.check([k]) else None for r, k in enumerate(keys)}

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.publish()
                alarm = self.store.check(["fired"])
            except Exception:  # the store's host is gone: the job is ending anyway
                return
            if alarm or (self.armed and TRAIL.snapshot()["idle"] > self.timeout):
                self.fire(first=not alarm)

    def fire(self, first: bool) -> None:
        """Raise the alarm (first) or answer it, print this rank's verdict, wait briefly for the other
        live ranks to print theirs (the store may live in one of them), exit with EXIT_HANG."""
        atexit.register(_exit_hang)  # a peer's exit may fail our main thread first: still exit 75
        try:
            if first:
                self.store.set("fired", str(self.rank))
            time.sleep(self.interval)  # the others publish their latest trail meanwhile
            self.publish()
            states = self.read_states()
            line = verdict(self.rank, states, time.time(), self.stale_after)
        except Exception as e:  # noqa: BLE001 -- a verdict from local state only beats none
            states, line = None, f"hang verdict: rank {self.rank} (store unreachable: {e}); own trail: {TRAIL.snapshot()}"
        print(f"{line} -- exiting with code {EXIT_HANG}", file=sys.stderr, flush=True)
        try:
            live = sum(1 for s in (states or {}).values() if s and time.time() - s["t"] <= self.stale_after)
            self.store.add("verdicts", 1)
            deadline = time.time() + 2 * self.interval + 2
            while time.time() < deadline and self.store.add("verdicts", 0) < live:
                time.sleep(0.05)
        except Exception:  # noqa: BLE001
            pass
        _exit_hang()


def _exit_hang() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_HANG)
