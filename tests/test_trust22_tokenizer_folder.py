"""A tokenizer folder's attacks that failed (round 22's adversarial review), pinned: no earlier test covered them, and
each holds only because of what transformers 5 does inside AutoTokenizer.from_pretrained, which `hybrid generate`
calls on a folder holding tokenizer_config.json (hybrid/generate/decode.py):

* a path in tokenizer_config.json (`tokenizer_file`, `vocab_file`: "/elsewhere/tokenizer.json") is not opened --
  transformers takes the folder's own files over the config's values (its CWE-22 fix); an older transformers read
  the file the config named, outside the folder;
* a non-JSON file transformers reads (chat_template.jinja) that is a FIFO is skipped, not opened (generate's own
  regular-file check covers the folder's .json files only).

A transformers upgrade that undid either would fail here rather than pass silently."""

from __future__ import annotations

import json
import os
import threading

import pytest

from hybrid.generate import decode


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    from hybrid.data.train_tokenizer import train
    root = tmp_path_factory.mktemp("tok")
    (root / "text.txt").write_text("the quick brown fox jumps over the lazy dog " * 50)
    train([str(root / "text.txt")], 300, str(root / "tok"))
    return str(root / "tok")


@pytest.mark.parametrize("key", ["tokenizer_file", "vocab_file"])
def test_a_path_in_tokenizer_config_is_not_followed_out_of_the_folder(key, tokenizer, tmp_path):
    """The folder holds only a tokenizer_config.json naming the real tokenizer.json elsewhere: loading it must fail
    (no tokenizer in the folder), never succeed with the outside file's tokens."""
    folder = tmp_path / "evil"
    folder.mkdir()
    config = json.load(open(os.path.join(tokenizer, "tokenizer_config.json")))
    config[key] = os.path.join(tokenizer, "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as e:
        decode._tokenizer_codec(str(folder), "--tokenizer")
    assert str(e.value).startswith(f"tokenizer {folder} (--tokenizer): transformers cannot load it ")


def test_a_fifo_chat_template_is_skipped_not_opened(tokenizer, tmp_path):
    import shutil
    folder = tmp_path / "tok"
    shutil.copytree(tokenizer, folder)
    fifo = str(folder / "chat_template.jinja")
    os.mkfifo(fifo)
    opened = []

    def feed():  # returns only when a reader opens the FIFO
        with open(fifo, "w") as f:
            opened.append(True)
            f.write("{{ bos_token }}")
    threading.Thread(target=feed, daemon=True).start()
    codec = decode._tokenizer_codec(str(folder), "--tokenizer")
    assert codec.vocab_size == decode._tokenizer_codec(tokenizer, "--tokenizer").vocab_size and not opened
    os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # release the feeder
