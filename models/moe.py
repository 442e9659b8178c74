"""The Mixture-of-Experts MLP of Mixtral and Qwen2-MoE: hybrid/moe's block with the model's pieces.

    Mixtral     y = sum_{top-2 of 8} p_e SwiGLU_e(x)                  (softmax, top-k, renormalised)
    Qwen2-MoE   y = sum_{top-k of E} p_e SwiGLU_e(x) + sigmoid(x w_g) SwiGLU_shared(x)   (no renormalisation
                by default; fine-grained experts: many narrow ones)

The shared expert is the dense tensor-parallel SwiGLU of models/llama.py at its own width.
"""

from __future__ import annotations

import dataclasses

import torch.nn as nn
from hybrid.moe.layer import ExpertContext, MoELayer
from hybrid.tp import TPContext
from models.activations import activation
from models.config import ModelConfig


def moe_mlp(cfg: ModelConfig, tp: TPContext, moe: ExpertContext | None) -> nn.Module:
    """The MoE block of one layer; `moe` None: defaults (one rank holds every expert, no auxiliary loss)."""
    from models.llama import SwiGLU
    shared = None
    if cfg.moe_shared_expert_ffn_hidden_size:
        shared = SwiGLU(dataclasses.replace(cfg, ffn_hidden_size=cfg.moe_shared_expert_ffn_hidden_size,
                                            mlp_bias=False), tp)
    return MoELayer(cfg, tp, moe or ExpertContext(), activation(cfg.activation), shared)
