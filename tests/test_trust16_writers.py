"""Writers: nothing written through a link planted in the output folder, nothing half-written after a crash, and
every write of the product accounted for.

* Before round 16, four writers staged into a FIXED temporary name and opened it with open(..., "w"), which follows
  a link: checkpoint `latest`, state.json and manifest.json (store.write_durable: `latest.tmp`), the indexed
  dataset (`PREFIX.bin.tmp`, `PREFIX.idx.tmp`) and train_tokenizer.py's three files (`.tokenizer.json.tmp`, ...).
  Anyone able to create a file in the output folder could make that name a link to a file of the user's (a
  ~/.bashrc) and have it overwritten, then the link renamed into place. Each test plants the links at the old
  names, shows that a naive write there reaches the outside file (the plant is live), then runs the real command
  and checks the outside file is byte for byte unchanged.
* A leftover iter_N.tmp that is a link: clean_partial's rmtree refused it (ignore_errors hid that), and the save
  then died on makedirs with a traceback -- now unlinked, its target kept.
* Crashes through the one test-only fault hook (HYBRID_FAULT, hybrid/checkpoint/faults.py): the new crash point
  `before_latest` (the checkpoint renamed, `latest`'s new text fsynced under its temporary name): `latest` still
  names the previous checkpoint, whole; the next run resumes and removes the temporary.
* An inventory: every call in hybrid/ and models/ that writes a file is in WRITERS with its guard (the table of
  docs/operations.md); a new writer fails the test until it is reviewed and listed.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from hybrid.checkpoint import store
from hybrid.checkpoint.faults import SimulatedCrash
from test_trust import hf_folder, train, tree  # noqa: F401 -- hf_folder: a fixture
from tests.write_scan import _writes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRECIOUS = "the user's own file\n"


def _outside(tmp_path, name: str) -> str:
    path = tmp_path / "home" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(PRECIOUS)
    return str(path)


def _plant(folder: str, names: list[str], tmp_path) -> list[str]:
    """A link at each old fixed temporary name, to a file outside; returns the outside files."""
    os.makedirs(folder, exist_ok=True)
    targets = []
    for n in names:
        target = _outside(tmp_path, n.replace("/", "_") + ".target")
        os.symlink(target, os.path.join(folder, n))
        targets.append(target)
    return targets


def _naive_write_reaches(link: str) -> bool:
    """The write the old code made at the fixed name (open(path + ".tmp", "w")) lands in the link's target."""
    target = os.path.realpath(link)
    before = open(target).read()
    with open(link, "w") as f:
        f.write("overwritten")
    reached = open(target).read() == "overwritten"
    open(target, "w").write(before)
    return reached


def _checkpoint_finalize(folder: str, tmp_path) -> None:
    """store.finalize -- what rank 0 runs at the end of every save -- on a staged iteration 1."""
    staged = store.tmp_path(folder, 1)
    os.makedirs(staged, exist_ok=True)
    open(os.path.join(staged, ".metadata"), "wb").write(b"dcp")
    store.finalize(folder, 1, {}, {"iteration": 1})


def _preprocess(folder: str, tmp_path) -> None:
    from hybrid.data import preprocess
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"text": f"document {i} " * 5}) + "\n" for i in range(5)))
    preprocess.main(["--input", str(data), "--output-prefix", os.path.join(folder, "c"),
                     "--tokenizer-type", "ByteLevel", "--workers", "1"])


def _train_tokenizer(folder: str, tmp_path) -> None:
    from hybrid.data import train_tokenizer
    text = tmp_path / "in.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n\n" * 20)
    train_tokenizer.main(["--input", str(text), "--vocab-size", "280", "--output", folder])


# (id, the old fixed temporary names, the command, what it must have written)
FIXED_NAMES = [
    ("checkpoint-latest", ["latest.tmp", "iter_0000001.tmp/state.json.tmp", "iter_0000001.tmp/manifest.json.tmp"],
     _checkpoint_finalize, ["latest", "iter_0000001/state.json", "iter_0000001/manifest.json"]),
    ("preprocess-data", ["c_text_document.bin.tmp", "c_text_document.idx.tmp"], _preprocess,
     ["c_text_document.bin", "c_text_document.idx"]),
    ("train-tokenizer", [".tokenizer.json.tmp", ".tokenizer_config.json.tmp", ".special_tokens_map.json.tmp"],
     _train_tokenizer, ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]),
]


@pytest.mark.parametrize("case", FIXED_NAMES, ids=[c[0] for c in FIXED_NAMES])
def test_a_link_at_a_writers_old_temporary_name_is_never_written_through(case, tmp_path, monkeypatch, capsys):
    name, names, command, written = case
    monkeypatch.delenv("HYBRID_FAULT", raising=False)
    folder = str(tmp_path / "out")
    for n in names:
        os.makedirs(os.path.dirname(os.path.join(folder, n)), exist_ok=True)
    targets = _plant(folder, names, tmp_path)
    assert all(_naive_write_reaches(os.path.join(folder, n)) for n in names)  # the plant is live
    command(folder, tmp_path)
    assert [open(t).read() for t in targets] == [PRECIOUS] * len(targets)
    for w in written:  # the outputs are regular files of the folder, not the links renamed into place
        path = os.path.join(folder, w)
        assert os.path.isfile(path) and not os.path.islink(path), w
    if name == "checkpoint-latest":
        assert store.read_latest(folder) == 1 and open(os.path.join(folder, "latest")).read() == "iter_0000001\n"
    leftovers = [n for n in os.listdir(folder) if n.endswith(".tmp") and not os.path.islink(os.path.join(folder, n))]
    assert leftovers == [], leftovers  # the writer's own temporaries are renamed or removed


def test_a_linked_leftover_save_directory_is_unlinked_and_its_target_kept(tmp_path):
    root, elsewhere = tmp_path / "ck", tmp_path / "elsewhere"
    root.mkdir(), elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text(PRECIOUS)
    link = root / "iter_0000002.tmp"
    os.symlink(elsewhere, link)
    import shutil
    shutil.rmtree(link, ignore_errors=True)  # what clean_partial did: the link stays, silently ...
    with pytest.raises(FileExistsError):
        os.makedirs(link)  # ... and the save's makedirs then failed on it
    assert store.clean_partial(str(root)) == ["iter_0000002.tmp"]
    assert not os.path.lexists(link) and (elsewhere / "keep.txt").read_text() == PRECIOUS
    os.makedirs(link)  # the save can now stage there


def test_a_crash_before_latest_is_renamed_keeps_the_previous_latest_whole(tmp_path, monkeypatch):
    """In-process, through HYBRID_FAULT (SimulatedCrash): iteration 2 complete, `latest` still iteration 1's."""
    root = str(tmp_path / "ck")
    monkeypatch.delenv("HYBRID_FAULT", raising=False)
    _checkpoint_finalize(root, tmp_path)
    os.makedirs(store.tmp_path(root, 2))
    open(os.path.join(store.tmp_path(root, 2), ".metadata"), "wb").write(b"dcp")
    monkeypatch.setenv("HYBRID_FAULT", "crash:point=before_latest,iteration=2")
    with pytest.raises(SimulatedCrash):
        store.finalize(root, 2, {}, {"iteration": 2})
    assert open(os.path.join(root, "latest")).read() == "iter_0000001\n"
    assert store.complete_iterations(root) == [1, 2] and store.read_latest(root) == 1
    assert sorted(os.listdir(root)) == ["iter_0000001", "iter_0000002", "latest"]  # the temporary removed


@pytest.mark.slow  # two train.py runs (forked)
def test_a_kill_before_latest_through_train_py_then_a_resume(tmp_path):
    """train.py --save-interval 2 SIGKILLed (HYBRID_FAULT ...,signal=SIGKILL) after iteration 4's checkpoint is
    renamed and `latest`'s new text is fsynced under its temporary name; links planted at the old names beforehand.
    Then a resume: from iteration 2 (what `latest` names), the killed temporary removed, nothing outside touched."""
    ck = str(tmp_path / "ck")
    outside = _plant(ck, ["latest.tmp"], tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text(PRECIOUS)
    os.symlink(elsewhere, os.path.join(ck, "iter_0000002.tmp"))  # a leftover save directory, linked elsewhere
    before_elsewhere = tree(elsewhere)
    kill = "crash:point=before_latest,iteration=4,signal=SIGKILL"
    a = train(["--train-iters", "4", "--save", ck, "--save-interval", "2"], tmp_path, check=False,
              env={"HYBRID_FAULT": kill})
    assert a.returncode == -signal.SIGKILL, (a.returncode, a.stderr[-2000:])
    assert "removed the unfinished iter_0000002.tmp" in a.stdout
    assert open(os.path.join(ck, "latest")).read() == "iter_0000002\n"  # whole: the old text
    assert store.complete_iterations(ck) == [2, 4] and store.verify_all(store.final_path(ck, 4)).error is None
    killed = [n for n in os.listdir(ck) if n.startswith(".latest.") and n.endswith(".tmp")]
    assert len(killed) == 1 and open(os.path.join(ck, killed[0])).read() == "iter_0000004\n"
    b = train(["--train-iters", "6", "--load", ck, "--save", ck, "--save-interval", "2"], tmp_path)
    assert f"checkpoint: resumed from {store.final_path(ck, 2)} " in b.stdout
    assert store.read_latest(ck) == 6 and not [n for n in os.listdir(ck) if n.startswith(".latest.")]
    assert [open(t).read() for t in outside] == [PRECIOUS] and tree(elsewhere) == before_elsewhere


def test_convert_refuses_a_dst_that_is_a_link_before_any_work(hf_folder, tmp_path, monkeypatch, one_line):  # noqa: F811
    """DST a link to an empty folder: the staged output would have been renamed over the link only after the whole
    conversion (rmdir of a link: NotADirectoryError, a traceback); now one line before any work."""
    import hybrid.cli
    target = tmp_path / "target"
    target.mkdir()
    os.symlink(target, tmp_path / "dst")
    monkeypatch.chdir(tmp_path)
    line = one_line(lambda: hybrid.cli.main(["convert", hf_folder, str(tmp_path / "dst")]))
    assert line == (f"hybrid convert: error: DST {str(tmp_path / 'dst')!r} is a symbolic link (to {str(target)!r}); "
                    f"give the directory itself (nothing is written through a link)")
    assert os.listdir(target) == [] and sorted(os.listdir(tmp_path)) == ["dst", "target"]


def test_atomic_output_replaces_a_link_at_the_destination_not_its_target(tmp_path):
    """Every report, plot, profile and timeline goes through cliutil.atomic_output: a link at the destination is
    replaced by the new file (rename), its target untouched; a failure leaves the old file and no temporary."""
    from hybrid.cliutil import atomic_output
    target = _outside(tmp_path, "report.target")
    dst = tmp_path / "out" / "report.md"
    dst.parent.mkdir()
    os.symlink(target, dst)
    with atomic_output(str(dst)) as tmp, open(tmp, "w") as f:
        f.write("new")
    assert open(target).read() == PRECIOUS and not os.path.islink(dst) and dst.read_text() == "new"
    with pytest.raises(RuntimeError), atomic_output(str(dst)) as tmp:
        open(tmp, "w").write("half")
        raise RuntimeError("killed mid-write")
    assert dst.read_text() == "new" and os.listdir(dst.parent) == ["report.md"]


# --- the inventory: every write of the product, with its guard ---------------------------------------------------
# (file, function, the call) -> how it is guarded: T temporary + rename (whole or absent), N never replaces what it
# did not write (or needs a flag), L no write through a planted link. docs/operations.md has the same table.
WRITERS = {
    ("hybrid/cliutil.py", "record_error", "open(w)"): "torchrun's own TORCHELASTIC_ERROR_FILE (the launcher's path)",
    ("hybrid/cliutil.py", "write_text", "open(w)"): "TL: atomic_output's mkstemp temporary",
    ("hybrid/diloco/bench.py", "main", "open(w)"): "TL: atomic_output",
    ("hybrid/compress/diagnose.py", "main", "open(w)"): "TL: atomic_output, --json checked before the run",
    ("hybrid/metrics/plot.py", "main", "savefig"): "TL: atomic_output; --out checked first",
    ("hybrid/planner/plot.py", "plot_memory", "savefig"): "TL: planner/cli.py's atomic_output",
    ("hybrid/planner/calibrate.py", "save_profile", "open(w)"): "TL: atomic_output; N: check_replaces_a_profile",
    ("hybrid/pipeline/timeline.py", "write_chrome_trace", "open(w)"): "TL: atomic_output; N: check_replaceable",
    ("hybrid/metrics/writer.py", "MetricsWriter._open", "open(a)"): "N: check_appendable (a run's metrics only); "
                                                                        "appended a line per write",
    ("hybrid/metrics/writer.py", "MetricsWriter._open", "SummaryWriter"): "TensorBoard's own new event file",
    ("hybrid/metrics/writer.py", "drop_torn_record", "open(rb+)"):
        "N: the --metrics-file MetricsWriter then appends to; only the bytes after its last newline cut (trust17)",
    ("hybrid/convert/safetensors_out.py", "write_sharded", "open(wb)"): "TL: inside staged_dst's mkdtemp folder",
    ("hybrid/convert/safetensors_out.py", "write_sharded", "open(w)"): "TL: inside staged_dst's mkdtemp folder",
    ("hybrid/convert/to_hf.py", "hybrid_to_hf", "to_json_file"): "TL: inside staged_dst's mkdtemp folder",
    ("hybrid/convert/to_hybrid.py", "_write", "to_json_file"): "TL: inside staged_dst's mkdtemp folder",
    ("hybrid/convert/to_hybrid.py", "_from_saved_keys", "to_json_file"): "a TemporaryDirectory of its own",
    ("hybrid/convert/to_hybrid.py", "_from_saved_keys", "save_file"): "a TemporaryDirectory of its own",
    ("hybrid/convert/tokenizer_out.py", "_config", "open(w)"): "TL: inside staged_dst's mkdtemp folder",
    ("hybrid/convert/tokenizer_out.py", "_tokenizer_files", "save"): "TL: inside staged_dst's mkdtemp folder",
    ("hybrid/convert/tokenizer_out.py", "export_tokenizer", "open(w)"): "TL: inside staged_dst's mkdtemp folder "
    "(hybrid_tokens.json, round 25)",
    ("hybrid/data/cache.py", "_save", "os.fdopen"): "TL: mkstemp temporaries renamed over the key's names (a link "
    "there is replaced, not followed); the description renamed last",
    ("hybrid/data/cache.py", "_save", "save"): "TL: np.save into _save's mkstemp temporary, renamed",
    ("hybrid/data/cache.py", "_locked.__enter__", "open(a)"): "N: the index cache's lock file, opened only to flock, "
    "nothing written (a planted link's target is at most created empty)",
    ("hybrid/data/train_tokenizer.py", "train", "save"): "TL: mkstemp temporaries; N: check_fresh_output",
    ("hybrid/data/train_tokenizer.py", "_dump", "open(w)"): "TL: mkstemp temporaries; N: check_fresh_output",
    ("hybrid/data/indexed.py", "IndexedDatasetWriter.__init__", "open(wb)"): "TL: mkstemp; N: preprocess refuses "
                                                                             "an existing dataset",
    ("hybrid/data/indexed.py", "write_index", "open(wb)"): "TL: the writer's mkstemp .idx temporary",
    ("hybrid/checkpoint/core.py", "save_state", "save"): "TL: DCP into a fresh iter_N.tmp, renamed; N: "
                                                         "--overwrite-save",
    ("hybrid/checkpoint/run.py", "RunCheckpoints.after_step", "save"): "its own save(): core.save_state below",
    ("hybrid/checkpoint/run.py", "RunCheckpoints.finish", "save"): "its own save(): core.save_state below",
    ("hybrid/checkpoint/store.py", "write_durable", "os.fdopen"): "TL: mkstemp + fsync + rename",
    ("hybrid/zero/cpu_adam_build.py", "cpu_adam_build", "open(a)"): "a lock file (flock), nothing written in it",
    ("hybrid/zero/shm.py", "_create", "os.open"): "O_CREAT | O_EXCL, 0600, then renamed (shared-memory segment)",
}
SKIP = ("hybrid/testing",)  # the test harness's own files
def test_every_file_write_of_the_product_is_listed_with_its_guard():
    found = set()
    for top in ("hybrid", "models"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                path = os.path.join(d, f)
                if f.endswith(".py") and not os.path.relpath(path, ROOT).startswith(SKIP):
                    found |= _writes(path)
    assert found - set(WRITERS) == set(), f"unreviewed writers (add them, with their guard): {found - set(WRITERS)}"
    assert set(WRITERS) - found == set(), f"listed writers no longer found: {set(WRITERS) - found}"


def test_the_inventory_sees_a_raw_write(tmp_path):
    """The scan is not blind: a module with `open(p, "w")` and a `.save(...)` is found."""
    src = tmp_path / "m.py"
    src.write_text("def f(p, t):\n    open(p, 'w').write('x')\n    t.save(p)\n")
    assert {w[1:] for w in _writes(str(src))} == {("f", "open(w)"), ("f", "save")}


def test_the_metrics_file_holds_whole_lines_only(tmp_path):
    """The one appending writer: each record is one write of one whole line (line-buffered), so a kill between
    records leaves only whole lines -- checked by reading back what MetricsWriter wrote."""
    from hybrid.metrics.writer import MetricsWriter
    path = str(tmp_path / "m.jsonl")
    w = MetricsWriter(None, path, True)
    w.write(1, {"lm_loss": 1.5})
    assert open(path).read() == '{"iteration": 1, "lm_loss": 1.5}\n'  # on disk before close: flushed per line
    w.close()
