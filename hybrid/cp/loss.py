"""The language-model loss of a context-parallel rank, exact over the whole sequence.

The unsharded loss of a micro-batch is the mean over its N tokens that have a label, L = (1/N) sum_t l_t. CP rank
r holds the tokens S_r (a partition of them), so

    L = sum_r (1/N) sum_{t in S_r} l_t,       N = sum_r N_r   (one all-reduce of a count over CP)

Each rank returns CP x its term, L_r = CP (1/N) sum_{t in S_r} l_t: gradients are then averaged over DP x CP
(hybrid/zero/engine.py divides the dp_cp sum by dp x cp), and (1 / (dp CP)) sum_r dL_r = (1/dp) dL -- the DP
average of the exact gradient, as Megatron scales its loss by cp_size. The logged loss is the same average of
L_r over dp_cp. Ranks whose tokens have fewer labels (the sequence's last token has none; packed documents,
ignored tokens) are weighted exactly, not by 1/CP.
"""

from __future__ import annotations

import torch

from hybrid.comm import Group
from hybrid.tp.cross_entropy import IGNORE_INDEX, vocab_parallel_cross_entropy


def context_parallel_loss(logits: torch.Tensor, labels: torch.Tensor, vocab_start: int, tp: Group,
                          cp: Group) -> torch.Tensor:
    """CP x (sum of this rank's token losses) / (tokens with a label over the CP group)."""
    total = vocab_parallel_cross_entropy(logits, labels, vocab_start, tp, IGNORE_INDEX, reduction="sum")
    count = (labels != IGNORE_INDEX).sum().to(torch.float32).reshape(1)
    cp.all_reduce(count)
    return total * (cp.size / count.clamp(min=1)[0])
