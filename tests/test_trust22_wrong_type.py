"""A file of the wrong type inside a folder hybrid reads (round 22's adversarial review): every reader was fed a FIFO,
a directory and an empty file in place of each file it opens (tests/test_trust*.py had covered the top-level paths
and the checkpoint's files). Two answers were wrong:

* train.py --load of a transformers folder whose model.safetensors (or its index) is a FIFO hung in safetensors'
  open -- generate and convert, which check for a regular file first, answered in one line;
* a checkpoint's .metadata that is a FIFO or a directory was called "missing".

A feeder thread writes into the FIFO, so a regression fails on the message instead of hanging the suite."""

from __future__ import annotations

import os
import shutil
import threading

import pytest

from hybrid.checkpoint import safe_read
from hybrid.checkpoint.store import CorruptCheckpoint
from hybrid.train.main import validate


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> str:
    from transformers import AutoModelForCausalLM

    from models.presets import transformers_config
    root = tmp_path_factory.mktemp("hf") / "hf"
    AutoModelForCausalLM.from_config(transformers_config("tiny-gpt2")).save_pretrained(root)
    return str(root)


def _fifo_fed(path: str) -> None:
    """A FIFO at `path`, and a thread that writes a few bytes once a reader opens it (only a regression does)."""
    os.mkfifo(path)

    def feed():
        with open(path, "wb") as f:
            f.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    threading.Thread(target=feed, daemon=True).start()


def _release(path: str) -> None:
    os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))  # the feeder's open returns; it ends


@pytest.mark.parametrize("name", ["model.safetensors", "model.safetensors.index.json"])
def test_a_fifo_in_a_load_folder_is_one_line_not_a_hang(name, hf, tmp_path, one_line):
    src = str(tmp_path / "hf")
    shutil.copytree(hf, src)
    if os.path.exists(os.path.join(src, name)):
        os.remove(os.path.join(src, name))
    _fifo_fed(os.path.join(src, name))
    line = one_line(lambda: validate(["--load", src]))
    assert line == (f"train.py: error: --load {src}: {name} is not a regular file (a FIFO, a device or a directory); "
                    f"copy the model folder again")
    _release(os.path.join(src, name))


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_metadata_of_the_wrong_type_is_named_as_such(kind, tmp_path):
    it = tmp_path / "iter_0000002"
    it.mkdir()
    os.mkfifo(it / ".metadata") if kind == "fifo" else (it / ".metadata").mkdir()
    with pytest.raises(CorruptCheckpoint) as e:
        safe_read.read_metadata(str(it))
    assert str(e.value) == (f"{it / '.metadata'}: not a regular file; a checkpoint's files are regular files inside "
                            f"its folder")


def test_a_fifo_in_a_deepspeed_folder_is_one_line_not_a_hang(tmp_path, one_line, monkeypatch):
    """`hybrid convert` of a DeepSpeed folder whose model states file is a FIFO hung in torch.load's open (DeepSpeed's
    zero_to_fp32 opens every *_model_states.pt its glob finds); now one line naming the file, DST never made."""
    import hybrid.cli
    from hybrid.testing_inputs import python_environment
    src, out = tmp_path / "ds", tmp_path / "out"
    (src / "global_step1").mkdir(parents=True)
    (src / "latest").write_text("global_step1")
    fifo = str(src / "global_step1" / "mp_rank_00_model_states.pt")
    _fifo_fed(fifo)
    monkeypatch.chdir(tmp_path)
    python_environment(monkeypatch)
    line = one_line(lambda: hybrid.cli.main(["convert", str(src), str(out), "--model", "tiny-gpt2"]))
    assert line == (f"hybrid convert: error: SRC {fifo}: not a regular file (a FIFO, a device or a directory); copy "
                    f"the DeepSpeed ZeRO checkpoint again")
    assert not out.exists()
    _release(fifo)
