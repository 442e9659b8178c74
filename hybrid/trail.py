"""The op trail: what this process is doing right now, for the watchdog and the straggler report.

`hybrid.comm.Group` records every collective and point-to-point batch here where it starts, and the
pipeline executor (or, without a pipeline, a forward hook) records the phase and micro-batch. Per rank:

  * a sequence number per process group: the n-th collective a rank starts on its "dp" group is
    the n-th its DP peers start too (every member issues the same collectives in the same order),
    so "rank 0 is in dp all_reduce #37, rank 2 has started only 36" names who has not arrived;
  * per-peer point-to-point counters: a rank's k-th send to peer q meets q's k-th receive from it;
  * the ops started and not yet completed (`pending`), oldest first;
  * the iteration (1-based, as the log prints it), the micro-batch (0-based) and the phase;
  * seconds per phase in the current step (forward, backward, p2p, comm, optimizer), time spent
    waiting in a collective (or context parallelism's ring transfers) counted as comm, on a pipeline message
    as p2p, not as the phase around it.

One trail per process (like PyTorch's Flight Recorder, and for the same reason: a hang must be
diagnosable from a thread that shares nothing with the stuck code but memory). It observes only:
nothing in training reads it back. The cost is a few dict updates per op.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

PHASES = ("forward", "backward", "p2p", "comm", "optimizer", "other")


@dataclass
class OpRecord:
    """One collective or point-to-point batch as this rank started it."""

    group: str  # mesh axis name: tp, dp, pp, embedding
    ranks: tuple[int, ...]  # global ranks of the group
    op: str  # all_reduce, all_gather, reduce_scatter, broadcast, p2p
    seq: int  # collectives: 1-based index on this group; p2p: 0 (see `p2p`)
    iteration: int
    microbatch: int
    phase: str
    p2p: list[tuple[str, int, int, str]] = field(default_factory=list)  # (send|recv, peer global rank, k-th, label)
    started: float = 0.0  # time.time()


class Trail:
    """This process's op trail (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.iteration = 0
        self.microbatch = -1
        self.phase = "other"
        self.seq: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.last: dict[str, dict] = {}  # group -> its latest collective: op, seq, ranks, iteration, micro-batch
        self.p2p: dict[str, int] = {}  # "send:q" / "recv:q" -> count started
        self.pending: list[OpRecord] = []
        self.blocked: OpRecord | None = None  # the op the caller waits for right now (lazy p2p: one of several)
        self.last_progress = time.monotonic()
        self.phase_seconds = dict.fromkeys(PHASES, 0.0)
        self._phase_since = time.monotonic()
        self.on_op_start = None  # test-only fault hook (hybrid.fault.inject), called before an op counts

    # --- phases ------------------------------------------------------------------------------
    def _switch(self, phase: str) -> str:
        now = time.monotonic()
        self.phase_seconds[self.phase] = self.phase_seconds.get(self.phase, 0.0) + now - self._phase_since
        self._phase_since = self.last_progress = now
        old, self.phase = self.phase, phase
        return old

    def enter(self, phase: str, microbatch: int | None = None) -> None:
        """The rank starts `phase` (of micro-batch `microbatch`, when given)."""
        if microbatch is not None:
            self.microbatch = microbatch
        self._switch(phase)

    def begin_iteration(self, iteration: int) -> None:
        self.iteration, self.microbatch = iteration, -1
        self._switch("other")
        self.phase_seconds = dict.fromkeys(PHASES, 0.0)

    def take_phase_seconds(self) -> dict[str, float]:
        """Seconds per phase since the iteration began (the current phase closed now)."""
        self._switch(self.phase)
        return dict(self.phase_seconds)

    # --- ops ---------------------------------------------------------------------------------
    def start(self, group: str, ranks: tuple[int, ...], op: str, sends: tuple[int, ...] = (),
              recvs: tuple[int, ...] = (), labels: tuple[str, ...] = ()) -> OpRecord:
        """Record an op as started: collectives count on `group`; p2p counts per peer (global ranks),
        `labels` naming each send, then each receive (e.g. "send_act of micro-batch 1")."""
        rec = OpRecord(group, tuple(ranks), op, 0, self.iteration, self.microbatch, self.phase)
        if self.on_op_start is not None:
            self.on_op_start(rec, sends)
        with self.lock:
            if op == "p2p":
                items = [("send", q) for q in sends] + [("recv", q) for q in recvs]
                for i, (d, q) in enumerate(items):
                    key = f"{d}:{q}"
                    self.p2p[key] = self.p2p.get(key, 0) + 1
                    rec.p2p.append((d, q, self.p2p[key], labels[i] if i < len(labels) else d))
            else:
                rec.seq = self.seq[group] = self.seq.get(group, 0) + 1
                self.last[group] = {"op": op, "seq": rec.seq, "ranks": list(ranks), "iteration": rec.iteration,
                                    "microbatch": rec.microbatch}
            rec.started = time.time()
            self.pending.append(rec)
        self.last_progress = time.monotonic()
        return rec

    def complete(self, rec: OpRecord) -> None:
        with self.lock:
            if rec in self.pending:
                self.pending.remove(rec)
            if rec.op != "p2p":
                self.done[rec.group] = max(self.done.get(rec.group, 0), rec.seq)
        self.last_progress = time.monotonic()

    @contextmanager
    def waiting(self, rec: OpRecord):
        """The caller blocks until `rec` completes: the time counts as comm, or p2p for the pipeline's messages
        (blocked_phase)."""
        old = self._switch(blocked_phase(rec))
        self.blocked = rec
        try:
            yield
        finally:
            self.blocked = None
            self.complete(rec)
            self._switch(old)

    @contextmanager
    def op(self, group: str, ranks: tuple[int, ...], op: str, **kw):
        """A blocking op: started, waited for, completed."""
        rec = self.start(group, ranks, op, **kw)
        with self.waiting(rec):
            yield rec

    # --- for the watchdog --------------------------------------------------------------------
    def snapshot(self) -> dict:
        with self.lock:
            return {"iteration": self.iteration, "microbatch": self.microbatch, "phase": self.phase,
                    "idle": time.monotonic() - self.last_progress, "seq": dict(self.seq), "done": dict(self.done),
                    "last": {g: dict(v) for g, v in self.last.items()},
                    "p2p": dict(self.p2p), "pending": [asdict(r) for r in self.pending],
                    "blocked": self.pending.index(self.blocked) if self.blocked in self.pending else None}


def blocked_phase(rec: OpRecord) -> str:
    """The phase a rank blocked on `rec` is in: "p2p" (the straggler report's "pipeline waits": bubble and
    transfers) for point-to-point on the pipeline group only; context parallelism's ring (p2p on the "cp" group)
    exchanges key / value blocks inside attention, a collective's time as TP's, so "comm" -- it was "p2p", and a
    pp 1 run with --cp-comm-type p2p reported 14 % "pipeline waits" without a pipeline."""
    return "p2p" if rec.op == "p2p" and rec.group == "pp" else "comm"


TRAIL = Trail()
