"""`hybrid generate --prompt` of a checkpoint whose run read a preprocessed dataset and recorded no tokenizer (round 24).

Repro (docs/data.md's steps, then docs/convert.md's): a tokenizer of 4,096 ids, `preprocess_data.py` with it, then
`train.py --model cfg.json --data-path data/corpus_text_document --save ck` -- the tokenizer flags are optional there,
the ids are in the .bin -- and `hybrid generate ck --prompt "Hi"`: the prompt went in as UTF-8 bytes (other tokens
of this vocabulary), and the ids >= 256 the model generated were dropped from the text: "Hi" and nothing after it,
exit 0. Now one line before any process group naming the dataset and the two fixes (hybrid/generate/cli.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybrid.cli import main as hybrid_main
from hybrid.convert.tokenizer_out import TOKENS_FILE, export_tokens
from hybrid.data.indexed import IndexedDatasetWriter
from hybrid.generate.cli import check_guessed_bytes
from hybrid.testing import launch

LLAMA = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2,
         "num_hidden_layers": 1, "intermediate_size": 64, "vocab_size": 512, "max_position_embeddings": 64}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One iteration on an indexed dataset of ids up to 511, no tokenizer flag (one forked rank, ~3 s)."""
    d = tmp_path_factory.mktemp("run")
    (d / "cfg.json").write_text(json.dumps(LLAMA))
    w = IndexedDatasetWriter(str(d / "corpus_text_document"), np.uint16)
    rng = np.random.default_rng(0)
    for _ in range(40):
        w.add_document(rng.integers(0, 512, 50))
    w.finalize()
    (run,) = launch(["--model", str(d / "cfg.json"), "--data-path", str(d / "corpus_text_document"), "--seq-length",
                     "16", "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "1", "--eval-iters",
                     "0", "--save", str(d / "ck")], 1, launcher_env=False)
    assert run.returncode == 0, run.stderr[-2000:]
    return d


@pytest.mark.slow  # the module's forked run: ~3-5 s of CPU
def test_a_text_prompt_is_refused_before_any_process_group(trained, one_line, one_process):
    line = one_line(lambda: hybrid_main(["generate", str(trained / "ck"), "--prompt", "Hi", "--max-new-tokens", "2"]))
    assert line == (f"hybrid generate: error: --prompt: SRC's run read --data-path {trained / 'corpus_text_document'} "
                    f"(token ids of the tokenizer it was preprocessed with) and recorded no tokenizer, and its "
                    f"vocabulary of 512 is not UTF-8 bytes' 256; give --tokenizer (that tokenizer's folder or "
                    f"tokenizer.json) or --prompt-ids")


class _Args:
    def __init__(self, prompt):
        self.prompt = prompt


class _Codec:
    def __init__(self, guessed):
        self.guessed = guessed


class _Cfg:
    def __init__(self, vocab_size):
        self.vocab_size = vocab_size


@pytest.mark.slow  # the module's forked run, converted (round 25: tests/test_convert25_export_tokens.py's case)
def test_an_export_of_ids_refuses_a_text_prompt(trained, one_line, one_process):
    """`hybrid convert` of that run records ids (hybrid_tokens.json); `hybrid generate EXPORT --prompt` refuses."""
    exported = trained / "exported"
    if not exported.exists():
        hybrid_main(["convert", str(trained / "ck"), str(exported), "--no-verify"])
    assert export_tokens(str(exported)) == "ids"
    line = one_line(lambda: hybrid_main(["generate", str(exported), "--prompt", "Hi", "--max-new-tokens", "2"]))
    assert line == (f"hybrid generate: error: --prompt: SRC's {TOKENS_FILE} says its tokens are the ids of an indexed "
                    f"dataset whose tokenizer the run did not record (no tokenizer in SRC), and its vocabulary of 512 "
                    f"is not UTF-8 bytes' 256; give --tokenizer (the tokenizer the data was preprocessed with) or "
                    f"--prompt-ids")


def test_bytes_stay_where_they_are_the_data(tmp_path):
    """Text data (a file that is there), a byte vocabulary, --prompt-ids, a tokenizer found: no refusal."""
    text = tmp_path / "corpus.txt"
    text.write_text("hello\n")
    indexed = {"args": {"data_path": ["0.5", str(tmp_path / "corpus_text_document"), "0.5", str(text)]}}
    check_guessed_bytes(_Args("Hi"), _Cfg(4096), _Codec(True), {"args": {"data_path": [str(text)]}})
    check_guessed_bytes(_Args("Hi"), _Cfg(256), _Codec(True), indexed)
    check_guessed_bytes(_Args(None), _Cfg(4096), _Codec(True), indexed)
    check_guessed_bytes(_Args("Hi"), _Cfg(4096), _Codec(False), indexed)
    check_guessed_bytes(_Args("Hi"), _Cfg(4096), _Codec(True), {"args": {"data_path": None}})  # built-in corpus
    with pytest.raises(ValueError, match="corpus_text_document"):  # the indexed entry of a blend is named
        check_guessed_bytes(_Args("Hi"), _Cfg(4096), _Codec(True), indexed)
