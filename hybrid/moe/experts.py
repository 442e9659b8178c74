"""A rank's local experts: SwiGLU MLPs run on their contiguous blocks of dispatched rows.

Expert e computes down_e(act(gate_e(x)) * up_e(x)) with gate_e, up_e (f, h) and down_e (h, f), as transformers'
Mixtral (w1, w3, w2) and Qwen2-MoE experts. Each expert's three weights are parameters of their own, named by
the *global* expert id (`experts.5.gate_proj.weight`), so names -- and initial weights, checkpoint keys and
transformers keys -- are the same at every expert-parallel size; a rank simply holds fewer of them.

Expert-TP (etp > 1, hybrid/moe/parallel.py) splits each expert like a TP MLP over its expert-TP group, as
Megatron's: with f = F / etp and j the expert-TP rank,

    gate_e, up_e  column-parallel: rows [j f, (j+1) f) of the (F, h) weights
    down_e        row-parallel:    columns [j f, (j+1) f) of the (h, F) weight, so
    down_e(act(gate_e x) * up_e x) = sum_j down_e^j (act(gate_e^j x) * up_e^j x)

(the activation is elementwise, so it splits with the columns). Each rank returns its partial sum; the
dispatcher's reduce-scatter over the expert-TP group adds them (hybrid/moe/layer.py). The weights carry a
ShardSpec along the split dimension and their expert-TP rank as `split_rank`, so initialisation, checkpoints
and conversion place the slice in the full tensor as they do a TP shard.

Two ways to run E_l experts on rows sorted by expert with counts n_0 .. n_{E_l-1}:

    loop     for e: y[block e] = down_e(act(gate_e(x[block e])) * up_e(x[block e]))       E_l x 3 matmuls
    grouped  Y = grouped_mm(X, [gate|up]^T, offs); Y = grouped_mm(act(G) * U, down^T, offs)   2 calls

`grouped` stacks the weights into (E_l, 2f, h) and (E_l, h, f) on every forward (a copy the size of the local
expert weights; backward splits the gradient back), then one grouped GEMM per projection (torch's
grouped_mm: CUDA kernels, and a CPU fallback). Every expert runs even on zero rows, so each weight gets a
gradient every backward (zeros when idle): ZeRO's hooks count on it.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from hybrid.moe.config import ExpertsImpl
from hybrid.moe.params import mark_expert
from hybrid.tp.layers import normal_init
from hybrid.tp.sharding import REPLICATED, ShardSpec, set_spec, split_spec


class _Weight(nn.Module):
    """A bias-free linear's weight (out, in) under its transformers-like name `<proj>.weight`; an expert's
    unless `expert` is False."""

    def __init__(self, out_features: int, in_features: int, spec: ShardSpec = REPLICATED, expert: bool = True,
                 split_rank: int | None = None):
        super().__init__()
        shape = [out_features, in_features]
        if spec.dim is not None:
            shape[spec.dim] = spec.length
        w = set_spec(nn.Parameter(torch.zeros(shape)), spec, normal_init(0.02))
        if split_rank is not None:
            w.split_rank = split_rank  # its index in spec.starts: the expert-TP rank (hybrid/tp/sharding.split_rank)
        self.weight = mark_expert(w) if expert else w


class ExpertMLP(nn.Module):
    """One routed expert: down(act(gate(x)) * up(x)); with etp > 1 this rank's width slice etp_rank of it
    (module docstring), whose output is a partial sum."""

    def __init__(self, hidden: int, ffn: int, etp: int = 1, etp_rank: int = 0):
        super().__init__()
        col = split_spec(ffn, etp, 0) if etp > 1 else REPLICATED
        row = split_spec(ffn, etp, 1) if etp > 1 else REPLICATED
        rank = etp_rank if etp > 1 else None
        self.gate_proj = _Weight(ffn, hidden, col, split_rank=rank)
        self.up_proj = _Weight(ffn, hidden, col, split_rank=rank)
        self.down_proj = _Weight(hidden, ffn, row, split_rank=rank)

    def forward(self, x: torch.Tensor, act) -> torch.Tensor:
        return F.linear(act(F.linear(x, self.gate_proj.weight)) * F.linear(x, self.up_proj.weight),
                        self.down_proj.weight)


class LocalExperts(nn.ModuleDict):
    """Experts [first, first + count) of a layer, keyed by their global id (with etp > 1: width slice etp_rank of
    each)."""

    def __init__(self, hidden: int, ffn: int, first: int, count: int, act, impl: ExpertsImpl = ExpertsImpl.AUTO,
                 etp: int = 1, etp_rank: int = 0):
        super().__init__({str(first + i): ExpertMLP(hidden, ffn, etp, etp_rank) for i in range(count)})
        object.__setattr__(self, "act", act)  # a plain attribute: not one of the dict's experts
        self.impl = impl

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """(R, h) rows in blocks of `counts` (one per local expert, in id order) -> (R, h) outputs. Called as a
        module (never through a helper): ZeRO stage 3 gathers the experts' parameters in its forward hooks."""
        impl = self.impl
        if impl is ExpertsImpl.AUTO:
            impl = ExpertsImpl.GROUPED if x.is_cuda else ExpertsImpl.LOOP
        if impl is ExpertsImpl.GROUPED:
            return self._grouped(x, counts)
        outs = [e(block, self.act) for e, block in zip(self.values(), torch.split(x, counts))]
        return torch.cat(outs) if outs else x

    def _grouped(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        experts = list(self.values())
        ffn = experts[0].gate_proj.weight.shape[0]
        gate_up = torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight]) for e in experts])  # (E_l, 2f, h)
        down = torch.stack([e.down_proj.weight for e in experts])  # (E_l, h, f)
        offs = torch.cumsum(torch.tensor(counts, device=x.device), 0).to(torch.int32)
        gu = F.grouped_mm(x, gate_up.transpose(1, 2), offs=offs)  # (R, 2f)
        z = self.act(gu[:, :ffn]) * gu[:, ffn:]
        return F.grouped_mm(z.contiguous(), down.transpose(1, 2), offs=offs)  # (R, h)
