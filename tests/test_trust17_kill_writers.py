"""A SIGKILL inside each non-checkpoint writer leaves the old output or none -- never a half-written one under the
final name, and no temporary a later run reads.

Each case is one child (forked from the test forkserver, torch already imported) that runs the real writer with
the one test-only fault hook set, HYBRID_FAULT="crash:point=P,signal=SIGKILL" (hybrid/fault_hook.py): the child
kills itself at crash point P, between the new bytes written under a temporary name and their rename -- nothing
unwinds, no `except` or `finally` runs. Then the folder is read as the next user would read it. A writer that
wrote in place (Megatron's indexed writer, a plain open(path, "w")) would leave its new bytes under the final
name at the same point: the old file gone and, for a two- or three-file output, half a set.

The metrics file is appended, not staged: a kill inside a long record's write leaves a torn last line. Its child
writes half a record and SIGKILLs itself (no crash point can sit inside one write() call); the resumed run's
writer must cut the torn bytes, so the file stays whole lines that plot_run reads.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from hybrid import testing

OLD = '{"old": "the previous run\'s output"}\n'


def _killed_at(point: str, code: str, cwd: str) -> None:
    """Run `code` in a child with the crash point `point` armed as a SIGKILL; it must die there."""
    out = testing.run(["-c", code], env={"HYBRID_FAULT": f"crash:point={point},signal=SIGKILL", "RANK": None},
                      cwd=cwd, timeout=120)
    assert out.returncode == -signal.SIGKILL, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    assert f"at crash point {point}" in out.stdout


def _strays(folder, *finals: str) -> list[str]:
    """Everything in `folder` but the final names: each must be a hidden temporary (`.NAME.`...), a unique name
    no reader opens."""
    names = sorted(set(os.listdir(folder)) - set(finals))
    assert all(n.startswith(".") for n in names), names
    return names


# --- atomic_output: the timeline, the planner's profile JSON (and plots, reports: the same context manager) ----
WRITERS = {
    "timeline": "from hybrid.pipeline.timeline import write_chrome_trace as w; w('out.json', {'traceEvents': []})",
    "profile": "from hybrid.planner.calibrate import save_profile as w; w({'format': 1}, 'out.json')",
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_kill_before_the_rename_leaves_the_old_output_whole(writer, tmp_path):
    (tmp_path / "out.json").write_text(OLD)
    _killed_at("output_written", WRITERS[writer], str(tmp_path))
    assert (tmp_path / "out.json").read_text() == OLD  # in place, the new JSON would stand there
    stray, = _strays(tmp_path, "out.json")
    assert stray.startswith(".out.json.tmp.")
    out = testing.run(["-c", WRITERS[writer]], env={"HYBRID_FAULT": None}, cwd=str(tmp_path), timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads((tmp_path / "out.json").read_text()) != json.loads(OLD)  # the rerun writes, beside the stray


# --- the indexed dataset: two files, two renames ---------------------------------------------------------------
DATASET = ("from hybrid.data.indexed import IndexedDatasetWriter as W\n"
           "w = W('data/d')\n"
           "for doc in ([1, 2, 3], [4, 5], [6]):\n"
           "    w.add_document(doc)\n"
           "w.finalize()\n")


def test_a_kill_before_the_dataset_renames_leaves_no_dataset(tmp_path):
    (tmp_path / "data").mkdir()
    _killed_at("dataset_written", DATASET, str(tmp_path))
    assert len(_strays(tmp_path / "data")) == 2  # .d.bin.*.tmp, .d.idx.*.tmp: no d.bin, no d.idx
    out = testing.run(["-c", DATASET + "from hybrid.data.indexed import IndexedDataset as D\n"
                       "print([D('data/d').get(i).tolist() for i in range(3)])"], env={"HYBRID_FAULT": None},
                      cwd=str(tmp_path), timeout=120)
    assert out.returncode == 0 and "[[1, 2, 3], [4, 5], [6]]" in out.stdout, out.stderr[-2000:]


def test_a_kill_between_the_dataset_renames_is_named_by_the_reader(tmp_path):
    """PREFIX.bin whole, PREFIX.idx not there: the reader names the missing file, one line; never a dataset read."""
    from hybrid.data.indexed import IndexedDataset
    (tmp_path / "data").mkdir()
    _killed_at("dataset_bin_renamed", DATASET, str(tmp_path))
    assert (tmp_path / "data" / "d.bin").read_bytes() == b"".join(i.to_bytes(4, "little") for i in range(1, 7))
    _strays(tmp_path / "data", "d.bin")
    with pytest.raises(ValueError, match=r"d\.idx is missing \(found .*d\.bin\)"):
        IndexedDataset(str(tmp_path / "data" / "d"))


# --- train_tokenizer: three files, tokenizer.json renamed last ---------------------------------------------------
TOKENIZER = ("from hybrid.data.train_tokenizer import train\n"
             "open('text.txt', 'w').write('the quick brown fox jumps over the lazy dog ' * 20)\n"
             "train(['text.txt'], 300, 'tok')\n")


@pytest.mark.parametrize("point", ["tokenizer_staged", "tokenizer_first_renamed"])
def test_a_killed_tokenizer_training_leaves_no_tokenizer_json_without_its_config(point, tmp_path):
    """Every reader opens tokenizer.json; the other two say how transformers builds the tokenizer around it (class,
    bos / eos). Killed before or between the renames, no tokenizer.json stands without them."""
    _killed_at(point, TOKENIZER, str(tmp_path))
    there = set(os.listdir(tmp_path / "tok"))
    assert "tokenizer.json" not in there, there
    assert _strays(tmp_path / "tok", "tokenizer_config.json", "special_tokens_map.json")  # tokenizer.json's temporary


# --- hybrid convert: the staged directory ------------------------------------------------------------------------
CONVERT = ("from transformers import AutoModelForCausalLM\n"
           "from models.presets import transformers_config\n"
           "AutoModelForCausalLM.from_config(transformers_config('tiny-gpt2')).save_pretrained('hf')\n"
           "import hybrid.cli\n"
           "hybrid.cli.main(['convert', 'hf', 'dst'])\n")


def test_a_killed_conversion_leaves_no_dst(tmp_path):
    _killed_at("export_written", CONVERT, str(tmp_path))
    assert not os.path.lexists(tmp_path / "dst")
    stray, = _strays(tmp_path, "hf")
    assert stray.startswith(".dst.tmp.") and os.listdir(tmp_path / stray)  # the whole conversion, never renamed


# --- --metrics-file: appended, a torn last record cut on resume --------------------------------------------------
def test_a_resume_cuts_the_torn_record_a_killed_run_left(tmp_path):
    torn = ("from hybrid.metrics.writer import MetricsWriter\n"
            "import json, os, signal\n"
            "w = MetricsWriter(None, 'm.jsonl', True)\n"
            "w.write(1, {'lm_loss': 5.0})\n"
            "line = json.dumps({'iteration': 2, 'lm_loss': 4.0, 'per_rank': [1.5] * 4000})\n"
            "w.file.write(line[:len(line) // 2]); w.file.flush()  # half a long record reached the file\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    out = testing.run(["-c", torn], env={"HYBRID_FAULT": None}, cwd=str(tmp_path), timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    assert not (tmp_path / "m.jsonl").read_text().endswith("\n")  # the torn record is there
    from hybrid.metrics.args import check_appendable
    from hybrid.metrics.plot import read_jsonl
    from hybrid.metrics.writer import MetricsWriter
    check_appendable(str(tmp_path / "m.jsonl"))  # train.py's check before appending: still a metrics file
    w = MetricsWriter(None, str(tmp_path / "m.jsonl"), True)  # the resumed run
    w.write(2, {"lm_loss": 4.0})
    w.close()
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == [1, 2]
    assert read_jsonl(str(tmp_path / "m.jsonl"), "run").loss == {1: 5.0, 2: 4.0}
