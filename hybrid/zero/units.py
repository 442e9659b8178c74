"""Flat units: the granularity at which ZeRO communicates and partitions.

A unit is a list of parameters laid end to end in one flat buffer, padded to a multiple of the
data-parallel size n so it splits into n equal shards (ZeRO's partition):

    flat = [p_0 | p_1 | ... | p_k | pad],   numel(flat) = n S,   rank r owns flat[r S : (r+1) S]

Each parameter's `.data` is a view into `flat`, so the model's forward reads the flat buffer with
no copy. Stage 3 frees the buffer between uses by shrinking its *storage* to 0 bytes
(`untyped_storage().resize_(0)`, as torch FSDP1 does): the views, and every view autograd saved for
backward, keep pointing at that storage, so refilling it (all-gather) before backward makes them
valid again without touching the autograd graph.

Stage 0 is the degenerate partition n = 1: one shard, the whole unit.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from hybrid.comm import Group, Work
from hybrid.tp import spec_of


@dataclass
class Segment:
    """The part of one parameter that falls in this rank's shard: shard[lo:hi] = param.flat()[a:a+hi-lo]."""

    param: nn.Parameter
    lo: int
    hi: int
    decay: bool  # AdamW weight decay applies (matrices, not biases/norms: as build_optimizer)
    norm_weight: float  # 1 where this rank's copy counts in the global gradient norm, 0 for duplicates


def norm_weight(p: nn.Parameter, tp: Group, duplicate: bool) -> float:
    """Count each logical element once in the global gradient norm: a parameter replicated over TP
    (spec.dim None, including partial-grad ones, which hold the summed gradient after the TP sync)
    counts on TP rank 0 only; a shard held by several TP ranks (replicated kv-heads: equal starts)
    counts on the first of them; `duplicate` marks the second copy of a tied embedding."""
    if duplicate:
        return 0.0
    spec = spec_of(p)
    if spec.dim is None:
        return 1.0 if tp.rank == 0 else 0.0
    return 1.0 if spec.starts.index(spec.starts[tp.rank]) == tp.rank else 0.0


@dataclass
class FlatUnit:
    """Parameters flattened into one buffer and split over `parts` ranks (1 for stage 0)."""

    name: str
    params: list[nn.Parameter]
    parts: int  # shards (the DP size; 1 when the optimizer state is not sharded)
    part: int  # this rank's shard index
    deferred: bool = False  # reduced after the whole forward/backward (tied embeddings), not from a hook
    align: int = 1  # each shard a multiple of this (1-bit Adam: 8, whole bytes of signs per shard; hybrid/compress)
    offsets: list[int] = field(default_factory=list)
    numel: int = 0
    flat: torch.Tensor | None = None  # full compute-dtype buffer; params are views into it
    shard: torch.Tensor | None = None  # this rank's parameter shard (stage 3: its own storage)
    flat_grad: torch.Tensor | None = None  # stages 0-1: persistent full gradient buffer (p.grad views, or with
    #                                        fp32 grads the fp32 buffer the hooks add each p.grad into)
    full_grad: torch.Tensor | None = None  # stages 2-3 with fp32 grads: the full fp32 gradient accumulating since
    #                                        the unit's last reduce-scatter (None between)
    grad_shard: torch.Tensor | None = None  # reduced gradient of this rank's shard
    master: torch.Tensor | None = None  # fp32 master shard the optimizer updates (may be `shard`)
    master_grad: torch.Tensor | None = None  # fp32 gradient of `master` during the step
    segments: list[Segment] = field(default_factory=list)
    views: list[torch.Tensor] = field(default_factory=list)  # master[lo:hi] per segment: optimizer params
    written: set[int] = field(default_factory=set)  # id(param) whose slot of the gradient buffer holds this
    #                                                  step's (stages 0-1) or this buffer's (2-3) gradient
    fired: int = 0  # post-accumulate-grad hooks seen since the last reduction
    gathered: bool = True  # stage 3: flat holds the full parameters
    gather_work: Work | None = None  # stage 3: prefetch in flight

    offset_of: dict[int, int] = field(default_factory=dict)  # id(param) -> its offset

    def __post_init__(self) -> None:
        off = 0
        for p in self.params:
            self.offsets.append(off)
            self.offset_of[id(p)] = off
            off += p.numel()
        self.numel = off

    @property
    def padded(self) -> int:
        """numel rounded up to a multiple of `parts` x `align`."""
        return -(-self.numel // (self.parts * self.align)) * self.parts * self.align

    @property
    def shard_numel(self) -> int:
        return self.padded // self.parts

    @property
    def shard_range(self) -> tuple[int, int]:
        return self.part * self.shard_numel, (self.part + 1) * self.shard_numel

    def flatten_values(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 copy of the current parameter values, padded (zeros); into `out` (fp32, `padded` elements) if given."""
        p0 = self.params[0]
        out = torch.zeros(self.padded, dtype=torch.float32, device=p0.device) if out is None else out.zero_()
        for p, off in zip(self.params, self.offsets):
            out[off:off + p.numel()].copy_(p.detach().flatten())
        return out

    def bind(self, flat: torch.Tensor) -> None:
        """Make every parameter a view into `flat` (fixed for the unit's life)."""
        self.flat = flat
        for p, off in zip(self.params, self.offsets):
            p.data = flat[off:off + p.numel()].view_as(p)

    def bind_grads(self) -> None:
        """Stages 0-1: every p.grad a view into the flat gradient buffer, so backward accumulates in it."""
        for p, off in zip(self.params, self.offsets):
            p.grad = self.flat_grad[off:off + p.numel()].view_as(p)

    def grad_view(self, buf: torch.Tensor, p: nn.Parameter) -> torch.Tensor:
        """p's slot of a flat gradient buffer of this unit, shaped as p."""
        off = self.offset_of[id(p)]
        return buf[off:off + p.numel()].view_as(p)

    def add_grad(self, buf: torch.Tensor, p: nn.Parameter) -> None:
        """buf[p] += p.grad, then free p.grad (Megatron's main_grad; torch DDP's copy into its bucket). The first
        gradient since the buffer was last reset (`written`) is copied, later ones added: the buffer is never
        zeroed (a pass over it fewer; 0 + g = g). With fp32 grads torch keeps p.grad in p's dtype, so the fp32
        buffer cannot be p.grad itself; every bf16 / fp16 value is an fp32 value, so the only rounding is the fp32
        sum's (unit roundoff 2^-24), where accumulating in p.grad rounds each sum to 2^-8 (bf16)."""
        slot = self.grad_view(buf, p)
        if id(p) in self.written:
            slot.add_(p.grad)
        else:
            slot.copy_(p.grad)
            self.written.add(id(p))
        p.grad = None

    def bind_grad(self, buf: torch.Tensor, p: nn.Parameter) -> None:
        """Stages 0-1 (compute-dtype gradients): p.grad, which holds all of p's gradient so far, into its slot of
        `buf`, and p.grad made that slot. The first backward's gradient is copied in (read 1, write 1 -- torch DDP's
        copy into its bucket, where a zeroed bound buffer costs a memset and an in-place add); later micro-batches
        accumulate in place through autograd (p.grad is the slot), nothing to move."""
        slot = self.grad_view(buf, p)
        if p.grad.data_ptr() != slot.data_ptr():
            slot.copy_(p.grad)
            p.grad = slot
        self.written.add(id(p))

    def zero_unwritten(self, buf: torch.Tensor) -> None:
        """Zero the slots of the parameters that received no gradient (what a zeroed buffer would hold), and count
        them written: a second call (the engine's late units are zeroed before their TP / tied-embedding sums and
        again at their reduction) neither repeats the pass nor wipes what those sums put there."""
        if len(self.written) < len(self.params):
            for p in self.params:
                if id(p) not in self.written:
                    self.grad_view(buf, p).zero_()
                    self.written.add(id(p))

    def new_full_grad(self, buf: torch.Tensor) -> None:
        """Stages 2-3: start a full gradient in `buf` (uninitialised, `padded` elements): the padding zeroed, every
        parameter's slot written by its first gradient (`add_grad`)."""
        buf[self.numel:].zero_()
        self.full_grad = buf
        self.written.clear()

    def take_full_grad(self) -> torch.Tensor:
        """Stages 2-3: the full gradient accumulated since the last reduce-scatter (zeros where no gradient came),
        handed to the reduce-scatter; the unit starts a new one at its next gradient."""
        full = self.full_grad
        self.zero_unwritten(full)
        self.full_grad = None
        return full

    def make_segments(self, tp: Group, duplicates: set[int]) -> None:
        """The parts of each parameter inside this rank's shard (optimizer params, norm weights)."""
        a, b = self.shard_range
        for p, off in zip(self.params, self.offsets):
            lo, hi = max(a, off), min(b, off + p.numel())
            if lo < hi:
                self.segments.append(Segment(p, lo - a, hi - a, decay=p.dim() >= 2,
                                             norm_weight=norm_weight(p, tp, id(p) in duplicates)))

    # --- stage 3: gathering and freeing the full parameters -----------------------------------
    def free(self) -> None:
        """Release the full parameters' memory; views (and autograd's saved views) stay valid objects."""
        self.flat.untyped_storage().resize_(0)
        self.gathered = False

    def start_gather(self, dp: Group, device: torch.device) -> None:
        """Allocate the full buffer and post the all-gather of every rank's shard into it."""
        if self.gathered or self.gather_work is not None:
            return
        self.flat.untyped_storage().resize_(self.padded * self.flat.element_size())
        shard = self.shard.to(device, non_blocking=True)  # host -> device when parameters are offloaded
        with preserve_version(self.flat):
            self.gather_work = dp.all_gather_into(self.flat, shard)

    def finish_gather(self, dp: Group, device: torch.device) -> None:
        self.start_gather(dp, device)
        if self.gather_work is not None:
            self.gather_work.wait()
            self.gather_work = None
        self.gathered = True


@contextmanager
def preserve_version(t: torch.Tensor):
    """Writing parameters in place (all-gather, optimizer write-back) is not a change autograd must
    see: the values written are the ones the saved graph was built with (stage 3 refill) or the graph
    is gone (after the step). Keep the version counter so saved views do not raise."""
    with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(t):
        yield
