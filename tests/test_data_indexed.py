"""Megatron's indexed dataset (MMIDIDX): our writer and reader against megatron-core 0.16's (byte for byte, when
it is installed -- the `bench` extra), a round trip, and one clear error per bad file."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
import torch

from hybrid.data.indexed import IndexedDataset, IndexedDatasetWriter, optimal_dtype

DOCS = [[5, 6, 7], [1], [], [65000, 2, 3, 4, 9], list(range(300))]


def write(prefix: str, docs=DOCS, dtype=np.uint16) -> None:
    w = IndexedDatasetWriter(prefix, dtype)
    for d in docs:
        w.add_document(d)
    w.finalize()


def test_round_trip_gives_back_every_document(tmp_path):
    prefix = str(tmp_path / "d")
    write(prefix)
    ds = IndexedDataset(prefix)
    assert len(ds) == len(DOCS) and ds.num_tokens == sum(map(len, DOCS))
    assert [ds.get(i).tolist() for i in range(len(DOCS))] == DOCS
    assert ds.get(4, 10, 5).tolist() == [10, 11, 12, 13, 14]
    assert ds.document_indices.tolist() == list(range(len(DOCS) + 1))
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_header_layout_is_the_documented_one(tmp_path):
    """Independent of our reader: parse the bytes by the layout in docs/data.md."""
    prefix = str(tmp_path / "d")
    write(prefix)
    raw = open(prefix + ".idx", "rb").read()
    n, d = len(DOCS), len(DOCS) + 1
    assert raw[:9] == b"MMIDIDX\x00\x00" and struct.unpack("<QBQQ", raw[9:34]) == (1, 8, n, d)
    lengths = np.frombuffer(raw, np.int32, n, 34)
    pointers = np.frombuffer(raw, np.int64, n, 34 + 4 * n)
    assert lengths.tolist() == [len(x) for x in DOCS]
    assert pointers.tolist() == [0, 6, 8, 8, 18]  # 2 bytes per uint16 token
    assert len(raw) == 34 + 12 * n + 8 * d
    assert open(prefix + ".bin", "rb").read() == np.concatenate([np.array(x, np.uint16) for x in DOCS]).tobytes()


def test_optimal_dtype_is_megatrons():
    assert optimal_dtype(65499) is np.uint16 and optimal_dtype(65500) is np.int32


def _megatron():
    try:
        from megatron.core.datasets import indexed_dataset
    except ImportError as e:  # only a missing package skips; any other failure of megatron-core is a failure
        pytest.skip(f"megatron-core not importable ({e}); scripts/setup.sh installs it (pip install -e '.[bench]')")
    return indexed_dataset


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_files_are_byte_identical_to_megatron_cores_and_read_both_ways(tmp_path, dtype):
    mi = _megatron()
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    write(ours, dtype=dtype)
    builder = mi.IndexedDatasetBuilder(theirs + ".bin", dtype=dtype)
    for d in DOCS:  # preprocess_data.py's call: one sentence per document
        builder.add_document(torch.tensor(d, dtype=torch.int64), [len(d)])
    builder.finalize(theirs + ".idx")
    for ext in (".bin", ".idx"):
        assert open(ours + ext, "rb").read() == open(theirs + ext, "rb").read(), ext
    mds = mi.IndexedDataset(ours)  # megatron reads ours
    assert [mds[i].tolist() for i in range(len(DOCS))] == DOCS
    assert mds.document_indices.tolist() == IndexedDataset(theirs).document_indices.tolist()


def test_missing_idx_is_one_clear_error(tmp_path):
    prefix = str(tmp_path / "d")
    write(prefix)
    os.remove(prefix + ".idx")
    with pytest.raises(ValueError, match=r"d\.idx is missing"):
        IndexedDataset(prefix)


def test_truncated_bin_is_one_clear_error(tmp_path):
    prefix = str(tmp_path / "d")
    write(prefix)
    with open(prefix + ".bin", "r+b") as f:
        f.truncate(100)
    with pytest.raises(ValueError, match="has 100 bytes but the index describes 618"):
        IndexedDataset(prefix)


def test_wrong_magic_is_one_clear_error(tmp_path):
    prefix = str(tmp_path / "d")
    write(prefix)
    raw = bytearray(open(prefix + ".idx", "rb").read())
    raw[:7] = b"NOTMMID"
    open(prefix + ".idx", "wb").write(bytes(raw))
    with pytest.raises(ValueError, match="not a Megatron indexed dataset index"):
        IndexedDataset(prefix)


def test_truncated_idx_is_one_clear_error(tmp_path):
    prefix = str(tmp_path / "d")
    write(prefix)
    raw = open(prefix + ".idx", "rb").read()
    open(prefix + ".idx", "wb").write(raw[:-8])
    with pytest.raises(ValueError, match="the index is truncated or corrupt"):
        IndexedDataset(prefix)
