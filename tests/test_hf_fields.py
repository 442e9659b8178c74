"""transformers config fields: each one that changes the math is implemented (and matches
transformers) or rejected by name; checkpoint tensors must have the shapes config.json implies."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (GPT2Config, LlamaConfig, LlamaForCausalLM, MistralConfig, MixtralConfig, Qwen2Config,
                          Qwen2MoeConfig)

from hybrid.comm import Group
from hybrid.tp import TPContext
from models import build_model, from_hf
from models.hf_io import check_checkpoint, load_hf_checkpoint

SMALL = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=80, vocab_size=256, max_position_embeddings=64)
GPT2 = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=256, n_positions=64, bos_token_id=0, eos_token_id=0)


def _gpt2(**kw):
    return GPT2Config(**{**GPT2, **kw})


def _with(cfg, **attrs):
    """A valid config with attributes set afterwards, as a hand-edited config.json would give
    (transformers' own validators would refuse some of these at construction)."""
    for k, v in attrs.items():
        setattr(cfg, k, v)
    return cfg


def _forced(cfg, **attrs):
    """As _with, past huggingface_hub's strict type check on assignment (a config object built by code
    that sidesteps it): the type checks of hf_fields must not rely on that validator."""
    for k, v in attrs.items():
        object.__setattr__(cfg, k, v)
    return cfg


REJECTED = [  # (config, the field named in the error)
    (_gpt2(scale_attn_weights=False), "scale_attn_weights=False"),
    (_gpt2(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx=True"),
    (_gpt2(reorder_and_upcast_attn=True), "reorder_and_upcast_attn=True"),
    (_gpt2(add_cross_attention=True), "add_cross_attention=True"),
    (_gpt2(tie_word_embeddings=False), "tie_word_embeddings=False"),
    (_gpt2(initializer_range=0.01), "initializer_range=0.01"),
    (_gpt2(activation_function="nope"), "activation_function='nope'"),
    (_with(_gpt2(), n_head=5), "n_head=5"),
    (LlamaConfig(**SMALL, hidden_act="nope"), "hidden_act='nope'"),
    (_with(LlamaConfig(**SMALL), quantization_config={"quant_method": "gptq"}), "quantization_config="),
    (LlamaConfig(**SMALL, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}),
     "rope_parameters.rope_type='dynamic'"),
    (_with(LlamaConfig(**SMALL), rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}),
     "rope_parameters.rope_type='longrope'"),
    (_with(LlamaConfig(**SMALL), rope_parameters={"rope_type": "proportional", "rope_theta": 1e4}),
     "rope_parameters.rope_type='proportional'"),
    (_with(Qwen2Config(**SMALL), rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e4}}),
     "rope_parameters={'full_attention'"),
    (_with(LlamaConfig(**SMALL), rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                  "partial_rotary_factor": 0.5}),
     "rope_parameters.partial_rotary_factor=0.5"),
    (_with(MistralConfig(**{**SMALL, "hidden_size": 34}, head_dim=None)), "num_attention_heads=4"),
    (_with(Qwen2Config(**{**SMALL, "hidden_size": 34})), "num_attention_heads=4"),
    (_with(MistralConfig(**SMALL), layer_types=["full_attention", "sliding_attention"]), "layer_types="),
    (_with(Qwen2Config(**SMALL), layer_types=["chunked_attention", "full_attention"]), "layer_types="),
    (_with(Qwen2Config(**SMALL), layer_types=["sliding_attention", "full_attention"]), "sliding_window=None"),
    (_with(Qwen2Config(**SMALL), is_encoder_decoder=True), "is_encoder_decoder=True"),
    (_with(LlamaConfig(**SMALL), attention_dropout=1.0), "attention_dropout=1.0"),
    # values out of range: transformers' config classes accept every one of these
    (LlamaConfig(**SMALL, rms_norm_eps=float("nan")), "rms_norm_eps=nan must be a finite number > 0"),
    (LlamaConfig(**SMALL, rms_norm_eps=float("inf")), "rms_norm_eps=inf"),
    (MistralConfig(**SMALL, rms_norm_eps=-1e-6), "rms_norm_eps=-1e-06"),
    (Qwen2Config(**SMALL, rms_norm_eps=0.0), "rms_norm_eps=0.0"),
    (_gpt2(layer_norm_epsilon=-1e-5), "layer_norm_epsilon=-1e-05"),
    (_gpt2(layer_norm_epsilon=float("nan")), "layer_norm_epsilon=nan"),
    (_gpt2(attn_pdrop=1.0), "attn_pdrop=1.0 must be a probability in [0, 1)"),
    (_gpt2(resid_pdrop=-0.1), "resid_pdrop=-0.1"),
    (_gpt2(embd_pdrop=float("nan")), "embd_pdrop=nan"),
    (Qwen2Config(**SMALL, attention_dropout=1.5), "qwen2 config field attention_dropout=1.5"),
    (MistralConfig(**SMALL, attention_dropout=-0.5), "attention_dropout=-0.5"),
    (LlamaConfig(**SMALL, rope_parameters={"rope_type": "default", "rope_theta": 0.0}),
     "rope_parameters.rope_theta=0.0"),
    (MistralConfig(**SMALL, rope_parameters={"rope_type": "default", "rope_theta": float("nan")}),
     "rope_parameters.rope_theta=nan"),
    (_with(LlamaConfig(**SMALL), rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 0.5}),
     "rope_parameters.factor=0.5"),
    (_with(LlamaConfig(**SMALL), vocab_size=0), "vocab_size=0 must be a positive integer"),
    (_with(MistralConfig(**SMALL), hidden_size=-32), "hidden_size=-32"),
    (_with(Qwen2Config(**SMALL), num_attention_heads=0), "num_attention_heads=0"),
    (_with(LlamaConfig(**SMALL), num_key_value_heads=0), "num_key_value_heads=0"),
    (_forced(MistralConfig(**SMALL), head_dim=8.5), "head_dim=8.5"),
    (_with(MistralConfig(**SMALL), sliding_window=0), "sliding_window=0"),
    (_with(_gpt2(), n_embd=0), "n_embd=0"),
    (_with(_gpt2(), n_layer=-1), "n_layer=-1"),
    (_forced(_gpt2(), n_inner=2.5), "n_inner=2.5"),
    (_forced(LlamaConfig(**SMALL), attention_bias="yes"), "attention_bias='yes' must be true or false"),
    (_forced(LlamaConfig(**SMALL), tie_word_embeddings=1), "tie_word_embeddings=1"),
]


@pytest.mark.parametrize("hf,field", REJECTED, ids=[f for _, f in REJECTED])
def test_unimplemented_config_field_is_rejected_by_name(hf, field):
    with pytest.raises(ValueError) as e:
        from_hf(hf)
    assert field in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("config_class,model_type", [(GPT2Config, "gpt2"), (LlamaConfig, "llama"),
                                                     (MistralConfig, "mistral"), (Qwen2Config, "qwen2"),
                                                     (MixtralConfig, "mixtral"), (Qwen2MoeConfig, "qwen2_moe")])
def test_every_field_transformers_defines_or_reads_is_classified(config_class, model_type):
    """The reference is transformers itself: every key of the config class's to_dict() and every `config.X`
    that its modeling_<type>.py reads is implemented, harmless, or has a rejection rule -- so a field a new
    transformers release adds fails here rather than being ignored silently."""
    import inspect
    import re

    import transformers

    from models import hf_fields
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    source = inspect.getsource(module)
    read = set(re.findall(r"\bconfig\.([A-Za-z_]\w*)", source))
    read |= set(re.findall(r"getattr\((?:self\.)?config, \"(\w+)\"", source))
    read = {f for f in read if not callable(getattr(config_class, f, None))}  # methods (to_dict, ...)
    fields = set(config_class().to_dict()) | read
    rejected = {r.field for r in hf_fields.RULES if model_type in r.model_types}
    known = hf_fields.IMPLEMENTED[model_type] | hf_fields.HARMLESS | rejected
    assert fields - known == set(), f"transformers {transformers.__version__} {model_type}: unclassified"


def test_top_level_partial_rotary_factor_and_old_rope_scaling_are_rejected():
    """transformers folds a top-level partial_rotary_factor / rope_scaling into rope_parameters; either is
    then rejected by name (RoPE on part of the head, dynamic frequencies)."""
    with pytest.raises(ValueError, match="partial_rotary_factor=0.5"):
        from_hf(LlamaConfig(**SMALL, partial_rotary_factor=0.5))
    with pytest.raises(ValueError, match="rope_type='dynamic'"):
        from_hf(MistralConfig(**SMALL, rope_scaling={"rope_type": "dynamic", "factor": 2.0}))


def test_harmless_fields_are_accepted():
    from_hf(_gpt2(summary_type="mean", summary_first_dropout=0.3, use_cache=False, bos_token_id=1))
    from_hf(LlamaConfig(**SMALL, pretraining_tp=4, use_cache=False, pad_token_id=0))


def test_mistral_and_qwen2_ignore_bias_flags_as_transformers_does():
    """MistralAttention / Qwen2Attention read no attention_bias: a stray one must not add biases."""
    mistral = from_hf(_with(MistralConfig(**SMALL), attention_bias=True, mlp_bias=True))
    qwen = from_hf(_with(Qwen2Config(**SMALL), attention_bias=True, mlp_bias=True))
    assert (mistral.qkv_bias, mistral.out_bias, mistral.mlp_bias) == (False, False, False)
    assert (qwen.qkv_bias, qwen.out_bias, qwen.mlp_bias) == (True, False, False)


@pytest.mark.parametrize("hf,window,layers", [
    (MistralConfig(**SMALL, sliding_window=7), 7, (0, 1)),
    (MistralConfig(**SMALL, sliding_window=None), None, ()),
    (Qwen2Config(**{**SMALL, "num_hidden_layers": 4}, use_sliding_window=True, sliding_window=7, max_window_layers=1),
     7, (1, 2, 3)),
    (Qwen2Config(**SMALL, use_sliding_window=False, sliding_window=7), None, ()),
    (Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=7,
                 layer_types=["sliding_attention", "full_attention"]), 7, (0,)),
], ids=["mistral", "mistral-none", "qwen2-max-window-layers", "qwen2-off", "qwen2-layer-types"])
def test_sliding_window_layers_follow_transformers(hf, window, layers):
    cfg = from_hf(hf)
    assert (cfg.sliding_window, cfg.sliding_layers) == (window, layers)


@pytest.mark.parametrize("rope", [
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16},
], ids=["linear", "yarn"])
def test_static_rope_scaling_matches_transformers(rope, tmp_path):
    """Logits of a 2-layer Llama with RoPE scaling against transformers', tp = 1, fp32; the
    tolerance is test_tp_models' 1e-5 (a few fp32 roundings through two blocks)."""
    hf_cfg = LlamaConfig(**SMALL, rope_parameters=rope)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(hf_cfg).eval()
    hf.save_pretrained(tmp_path)
    model = build_model(from_hf(hf_cfg), TPContext(Group.solo("tp")), seed=None).eval()
    load_hf_checkpoint(model, tmp_path, 0)
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    ref = hf(ids).logits
    assert ((model(ids) - ref).abs().max() / ref.abs().max()).item() <= 1e-5


def test_sliding_window_changes_the_logits(tmp_path):
    """The window matters at this size (so test_tp_models' sliding cases can fail): Mistral with
    window 5 over 24 tokens matches transformers within 1e-5, the same weights with the window
    dropped differ by more than 10% (measured: 56% with test_tp_models' config)."""
    import dataclasses

    from transformers import MistralForCausalLM
    hf_cfg = MistralConfig(**SMALL, sliding_window=5)
    torch.manual_seed(0)
    hf = MistralForCausalLM(hf_cfg).eval()
    hf.save_pretrained(tmp_path)
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    ref = hf(ids).logits
    errs = []
    for cfg in (from_hf(hf_cfg), dataclasses.replace(from_hf(hf_cfg), sliding_layers=())):
        model = build_model(cfg, TPContext(Group.solo("tp")), seed=None).eval()
        load_hf_checkpoint(model, tmp_path, 0)
        errs.append(((model(ids) - ref).abs().max() / ref.abs().max()).item())
    assert errs[0] <= 1e-5 and errs[1] > 0.1, errs


def _saved_gpt2(tmp_path, **cfg_kw):
    from transformers import GPT2LMHeadModel
    GPT2LMHeadModel(_gpt2(**cfg_kw)).save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize("key,grow", [("transformer.wte.weight", 0), ("transformer.h.1.attn.c_attn.weight", 1),
                                      ("transformer.h.0.mlp.c_fc.bias", 0)])
def test_checkpoint_tensor_larger_than_config_is_an_error(tmp_path, key, grow):
    """One tensor is grown by 3 along one dim; the sliced read would crop it and train on. Both the
    pre-flight check (before any process group) and the loader itself name it."""
    path = _saved_gpt2(tmp_path)
    tensors = load_file(path / "model.safetensors")
    expected = list(tensors[key].shape)
    found = list(expected)
    found[grow] += 3
    tensors[key] = torch.zeros(found)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    cfg = from_hf(_gpt2())
    msg = f"tensor {key} has shape {found}, but the model config implies {expected}"
    with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        check_checkpoint(cfg, path)
    model = build_model(cfg, TPContext(Group.solo("tp")), seed=None)
    with pytest.raises(ValueError, match="has shape"):
        load_hf_checkpoint(model, path, 0)


def test_checkpoint_matching_config_passes_and_missing_tensor_is_named(tmp_path):
    path = _saved_gpt2(tmp_path)
    check_checkpoint(from_hf(_gpt2()), path)
    deeper = from_hf(GPT2Config(**{**GPT2, "n_layer": 3}))
    with pytest.raises(ValueError, match="no tensor 'transformer.h.2"):
        check_checkpoint(deeper, path)
    assert json.loads((path / "config.json").read_text())["n_layer"] == 2


def test_checkpoint_deeper_than_config_is_an_error(tmp_path):
    """A 3-layer checkpoint read with a 2-layer config: every tensor the model reads has the right shape, but
    layer 2 would be dropped silently; the check names it."""
    path = _saved_gpt2(tmp_path, n_layer=3)
    with pytest.raises(ValueError, match=r"tensor transformer.h.2.\S+ belongs to layer 2, but the model config has 2"):
        check_checkpoint(from_hf(_gpt2()), path)


def test_train_load_of_a_grown_checkpoint_fails_before_any_process_group(tmp_path):
    """`train.py --load DIR` with a tensor larger than DIR's config.json: check_args (which runs
    before any process group; main turns its ValueError into `train.py: error: ...`) names it."""
    from hybrid.train.args import check_args, parse_args

    path = _saved_gpt2(tmp_path)
    tensors = load_file(path / "model.safetensors")
    tensors["transformer.wpe.weight"] = torch.zeros(80, 32)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"tensor transformer.wpe.weight has shape \[80, 32\], but the model "
                                         r"config implies \[64, 32\]"):
        check_args(parse_args(["--model", str(path), "--load", str(path), "--seq-length", "32"]), 1)


@pytest.mark.parametrize("name,params", [("gpt2.json", 124_439_808), ("llama-3.1-8b.json", 8_030_261_248),
                                         ("mistral-7b-v0.3.json", 7_248_023_552), ("qwen2.5-7b.json", 7_615_616_512),
                                         ("mixtral-8x7b-v0.1.json", 46_702_792_704),
                                         ("qwen1.5-moe-a2.7b.json", 14_315_784_192)])
def test_published_config_json_files_pass_every_check(name, params):
    """The value and field checks refuse nothing real: the config.json files of these models on the Hugging Face
    hub (tests/data/configs: transcribed, every key that transformers reads) load, with the exact parameter
    counts the hub reports for their safetensors (GPT-2 124,439,808; Llama 3.1 8B 8,030,261,248; Mistral 7B v0.3
    7,248,023,552; Qwen2.5 7B 7,615,616,512; the MoE Mixtral 8x7B v0.1 46,702,792,704 and Qwen1.5-MoE-A2.7B
    14,315,784,192)."""
    import os

    from models import load_config
    cfg = load_config(os.path.join(os.path.dirname(__file__), "data", "configs", name))
    assert cfg.num_parameters == params
