"""Which node each rank runs on, and whether every tensor-parallel group stays inside one.

The mesh's rank order puts TP innermost (rank = tp_rank + tp * (dp_rank + dp * pp_rank)), and
torchrun numbers ranks node by node (LOCAL_WORLD_SIZE consecutive ranks per agent), so TP stays
inside a node exactly when --tensor-model-parallel-size divides LOCAL_WORLD_SIZE. We check the
placement as it is -- each rank's node id (torchrun's GROUP_RANK, else the host name) gathered at
start-up -- rather than trust the arithmetic.
"""

from __future__ import annotations

import os
import socket

from hybrid.comm import Group
from hybrid.mesh import Axis, ParallelDims


def node_id() -> str:
    return os.environ.get("GROUP_RANK") or socket.gethostname()


def layout_line(dims: ParallelDims, nodes: list[str]) -> str:
    """One start-up line: nodes x ranks per node, and whether TP groups cross nodes."""
    order = list(dict.fromkeys(nodes))
    per = [nodes.count(n) for n in order]
    shape = f"{len(order)} x {per[0]}" if len(set(per)) == 1 else "+".join(map(str, per))
    local = os.environ.get("LOCAL_WORLD_SIZE")  # torchrun's; unset in one process without a launcher
    launcher = (f"LOCAL_WORLD_SIZE {local}" if local else "one process, no launcher" if dims.world == 1 else
                "LOCAL_WORLD_SIZE unset: not started by torchrun")
    spans = [g for g in dims.group_ranks(Axis.TP) if len({nodes[r] for r in g}) > 1]
    if not spans:
        return f"nodes: {shape} ranks ({launcher}); every tp group inside one node"
    return (f"nodes: {shape} ranks ({launcher}); warning: tp groups {spans[:4]} span nodes, so "
            f"tensor-parallel all-reduces cross the network; make --tensor-model-parallel-size divide the "
            f"ranks per node")


def describe(dims: ParallelDims, world: Group | None = None) -> str:
    """Collective over the `world` group (Mesh.world): gather every rank's node id, return `layout_line`."""
    if dims.world == 1 or world is None:
        return layout_line(dims, [node_id()] * dims.world)
    return layout_line(dims, world.all_gather_object(node_id()))
