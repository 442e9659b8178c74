"""A simulated slow data-parallel link, for tests and demos (`--simulated-dp-bandwidth GBPS`, off by default).

After each step's gradient traffic the rank sleeps bytes / bandwidth, where bytes are the DP group's gradient
collectives that step as the ledger counts them (nccl-tests' size S: hybrid/comm.py) -- so a method that sends
fewer bytes waits less, exactly in proportion. It models bandwidth only (no latency, no overlap with compute)."""

from __future__ import annotations

import time

from hybrid.comm import CommLedger

GRADIENT_TAGS = ("powersgd.", "onebit.")  # the compressors' collectives, filed as "<group>:<tag>"


def dp_gradient_bytes(ledger: CommLedger, group: str) -> int:
    """Bytes of the gradient collectives on DP group `group` so far: its untagged calls (the engine's all-reduce,
    reduce-scatter, parameter all-gather) and the compressors' tagged ones (not metrics, clipping or overflow)."""
    total = 0
    for (_, g), e in ledger.entries.items():
        name, _, tag = g.partition(":")
        if name == group and (not tag or tag.startswith(GRADIENT_TAGS)):
            total += e.bytes
    return total


class SimulatedLink:
    """Sleeps each step for the DP gradient bytes sent since the last call, at `gbps` GB/s (1e9 bytes/s)."""

    def __init__(self, gbps: float, ledger: CommLedger, group: str) -> None:
        self.gbps, self.ledger, self.group = gbps, ledger, group
        self.seen = dp_gradient_bytes(ledger, group)
        self.slept = 0.0  # seconds asked for, in all: the bytes / the bandwidth
        self.waited = 0.0  # seconds the sleeps took on the clock (>= slept: a sleep is never shorter)
        self.steps = 0  # delay() calls: one a step

    def delay(self) -> float:
        """Sleep for the bytes since the last call; returns the seconds slept. A ledger reset (tests) restarts the
        count."""
        now = dp_gradient_bytes(self.ledger, self.group)
        sent = now - self.seen if now >= self.seen else now
        self.seen = now
        seconds = sent / (self.gbps * 1e9)
        if seconds > 0:
            start = time.perf_counter()
            time.sleep(seconds)
            self.waited += time.perf_counter() - start
        self.slept += seconds
        self.steps += 1
        return seconds

    def line(self) -> str:
        """The run's end line: what the link cost, asked for (the ledger's bytes / bandwidth) and on the clock."""
        return (f"simulated DP link: {self.steps} steps waited {self.waited:.6f} s on the clock for {self.slept:.6f} s "
                f"asked (the DP gradient bytes / {self.gbps:g} GB/s)")
