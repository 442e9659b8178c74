"""Named models (`--model tiny-gpt2`, the planner's `--model llama-3-70b`): plain `ModelConfig` literals, so a
run on a preset builds its model without importing transformers.

Tiny presets run on CPU in tests and the demo (vocabulary 256 = byte-level text); real sizes feed the planner.
The tiny presets set dropout 0: the parallel-vs-single-process tests train them, and dropout masks of
TP-sharded regions legitimately differ between layouts (each TP rank draws its own, as in Megatron), so only
dropout 0 makes layouts comparable. Real sizes follow the published configs (GPT-2: Radford et al. 2019;
Llama 3: Meta's config.json files).

`TRANSFORMERS_ARGS` holds each preset as transformers' config class arguments: what `ModelConfig.hf` builds
when a preset's transformers config is needed (exporting a checkpoint trained from a preset), and what
tests/test_presets.py checks every literal against (`from_hf` of it equals the literal, RoPE included).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from models.config import ARCH_GPT2, ARCH_LLAMA, ModelConfig


def _gpt2(name: str, layers: int, hidden: int, heads: int, vocab: int = 50257, positions: int = 1024,
          dropout: float = 0.1) -> ModelConfig:
    """GPT2Config's defaults: GELU (tanh) MLP of 4h, LayerNorm eps 1e-5, biases everywhere, tied head."""
    return ModelConfig(arch=ARCH_GPT2, vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads,
                       num_kv_heads=heads, head_dim=hidden // heads, ffn_hidden_size=4 * hidden,
                       max_position_embeddings=positions, norm_eps=1e-5, tie_embeddings=True, qkv_bias=True,
                       mlp_bias=True, out_bias=True, activation="gelu_new", dropout=dropout, model_type="gpt2",
                       name=name)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int = 128256,
           positions: int = 8192, model_type: str = "llama", tie: bool = False, qkv_bias: bool = False,
           eps: float = 1e-5, theta: float = 500000.0) -> ModelConfig:
    """RMSNorm, SwiGLU (SiLU gate), RoPE, grouped-query attention, no dropout."""
    return ModelConfig(arch=ARCH_LLAMA, vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads,
                       num_kv_heads=kv, head_dim=hidden // heads, ffn_hidden_size=ffn,
                       max_position_embeddings=positions, norm_eps=eps, tie_embeddings=tie, qkv_bias=qkv_bias,
                       mlp_bias=False, out_bias=False, activation="silu", dropout=0.0, model_type=model_type,
                       rope_type="default", rope_theta=theta, name=name)


def _moe(name: str, model_type: str, ffn: int, experts: int, k: int, expert_ffn: int, eps: float, theta: float,
         qkv_bias: bool = False, norm_topk: bool = True, shared_ffn: int = 0) -> ModelConfig:
    """A tiny Mixture-of-Experts Llama (hybrid/moe): every layer's MLP is the MoE block."""
    return dataclasses.replace(
        _llama(name, 4, 64, 4, 2, ffn, vocab=256, positions=256, model_type=model_type, qkv_bias=qkv_bias, eps=eps,
               theta=theta),
        num_experts=experts, moe_top_k=k, moe_ffn_hidden_size=expert_ffn, moe_layers=(0, 1, 2, 3),
        moe_norm_topk_prob=norm_topk, moe_shared_expert_ffn_hidden_size=shared_ffn,
        moe_shared_expert_gate=shared_ffn > 0)


PRESETS: dict[str, ModelConfig] = {c.name: c for c in (
    _gpt2("tiny-gpt2", 4, 64, 4, vocab=256, positions=256, dropout=0.0),
    _llama("tiny-llama", 4, 64, 4, 2, 176, vocab=256, positions=256),
    _llama("tiny-qwen2", 4, 64, 4, 2, 176, vocab=256, positions=256, model_type="qwen2", tie=True, qkv_bias=True,
           eps=1e-6, theta=10000.0),
    # tiny-mixtral: 8 experts, top-2; tiny-qwen2-moe: 8 fine-grained experts (width 32), top-4 without
    # renormalisation, a shared expert (width 64) behind its sigmoid gate
    _moe("tiny-mixtral", "mixtral", 64, 8, 2, 64, eps=1e-5, theta=1e6),
    _moe("tiny-qwen2-moe", "qwen2_moe", 176, 8, 4, 32, eps=1e-6, theta=10000.0, qkv_bias=True, norm_topk=False,
         shared_ffn=64),
    _gpt2("gpt2", 12, 768, 12),
    _gpt2("gpt2-medium", 24, 1024, 16),
    _gpt2("gpt2-large", 36, 1280, 20),
    _gpt2("gpt2-xl", 48, 1600, 25),
    _llama("llama-3-8b", 32, 4096, 32, 8, 14336),
    _llama("llama-3-70b", 80, 8192, 64, 8, 28672),
    _llama("llama-3-405b", 126, 16384, 128, 8, 53248),
)}

_LLAMA3 = {"rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "vocab_size": 128256,
           "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}


def _llama3(layers: int, hidden: int, heads: int, kv: int, ffn: int) -> tuple[str, dict[str, Any]]:
    return "llama", dict(_LLAMA3, num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                         num_key_value_heads=kv, intermediate_size=ffn)


# preset -> (transformers model_type, its config class's arguments)
TRANSFORMERS_ARGS: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny-gpt2": ("gpt2", dict(n_layer=4, n_embd=64, n_head=4, vocab_size=256, n_positions=256, resid_pdrop=0.0,
                               embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)),
    "tiny-llama": ("llama", dict(_LLAMA3, num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=176, vocab_size=256,
                                 max_position_embeddings=256, tie_word_embeddings=False, attention_dropout=0.0)),
    "tiny-qwen2": ("qwen2", dict(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                 intermediate_size=176, vocab_size=256, max_position_embeddings=256,
                                 tie_word_embeddings=True, attention_dropout=0.0)),
    "tiny-mixtral": ("mixtral", dict(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                     vocab_size=256, max_position_embeddings=256, tie_word_embeddings=False,
                                     attention_dropout=0.0, intermediate_size=64, num_local_experts=8,
                                     num_experts_per_tok=2)),
    "tiny-qwen2-moe": ("qwen2_moe", dict(num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
                                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
                                         tie_word_embeddings=False, attention_dropout=0.0, intermediate_size=176,
                                         moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                         num_experts=8, num_experts_per_tok=4, norm_topk_prob=False)),
    "gpt2": ("gpt2", dict(n_layer=12, n_embd=768, n_head=12)),
    "gpt2-medium": ("gpt2", dict(n_layer=24, n_embd=1024, n_head=16)),
    "gpt2-large": ("gpt2", dict(n_layer=36, n_embd=1280, n_head=20)),
    "gpt2-xl": ("gpt2", dict(n_layer=48, n_embd=1600, n_head=25)),
    "llama-3-8b": _llama3(32, 4096, 32, 8, 14336),
    "llama-3-70b": _llama3(80, 8192, 64, 8, 28672),
    "llama-3-405b": _llama3(126, 16384, 128, 8, 53248),
}


def transformers_config(name: str):
    """The transformers config of preset `name` (imports transformers)."""
    from transformers import AutoConfig
    model_type, kwargs = TRANSFORMERS_ARGS[name]
    return AutoConfig.for_model(model_type, **copy.deepcopy(kwargs))  # the class may edit rope_parameters
