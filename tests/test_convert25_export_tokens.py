"""An export says what its tokens are (hybrid_tokens.json, hybrid/convert/tokenizer_out.py), and `hybrid generate
EXPORT --prompt` refuses text for an export of token ids with no tokenizer -- and only then (README's byte-level
`hybrid generate exported/` is tests/test_docs_commands.py's; the end-to-end refusal -- train on ids, convert,
generate -- shares tests/test_newuser24_generate.py's forked run).

Repro (round 24's, one step further): train.py on a preprocessed dataset with no tokenizer flag, `hybrid convert
ck exported/`, `hybrid generate exported/ --prompt Hi`: the prompt went in as UTF-8 bytes, the answer's ids >= 256
were dropped from the text -- nonsense, exit 0."""

from __future__ import annotations

import json

import pytest

from hybrid.convert.tokenizer_out import TOKENS_FILE, export_tokenizer, export_tokens
from hybrid.generate.cli import check_guessed_bytes
from test_newuser24_generate import _Args, _Cfg, _Codec  # generate's argument stand-ins

def _kind(tmp_path, state: dict, carried=()) -> str:
    dst = tmp_path / "dst"
    dst.mkdir(exist_ok=True)
    export_tokenizer(str(dst), list(carried), state, 64)
    return json.loads((dst / TOKENS_FILE).read_text())["tokens"]


def test_what_each_export_records(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("hello\n")
    assert _kind(tmp_path, {"args": {"data_path": None}}) == "bytes"  # the built-in corpus (README's export)
    assert _kind(tmp_path, {"args": {"data_path": [str(text)]}}) == "bytes"
    assert _kind(tmp_path, {"args": {"tokenizer_type": "ByteLevel", "data_path": ["p_text_document"]}}) == "bytes"
    assert _kind(tmp_path, {"args": {"data_path": [str(tmp_path / "p_text_document")]}}) == "ids"
    assert _kind(tmp_path, {"args": {}}) == "unknown"  # an older checkpoint: data_path not recorded
    assert _kind(tmp_path, {"args": {}}, carried=["tokenizer.json"]) == "tokenizer"


def test_a_carried_record_is_kept_where_the_run_adds_nothing(tmp_path):
    """An export converted back to hybrid and exported again: its hybrid_tokens.json (carried) still says ids."""
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / TOKENS_FILE).write_text(json.dumps({"tokens": "ids", "how": "x"}))
    export_tokenizer(str(dst), [TOKENS_FILE], {"converted_from": {"path": "somewhere"}}, 64)
    assert export_tokens(str(dst)) == "ids"


@pytest.mark.parametrize("kind", ["bytes", "unknown", "tokenizer", None, "{broken"])
def test_only_ids_refuse(tmp_path, kind):
    """A transformers folder whose record is not "ids" (or has none, or a broken one) reads --prompt as before."""
    if kind is not None:
        (tmp_path / TOKENS_FILE).write_text(kind if kind.startswith("{") else json.dumps({"tokens": kind}))
    check_guessed_bytes(_Args("Hi"), _Cfg(512), _Codec(True), None, str(tmp_path))
    (tmp_path / TOKENS_FILE).write_text(json.dumps({"tokens": "ids"}))
    check_guessed_bytes(_Args(None), _Cfg(512), _Codec(True), None, str(tmp_path))  # --prompt-ids
    check_guessed_bytes(_Args("Hi"), _Cfg(512), _Codec(False), None, str(tmp_path))  # --tokenizer given
    check_guessed_bytes(_Args("Hi"), _Cfg(256), _Codec(True), None, str(tmp_path))  # a byte vocabulary
    with pytest.raises(ValueError, match=TOKENS_FILE):
        check_guessed_bytes(_Args("Hi"), _Cfg(512), _Codec(True), None, str(tmp_path))
