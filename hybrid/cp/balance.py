"""Causal load balancing: which tokens of a sequence each context-parallel rank holds (a pure index function).

Under a causal mask, query t attends to t + 1 keys, so contiguous shards would give rank CP-1 almost 2 CP times the
work of rank 0. Split the sequence into 2 CP equal chunks and give rank i chunks i and 2 CP - 1 - i (Megatron's
`get_batch_on_this_cp_rank`, torch's `_HeadTailLoadBalancer`): every rank then holds one early and one late chunk,
and its queries see (i + 1/2) + (2 CP - i - 1/2) = 2 CP chunks' worth of keys -- the same for every i.

    T = 16, CP = 2: chunks of 4; rank 0 holds [0..3] + [12..15], rank 1 holds [4..7] + [8..11]

Everything here is integer arithmetic on indices; no process group, no data.
"""

from __future__ import annotations

import torch


def check_divisible(seq_len: int, cp: int) -> None:
    """2 CP chunks of equal length: the sequence length must split that way."""
    step = 2 * cp
    if seq_len % step:
        near = [n for n in (seq_len // step * step, (seq_len // step + 1) * step) if n > 0]
        # "2 x --context-parallel-size 4 = 8": "(8)" read as the flag's value, as in the world-size line's
        # "--context-parallel-size (3)" (round 23)
        raise ValueError(f"--seq-length {seq_len} is not divisible by 2 x --context-parallel-size {cp} = {step}; "
                         f"causal load balancing splits each sequence into {step} equal chunks: use a multiple of "
                         f"{step} ({' or '.join(map(str, near))})")


def chunk_ids(rank: int, cp: int) -> tuple[int, int]:
    """The two chunks (of 2 CP) that CP rank `rank` holds, in the order it holds them: (i, 2 CP - 1 - i)."""
    if not 0 <= rank < cp:
        raise ValueError(f"CP rank {rank} outside a group of {cp}")
    return rank, 2 * cp - 1 - rank


def chunk_range(chunk: int, seq_len: int, cp: int) -> tuple[int, int]:
    """[start, end) of one chunk, in sequence positions."""
    n = seq_len // (2 * cp)
    return chunk * n, (chunk + 1) * n


def local_indices(rank: int, cp: int, seq_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(T / CP,) int64: the sequence positions of CP rank `rank`'s tokens, in the order it holds them."""
    check_divisible(seq_len, cp)
    ranges = [chunk_range(c, seq_len, cp) for c in chunk_ids(rank, cp)]
    return torch.cat([torch.arange(a, b, device=device) for a, b in ranges])


def gathered_indices(cp: int, seq_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(T,) int64: the positions of every rank's tokens concatenated in rank order -- what an all-gather over CP
    holds. Its argsort puts a gathered tensor back into sequence order."""
    return torch.cat([local_indices(r, cp, seq_len, device) for r in range(cp)])


def shard(x: torch.Tensor, rank: int, cp: int, dim: int = 1) -> torch.Tensor:
    """This rank's tokens of a full-sequence tensor (its two chunks along `dim`, concatenated)."""
    if cp == 1:
        return x
    return x.index_select(dim, local_indices(rank, cp, x.shape[dim], x.device))


def unshard(parts: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The full sequence from every rank's shard (inverse of `shard` over all ranks): tests and export."""
    cp = len(parts)
    x = torch.cat(parts, dim=dim)
    if cp == 1:
        return x
    order = torch.argsort(gathered_indices(cp, x.shape[dim], x.device))
    return x.index_select(dim, order)
