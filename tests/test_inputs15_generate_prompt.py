"""`hybrid generate`'s prompt checks name the flag the user gave (--prompt or --prompt-ids) and count tokens in
English ("1 token", not "1 tokens": newuser15's finding); a prompt that fills the context says how to fix it."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from hybrid.generate.decode import prompt_ids

CFG = SimpleNamespace(vocab_size=10, max_position_embeddings=4)


class _Codec:
    def encode(self, text):
        return [int(c) for c in text]


def _error(**kw):
    args = argparse.Namespace(prompt=kw.get("prompt"), prompt_ids=kw.get("prompt_ids"))
    with pytest.raises(ValueError) as e:
        prompt_ids(args, CFG, _Codec())
    return str(e.value)


def test_one_out_of_vocabulary_id_is_one_token_named_by_its_flag():
    assert _error(prompt_ids="12").startswith("--prompt-ids: 1 token, 1 outside the vocabulary [0, 10)")


def test_a_prompt_that_fills_the_context_names_prompt_and_the_fix():
    line = _error(prompt="1234")
    assert line.startswith("--prompt: 4 tokens, the model's context is 4") and "give a shorter prompt" in line


def test_a_prompt_that_fits_is_returned_whole():
    args = argparse.Namespace(prompt="123", prompt_ids=None)
    assert prompt_ids(args, CFG, _Codec()).tolist() == [[1, 2, 3]]
