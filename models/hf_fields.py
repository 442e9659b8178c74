"""Which transformers config fields we implement, and a one-line ValueError for each one we do not.

Every field of GPT2Config, LlamaConfig, MistralConfig and Qwen2Config (transformers 5.24) that the
modeling code reads is one of:

* implemented -- translated into `ModelConfig` by `models.config.from_hf` and tested against
  transformers (tests/test_tp_models.py, tests/test_hf_fields.py);
* harmless -- it does not change the training math (`use_cache`, token ids, `pretraining_tp`, which
  transformers' Llama no longer reads, the GPT-2 `summary_*` fields of the double-heads model, ...);
* rejected -- `check_supported` raises naming the field, its value and what we support.

docs/tensor-parallel.md has the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from transformers import PretrainedConfig
from transformers.activations import ACT2FN

LLAMA_FAMILY = ("llama", "mistral", "qwen2")
ALL = ("gpt2",) + LLAMA_FAMILY
INIT_STD = 0.02  # the std our init draws every weight with (models/gpt2.py, models/llama.py)
ROPE_TYPES = ("default", "linear", "yarn", "llama3")  # static inverse frequencies (ModelConfig.rope_inv_freq)


@dataclass(frozen=True)
class Rule:
    """One rejected value: the field, the model types it applies to, the test a supported value
    passes, and what we support instead."""

    field: str
    model_types: tuple[str, ...]
    ok: Callable[[Any], bool]
    supported: str


RULES = (
    Rule("scale_attn_weights", ("gpt2",), lambda v: v is True, "attention scores are always scaled by 1/sqrt(head_dim)"),
    Rule("scale_attn_by_inverse_layer_idx", ("gpt2",), lambda v: not v, "no per-layer 1/(layer+1) score scaling"),
    Rule("reorder_and_upcast_attn", ("gpt2",), lambda v: not v, "attention runs in the compute dtype (SDPA)"),
    Rule("add_cross_attention", ("gpt2",), lambda v: not v, "decoder-only: no cross-attention"),
    Rule("tie_word_embeddings", ("gpt2",), lambda v: v is not False, "GPT-2's LM head is tied to wte"),
    Rule("is_encoder_decoder", ALL, lambda v: not v, "decoder-only"),
    Rule("initializer_range", ALL, lambda v: v is None or v == INIT_STD, f"weights are initialised with std {INIT_STD}"),
    Rule("quantization_config", ALL, lambda v: not v, "full-precision weights only"),
    Rule("activation_function", ("gpt2",), lambda v: v in ACT2FN, "a transformers ACT2FN name"),
    Rule("hidden_act", LLAMA_FAMILY, lambda v: v in ACT2FN, "a transformers ACT2FN name"),
    Rule("layer_types", ("mistral",), lambda v: v is None,
         "transformers' MistralModel ignores layer_types and windows every layer; drop the field"),
    Rule("layer_types", ("qwen2",), lambda v: v is None or set(v) <= {"full_attention", "sliding_attention"},
         "full_attention and sliding_attention layers"),
)


def check_supported(hf: PretrainedConfig) -> None:
    """Raise ValueError naming the first config field whose value changes the math in a way we do
    not implement."""
    mt = hf.model_type
    for rule in RULES:
        if mt in rule.model_types and hasattr(hf, rule.field) and not rule.ok(getattr(hf, rule.field)):
            _reject(mt, rule.field, getattr(hf, rule.field), rule.supported)
    _check_head_dim(hf)
    if mt in LLAMA_FAMILY:
        _check_rope(hf)
        if mt == "qwen2" and "sliding_attention" in (hf.layer_types or ()) and hf.sliding_window is None:
            _reject(mt, "sliding_window", None, "an integer window for the sliding_attention layers "
                                                "(set use_sliding_window=True and sliding_window)")


def _check_head_dim(hf: PretrainedConfig) -> None:
    """Without an explicit head_dim the per-head width is hidden / heads, which must be an integer:
    transformers floors it silently for Mistral and Qwen2 (MistralConfig stores the floored value,
    so a head_dim equal to floor(hidden / heads) with a remainder is taken as derived)."""
    heads, hidden = hf.num_attention_heads, hf.hidden_size
    if hidden % heads == 0:
        return
    head_dim = getattr(hf, "head_dim", None)
    if hf.model_type == "gpt2" or head_dim is None or head_dim == hidden // heads:
        field = "n_head" if hf.model_type == "gpt2" else "num_attention_heads"
        _reject(hf.model_type, field, heads, f"a divisor of the hidden size {hidden} (hidden / heads = "
                                             f"{hidden / heads:g} is not an integer; or set head_dim explicitly)")


def _check_rope(hf: PretrainedConfig) -> None:
    params = getattr(hf, "rope_parameters", None) or {}
    if any(isinstance(v, dict) for v in params.values()):  # per layer type: {"full_attention": {...}, ...}
        _reject(hf.model_type, "rope_parameters", params, "one RoPE for every layer")
    rope_type = params.get("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        _reject(hf.model_type, "rope_parameters.rope_type", rope_type,
                f"{', '.join(ROPE_TYPES)} (static frequencies; dynamic and longrope change with the sequence length)")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        _reject(hf.model_type, "rope_parameters.partial_rotary_factor", params["partial_rotary_factor"],
                "1.0 (RoPE on the whole head)")


def _reject(model_type: str, field: str, value: Any, supported: str) -> None:
    raise ValueError(f"--model: {model_type} config field {field}={value!r} is not supported; supported: {supported}")


def sliding_layers(hf: PretrainedConfig) -> tuple[int | None, tuple[int, ...]]:
    """(window, ids of the windowed layers) as transformers 5.24 applies them.

    Mistral: `sliding_window` on every layer when it is set (MistralModel builds one sliding mask for
    all layers). Qwen2: Qwen2Config sets sliding_window = None unless use_sliding_window, and derives
    layer_types (sliding from layer max_window_layers on) unless given; each layer follows its type."""
    window = getattr(hf, "sliding_window", None)
    if hf.model_type == "mistral" and window is not None:
        return window, tuple(range(hf.num_hidden_layers))
    if hf.model_type == "qwen2" and window is not None:
        return window, tuple(i for i, t in enumerate(hf.layer_types) if t == "sliding_attention")
    return None, ()
