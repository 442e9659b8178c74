"""Model configs from presets, transformers config objects and config.json files."""

from __future__ import annotations

import json

import pytest
from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

from models.config import from_hf, load_config
from models.presets import PRESETS


@pytest.mark.parametrize("name,params", [("gpt2", 124_439_808), ("gpt2-xl", 1_557_611_200),
                                         ("llama-3-8b", 8_030_261_248), ("llama-3-70b", 70_553_706_496)])
def test_real_presets_have_the_published_parameter_counts(name, params):
    assert load_config(name).num_parameters == params


def test_every_preset_loads():
    for name in PRESETS:
        cfg = load_config(name)
        assert cfg.num_heads % cfg.num_kv_heads == 0


def test_transformers_configs_map_to_our_architecture():
    assert from_hf(GPT2Config(n_layer=2, n_embd=32, n_head=4)).arch == "gpt2"
    llama = from_hf(LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2))
    assert (llama.arch, llama.num_kv_heads, llama.qkv_bias) == ("llama", 2, False)
    mistral = from_hf(MistralConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=1))
    assert (mistral.arch, mistral.num_kv_heads, mistral.head_dim) == ("llama", 1, 8)
    qwen = from_hf(Qwen2Config(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2))
    assert qwen.qkv_bias and not qwen.out_bias


def test_config_json_directory_and_file(tmp_path):
    LlamaConfig(num_hidden_layers=3, hidden_size=48, num_attention_heads=6, num_key_value_heads=3,
                intermediate_size=96, vocab_size=300).save_pretrained(tmp_path)
    from_dir = load_config(tmp_path)
    from_file = load_config(tmp_path / "config.json")
    assert from_dir == from_file
    assert (from_dir.num_layers, from_dir.hidden_size, from_dir.vocab_size) == (3, 48, 300)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "llama"


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match="--model 'nope' is neither a preset"):
        load_config("nope")


def test_tiny_presets_have_dropout_zero():
    """The parallel-vs-single-process tests train the tiny presets; dropout masks of TP-sharded
    regions differ between layouts by design (per-TP-rank streams), so those tests need dropout 0."""
    for name in ("tiny-gpt2", "tiny-llama", "tiny-qwen2"):
        cfg = load_config(name)
        assert (cfg.dropout, cfg.embedding_dropout, cfg.attention_dropout) == (0.0, 0.0, 0.0), name


def test_real_gpt2_keeps_its_published_dropout():
    cfg = load_config("gpt2")
    assert (cfg.dropout, cfg.embedding_dropout, cfg.attention_dropout) == (0.1, 0.1, 0.1)
