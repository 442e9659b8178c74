"""The Llama family (Llama 2/3, Mistral, Qwen2, and the MoE Mixtral and Qwen2-MoE) on hybrid's tensor-parallel layers.

RoPE, RMSNorm, SwiGLU MLP, grouped-query attention; optional q/k/v bias (Qwen2); tied or untied
embeddings; sliding-window attention on the layers the config names (Mistral, Qwen2); the layers
`cfg.moe_layers` names hold a Mixture-of-Experts block instead of the MLP (models/moe.py). Parameter names follow transformers' LlamaForCausalLM without the "model." prefix.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from hybrid.tp import (ColumnParallelLinear, Dropout, ParallelLMHead, RMSNorm, RowParallelLinear, TPContext,
                       VocabParallelEmbedding, enter_linears)
from hybrid.cp.data import SequenceInfo
from models.activations import activation
from models.common import (KVCache, LayerCache, ParallelAttention, Recompute, StageLayout, checkpoint_block,
                           dropout_streams, lm_loss)
from models.config import ModelConfig


class SwiGLU(nn.Module):
    """down(act(gate(x)) * up(x)): gate and up are column-parallel behind one region entry,
    down is row-parallel -- one all-reduce each way."""

    def __init__(self, cfg: ModelConfig, tp: TPContext):
        super().__init__()
        h, f = cfg.hidden_size, cfg.ffn_hidden_size
        self.tp = tp
        self.gate_proj = ColumnParallelLinear(h, f, tp, bias=cfg.mlp_bias, enter=False)
        self.up_proj = ColumnParallelLinear(h, f, tp, bias=cfg.mlp_bias, enter=False)
        self.down_proj = RowParallelLinear(f, h, tp, bias=cfg.mlp_bias)
        self.act = activation(cfg.activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = enter_linears(x, (self.gate_proj, self.up_proj), self.tp)  # one region entry for both
        return self.down_proj(self.act(gate) * up)


class LlamaBlock(nn.Module):
    """Pre-RMSNorm block. Layer `layer_id` attends within cfg.window(layer_id) (sliding window)
    or causally over the whole sequence. transformers' Llama has no hidden dropout; `--hidden-dropout`
    adds it on both residual branches, as Megatron does."""

    def __init__(self, cfg: ModelConfig, tp: TPContext, layer_id: int, moe=None):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, tp, eps=cfg.norm_eps)
        self.self_attn = ParallelAttention(cfg, tp, out_std=0.02, window=cfg.window(layer_id))
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, tp, eps=cfg.norm_eps)
        if cfg.is_moe_layer(layer_id):  # Mixtral / Qwen2-MoE: the MoE block (models/moe.py, hybrid/moe)
            from models.moe import moe_mlp
            self.mlp = moe_mlp(cfg, tp, moe)
        else:
            self.mlp = SwiGLU(cfg, tp)
        self.drop = Dropout(cfg.dropout, tp.rng, tp.activation_region)
        self.recompute = Recompute.NONE
        self.rng = dropout_streams(cfg, tp)  # replayed by the recomputation (None: no dropout)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                cache: LayerCache | None = None, segments: torch.Tensor | None = None) -> torch.Tensor:
        return checkpoint_block(self.recompute, self.training, self.block, x, *rope, cache, segments,
                                rng=self.rng)

    def block(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              cache: LayerCache | None = None, segments: torch.Tensor | None = None) -> torch.Tensor:
        rope = (cos, sin)
        x = x + self.drop(self.self_attn(self.input_layernorm(x), rope, cache, segments))
        return x + self.drop(self.mlp(self.post_attention_layernorm(x)))


class Llama(nn.Module):
    """Llama-family language model, or one pipeline stage of it; forward as GPT2.forward."""

    def __init__(self, cfg: ModelConfig, tp: TPContext, stage: StageLayout | None = None, pad_vocab_to: int = 1,
                 moe=None):
        super().__init__()
        self.cfg, self.tp = cfg, tp
        self.stage = stage or StageLayout.whole(cfg.num_layers)
        tied_head = self.stage.last and cfg.tie_embeddings
        if self.stage.first or tied_head:
            self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp, pad_to=pad_vocab_to)
        if self.stage.first:
            self.drop = Dropout(cfg.embedding_dropout, tp.rng, tp.activation_region)  # 0 unless --hidden-dropout
        self.layers = nn.ModuleDict({str(i): LlamaBlock(cfg, tp, i, moe) for i in self.stage.layer_ids})
        if self.stage.last:
            self.norm = RMSNorm(cfg.hidden_size, tp, eps=cfg.norm_eps)
            if not cfg.tie_embeddings:
                self.lm_head = ParallelLMHead(cfg.hidden_size, cfg.vocab_size, tp, pad_to=pad_vocab_to)
        inv_freq, self.rope_scale = cfg.rope_inv_freq()
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.cp = None  # context parallelism (models.common.set_context_parallel): this rank's positions, the loss

    def tied_embedding_weight(self) -> torch.Tensor | None:
        """The token embedding this stage holds as input embedding or LM head, when they are tied."""
        return self.embed_tokens.weight if self.cfg.tie_embeddings and hasattr(self, "embed_tokens") else None

    def rope(self, seq_len: int, device: torch.device, dtype: torch.dtype, start: int = 0,
             positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape (T, hd) for positions start .. start + T - 1 (or `positions`: (T,) or (B, T), giving
        (B, 1, T, hd) to broadcast over heads): angle t * inv_freq_j, duplicated for the two halves."""
        if positions is None:
            positions = torch.arange(start, start + seq_len, device=device)
        freqs = positions.to(device, torch.float32)[..., None] * self.inv_freq  # = torch.outer for (T,)
        emb = torch.cat((freqs, freqs), dim=-1)
        if emb.dim() == 3:
            emb = emb[:, None]
        return (emb.cos() * self.rope_scale).to(dtype), (emb.sin() * self.rope_scale).to(dtype)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None,
                cache: KVCache | None = None, seq: SequenceInfo | None = None) -> torch.Tensor:
        """`cache` (inference): x holds only the tokens after the cached ones, which it then adds to. `seq`: the
        micro-batch's positions and document ids (`--reset-position-ids`, `--reset-attention-mask`)."""
        if self.stage.first:
            x = self.drop(self.embed_tokens(x))  # (B, T, C); SP: (B, T/t, C); CP: T is this rank's T/CP
        seq_len = x.shape[1] * (self.tp.size if self.tp.sequence_parallel else 1)
        positions = seq.positions if seq is not None else \
            self.cp.positions(seq_len, x.device) if self.cp is not None else None
        rope = self.rope(seq_len, x.device, x.dtype, start=cache.length if cache is not None else 0,
                         positions=positions)
        segments = seq.segments if seq is not None else None
        for i, block in self.layers.items():
            x = block(x, rope, None if cache is None else cache.layer(int(i)), segments)
        if cache is not None:
            cache.length += seq_len
        if not self.stage.last:
            return x
        h = self.norm(x)
        head = self.embed_tokens if self.cfg.tie_embeddings else self.lm_head
        logits = head.logits(h)
        return logits if labels is None else lm_loss(logits, labels, head.vocab_start, self.tp, self.cp)
