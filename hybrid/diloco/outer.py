"""DiLoCo's outer step (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language Models",
Algorithm 1) over the master weights of a ZeroOptimizer, and Streaming DiLoCo's fragments (Douillard et al. 2025).

Each of R replicas trains alone for H inner steps with the run's optimizer (AdamW; its gradients reduced only inside
the replica: replicas.py), from the last synced weights theta. Then every replica r sends its outer gradient

    delta_r = theta - theta_r                                  (the last synced minus the current weights)
    delta   = 1/R sum_r delta_r                                (one all-reduce over the cross-replica group)

and all take one Nesterov SGD step on theta (torch.optim.SGD, nesterov=True, dampening 0; momentum mu, lr eta):

    b     <- mu b + delta
    theta <- theta - eta (delta + mu b)                        (mu = 0: theta - eta delta)
    theta_r <- theta                                           (every replica starts the next round there)

With H = 1, eta = 1, mu = 0 and SGD inside this is theta - 1/R sum_r lr g_r: synchronous data parallelism
(tests/test_diloco.py checks it). The inner optimizer's state (Adam's moments) stays with each replica across
rounds, as in the paper.

The weights are the ZeRO optimizer's fp32 master segments on this rank (its TP / PP share, and its ZeRO shard of
the replica): one view per parameter segment, `ZeroOptimizer.units[i].views`. Inner rank i of every replica holds
the same segments, so the all-reduce over the cross group averages like with like. Bytes on the ledger ("diloco"):
4 x the segments of the fragment synced -- with one fragment, the rank's whole share of the model every H steps.

Fragments (`--diloco-fragments K`, Streaming DiLoCo): the segments split into K contiguous runs (about equal
counts, in the optimizer's order); fragment f syncs after step t when (t + 1) mod H = ((f + 1) H / K) mod H, so each
fragment still syncs every H steps, the K syncs spread evenly over the round and each moves 1/K of the bytes. The
paper's overlap of the sync with the next inner steps (and its mixing factor alpha) is not done here: each sync
blocks.
"""

from __future__ import annotations

import torch

from hybrid.comm import Group
from hybrid.diloco.args import DiLoCoConfig


class DiLoCo:
    """The outer loop around a ZeroOptimizer (the inner one): `after_step(it)` after every inner step."""

    def __init__(self, cfg: DiLoCoConfig, zero, cross: Group, replica: int = 0):
        self.cfg, self.zero, self.cross, self.replica = cfg, zero, cross, replica
        zero.wait_params()
        self.views = [v for u in zero.units for v in u.views]  # theta_r: this rank's master segments (live)
        self.anchors = [v.detach().clone() for v in self.views]  # theta: the weights of the last sync
        n, k = len(self.views), cfg.fragments
        self.fragments = [list(range(f * n // k, (f + 1) * n // k)) for f in range(k)]
        self.outer = [self._outer_sgd([self.anchors[i] for i in idx]) for idx in self.fragments]
        self.warm_start = False  # the next checkpoint load has no DiLoCo state: theta from the weights (state.py)

    def _outer_sgd(self, params: list[torch.Tensor]) -> torch.optim.SGD | None:
        """Nesterov SGD over theta; the momentum buffers made now (zeros: b <- mu 0 + delta = delta exactly as
        torch's first step) so that the checkpoint has tensors to fill."""
        if not params:
            return None
        mu = self.cfg.outer_momentum
        opt = torch.optim.SGD(params, lr=self.cfg.outer_lr, momentum=mu, nesterov=mu > 0)
        if mu > 0:
            for p in params:
                opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
        return opt

    def due(self, it: int) -> list[int]:
        """The fragments that sync after step `it` (0-based)."""
        h, k = self.cfg.inner_steps, self.cfg.fragments
        return [f for f in range(k) if (it + 1) % h == ((f + 1) * h // k) % h]

    def after_step(self, it: int) -> None:
        """After inner step `it`: the outer step of every fragment due now."""
        due = self.due(it)
        if due:
            self.zero.wait_params()  # a post-step parameter gather may still write the master's buffer
            for f in due:
                self.sync(f)
            self.zero.sync_params_from_master()  # compute-dtype parameters (stages 1-2: gathered in the replica)

    @torch.no_grad()
    def sync(self, f: int) -> None:
        """Outer step of fragment f: average delta over the replicas (one all-reduce), Nesterov SGD on theta,
        theta into the replica's master weights."""
        idx = self.fragments[f]
        if not idx:
            return
        delta = torch.cat([(self.anchors[i] - self.views[i]).reshape(-1) for i in idx])
        wire = delta.to(self.zero.device)  # offloaded masters live on the host; NCCL reduces device memory
        self.cross.all_reduce(wire)
        delta.copy_(wire).div_(self.cross.size)
        for i, d in zip(idx, delta.split([self.views[i].numel() for i in idx])):
            self.anchors[i].grad = d.view_as(self.anchors[i])
        self.outer[f].step()
        for i in idx:
            self.anchors[i].grad = None
            self.views[i].copy_(self.anchors[i])

    def momentum(self, i: int) -> torch.Tensor | None:
        """The outer momentum buffer b of segment i (None when mu = 0)."""
        f = next(f for f, idx in enumerate(self.fragments) if i in idx)
        return self.outer[f].state[self.anchors[i]].get("momentum_buffer")

    def state_dict(self) -> dict[str, object]:
        from hybrid.diloco import state
        return state.state_dict(self)

    def load_state_dict(self, sd: dict[str, object]) -> None:
        from hybrid.diloco import state
        state.load_state_dict(self, sd)
