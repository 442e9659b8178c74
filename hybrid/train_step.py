"""One training step: micro-batches, gradient synchronisation, the optimizer.

    loss = train_step(model, batches, zero_optimizer, mesh, runner=runner)     # train.py: ZeroOptimizer syncs
    loss = train_step(model, batches, torch_adamw, mesh, averager)             # tests' reference: GradAverager

Each micro-batch's loss is scaled by 1/m before backward, so the accumulated gradient is the
gradient of the mean loss over this rank's rows; averaging over DP then gives the gradient of the
mean over the global batch -- exactly what one process computes on the whole batch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch
import torch.nn as nn

from hybrid.cliutil import check_number
from hybrid.mesh import Mesh
from hybrid.cp.data import seq_kwargs
from hybrid.moe import runtime as moe_runtime
from hybrid.tp.sharding import param_grad


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with Megatron's defaults and flag names.

    Attributes:
        lr: peak learning rate (`--lr`).
        min_lr: floor of the decay (`--min-lr`).
        weight_decay: decoupled weight decay on matrices; biases and norms are not decayed
            (`--weight-decay`).
        beta1, beta2, eps: Adam (`--adam-beta1`, `--adam-beta2`, `--adam-eps`).
        warmup_iters: linear warm-up steps (`--lr-warmup-iters`), Megatron's: step k <= warmup_iters runs at
            lr k / warmup_iters (step 0 at 0, as Megatron's init_lr 0).
        decay_style: "constant", "linear" or "cosine" (`--lr-decay-style`), decaying to min_lr at decay_iters.
        train_iters: total steps (`--train-iters`).
        clip_grad: clip gradients to this global L2 norm, over every TP, PP and DP shard, each
            logical element once (`--clip-grad`); 0 disables. Applied by the ZeRO optimizer.
        decay_iters: the step at which the decay reaches min_lr (`--lr-decay-iters`, Megatron's; None:
            train_iters). A run extended by a larger --train-iters keeps its schedule when this stays the same;
            past it the rate stays at min_lr.
        optimizer: "adam" (AdamW) or "sgd" (torch's SGD, coupled weight decay as Megatron's) (`--optimizer`).
        sgd_momentum: SGD's momentum (`--sgd-momentum`).
    """

    lr: float = 1e-3
    min_lr: float = 0.0
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    warmup_iters: int = 0
    decay_style: str = "cosine"
    train_iters: int = 100
    clip_grad: float = 0.0
    decay_iters: int | None = None
    optimizer: str = "adam"
    sgd_momentum: float = 0.9

    DECAY_STYLES = ("constant", "linear", "cosine")
    OPTIMIZERS = ("adam", "sgd", "onebit-adam")

    def __post_init__(self) -> None:
        """Each field on its own (train.py's flags are checked before, with the cross-field rules): a decay style
        or optimizer not in the list was run as cosine / Adam without a word (lr_at's `else`), a string number
        failed mid-step. ValueError naming the field and its flag."""
        for name, choices, flag in (("decay_style", self.DECAY_STYLES, "--lr-decay-style"),
                                    ("optimizer", self.OPTIMIZERS, "--optimizer")):
            if getattr(self, name) not in choices:
                raise ValueError(f"OptimizerConfig.{name} ({flag}) must be one of {', '.join(choices)}, got "
                                 f"{getattr(self, name)!r}")
        for name, high in (("lr", None), ("min_lr", None), ("weight_decay", None), ("eps", None),
                           ("clip_grad", None), ("beta1", 1), ("beta2", 1), ("sgd_momentum", 1)):
            check_number(f"OptimizerConfig.{name}", getattr(self, name), 0, high, high_open=True)
        for name, low in (("warmup_iters", 0), ("train_iters", 1), ("decay_iters", 1)):
            if not (name == "decay_iters" and self.decay_iters is None):
                check_number(f"OptimizerConfig.{name}", getattr(self, name), low, integer=True)

    def lr_at(self, it: int) -> float:
        """The rate of step `it` (0-based), megatron-core's OptimizerParamScheduler.get_lr at num_steps = it
        (Megatron counts in samples, warm-up and decay steps times the global batch: the same ratios):

            it <= W (W > 0):   lr it / W
            constant:          lr
            it > D:            min_lr
            else:              min_lr + c (lr - min_lr),  r = (it - W) / (D - W),
                               c = 1 - r (linear), (1 + cos(pi r)) / 2 (cosine)

        with W = warmup_iters, D = decay_iters (default train_iters). A function of `it` alone: a resumed run
        with the same W and D steps at the rates an uninterrupted one does."""
        w, d = self.warmup_iters, self.decay_iters or self.train_iters
        if w > 0 and it <= w:
            return self.lr * it / w
        if self.decay_style == "constant":
            return self.lr
        if it > d:
            return self.min_lr
        ratio = (it - w) / (d - w)  # it > w and it <= d here, so d > w
        coeff = 1.0 - ratio if self.decay_style == "linear" else 0.5 * (1 + math.cos(math.pi * ratio))
        return self.min_lr + coeff * (self.lr - self.min_lr)


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # fused: the kernel ZeroOptimizer runs (one pass; elementwise, so per-tensor here = flat shards there, bit for bit)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=True)


class LocalForwardBackward:
    """No pipeline: forward and backward each micro-batch in turn on one model, loss scaled by 1/m.

    `record_timeline`: keep the latest step's F / B of each micro-batch in `events` (the pipeline executor's
    TimelineEvent, chunk 0), so `--timeline` at pp 1 draws the same F0 B0 F1 B1 ... track as one pipeline stage."""

    def __init__(self, model: nn.Module, device: torch.device, record_timeline: bool = False):
        self.model, self.device = model, device
        self.record_timeline = record_timeline
        self.events: list = []  # hybrid.pipeline.executor.TimelineEvent, the latest step's

    def forward_backward(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        self.events = []
        for mb, (inputs, labels, *info) in enumerate(batches):  # info: packed documents' SequenceInfo (hybrid/cp)
            t0 = time.time()
            loss = self.model(inputs.to(self.device), labels.to(self.device), **seq_kwargs(info, self.device)) / len(batches)
            t1 = time.time()
            loss.backward()
            self._record(mb, t0, t1, time.time())
            total += loss.detach()
        return total

    def _record(self, mb: int, t0: float, t1: float, t2: float) -> None:
        """Forward ran t0..t1, backward t1..t2 (wall-clock seconds, as the executor's events)."""
        if self.record_timeline:
            from hybrid.pipeline.executor import TimelineEvent
            self.events += [TimelineEvent("forward", mb, 0, t0, t1), TimelineEvent("backward", mb, 0, t1, t2)]


class ForwardBackward(Protocol):
    def forward_backward(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor: ...


class GradSync(Protocol):
    """Who makes gradients complete across ranks: `hybrid.zero.ZeroOptimizer` (from backward hooks, and also the
    optimizer: what train.py runs), or `hybrid.dp.GradAverager` (after backward: the tests' unsharded-DP
    reference, never a training path)."""

    loss_scale: float  # the loss was multiplied by this before backward (fp16); 1 otherwise

    def begin_step(self, num_micro_batches: int) -> None: ...

    def finish_backward(self, model: nn.Module, mesh: Mesh) -> None: ...


@torch.no_grad()
def sync_tied_embeddings(model: nn.Module, mesh: Mesh,
                         grad: Callable[[nn.Parameter], torch.Tensor | None] = param_grad) -> None:
    """GPT-2's input embedding (first stage) and LM head (last stage) are one logical weight held
    twice: sum the two gradients over the embedding group so both copies take the same step.
    `grad(w)` is the tensor holding w's gradient (p.grad, or ZeRO's fp32 buffer slot)."""
    tied = [m.tied_embedding_weight() for m in model.modules() if hasattr(m, "tied_embedding_weight")]
    grads = [g for g in (grad(w) for w in tied if w is not None) if g is not None]
    if not grads or (len(grads) == 1 and mesh.embedding.size == 1):
        return
    total = sum(grads)  # both copies on this rank when pp = 1 with v chunks, or ZBV's V (stages 0 and 2pp-1)
    if len(grads) == 1:  # the other copy is on the other end of the embedding group
        mesh.embedding.all_reduce(total)
    for g in grads:
        g.copy_(total)


def train_step(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], optimizer: torch.optim.Optimizer,
               mesh: Mesh, averager: GradSync | None = None, lr: float | None = None,
               runner: ForwardBackward | None = None) -> float:
    """Forward/backward every micro-batch (through the pipeline executor when given), sync gradients
    over TP (partial sums), the embedding group (tied weights) and DP (average), then step.
    `averager` None: the optimizer syncs its own gradients (a ZeroOptimizer).
    Returns the loss averaged over the global batch (the same number on every rank)."""
    sync = averager if averager is not None else optimizer
    model.train()
    optimizer.zero_grad(set_to_none=True)
    sync.begin_step(len(batches))
    moe_runtime.set_aux_grad_scale(model, sync.loss_scale / len(batches))  # MoE aux losses, as the LM loss
    loss = (runner or LocalForwardBackward(model, mesh.device)).forward_backward(batches)
    sync.finish_backward(model, mesh)
    scale = sync.loss_scale  # the scale backward used: an fp16 overflow step halves it in step()
    loss = _reduce_loss(loss, scale, mesh)
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    optimizer.step()
    moe_runtime.after_step(model, mesh)  # DeepSeek-V3's expert-bias update (MoE models with the bias only)
    return loss.item() / mesh.dp_cp.size


def _reduce_loss(loss: torch.Tensor, scale: float, mesh: Mesh) -> torch.Tensor:
    """The step's loss summed over PP (only the last stage holds it) and DP x CP (a CP rank's loss is CP x its
    share of the sequence's mean: hybrid/cp/loss.py), unscaled by the loss scale backward used.

    Reduced before the optimizer step, as Megatron averages its losses before its step: at ZeRO 1-2 the step
    posts the parameter all-gathers that the next forward waits for (ZeroConfig.overlap_param_gather), and a
    collective posted after them on the same group completes after them (gloo sends a pair's messages in
    order; NCCL runs a communicator's kernels in order) -- a loss all-reduce after the step waited for every
    gather at the end of the step, where nothing overlapped them (docs/zero.md, round 11). `.item()` is left
    to the caller, after the step, so a GPU does not sync before launching it."""
    loss = loss.float() / scale
    mesh.pp.all_reduce(loss, tag="metrics")
    return mesh.dp_cp.all_reduce(loss, tag="metrics")
