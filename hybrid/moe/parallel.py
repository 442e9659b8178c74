"""Expert parallelism as rank arithmetic: Megatron's parallel folding, pure data (no processes).

Dense layers split each pipeline stage's S = tp x dp ranks (x cp once the context-parallel axis lands) as
TP x DP. The expert layers of the same stage fold the *same* S ranks differently, as

    expert-TP x EP x expert-DP,      S = etp x ep x edp,      order "etp-ep-edp" (etp innermost)

so a stage-local rank s = rank - pp_rank S has etp_rank = s % etp, ep_rank = (s // etp) % ep,
edp_rank = s // (etp ep). The EP group is `ep` consecutive ranks: with ep <= GPUs per node the all-to-all
stays inside a node (NVLink), like TP. EP rank r holds experts [r E/ep, (r+1) E/ep); the expert-DP group holds
the same experts and sums their gradients (ZeRO shards them over it). Expert-TP is 1 here (each expert whole on
its rank); Megatron's etp > 1 splits each expert's width and is not implemented (rejected by name).

Why the gradients come out right: every rank of the stage routes its own tokens (under sequence parallelism
the TP ranks of one data-parallel replica hold different T/t slices). An expert's gradient on one rank sums
over the tokens its EP group sent it; the expert-DP sum adds the other EP groups, so the total covers all S
ranks' tokens -- every replica's whole micro-batch once. Dividing by dp (not edp) then gives the mean over the
global batch, as for the dense parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hybrid.mesh import Mesh, ParallelDims


class ExpertAxis(Enum):
    ETP = "etp"
    EP = "ep"
    EDP = "edp"


@dataclass(frozen=True)
class ExpertCoords:
    etp: int
    ep: int
    edp: int
    pp: int


@dataclass(frozen=True)
class ExpertLayout:
    """How the expert layers fold a stage's ranks (see the module docstring).

    Attributes:
        dims: the dense layout (its world and pipeline size give the stage size S).
        ep: expert-parallel size (`--expert-model-parallel-size`).
        etp: expert-tensor-parallel size (`--expert-tensor-parallel-size`); 1.
    """

    dims: ParallelDims
    ep: int = 1
    etp: int = 1

    def __post_init__(self) -> None:
        for flag, v in (("--expert-model-parallel-size", self.ep), ("--expert-tensor-parallel-size", self.etp)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{flag} must be a positive integer, got {v!r}")
        if self.etp != 1:
            raise ValueError(f"--expert-tensor-parallel-size {self.etp}: only 1 is implemented (each expert whole "
                             f"on its rank; Megatron's recommended folding); use EP and expert-DP instead")
        if self.stage_size % (self.ep * self.etp):
            raise ValueError(f"--expert-model-parallel-size {self.ep} x --expert-tensor-parallel-size {self.etp} "
                             f"must divide the {self.stage_size} ranks of a pipeline stage (tp x dp)")

    @property
    def stage_size(self) -> int:
        """Ranks of one pipeline stage: world / pp."""
        return self.dims.world // self.dims.pp

    @property
    def edp(self) -> int:
        return self.stage_size // (self.ep * self.etp)

    def check_experts(self, num_experts: int) -> None:
        if num_experts % self.ep:
            raise ValueError(f"--expert-model-parallel-size {self.ep} does not divide the model's {num_experts} "
                             f"experts; use a divisor of {num_experts}")

    def coords(self, rank: int) -> ExpertCoords:
        if not 0 <= rank < self.dims.world:
            raise ValueError(f"rank {rank} outside world of size {self.dims.world}")
        pp, s = divmod(rank, self.stage_size)
        return ExpertCoords(etp=s % self.etp, ep=(s // self.etp) % self.ep, edp=s // (self.etp * self.ep), pp=pp)

    def group_ranks(self, axis: ExpertAxis) -> list[list[int]]:
        """Every group along `axis`: ranks of one stage that differ only in that coordinate, in its order."""
        groups: dict[tuple, list[int]] = {}
        for r in range(self.dims.world):
            c = self.coords(r)
            key = {ExpertAxis.ETP: (c.pp, c.ep, c.edp), ExpertAxis.EP: (c.pp, c.etp, c.edp),
                   ExpertAxis.EDP: (c.pp, c.etp, c.ep)}[axis]
            groups.setdefault(key, []).append(r)
        return [groups[k] for k in sorted(groups)]

    def experts_of(self, ep_rank: int, num_experts: int) -> range:
        """The global ids of the experts EP rank `ep_rank` holds."""
        per = num_experts // self.ep
        return range(ep_rank * per, (ep_rank + 1) * per)

    def placement(self, num_experts: int) -> list[tuple[int, range]]:
        """(rank, its experts) for every rank: what `hybrid layout` prints."""
        return [(r, self.experts_of(self.coords(r).ep, num_experts)) for r in range(self.dims.world)]

    def describe(self, num_experts: int) -> list[str]:
        """`hybrid layout`'s lines for the expert layers: the folding, the groups, which ranks hold which experts."""
        self.check_experts(num_experts)
        lines = [f"expert layers: each stage's {self.stage_size} ranks = expert-tp {self.etp} x ep {self.ep} x "
                 f"expert-dp {self.edp} (order etp-ep-edp); {num_experts} experts, {num_experts // self.ep} per rank",
                 f"ep groups (token all-to-all): {self.group_ranks(ExpertAxis.EP)}",
                 f"expert-dp groups (expert gradients, ZeRO): {self.group_ranks(ExpertAxis.EDP)}"]
        for rank, experts in self.placement(num_experts):
            lines.append(f"  rank {rank}: experts {experts.start}-{experts.stop - 1}")
        return lines

    def groups(self) -> dict[str, list[list[int]]]:
        """The ep and edp groups, as Mesh.build's `expert_groups`."""
        return {axis.value: self.group_ranks(axis) for axis in (ExpertAxis.EP, ExpertAxis.EDP)}


def build_mesh(dims: ParallelDims, expert_parallel: int = 1, **kw) -> Mesh:
    """Mesh.build with the expert layers' groups (every rank of the world calls it)."""
    return Mesh.build(dims, expert_groups=ExpertLayout(dims, expert_parallel).groups(), **kw)
