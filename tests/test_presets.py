"""Presets are plain ModelConfig literals (models/presets.py), so a run on one imports neither transformers nor
torch.distributed.checkpoint: each literal equals what transformers' config of the model maps to (every compared
field, RoPE frequencies bit for bit), and the imports are asserted in a fresh interpreter and in a run's ranks.

This module imports transformers only inside its tests: `_train_and_list_modules` runs in forked ranks that import
it by name.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
import torch

from hybrid.testing import ROOT, launch, train_main
from models.config import from_hf, load_config
from models.presets import PRESETS, TRANSFORMERS_ARGS, transformers_config

HEAVY = ("transformers", "torch.distributed.checkpoint")


def test_every_preset_literal_equals_its_transformers_config():
    assert set(PRESETS) == set(TRANSFORMERS_ARGS)
    for name, cfg in PRESETS.items():
        assert cfg.name == name and load_config(name) is cfg
        hf = transformers_config(name)
        assert from_hf(hf) == cfg, name  # every field but the name and the transformers object
        assert cfg.hf.to_dict() == hf.to_dict(), name  # what `hybrid convert` writes for a preset


@pytest.mark.parametrize("name", [n for n, c in PRESETS.items() if c.arch == "llama"])
def test_preset_rope_frequencies_equal_transformers_rotary_embedding(name):
    """The default RoPE is computed here, not by transformers: compare with the model's own rotary module."""
    hf = transformers_config(name)
    module = importlib.import_module(f"transformers.models.{hf.model_type}.modeling_{hf.model_type}")
    rotary = getattr(module, type(hf).__name__.replace("Config", "RotaryEmbedding"))(config=hf)
    inv_freq, scale = PRESETS[name].rope_inv_freq()
    assert torch.equal(inv_freq, rotary.inv_freq) and scale == rotary.attention_scaling == 1.0


def test_default_rope_of_a_config_json_equals_transformers(tmp_path):
    """An integer rope_theta and a head_dim that is not hidden / heads, read from a config.json."""
    from transformers import MistralConfig
    from transformers.models.mistral.modeling_mistral import MistralRotaryEmbedding
    hf = MistralConfig(num_hidden_layers=2, hidden_size=48, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=20, intermediate_size=96, vocab_size=300,
                       rope_parameters={"rope_type": "default", "rope_theta": 12345})
    hf.save_pretrained(tmp_path)
    cfg = load_config(tmp_path)
    inv_freq, _ = cfg.rope_inv_freq()
    assert cfg.rope_theta == 12345 and cfg.hf is not None and cfg.name is None
    assert torch.equal(inv_freq, MistralRotaryEmbedding(config=hf).inv_freq)


def _modules_line() -> str:
    return "heavy modules: " + ",".join(m for m in HEAVY if m in sys.modules)


def test_importing_the_training_entry_point_and_a_one_process_run_import_neither(tmp_path):
    code = ("from hybrid.train.main import main; from tests.test_presets import _modules_line; "
            "print('after import', _modules_line()); "
            "main(['--model', 'tiny-llama', '--train-iters', '1', '--seq-length', '16', '--micro-batch-size', '1', "
            "'--global-batch-size', '1']); print('after the run', _modules_line())")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "after import heavy modules: \n" in out.stdout and out.stdout.endswith("after the run heavy modules: \n")


def _train_and_list_modules(argv: list[str]) -> None:
    try:
        train_main(argv)
    finally:
        print(_modules_line(), flush=True)


@pytest.mark.slow
def test_a_preset_runs_ranks_import_neither(tmp_path):
    argv = ["--model", "tiny-llama", "--tensor-model-parallel-size", "2", "--train-iters", "2", "--seq-length", "16",
            "--micro-batch-size", "1", "--global-batch-size", "1", "--log-interval", "1"]
    runs = launch(argv, world=2, cwd=str(tmp_path), timeout=300, entry=_train_and_list_modules)
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.endswith("heavy modules: \n"), r.stdout[-500:]
    assert "done: final lm loss" in runs[0].stdout
