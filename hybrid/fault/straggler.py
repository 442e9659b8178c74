"""Straggler report: per-rank step-time percentiles every log interval, and the rank (with the phase)
that is consistently slower than its peers.

Each rank keeps, per step, the seconds it spent in each phase of the op trail (hybrid/trail.py):
forward and backward compute, p2p wait, optimizer -- time blocked in a collective is counted apart
(comm), so a fast rank waiting for a slow peer does not look slow itself. Every log interval one SUM
over the world gathers the (ranks x steps x phases) table; rank 0 prints each rank's step-time
p50/p90/max and names rank r in phase f when

    mine = median_steps(t[r, f]),  ref = median_{peers}(median_steps(t[q, f])):
    mine > factor * ref   and   mine - ref > MIN_STEP_SHARE * median step time

The median over the interval's steps is what makes it "consistent" (slow in at least half the
steps); the second condition asks that the excess matter to the step (a synchronous step waits for
its slowest rank): on a busy CPU a 12 ms forward that takes 27 ms on one rank is scheduling noise,
not a straggler, when the step takes 260 ms (MIN_STEP_SHARE below). Peers are the ranks at the same pipeline stage: stages run different layers and schedules,
so only they should take equal time.
"""

from __future__ import annotations

import torch

from hybrid.fault.nan_guard import world_sum
from hybrid.mesh import Mesh

PHASES = ("forward", "backward", "p2p", "optimizer")  # named; "comm" and "other" only add to the step time
COLUMNS = PHASES + ("comm", "other")  # the table's phase columns (after the step total)
# the excess must cost at least this share of the median step time. 0.1 named a clean run's rank 3 (25 ms vs 9 ms
# backward in a 147 ms step, 11%) with 8 ranks' worth of load on 2 cores; a rank slowed 50 ms per micro-batch costs
# ~40% of its step here, and a straggler worth chasing on a cluster costs far more than a fifth of the step.
MIN_STEP_SHARE = 0.2


class StragglerReport:
    def __init__(self, mesh: Mesh, factor: float):
        self.mesh, self.factor = mesh, factor
        self.rows: list[list[float]] = []  # per step: [total, *COLUMNS]
        self.named = False  # the last report named a straggler (rank 0; the session prints it at once)

    def record(self, phase_seconds: dict[str, float]) -> None:
        self.rows.append([sum(phase_seconds.values())] + [phase_seconds.get(p, 0.0) for p in COLUMNS])

    def report(self, first: int, last: int) -> list[str]:
        """Collective. Lines about iterations first..last (rank 0's are non-empty); resets the table."""
        world, steps = self.mesh.dims.world, len(self.rows)
        table = torch.zeros(world, steps, 1 + len(COLUMNS), dtype=torch.float64)
        table[self.mesh.rank] = torch.tensor(self.rows, dtype=torch.float64)
        table = world_sum(self.mesh, table.to(self.mesh.device), "straggler").cpu()
        self.rows = []
        if self.mesh.rank != 0:
            return []
        verdict = slow_ranks(table, self.mesh, self.factor, first, last)
        self.named = not verdict[0].startswith("straggler: none")
        return [percentile_line(table, first, last), time_split_line(table, first, last)] + verdict


def _peers(n: int) -> str:
    """'its peer' / 'its 3 peers' (a rank at dp 2 has one peer in its stage)."""
    return "its peer" if n == 1 else f"its {n} peers"


def percentile_line(table: torch.Tensor, first: int, last: int) -> str:
    q = torch.quantile(table[:, :, 0], torch.tensor([0.5, 0.9, 1.0], dtype=table.dtype), dim=1) * 1e3  # (3, world)
    per = " ".join(f"r{r} {q[0, r]:.1f}/{q[1, r]:.1f}/{q[2, r]:.1f}" for r in range(table.shape[0]))
    return f"step time ms p50/p90/max, iterations {first}-{last}: {per}"


def time_split(table: torch.Tensor) -> dict[str, float]:
    """Where the step time goes, as shares of it: per rank the sum over the interval's steps of each phase /
    the sum of its step times, then the mean over ranks. compute = forward + backward (time blocked in a
    collective inside them excluded), collectives = blocked in TP / CP / DP / embedding collectives (CP's ring
    transfers too: hybrid.trail.blocked_phase), pipeline = blocked on pipeline messages (the bubble, and the
    transfers), optimizer, other (data, logging)."""
    col = {name: 1 + i for i, name in enumerate(COLUMNS)}
    total = table[:, :, 0].sum(dim=1).clamp_min(1e-12)
    share = {name: (table[:, :, col[name]].sum(dim=1) / total).mean().item() for name in COLUMNS}
    return {"compute": share["forward"] + share["backward"], "collectives": share["comm"],
            "pipeline": share["p2p"], "optimizer": share["optimizer"], "other": share["other"]}


def time_split_line(table: torch.Tensor, first: int, last: int) -> str:
    s = time_split(table)
    return (f"time split, iterations {first}-{last} (mean over ranks): compute {s['compute']:.1%}, collectives "
            f"{s['collectives']:.1%}, pipeline waits {s['pipeline']:.1%}, optimizer {s['optimizer']:.1%}, "
            f"other {s['other']:.1%}")


def slow_ranks(table: torch.Tensor, mesh: Mesh, factor: float, first: int, last: int) -> list[str]:
    med = table[:, :, 1:].median(dim=1).values  # (world, phases): each rank's median step
    floor = MIN_STEP_SHARE * table[:, :, 0].median().item()
    stage = [mesh.dims.coords(r).pp for r in range(table.shape[0])]
    named = []
    for r in range(table.shape[0]):
        peers = [q for q in range(table.shape[0]) if q != r and stage[q] == stage[r]]
        if not peers:
            continue
        for i, phase in enumerate(PHASES):
            ref = med[peers, i].median().item()
            mine = med[r, i].item()
            if mine > factor * ref and mine - ref > floor:
                named.append(f"straggler: rank {r} is slower than {_peers(len(peers))} in {phase}: "
                             f"{mine * 1e3:.1f} ms vs {ref * 1e3:.1f} ms per step (medians over iterations "
                             f"{first}-{last}, factor {factor:g})")
    return named or [f"straggler: none (iterations {first}-{last}, factor {factor:g})"]
