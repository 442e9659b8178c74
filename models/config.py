"""Model configuration: one typed dataclass for GPT-2 and the Llama family, from a named preset
(models/presets.py: plain literals), a transformers config (GPT2Config, LlamaConfig, MistralConfig,
Qwen2Config) or a `config.json` directory.

transformers' config classes are the source of truth for the architecture (and for the RoPE variants
beyond the default one, whose frequencies we compute with transformers' own `ROPE_INIT_FUNCTIONS`): we
read them, never re-derive them. A preset needs none of it, so transformers is imported only where a
config.json is read or a transformers config is asked for (`ModelConfig.hf`): a run on a preset does not
import it (tests/test_presets.py checks the literals against transformers' configs and the imports).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hybrid.cliutil import check_number, json_problem

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

ARCH_GPT2 = "gpt2"
ARCH_LLAMA = "llama"


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder-only Transformer.

    Attributes:
        arch: "gpt2" (learned positions, LayerNorm, GELU MLP, biases) or "llama" (RoPE, RMSNorm,
            SwiGLU, grouped-query attention).
        vocab_size: tokens in the vocabulary (before padding to a multiple of tp).
        hidden_size: model width h.
        num_layers: Transformer blocks L.
        num_heads: query heads a.
        num_kv_heads: key/value heads (= num_heads without GQA).
        head_dim: per-head width (h / a unless the config sets it).
        ffn_hidden_size: MLP inner width.
        max_position_embeddings: longest sequence.
        norm_eps: LayerNorm / RMSNorm epsilon.
        tie_embeddings: the LM head reuses the input embedding.
        qkv_bias / mlp_bias / out_bias: which linears have biases.
        activation: transformers' ACT2FN name of the MLP activation (GPT-2 "gelu_new", Llama "silu";
            models/activations.py).
        dropout: hidden dropout -- probability on each residual branch's output (Megatron's
            `--hidden-dropout`; GPT-2's resid_pdrop; 0 for the Llama family, which has none).
        embedding_dropout: probability on the embedding output (GPT-2's embd_pdrop); None: `dropout`.
        attention_dropout: probability on the attention probabilities (GPT-2's attn_pdrop, Llama's
            attention_dropout); None: `dropout`.
        sliding_window: window W of sliding-window attention: the query at position t attends keys
            at positions (t - W, t] (transformers' `kv_idx > q_idx - sliding_window`); None: full.
        sliding_layers: the layer ids that use the window (Mistral: all; Qwen2: those whose
            `layer_types` entry is "sliding_attention").
        model_type: transformers' model_type ("gpt2", "llama", "mistral", "qwen2", "mixtral", "qwen2_moe");
            None: the arch's.
        rope_type: transformers' rope_parameters.rope_type ("default": theta^(-2i/d); "linear", "yarn",
            "llama3" are computed by transformers from `hf`); unused by GPT-2.
        rope_theta: RoPE base theta (rope_parameters.rope_theta); unused by GPT-2.
        name: the preset's name (models/presets.py), None for a config read from transformers; not
            compared.
        hf_config: the transformers config it came from (a config.json, a config object), None for a
            preset; not compared. Read it as `hf`, which builds a preset's on demand.

    Mixture of Experts (model_type "mixtral", "qwen2_moe"; hybrid/moe, docs/moe.md; 0 experts: every layer has the
    dense MLP):
        num_experts: routed experts E per MoE layer (Mixtral num_local_experts, Qwen2-MoE num_experts).
        moe_top_k: experts each token is sent to, k (num_experts_per_tok).
        moe_ffn_hidden_size: inner width of one routed expert's SwiGLU (Mixtral intermediate_size,
            Qwen2-MoE moe_intermediate_size).
        moe_layers: ids of the layers whose MLP is the MoE block (Mixtral: all; Qwen2-MoE: those with
            (i + 1) % decoder_sparse_step == 0 not in mlp_only_layers); the others keep the dense MLP.
        moe_router_pre_softmax: True: softmax over all E logits, then top-k of the probabilities
            (transformers' Mixtral and Qwen2-MoE); False: top-k of the logits, softmax over the k
            (Megatron's default). Equal after renormalisation; they differ without it.
        moe_norm_topk_prob: the k selected probabilities are divided by their sum (Mixtral always;
            Qwen2-MoE norm_topk_prob).
        moe_shared_expert_ffn_hidden_size: inner width of the shared expert every token also goes
            through (Qwen2-MoE shared_expert_intermediate_size); 0: none.
        moe_shared_expert_gate: the shared expert's output is scaled by sigmoid(x w_g), w_g of shape
            (1, h) (Qwen2-MoE's shared_expert_gate).
    """

    arch: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    max_position_embeddings: int
    norm_eps: float
    tie_embeddings: bool
    qkv_bias: bool
    mlp_bias: bool
    out_bias: bool
    activation: str = "gelu_new"
    dropout: float = 0.0
    embedding_dropout: float | None = None
    attention_dropout: float | None = None
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = ()
    model_type: str | None = None
    rope_type: str = "default"
    rope_theta: float = 10000.0
    name: str | None = field(default=None, compare=False)
    hf_config: PretrainedConfig | None = field(default=None, compare=False, repr=False)
    # --- Mixture of Experts (hybrid/moe; fields documented above) ---------------------------------
    num_experts: int = 0
    moe_top_k: int = 0
    moe_ffn_hidden_size: int = 0
    moe_layers: tuple[int, ...] = ()
    moe_router_pre_softmax: bool = True
    moe_norm_topk_prob: bool = True
    moe_shared_expert_ffn_hidden_size: int = 0
    moe_shared_expert_gate: bool = False
    # ----------------------------------------------------------------------------------------------

    def __post_init__(self) -> None:
        if self.model_type is None:
            object.__setattr__(self, "model_type", self.arch)
        for name in ("embedding_dropout", "attention_dropout"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, self.dropout)
        for name in ("dropout", "embedding_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"--model: {name} {getattr(self, name)} must be in [0, 1)")
        if self.sliding_layers and (self.sliding_window is None or self.sliding_window < 1):
            raise ValueError(f"--model: sliding_window {self.sliding_window} must be >= 1 for the sliding "
                             f"layers {list(self.sliding_layers)}")
        if self.num_experts:
            from hybrid.moe.shapes import check_model_fields
            check_model_fields(self)

    def is_moe_layer(self, layer_id: int) -> bool:
        """Layer `layer_id`'s MLP is the Mixture-of-Experts block (hybrid/moe)."""
        return self.num_experts > 0 and layer_id in self.moe_layers

    def window(self, layer_id: int) -> int | None:
        """The attention window of layer `layer_id` (None: full causal attention)."""
        return self.sliding_window if layer_id in self.sliding_layers else None

    @property
    def num_parameters(self) -> int:
        """Exact parameter count (unpadded vocabulary, tied embedding counted once)."""
        h, f, hd = self.hidden_size, self.ffn_hidden_size, self.head_dim
        q, kv = self.num_heads * hd, self.num_kv_heads * hd
        attn = h * (q + 2 * kv) + q * h + (q + 2 * kv) * self.qkv_bias + h * self.out_bias
        if self.arch == ARCH_GPT2:
            mlp, norms = 2 * h * f + (f + h) * self.mlp_bias, 2 * 2 * h
        else:
            mlp, norms = 3 * h * f + (2 * f + h) * self.mlp_bias, 2 * h
        final_norm = 2 * h if self.arch == ARCH_GPT2 else h
        embed = self.vocab_size * h * (1 if self.tie_embeddings else 2)
        pos = self.max_position_embeddings * h if self.arch == ARCH_GPT2 else 0
        n_moe = sum(1 for i in range(self.num_layers) if self.is_moe_layer(i))
        moe = n_moe * (self.moe_mlp_parameters - mlp)  # MoE layers hold the MoE block instead of the dense MLP
        return self.num_layers * (attn + mlp + norms) + final_norm + embed + pos + moe

    @property
    def moe_mlp_parameters(self) -> int:
        """Parameters of one MoE block: router E h, E SwiGLU experts 3 h f_e, the shared expert 3 h f_s and its
        gate h."""
        h, E = self.hidden_size, self.num_experts
        shared = 3 * h * self.moe_shared_expert_ffn_hidden_size + h * self.moe_shared_expert_gate
        return E * h + E * 3 * h * self.moe_ffn_hidden_size + shared

    @property
    def hf(self) -> PretrainedConfig | None:
        """The transformers config: the one it was read from, or a preset's, built once from
        models/presets.py's arguments (imports transformers); None for a config made here (the planner's)."""
        if self.hf_config is None and self.name is not None:
            from models.presets import transformers_config
            object.__setattr__(self, "hf_config", transformers_config(self.name))
        return self.hf_config

    def rope_inv_freq(self) -> tuple[torch.Tensor, float]:
        """RoPE inverse frequencies and attention scaling, as transformers computes them: the default
        theta^(-2i/d), i = 0 .. d/2 - 1 (its `compute_default_rope_parameters`), here; the scaled types by
        transformers' ROPE_INIT_FUNCTIONS on the config it came from."""
        if self.rope_type != "default":
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
            inv_freq, scale = ROPE_INIT_FUNCTIONS[self.rope_type](self.hf, None)
            return inv_freq.float(), float(scale)
        import torch  # here, not at the top: the planner reads configs without the runtime (`hybrid plan` starts in ~1 s)
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / self.head_dim
        return 1.0 / (self.rope_theta ** exponent), 1.0


def from_hf(hf: PretrainedConfig) -> ModelConfig:
    """Our config from a transformers config object; a field that changes the math in a way we do
    not implement is a ValueError naming it (models/hf_fields.py)."""
    from models import hf_fields
    if hf.model_type not in hf_fields.ALL:
        raise ValueError(f"--model: unsupported model_type {hf.model_type!r}; supported: {', '.join(hf_fields.ALL)}")
    hf_fields.check_supported(hf)
    if hf.model_type == "gpt2":
        return ModelConfig(
            arch=ARCH_GPT2, vocab_size=hf.vocab_size, hidden_size=hf.n_embd, num_layers=hf.n_layer,
            num_heads=hf.n_head, num_kv_heads=hf.n_head, head_dim=hf.n_embd // hf.n_head,
            ffn_hidden_size=hf.n_inner or 4 * hf.n_embd, max_position_embeddings=hf.n_positions,
            norm_eps=hf.layer_norm_epsilon, tie_embeddings=True, qkv_bias=True, mlp_bias=True, out_bias=True,
            activation=hf.activation_function, dropout=float(hf.resid_pdrop),
            embedding_dropout=float(hf.embd_pdrop), attention_dropout=float(hf.attn_pdrop), model_type="gpt2",
            hf_config=hf)
    heads = hf.num_attention_heads
    llama = hf.model_type == "llama"  # Mistral's and Qwen2's modeling code reads no bias flags
    window, windowed = hf_fields.sliding_layers(hf)
    rope = getattr(hf, "rope_parameters", None) or {}
    return ModelConfig(
        arch=ARCH_LLAMA, vocab_size=hf.vocab_size, hidden_size=hf.hidden_size,
        num_layers=hf.num_hidden_layers, num_heads=heads,
        num_kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
        head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
        ffn_hidden_size=hf.intermediate_size, max_position_embeddings=hf.max_position_embeddings,
        norm_eps=hf.rms_norm_eps, tie_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        qkv_bias=hf.model_type == "qwen2" or (llama and bool(hf.attention_bias)) or bool(getattr(hf, "qkv_bias", False)),
        mlp_bias=llama and bool(hf.mlp_bias), out_bias=llama and bool(hf.attention_bias),
        activation=hf.hidden_act, dropout=0.0, embedding_dropout=0.0,
        attention_dropout=float(hf.attention_dropout or 0.0), sliding_window=window, sliding_layers=windowed,
        model_type=hf.model_type, rope_type=rope.get("rope_type", "default"),
        rope_theta=float(rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))), hf_config=hf,
        **moe_fields(hf))


def moe_fields(hf: PretrainedConfig) -> dict:
    """The Mixture-of-Experts fields of ModelConfig from a Mixtral / Qwen2-MoE config ({} for a dense one).
    transformers' routers both take the softmax over all experts before top-k (pre-softmax); Mixtral always
    renormalises the k probabilities, Qwen2-MoE when norm_topk_prob."""
    layers = range(hf.num_hidden_layers)
    if hf.model_type == "mixtral":
        return dict(num_experts=hf.num_local_experts, moe_top_k=hf.num_experts_per_tok,
                    moe_ffn_hidden_size=hf.intermediate_size, moe_layers=tuple(layers))
    if hf.model_type == "qwen2_moe":
        outside = sorted(set(hf.mlp_only_layers or ()) - set(layers))
        if outside:  # transformers compares each layer's index with the list: an index past the model is ignored
            raise ValueError(f"--model: mlp_only_layers {outside} names no layer of the model's "
                             f"{hf.num_hidden_layers} (indices 0 to {hf.num_hidden_layers - 1}); give those layers' "
                             f"indices, counted from 0")
        moe = tuple(i for i in layers if i not in (hf.mlp_only_layers or ())
                    and hf.num_experts > 0 and (i + 1) % hf.decoder_sparse_step == 0)
        return dict(num_experts=hf.num_experts if moe else 0, moe_top_k=hf.num_experts_per_tok,
                    moe_ffn_hidden_size=hf.moe_intermediate_size, moe_layers=moe,
                    moe_norm_topk_prob=bool(hf.norm_topk_prob),
                    moe_shared_expert_ffn_hidden_size=hf.shared_expert_intermediate_size,
                    moe_shared_expert_gate=True)
    return {}


SUPPORTED_MODEL_TYPES = ("gpt2", "llama", "mistral", "qwen2", "mixtral", "qwen2_moe")
# config.json keys that are sizes (a positive integer when present; None allowed where transformers derives it)
_SIZE_KEYS = {"n_embd": False, "n_head": False, "n_layer": False, "n_positions": False, "n_inner": True,
              "hidden_size": False, "num_attention_heads": False, "num_hidden_layers": False,
              "num_key_value_heads": True, "intermediate_size": False, "vocab_size": False,
              "max_position_embeddings": False, "head_dim": True,
              "num_local_experts": False, "num_experts_per_tok": False, "moe_intermediate_size": False,
              "decoder_sparse_step": False}


def preset_hint(key: str, presets) -> str:
    """The "did you mean" of a --model that is no preset and no file. "org/name" whose org is no folder here (a
    Hugging Face Hub id: nothing is downloaded) says how to get the folder; a preset in capitals, or one with a
    suffix after a dash ('gpt2-small', 'llama-3-8b-instruct': the longest preset it starts with), is named; else
    difflib's nearest spelling ('tiny-lama'). difflib alone sent 'gpt2-small', GPT-2's 124M, to 'gpt2-xl', its 1.5B."""
    parts = key.split("/")
    if len(parts) == 2 and all(parts) and not os.path.exists(parts[0]):
        return (f"as a Hugging Face Hub id it is not downloaded here: fetch the folder first (`hf download {key} "
                f"--local-dir DIR`), then give --model DIR (train.py: `--load DIR` too, for its weights); ")
    low = key.lower()
    prefix = [p for p in presets if low.startswith(p + "-") or low.startswith(p + "_")]
    if low in presets or prefix:
        return f"did you mean {low if low in presets else max(prefix, key=len)!r}? "
    import difflib
    close = difflib.get_close_matches(low, presets, n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def load_config(name_or_path: str | os.PathLike) -> ModelConfig:
    """A preset name, a directory holding config.json, or a config.json file. Every unreadable, malformed or
    unsupported config is a ValueError naming the file and what is wrong (never transformers' OSError/KeyError)."""
    from models.presets import PRESETS
    key = str(name_or_path)
    if key in PRESETS:
        return PRESETS[key]
    path = os.fspath(name_or_path)
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if os.path.isdir(path) and not os.path.isfile(file):
        raise ValueError(f"--model {path!r}: the directory has no config.json (a transformers model directory "
                         f"holds one; write it with config.save_pretrained)")
    if not os.path.isfile(file):
        raise ValueError(f"--model {key!r} is neither a preset nor a directory with config.json; "
                         f"{preset_hint(key, PRESETS)}presets: {', '.join(PRESETS)} (hybrid models)")
    raw = read_config_json(file)
    from huggingface_hub.errors import StrictDataclassError  # transformers' config validation (it imports it)
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging
    verbosity = hf_logging.get_verbosity()
    # transformers' own config warnings (a token id outside the vocabulary, say) are not ours to print: what
    # matters is checked here and in hf_fields, and a bad input stays one line
    hf_logging.set_verbosity_error()
    try:
        if os.path.isdir(path):
            hf = AutoConfig.from_pretrained(path)
        else:
            hf = AutoConfig.for_model(raw.pop("model_type"), **raw)
    except (OSError, KeyError, TypeError, ValueError, AttributeError, StrictDataclassError) as e:
        # huggingface_hub's strict-dataclass error spreads one reason over two lines ("Validation error for
        # field 'attention_bias':" / "TypeError: ... expected bool, got str"): keep both, on one line
        reason = " ".join(ln.strip() for ln in str(e).strip().splitlines()[:2]) or type(e).__name__
        raise ValueError(f"--model {file}: transformers cannot build a {raw.get('model_type', '')} config from it "
                         f"({reason})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    _check_misspelt_keys(raw, hf, file)
    try:
        return from_hf(hf)
    except ValueError as e:  # a rejected field: say which file holds it
        raise ValueError(str(e).replace("--model:", f"--model {file}:", 1)) from None


# keys a config.json of another transformers version holds that this version's to_dict() no longer lists (it moved
# rope_theta and rope_scaling into rope_parameters, torch_dtype to dtype; gpt2's n_ctx is long gone)
_LEGACY_KEYS = frozenset({"rope_theta", "rope_scaling", "torch_dtype", "n_ctx", "transformers_version"})


def _check_misspelt_keys(raw: dict, hf: PretrainedConfig, file: str) -> None:
    """A key that is no field of the model_type's config but a near spelling of one the file lacks
    (num_attention_head for num_attention_heads) is a typo: transformers keeps it as an unused attribute and the
    model silently gets the field's default (32 heads for a llama). ValueError naming both keys and the default.
    Unknown keys far from every field (a tool's own metadata, task_specific_params) are left alone."""
    import difflib
    cls = type(hf)
    known = set(cls().to_dict()) | set(getattr(cls, "attribute_map", {})) | _LEGACY_KEYS
    absent = [k for k in known if k not in raw and not k.startswith("_")]
    for key in raw:
        if key in known:
            continue
        near = difflib.get_close_matches(key, absent, n=1, cutoff=0.85)
        if near:
            raise ValueError(f"--model {file}: {key!r} is not a {raw.get('model_type')} config field; did you mean "
                             f"{near[0]!r}? (transformers ignores {key!r}, and the model would get the default of "
                             f"{near[0]!r}, {json.dumps(getattr(hf, near[0], None))})")


def read_config_json(file: str) -> dict:
    """The JSON object of a config.json, checked: UTF-8, valid JSON, a supported model_type, sizes that are
    positive integers and head sizes that divide. ValueError naming the file and the key otherwise."""
    try:
        with open(file, encoding="utf-8") as f:
            raw = json.load(f)
    except UnicodeDecodeError:
        raise ValueError(f"--model {file}: not UTF-8 text; a config.json is UTF-8 JSON") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--model {file}: not valid JSON ({json_problem(e)})") from None
    except (ValueError, RecursionError) as e:  # nesting deeper than the parser's stack, a 5000-digit number
        raise ValueError(f"--model {file}: not a config.json hybrid reads ({type(e).__name__})") from None
    except OSError as e:
        raise ValueError(f"--model {file}: cannot read it ({e.strerror})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"--model {file}: the top level must be a JSON object")
    kind = raw.get("model_type")
    if kind is None:
        raise ValueError(f"--model {file}: no model_type; add e.g. \"model_type\": \"llama\" "
                         f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    if kind not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"--model {file}: unsupported model_type {kind!r}; supported: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    if "auto_map" in raw:  # transformers would quietly build its own `kind` class instead (no trust_remote_code)
        names = raw["auto_map"] if isinstance(raw["auto_map"], dict) else {}
        raise ValueError(f"--model {file}: auto_map names custom code ({', '.join(map(str, names)) or 'auto_map'}), "
                         f"which hybrid never runs, so the model may not be the {kind} it builds; if it is a plain "
                         f"{kind}, delete auto_map from config.json")
    _check_causal_lm(raw, file, kind)
    for k, nullable in _SIZE_KEYS.items():
        v = raw.get(k)
        if k in raw and not (v is None and nullable):
            check_number(f"--model {file}: {k}", v, 1, integer=True, show=json.dumps)
    hidden, heads = raw.get("n_embd", raw.get("hidden_size")), raw.get("n_head", raw.get("num_attention_heads"))
    kv = raw.get("num_key_value_heads")
    if hidden and heads and raw.get("head_dim") is None and hidden % heads:
        raise ValueError(f"--model {file}: the hidden size {hidden} is not divisible by the {heads} attention "
                         f"heads; set head_dim or change the sizes")
    if heads and kv and heads % kv:
        raise ValueError(f"--model {file}: num_key_value_heads {kv} does not divide num_attention_heads {heads}")
    _check_rope_factor_json(raw, file)
    return raw


# transformers' task heads on a decoder (LlamaForSequenceClassification, GPT2ForTokenClassification, ...): the file
# describes a classifier, whose weights have no LM head, while hybrid builds (and plans) the causal LM of its sizes
TASK_HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")
CAUSAL_LM_CLASS = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                   "qwen2": "Qwen2ForCausalLM", "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}


def _check_causal_lm(raw: dict, file: str, kind: str) -> None:
    """A config.json whose `architectures` are all task heads (a sequence classifier, say) is refused by name: its
    weights have no LM head (train.py --load failed with "no tensor 'lm_head.weight'") and `hybrid plan` priced a
    vocabulary-wide head the model does not have. A bare backbone (LlamaModel) or no `architectures` is accepted:
    those sizes trained as a causal LM are what the file describes."""
    names = raw.get("architectures")
    if isinstance(names, list) and names and all(isinstance(n, str) and n.endswith(TASK_HEADS) for n in names):
        raise ValueError(f"--model {file}: architectures {json.dumps(names)} is a task head, not a causal language "
                         f"model, which hybrid trains and plans; use a {CAUSAL_LM_CLASS[kind]} checkpoint (for these "
                         f"sizes as a causal LM trained from scratch, write \"architectures\": "
                         f"[\"{CAUSAL_LM_CLASS[kind]}\"] in a copy of config.json)")


def _check_rope_factor_json(raw: dict, file: str) -> None:
    """A RoPE scaling factor below 1 (or NaN) is only a warning line from transformers' config class, printed
    while it builds the config: refuse it here, before, as one error (hf_fields checks it again on the object)."""
    for key in ("rope_scaling", "rope_parameters"):
        params = raw.get(key)
        if isinstance(params, dict) and "factor" in params:
            check_number(f"--model {file}: {key}.factor", params["factor"], 1, show=json.dumps)
