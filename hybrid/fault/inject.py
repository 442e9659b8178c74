"""Test-only fault injection at training time: installs the hang, stop, nan, slow and signal faults of
HYBRID_FAULT -- the project's one test-only fault hook, whose grammar and crash points live in hybrid/fault_hook.py
(standard library only, so every writer can reach them). Unset (the default), nothing is installed and training
runs untouched.
"""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.nn as nn

from hybrid.fault_hook import ENV, KINDS, Fault, attempt, parse  # noqa: F401  (re-exported: tests and callers)


def faults_for(rank: int) -> list[Fault]:
    """The faults this rank must inject (none when HYBRID_FAULT is unset)."""
    return [f for f in parse(os.environ.get(ENV, "")) if f.rank == rank]


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
