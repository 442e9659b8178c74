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
fragment still syncs every H steps, the K syncs spread evenly over the round and each moves 1/K of the bytes.

Overlap (Streaming DiLoCo's tau and alpha; torchft's `fragment_sync_delay` and `fragment_update_alpha`): fragment
f's all-reduce of delta is *posted* (async, on the counted cross group) after its step t and *waited* tau inner steps
later, after step t + tau; meanwhile the replica trains on. There the outer step runs on theta with the delta sent
at t, and the replica's weights -- tau steps further than those it sent -- are mixed with the new theta:

    theta_r <- lerp(theta, theta_r, alpha) = (1 - alpha) theta + alpha theta_r       (torch.lerp, torchft's merge)

tau = 0 and alpha = 0 (the defaults) are the blocking sync above, op for op. tau < H / K keeps one fragment in
flight at a time. The delta in flight lives in its own buffer (one fp32 copy of the rank's share, kept only when
tau > 0), which a checkpoint taken mid-flight stores after waiting for the all-reduce (state.py): the result is
applied at t + tau as without the checkpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from hybrid.comm import Group, Work
from hybrid.diloco.args import DiLoCoConfig


@dataclass
class InFlight:
    """Fragment f's outer all-reduce between its post and its apply: `work` (None once waited for), `wire` the
    buffer the backend reduces (the delta itself unless the masters are offloaded), `delta` the flat delta (the
    average once `reduced`)."""

    f: int
    work: Work | None
    wire: torch.Tensor
    delta: torch.Tensor
    reduced: bool = False
    link_s: float = 0.0  # the simulated slow link: the transfer's seconds, S / bandwidth
    ready: float = 0.0  # ... and the time.monotonic() at which it may complete (post + link_s)


class DiLoCo:
    """The outer loop around a ZeroOptimizer (the inner one): `after_step(it)` after every inner step."""

    def __init__(self, cfg: DiLoCoConfig, zero, cross: Group, replica: int = 0, link_gbps: float = 0.0):
        self.cfg, self.zero, self.cross, self.replica = cfg, zero, cross, replica
        # --simulated-dp-bandwidth on the cross-replica link: an all-reduce of S bytes completes no earlier than
        # S / (GBPS 1e9) seconds after its post; `exposed` sums the seconds the run waited for it, `hidden` the rest
        self.link_gbps, self.exposed, self.hidden = link_gbps, 0.0, 0.0
        zero.wait_params()
        self.views = [v for u in zero.units for v in u.views]  # theta_r: this rank's master segments (live)
        self.anchors = [v.detach().clone() for v in self.views]  # theta: the weights of the last sync
        n, k = len(self.views), cfg.fragments
        self.fragments = [list(range(f * n // k, (f + 1) * n // k)) for f in range(k)]
        self.outer = [self._outer_sgd([self.anchors[i] for i in idx]) for idx in self.fragments]
        self.warm_start = False  # the next checkpoint load has no DiLoCo state: theta from the weights (state.py)
        # tau > 0: each fragment's delta buffer (flat) and its per-segment views, what a checkpoint stores mid-flight
        self.flat = [torch.zeros(sum(self.views[i].numel() for i in idx), dtype=torch.float32,
                                 device=self.views[idx[0]].device) if idx and cfg.fragment_sync_delay else None
                     for idx in self.fragments]
        self.pending = [None] * n
        for f, idx in enumerate(self.fragments):
            if self.flat[f] is not None:
                for i, v in zip(idx, self.flat[f].split([self.views[i].numel() for i in idx])):
                    self.pending[i] = v.view_as(self.views[i])
        self.inflight: InFlight | None = None

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

    def due(self, it: int, delay: int = 0) -> list[int]:
        """The fragments posted after step `it` (0-based); delay tau: those applied after it (posted at it - tau)."""
        h, k = self.cfg.inner_steps, self.cfg.fragments
        return [f for f in range(k) if (it + 1 - delay) % h == ((f + 1) * h // k) % h]

    def after_step(self, it: int) -> None:
        """After inner step `it`: post the all-reduce of every fragment due now, then apply every fragment whose
        result is due (tau = 0: the same fragments, at once)."""
        posts = [f for f in self.due(it) if self.fragments[f]]
        landing = self.due(it, self.cfg.fragment_sync_delay)
        if not posts and (self.inflight is None or self.inflight.f not in landing):
            return
        # a post-step parameter gather may still write the master's buffer, and (shm_gather) the peer may not yet
        # have taken the shard the outer step overwrites: both waited for
        self.zero.before_param_writes()
        applied = False
        for f in posts:  # tau > 0: none lands at a post's step (tau < H / K), so one fragment is in flight at most
            self.post(f)
            if self.cfg.fragment_sync_delay == 0:
                self.apply(f)
                applied = True
        if self.inflight is not None and self.inflight.f in landing:  # (a first round's lands: nothing posted)
            self.apply(self.inflight.f)
            applied = True
        if applied:
            self.zero.sync_params_from_master()  # compute-dtype parameters (stages 1-2: gathered in the replica)

    @torch.no_grad()
    def post(self, f: int) -> None:
        """Fragment f's outer gradient delta = theta - theta_r (flat), its all-reduce posted (not waited)."""
        idx = self.fragments[f]
        parts = [(self.anchors[i] - self.views[i]).reshape(-1) for i in idx]
        delta = torch.cat(parts) if self.flat[f] is None else torch.cat(parts, out=self.flat[f])
        wire = delta.to(self.zero.device)  # offloaded masters live on the host; NCCL reduces device memory
        link_s = wire.numel() * wire.element_size() / (self.link_gbps * 1e9) \
            if self.link_gbps > 0 and self.cross.size > 1 else 0.0  # the ledger's S: the tensor's bytes
        self.inflight = InFlight(f, self.cross.all_reduce_async(wire), wire, delta, link_s=link_s,
                                 ready=time.monotonic() + link_s)

    def complete(self) -> None:
        """Wait for the all-reduce in flight (if any) and average it: delta = 1/R sum_r delta_r. Its outer step is
        still applied at its own step (`apply`)."""
        fl = self.inflight
        if fl is None or fl.reduced:
            return
        fl.work.wait()
        fl.work = None
        if fl.link_s:  # the simulated link: sleep what is left of the transfer (nothing once tau steps covered it)
            rest = min(fl.link_s, max(0.0, fl.ready - time.monotonic()))
            time.sleep(rest)
            self.exposed += rest
            self.hidden += fl.link_s - rest
        fl.delta.copy_(fl.wire).div_(self.cross.size)
        fl.reduced = True

    @torch.no_grad()
    def apply(self, f: int) -> None:
        """Outer step of fragment f with its averaged delta: Nesterov SGD on theta, then theta (alpha = 0) or
        lerp(theta, theta_r, alpha) into the replica's master weights."""
        self.complete()
        idx, delta, alpha = self.fragments[f], self.inflight.delta, self.cfg.fragment_update_alpha
        for i, d in zip(idx, delta.split([self.views[i].numel() for i in idx])):
            self.anchors[i].grad = d.view_as(self.anchors[i])
        self.outer[f].step()
        for i in idx:
            self.anchors[i].grad = None
            if alpha:
                self.views[i].copy_(torch.lerp(self.anchors[i], self.views[i], alpha))
            else:
                self.views[i].copy_(self.anchors[i])
        if self.flat[f] is not None:
            self.flat[f].zero_()  # the checkpoint's "pending": the in-flight fragment's average, 0 elsewhere
        self.inflight = None

    def landed(self, f: int) -> None:
        """Fragment f's averaged delta is in its buffer (a checkpoint loaded mid-flight): apply it at its step."""
        self.inflight = InFlight(f, None, self.flat[f], self.flat[f], reduced=True)

    def momentum(self, i: int) -> torch.Tensor | None:
        """The outer momentum buffer b of segment i (None when mu = 0)."""
        f = next(f for f, idx in enumerate(self.fragments) if i in idx)
        return self.outer[f].state[self.anchors[i]].get("momentum_buffer")

    def state_bytes(self) -> int:
        """Bytes of the outer state this rank holds (theta, the outer momentum, the in-flight delta buffers): one
        fp32 copy of its master segments each -- its share of the replica's parameters, 1/z of them under ZeRO
        inside a replica of z ranks (stage 3 included), never the whole model. `state_ledger` files them."""
        tensors = [*self.anchors, *(self.momentum(i) for i in range(len(self.views))), *self.flat]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def state_ledger(self):
        """The outer state on the memory ledger (hybrid/measured_memory.py): kind OUTER_STATE, placed where the
        master weights are (the host when the optimizer is offloaded)."""
        from hybrid.measured_memory import ModelStateLedger, StateKind
        where = "offload" if self.zero.cfg.offload_optimizer else "device"
        return ModelStateLedger(entries={(StateKind.OUTER_STATE, where): self.state_bytes()})

    def state_dict(self) -> dict[str, object]:
        from hybrid.diloco import state
        return state.state_dict(self)

    def load_state_dict(self, sd: dict[str, object]) -> None:
        from hybrid.diloco import state
        state.load_state_dict(self, sd)
