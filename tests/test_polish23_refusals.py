"""Round 23's polish: two refusals, each one line before any open or process group.

1. A FIFO (or any non-regular file) at an indexed dataset's PREFIX.bin or PREFIX.idx was named "missing"; it is
   "not a regular file", as the checkpoint's .metadata path says (checkpoint/store.py), and no open is tried (a
   FIFO's open for reading blocks until a writer comes).
2. --recompute-method without --recompute-num-layers (or the reverse) is refused as megatron-core's TransformerConfig
   refuses it (Megatron-LM's --recompute-num-layers defaulted to 1 until 2023, None since); the line names the value
   that is every layer recomputed alone. In this process, one rank (conftest's `one_line`)."""

from __future__ import annotations

import builtins
import os

import numpy as np
import pytest

from hybrid.data.indexed import IndexedDataset, IndexedDatasetWriter
from hybrid.data.source import open_dataset
from hybrid.train.main import validate
from models import Recompute


def _pair(prefix: str) -> None:
    w = IndexedDatasetWriter(prefix, np.uint16)
    for doc in ([5, 6, 7], [1, 2]):
        w.add_document(doc)
    w.finalize()


@pytest.fixture
def no_open_of(monkeypatch):
    """`no_open_of(path)`: from here on, an open() or np.memmap of `path` fails the test at once (rather than
    block on a FIFO with no writer)."""
    banned = set()
    real_open, real_memmap = builtins.open, np.memmap

    def guard(path):
        if os.fspath(path) in banned:
            raise AssertionError(f"{path} was opened")

    def opener(file, *a, **k):
        if isinstance(file, (str, bytes, os.PathLike)):
            guard(file)
        return real_open(file, *a, **k)

    class Memmap(real_memmap):
        def __new__(cls, filename, *a, **k):
            guard(filename)
            return real_memmap.__new__(real_memmap, filename, *a, **k)

    monkeypatch.setattr(builtins, "open", opener)
    monkeypatch.setattr(np, "memmap", Memmap)
    return banned.add


@pytest.mark.parametrize("fifo", [".bin", ".idx"])
def test_fifo_at_bin_or_idx_is_not_a_regular_file_and_never_opened(fifo, tmp_path, no_open_of):
    prefix = str(tmp_path / "d")
    _pair(prefix)
    os.remove(prefix + fifo)
    os.mkfifo(prefix + fifo)
    no_open_of(prefix + fifo)
    line = (f"--data-path {prefix}: {prefix}{fifo} is not a regular file (a FIFO, a device or a directory); give "
            f"the .bin/.idx pair scripts/preprocess_data.py writes")
    with pytest.raises(ValueError) as err:
        IndexedDataset(prefix)
    assert str(err.value) == line
    with pytest.raises(ValueError) as err:  # what --data-path PREFIX goes through
        open_dataset(prefix)
    assert str(err.value) == line


def test_both_fifos_are_named_not_missing(tmp_path, no_open_of):
    """Neither file regular: open_dataset used to say "no such file, nor PREFIX.bin / PREFIX.idx"."""
    prefix = str(tmp_path / "d")
    for ext in (".bin", ".idx"):
        os.mkfifo(prefix + ext)
        no_open_of(prefix + ext)
    with pytest.raises(ValueError, match=r"d\.idx is not a regular file \(a FIFO"):
        open_dataset(prefix)


def test_a_missing_file_is_still_missing(tmp_path):
    prefix = str(tmp_path / "d")
    _pair(prefix)
    os.remove(prefix + ".bin")
    with pytest.raises(ValueError, match=r"d\.bin is missing \(found .*d\.idx\)"):
        IndexedDataset(prefix)


# --- 2. --recompute-method / --recompute-num-layers given alone -----------------------------------------------------
@pytest.mark.usefixtures("one_process")
@pytest.mark.parametrize("half, fix", [
    (["--recompute-method", "uniform"], ["--recompute-num-layers", "1"]),
    (["--recompute-method", "block"], ["--recompute-num-layers", "4"]),
    (["--recompute-num-layers", "1"], ["--recompute-method", "uniform"]),
    (["--recompute-num-layers", "4"], ["--recompute-method", "block"]),
    (["--recompute-num-layers", "2"], ["--recompute-method", "block", "--recompute-num-layers", "4"]),
])
def test_half_of_the_recompute_pair_names_the_value_that_runs(half, fix, one_line):
    """tiny-gpt2's 4 layers, pp 1: the line names the flag and value that complete the pair, and the argv with
    that fix applied runs full recomputation (the line's advice is checked, not only its words)."""
    full = ["--recompute-granularity", "full"]
    line = one_line(lambda: validate(full + half))
    assert line.startswith(f"train.py: error: {' '.join(half)} needs {fix[0]} too (megatron-core's pair: ")
    assert f"; give {' '.join(fix)} (every layer recomputed alone), or drop {half[0]}: " in line
    fixed = dict(zip(half[::2], half[1::2])) | dict(zip(fix[::2], fix[1::2]))
    assert validate(full + [x for kv in fixed.items() for x in kv])[0].model.recompute is Recompute.FULL
    assert validate(full)[0].model.recompute is Recompute.FULL  # "drop it: the same run"
