"""Dispatch as data: which rows go to which expert, as pure functions of the routing map and the counts.

Routing gives each of N tokens k experts, i.e. N k *slots*; slot j = t k + i is token t's i-th choice.
Dispatch sorts the kept slots by expert (tokens in their order within an expert, as Megatron's permute):

    rows    (R,)  slot id of each dispatched row, experts' blocks one after another; -1 = a padding row
    counts  (E,)  rows per expert (padding included): expert e's block is rows[off_e : off_e + counts_e]

The expert computation then runs on x[rows // k] and the combine adds each row's output, times its slot's
probability, back into its token: y_t = sum_{rows of t} p_slot * expert(x_t). Nothing here communicates;
the expert-parallel dispatchers (hybrid/moe/dispatcher.py) move these blocks between ranks.

Capacity (Lepikhin et al. 2020, Megatron's --moe-expert-capacity-factor): each expert takes at most
C = ceil(factor * N k / E) rows; beyond that the slots with the lowest probabilities are dropped (their
tokens get no output from that expert). Padding makes every expert's block exactly C rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Dispatch:
    """Rows sorted by expert (see the module docstring)."""

    rows: torch.Tensor
    counts: torch.Tensor

    @property
    def num_rows(self) -> int:
        return self.rows.numel()


def capacity(num_tokens: int, num_experts: int, k: int, factor: float) -> int:
    """Rows per expert: ceil(factor * N k / E) (Megatron's get_capacity)."""
    return math.ceil(num_tokens * k / num_experts * factor)


def capacity_keep(probs: torch.Tensor, experts: torch.Tensor, num_experts: int, cap: int) -> torch.Tensor:
    """(N, k) bool: the slots each expert keeps, at most `cap` per expert, the highest probabilities first
    (Megatron's drop policy "probs"; ties by lower token id)."""
    N = probs.shape[0]
    if cap >= N:
        return torch.ones_like(experts, dtype=torch.bool)
    dense = torch.full((N, num_experts), -1.0, dtype=torch.float32, device=probs.device)
    dense.scatter_(1, experts, probs.detach().float())  # -1 where not routed: never above a probability
    kept = torch.zeros_like(dense, dtype=torch.bool)
    order = torch.sort(dense, dim=0, descending=True, stable=True).indices[:cap]  # (cap, E) token ids
    kept.scatter_(0, order, True)
    return kept.gather(1, experts) & (dense.gather(1, experts) >= 0)


def permutation(experts: torch.Tensor, num_experts: int, keep: torch.Tensor | None = None,
                pad_to: int | None = None) -> Dispatch:
    """The dispatch of an (N, k) routing map: kept slots sorted by expert, token order within each expert;
    `pad_to` pads every expert's block to that many rows (padding rows are -1)."""
    slots = experts.flatten()
    ids = torch.arange(slots.numel(), device=slots.device)
    if keep is not None:
        ids, slots = ids[keep.flatten()], slots[keep.flatten()]
    order = torch.sort(slots, stable=True).indices
    rows, counts = ids[order], torch.bincount(slots, minlength=num_experts)
    if pad_to is None:
        return Dispatch(rows, counts)
    if counts.numel() and int(counts.max()) > pad_to:
        raise ValueError(f"an expert got {int(counts.max())} rows, more than the capacity {pad_to}: drop first")
    padded = torch.full((num_experts, pad_to), -1, dtype=rows.dtype, device=rows.device)
    pos = torch.arange(rows.numel(), device=rows.device) - torch.repeat_interleave(
        torch.cumsum(counts, 0) - counts, counts)  # each row's place within its expert's block
    padded[torch.repeat_interleave(torch.arange(num_experts, device=rows.device), counts), pos] = rows
    return Dispatch(padded.flatten(), torch.full_like(counts, pad_to))


def expert_major(counts: torch.Tensor) -> torch.Tensor:
    """Reorder rows received from S source ranks, each sending blocks for experts 0..E_l-1 in that order
    ((S, E_l) counts: rank-major), into expert-major order (expert 0's rows from every source, then
    expert 1's, ...): the index into the received rows. Its inverse (argsort) undoes it."""
    S, El = counts.shape
    flat = counts.flatten()
    starts = torch.cumsum(flat, 0) - flat  # start of block (s, e) in the received buffer
    by_expert = counts.t().flatten()  # blocks in (e, s) order
    block_starts = starts.view(S, El).t().flatten()
    return torch.repeat_interleave(block_starts - (torch.cumsum(by_expert, 0) - by_expert), by_expert) + \
        torch.arange(int(by_expert.sum()), device=counts.device)


def rank_splits(counts: torch.Tensor, ranks: int) -> torch.Tensor:
    """Rows bound for each of `ranks` expert-parallel ranks; rank r holds experts [r E/ranks, (r+1) E/ranks)."""
    return counts.view(ranks, -1).sum(1)
