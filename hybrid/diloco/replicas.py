"""Which ranks form a DiLoCo replica and which ranks a replica's outer sync crosses.

The mesh's DP group of a (tp, cp, pp) coordinate holds dp ranks, in DP order. With R replicas (`--diloco-replicas`,
default dp: every DP rank its own replica) each replica takes z = dp / R consecutive DP ranks:

    DP ranks   d = 0 1 2 3 4 5 6 7        dp 8, R 2, z 4
    inner      [0 1 2 3] [4 5 6 7]        ZeRO shards and reduces gradients here, every inner step
    cross      [0 4] [1 5] [2 6] [3 7]    the outer step all-reduces the deltas here, every H steps

so inner rank i of every replica holds the same ZeRO shard, and the cross group of i all-reduces exactly that shard.
Consecutive DP ranks are the nearest ones (rank order tp-cp-dp-pp, hybrid/mesh.py): a replica's chatty ZeRO
traffic stays close, the rare outer sync crosses the slow link. Pure rank arithmetic here, no processes;
`ReplicaLayout.build` makes the process groups.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hybrid.comm import Group
from hybrid.mesh import Axis, Mesh, ParallelDims


def inner_cross_ranks(dims: ParallelDims, replicas: int) -> tuple[list[list[int]], list[list[int]]]:
    """(inner groups, cross groups) of global ranks over the whole world, as described above."""
    if replicas < 1 or dims.dp % replicas:
        raise ValueError(f"--diloco-replicas {replicas} must divide the data-parallel size {dims.dp}")
    z = dims.dp // replicas
    inner, cross = [], []
    for g in dims.group_ranks(Axis.DP):  # g[d] = the rank with DP coordinate d
        inner += [g[j * z:(j + 1) * z] for j in range(replicas)]
        cross += [g[i::z] for i in range(z)]
    return inner, cross


@dataclass
class ReplicaLayout:
    """This rank's replica: `inner_mesh` is the mesh the replica trains on (the DP group replaced by the replica's
    own, so ZeRO shards and reduces inside it), `cross` the counted group of the outer sync ("diloco" on the
    ledger), `replica` this rank's replica index."""

    inner_mesh: Mesh
    cross: Group
    replica: int
    replicas: int

    @classmethod
    def build(cls, mesh: Mesh, replicas: int | None = None, own_cross: bool = False) -> "ReplicaLayout":
        """Collective over the world when replicas < dp or own_cross (new process groups); replicas None: dp.
        own_cross (the overlapped sync, tau > 0): with replicas = dp the cross group is a process group of its own
        over the DP ranks rather than the DP group itself, so that what the run still sends on DP (the logged
        loss) does not queue behind an outer all-reduce in flight.

        Context parallelism (cp > 1): a replica is its DP ranks x every CP rank (TP x PP x CP x dp / R ranks);
        ZeRO shards and reduces gradients over the replica's DP x CP ranks ("dp_cp", as the run's mesh does over
        all of DP x CP), and the cross group of a rank is the ranks of its CP coordinate and inner DP index in the
        other replicas -- the same shard of the same parameters (inner_cross_ranks)."""
        dims = mesh.dims
        replicas = replicas or dims.dp
        if replicas == dims.dp:  # every DP rank its own replica: no group to create
            inner = Group.solo("dp", mesh.ledger)
            # with CP the replica is this rank's CP group: ZeRO reduces and shards over it (its process group reused)
            inner_cp = Group("dp_cp", mesh.cp.ranks, mesh.cp.pg, mesh.ledger) if dims.cp > 1 else inner
            if own_cross:
                cross = _mine("diloco", dims.group_ranks(Axis.DP), mesh)
            else:
                cross = Group("diloco", mesh.dp.ranks, mesh.dp.pg, mesh.ledger) if dims.dp > 1 else \
                    Group.solo("diloco", mesh.ledger)
        else:
            inner_ranks, cross_ranks = inner_cross_ranks(dims, replicas)
            inner = _mine("dp", inner_ranks, mesh)
            inner_cp = _mine("dp_cp", inner_dp_cp_ranks(dims, replicas), mesh) if dims.cp > 1 else inner
            cross = _mine("diloco", cross_ranks, mesh)
        inner_mesh = dataclasses.replace(mesh, dp=inner, dp_cp=inner_cp)
        if mesh.edp is not None:  # MoE: the experts' gradients reduced and ZeRO-sharded over the replica's share
            inner_mesh.edp = _mine("edp", inner_expert_dp_ranks(dims, replicas, mesh.ep.size,
                                                                mesh.etp.size if mesh.etp is not None else 1), mesh)
        return cls(inner_mesh, cross, replica=mesh.coords.dp // (dims.dp // replicas), replicas=replicas)


def inner_dp_cp_ranks(dims: ParallelDims, replicas: int) -> list[list[int]]:
    """With context parallelism: each replica's DP x CP ranks of one (tp, pp) coordinate, in rank order -- where
    ZeRO shards and reduces inside the replica. Replica j holds DP coordinates [j z, (j + 1) z), z = dp / R, at
    every CP coordinate. Its k-th rank and the k-th rank of every other replica have the same CP coordinate and
    inner DP index (rank order is a mixed-radix number: the order of (inner dp, cp) pairs does not depend on j),
    so they hold the same ZeRO shard, and inner_cross_ranks' cross groups pair exactly them."""
    z = dims.dp // replicas
    groups: dict[tuple[int, int, int], list[int]] = {}
    for r in range(dims.world):
        c = dims.coords(r)
        groups.setdefault((c.tp, c.pp, c.dp // z), []).append(r)
    return [groups[k] for k in sorted(groups)]


def inner_expert_dp_ranks(dims: ParallelDims, replicas: int, ep: int, etp: int) -> list[list[int]]:
    """MoE: each expert-DP group (hybrid/moe/parallel.py: the ranks of a stage holding the same experts, ordered by
    their stage index s = tp + cp-and-dp digits) cut into its ranks in each replica. A replica holds stage indices
    [j Q, (j + 1) Q), Q = tp x cp x dp / R, and with ep x etp dividing Q (args.check_layout) its expert-DP ranks are
    a run of w = Q / (ep etp) consecutive expert-DP indices; the k-th of them sits at stage index j Q + c, the k-th
    of replica j' at j' Q + c -- the dense cross group's pairing (same tp, cp and inner DP index) -- so experts and
    dense parameters share the cross group: the holders of the same experts' same shard."""
    from hybrid.moe.parallel import ExpertAxis, ExpertLayout
    z = dims.dp // replicas
    out = []
    for g in ExpertLayout(dims, ep, etp).group_ranks(ExpertAxis.EDP):
        parts: dict[int, list[int]] = {}
        for r in g:
            parts.setdefault(dims.coords(r).dp // z, []).append(r)
        out += [parts[j] for j in sorted(parts)]
    return out


def _mine(name: str, all_ranks: list[list[int]], mesh: Mesh) -> Group:
    """Every rank creates every group (new_group is collective over the world) and keeps its own."""
    mine = None
    for ranks in all_ranks:
        g = Group.create(name, ranks, mesh.ledger)
        if mesh.rank in ranks:
            mine = g
    return mine
