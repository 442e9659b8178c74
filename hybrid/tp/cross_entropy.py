"""Cross-entropy over vocabulary-parallel logits, never gathering the full (B, T, V) tensor.

Rank i holds logits z[:, V_i] for its vocabulary slice. For a token with target y:

    loss = log sum_v exp(z_v) - z_y
         = log sum_i sum_{v in V_i} exp(z_v - m) + m - z_y,      m = max_v z_v

so three all-reduces of (B, T) numbers suffice: MAX of the local maxima, SUM of the local
exp-sums, SUM of z_y (only the rank whose slice holds y contributes it). The gradient
d loss / d z_v = softmax(z)_v - [v == y] is local to each rank -- no communication backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hybrid.comm import Group

IGNORE_INDEX = -100


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, vocab_start, group):
        logits = logits.float()
        local_max = logits.max(dim=-1).values
        global_max = group.all_reduce(local_max.clone(), op=dist.ReduceOp.MAX)
        shifted = logits - global_max.unsqueeze(-1)  # (B, T, V/t)

        local_t = target - vocab_start
        mine = (local_t >= 0) & (local_t < logits.shape[-1])
        idx = local_t.clamp(0, logits.shape[-1] - 1).unsqueeze(-1)
        z_target = torch.where(mine, torch.gather(shifted, -1, idx).squeeze(-1), 0.0)  # not *mine: -inf*0
        z_target = group.all_reduce(z_target.contiguous())

        exp = shifted.exp()
        sum_exp = group.all_reduce(exp.sum(dim=-1))
        loss = sum_exp.log() - z_target  # (B, T)

        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), idx, mine)
        return loss

    @staticmethod
    def backward(ctx, g):
        softmax, idx, mine = ctx.saved_tensors
        grad = softmax  # reuse the buffer: softmax - onehot(target on this rank)
        grad.scatter_add_(-1, idx, -mine.to(grad.dtype).unsqueeze(-1))
        return grad.mul_(g.unsqueeze(-1)), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab_start: int,
                                 group: Group, ignore_index: int = IGNORE_INDEX, reduction: str = "mean") -> torch.Tensor:
    """Mean (`reduction` "sum": sum) of the loss over the tokens whose target is not `ignore_index` (as
    F.cross_entropy)."""
    if group.size == 1:  # the whole vocabulary is here: torch's fused kernel
        return F.cross_entropy(logits.float().flatten(0, -2), target.flatten(), ignore_index=ignore_index,
                               reduction=reduction)
    keep = target != ignore_index
    per_token = _VocabParallelCrossEntropy.apply(logits, target.masked_fill(~keep, 0), vocab_start, group)
    total = (per_token * keep).sum()
    return total if reduction == "sum" else total / keep.sum().clamp(min=1)
