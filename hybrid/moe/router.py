"""The router: scores, the top-k choice, and the losses that balance the experts' loads.

For N tokens x (N, h) and E experts, logits = x W_r^T (N, E). Two orders of softmax and top-k exist:

    pre-softmax  (transformers' Mixtral, Qwen2-MoE)  s = softmax(logits); keep the k largest s; optionally
                                                     divide them by their sum (Mixtral always, Qwen2-MoE
                                                     with norm_topk_prob)
    post-softmax (Megatron's default)                keep the k largest logits; softmax over those k

With renormalisation the two are the same function (softmax restricted to k entries); without it they differ.
DeepSeek-V3 scores with a sigmoid and chooses with s + b, b a per-expert bias that is not trained by gradient
but nudged after every step towards even loads (auxiliary-loss-free balancing, Wang et al. 2024):

    b_e <- b_e + u * sign(mean_e' n_e' - n_e)       n_e: tokens routed to e this step, over the whole batch

The weights are then gathered from s (not s + b), so the bias changes only which experts are chosen.

The losses (each a function of the router's outputs, tested against transformers' and Megatron's own):

    switch (Megatron's aux_loss)   coeff * E / (k T^2) * sum_e n_e P_e,    P_e = sum_t s_te (this rank's tokens)
    z-loss (ST-MoE)                coeff * mean_t logsumexp(logits_t)^2
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from hybrid.tp import TPContext
from hybrid.tp.layers import normal_init
from hybrid.tp.sharding import set_spec

SOFTMAX = "softmax"
SIGMOID = "sigmoid"


@dataclass
class Routing:
    """The router's decision for N tokens.

    Attributes:
        logits: (N, E) fp32 router logits.
        scores: (N, E) fp32 score distribution the balancing loss reads (softmax, or the sigmoid scores
            normalised to sum 1 per token, as Megatron's compute_routing_scores_for_aux_loss).
        experts: (N, k) int64 ids of the chosen experts.
        probs: (N, k) weights the chosen experts' outputs are summed with (differentiable).
    """

    logits: torch.Tensor
    scores: torch.Tensor
    experts: torch.Tensor
    probs: torch.Tensor


def route(logits: torch.Tensor, k: int, pre_softmax: bool = True, norm_topk: bool = True,
          score_function: str = SOFTMAX, bias: torch.Tensor | None = None,
          chosen: torch.Tensor | None = None) -> Routing:
    """Top-k routing of (N, E) logits (see the module docstring). `bias` (E,) is added to the scores for the
    choice only (expert bias); it needs scores to choose from: pre-softmax or sigmoid. `chosen` (N, k) replays
    an earlier choice (activation recomputation): the weights are recomputed, the experts are not re-chosen."""
    logits = logits.float()
    pick = (lambda scores: chosen) if chosen is not None else (lambda scores: _top(scores, k))
    if score_function == SIGMOID:
        s = torch.sigmoid(logits)
        experts = pick(s if bias is None else s + bias)
        probs = s.gather(1, experts)
        if norm_topk and k > 1:
            probs = probs / (probs.sum(-1, keepdim=True) + 1e-20)
        return Routing(logits, s / (s.sum(-1, keepdim=True) + 1e-20), experts, probs)
    s = torch.softmax(logits, dim=-1)
    if pre_softmax:
        experts = pick(s if bias is None else s + bias)
        probs = s.gather(1, experts)
        if norm_topk:
            probs = probs / probs.sum(-1, keepdim=True)
    else:
        if bias is not None:
            raise ValueError("--moe-router-enable-expert-bias needs scores to choose with: a pre-softmax or "
                             "sigmoid router")
        experts = pick(logits)
        probs = torch.softmax(logits.gather(1, experts), dim=-1)
    return Routing(logits, s, experts, probs)


@torch.no_grad()
def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest entries' ids per row (no autograd node: the weights are gathered afterwards, so a replayed
    choice saves the same tensors for backward)."""
    return torch.topk(scores, k, dim=-1).indices


def tokens_per_expert(experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """(E,) fp32: how many of the (N, k) routing slots chose each expert."""
    return torch.bincount(experts.flatten(), minlength=num_experts).float()


def switch_aux_loss(scores: torch.Tensor, counts: torch.Tensor, total_tokens: int, k: int,
                    coeff: float) -> torch.Tensor:
    """Megatron's switch_load_balancing_loss_func: coeff * E / (k T^2) * sum_e counts_e * sum_t scores_te.

    `scores` (N, E) are this rank's tokens; `counts` (E,) and `total_tokens` T cover every rank the
    micro-batch's tokens are spread over (the TP group under sequence parallelism), so the sum of the
    ranks' values is the micro-batch's loss."""
    E = scores.shape[-1]
    return (scores.sum(0) * counts).sum() * (E * coeff / (k * total_tokens * total_tokens))


def seq_aux_loss(scores: torch.Tensor, counts: torch.Tensor, seq_tokens: int, k: int,
                 coeff: float) -> torch.Tensor:
    """The switch loss of each sequence, averaged over the B sequences (Megatron's seq_aux_loss).
    scores (B, T_local, E); counts (B, E) per sequence over its T = `seq_tokens` tokens."""
    B, _, E = scores.shape
    per_seq = (scores.sum(1) * counts).sum(-1) * (E * coeff / (k * seq_tokens * seq_tokens))
    return per_seq.sum() / B


def hf_aux_weights(counts_all_layers: torch.Tensor, layers: int, tokens: int, coeff: float) -> torch.Tensor:
    """transformers' load_balancing_loss_func, pooled over L layers: loss = coeff * E * sum_e (C_e / (L T)) *
    (P_e / (L T)) with C, P summed over the layers, is linear in each layer's P (sum_t s_te): this returns
    d loss / d P_e = coeff * E * C_e / (L T)^2, the same for every layer."""
    E = counts_all_layers.shape[-1]
    return counts_all_layers * (coeff * E / float(layers * tokens) ** 2)


def z_loss(logits: torch.Tensor, coeff: float) -> torch.Tensor:
    """ST-MoE's router z-loss: coeff * mean_t logsumexp(logits_t)^2 (Megatron's z_loss_func)."""
    return torch.logsumexp(logits, dim=-1).square().mean() * coeff


@torch.no_grad()
def updated_expert_bias(bias: torch.Tensor, counts: torch.Tensor, rate: float) -> torch.Tensor:
    """DeepSeek-V3's update (Megatron's get_updated_expert_bias): b + rate * sign(mean(counts) - counts);
    `counts` over the whole step and batch."""
    return bias + torch.sign(counts.mean() - counts) * rate


class Router(nn.Module):
    """logits = x W^T with W (E, h), replicated on every rank of the layer (its gradient is a partial sum over
    TP under sequence parallelism, where each rank routes its own T/t tokens). `expert_bias` (E,) fp32 buffer:
    DeepSeek-V3's balancing bias (zeros, updated by `updated_expert_bias`), None when off."""

    def __init__(self, hidden: int, num_experts: int, tp: TPContext, expert_bias: bool = False):
        super().__init__()
        self.weight = set_spec(nn.Parameter(torch.zeros(num_experts, hidden)), tp.replicated_spec(),
                               normal_init(0.02))
        self.register_buffer("expert_bias", torch.zeros(num_experts) if expert_bias else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, h) -> (N, E) logits in the compute dtype (the routing math takes them to fp32)."""
        return F.linear(x, self.weight)
