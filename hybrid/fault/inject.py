"""Test-only fault injection: the one place that reads HYBRID_FAULT. Unset (the default), nothing
is installed and training runs untouched.

    HYBRID_FAULT="hang:rank=2,op=dp.all_reduce,iteration=5,microbatch=1"   sleep before that op
    HYBRID_FAULT="stop:rank=2,op=pp.send,iteration=5,microbatch=1"         SIGSTOP itself there
    HYBRID_FAULT="nan:rank=1,iterations=7"                                 NaN gradient (7 or 7,10-12)
    HYBRID_FAULT="slow:rank=2,ms=50"                                       sleep per micro-batch forward
    HYBRID_FAULT="signal:rank=1,iteration=3,signal=SIGKILL"                 signal itself as iteration 3 starts
                                                                           (SIGKILL: a crashed rank, SIGSTOP: a
                                                                           stalled one)
    HYBRID_FAULT="crash:point=after_data"                                  raise inside a checkpoint save (see
                                                                           hybrid/checkpoint/faults.py)
    HYBRID_FAULT="signal:rank=1,iteration=3,signal=SIGKILL,op=tp.all_reduce,microbatch=1"
                                                                           signal itself before that op instead
                                                                           (mid-step, mid-accumulation)
    HYBRID_FAULT="crash:point=after_rank_files,rank=1,iteration=4,signal=SIGKILL"
                                                                           signal itself there instead (a real
                                                                           kill), in the save of iteration 4 only
    HYBRID_FAULT="signal:rank=1,iteration=3,signal=SIGKILL,restart=0"       only in torchrun's first attempt
                                                                           (TORCHELASTIC_RESTART_COUNT 0), so the
                                                                           restarted job runs on
    HYBRID_FAULT="slow:rank=0,ms=300,restart=0"                            slow in the first attempt only: the
                                                                           restarted job runs at full speed

Several faults are separated by ";". Iterations are 1-based (as logged), micro-batches 0-based. `op` is
"GROUP.OP" with OP a collective (all_reduce, all_gather, reduce_scatter, broadcast) or send / recv
(a point-to-point batch that contains one), or shm_take: ZeRO 1-2's shared-memory gather copying the peer's
shard (hybrid/zero/shm.py; "hang:...,op=dp.shm_take" makes the reader slow, not counted on the trail).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import torch
import torch.nn as nn

ENV = "HYBRID_FAULT"
KINDS = ("hang", "stop", "nan", "slow", "signal", "crash")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    op: str = ""  # hang/stop, and signal when given: "dp.all_reduce", "pp.send"
    iteration: int = 0  # hang/stop; crash: only in the save of this iteration (0: every save)
    microbatch: int = 0  # hang/stop
    iterations: frozenset[int] = frozenset()  # nan
    ms: float = 0.0  # slow
    seconds: float = 3600.0  # hang: how long to sleep
    signal: str = ""  # signal: SIGKILL, SIGSTOP, SIGTERM, ...; crash: send it instead of raising ("": raise)
    point: str = ""  # crash: the checkpoint save's crash point (hybrid/checkpoint/faults.py); rank -1: every rank
    restart: int = -1  # signal/crash/slow: only in this torchrun attempt (TORCHELASTIC_RESTART_COUNT); -1: every attempt

    def in_this_attempt(self) -> bool:
        return self.restart in (-1, attempt())


def _iterations(text: str) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


def _is_signal(name: str) -> bool:
    return isinstance(getattr(signal, name, None), signal.Signals)


def parse(text: str) -> list[Fault]:
    faults = []
    for item in filter(None, (t.strip() for t in text.split(";"))):
        kind, _, rest = item.partition(":")
        if kind not in KINDS:
            raise ValueError(f"{ENV}: unknown fault {kind!r}; use one of {', '.join(KINDS)}")
        kw: dict = {}
        # "iterations=7,10-12" holds commas: split on "," only before a key=
        fields, key = {}, None
        for tok in rest.split(","):
            if "=" in tok:
                key, _, val = tok.partition("=")
                fields[key] = val
            elif key is not None:
                fields[key] += "," + tok
        for k, v in fields.items():
            if k == "iterations":
                kw[k] = _iterations(v)
            elif k in ("rank", "iteration", "microbatch", "restart"):
                kw[k] = int(v)
            elif k in ("ms", "seconds"):
                kw[k] = float(v)
            else:
                kw[k] = v
        if kind == "crash":
            kw.setdefault("rank", -1)
        if kind == "signal" and not _is_signal(kw.get("signal", "")):
            raise ValueError(f"{ENV}: signal fault needs signal=SIGKILL|SIGSTOP|SIGTERM|..., got {item!r}")
        if kind == "crash" and "signal" in kw and not _is_signal(kw["signal"]):
            raise ValueError(f"{ENV}: crash fault's signal= must name a signal (SIGKILL, SIGTERM, ...), got {item!r}")
        faults.append(Fault(kind=kind, **kw))
    return faults


def faults_for(rank: int) -> list[Fault]:
    """The faults this rank must inject (none when HYBRID_FAULT is unset)."""
    return [f for f in parse(os.environ.get(ENV, "")) if f.rank == rank]


def attempt() -> int:
    """torchrun's restart count for this worker (0 in the first attempt and without torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


class Injector:
    """Installs this rank's faults: op hooks on the trail, a forward delay, NaN gradient hooks."""

    def __init__(self, faults: list[Fault]):
        self.faults = faults
        self._handles: list = []

    def __bool__(self) -> bool:
        return bool(self.faults)

    def on_op_start(self, rec, sends: tuple[int, ...]) -> None:
        for f in self.faults:
            at_op = f.kind in ("hang", "stop") or (f.kind == "signal" and f.op and f.in_this_attempt())
            if not at_op or (rec.iteration, rec.microbatch) != (f.iteration, f.microbatch):
                continue
            group, _, op = f.op.partition(".")
            hit = rec.group == group and (rec.op == op or (op == "send" and rec.op == "p2p" and sends)
                                          or (op == "recv" and rec.op == "p2p" and not sends))
            if hit:
                print(f"inject: rank {f.rank} {f.kind} before {f.op} at iteration {f.iteration} "
                      f"micro-batch {f.microbatch}", flush=True)
                if f.kind == "stop":
                    os.kill(os.getpid(), signal.SIGSTOP)
                elif f.kind == "signal":
                    os.kill(os.getpid(), getattr(signal, f.signal))
                else:
                    time.sleep(f.seconds)

    def on_forward(self) -> None:
        for f in self.faults:
            if f.kind == "slow" and f.in_this_attempt():
                time.sleep(f.ms / 1e3)

    def begin_iteration(self, iteration: int, model: nn.Module) -> None:
        """signal: the rank signals itself now. nan: this iteration's backward writes NaN into the first trainable parameter's gradient
        (before gradient accumulation and the DP reduction, as a bad kernel would)."""
        for f in self.faults:
            if f.kind == "signal" and not f.op and f.iteration == iteration and f.in_this_attempt():
                print(f"inject: {f.signal} to rank {f.rank} at iteration {iteration}, t={time.time():.3f}", flush=True)
                os.kill(os.getpid(), getattr(signal, f.signal))
        for h in self._handles:
            h.remove()
        self._handles = []
        if any(f.kind == "nan" and iteration in f.iterations for f in self.faults):
            p = next(p for p in model.parameters() if p.requires_grad)
            self._handles.append(p.register_hook(lambda g: torch.full_like(g, float("nan"))))
