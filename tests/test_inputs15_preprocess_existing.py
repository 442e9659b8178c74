"""preprocess_data.py never replaces an indexed dataset (newuser15's finding, unfixed by that helper): a second
tokenization to a prefix whose .bin/.idx exist is one line naming --output-prefix, before any tokenizing, and the
files stay byte for byte; a bad input is still named first (test_trust's rule), a fresh prefix still works."""

from __future__ import annotations

import json
import os

import pytest

from hybrid.data import preprocess
from hybrid.testing_inputs import OneLine


def _corpus(path, n=12):
    path.write_text("".join(json.dumps({"text": f"document {i} about foxes"}) + "\n" for i in range(n)))
    return str(path)


def _one_line(fn, capsys):
    return OneLine(capsys)(fn)


def _bytes(folder):
    return {f: open(os.path.join(folder, f), "rb").read() for f in sorted(os.listdir(folder))}


@pytest.mark.parametrize("which", ["both", "idx-only", "bin-only"])
def test_an_existing_dataset_is_never_replaced_and_nothing_is_tokenized(tmp_path, capsys, monkeypatch, which):
    first = _corpus(tmp_path / "a.jsonl")
    prefix = str(tmp_path / "data")
    preprocess.main(["--input", first, "--output-prefix", prefix, "--tokenizer-type", "ByteLevel"])
    if which != "both":
        os.remove(prefix + "_text_document." + ("bin" if which == "idx-only" else "idx"))
    capsys.readouterr()
    before = _bytes(tmp_path)
    second = _corpus(tmp_path / "b.jsonl", n=30)
    before[os.path.basename(second)] = open(second, "rb").read()
    monkeypatch.setattr(preprocess, "run", lambda *a, **k: pytest.fail("tokenized before refusing"))
    line = _one_line(lambda: preprocess.main(["--input", second, "--output-prefix", prefix,
                                              "--tokenizer-type", "ByteLevel"]), capsys)
    assert line.startswith("preprocess_data.py: error: --output-prefix ") and "already exists" in line, line
    assert "give a new --output-prefix" in line
    assert _bytes(tmp_path) == before


def test_a_bad_input_is_named_before_the_existing_output(tmp_path, capsys):
    prefix = str(tmp_path / "data")
    preprocess.main(["--input", _corpus(tmp_path / "a.jsonl"), "--output-prefix", prefix,
                     "--tokenizer-type", "ByteLevel"])
    capsys.readouterr()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n" + "{\"text\": \n")
    line = _one_line(lambda: preprocess.main(["--input", str(bad), "--output-prefix", prefix,
                                              "--tokenizer-type", "ByteLevel"]), capsys)
    assert "error: --input" in line and "line 2" in line, line


def test_a_new_prefix_beside_an_existing_dataset_is_written(tmp_path, capsys):
    src = _corpus(tmp_path / "a.jsonl")
    preprocess.main(["--input", src, "--output-prefix", str(tmp_path / "one"), "--tokenizer-type", "ByteLevel"])
    stats = preprocess.main(["--input", src, "--output-prefix", str(tmp_path / "two"), "--tokenizer-type",
                             "ByteLevel"])
    assert stats["documents"] == 12
    assert os.path.getsize(tmp_path / "one_text_document.bin") == os.path.getsize(tmp_path / "two_text_document.bin")
