"""DiLoCo's state in a checkpoint (hybrid/stateful.py's sharded state dicts).

* The outer state -- theta (the last synced weights) and the outer momentum b -- is one tensor per parameter, equal
  on every replica: described with the inner optimizer's own geometry (hybrid/zero/state.py: each master segment's
  pieces of the global tensor) and written by replica 0 only, under "diloco.anchor/<name>" and
  "diloco.momentum/<name>". It loads at any TP / PP layout (and ZeRO stage) the weights load at.
* The inner state differs per replica between syncs (weights, Adam's moments). Replica 0's is the run's ordinary
  optimizer state (model/..., optim....: what `hybrid checkpoint inspect` and `convert` read); replica r > 0 keeps
  the same keys under "diloco.replica<r>/" (`ReplicaState`). A checkpoint therefore resumes at the same number of
  replicas; plain values (Adam's step, the loss scaler) are replica 0's, equal on every replica (fp16's dynamic
  scale, which would differ, is refused with DiLoCo).
* Mid-overlap (`--diloco-fragment-sync-delay` tau > 0, a fragment's all-reduce posted and its result not yet
  applied): the save first waits for the all-reduce (the communication completes early; its outer step is still
  applied tau steps after the post, as without a checkpoint) and stores the averaged delta under
  "diloco.pending/<name>" (0 outside the fragment in flight; equal on every replica, written by replica 0) and the
  fragment's index as the plain value "diloco.inflight" (-1: none). Both only when tau > 0.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from hybrid.stateful import Shards
from hybrid.zero.state import _one_per_box, optimizer_chunks, param_names

KINDS = ("anchor", "momentum", "pending")


def _index(zero) -> dict[tuple[int, int], int]:
    """(unit, segment) -> the segment's index in DiLoCo.views."""
    out, i = {}, 0
    for ui, u in enumerate(zero.units):
        for si in range(len(u.views)):
            out[(ui, si)] = i
            i += 1
    return out


def _tensor(d, kind: str, i: int) -> torch.Tensor:
    return d.anchors[i] if kind == "anchor" else d.momentum(i) if kind == "momentum" else d.pending[i]


def _kinds(cfg) -> tuple[str, ...]:
    """The outer state's tensors: theta always, b when mu > 0, the delta in flight when tau > 0."""
    return tuple(k for k, on in zip(KINDS, (True, cfg.outer_momentum > 0, cfg.fragment_sync_delay > 0)) if on)


def state_dict(d) -> dict[str, object]:
    if d.warm_start:  # loading a checkpoint without DiLoCo state: nothing of ours in it (load_state_dict sets theta)
        return {}
    d.zero.wait_params()
    d.complete()  # mid-overlap: the all-reduce in flight waited for, its average in d.pending (applied at its step)
    index = _index(d.zero)
    kept, _ = _one_per_box(optimizer_chunks(d.zero, param_names(d.zero.model)))
    by_name = defaultdict(list)
    for c in kept:
        by_name[c.name].append(c)
    kinds = _kinds(d.cfg)
    out: dict[str, object] = {"inflight": d.inflight.f if d.inflight else -1} if "pending" in kinds else {}
    for kind in kinds:
        for name, cs in by_name.items():
            views = [_tensor(d, kind, index[(c.unit, c.seg)])[c.lo:c.hi].view(c.sizes) for c in cs]
            out[f"{kind}/{name}"] = Shards(cs[0].global_shape, views, [(c.offsets, c.sizes) for c in cs],
                                           write=cs[0].owner and d.replica == 0)
    return out


@torch.no_grad()
def load_state_dict(d, sd: dict[str, object]) -> None:
    """The pieces were filled in place; a tied weight's second copy on this rank takes the values loaded. A warm
    start (a checkpoint without DiLoCo state): theta = the weights just loaded, momentum 0."""
    if d.warm_start:
        d.warm_start = False
        d.zero.wait_params()
        for a, v in zip(d.anchors, d.views):
            a.copy_(v)
        for i in range(len(d.views)):
            if (b := d.momentum(i)) is not None:
                b.zero_()
        return
    index = _index(d.zero)
    kinds = _kinds(d.cfg)
    for twin, kept in _one_per_box(optimizer_chunks(d.zero, param_names(d.zero.model)))[1]:
        for kind in kinds:
            src = _tensor(d, kind, index[(kept.unit, kept.seg)])[kept.lo:kept.hi]
            _tensor(d, kind, index[(twin.unit, twin.seg)])[twin.lo:twin.hi].copy_(src)
    if sd.get("inflight", -1) >= 0:
        d.landed(sd["inflight"])


class ReplicaState:
    """Replica r > 0's inner optimizer as the checkpoint sees it: the ZeroOptimizer's sharded state under
    "diloco.replica<r>/" (plain values keep their names: they equal replica 0's). Everything else is the
    optimizer's own."""

    def __init__(self, zero, replica: int):
        self.zero, self.prefix = zero, f"diloco.replica{replica}/"
        self.warm_start = False  # the next load reads replica 0's keys (a checkpoint saved without DiLoCo)

    def state_dict(self, optimizer: bool = True, names: dict[int, str] | None = None) -> dict[str, object]:
        sd = self.zero.state_dict(optimizer=optimizer, names=names)
        prefix = "" if self.warm_start else self.prefix
        return {(prefix + k if isinstance(v, Shards) else k): v for k, v in sd.items()}

    def load_state_dict(self, sd: dict[str, object]) -> None:
        self.zero.load_state_dict({k.removeprefix(self.prefix): v for k, v in sd.items()})
        self.warm_start = False

    def __getattr__(self, name: str):
        return getattr(self.zero, name)
