"""ZeRO data parallelism (stages 0-3) as one optimizer that also owns gradient synchronisation.

    zero = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=3), OptimizerConfig(lr=1e-3))
    loss = train_step(chunks, batches, zero, mesh, runner=runner)   # begin / backward / finish / step

What each rank keeps (Psi = this rank's TP/PP share of the parameters, n = DP size, b = bytes of
the compute dtype, K = 12 with fp32 master weights (mixed precision), 8 without):

    stage 0   params b Psi     grads b Psi     master + Adam K Psi        all-reduce grads
    stage 1   params b Psi     grads b Psi     master + Adam K Psi / n    reduce-scatter grads, all-gather params
    stage 2   params b Psi     grads b Psi/n   master + Adam K Psi / n    reduce-scatter grads as produced
    stage 3   params b Psi/n   grads b Psi/n   master + Adam K Psi / n    + all-gather each layer before use

With fp32 gradients (`accumulate_fp32_grads`, Megatron's `--accumulate-allreduce-grads-in-fp32`) the grads
column holds 4 bytes a parameter instead of b, and the gradient collectives move fp32: each backward's
compute-dtype p.grad is added into the unit's fp32 buffer by the post-accumulate-grad hook and released
(Megatron's main_grad), so micro-batches accumulate and ranks sum with fp32 rounding; the reduced fp32 shard
is then the master gradient itself (no fp32 copy in the step). Stage 0 without offload: 2 + 4 + 12 = 18 bytes
a parameter.

Gradient synchronisation runs from autograd's post-accumulate-grad hooks: a unit (a bucket of
~bucket_bytes for stages 0-2, one Transformer block or the chunk's remaining parameters for stage
3) is reduced as soon as backward has produced all its gradients -- for stages 0-1 on the last
micro-batch only (gradients accumulate in the full buffer), for stages 2-3 every micro-batch (the
full gradient is dropped after each reduce-scatter; the shard accumulates). Collectives are posted
asynchronously and waited for after backward, so they overlap the rest of backward. Hooks fire in
the same order on every DP rank (identical graphs), so every rank posts the same collective
sequence.

Two kinds of gradient need more than DP before they are complete, and both are linear sums, so
their order against the DP sum is free:
  * TP partial gradients (sequence-parallel norms, replicated kv-heads): summed over TP inside the
    hook, just before the unit's DP reduction (every TP rank runs the same hooks in the same order);
  * tied embeddings (the first and last pipeline stage hold one logical weight): summed over the
    embedding group, which spans pipeline stages that are at different points of backward -- a
    collective from inside a hook could deadlock -- so their unit is `deferred`: reduced once after
    the whole forward/backward, as the pre-ZeRO code did.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
from torch.utils._python_dispatch import _disable_current_modes

from hybrid.comm import Group
from hybrid.dp import make_buckets
from hybrid.mesh import Mesh
from hybrid.moe.experts import LocalExperts
from hybrid.moe.params import is_expert
from hybrid.tp import VocabParallelEmbedding, sync_partial_grads
from hybrid.train_step import OptimizerConfig, sync_tied_embeddings
from hybrid.zero.buffers import BufferPool
from hybrid.zero.config import CpuAdam, Precision, ZeroConfig
from hybrid.zero.direct import can_reduce_directly, reduce_scatter_grads
from hybrid.zero.host_alloc import retain_freed_host_memory
from hybrid.zero.shm import SharedFlats
from hybrid.zero.units import FlatUnit

if TYPE_CHECKING:  # the compressor seam's protocol (hybrid/compress imports this package: no cycle)
    from hybrid.compress.reduction import DPReduction

MAX_IN_FLIGHT = 1  # reductions left in flight after posting one (FSDP2: 1): bounds the full-size temporaries
BLOCK_CONTAINERS = ("h", "layers")  # where each model keeps its Transformer blocks: GPT-2, Llama
Blocks = list[tuple[nn.Module, FlatUnit]]  # stage 3: each block with its unit, in forward order
LOOKUPS = (nn.Embedding, VocabParallelEmbedding)  # modules whose backward reads no parameter value


@dataclass
class Stage3Chunk:
    """How stage 3 gathers one model chunk's parameters (each unit is gathered just before use, freed after):

    * `inputs`: one unit per embedding lookup (token, position): gathered for the chunk's forward, freed right
      after its lookup and never gathered again in backward -- an embedding's gradient is a scatter-add of the
      output gradient into rows, which reads no weight;
    * `blocks`: a unit per Transformer block, prefetched one ahead, forward and backward;
    * `output`: the rest of the chunk's own parameters (final norm, untied LM head), gathered when one of its
      `output_owners` runs (prefetched by the last block) and again at the start of backward, reduced and freed as
      soon as the head's and norm's gradients are in;
    * `roots`: the tied embedding (used as lookup and head, at both ends), held for the chunk's whole forward and
      whole backward.
    torch FSDP2 (and this engine before) held embedding, norm and head as one group through both passes: for a
    36k-vocabulary, h 1024 model that is 295 MB more at the backward's peak (docs/zero.md)."""

    chunk: nn.Module
    roots: list[FlatUnit]
    blocks: Blocks
    inputs: list[tuple[nn.Module, FlatUnit]] = field(default_factory=list)
    output: FlatUnit | None = None
    output_owners: list[nn.Module] = field(default_factory=list)

    @property
    def units(self) -> list[FlatUnit]:
        return self.roots + [u for _, u in self.inputs] + [u for _, u in self.blocks] + \
            ([self.output] if self.output is not None else [])


def block_modules(chunk: nn.Module) -> list[nn.Module]:
    """The Transformer blocks of one model chunk, in forward order (stage 3's per-layer units)."""
    for name in BLOCK_CONTAINERS:
        blocks = getattr(chunk, name, None)
        if isinstance(blocks, nn.ModuleDict):
            return list(blocks.values())
    return []


def tied_weight(chunk: nn.Module) -> torch.Tensor | None:
    fn = getattr(chunk, "tied_embedding_weight", None)
    return fn() if fn is not None else None


@dataclass
class Pending:
    """A reduction in flight: where its result lands and the temporaries it holds until it completes."""

    unit: FlatUnit
    work: object
    out: torch.Tensor | None = None  # None: all-reduced in place (stage 0); the unit's grad_shard: landed there
    full: torch.Tensor | None = None  # a pooled full gradient (stages 2-3), given back once sent
    recv: torch.Tensor | None = None  # the exchange's pooled receive buffer


@dataclass
class StepReport:
    """What one optimizer step did."""

    grad_norm: float | None  # global L2 norm before clipping (None unless clipping)
    skipped: bool  # fp16 overflow: no update, the loss scale was halved
    loss_scale: float


class ZeroOptimizer:
    """AdamW over ZeRO-partitioned fp32 master shards, plus the gradient sync that feeds it.

    `model` is a pipeline rank's `nn.ModuleList` of chunks (or one module). The model's parameters
    become views into flat compute-dtype buffers (cast here for --bf16/--fp16); the fp32 values
    they held become the master weights.
    """

    def __init__(self, model: nn.Module, mesh: Mesh, cfg: ZeroConfig, opt_cfg: OptimizerConfig,
                 reduction: DPReduction | None = None) -> None:
        self.model, self.mesh, self.cfg, self.opt_cfg = model, mesh, cfg, opt_cfg
        # hybrid/compress: a gradient compressor reduces the dense units instead of the plain collectives below
        if reduction is not None and not reduction.per_micro_batch and cfg.stage == 3:
            raise ValueError("gradient compression does not run with --zero-stage 3; use --zero-stage 0, 1 or 2")
        self.reduction = reduction
        self.chunks = list(model) if isinstance(model, nn.ModuleList) else [model]
        # gradients are reduced (and ZeRO shards) over DP x CP: each CP rank saw other tokens of the same sequences
        # (Megatron's dp_cp group); the DP group itself when cp = 1 -- the only CP edit here
        self.dp: Group = mesh.dp_cp
        self.edp: Group = mesh.expert_dp  # MoE experts: replicated over their expert-DP group (hybrid/moe)
        self._expert_units: set[int] = set()
        self.device = mesh.device
        self.dtype = cfg.precision.dtype
        self.grad_dtype = cfg.grad_dtype  # fp32 with accumulate_fp32_grads, else the compute dtype
        self.offload_device = torch.device("cpu")
        self.pin = self.device.type == "cuda"
        self.loss_scale = cfg.initial_loss_scale if cfg.precision is Precision.FP16 else 1.0
        self.good_steps = self.skipped_steps = 0
        self.last_report: StepReport | None = None
        self._grad_div = 1.0  # the gradients' divisor left to the AdamW kernel this step (_make_master_grads)
        self._seeded = 0  # backward passes of this step whose loss gradient was seeded with 1 / n (_seed_mean)
        self._m = 1  # micro-batches of the current step
        self._direct_step = False  # this step reduces the direct units from autograd's gradients (begin_step)
        self._armed = False
        self._pending: list[Pending] = []
        self._pool = BufferPool()  # the reductions' host temporaries, reused (hybrid/zero/buffers.py)
        self._launches: dict[int, int] = {}
        self._param_gathers: dict[int, tuple[object, torch.Tensor]] = {}  # id(unit) -> (work, send buffer)
        self.units, self.stage3_plan = self._build_units()
        self._direct_units = self._reduced_directly()
        self._shared, self._shared_index = self._open_shared()
        self._unit_of = {id(p): u for u in self.units for p in u.params}
        for u in self.units:
            self._init_unit(u)
        self.optimizer, self.optimizer_kind = self._build_optimizer()
        self.seeds_mean = self._can_seed_mean()
        if reduction is not None:
            reduction.bind([u for u in self.units if id(u) not in self._expert_units], self)
        self._register_hooks()
        if self.device.type == "cpu" and self.dp.size > 1 and self.cfg.stage < 3:  # after the persistent buffers
            # autograd's large gradients reused from the heap, not faulted in each step. Not at ZeRO 3: there the
            # retained heap (per-unit gathers of many sizes) raised the peak above FSDP2's (docs/zero.md)
            retain_freed_host_memory()

    # --- construction ------------------------------------------------------------------------
    @property
    def parts(self) -> int:
        return self.dp.size if self.cfg.sharded else 1

    def _unit(self, name: str, params: list[nn.Parameter], deferred: bool = False, expert: bool = False) -> FlatUnit:
        """A unit over the DP group, or (expert) over the expert-DP group: MoE experts' gradients are summed
        and sharded over the ranks holding the same experts (hybrid/moe/parallel.py)."""
        group = self.edp if expert else self.dp
        # hybrid/compress: 1-bit Adam's server chunks are the ZeRO shards, a whole number of bytes of signs each
        align = getattr(self.reduction, "shard_align", 1) if self.cfg.sharded and not expert else 1
        u = FlatUnit(name, params, parts=group.size if self.cfg.sharded else 1,
                     part=group.rank if self.cfg.sharded else 0, deferred=deferred, align=align)
        if expert:
            self._expert_units.add(id(u))
        return u

    def _reduced_directly(self) -> set[int]:
        """The units (ids) whose reduce-scatter reads autograd's gradients where they lie (hybrid/zero/direct.py:
        no copy into a flat gradient buffer): `reduce_from_grads` at stages 1-2, compute-dtype gradients, no
        compressor, over a 2-rank gloo DP group on the host; not the deferred units (tied embeddings: their TP and
        embedding-group sums run on the flat buffer after backward) nor MoE experts (the expert-DP group)."""
        if not (self.cfg.reduce_from_grads and self.cfg.stage in (1, 2) and self.reduction is None
                and not self.cfg.accumulate_fp32_grads and can_reduce_directly(self.dp, self.device)):
            return set()
        return {id(u) for u in self.units if not u.deferred and id(u) not in self._expert_units}

    def _open_shared(self) -> tuple[SharedFlats | None, dict[int, int]]:
        """`ZeroConfig.shm_gather`: the dense units' flat parameters in shared memory (hybrid/zero/shm.py), collective
        over the DP pair; (None, {}) where it does not run -- on both ranks alike: the conditions here are the
        config's, and `SharedFlats.open` agrees its own over the group. Not the MoE experts' units (the expert-DP
        group), nor under a compressor (hybrid/compress steps and gathers its own way), nor at stages 0 and 3 (no
        post-step gather)."""
        self.shm_gather_declined: str | None = None  # why a 2-rank gloo pair's set-up fell back, if it did
        if not (self.cfg.shm_gather and self.cfg.stage in (1, 2) and self.device.type == "cpu"
                and self.reduction is None):
            return None, {}
        dense = [u for u in self.units if id(u) not in self._expert_units]
        why: list[str] = []
        shared = SharedFlats.open(self.dp, [u.padded for u in dense], self.dtype, why=why)
        self.shm_gather_declined = why[0] if why else None  # train.py's header says it (hybrid/train/loop.py)
        return shared, ({id(u): i for i, u in enumerate(dense)} if shared is not None else {})

    @property
    def shm_gather_active(self) -> bool:
        """Whether the post-step gathers run through shared memory (shm_gather asked for and set up)."""
        return self._shared is not None

    def _all_gather(self, u: FlatUnit):
        """Post u's post-step all-gather (stages 1-2): through shared memory for the units there, else the group's."""
        i = self._shared_index.get(id(u))
        return self._group(u).all_gather_in_place(u.flat) if i is None else self._shared.all_gather(i)

    def before_param_writes(self) -> None:
        """Before this rank writes its parameter shards or the master weights (an optimizer step, DiLoCo's outer
        step, `sync_params_from_master`, a checkpoint's in-place fill of `state_dict`'s views): every post-step
        gather waited for, and with shm_gather the peer has taken this rank's last posted values -- its shards live
        in the file the peer copies them from (fp32: the master is the shard). Take first, then wait for the peer's
        take, in that order on both ranks, so neither waits for the other's wait (hybrid/zero/shm.py). Both ranks of
        the pair call it at the same point (each writer above runs on every rank)."""
        self.wait_params()
        if self._shared is not None:
            self._shared.wait_taken(list(range(len(self._shared.numels))))

    def _direct(self, u: FlatUnit) -> bool:
        return self._direct_step and id(u) in self._direct_units

    def _group(self, u: FlatUnit) -> Group:
        """The group `u` is reduced, sharded and gathered over."""
        return self.edp if id(u) in self._expert_units else self.dp

    def _split_experts(self, c: int, name: str, params: list[nn.Parameter]) -> list[FlatUnit]:
        """Stages 0-2: the dense parameters' buckets, then the experts' (a bucket never mixes the two groups)."""
        units = []
        for expert in (False, True):
            mine = [p for p in params if is_expert(p) == expert]
            buckets = make_buckets(mine, self.cfg.bucket_bytes, _element_size(self.grad_dtype))
            units += [self._unit(f"chunk{c}.{name}{i}", b, expert=expert) for i, b in enumerate(buckets)]
        return units

    def _stage3_blocks(self, c: int, chunk: nn.Module) -> Blocks:
        """Stage 3: one unit per block's dense parameters, and after it one for each MoE experts module in it
        (gathered around that module's own forward, over the expert-DP group)."""
        blocks: Blocks = []
        for i, b in enumerate(block_modules(chunk)):
            blocks.append((b, self._unit(f"chunk{c}.block{i}", [p for p in b.parameters() if not is_expert(p)])))
            blocks += [(m, self._unit(f"chunk{c}.block{i}.experts", list(m.parameters()), expert=True))
                       for m in b.modules() if isinstance(m, LocalExperts)]
        return blocks

    def _build_units(self) -> tuple[list[FlatUnit], list[Stage3Chunk]]:
        """Tied embeddings in their own deferred unit; stage 3: one unit per block plus one for each
        chunk's remaining parameters; stages 0-2: buckets in backward order (last chunk, last
        parameter first)."""
        units, plan = [], []
        self.duplicates: set[int] = set()
        for c, chunk in reversed(list(enumerate(self.chunks))):
            tied = tied_weight(chunk)
            stage = getattr(chunk, "stage", None)
            if tied is not None and stage is not None and not stage.first:
                self.duplicates.add(id(tied))  # the LM-head copy: counted once, on the first stage
            roots = [self._unit(f"chunk{c}.tied", [tied], deferred=True)] if tied is not None else []
            rest = [p for p in chunk.parameters() if p is not tied and p.requires_grad]
            if self.cfg.stage == 3:
                entry = self._stage3_plan(c, chunk, roots, rest)
                plan.append(entry)
                units += entry.units
            else:
                units += roots + self._split_experts(c, "bucket", rest)
        return units, plan

    def _stage3_plan(self, c: int, chunk: nn.Module, roots: list[FlatUnit], rest: list[nn.Parameter]) -> Stage3Chunk:
        """Stage 3's units of one chunk (Stage3Chunk): its blocks, its embedding lookups, the rest (output)."""
        blocks = self._stage3_blocks(c, chunk)  # each block's dense unit, then its experts' (MoE)
        taken = {id(p) for _, u in blocks for p in u.params}
        mine = {id(p) for p in rest}
        inputs = []
        for name, m in chunk.named_children():
            params = [p for p in m.parameters() if id(p) in mine and id(p) not in taken]
            if isinstance(m, LOOKUPS) and params:
                inputs.append((m, self._unit(f"chunk{c}.{name}", params)))
                taken.update(id(p) for p in params)
        left = [p for p in rest if id(p) not in taken]
        owners = [m for m in chunk.modules() if m is not chunk and any(id(p) in {id(q) for q in left}
                                                                       for p in m.parameters(recurse=False))]
        output = self._unit(f"chunk{c}.output", left) if left else None
        return Stage3Chunk(chunk, roots, blocks, inputs, output, owners)

    def _init_unit(self, u: FlatUnit) -> None:
        """Flat compute-dtype parameters, this rank's shard, gradient buffers and the fp32 master."""
        i = self._shared_index.get(id(u))  # shm_gather: the flat parameters in the shared file
        shared = self._shared.flat(i) if i is not None else None
        fp32_shared = shared is not None and self.dtype == torch.float32
        values = u.flatten_values(shared if fp32_shared else None)  # fp32, padded (no transient copy when shared)
        flat = values.to(self.dtype) if self.dtype != torch.float32 else values
        u.bind(flat if shared is None or fp32_shared else shared.copy_(flat))
        a, b = u.shard_range
        offload_params = self.cfg.offload_params
        u.shard = self._place(u.flat[a:b].clone(), offload_params) if self.cfg.stage == 3 else u.flat[a:b]
        # fp32 shards that already sit where the optimizer runs are their own master weights
        if self.dtype == torch.float32 and offload_params == self.cfg.offload_optimizer:
            u.master = u.shard
        else:
            u.master = self._place(values[a:b].clone(), self.cfg.offload_optimizer)
        if self.cfg.stage == 3:
            # only now: in fp32 `values` *is* the flat buffer, so freeing it first would leave the
            # master copy above reading a 0-byte storage
            u.free()
        if self.cfg.stage <= 1 or not self._per_micro_batch and self.cfg.stage == 2:  # compression: reduced once
            u.flat_grad = torch.zeros(u.padded, dtype=self.grad_dtype, device=self.device)
            if not self._buffers_grads:  # else the hooks move each p.grad into flat_grad
                u.bind_grads()
            u.grad_shard = u.flat_grad[a:b]
        else:
            u.grad_shard = torch.zeros(u.shard_numel, dtype=self.grad_dtype, device=self.device)
        u.make_segments(self.mesh.tp, self.duplicates)
        self._expert_norm_weights(u)
        u.views = [u.master[s.lo:s.hi] for s in u.segments]

    @property
    def has_experts(self) -> bool:
        return bool(self._expert_units)

    def _expert_norm_weights(self, u: FlatUnit) -> None:
        """With MoE the gradient norm is summed over DP too (experts differ across DP ranks): an expert element
        counts on every rank that holds its shard (sharded) or on expert-DP rank 0 (stage 0); a dense one, which
        stage 0 replicates over DP, on DP rank 0 only."""
        if not self.has_experts or (self.cfg.sharded and id(u) not in self._expert_units):
            return
        for s in u.segments:
            if id(u) in self._expert_units:
                s.norm_weight = 1.0 if self.cfg.sharded or self.edp.rank == 0 else 0.0
            elif self.dp.rank != 0:
                s.norm_weight = 0.0

    def _place(self, t: torch.Tensor, offload: bool) -> torch.Tensor:
        if not offload:
            return t
        t = t.to(self.offload_device)
        return t.pin_memory() if self.pin else t

    def _master_grad_is_view(self, u: FlatUnit) -> bool:
        """The reduced gradient shard is the master gradient (no copy) when it is fp32 and the optimizer runs on
        the device: fp32 training (its master is the shard), or fp32 gradients (accumulate_fp32_grads)."""
        if self.cfg.offload_optimizer:
            return False
        return self.cfg.accumulate_fp32_grads or (u.master is u.shard and self.dtype == torch.float32)

    def _build_optimizer(self) -> tuple[torch.optim.Optimizer, str]:
        """AdamW over the master segments, decay on matrices only (as training.build_optimizer).

        Without offload: torch's fused AdamW on CPU and GPU alike -- one multi-tensor call, one pass over weights,
        gradients and both moments (the per-tensor loop, torch's CPU default, makes ~8 passes: 2.7x the bandwidth
        floor on CPU; the foreach default on a GPU ~8 passes and a full-size temporary: 0.1 s of a 0.76 s step of
        a 1.2B model on an H200). The kernel is elementwise and position-independent, so a segment of a shard
        steps bit for bit as the whole parameter does in training.build_optimizer."""
        decay = [v for u in self.units for v, s in zip(u.views, u.segments) if s.decay]
        no_decay = [v for u in self.units for v, s in zip(u.views, u.segments) if not s.decay]
        groups = [{"params": decay, "weight_decay": self.opt_cfg.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
        if self.opt_cfg.optimizer == "sgd":  # --optimizer sgd (fused: reads grad_scale as AdamW does)
            return torch.optim.SGD(groups, lr=self.opt_cfg.lr, momentum=self.opt_cfg.sgd_momentum, fused=True), "sgd"
        kw = dict(lr=self.opt_cfg.lr, betas=(self.opt_cfg.beta1, self.opt_cfg.beta2), eps=self.opt_cfg.eps)
        if hasattr(self.reduction, "build_optimizer"):  # hybrid/compress: 1-bit Adam brings its own
            return self.reduction.build_optimizer(self, groups, **kw), "onebit-adam"
        if not self.cfg.offload_optimizer:
            return torch.optim.AdamW(groups, **kw, fused=True), "torch-fused"
        return cpu_adamw(groups, self.cfg.cpu_adam, **kw)

    def segment_grad(self, u: FlatUnit, s) -> torch.Tensor:
        """The gradient AdamW applies this step to segment `s` of unit `u`: the master gradient divided by what
        the kernel divides it by (`grad_scale`, see _make_master_grads). Valid inside step(), before the update."""
        g = u.master_grad[s.lo:s.hi]
        return g / self._grad_div if self._grad_div != 1.0 else g

    def moment(self, unit: int, seg: int, kind: str) -> torch.Tensor:
        """AdamW state `kind` ("exp_avg", "exp_avg_sq") of segment `seg` of unit `unit` (the checkpoint reads and
        writes moments per parameter through this)."""
        return self.optimizer.state[self.units[unit].views[seg]][kind]

    # --- hooks -------------------------------------------------------------------------------
    def _register_hooks(self) -> None:
        for u in self.units:
            for p in u.params:
                p.register_post_accumulate_grad_hook(partial(self._on_grad, u))
        for chunk in self.chunks:
            if getattr(getattr(chunk, "stage", None), "last", True):
                if self.cfg.precision is Precision.FP16:
                    chunk.register_forward_hook(self._scale_loss)
                elif self.seeds_mean:
                    chunk.register_forward_hook(self._seed_mean)
        if self.cfg.stage == 3:
            for entry in self.stage3_plan:
                self._register_stage3(entry)
        if self.overlaps_param_gather:
            self._gather_groups = self._register_gather_waits()
            self._gather_order = [u for g in self._gather_groups for u in g]

    @property
    def overlaps_param_gather(self) -> bool:
        """Stages 1-2 with overlap_param_gather: the next forward waits for the post-step all-gathers."""
        return self.cfg.stage in (1, 2) and self.cfg.overlap_param_gather and self.dp.size > 1

    def _register_gather_waits(self) -> list[list[FlatUnit]]:
        """Forward hooks that wait for the post-step all-gathers just before use: each chunk's pre-hook for the
        units of its own parameters and of its embedding lookups (the input side), each block's for the units
        holding its parameters, and the last block's forward hook (after it) for the rest outside the blocks (final
        norm, LM head: a head may be read through a method, `logits`, that runs no hook of its own). Returns the
        units in that order, grouped by the hook that first waits for them (the units no hook waits for last),
        which is the order `_write_back` posts them (collectives complete in posting order): the LM head's gather
        (a 36k x 1024 head: 74 MB to receive at dp 2) is posted last and overlaps every block's forward, where
        waiting for it with the embedding before the first block left it exposed. `_step_and_gather` steps one
        group a call."""
        unit_of = {id(p): u for u in self.units for p in u.params}
        order: list[FlatUnit] = []
        groups: list[list[FlatUnit]] = []

        def units_of(params) -> tuple[FlatUnit, ...]:
            us = []
            for p in params:
                u = unit_of.get(id(p))
                if u is not None and u not in us:
                    us.append(u)
            new = [u for u in us if u not in order]
            order.extend(new)
            groups.extend([new] if new else [])
            return tuple(us)

        def wait(m, *_, us) -> None:
            self._wait_gathers(us)

        for chunk in self.chunks:
            blocks = block_modules(chunk)
            in_blocks = {id(p) for b in blocks for p in b.parameters()}
            lookups = [p for m in chunk.modules() if isinstance(m, LOOKUPS) for p in m.parameters()]
            inputs = units_of(p for p in [*chunk.parameters(recurse=False), *lookups] if id(p) not in in_blocks)
            chunk.register_forward_pre_hook(partial(wait, us=inputs))
            for b in blocks:
                b.register_forward_pre_hook(partial(wait, us=units_of(b.parameters())))
            outputs = units_of(p for p in chunk.parameters() if id(p) not in in_blocks)
            (blocks[-1].register_forward_hook if blocks else chunk.register_forward_pre_hook)(
                partial(wait, us=outputs))
        rest = [u for u in self.units if u not in order]
        return groups + ([rest] if rest else [])

    def _wait_gathers(self, units) -> None:
        if self._param_gathers:
            for u in units:
                entry = self._param_gathers.pop(id(u), None)
                if entry is not None:
                    entry[0].wait()

    def wait_params(self) -> None:
        """Wait for every post-step all-gather still in flight: before anything reads or writes the parameters
        other than the forward (which waits per block): a checkpoint load or save, `gathered`, the next step."""
        self._wait_gathers(self.units)

    def _scale_loss(self, module: nn.Module, args, out):
        """fp16: the loss times the loss scale, so small gradients survive fp16's range."""
        return out * self.loss_scale if torch.is_tensor(out) and out.dim() == 0 else None

    def _can_seed_mean(self) -> bool:
        """Whether the mean over DP (the sum's / n) can enter backward as the loss gradient's seed 1 / n instead of a
        division in the step (_seed_mean): fp32 or bf16 (fp16 keeps its range for the loss scale), n a power of two
        > 1, the loss on this rank (pp = 1), no compressor (it reads the sums), no MoE auxiliary loss (its gradient
        enters backward apart from the loss: hybrid/moe/runtime.py)."""
        from hybrid.moe.runtime import moe_layers
        return (self.cfg.precision in (Precision.FP32, Precision.BF16) and self.dp.size > 1
                and _power_of_two(self.dp.size) and self.mesh.pp.size == 1 and self.reduction is None
                and not moe_layers(self.model))

    def _seed_mean(self, module: nn.Module, args, out) -> None:
        """The loss's gradient seed times 1 / n, so backward produces each rank's gradient / n and the DP sum is the
        mean -- the division the step would otherwise make: a pass over the gradient shards (read 4, write 4 bytes
        a parameter), or, folded into torch's fused AdamW (`grad_scale`), a write of the divided gradient back into
        the gradient buffer (its CPU kernel stores it: 32 bytes a parameter where AdamW needs 28). Every backward op
        is linear in the seed, and scaling by a power of two is exact in fp32 and bf16 (one exponent range), so
        each gradient is bit for bit the sum's / n (unless a value falls below the normal range, 2^-126, where the
        scaled value rounds first). The loss's value is untouched (a gradient hook, not a forward change)."""
        if self.seeds_mean and self._armed and torch.is_tensor(out) and out.dim() == 0 and out.requires_grad:
            out.register_hook(self._seed_grad)

    def _seed_grad(self, g: torch.Tensor) -> torch.Tensor:
        self._seeded += 1
        return g / self.dp.size

    def _register_stage3(self, plan: Stage3Chunk) -> None:
        """Gather just before use, prefetch the next unit, free after use -- forward and backward (Stage3Chunk says
        which unit is held when)."""
        units = [u for _, u in plan.blocks]
        out = [plan.output] if plan.output is not None else []
        held = plan.roots + out  # freed after the chunk's forward, gathered again at the start of its backward
        plan.chunk.register_forward_pre_hook(
            lambda m, a: self._gather(plan.roots + [u for _, u in plan.inputs], units[:1] or out))
        plan.chunk.register_forward_hook(lambda m, a, o: self._after_forward(held, o, units[-1:]))
        for module, u in plan.inputs:
            module.register_forward_hook(lambda m, a, o, u=u: self._free([u]))
        for owner in plan.output_owners:
            owner.register_forward_pre_hook(lambda m, a: self._gather(out, []))
        for i, (block, u) in enumerate(plan.blocks):
            nxt, prev = (units[i + 1:i + 2] or out), units[max(0, i - 1):i] if i else []
            block.register_forward_pre_hook(lambda m, a, u=u, nxt=nxt: self._before_block(u, nxt))
            block.register_forward_hook(lambda m, a, o, u=u, prev=prev: self._after_block(u, o, prev))

    def _before_block(self, u: FlatUnit, prefetch: list[FlatUnit]) -> None:
        """A block's (or an MoE experts module's) forward pre-hook: gather its unit, prefetch the next. A module
        inside a checkpointed block (an MoE layer's experts) runs its hooks again in the backward's recomputation:
        then it gathers only its own unit, which the backward about to run reads (torch FSDP2's rule for
        activation checkpointing) -- the next unit's backward is over, a prefetch would gather it for nothing."""
        self._gather([u], [] if _in_backward() else prefetch)

    def _after_block(self, u: FlatUnit, out, prefetch: list[FlatUnit]) -> None:
        """A block's forward hook: free its unit and hook its re-gather on the output's gradient. In the
        recomputation the unit stays gathered for the backward that follows (`_on_grad` frees it once its
        gradients are in); freeing it here made that backward gather it a second time."""
        if not _in_backward():
            self._after_forward([u], out, prefetch)

    def gather_chunk(self, chunk: nn.Module) -> None:
        """Stage 3: gather every unit of `chunk` now. A zero-bubble W (hybrid/pipeline/split_backward.py) runs
        apart from the forward and input backward whose hooks gather, and some weight-gradient kernels read the
        weight (CPU layer norm); each unit is freed again once its gradients are in (`_on_grad`)."""
        if self.cfg.stage != 3 or self.cfg.keep_gathered:
            return
        plan = next(plan for plan in self.stage3_plan if plan.chunk is chunk)
        self._gather(plan.units, [])

    def _gather(self, units: list[FlatUnit], prefetch: list[FlatUnit]) -> None:
        """Gather `units` now and post `prefetch`'s gathers. Under no torch dispatch mode: an MoE experts module's
        hooks run inside its block's checkpoint, whose op-level policy (`--recompute-granularity selective-op`,
        torch's selective-checkpoint modes) records every operator of the forward and requires the recomputation
        to run the same ones in the same order; a gather's copies and views depend on what is gathered already
        (a prefetch, another micro-batch), so they must not be among them -- they are the optimizer's, not the
        model's (torch: "aten.split.Tensor invocation index 2 ... not found in storage")."""
        with _disable_current_modes():
            for u in units:
                u.finish_gather(self._group(u), self.device)
            for u in prefetch:  # posted now, waited for when that unit runs: overlaps this one's compute
                u.start_gather(self._group(u), self.device)

    def _free(self, units: list[FlatUnit]) -> None:
        if not self.cfg.keep_gathered:
            for u in units:
                u.free()

    def _after_forward(self, units: list[FlatUnit], out, prefetch: list[FlatUnit]):
        self._free(units)
        if torch.is_tensor(out) and out.requires_grad:
            # fires when the gradient w.r.t. this output exists: just before these units' backward
            out.register_hook(lambda g: self._gather(units, prefetch))
        return None

    def _on_grad(self, u: FlatUnit, p: nn.Parameter) -> None:
        """Post-accumulate-grad hook: (fp32 grads) add p.grad into u's fp32 buffer; reduce `u` once backward has
        produced all its gradients."""
        if not self._armed:
            return
        if self._direct(u):
            pass  # p.grad stays autograd's tensor until the unit's reduction is posted (_launch_direct)
        elif self._buffers_grads:
            if u.flat_grad is None and u.full_grad is None:  # stages 2-3: u's first gradient since its reduction
                self._reap()  # finished reductions first: their full gradients go back before this one is taken
                u.new_full_grad(self._pool.take(u.padded, self.grad_dtype, self.device))
            if u.flat_grad is not None and not self.cfg.accumulate_fp32_grads:
                u.bind_grad(u.flat_grad, p)  # stages 0-1: p.grad stays a view of the buffer, as before
            else:
                u.add_grad(u.flat_grad if u.flat_grad is not None else u.full_grad, p)
        u.fired += 1
        per_micro_batch = self._per_micro_batch
        if u.fired < len(u.params) * (1 if per_micro_batch else self._m):
            return
        u.fired = 0
        if self.cfg.stage == 3 and not self.cfg.keep_gathered:
            u.free()  # before the reduction allocates its result: the gathered parameters are not needed again
        if not (u.deferred or self.cfg.keep_gathered):
            sync_partial_grads(u.params, self.mesh.tp, self._grad_of)
            self._launch(u)

    @property
    def _buffers_grads(self) -> bool:
        """Whether the hook moves each p.grad into its unit's flat gradient buffer and frees it (copied when it is
        the slot's first, added after): with fp32 grads (the fp32 buffer, every stage), at stages 2-3, whose full
        gradient lives only until its reduce-scatter, and at stages 0-1 without a compressor. At stages 2-3 this
        holds one parameter's gradient beside the unit's buffer, where copying them all into a buffer at the unit's
        reduction held every gradient of the unit twice (a 36k x 1024 embedding and LM head: 295 MB more at the peak
        of a ZeRO-3 step, docs/zero.md). At stages 0-1 the first gradient is copied into the buffer and p.grad bound
        to its slot then (`FlatUnit.bind_grad`), where p.grad was bound into a buffer zeroed every step (a memset of
        the whole buffer, then autograd's in-place add: read 2, write 1 a parameter, where the copy reads 1, writes
        1), as torch DDP copies each gradient into its bucket. A compressor at stages 0-1 (and at stage 2 when
        not per micro-batch) still binds p.grad into its buffer (hybrid/compress)."""
        if self.cfg.accumulate_fp32_grads or self.reduction is None:
            return True
        return self.cfg.stage >= 2 and getattr(self.reduction, "per_micro_batch", True)

    # --- gradient reduction ------------------------------------------------------------------
    def _grad_of(self, p: nn.Parameter) -> torch.Tensor | None:
        """The gradient backward has accumulated for p: p.grad, or where the hooks buffer gradients p's slot of its
        unit's buffer (what the TP partial-gradient and tied-embedding sums must add)."""
        u = self._unit_of.get(id(p))
        if u is None or not self._buffers_grads or self._direct(u):
            return p.grad
        buf = u.flat_grad if u.flat_grad is not None else u.full_grad
        return None if buf is None else u.grad_view(buf, p)

    @property
    def _per_micro_batch(self) -> bool:
        """Stages 2-3 reduce every micro-batch (the full gradient is dropped); a compressor once per step."""
        return self.cfg.stage >= 2 and not self.cfg.keep_gathered and getattr(self.reduction, "per_micro_batch", True)

    def _launch(self, u: FlatUnit) -> None:
        """Post u's DP reduction: the compressor's (hybrid/compress, synchronous: flat_grad then holds the sum,
        the shard is a view of it), else all-reduce (stage 0), or reduce-scatter to this rank's shard."""
        self._launches[id(u)] = self._launches.get(id(u), 0) + 1
        if self.reduction is not None and self.reduction.reduce(u, self._group(u)):
            return
        group = self._group(u)
        if self._direct(u):
            self._launch_direct(u, group)
        elif self.cfg.stage == 0:
            if self._buffers_grads:
                u.zero_unwritten(u.flat_grad)
            self._pending.append(Pending(u, group.all_reduce_async(u.flat_grad)))
        elif u.flat_grad is not None:  # stage 1, or stage 2 under a compressor (before it starts): in place, the
            if self._buffers_grads:  # shard is flat_grad's own chunk
                u.zero_unwritten(u.flat_grad)
            recv = self._take(u.shard_numel, group)
            self._pending.append(Pending(u, group.reduce_scatter_into(u.grad_shard, u.flat_grad, recv),
                                         u.grad_shard, recv=recv))
        else:  # 2-3: the full gradient goes back to the pool once its reduce-scatter completes; the step's first
            #    reduction lands in the shard itself, later micro-batches' are added to it
            full = u.take_full_grad() if u.full_grad is not None else self._zeros_full(u)
            first = self._launches[id(u)] == 1
            out = u.grad_shard if first else self._pool.take(u.shard_numel, self.grad_dtype, self.device)
            recv = self._take(u.shard_numel, group)
            self._pending.append(Pending(u, group.reduce_scatter_into(out, full, recv), out, full, recv))
        while len(self._pending) > MAX_IN_FLIGHT:
            self._complete(self._pending.pop(0))

    def _launch_direct(self, u: FlatUnit, group: Group) -> None:
        """Post u's reduce-scatter from its parameters' gradients as autograd left them (hybrid/zero/direct.py),
        each p.grad released here -- the Work keeps them until sent and added -- so a later micro-batch's backward
        starts fresh ones instead of adding into tensors on the wire. Stage 1: lands in place (the shard is
        flat_grad's own chunk), received into flat_grad's other chunk (the stage-1 gradient buffer the paper
        counts; no pooled receive buffer). Stage 2: as the flat path, the step's first reduction lands in the shard,
        later micro-batches' in a pooled buffer added to it."""
        grads = {id(p): p.grad for p in u.params if p.grad is not None}
        for p in u.params:
            p.grad = None
        if u.flat_grad is not None:  # stage 1
            out, recv, pooled = u.grad_shard, u.flat_grad.view(-1).chunk(2)[1 - group.rank], None
        else:
            first = self._launches[id(u)] == 1
            out = u.grad_shard if first else self._pool.take(u.shard_numel, self.grad_dtype, self.device)
            recv = pooled = self._pool.take(u.shard_numel, self.grad_dtype, self.device)
        self._pending.append(Pending(u, reduce_scatter_grads(group, u, grads, out, recv), out, recv=pooled))

    def _take(self, numel: int, group: Group) -> torch.Tensor | None:
        """A pooled receive buffer for a 2-rank exchange reduce-scatter (hybrid/comm.py), None otherwise."""
        return self._pool.take(numel, self.grad_dtype, self.device) if group.size == 2 else None

    def _zeros_full(self, u: FlatUnit) -> torch.Tensor:
        """Stages 2-3: the full gradient of a unit no hook gave a gradient (zeros)."""
        return self._pool.take(u.padded, self.grad_dtype, self.device).zero_()

    def _complete(self, p: Pending) -> None:
        p.work.wait()
        self._pool.give(p.recv)
        self._pool.give(p.full)
        if p.out is not None and p.out is not p.unit.grad_shard:
            p.unit.grad_shard.add_(p.out)  # accumulate over micro-batches
            self._pool.give(p.out)

    def _reap(self) -> None:
        """Complete the reductions at the front of the queue that have already finished (no waiting): frees their
        full-size gradients and results as soon as possible."""
        while self._pending and self._pending[0].work.done():
            self._complete(self._pending.pop(0))

    def _drain(self) -> None:
        while self._pending:
            self._complete(self._pending.pop(0))

    def begin_step(self, num_micro_batches: int) -> None:
        """Arm the hooks for a step of `num_micro_batches` backward passes."""
        self._m, self._armed, self._launches, self._seeded = num_micro_batches, True, {}, 0
        # stage 1 accumulates micro-batches in its flat buffer (bound p.grad): direct only with one micro-batch,
        # else autograd's gradients would be held through the step beside the buffer (twice the gradient memory)
        self._direct_step = bool(self._direct_units) and (self.cfg.stage == 2 or num_micro_batches == 1)
        for u in self.units:
            u.fired = 0

    def finish_backward(self, model: nn.Module | None = None, mesh: Mesh | None = None) -> None:
        """After the last backward: wait for the hooked reductions, then reduce the deferred units
        (tied embeddings; every unit under keep_gathered) after their TP and embedding-group sums."""
        self._drain()
        late = [u for u in self.units if u.deferred or self.cfg.keep_gathered]
        for u in late:  # slots no gradient reached: zeros before the TP and embedding-group sums read them
            if self._buffers_grads and u.flat_grad is not None:
                u.zero_unwritten(u.flat_grad)
        sync_partial_grads([p for u in late for p in u.params], self.mesh.tp, self._grad_of)
        sync_tied_embeddings(nn.ModuleList(self.chunks), self.mesh, self._grad_of)
        for u in late:
            self._launch(u)
        self._drain()
        if self.cfg.stage == 3:  # its memory between steps as before: the pool's buffers served this backward only
            self._pool.clear()
        if self.cfg.stage == 3 and self.cfg.keep_gathered:
            for u in self.units:
                u.free()
        self._armed = False
        self._check_every_unit_reduced()
        if self.reduction is not None:
            self.reduction.end_step()

    def _check_every_unit_reduced(self) -> None:
        per_mb = self._per_micro_batch
        for u in self.units:
            want = self._m if per_mb and not u.deferred else 1
            if self._launches.get(id(u), 0) != want:
                raise RuntimeError(f"ZeRO unit {u.name} was reduced {self._launches.get(id(u), 0)} times this step, "
                                   f"expected {want}: did every micro-batch run backward through it?")

    # --- the optimizer step ------------------------------------------------------------------
    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the last step's gradients. Without a compressor nothing is zeroed: each hook copies the first
        gradient of its slot (`FlatUnit.add_grad`; slots none reached are zeroed at the reduction) and each unit's
        first reduction of the step lands in its shard (stages 2-3) or in place (0-1)."""
        for u in self.units:
            self._pool.give(u.full_grad)  # a step abandoned before this unit's reduction
            u.full_grad = None
            u.written.clear()
            if self.reduction is None and self._buffers_grads:
                for p in u.params:
                    p.grad = None
                continue
            u.grad_shard.zero_()
            if u.flat_grad is not None:
                u.flat_grad.zero_()
            if u.flat_grad is not None and not self.cfg.accumulate_fp32_grads:
                u.bind_grads()
            else:
                for p in u.params:
                    p.grad = None

    @torch.no_grad()
    def step(self) -> StepReport:
        """Unscale and average the reduced gradients into fp32 master gradients, skip on fp16
        overflow, clip by the global norm, AdamW on the master shards, write the new values back
        to the compute-dtype parameters (stages 1-2: all-gathered to every rank)."""
        self.before_param_writes()
        self._make_master_grads()
        skipped = self.cfg.precision is Precision.FP16 and self._overflow()
        norm = None
        if not skipped:
            if self.opt_cfg.clip_grad > 0:
                norm = self._clip(self.opt_cfg.clip_grad)
            if self._steps_in_gather_order:
                self._step_and_gather()
            else:
                self.optimizer.step()
                self._write_back()
        self._update_loss_scale(skipped)
        for u in self.units:
            for v in u.views:
                v.grad = None
            if not self._master_grad_is_view(u):
                u.master_grad = None
        self.last_report = StepReport(grad_norm=norm, skipped=skipped, loss_scale=self.loss_scale)
        return self.last_report

    def _make_master_grads(self) -> None:
        """The master gradients: the DP sum / n is the mean over the global batch; / loss scale undoes fp16 scaling.

        Where the reduced shard is the master gradient and n x scale is a power of two (in practice always), the
        division is left to the fused AdamW kernel (`grad_scale`: it divides each gradient as it reads it, bit
        for bit as `div_` would) -- one pass over the gradients fewer. Dividing by a power of two is exact, so the
        clip norm taken on the undivided values and divided by it is the norm of the divided ones, bit for bit.
        Where backward already divided (`_seed_mean`: every micro-batch's loss seeded with 1 / n) nothing is left to
        divide: no pass, no `grad_scale`."""
        div = self.dp.size * self.loss_scale
        if self._seeded:
            if self._seeded != self._m:
                raise RuntimeError(f"ZeRO: {self._seeded} of this step's {self._m} backward passes were seeded with "
                                   "1 / dp: run every micro-batch's backward from the model's loss output")
            div = self.loss_scale
        divide = div != 1.0  # dp 1 at fp32, or seeded: the reduced gradients are the mean already
        fold = divide and _takes_grad_scale(self.optimizer) and _power_of_two(div)
        for u in self.units:
            if self._master_grad_is_view(u):
                u.master_grad = u.grad_shard.div_(div) if divide and not fold else u.grad_shard
            else:
                u.master_grad = u.grad_shard.to(u.master.device, torch.float32, copy=True)
                if divide and not fold:
                    u.master_grad.div_(div)
            for v, s in zip(u.views, u.segments):
                v.grad = u.master_grad[s.lo:s.hi]
        self._grad_div = div if fold else 1.0
        self.optimizer.grad_scale = (torch.tensor(div, dtype=torch.float32, device=self.units[0].master.device)
                                     if fold else None)

    def _all_ranks_sum(self, t: torch.Tensor, tag: str) -> torch.Tensor:
        """Sum over TP, PP and (when the optimizer state is sharded) DP: over every shard once."""
        t = t.to(self.device)
        self.mesh.tp.all_reduce(t, tag=tag)
        self.mesh.pp.all_reduce(t, tag=tag)
        if self.cfg.sharded or self.has_experts:  # experts differ across DP ranks (_expert_norm_weights)
            self.dp.all_reduce(t, tag=tag)
        return t

    def _overflow(self) -> bool:
        bad = sum(float(not torch.isfinite(u.master_grad).all()) for u in self.units)
        return self._all_ranks_sum(torch.tensor([bad], dtype=torch.float32), "overflow").item() > 0

    def _clip(self, max_norm: float) -> float:
        """||g|| over all TP, PP and DP shards, each logical element once (Segment.norm_weight);
        scale by max_norm / (||g|| + 1e-6) when that is < 1 (torch's clip_grad_norm_)."""
        # accumulated where the master gradients live, in fp64 without an fp64 copy of any segment, and read once
        # (a host read per segment was a device synchronisation per parameter)
        counted = [u.master_grad[s.lo:s.hi] for u in self.units for s in u.segments if s.norm_weight]
        # one multi-tensor call (no loop of kernels over parameters), each norm in fp64 without an fp64 copy,
        # summed where the gradients live and read once (a host read per segment synchronised per parameter)
        local = torch.stack(torch._foreach_norm(counted, 2, dtype=torch.float64)).square().sum() if counted else \
            torch.zeros((), dtype=torch.float64, device=self.units[0].master_grad.device)
        norm = math.sqrt(self._all_ranks_sum(local.reshape(1), "clip").item()) / self._grad_div
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            for u in self.units:
                u.master_grad.mul_(coef)
        return norm

    def _write_back(self) -> None:
        """The updated master shards into the compute-dtype parameters; stages 1-2 all-gather every unit to
        every rank -- posted in the next forward's order and left in flight when overlapping (the forward's
        hooks wait per block), else waited for here."""
        self.before_param_writes()  # a gather still in flight writes the buffers written below; the peer's reads
        if self.cfg.stage == 3:
            self._drop_stale_gathers()
        for u in (self._gather_order if self.overlaps_param_gather else self.units):
            if u.master is not u.shard:
                u.shard.copy_(u.master, non_blocking=self.pin)  # fp32 -> compute dtype, host -> device
            if self.cfg.stage in (1, 2):  # every rank needs the whole updated unit; u.shard is u.flat's own chunk
                work = self._all_gather(u)
                if self.overlaps_param_gather:
                    self._param_gathers[id(u)] = (work, None)
                else:
                    work.wait()

    @property
    def _steps_in_gather_order(self) -> bool:
        """`ZeroConfig.step_in_gather_order` where it applies: stages 1-2 overlapping the gathers, torch's own
        optimizer (it skips a parameter without a gradient), no compressor (1-bit Adam steps its own way)."""
        return self.cfg.step_in_gather_order and self.overlaps_param_gather and self.reduction is None and \
            isinstance(self.optimizer, (torch.optim.AdamW, torch.optim.SGD))

    def _step_and_gather(self) -> None:
        """The optimizer step in the next forward's order, one call per group of units a forward hook waits for
        (`_gather_groups`: the inputs, each block, the output side), each unit's all-gather posted as soon as its
        group is updated: the embedding's gather (the first the next forward waits for) starts while the blocks
        and the head step. A call per group, not per unit: a bucket a call would be ~1,100 calls a step for a 7B
        model's 25 MB buckets, each scanning every parameter. Each call steps only the views that hold a gradient
        (torch's optimizers skip the rest), and the kernel is elementwise per parameter, so every parameter steps
        bit for bit as in one call."""
        self.before_param_writes()
        grads = {id(v): v.grad for u in self._gather_order for v in u.views}
        for u in self._gather_order:
            for v in u.views:
                v.grad = None
        for group in self._gather_groups:
            views = [v for u in group for v in u.views]
            for v in views:
                v.grad = grads[id(v)]
            self.optimizer.step()
            for v in views:
                v.grad = None
            for u in group:
                if u.master is not u.shard:
                    u.shard.copy_(u.master, non_blocking=self.pin)
                self._param_gathers[id(u)] = (self._all_gather(u), None)

    def _drop_stale_gathers(self) -> None:
        """Stage 3: a unit gathered (or prefetched) before this step and not freed holds the old parameters; free
        it so its next use gathers the new ones (a unit whose backward computed no gradient for it is still held:
        `_on_grad` frees a unit when its gradients are in)."""
        if self.cfg.keep_gathered:
            return
        for u in self.units:
            if u.gather_work is not None:
                u.gather_work.wait()
                u.gather_work = None
            if u.gathered:
                u.free()

    def _update_loss_scale(self, skipped: bool) -> None:
        """Dynamic loss scaling: halve on overflow (the step is skipped), double after a window of
        good steps."""
        if self.cfg.precision is not Precision.FP16:
            return
        if skipped:
            self.skipped_steps += 1
            self.good_steps = 0
            self.loss_scale = max(self.loss_scale / 2, self.cfg.min_loss_scale)
        else:
            self.good_steps += 1
            if self.good_steps % self.cfg.loss_scale_window == 0:
                self.loss_scale *= 2

    @contextmanager
    def gathered(self):
        """Every unit's full parameters inside the block (to read or save the weights): stage 3 gathers them,
        stages 1-2 wait for the post-step all-gathers still in flight."""
        self.wait_params()
        if self.cfg.stage != 3:
            yield
            return
        for u in self.units:
            u.finish_gather(self._group(u), self.device)
        try:
            yield
        finally:
            for u in self.units:
                u.free()

    # --- accounting ----------------------------------------------------------------------------
    @property
    def numel(self) -> int:
        """Psi: parameters of this rank (its TP/PP share), unpadded."""
        return sum(u.numel for u in self.units)

    @property
    def padded_numel(self) -> int:
        return sum(u.padded for u in self.units)

    # --- checkpoints (hybrid/checkpoint) ------------------------------------------------------
    def state_dict(self, optimizer: bool = True, names: dict[int, str] | None = None) -> dict[str, object]:
        """The model's fp32 master weights (and with `optimizer` Adam's moments, step and loss scaler) as a sharded
        state dict (hybrid/stateful.py; the keys and pieces: hybrid/zero/state.py). `names`: id(param) -> global
        name (default: the model's own)."""
        from hybrid.zero import state
        return state.state_dict(self, optimizer, names)

    def load_state_dict(self, state_dict: dict[str, object]) -> None:
        """After a checkpoint filled `state_dict()`'s pieces: the step, the loss scaler, the parameters."""
        from hybrid.zero import state
        self.before_param_writes()
        state.load_state_dict(self, state_dict)

    @torch.no_grad()
    def sync_params_from_master(self) -> None:
        """After the fp32 master shards were loaded from a checkpoint: rebuild the compute-dtype
        parameters from them, exactly as after an optimizer step (cast, copy to the device, stages
        1-2 all-gather; stage 3 gathers when the parameters are next used)."""
        self._write_back()


def _in_backward() -> bool:
    """True while autograd runs a backward pass: a forward hook firing then belongs to activation recomputation."""
    return torch._C._current_graph_task_id() != -1


def _takes_grad_scale(optimizer: torch.optim.Optimizer) -> bool:
    """torch's fused AdamW divides each gradient by `optimizer.grad_scale` as it reads it (what GradScaler uses);
    any other kernel (DeepSpeed's CPU Adam, the per-tensor loop) gets gradients already divided."""
    return isinstance(optimizer, torch.optim.AdamW) and bool(optimizer.defaults.get("fused"))


def _power_of_two(x: float) -> bool:
    m, _ = math.frexp(x)
    return x > 0 and m == 0.5


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def cpu_adamw(groups: list[dict], which: CpuAdam, lr: float, betas: tuple[float, float],
              eps: float) -> tuple[torch.optim.Optimizer, str]:
    """DeepSpeed's CPU Adam (AVX kernel, one pass over m, v and the weights) when asked for or
    when `auto` and it builds; torch's fused CPU AdamW otherwise."""
    if which is CpuAdam.TORCH_LOOP:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, foreach=False), "torch-loop"
    if which is not CpuAdam.TORCH:
        from hybrid.zero.cpu_adam_build import StaleBuildLock, cpu_adam_build
        try:
            from deepspeed.ops.adam import DeepSpeedCPUAdam
            with cpu_adam_build(lambda line: print(line, flush=True)):  # a first build says so; a stale lock is named
                return DeepSpeedCPUAdam(groups, lr=lr, betas=betas, eps=eps, adamw_mode=True), "deepspeed-cpu-adam"
        except StaleBuildLock as e:  # the lock's line, and this kernel's own way around it
            if which is CpuAdam.DEEPSPEED:
                from hybrid.cliutil import fail
                raise fail(f"train.py: error: {e}, or pass --cpu-adam torch") from None
            print(f"train.py: warning: {e}, or pass --cpu-adam torch; using torch's fused AdamW meanwhile", flush=True)
        except Exception as e:  # no compiler, no deepspeed: fall back, unless it was asked for by name
            if which is CpuAdam.DEEPSPEED:
                raise RuntimeError(f"--cpu-adam deepspeed: DeepSpeedCPUAdam failed to build: {e}") from e
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=True), "torch-fused"
