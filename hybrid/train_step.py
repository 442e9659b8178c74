"""One training step: micro-batches, gradient synchronisation, the optimizer.

    loss = train_step(model, batches, optimizer, mesh, averager)

Each micro-batch's loss is scaled by 1/m before backward, so the accumulated gradient is the
gradient of the mean loss over this rank's rows; averaging over DP then gives the gradient of the
mean over the global batch -- exactly what one process computes on the whole batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch
import torch.nn as nn

from hybrid.mesh import Mesh
from hybrid.cp.data import seq_kwargs
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
        warmup_iters: linear warm-up steps (`--lr-warmup-iters`).
        decay_style: "constant" or "cosine" (`--lr-decay-style`), decaying to min_lr at train_iters.
        train_iters: total steps (`--train-iters`).
        clip_grad: clip gradients to this global L2 norm, over every TP, PP and DP shard, each
            logical element once (`--clip-grad`); 0 disables. Applied by the ZeRO optimizer.
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

    def lr_at(self, it: int) -> float:
        if it < self.warmup_iters:
            return self.lr * (it + 1) / self.warmup_iters
        if self.decay_style == "constant":
            return self.lr
        progress = (it - self.warmup_iters) / max(1, self.train_iters - self.warmup_iters)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # fused: the kernel ZeroOptimizer runs (one pass; elementwise, so per-tensor here = flat shards there, bit for bit)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=True)


class LocalForwardBackward:
    """No pipeline: forward and backward each micro-batch in turn on one model, loss scaled by 1/m."""

    def __init__(self, model: nn.Module, device: torch.device):
        self.model, self.device = model, device

    def forward_backward(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        for inputs, labels, *info in batches:  # info: a SequenceInfo with packed documents (hybrid/cp/data.py)
            loss = self.model(inputs.to(self.device), labels.to(self.device), **seq_kwargs(info, self.device)) / len(batches)
            loss.backward()
            total += loss.detach()
        return total


class ForwardBackward(Protocol):
    def forward_backward(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor: ...


class GradSync(Protocol):
    """Who makes gradients complete across ranks: `GradAverager` (after backward) or
    `hybrid.zero.ZeroOptimizer` (from backward hooks, and also the optimizer)."""

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
    loss = (runner or LocalForwardBackward(model, mesh.device)).forward_backward(batches)
    sync.finish_backward(model, mesh)
    scale = sync.loss_scale  # the scale backward used: an fp16 overflow step halves it in step()
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    optimizer.step()
    loss = loss.float() / scale
    mesh.pp.all_reduce(loss, tag="metrics")  # only the last stage holds it
    # over DP x CP: a CP rank's loss is CP x its share of the sequence's mean (hybrid/cp/loss.py)
    return mesh.dp_cp.all_reduce(loss, tag="metrics").item() / mesh.dp_cp.size
