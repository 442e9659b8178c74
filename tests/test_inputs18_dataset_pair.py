"""The indexed dataset's .bin / .idx pair is whole-or-nothing as a reader sees it, even when a SIGKILL lands between
the writer's two renames (round 17 left it open).

Repro (round 17's order: .bin renamed over the old one, then .idx): write a pair d.bin / d.idx, then write another
over it with HYBRID_FAULT="crash:point=dataset_bin_renamed,signal=SIGKILL" -- the reader then read the new .bin
through the old .idx, [[9, 8, 7], [6, 5], [4]]: a dataset neither run wrote, without a word (the sizes agreed).
Now the writer removes an older .idx before its renames: a kill there leaves d.bin without d.idx, which the reader
names as missing, and preprocess_data.py names as an interrupted write (not "a dataset a run may be reading").

The kill is a real SIGKILL in a child (tests/test_trust17_kill_writers.py's `_killed_at`, the one fault hook).
"""

from __future__ import annotations

import os

import pytest

from hybrid.data.indexed import IndexedDataset, IndexedDatasetWriter
from tests.test_trust17_kill_writers import _killed_at, _strays

OLD, NEW = ([1, 2, 3], [4, 5], [6]), ([9], [8, 7, 6, 5, 4])  # the same 6 tokens: the .bin sizes agree


def _writer(docs) -> str:
    return ("from hybrid.data.indexed import IndexedDatasetWriter as W\n"
            "w = W('data/d')\n"
            f"for doc in {docs!r}:\n"
            "    w.add_document(doc)\n"
            "w.finalize()\n")


def _old_pair(tmp_path) -> None:
    (tmp_path / "data").mkdir()
    w = IndexedDatasetWriter(str(tmp_path / "data" / "d"))
    for doc in OLD:
        w.add_document(doc)
    w.finalize()
    assert [IndexedDataset(str(tmp_path / "data" / "d")).get(i).tolist() for i in range(3)] == list(map(list, OLD))


def test_a_kill_between_the_renames_over_an_old_pair_leaves_no_pair_a_reader_takes(tmp_path):
    _old_pair(tmp_path)
    _killed_at("dataset_bin_renamed", _writer(NEW), str(tmp_path))
    assert (tmp_path / "data" / "d.bin").read_bytes() == b"".join(i.to_bytes(4, "little") for i in (9, 8, 7, 6, 5, 4))
    _strays(tmp_path / "data", "d.bin")  # the new .idx under its temporary name only
    with pytest.raises(ValueError, match=r"d\.idx is missing \(found .*d\.bin\)"):
        IndexedDataset(str(tmp_path / "data" / "d"))  # round 17's order: the old .idx beside it, read as a dataset


def test_a_kill_before_the_renames_leaves_the_old_pair_whole(tmp_path):
    _old_pair(tmp_path)
    _killed_at("dataset_written", _writer(NEW), str(tmp_path))
    d = IndexedDataset(str(tmp_path / "data" / "d"))
    assert [d.get(i).tolist() for i in range(len(d))] == list(map(list, OLD))


@pytest.mark.parametrize("left", ["bin", "idx"])
def test_preprocess_names_half_a_pair_as_an_interrupted_write(left, tmp_path, capsys):
    """What the kill leaves is no dataset a run may be reading: the line says which file is alone and the fix."""
    from hybrid.data import preprocess
    from hybrid.testing_inputs import OneLine
    (tmp_path / "a.txt").write_text("one document\n\nanother one\n")
    prefix = str(tmp_path / "p")
    (tmp_path / f"p_text_document.{left}").write_bytes(b"half")
    line = OneLine(capsys)(lambda: preprocess.main(["--input", str(tmp_path / "a.txt"), "--output-prefix", prefix,
                                                    "--tokenizer-type", "ByteLevel"]))
    other = "idx" if left == "bin" else "bin"
    assert line == (f"preprocess_data.py: error: --output-prefix {prefix}: {prefix}_text_document.{left} already "
                    f"exists without its .{other} (left by a preprocess that was killed, or one still writing: no "
                    f"run can read it); delete {prefix}_text_document.{left} if none is running, or give a new "
                    f"--output-prefix"), line
    assert sorted(os.listdir(tmp_path)) == ["a.txt", f"p_text_document.{left}"]  # nothing written
