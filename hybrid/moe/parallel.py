"""Expert parallelism as rank arithmetic: Megatron's parallel folding, pure data (no processes).

Dense layers split each pipeline stage's S = tp x cp x dp ranks as TP x CP x DP (hybrid/mesh.py, order
"tp-cp-dp-pp"). The expert layers of the same stage fold the *same* S ranks differently, as

    expert-TP x EP x expert-DP,      S = etp x ep x edp,      order "etp-ep-edp" (etp innermost)

so a stage-local rank s = rank - pp_rank S has etp_rank = s % etp, ep_rank = (s // etp) % ep,
edp_rank = s // (etp ep). The EP group is `ep` consecutive ranks: with ep <= GPUs per node the all-to-all
stays inside a node (NVLink), like TP. EP rank r holds experts [r E/ep, (r+1) E/ep); the expert-DP group holds
the same expert shards and sums their gradients (ZeRO shards them over it).

Expert-TP (etp > 1, Megatron's --expert-tensor-parallel-size) splits each expert's width f like a TP MLP: expert-TP
rank j holds gate/up rows [j f/etp, (j+1) f/etp) (column-parallel) and the same columns of down (row-parallel).
After the EP all-to-all the etp ranks of a group gather each other's rows (all-gather-v), each computes its
partial down-projection on all of them, and a reduce-scatter-v sums the partials and hands every rank back its
own rows (hybrid/moe/layer.py; Megatron's alltoall dispatcher with tp_size > 1). So `etp` ranks share one
expert's compute, and the group's ranks are a block of etp consecutive ranks (innermost: the traffic of every
row that reaches an expert stays inside a node).

Context parallelism (cp > 1) is carved out exactly as Megatron's parallel_state does it: the expert rank generator
has no CP axis, so expert-DP = S / (etp ep) takes the CP ranks in (edp = tp cp dp / (etp ep)) and an EP group may
join ranks of one sequence (e.g. tp 1, cp 2, ep 2: each EP group is a CP pair). MoE layers are token-local, so a
CP rank routes its own T/cp tokens like any other rank of the stage.

Why the gradients come out right: every rank of the stage routes its own tokens (under sequence parallelism
the TP ranks of one data-parallel replica hold different T/t slices; under CP the CP ranks hold different T/cp
slices of the same sequences). An expert's gradient on one rank sums over the tokens its EP group sent it; the
expert-DP sum adds the other EP groups, so the total covers all S ranks' tokens -- every replica's whole
micro-batch once. Dividing by dp x cp (the ZeRO engine's dp_cp divisor, not edp) then gives the mean over the
global batch, as for the dense parameters: each CP rank's loss is cp x its share (hybrid/cp/loss.py; the
balancing losses likewise, hybrid/moe/layer.py), so the cp cancels -- Megatron's DDP scales the experts'
expert-DP sum by 1 / dp_cp too (distributed_data_parallel.py, expert_gradient_scaling_factor).

The routing counts of the balancing loss cover one micro-batch's tokens, which lie on the TP x CP ranks of its
replica (TP under sequence parallelism): they are all-reduced over that group -- `tp_cp`, built here when both
sizes exceed 1 (Megatron's tp_cp_group), else the CP or the TP group alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hybrid.cliutil import check_number, divisors, one_of, plural
from hybrid.mesh import Axis, Mesh, ParallelDims


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
        etp: expert-tensor-parallel size (`--expert-tensor-parallel-size`): ranks splitting each expert's width.
    """

    dims: ParallelDims
    ep: int = 1
    etp: int = 1

    def __post_init__(self) -> None:
        for flag, v in (("--expert-model-parallel-size", self.ep), ("--expert-tensor-parallel-size", self.etp)):
            check_number(flag, v, 1, integer=True)
        if self.stage_size % (self.ep * self.etp):
            fits = [n for n in divisors(self.stage_size) if self.stage_size % (n * self.etp) == 0]
            raise ValueError(f"--expert-model-parallel-size {self.ep} x --expert-tensor-parallel-size {self.etp} "
                             f"must divide the {plural(self.stage_size, 'rank')} of a pipeline stage (tp x cp x dp)"
                             + (f"; give --expert-model-parallel-size {one_of(fits)}" if fits else
                                "; give a smaller --expert-tensor-parallel-size"))

    @property
    def stage_size(self) -> int:
        """Ranks of one pipeline stage: world / pp."""
        return self.dims.world // self.dims.pp

    @property
    def edp(self) -> int:
        return self.stage_size // (self.ep * self.etp)

    def check_experts(self, num_experts: int, expert_ffn: int | None = None) -> None:
        if num_experts % self.ep:
            raise ValueError(f"--expert-model-parallel-size {self.ep} does not divide the model's {num_experts} "
                             f"experts; use a divisor of {num_experts}")
        if expert_ffn is not None and expert_ffn % self.etp:
            raise ValueError(f"--expert-tensor-parallel-size {self.etp} does not divide the experts' width "
                             f"{expert_ffn} (moe_ffn_hidden_size); use a divisor of {expert_ffn}")

    def expert_columns(self, etp_rank: int, expert_ffn: int) -> range:
        """The rows of gate/up (columns of down) of every local expert that expert-TP rank `etp_rank` holds."""
        per = expert_ffn // self.etp
        return range(etp_rank * per, (etp_rank + 1) * per)

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

    def describe(self, num_experts: int, expert_ffn: int | None = None) -> list[str]:
        """`hybrid layout`'s lines for the expert layers: the folding, the groups, which ranks hold which experts
        (and, with expert-TP, which slice of each expert's width: `expert_ffn` columns split etp ways)."""
        self.check_experts(num_experts, expert_ffn)
        lines = [f"expert layers: each stage's {self.stage_size} ranks = expert-tp {self.etp} x ep {self.ep} x "
                 f"expert-dp {self.edp} (order etp-ep-edp); {num_experts} experts, {num_experts // self.ep} per rank",
                 f"ep groups (token all-to-all): {self.group_ranks(ExpertAxis.EP)}"]
        if self.etp > 1:
            lines.append(f"expert-tp groups (token all-gather / reduce-scatter, each expert's width split): "
                         f"{self.group_ranks(ExpertAxis.ETP)}")
        lines.append(f"expert-dp groups (expert gradients, ZeRO): {self.group_ranks(ExpertAxis.EDP)}")
        if self.dims.cp > 1:  # the balancing loss's counts: one micro-batch's tokens lie on its replica's tp x cp ranks
            lines.append(f"tp x cp groups (a micro-batch's tokens: routing counts summed): "
                         f"{self.dims.group_ranks((Axis.TP, Axis.CP))}")
        for rank, experts in self.placement(num_experts):
            held = f"expert {experts.start}" if len(experts) == 1 else f"experts {experts.start}-{experts.stop - 1}"
            line = f"  rank {rank}: {held}"  # one each (--num-experts = ep): "expert 3", not "experts 3-3"
            if self.etp > 1:
                j = self.coords(rank).etp
                line += f", width shard {j + 1}/{self.etp}"
                if expert_ffn is not None:
                    cols = self.expert_columns(j, expert_ffn)
                    line += f" (ffn columns {cols.start}-{cols.stop - 1})"
            lines.append(line)
        return lines

    def groups(self) -> dict[str, list[list[int]]]:
        """The ep, etp and edp groups, as Mesh.build's `expert_groups`; with tp > 1 and cp > 1 also tp_cp, the ranks
        one micro-batch's tokens are spread over (the balancing loss's counts are summed there)."""
        out = {axis.value: self.group_ranks(axis) for axis in (ExpertAxis.EP, ExpertAxis.ETP, ExpertAxis.EDP)}
        if self.dims.tp > 1 and self.dims.cp > 1:
            out["tp_cp"] = self.dims.group_ranks((Axis.TP, Axis.CP))
        return out


def build_mesh(dims: ParallelDims, expert_parallel: int = 1, expert_tensor_parallel: int = 1, **kw) -> Mesh:
    """Mesh.build with the expert layers' groups (every rank of the world calls it)."""
    return Mesh.build(dims, expert_groups=ExpertLayout(dims, expert_parallel, expert_tensor_parallel).groups(), **kw)
