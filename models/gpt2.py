"""GPT-2 (Radford et al. 2019) on hybrid's tensor-parallel layers.

At tp = 1 this is the plain model: learned positions, pre-LayerNorm blocks, GELU MLP, biases,
the LM head tied to the token embedding. Parameter names follow transformers' GPT2LMHeadModel
(wte, wpe, h.{i}, ln_f) except that c_attn is held as separate q/k/v projections, so each
splits over TP by heads.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from hybrid.tp import ColumnParallelLinear, Dropout, LayerNorm, RowParallelLinear, TPContext, VocabParallelEmbedding, normal_init
from hybrid.tp.sharding import set_spec
from hybrid.cp.data import SequenceInfo
from models.activations import activation
from models.common import (KVCache, LayerCache, ParallelAttention, Recompute, StageLayout, checkpoint_block,
                           dropout_streams, lm_loss)
from models.config import ModelConfig


class GPT2MLP(nn.Module):
    """c_fc (column-parallel) -> GELU -> c_proj (row-parallel): one all-reduce each way."""

    def __init__(self, cfg: ModelConfig, tp: TPContext, out_std: float):
        super().__init__()
        self.c_fc = ColumnParallelLinear(cfg.hidden_size, cfg.ffn_hidden_size, tp, bias=cfg.mlp_bias)
        self.act = activation(cfg.activation)
        self.c_proj = RowParallelLinear(cfg.ffn_hidden_size, cfg.hidden_size, tp, bias=cfg.mlp_bias,
                                        init=normal_init(out_std))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPContext):
        super().__init__()
        out_std = 0.02 / math.sqrt(2 * cfg.num_layers)  # GPT-2's scaled init of residual projections
        self.ln_1 = LayerNorm(cfg.hidden_size, tp, eps=cfg.norm_eps)
        self.attn = ParallelAttention(cfg, tp, out_std)
        self.ln_2 = LayerNorm(cfg.hidden_size, tp, eps=cfg.norm_eps)
        self.mlp = GPT2MLP(cfg, tp, out_std)
        self.drop = Dropout(cfg.dropout, tp.rng, tp.activation_region)  # resid_pdrop
        self.recompute = Recompute.NONE
        self.rng = dropout_streams(cfg, tp)  # replayed by the recomputation (None: no dropout)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None,
                segments: torch.Tensor | None = None) -> torch.Tensor:
        return checkpoint_block(self.recompute, self.training, self.block, x, cache, segments, rng=self.rng)

    def block(self, x: torch.Tensor, cache: LayerCache | None = None,
              segments: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln_1(x), cache=cache, segments=segments))
        return x + self.drop(self.mlp(self.ln_2(x)))


class GPT2(nn.Module):
    """GPT-2 language model, or one pipeline stage of it (see StageLayout).

    forward(x, labels): x is token ids (B, T) on the first stage, hidden states otherwise; returns
    the mean loss when labels are given on the last stage, vocab-parallel logits (B, T, V_p/t)
    without labels, and hidden states on other stages. Under sequence parallelism hidden states
    between stages are (B, T/t, C).
    """

    def __init__(self, cfg: ModelConfig, tp: TPContext, stage: StageLayout | None = None, pad_vocab_to: int = 1):
        super().__init__()
        self.cfg, self.tp = cfg, tp
        self.stage = stage or StageLayout.whole(cfg.num_layers)
        if self.stage.first or self.stage.last:  # the last stage's copy is the tied LM head
            self.wte = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp, pad_to=pad_vocab_to)
        if self.stage.first:
            self.wpe = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
            set_spec(self.wpe.weight, tp.replicated_spec(), normal_init(0.01))
            self.drop = Dropout(cfg.embedding_dropout, tp.rng, tp.activation_region)  # embd_pdrop
        self.h = nn.ModuleDict({str(i): GPT2Block(cfg, tp) for i in self.stage.layer_ids})
        if self.stage.last:
            self.ln_f = LayerNorm(cfg.hidden_size, tp, eps=cfg.norm_eps)
        self.cp = None  # context parallelism (models.common.set_context_parallel): this rank's positions, the loss

    def tied_embedding_weight(self) -> torch.Tensor | None:
        """The token embedding this stage holds as input embedding or LM head (tied), if any."""
        return self.wte.weight if hasattr(self, "wte") else None

    def embed(self, ids: torch.Tensor, start: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Token + learned position embeddings of positions start .. start + T - 1 (or `positions`, (T,) or
        (B, T): CP's load-balanced tokens, `--reset-position-ids`)."""
        x = self.wte(ids)  # (B, T, C); under SP reduce-scattered to (B, T/t, C)
        pos = torch.arange(start, start + ids.shape[1], device=ids.device) if positions is None else positions
        if self.tp.sequence_parallel:
            pos = pos.chunk(self.tp.size, dim=-1)[self.tp.rank]  # the positions of this rank's T/t tokens
        return self.drop(x + self.wpe(pos))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None,
                cache: KVCache | None = None, seq: SequenceInfo | None = None) -> torch.Tensor:
        """`cache` (inference): x holds only the tokens after the cached ones, which it then adds to. `seq`: the
        micro-batch's positions and document ids (`--reset-position-ids`, `--reset-attention-mask`)."""
        if self.stage.first:
            positions = seq.positions.to(x.device) if seq is not None else \
                self.cp.positions(x.shape[1], x.device) if self.cp is not None else None
            x = self.embed(x, start=cache.length if cache is not None else 0, positions=positions)
        segments = seq.segments if seq is not None else None
        for i, block in self.h.items():
            x = block(x, None if cache is None else cache.layer(int(i)), segments)
        if cache is not None:
            cache.length += x.shape[1] * (self.tp.size if self.tp.sequence_parallel else 1)
        if not self.stage.last:
            return x
        logits = self.wte.logits(self.ln_f(x))
        return logits if labels is None else lm_loss(logits, labels, self.wte.vocab_start, self.tp, self.cp)
