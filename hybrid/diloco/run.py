"""DiLoCo inside train.py's loop (hybrid/train/loop.py), four hooks:

    local = LocalUpdates.build(run.diloco, mesh)                      # replicas' groups (collective); off: no-op
    optimizer = ZeroOptimizer(model, local.mesh, run.zero, opt_cfg)   # ZeRO / gradient sync inside the replica
    ckpt = RunCheckpoints(..., local.checkpointed(optimizer), ..., owners={..., **local.owners()})
    ... train_step(...); local.after_step(it)                         # the outer step every H steps
"""

from __future__ import annotations

from dataclasses import dataclass

from hybrid.diloco.args import DiLoCoConfig
from hybrid.diloco.outer import DiLoCo
from hybrid.diloco.replicas import ReplicaLayout
from hybrid.diloco.state import ReplicaState
from hybrid.mesh import Mesh


@dataclass
class LocalUpdates:
    """The run's DiLoCo, or nothing (cfg None): `mesh` is what the inner optimizer trains on (the run's own mesh
    without DiLoCo)."""

    cfg: DiLoCoConfig | None
    mesh: Mesh
    layout: ReplicaLayout | None = None
    outer: DiLoCo | None = None

    @classmethod
    def build(cls, cfg: DiLoCoConfig | None, mesh: Mesh) -> "LocalUpdates":
        if cfg is None:
            return cls(None, mesh)
        layout = ReplicaLayout.build(mesh, cfg.replicas)
        return cls(cfg, layout.inner_mesh, layout)

    def checkpointed(self, zero):
        """Start the outer loop around `zero`; what the checkpoint should save as the optimizer (replica r > 0's
        inner state under its own keys: hybrid/diloco/state.py)."""
        if self.cfg is None:
            return zero
        self.outer = DiLoCo(self.cfg, zero, self.layout.cross, self.layout.replica)
        return zero if self.layout.replica == 0 else ReplicaState(zero, self.layout.replica)

    def owners(self) -> dict:
        """The outer state's owner for the checkpoint (theta and the outer momentum)."""
        return {"diloco.": self.outer} if self.outer is not None else {}

    def after_step(self, it: int) -> None:
        if self.outer is not None:
            self.outer.after_step(it)

    def describe(self) -> str:
        """The start-up line; empty when off."""
        if self.cfg is None:
            return ""
        c, lay = self.cfg, self.layout
        z = self.mesh.dp.size
        return (f"diloco: {lay.replicas} replicas{f' (ZeRO over {z} ranks each)' if z > 1 else ''} | H {c.inner_steps}"
                f" inner steps | outer Nesterov SGD lr {c.outer_lr} momentum {c.outer_momentum}"
                f"{f' | {c.fragments} fragments' if c.fragments > 1 else ''}")
