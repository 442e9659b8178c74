"""DiLoCo inside train.py's loop (hybrid/train/loop.py), four hooks:

    local = LocalUpdates.build(run.diloco, mesh)                      # replicas' groups (collective); off: no-op
    optimizer = ZeroOptimizer(model, local.mesh, run.zero, opt_cfg)   # ZeRO / gradient sync inside the replica
    ckpt = RunCheckpoints(..., local.checkpointed(optimizer), ..., owners={..., **local.owners()})
    ... train_step(...); local.after_step(it)                         # the outer step every H steps
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hybrid.checkpoint import store
from hybrid.checkpoint.args import CheckpointConfig
from hybrid.cliutil import fail
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

    def checkpointed(self, zero, ckpt: CheckpointConfig | None = None):
        """Start the outer loop around `zero`; what the checkpoint should save as the optimizer (replica r > 0's
        inner state under its own keys: hybrid/diloco/state.py). `ckpt`: the run's checkpoint flags -- a --load
        checkpoint saved without DiLoCo (a synchronous run, a pretrained model: the paper's start) gives every
        replica its weights and optimizer state, and theta its weights; one saved with another number of replicas
        is one error line."""
        if self.cfg is None:
            return zero
        self.outer = DiLoCo(self.cfg, zero, self.layout.cross, self.layout.replica)
        inner = zero if self.layout.replica == 0 else ReplicaState(zero, self.layout.replica)
        if _saved_replicas(ckpt) == 0:  # no DiLoCo state in it: load the synchronous keys, theta from them
            self.outer.warm_start = True
            if isinstance(inner, ReplicaState):
                inner.warm_start = True
        elif (saved := _saved_replicas(ckpt)) not in (None, self.layout.replicas):
            raise fail(f"train.py: error: --load {ckpt.load} holds DiLoCo state of {saved} replicas, this run has "
                       f"{self.layout.replicas}; resume with --diloco-replicas {saved} (and a DP size it divides)")
        return inner

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


def _saved_replicas(ckpt: CheckpointConfig | None) -> int | None:
    """The DiLoCo replicas of the checkpoint a resume will read (--ckpt-step's, else the newest): 0 when it was saved
    without DiLoCo, None when there is nothing to load (or it is unreadable: the resume reports that)."""
    if ckpt is None or ckpt.load is None:
        return None
    tries = [ckpt.ckpt_step] if ckpt.ckpt_step is not None else store.candidates(ckpt.load)
    if not tries or not os.path.isfile(os.path.join(store.final_path(ckpt.load, tries[0]), "state.json")):
        return None
    try:
        state = store.read_state(store.final_path(ckpt.load, tries[0]))
    except (OSError, ValueError, store.CorruptCheckpoint):
        return None
    args = state.get("args") or {}
    if args.get("diloco_inner_steps") is None:
        return 0
    return args.get("diloco_replicas") or state.get("layout", {}).get("dp")
