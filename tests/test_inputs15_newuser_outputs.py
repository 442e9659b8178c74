"""Round 15's new-user pass: outputs that replaced a user's files without a word, and a tokenizer folder whose
refusal was three lines pointing at the Hub. Each is now one line naming the flag and the fix, before any process
group or work, with the file that was there unchanged.

1. train.py --timeline replaced whatever file was at its path at the end of the run: the run's own --metrics-file
   (also when both flags named one new file), a checkpoint's `latest`, a script.
2. scripts/train_tokenizer.py --output replaced the tokenizer already in the folder (data preprocessed with it then
   hold ids a new vocabulary reads as other tokens) and wrote into a checkpoint folder, whose tokenizer `hybrid
   generate` and `hybrid convert` then take as the model's.
3. hybrid generate on a tokenizer folder whose tokenizer_config.json names custom code (auto_map): transformers'
   three-line refusal, sending the user to https://hf.co/<local folder>. Nothing ran then either; now one line.

All in this process (conftest's `one_line`: one line, no traceback, no process group)."""

from __future__ import annotations

import json
import os

import pytest

from hybrid.data import train_tokenizer
from hybrid.pipeline.timeline import check_replaceable, chrome_trace, write_chrome_trace
from hybrid.train.main import validate

pytestmark = pytest.mark.usefixtures("one_process")  # python, not torchrun: world 1 (tests/conftest.py)
TRAIN = ["--model", "tiny-gpt2", "--seq-length", "32", "--micro-batch-size", "1", "--global-batch-size", "1",
         "--train-iters", "2", "--eval-iters", "0"]


# --- 1. train.py --timeline ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, content", [
    ("run.jsonl", '{"iteration": 20, "lm_loss": 4.28}\n'),  # a metrics file
    ("latest", "iter_0000004\n"),                            # a checkpoint's marker
    ("train.py", "import torch\n"),                          # a script
])
def test_timeline_over_a_file_that_is_not_a_timeline_is_one_line_and_keeps_it(name, content, tmp_path, one_line):
    path = tmp_path / name
    path.write_text(content)
    line = one_line(lambda: validate(TRAIN + ["--timeline", str(path)]))
    assert line == (f"train.py: error: --timeline {str(path)!r} exists and is not a pipeline timeline (it does not "
                    f"start with {{\"traceEvents\"); the run replaces it at its end: give a new file, or the "
                    f"--timeline of an earlier run")
    assert path.read_text() == content


def test_timeline_and_metrics_file_on_one_new_path_is_one_line(tmp_path, one_line):
    """Neither file exists yet: each check alone passes, and the timeline would replace the metrics at the end."""
    path = tmp_path / "run.json"
    line = one_line(lambda: validate(TRAIN + ["--timeline", str(path), "--metrics-file",
                                              os.path.join(str(tmp_path), ".", "run.json")]))
    assert line == (f"train.py: error: --timeline and --metrics-file are both {str(path)!r}: the timeline would "
                    f"replace the metrics at the end of the run; give each its own file")
    assert not path.exists()


def test_timeline_a_run_wrote_an_empty_file_or_a_new_path_are_taken(tmp_path):
    """The rerun of a command overwrites its own timeline (tests/test_newuser9_inputs.py runs it): what
    write_chrome_trace writes passes the check, as do an empty file and a new path."""
    trace = tmp_path / "timeline.json"
    write_chrome_trace(str(trace), chrome_trace({}, {}))
    (tmp_path / "empty.json").write_text("")
    for path in (trace, tmp_path / "empty.json", tmp_path / "new.json"):
        check_replaceable("--timeline", str(path))
    assert validate(TRAIN + ["--timeline", str(trace), "--metrics-file", str(tmp_path / "run.jsonl")])[0]


# --- 2. scripts/train_tokenizer.py --output ---------------------------------------------------------------------------
def _train_tokenizer(tmp_path, output) -> list[str]:
    (tmp_path / "in.txt").write_text("a small corpus\n\nof two paragraphs\n")
    return ["--input", str(tmp_path / "in.txt"), "--vocab-size", "260", "--output", str(output)]


def test_tokenizer_output_holding_a_tokenizer_is_one_line_and_keeps_it(tmp_path, one_line):
    out = tmp_path / "tok"
    out.mkdir()
    (out / "tokenizer.json").write_text('{"model": "the one the data were encoded with"}')
    line = one_line(lambda: train_tokenizer.main(_train_tokenizer(tmp_path, out)))
    assert line == (f"train_tokenizer.py: error: --output {str(out)!r} already holds a tokenizer (tokenizer.json); "
                    f"data preprocessed with it would no longer match a new one: give a new directory, or delete "
                    f"those files first")
    assert os.listdir(out) == ["tokenizer.json"]
    assert json.loads((out / "tokenizer.json").read_text()) == {"model": "the one the data were encoded with"}


@pytest.mark.parametrize("mark", ["latest", "config.json", "iter_0000004", "global_step10"])
def test_tokenizer_output_into_a_checkpoint_or_model_folder_is_one_line(mark, tmp_path, one_line):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / mark).mkdir() if mark.startswith(("iter_", "global_step")) else (out / mark).write_text("x")
    line = one_line(lambda: train_tokenizer.main(_train_tokenizer(tmp_path, out)))
    assert line.startswith(f"train_tokenizer.py: error: --output {str(out)!r} is a checkpoint or model folder")
    assert "give the tokenizer a directory of its own" in line
    assert os.listdir(out) == [mark]


def test_tokenizer_output_new_or_empty_is_written(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "new", tmp_path / "empty"):
        train_tokenizer.main(_train_tokenizer(tmp_path, out))
        assert sorted(os.listdir(out)) == sorted(train_tokenizer.WRITTEN)


# --- 3. hybrid generate: a tokenizer folder that names custom code -----------------------------------------------------
def _custom_code_tokenizer(folder) -> None:
    """A tokenizer folder as the Hub has them with remote code: its class in tok.py, which would leave a marker."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    folder.mkdir()
    Tokenizer(WordLevel({"a": 0, "b": 1}, unk_token="a")).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "MyTok", "auto_map": {"AutoTokenizer": ["tok.MyTok", None]}}))
    marker = folder.parent / "RAN"
    (folder / "tok.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                   f"from transformers import PreTrainedTokenizerFast\n"
                                   f"class MyTok(PreTrainedTokenizerFast): pass\n")


@pytest.mark.parametrize("given", [True, False], ids=["--tokenizer", "carried with SRC"])
def test_generate_tokenizer_with_custom_code_is_one_line_and_runs_nothing(given, tmp_path):
    from hybrid.generate.decode import find_codec
    folder = tmp_path / "tok"
    _custom_code_tokenizer(folder)
    why = "--tokenizer" if given else "carried with SRC"
    with pytest.raises(ValueError) as e:
        find_codec(str(folder) if given else None, str(folder), None)
    assert str(e.value) == (f"tokenizer {folder} ({why}): its tokenizer_config.json names custom code (auto_map), "
                            f"which is never run; give --tokenizer a folder without it (or its tokenizer.json alone) "
                            f"or --prompt-ids")
    assert not (tmp_path / "RAN").exists()


def test_generate_tokenizer_json_alone_of_that_folder_is_read(tmp_path):
    """The way out the line names: the folder's tokenizer.json alone, read by `tokenizers`, no code."""
    from hybrid.generate.decode import find_codec
    _custom_code_tokenizer(tmp_path / "tok")
    codec = find_codec(str(tmp_path / "tok" / "tokenizer.json"), str(tmp_path), None)
    assert codec.encode("b") == [1] and not (tmp_path / "RAN").exists()
