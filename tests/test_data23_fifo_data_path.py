"""Round 23's review: --data-path naming a FIFO (or a socket or a device) itself, not a prefix, is "not a regular file" -- not
"no such file, nor PATH.bin / PATH.idx", the line for a path that does not exist -- refused before any open (a
FIFO's open for reading blocks until a writer comes), as polish23 refuses a FIFO at PREFIX.bin / PREFIX.idx."""

from __future__ import annotations

import builtins
import os

import pytest

from hybrid.data.source import open_dataset


def test_a_fifo_data_path_is_not_a_regular_file(tmp_path, monkeypatch):
    path = str(tmp_path / "corpus.txt")
    os.mkfifo(path)
    real_open = builtins.open

    def opener(file, *a, **k):  # only the FIFO's open fails (it would block); pytest's own opens go through
        if isinstance(file, (str, os.PathLike)) and os.fspath(file) == path:
            raise AssertionError(f"opened {file}")
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", opener)
    with pytest.raises(ValueError) as err:
        open_dataset(path)
    assert str(err.value) == (f"--data-path {path!r} is not a regular file (a FIFO, a socket or a device); give a "
                              f"UTF-8 text file or an indexed-dataset prefix (PREFIX.bin + PREFIX.idx)")


def test_a_device_data_path_is_not_a_regular_file():
    with pytest.raises(ValueError, match=r"'/dev/null' is not a regular file"):
        open_dataset("/dev/null")


def test_a_missing_data_path_is_still_no_such_file(tmp_path):
    path = str(tmp_path / "nothing")
    with pytest.raises(ValueError, match=r"no such file, nor .*nothing\.bin / .*nothing\.idx"):
        open_dataset(path)
