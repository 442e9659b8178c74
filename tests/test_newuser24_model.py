"""A new user's --model names (round 24): what a name that is no preset and no folder gets told.

difflib alone answered `--model gpt2-small` (GPT-2's 124M, as nanoGPT and the papers call it) with "did you mean
'gpt2-xl'?" -- the 1.5B, twelve times the model meant -- and a Hugging Face Hub id ("meta-llama/Meta-Llama-3-8B", what
transformers' from_pretrained takes) with no hint that nothing is downloaded here. models/config.preset_hint."""

from __future__ import annotations

import pytest

from models.config import load_config, preset_hint
from models.presets import PRESETS


@pytest.mark.parametrize("name, meant", [
    ("gpt2-small", "gpt2"), ("gpt2-124m", "gpt2"), ("GPT2", "gpt2"), ("Llama-3-8B", "llama-3-8b"),
    ("llama-3-8b-instruct", "llama-3-8b"), ("tiny_gpt2", "tiny-gpt2"), ("tiny-gpt2-small", "tiny-gpt2"),
    ("gpt2-medium-v2", "gpt2-medium"),  # the longest preset it starts with, not gpt2
    ("tiny-lama", "tiny-llama"), ("gpt9", "gpt2"),  # spelling: difflib, as before
])
def test_a_near_name_is_pointed_at_the_preset_it_means(name, meant):
    with pytest.raises(ValueError) as e:
        load_config(name)
    assert f"did you mean {meant!r}?" in str(e.value), str(e.value)


def test_a_hub_id_says_it_is_not_downloaded_and_how_to_get_the_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as e:
        load_config("meta-llama/Meta-Llama-3-8B")
    line = str(e.value)
    assert "not downloaded here" in line and "`hf download meta-llama/Meta-Llama-3-8B --local-dir DIR`" in line
    assert "did you mean" not in line and "\n" not in line
    # a relative path whose first folder exists is a path with a typo, not a Hub id
    (tmp_path / "runs").mkdir()
    assert "hf download" not in preset_hint("runs/modle", PRESETS)


def test_names_with_no_near_preset_get_only_the_list():
    for name in ("nope", "bert-base-uncased"):
        hint = preset_hint(name, PRESETS)
        assert hint == "" or "bert" not in hint, hint
