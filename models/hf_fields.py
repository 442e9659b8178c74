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
from typing import TYPE_CHECKING, Any, Callable

from hybrid.cliutil import is_finite, is_integer
from models import activations

if TYPE_CHECKING:  # the checks run on transformers' config objects; importing this module does not import it
    from transformers import PretrainedConfig

MOE = ("mixtral", "qwen2_moe")  # Mixture-of-Experts members of the Llama family (hybrid/moe)
LLAMA_FAMILY = ("llama", "mistral", "qwen2") + MOE
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
    Rule("activation_function", ("gpt2",), activations.known, "a transformers ACT2FN name"),
    Rule("hidden_act", LLAMA_FAMILY, activations.known, "a transformers ACT2FN name"),
    Rule("layer_types", ("mistral",), lambda v: v is None,
         "transformers' MistralModel ignores layer_types and windows every layer; drop the field"),
    Rule("layer_types", ("qwen2",), lambda v: v is None or set(v) <= {"full_attention", "sliding_attention"},
         "full_attention and sliding_attention layers"),
    # Mixture of Experts (hybrid/moe)
    Rule("router_jitter_noise", ("mixtral",), lambda v: not v, "no multiplicative jitter on the router input (0)"),
    Rule("use_sliding_window", ("qwen2_moe",), lambda v: not v, "full attention on every qwen2_moe layer"),
    Rule("layer_types", ("qwen2_moe",), lambda v: v is None or set(v) == {"full_attention"},
         "full_attention on every qwen2_moe layer"),
)


# Every field the four config classes hold or their modeling code reads, classified (tests/test_hf_fields.py
# checks that nothing transformers adds goes unclassified: the union of these and RULES covers it).
IMPLEMENTED = {
    "gpt2": {"vocab_size", "n_embd", "n_head", "n_layer", "n_positions", "n_inner", "activation_function",
             "layer_norm_epsilon", "attn_pdrop", "resid_pdrop", "embd_pdrop",
             # GPT2Config's attribute_map aliases of the n_* sizes
             "hidden_size", "num_attention_heads", "num_hidden_layers", "max_position_embeddings"},
    "llama": {"vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
              "intermediate_size", "max_position_embeddings", "head_dim", "hidden_act", "rms_norm_eps",
              "attention_dropout", "attention_bias", "mlp_bias", "rope_parameters", "tie_word_embeddings"},
}
IMPLEMENTED["mistral"] = IMPLEMENTED["llama"] - {"attention_bias", "mlp_bias"} | {"sliding_window"}
IMPLEMENTED["qwen2"] = IMPLEMENTED["mistral"] | {"use_sliding_window", "max_window_layers", "layer_types"}
# MoE: the router's load-balancing loss is a training choice (--moe-aux-loss-coeff and
# --moe-router-load-balancing-type hf_aux_loss give transformers' output_router_logits=True loss), so
# router_aux_loss_coef and output_router_logits are HARMLESS below: they do not change the forward math.
IMPLEMENTED["mixtral"] = IMPLEMENTED["mistral"] | {"num_local_experts", "num_experts_per_tok"}
IMPLEMENTED["qwen2_moe"] = (IMPLEMENTED["qwen2"] - {"use_sliding_window", "layer_types"}) | {
    "num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
    "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "qkv_bias"}
# Fields that do not change the training math of the causal-LM model: bookkeeping, generation, output
# switches, heads other than the LM head (GPT-2's summary_* double-heads and classifier fields), the attention
# kernel choice. pad_token_id: transformers gives nn.Embedding that padding_idx, whose row then gets no
# gradient; the forward pass is the same and we train that row like any other (docs/tensor-parallel.md).
HARMLESS = {"_name_or_path", "architectures", "bos_token_id", "eos_token_id", "pad_token_id", "dtype",
            "chunk_size_feed_forward", "id2label", "label2id", "num_labels", "problem_type", "output_attentions",
            "output_hidden_states", "return_dict", "use_cache", "transformers_version", "model_type",
            "_attn_implementation", "pretraining_tp", "summary_type", "summary_use_proj", "summary_activation",
            "summary_proj_to_labels", "summary_first_dropout", "summary_last_dropout", "classifier_dropout",
            "hidden_dropout", "router_aux_loss_coef", "output_router_logits"}


# Value ranges of the numeric fields (transformers' config classes accept NaN, inf and negatives for all
# of them). Sizes: a positive integer (None where transformers derives it); eps: a finite number > 0 (the
# norm divides by sqrt(mean(x^2) + eps), which is NaN for eps < 0 and 0/0 on an all-zero row for eps = 0);
# dropout probabilities: [0, 1) (p = 1 zeroes everything and rescales by 1 / (1 - p) = inf).
SIZES = {"gpt2": ("vocab_size", "n_embd", "n_head", "n_layer", "n_positions"),
         "llama": ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                   "max_position_embeddings")}
OPTIONAL_SIZES = {"gpt2": ("n_inner",), "llama": ("num_key_value_heads", "head_dim", "sliding_window")}
MOE_SIZES = {"mixtral": ("num_local_experts", "num_experts_per_tok"),
             "qwen2_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                           "shared_expert_intermediate_size", "decoder_sparse_step")}
EPSILONS = {"gpt2": ("layer_norm_epsilon",), "llama": ("rms_norm_eps",)}
DROPOUTS = {"gpt2": ("attn_pdrop", "resid_pdrop", "embd_pdrop"), "llama": ("attention_dropout",)}
BOOLEANS = {"gpt2": (), "llama": ("attention_bias", "mlp_bias", "tie_word_embeddings", "use_sliding_window")}


def check_values(hf: PretrainedConfig) -> None:
    """ValueError naming the first numeric field out of range (see SIZES / EPSILONS / DROPOUTS; RoPE's
    after its layout is checked, _check_rope_values)."""
    mt = hf.model_type
    family = "gpt2" if mt == "gpt2" else "llama"
    for name in SIZES[family] + OPTIONAL_SIZES[family] + MOE_SIZES.get(mt, ()):
        v = getattr(hf, name, None)
        if mt == "qwen2_moe" and name == "sliding_window" and not getattr(hf, "use_sliding_window", False):
            continue  # Qwen2MoeConfig stores 0 when the window is off
        if (v is not None or name in SIZES[family]) and (not is_integer(v) or v < 1):
            _bad(mt, name, v, "a positive integer")
    for name in EPSILONS[family]:
        v = getattr(hf, name, None)
        if not is_finite(v) or v <= 0:
            _bad(mt, name, v, "a finite number > 0")
    for name in DROPOUTS[family]:
        v = getattr(hf, name, None)
        if v is not None and (not is_finite(v) or not 0.0 <= v < 1.0):
            _bad(mt, name, v, "a probability in [0, 1)")
    for name in BOOLEANS[family]:
        v = getattr(hf, name, None)
        if v is not None and not isinstance(v, bool):
            _bad(mt, name, v, "true or false")


def _check_rope_values(hf: PretrainedConfig) -> None:
    """rope_theta: the base of the inverse frequencies theta^(-2i/d), a finite number > 0 (theta <= 0 gives
    NaN or inf angles); a scaling factor >= 1, as transformers' rope validation asks (it only warns)."""
    params = getattr(hf, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(hf, "rope_theta", None))
    if not is_finite(theta) or theta <= 0:
        _bad(hf.model_type, "rope_parameters.rope_theta", theta, "a finite number > 0")
    if "factor" in params and params.get("rope_type", "default") != "default":
        factor = params["factor"]
        if not is_finite(factor) or factor < 1:
            _bad(hf.model_type, "rope_parameters.factor", factor, "a finite number >= 1 (transformers' bound)")


def _bad(model_type: str, field: str, value: Any, wanted: str) -> None:
    raise ValueError(f"--model: {model_type} config field {field}={value!r} must be {wanted}")


def check_supported(hf: PretrainedConfig) -> None:
    """Raise ValueError naming the first config field whose value is out of range (check_values) or
    changes the math in a way we do not implement."""
    check_values(hf)
    mt = hf.model_type
    for rule in RULES:
        if mt in rule.model_types and hasattr(hf, rule.field) and not rule.ok(getattr(hf, rule.field)):
            _reject(mt, rule.field, getattr(hf, rule.field), rule.supported)
    _check_head_dim(hf)
    if mt in MOE:
        _check_moe(hf)
    if mt in LLAMA_FAMILY:
        _check_rope(hf)
        _check_rope_values(hf)
        if mt == "qwen2" and "sliding_attention" in (hf.layer_types or ()) and hf.sliding_window is None:
            _reject(mt, "sliding_window", None, "an integer window for the sliding_attention layers "
                                                "(set use_sliding_window=True and sliding_window)")


def _check_moe(hf: PretrainedConfig) -> None:
    """k experts per token out of E: k <= E."""
    experts = hf.num_local_experts if hf.model_type == "mixtral" else hf.num_experts
    if hf.num_experts_per_tok > experts:
        _reject(hf.model_type, "num_experts_per_tok", hf.num_experts_per_tok,
                f"at most the {experts} experts")


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
    if hf.model_type in ("mistral", "mixtral") and window is not None:
        return window, tuple(range(hf.num_hidden_layers))
    if hf.model_type == "qwen2" and window is not None:
        return window, tuple(i for i, t in enumerate(hf.layer_types) if t == "sliding_attention")
    return None, ()
