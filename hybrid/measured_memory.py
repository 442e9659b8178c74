"""Memory a training step holds, measured rather than estimated: activations saved for backward
(`SavedActivationLedger`) and model state -- parameters, gradients, optimizer states
(`model_state_bytes`, `ModelStateLedger`). Tests assert both exactly, as they assert the
communication ledger (hybrid/comm.py); the planner's formulas are checked against them.

Unit: bytes of *storages*. A tensor is a view into a storage; many saved tensors are views of one
storage (q, k, v of one projection output, a transposed weight), and what the device holds is the
storage. Each distinct storage -- (device, data_ptr, nbytes) -- is counted once, whole.

Saved activations of one Transformer layer (tp = 1, fp32, no dropout, CPU flash attention), per
token (b s tokens; h hidden, a query heads, g key/value heads, d head width, f MLP width), in
elements (x 4 bytes):

    GPT-2:  4h + 4 + 2ad + 2gd + a + 2f         (= 16h + 4 + a at f = 4h, ad = gd = h)
    Llama:  6h + 2 + 2ad + 2gd + a + 4f         plus 2 s d for RoPE cos/sin, shared by all layers

  GPT-2  ln_1: input h, mean 1, rstd 1 | q/k/v input (ln_1 output) h | attention: q ad, k gd, v gd,
         output ad (also the o_proj input), logsumexp a | ln_2: input h, mean 1, rstd 1 |
         c_fc input h | fused tanh-GELU input f | c_proj input (gelu output) f.
  Llama  RMSNorm x2: input h, rsqrt 1, normalised x h | q/k/v and gate/up inputs (norm outputs) h
         each | attention: rotated q ad, rotated k gd, v gd, output ad, logsumexp a |
         SwiGLU: gate output f (silu), silu output f, up output f, down input f.

Korthikanti et al. 2022 (Sec. 4.1) count sbh(34 + 5as/h) bytes per layer in fp16 with dropout:
16 sbh activations of 2 bytes, 2 sbh one-byte dropout masks, and 5as^2 b for the materialised
softmax (2 bytes), its dropout mask (1) and dropout output (2). Here the 16 sbh elements take 4
bytes (64 sbh), there are no masks, and flash attention keeps a row logsumexp (4asb bytes) instead
of the s x s matrix; GPT-2 adds the LayerNorm statistics (16 sb): 64 sbh + 16 sb + 4 asb bytes in
all (tests/test_memory.py reconciles the two). GPT-2's GELU runs as torch's fused kernel, which saves
only its input; transformers' Python gelu_new would keep three more f-wide intermediates (48 sbh).
Llama's SwiGLU saves 4f per token where a GELU MLP's inputs are 2f; its RMSNorms keep the
normalised x besides the input.

Other settings save other tensors, and the formula above does not cover them: CUDA attention
backends (their own auxiliaries), bf16 (RMSNorm saves fp32 upcasts), dropout (masks), tp > 1 or
sequence parallelism (shards). Measure those with the ledger.
"""

from __future__ import annotations

import enum
import threading
import weakref
from collections import defaultdict, deque
from collections.abc import Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn as nn

StorageKey = tuple[str, int, int]  # (device, data_ptr, nbytes) of an untyped storage


def storage_key(t: torch.Tensor) -> StorageKey:
    """Identity of the storage under `t`: two views of one storage share it. The storage's own
    nbytes, not the view's: a saved view keeps its whole storage alive. Meta tensors have no address
    (data_ptr 0): the storage object's own address stands in, so a model built on the meta device is
    measured without allocating it."""
    s = t.untyped_storage()
    return (str(s.device), s.data_ptr() or s._cdata, s.nbytes())


def _release_held(released: deque, entry: tuple, held: torch.Tensor) -> None:
    """A tracked tensor's finalizer: queue its release; `held` was kept alive until now (SavedActivationLedger._track)."""
    released.append(entry)


# --- activations saved for backward ------------------------------------------------------------

@dataclass
class TagUsage:
    """Saved bytes filed under one tag (e.g. one micro-batch)."""

    current: int = 0  # bytes of distinct storages this tag holds now
    peak: int = 0  # most `current` has been since the last reset_peak()


class _Saved:
    """What the autograd graph holds in place of a saved tensor. Its finalizer releases the count
    when the graph drops it: after the node's backward (retain_graph=False), or when the graph is
    freed without a backward."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


class SavedActivationLedger:
    """Bytes of the tensors autograd saves for backward while the ledger is entered.

        ledger = SavedActivationLedger(params=model.parameters())
        with ledger:
            with ledger.tagged(mb):            # the pipeline executor: one tag per micro-batch
                loss = model(ids, labels)
        ledger.peak_bytes, ledger.tag_current(mb)
        loss.backward()                        # mb's storages are released as its nodes run

    Design (exact, not sampled). `torch.autograd.graph.saved_tensors_hooks` calls `_pack` for each
    tensor a node saves; the graph keeps what `_pack` returns (a `_Saved` handle) until the node's
    backward has run with retain_graph=False, or until the graph is freed without a backward. A
    `weakref.finalize` on the handle therefore fires exactly when autograd lets the tensor go.
    Counting unpacks instead would be wrong twice: a retained graph unpacks many times, a dropped
    one never. The handle holds a *detached* view: holding the saved output of a node itself would
    make a cycle (output -> grad_fn -> handle -> output) that only the garbage collector frees.

    A finalizer only queues its release (a deque append: atomic, so safe on autograd's device
    threads and inside a garbage-collector pass that interrupts the ledger); the queue is applied
    before every count and every query, so the numbers read are exact.

    Storages are reference-counted: the first saver of a storage adds its bytes, the last release
    removes them, however many nodes (or views) save it. Per tag the same is done separately, so a
    storage saved under two tags counts once in `current_bytes` but once in each tag.

    Parameters are model state, not activations, and are skipped: an `nn.Parameter`, a view of one
    (`weight.t()` saved by mm), or any tensor whose storage is in `params` (e.g. flat buffers that
    parameters are views of).
    """

    def __init__(self, params: Iterable[torch.Tensor] = (), recomputation: bool = False):
        self.recomputation = recomputation  # also count what checkpointed regions re-save in backward
        self.tag: Hashable = None  # tag the next saved tensors are filed under (set by `tagged`)
        self._param_storages = {storage_key(p) for p in params}
        self._current = 0  # bytes of distinct saved storages alive now
        self._peak = 0  # most _current has been since the last reset_peak()
        self._tags: dict[Hashable, TagUsage] = {}
        self._refs: dict[StorageKey, int] = defaultdict(int)  # savers alive per storage
        self._tag_refs: dict[tuple[Hashable, StorageKey], int] = defaultdict(int)  # ... per (tag, storage)
        self._released: deque[tuple[StorageKey, Hashable]] = deque()  # queued by finalizers
        self._lock = threading.Lock()
        self._hooks: list[torch.autograd.graph.saved_tensors_hooks] = []  # one per (nested) entry

    # --- entering ----------------------------------------------------------------------------
    def __enter__(self) -> "SavedActivationLedger":
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()
        self._hooks.append(hooks)
        _ACTIVE_LEDGERS.append(self)
        if self.recomputation:
            _install_recomputation_hook()
            _RECOMPUTING_LEDGERS.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        # stops counting new saves; what was saved is still released as autograd frees it
        self._hooks.pop().__exit__(*exc)
        _ACTIVE_LEDGERS.remove(self)
        if self.recomputation:
            _RECOMPUTING_LEDGERS.remove(self)

    @contextmanager
    def tagged(self, tag: Hashable) -> Iterator[None]:
        """File the tensors saved inside the block under `tag`."""
        outer, self.tag = self.tag, tag
        try:
            yield
        finally:
            self.tag = outer

    # --- queries -----------------------------------------------------------------------------
    @property
    def current_bytes(self) -> int:
        """Bytes of the distinct storages saved for backward and not yet released."""
        with self._lock:
            self._apply_releases()
            return self._current

    @property
    def peak_bytes(self) -> int:
        """The most `current_bytes` has been since the ledger was made or `reset_peak()`."""
        with self._lock:
            self._apply_releases()
            return self._peak

    @property
    def tags(self) -> dict[Hashable, TagUsage]:
        """Usage per tag (a copy), for every tag that saved anything."""
        with self._lock:
            self._apply_releases()
            return {t: TagUsage(u.current, u.peak) for t, u in self._tags.items()}

    def tag_current(self, tag: Hashable) -> int:
        usage = self.tags.get(tag)
        return usage.current if usage else 0

    def tag_peak(self, tag: Hashable) -> int:
        usage = self.tags.get(tag)
        return usage.peak if usage else 0

    def reset_peak(self) -> None:
        """Start peaks afresh from what is held now."""
        with self._lock:
            self._apply_releases()
            self._peak = self._current
            for usage in self._tags.values():
                usage.peak = usage.current

    def summary(self) -> dict[str, object]:
        """{"current": b, "peak": b, "tags": {tag: {"current": b, "peak": b}}}, for logs and JSON."""
        with self._lock:
            self._apply_releases()
            return {"current": self._current, "peak": self._peak,
                    "tags": {str(t): {"current": u.current, "peak": u.peak} for t, u in self._tags.items()}}

    # --- hooks -------------------------------------------------------------------------------
    def _pack(self, t: torch.Tensor) -> _Saved | torch.Tensor:
        key, tag = storage_key(t), self.tag
        if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter) or key in self._param_storages:
            return t  # model state, not an activation
        handle = _Saved(t.detach())  # detached: see the class docstring (no reference cycle)
        with self._lock:
            self._apply_releases()  # releases that happened before this save, so the peak is exact
            self._acquire(key, tag)
        weakref.finalize(handle, self._released.append, (key, tag))
        return handle

    def track(self, t: torch.Tensor, owner: object, tag: Hashable = None) -> None:
        """Count `t` under `tag` as held until `owner` is garbage: e.g. an output gradient a zero-bubble B keeps
        for its W (hybrid/pipeline/split_backward.py), which autograd does not save and the hooks do not see."""
        outer, self.tag = self.tag, tag
        try:
            self._track(t, owner)
        finally:
            self.tag = outer

    def _track(self, t: torch.Tensor, owner: object) -> None:
        """Count `t` as saved until `owner` is garbage: a tensor a checkpointed region re-saved in backward,
        held by the checkpoint frame until the node that needs it unpacks it."""
        key, tag = storage_key(t), self.tag
        if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter) or key in self._param_storages:
            return
        with self._lock:
            self._apply_releases()
            self._acquire(key, tag)
        # The finalizer holds `t` until `owner` goes: the count is keyed by the storage's address, and a tensor
        # freed before its owner would let a later save land at the same address and count as a second saver of
        # a live key -- a whole tensor missing from the peak, depending on the heap's history (measured: 2 of 12
        # runs in one process, 16 KB at tiny-llama: tests/test_recompute.py's selective-op peak).
        # Held, what is counted is exactly what is alive, as the docstring promises.
        weakref.finalize(owner, _release_held, self._released, (key, tag), t)

    @staticmethod
    def _unpack(packed: _Saved | torch.Tensor) -> torch.Tensor:
        # autograd re-attaches the grad_fn of a saved output itself; a detached tensor is what it expects
        return packed.tensor if isinstance(packed, _Saved) else packed

    def _acquire(self, key: StorageKey, tag: Hashable) -> None:
        nbytes = key[2]
        self._refs[key] += 1
        if self._refs[key] == 1:  # first saver of this storage
            self._current += nbytes
            self._peak = max(self._peak, self._current)
        self._tag_refs[(tag, key)] += 1
        if self._tag_refs[(tag, key)] == 1:
            usage = self._tags.setdefault(tag, TagUsage())
            usage.current += nbytes
            usage.peak = max(usage.peak, usage.current)

    def _apply_releases(self) -> None:
        """Apply the queued releases (caller holds the lock)."""
        while self._released:
            key, tag = self._released.popleft()
            nbytes = key[2]
            self._refs[key] -= 1
            if self._refs[key] == 0:  # last saver gone: the graph no longer holds the storage
                del self._refs[key]
                self._current -= nbytes
            self._tag_refs[(tag, key)] -= 1
            if self._tag_refs[(tag, key)] == 0:
                del self._tag_refs[(tag, key)]
                self._tags[tag].current -= nbytes


# --- recomputation (activation checkpointing) --------------------------------------------------
#
# torch's non-reentrant checkpoint saves a region's *inputs* through the ambient saved-tensor hooks (its
# NoopSaveInputs node), so the ledger sees them; what the region's ops save is replaced by placeholders, and
# in backward the recomputed tensors are kept by the checkpoint frame under its own innermost hooks
# (`_recomputation_hook`), which the ledger's hooks never see. That recompute working set -- one layer's whole
# set under full recomputation (Korthikanti et al. 2022: "plus the activations of the layer being
# recomputed") -- is real memory. With `recomputation=True` the ledger wraps that hook's pack function: each
# re-saved tensor counts from its re-save until the frame's entry for it (keyed by a weakly held handle that
# the unpack drops) is gone. Relies on torch.utils.checkpoint internals (torch 2.1-2.13); a torch without
# them raises at __enter__ rather than measuring less.

_RECOMPUTING_LEDGERS: list[SavedActivationLedger] = []
_ACTIVE_LEDGERS: list[SavedActivationLedger] = []


def track_stored(tensors: object, owner: object) -> None:
    """Count the tensors in `tensors` (a tensor or a tuple / list of them) in every entered ledger until `owner`
    is garbage: what selective activation checkpointing stores in forward (models/common.py SelectiveOpPolicy)
    outside autograd's saved-tensor hooks, kept by the checkpoint frame until the region's backward is done."""
    items = tensors if isinstance(tensors, (tuple, list)) else (tensors,)
    for t in items:
        if isinstance(t, torch.Tensor) and t.numel() > 0:
            for ledger in _ACTIVE_LEDGERS:
                ledger._track(t, owner)
_RECOMPUTATION_HOOKED = False


def _install_recomputation_hook() -> None:
    global _RECOMPUTATION_HOOKED
    if _RECOMPUTATION_HOOKED:
        return
    from torch.utils import checkpoint as ckpt
    hook_cls = getattr(ckpt, "_recomputation_hook", None)
    if hook_cls is None:
        raise RuntimeError("SavedActivationLedger(recomputation=True): this torch has no "
                           "torch.utils.checkpoint._recomputation_hook; recomputed tensors cannot be counted")
    original_init = hook_cls.__init__

    def init(hook, target_frame_ref, gid) -> None:
        original_init(hook, target_frame_ref, gid)
        pack = hook.pack_hook

        def counted_pack(x):
            frame = target_frame_ref()
            index = frame.recomp_counter[gid]
            try:
                return pack(x)  # may raise _StopRecomputationError after storing x (early stop)
            finally:
                holder = frame.weak_holders[index]() if index < len(frame.weak_holders) else None
                handle = holder.handles.get(gid) if holder is not None else None
                if handle is not None:
                    for ledger in _RECOMPUTING_LEDGERS:
                        ledger._track(x, handle)

        hook.pack_hook = counted_pack

    hook_cls.__init__ = init
    _RECOMPUTATION_HOOKED = True


# --- model state -------------------------------------------------------------------------------

class StateKind(str, enum.Enum):
    """What a model-state tensor is. A storage in several kinds counts once, under the first of
    this order (e.g. a master weight that is the model parameter itself is a parameter)."""

    PARAMETERS = "parameters"  # the model's parameters, as the forward uses them
    BUFFERS = "buffers"  # registered buffers (RoPE frequencies, ...)
    GRADIENTS = "gradients"  # .grad of parameters and of master weights (a flat bucket counts once)
    MASTER_WEIGHTS = "master_weights"  # optimizer params that are not model params (fp32 copies)
    OPTIMIZER_STATES = "optimizer_states"  # per-element optimizer state (Adam: exp_avg, exp_avg_sq)
    OPTIMIZER_SCALARS = "optimizer_scalars"  # 0-dim state (Adam's `step`): per tensor, not per element
    OUTER_STATE = "outer_state"  # DiLoCo's theta and outer momentum (hybrid/diloco/outer.py: DiLoCo.state_ledger)


StateBytes = dict[tuple[StateKind, str], int]  # (kind, device type) -> bytes


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> StateBytes:
    """Bytes per (kind, device type) that `model` and `optimizer` hold on this rank, each storage
    counted once. Adam's 0-dim `step` tensors are filed as OPTIMIZER_SCALARS, so OPTIMIZER_STATES
    is exactly 2 x the parameter bytes for AdamW (same dtype, no amsgrad)."""
    counter = _StateCounter()
    params = list(model.parameters())
    counter.add_all(StateKind.PARAMETERS, params)
    counter.add_all(StateKind.BUFFERS, model.buffers())
    counter.add_all(StateKind.GRADIENTS, (p.grad for p in params if p.grad is not None))
    if optimizer is not None:
        _count_optimizer(counter, optimizer)
    return dict(counter.bytes)


def _count_optimizer(counter: "_StateCounter", optimizer: torch.optim.Optimizer) -> None:
    opt_params = [p for group in optimizer.param_groups for p in group["params"]]
    counter.add_all(StateKind.MASTER_WEIGHTS, opt_params)  # model params were already counted
    counter.add_all(StateKind.GRADIENTS, (p.grad for p in opt_params if p.grad is not None))
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                kind = StateKind.OPTIMIZER_SCALARS if value.dim() == 0 else StateKind.OPTIMIZER_STATES
                counter.add(kind, value)


@dataclass
class _StateCounter:
    """Bytes per (kind, device type), skipping storages already counted."""

    bytes: dict[tuple[StateKind, str], int] = field(default_factory=lambda: defaultdict(int))
    seen: set[StorageKey] = field(default_factory=set)

    def add(self, kind: StateKind, t: torch.Tensor) -> None:
        key = storage_key(t)
        if key not in self.seen:
            self.seen.add(key)
            self.bytes[(kind, t.device.type)] += key[2]

    def add_all(self, kind: StateKind, tensors: Iterable[torch.Tensor]) -> None:
        for t in tensors:
            self.add(kind, t)


@dataclass
class ModelStateLedger:
    """Model-state bytes of one rank by (kind, device type); the counterpart of CommLedger."""

    entries: StateBytes = field(default_factory=dict)  # (kind, device type) -> bytes

    @classmethod
    def measure(cls, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> "ModelStateLedger":
        return cls(entries=model_state_bytes(model, optimizer))

    def bytes(self, kind: StateKind | None = None, device: str | None = None) -> int:
        """Total over the entries matching `kind` and `device` (None matches all)."""
        return sum(b for (k, d), b in self.entries.items()
                   if (kind is None or k == kind) and (device is None or d == device))

    def summary(self) -> dict[str, int]:
        """{"kind@device": bytes}, for logs and JSON."""
        return dict(sorted((f"{k.value}@{d}", b) for (k, d), b in self.entries.items()))
