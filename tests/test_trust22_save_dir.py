"""--save DIR holding entries a save replaces that no hybrid save wrote (round 22's adversarial review).

A save of iteration N replaces DIR/iter_NNNNNNN (shutil.rmtree of a folder) and every save replaces DIR/latest. The
earlier checks refused another run's complete checkpoints, Megatron-LM's and DeepSpeed's folders and source trees,
but an iter_* entry without manifest.json (a folder of the user's, a Megatron-LM iteration whose tracker file is
gone) or a `latest` of other content passed: train.py deleted the folder and replaced the file without a word.
Now refused before any work unless --overwrite-save consents."""

from __future__ import annotations

import importlib
import json
import os

import pytest

from hybrid.checkpoint import store
from hybrid.checkpoint import args as ckpt_args
from hybrid.train.main import validate

train_main = importlib.import_module("hybrid.train.main")
NOTES = "my notes: not a checkpoint\n"


def _user_folder(root):
    (root / "iter_0000002").mkdir(parents=True)
    (root / "iter_0000002" / "notes.txt").write_text(NOTES)


def _user_file(root):
    root.mkdir(parents=True)
    (root / "iter_0000002").write_text(NOTES)


def _user_latest(root):
    root.mkdir(parents=True)
    (root / "latest").write_text(NOTES)


def _files(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


CASES = [("iter-folder-without-manifest", _user_folder, "iter_0000002"),
         ("iter-file", _user_file, "iter_0000002"),
         ("latest-of-other-content", _user_latest, "latest")]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_entries_no_save_wrote_are_refused_by_name_and_kept(case, tmp_path, one_line):
    _, make, name = case
    root = tmp_path / "ck"
    make(root)
    before = _files(root)
    line = one_line(lambda: validate(["--save", str(root)]))
    assert line == (f"train.py: error: --save {str(root)!r} holds {name!r}, which no hybrid save wrote (an iter_* "
                    f"without manifest.json, a `latest` not naming one): a save replaces them, deleting what they "
                    f"hold; give a directory of its own, or pass --overwrite-save to replace them")
    assert _files(root) == before
    assert validate(["--save", str(root), "--overwrite-save"])[0].checkpoint.save == str(root)  # consent given


def test_a_latest_directory_is_refused_even_with_overwrite_save(tmp_path, one_line):
    """A save cannot replace a directory with its `latest` file: it failed at the end of the first save."""
    (tmp_path / "ck" / "latest").mkdir(parents=True)
    line = one_line(lambda: validate(["--save", str(tmp_path / "ck"), "--overwrite-save"]))
    assert line == (f"train.py: error: --save {str(tmp_path / 'ck')!r}: its `latest` is a directory, where every "
                    f"save writes the file naming its newest checkpoint; move it, or give --save a directory of its "
                    f"own")


def test_a_run_folder_of_our_own_saves_and_unfinished_saves_is_not_refused(tmp_path):
    """What hybrid itself leaves -- complete iterations, `latest` naming one, an iter_N.tmp of a killed save -- is
    the same run's folder: resumed into (--load DIR --save DIR) without a word."""
    root = tmp_path / "ck"
    (root / "iter_0000004").mkdir(parents=True)
    (root / "iter_0000004" / store.MANIFEST).write_text("{}")
    (root / "iter_0000006.tmp").mkdir()
    (root / "latest").write_text("iter_0000004\n")
    assert ckpt_args._not_ours(str(root)) == []
    (root / "latest").write_text("iter_0000009\n")  # a name of ours whose folder is gone: still our file
    assert ckpt_args._not_ours(str(root)) == []


def test_finalize_replaces_a_file_at_the_iterations_name(tmp_path):
    """With --overwrite-save's consent the save replaces an iter_N file (shutil.rmtree raised NotADirectoryError at
    the end of the first save)."""
    root = tmp_path / "ck"
    tmp = root / "iter_0000002.tmp"
    tmp.mkdir(parents=True)
    (tmp / ".metadata").write_bytes(b"m")
    (root / "iter_0000002").write_text(NOTES)
    final = store.finalize(str(root), 2, {}, {"iteration": 2})
    assert os.path.isdir(final) and json.load(open(os.path.join(final, store.MANIFEST)))["files"]
    assert store.read_latest(str(root)) == 2


def test_the_deletion_was_live_through_train_py(tmp_path, monkeypatch):
    """Without the check, a 2-iteration run saving at iteration 2 deletes the user's iter_0000002/notes.txt and
    replaces `latest`: what the refusal above prevents."""
    from hybrid.testing_inputs import python_environment
    root = tmp_path / "ck"
    _user_folder(root)
    (root / "latest").write_text(NOTES)
    monkeypatch.chdir(tmp_path)
    python_environment(monkeypatch)
    monkeypatch.setattr(ckpt_args, "_check_not_ours", lambda args: None)
    train_main.main(["--seq-length", "32", "--micro-batch-size", "2", "--train-iters", "2", "--eval-iters", "1",
                     "--save", str(root), "--save-interval", "2"])
    assert not (root / "iter_0000002" / "notes.txt").exists()
    assert (root / "latest").read_text() == "iter_0000002\n"


def test_only_a_saves_own_temporaries_are_removed(tmp_path):
    """The save's clean-up of a killed save's iter_NNNNNNN.tmp removed any iter_*.tmp entry: a user's
    iter_notes.tmp/ folder went with it."""
    root = tmp_path / "ck"
    (root / "iter_0000006.tmp").mkdir(parents=True)
    (root / "iter_notes.tmp").mkdir()
    (root / "iter_notes.tmp" / "notes.txt").write_text(NOTES)
    assert store.clean_partial(str(root)) == ["iter_0000006.tmp"]
    assert (root / "iter_notes.tmp" / "notes.txt").read_text() == NOTES
