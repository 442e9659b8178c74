"""One training step: micro-batches, gradient synchronisation, the optimizer.

    loss = train_step(model, batches, optimizer, mesh, averager)

Each micro-batch's loss is scaled by 1/m before backward, so the accumulated gradient is the
gradient of the mean loss over this rank's rows; averaging over DP then gives the gradient of the
mean over the global batch -- exactly what one process computes on the whole batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from hybrid.dp import GradAverager
from hybrid.mesh import Mesh
from hybrid.tp import sync_partial_grads


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
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)


def train_step(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], optimizer: torch.optim.Optimizer,
               mesh: Mesh, averager: GradAverager, lr: float | None = None) -> float:
    """Forward/backward every micro-batch, sync gradients over TP (partial sums) and DP (average),
    step. Returns the loss averaged over the global batch (the same number on every rank)."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=mesh.device)
    for inputs, labels in batches:
        loss = model(inputs.to(mesh.device), labels.to(mesh.device)) / len(batches)
        loss.backward()
        total += loss.detach()
    sync_partial_grads(model.parameters(), mesh.tp)
    averager()
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    optimizer.step()
    return mesh.dp.all_reduce(total, tag="metrics").item() / mesh.dp.size
