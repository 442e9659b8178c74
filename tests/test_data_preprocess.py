"""scripts/train_tokenizer.py and scripts/preprocess_data.py: the tokenizer folder loads in transformers and
encodes as `tokenizers` does; preprocessing writes each document's ids (+ EOD) to Megatron's format, the same bytes
with 1 or 2 workers; bad inputs are one error line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybrid.data import preprocess, train_tokenizer
from hybrid.data.indexed import IndexedDataset

TEXTS = ["Hello world.\nSecond line.", "def f(x):\n    return x + 1", "Ünïcödé — text ✓", "short"] * 5


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    train_tokenizer.main(["--output", str(d), "--vocab-size", "400"])  # on Python's pydoc topics
    return d


def _jsonl(path, texts, key="text"):
    path.write_text("".join(json.dumps({key: t, "id": i}) + "\n" for i, t in enumerate(texts)))


def test_tokenizer_folder_loads_in_transformers_and_encodes_alike(tok_dir):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    ours = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(str(tok_dir))
    assert ours.get_vocab_size() == 400 and ours.token_to_id("<|endoftext|>") == 0
    for t in TEXTS[:4]:
        ids = ours.encode(t).ids
        assert hf.encode(t, add_special_tokens=False) == ids
        assert ours.decode(ids) == t  # byte-level BPE is lossless


def test_preprocess_writes_every_document_and_eod_alike_with_1_or_2_workers(tmp_path, tok_dir):
    from tokenizers import Tokenizer

    _jsonl(tmp_path / "in.jsonl", TEXTS)
    ref = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    for workers in (1, 2):
        stats = preprocess.main(["--input", str(tmp_path / "in.jsonl"), "--output-prefix", str(tmp_path / f"w{workers}"),
                                 "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tok_dir),
                                 "--append-eod", "--workers", str(workers)])
        ds = IndexedDataset(str(tmp_path / f"w{workers}_text_document"))
        assert ds.dtype == np.uint16 and len(ds) == len(TEXTS) == stats["documents"]
        for i, t in enumerate(TEXTS):
            assert ds.get(i).tolist() == ref.encode(t).ids + [0]
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"w1_text_document{ext}").read_bytes() == (tmp_path / f"w2_text_document{ext}").read_bytes()


def test_plain_text_paragraphs_are_documents_with_byte_level(tmp_path):
    (tmp_path / "in.txt").write_text("first para\nline two\n\n\nsecond\n\nthird\n")
    preprocess.main(["--input", str(tmp_path / "in.txt"), "--output-prefix", str(tmp_path / "o"),
                     "--tokenizer-type", "ByteLevel", "--append-eod"])
    ds = IndexedDataset(str(tmp_path / "o_text_document"))
    docs = [bytes(ds.get(i)[:-1].astype(np.uint8)).decode() for i in range(len(ds))]
    assert docs == ["first para\nline two\n", "second\n", "third\n"] and ds.get(0)[-1] == 0


@pytest.mark.parametrize("lines,argv,fragment", [
    ('{"content": "x"}\n', [], "line 1 has no string 'text'"),
    ('{"text": "x"}\nnot json\n', [], "line 2 is not JSON"),
    ('{"text": "x"}\n', ["--tokenizer-model", "/nonexistent"], "--tokenizer-model"),
    ('{"text": "x"}\n', ["--workers", "0"], "--workers"),
])
def test_bad_input_is_one_error_line_and_leaves_no_dataset(tmp_path, tok_dir, capsys, lines, argv, fragment):
    (tmp_path / "in.jsonl").write_text(lines)
    model = [] if "--tokenizer-model" in argv else ["--tokenizer-model", str(tok_dir)]
    with pytest.raises(SystemExit) as e:
        preprocess.main(["--input", str(tmp_path / "in.jsonl"), "--output-prefix", str(tmp_path / "o"),
                         "--tokenizer-type", "HuggingFaceTokenizer", *model, *argv])
    err = capsys.readouterr().err + (e.value.code if isinstance(e.value.code, str) else "")
    lines_out = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines_out) == 1 and lines_out[0].startswith("preprocess_data.py: error:"), lines_out
    assert fragment in lines_out[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
