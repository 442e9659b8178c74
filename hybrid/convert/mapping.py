"""Our global parameter names <-> transformers state-dict keys, for a whole (tp 1, unpadded) model.

The per-parameter location is models/hf_io.hf_source (the mapping train.py's `--load` of a transformers folder
uses): a key, whether the stored tensor is our weight transposed (GPT-2's Conv1D keeps (in, out)), and the
offset of our rows in a fused tensor (GPT-2's c_attn = [q; k; v] along the output dim). Here it is applied to
full tensors in both directions:

    ours  = stored.T[offset : offset + rows]     (transpose first when the key is a Conv1D)
    stored = cat(ours_q, ours_k, ours_v).T       (the inverse, pieces sorted by offset)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from hybrid.comm import Group
from hybrid.tp import TPContext
from models import build_model
from models.config import ModelConfig
from models.hf_io import Source, expected_shapes, hf_source


@dataclass(frozen=True)
class Param:
    """One of our parameters: its global name, full shape, and where transformers keeps it."""

    name: str
    shape: tuple[int, ...]
    source: Source


def meta_model(cfg: ModelConfig) -> torch.nn.Module:
    """The whole model at tp 1 on the meta device: names and shapes, no memory."""
    with torch.device("meta"):
        return build_model(cfg, TPContext(Group.solo("tp")), seed=None)


def params(cfg: ModelConfig) -> list[Param]:
    """Every parameter of the model `cfg` describes, in the model's order (tp 1: full, unpadded shapes)."""
    return [Param(n, tuple(p.shape), hf_source(cfg, n)) for n, p in meta_model(cfg).named_parameters()]


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every transformers key the model reads, with the stored shape its config implies."""
    return expected_shapes(meta_model(cfg))


def ours_from_hf(p: Param, stored: torch.Tensor) -> torch.Tensor:
    """Our tensor `p` from the full stored transformers tensor (a copy: contiguous, its own storage)."""
    t = stored.t() if p.source.transpose else stored
    return t[p.source.offset:p.source.offset + p.shape[0]].clone(memory_format=torch.contiguous_format)


def hf_keys(cfg: ModelConfig) -> dict[str, list[Param]]:
    """transformers key -> our parameters stored in it, sorted by their row offset (GPT-2's c_attn: q, k, v)."""
    out: dict[str, list[Param]] = defaultdict(list)
    for p in params(cfg):
        out[p.source.key].append(p)
    return {k: sorted(v, key=lambda p: p.source.offset) for k, v in out.items()}


def hf_tensors(cfg: ModelConfig, read: Callable[[Param], torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """(transformers key, stored tensor) one at a time, each built from our tensors `read(param)` returns:
    at most one key's pieces are alive at once."""
    for key, parts in hf_keys(cfg).items():
        pieces = [read(p) for p in parts]
        full = torch.cat(pieces, dim=0) if len(pieces) > 1 else pieces[0]
        del pieces
        yield key, (full.t().contiguous() if parts[0].source.transpose else full)
