"""HYBRID_FAULT, the project's one test-only fault hook: its grammar (`parse`) and the crash points inside
writes (`crash_point`). Unset (the default), nothing is injected and nothing runs. Standard library only, and
importing nothing of hybrid, so every writer can reach it (hybrid.cliutil, hybrid.data, hybrid.pipeline, ...)
without an import cycle; hybrid/fault/inject.py installs the training-time faults (hang, stop, nan, slow,
signal) from the same parse.

    HYBRID_FAULT="hang:rank=2,op=dp.all_reduce,iteration=5,microbatch=1"   sleep before that op
    HYBRID_FAULT="stop:rank=2,op=pp.send,iteration=5,microbatch=1"         SIGSTOP itself there
    HYBRID_FAULT="nan:rank=1,iterations=7"                                 NaN gradient (7 or 7,10-12)
    HYBRID_FAULT="slow:rank=2,ms=50"                                       sleep per micro-batch forward
    HYBRID_FAULT="signal:rank=1,iteration=3,signal=SIGKILL"                 signal itself as iteration 3 starts
                                                                           (SIGKILL: a crashed rank, SIGSTOP: a
                                                                           stalled one)
    HYBRID_FAULT="crash:point=after_data"                                  raise inside a checkpoint save (see
                                                                           hybrid/checkpoint/faults.py) or
                                                                           another write (POINTS below)
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
    point: str = ""  # crash: the crash point's name (POINTS); rank -1: every rank
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
            if kw.get("point") not in POINTS:
                raise ValueError(f"{ENV}: crash fault's point= must be one of {', '.join(POINTS)}, got {item!r}")
        if kind == "signal" and not _is_signal(kw.get("signal", "")):
            raise ValueError(f"{ENV}: signal fault needs signal=SIGKILL|SIGSTOP|SIGTERM|..., got {item!r}")
        if kind == "crash" and "signal" in kw and not _is_signal(kw["signal"]):
            raise ValueError(f"{ENV}: crash fault's signal= must name a signal (SIGKILL, SIGTERM, ...), got {item!r}")
        faults.append(Fault(kind=kind, **kw))
    return faults


def attempt() -> int:
    """torchrun's restart count for this worker (0 in the first attempt and without torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


# every crash point, in the order its writer passes them: a checkpoint save's (hybrid/checkpoint/faults.py), then
# the other writers' -- each between writing the new bytes under a temporary name and making them the output
POINTS = ("after_rank_files", "after_data", "before_rename", "before_latest",
          "output_written",      # cliutil.atomic_output: the temporary whole, not yet renamed onto the output
          "dataset_written",     # indexed dataset: .bin and .idx whole under temporary names, neither renamed
          "dataset_bin_renamed", # indexed dataset: an older PREFIX.idx removed, PREFIX.bin renamed into place,
                                 # PREFIX.idx not yet
          "tokenizer_staged",    # train_tokenizer: its three files whole under temporary names, none renamed
          "tokenizer_first_renamed",  # train_tokenizer: the first of its three files renamed, the others not
          "export_written",      # convert: the staged DST directory whole, not yet renamed onto DST
          "index_cache_written")  # data index cache: its .npy files renamed, their description not yet


class SimulatedCrash(RuntimeError):
    """Raised at the crash point a HYBRID_FAULT `crash` fault names (without signal=)."""


def crash_point(name: str, iteration: int = 0) -> None:
    """Crash here if HYBRID_FAULT holds a `crash` fault naming this point for this rank (RANK, default 0) and, for
    a checkpoint save, this `iteration` (a fault's iteration 0: every one). signal=SIGKILL: a real kill, nothing
    unwinds, no handler runs; no signal: SimulatedCrash, which a test catches in-process."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    rank = int(os.environ.get("RANK", "0"))
    for f in parse(spec):
        if f.kind != "crash" or f.point != name or f.rank not in (-1, rank) or f.iteration not in (0, iteration):
            continue
        if not f.in_this_attempt():  # restart=K: only in torchrun's attempt K
            continue
        if f.signal:
            where = f" of the save of iteration {iteration}" if iteration else ""
            print(f"inject: {f.signal} to rank {rank} at crash point {name}{where}, t={time.time():.3f}", flush=True)
            # delivered before kill() returns (POSIX, for a signal to oneself): SIGKILL ends the process here;
            # a signal with a handler that returns falls through to the raise
            os.kill(os.getpid(), getattr(signal, f.signal))
        raise SimulatedCrash(f"{ENV}: crash:point={name}: simulated crash during a write")
