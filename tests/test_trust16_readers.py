"""Readers the earlier trust rounds (tests/test_trust.py: DCP checkpoints, DeepSpeed folders, truncated model and
tokenizer files) left open, each fed through the entry point a user runs:

* a Megatron indexed dataset (`--data-path PREFIX`) whose index is self-consistent but silently misread: the first
  sequence not at byte 0 (get() sliced past the .bin's end or, negative, wrapped to its tail), a float dtype (token
  ids cast from 2.5 or NaN), a negative token id (an embedding lookup failing mid-run);
* a transformers folder whose config.json names custom code (auto_map) -- transformers without trust_remote_code
  quietly builds its own class instead, so the model trained or converted may not be the one the author wrote;
* a transformers folder holding a pickled `pytorch_model.bin` payload, beside safetensors weights or alone;
* a safetensors header declaring a 4 TiB tensor in a file of a few bytes.

Each payload test first shows the payload is live (the marker appears when the file is loaded naively), then that
the real command is one line naming the file, writes no marker and changes nothing in the folder."""

from __future__ import annotations

import importlib
import io
import json
import os
import runpy
import shutil
import struct

import numpy as np
import pytest
import torch
import torch.distributed as dist

import hybrid.cli
from hybrid.data.indexed import HEADER_BYTES, IndexedDataset, IndexedDatasetWriter
from test_trust import Payload, _isolate, _no_process_group, hf_folder, one_line_error, saved, tree  # noqa: F401

train_main = importlib.import_module("hybrid.train.main")
TINY = ["--seq-length", "32", "--micro-batch-size", "2", "--train-iters", "1", "--eval-iters", "1"]
DOCS = [[1, 2, 3, 4, 5] * 20, [6, 7, 8] * 30, [9, 10] * 40]  # 3 documents, 270 tokens (< tiny-gpt2's 256 ids)


# --- indexed datasets -----------------------------------------------------------------------------------------
def _dataset(prefix: str, docs=DOCS) -> None:
    w = IndexedDatasetWriter(prefix, np.int32)
    for d in docs:
        w.add_document(d)
    w.finalize()


def _shift_pointers(by: int):
    """Every sequence's byte offset moved by `by`: their differences (what the reader checked) unchanged."""
    def edit(prefix):
        b = bytearray(open(prefix + ".idx", "rb").read())
        n = struct.unpack("<Q", b[18:26])[0]
        at = slice(HEADER_BYTES + 4 * n, HEADER_BYTES + 12 * n)
        b[at] = (np.frombuffer(bytes(b[at]), dtype=np.int64) + by).tobytes()
        open(prefix + ".idx", "wb").write(b)
    return edit


def _dtype_code(code: int):
    """The index's dtype byte (offset 17) set to `code`: float32 (7) has int32's item size, so every size agrees."""
    def edit(prefix):
        b = bytearray(open(prefix + ".idx", "rb").read())
        b[17] = code
        open(prefix + ".idx", "wb").write(b)
    return edit


def _negative_token(prefix):
    os.remove(prefix + ".bin"), os.remove(prefix + ".idx")
    _dataset(prefix, [DOCS[0], [6, -3, 8] * 30, DOCS[2]])


INDEX_CASES = [  # (id, edit, the fragment of the one line)
    ("first-pointer-negative", _shift_pointers(-400), "the first sequence starts at byte -400 of the .bin, not 0"),
    ("first-pointer-past-the-end", _shift_pointers(400), "the first sequence starts at byte 400 of the .bin, not 0"),
    ("float32-dtype", _dtype_code(7), "dtype code 7 (float32): token ids are integers"),
    ("negative-token-id", _negative_token, "token id -3 is negative"),
]


def test_the_index_forgeries_are_live_misreads(tmp_path):
    """What each forgery did before the checks: get() read other bytes without a word, float32 ids became other
    integers, and a negative id fails the embedding lookup mid-run (an IndexError, not one line)."""
    prefix = str(tmp_path / "d")
    _dataset(prefix)
    ds = IndexedDataset(prefix)
    assert ds.get(0).tolist() == DOCS[0]
    ds.sequence_pointers = ds.sequence_pointers - 400  # the pointers the negative forgery writes
    assert len(ds.get(0)) == 0 or ds.get(0).tolist() != DOCS[0]  # sliced from the tail: no error
    ds.sequence_pointers = ds.sequence_pointers + 800
    assert ds.get(0).tolist() != DOCS[0]  # 100 bytes further on: another document's tokens, no error
    as_float = np.frombuffer(open(prefix + ".bin", "rb").read(), dtype=np.float32).astype(np.int64)
    assert as_float[:5].tolist() == [0, 0, 0, 0, 0]  # the token ids 1..5 as float32 bits: denormals, cast to 0
    with pytest.raises(IndexError):
        torch.nn.Embedding(256, 4)(torch.tensor([6, -3, 8]))


@pytest.mark.parametrize("case", INDEX_CASES, ids=[c[0] for c in INDEX_CASES])
def test_a_misread_indexed_dataset_is_one_line_through_train_py(case, tmp_path, monkeypatch, capsys):
    name, edit, fragment = case
    prefix = str(tmp_path / "d")
    _dataset(prefix)
    edit(prefix)
    _isolate(monkeypatch, tmp_path)
    monkeypatch.setattr(dist, "init_process_group", _no_process_group)
    before = tree(tmp_path)
    line = one_line_error(train_main.main, TINY + ["--data-path", prefix], capsys)
    assert line.startswith(f"train.py: error: --data-path {prefix}") and fragment in line, line
    assert tree(tmp_path) == before


def test_the_checks_keep_a_good_dataset_and_megatrons_layout(tmp_path):
    """The writer's own output passes (the first pointer is 0 there, as megatron-core writes it)."""
    prefix = str(tmp_path / "d")
    _dataset(prefix)
    ds = IndexedDataset(prefix)
    assert int(ds.sequence_pointers[0]) == 0 and ds.token_range() == (0, 10)
    assert [ds.get(i).tolist() for i in range(3)] == DOCS


# --- transformers folders -------------------------------------------------------------------------------------
MODULE = "configuration_hostile.py"


def _plant_auto_map(folder: str, marker: str) -> None:
    """config.json names a module of the folder (as remote-code models do); importing that module writes `marker`."""
    cfg_path = os.path.join(folder, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["auto_map"] = {"AutoConfig": "configuration_hostile.HostileConfig",
                       "AutoModelForCausalLM": "configuration_hostile.HostileModel"}
    json.dump(cfg, open(cfg_path, "w"))
    with open(os.path.join(folder, MODULE), "w") as f:
        f.write(f"open({marker!r}, 'w').close()\n"
                f"from transformers import GPT2Config, GPT2LMHeadModel\n"
                f"class HostileConfig(GPT2Config): pass\n"
                f"class HostileModel(GPT2LMHeadModel): pass\n")


def _plant_bin(folder: str, marker: str) -> None:
    """A pickled pytorch_model.bin whose loading writes `marker`, beside the safetensors weights."""
    buf = io.BytesIO()
    torch.save({"transformer.wte.weight": Payload(marker)}, buf)
    open(os.path.join(folder, "pytorch_model.bin"), "wb").write(buf.getvalue())


def _bin_only(folder: str, marker: str) -> None:
    _plant_bin(folder, marker)
    os.remove(os.path.join(folder, "model.safetensors"))


def _declared_4tib(folder: str, marker: str) -> None:
    """A safetensors header declaring one 4 TiB tensor, in a file of a few hundred bytes."""
    header = json.dumps({"transformer.wte.weight": {"dtype": "F32", "shape": [1 << 40],
                                                    "data_offsets": [0, 4 << 40]}}).encode()
    open(os.path.join(folder, "model.safetensors"), "wb").write(struct.pack("<Q", len(header)) + header + bytes(16))


def _live_auto_map(folder: str, marker: str) -> None:
    runpy.run_path(os.path.join(folder, MODULE))  # what importing it (trust_remote_code=True) runs first


def _live_bin(folder: str, marker: str) -> None:
    torch.load(os.path.join(folder, "pytorch_model.bin"), weights_only=False)  # a naive torch.load


FOLDER_CASES = [  # (id, plant, how a naive reader runs it or None, {command: fragment of the one line})
    ("config-auto-map", _plant_auto_map, _live_auto_map,
     {"train": "config.json: auto_map names custom code (AutoConfig, AutoModelForCausalLM), which hybrid never runs",
      "convert": "auto_map names custom code", "plan": "auto_map names custom code"}),
    ("pickle-bin-alone", _bin_only, _live_bin,
     {"convert": "(.bin weights are not read)", "generate": "(.bin weights are not read)"}),
    ("pickle-bin-beside-safetensors", _plant_bin, _live_bin, {"convert": None, "generate": None}),
    ("safetensors-declares-4tib", _declared_4tib, None,
     {"convert": "not a readable safetensors checkpoint", "generate": "not a readable safetensors checkpoint"}),
]
FOLDER_RUNS = [(c, cmd) for c in FOLDER_CASES for cmd in c[3]]


@pytest.mark.parametrize("case", [c for c in FOLDER_CASES if c[2]], ids=[c[0] for c in FOLDER_CASES if c[2]])
def test_the_folder_payloads_are_live(case, hf_folder, tmp_path):  # noqa: F811
    name, plant, live, _ = case
    src, marker = str(tmp_path / "src"), str(tmp_path / "RAN")
    shutil.copytree(hf_folder, src)
    plant(src, marker)
    assert not os.path.exists(marker)
    live(src, marker)
    assert os.path.exists(marker)


def _argv(command: str, src: str, out: str) -> tuple:
    if command == "train":
        return train_main.main, TINY + ["--model", src]
    if command == "plan":
        return hybrid.cli.main, ["plan", "--model", src, "--gpus", "8", "--global-batch-size", "64"]
    if command == "convert":
        return hybrid.cli.main, ["convert", src, out]
    return hybrid.cli.main, ["generate", src, "--prompt-ids", "1,2", "--max-new-tokens", "2"]


@pytest.mark.parametrize("case, command", FOLDER_RUNS, ids=[f"{c[0]}-{cmd}" for c, cmd in FOLDER_RUNS])
def test_a_hostile_model_folder_runs_nothing_through_each_command(case, command, hf_folder, tmp_path,  # noqa: F811
                                                                 monkeypatch, capsys):
    """One line naming the file (or, for a payload beside safetensors weights, the command works and never opens
    it); the marker never appears; the folder is unchanged."""
    name, plant, _, fragments = case
    src, marker, out = str(tmp_path / "src"), str(tmp_path / "RAN"), str(tmp_path / "out")
    shutil.copytree(hf_folder, src)
    if command == "generate" and fragments[command] is None:  # its 300-token tokenizer exceeds tiny-gpt2's 256
        for n in os.listdir(src):
            if n.startswith(("tokenizer", "special_tokens")):
                os.remove(os.path.join(src, n))
    plant(src, marker)
    _isolate(monkeypatch, tmp_path)
    before = tree(src)
    fn, argv = _argv(command, src, out)
    if fragments[command] is None:  # the .bin is never read: safetensors are the weights
        fn(argv)  # no SystemExit: the command ran to its end
        assert os.path.isdir(out) if command == "convert" else capsys.readouterr().out.strip()
    else:
        monkeypatch.setattr(dist, "init_process_group", _no_process_group)
        line = one_line_error(fn, argv, capsys)
        prog = "train.py" if command == "train" else f"hybrid {command}"
        assert line.startswith(f"{prog}: error: ") and fragments[command] in line, line
        assert not os.path.exists(out)
    assert not os.path.exists(marker)
    assert tree(src) == before


def test_a_plain_config_folder_without_auto_map_still_loads(hf_folder, tmp_path):  # noqa: F811
    """The refusal is of auto_map only: the same config.json without it is read (a preset-equal tiny GPT-2)."""
    from models.config import load_config
    assert load_config(hf_folder).num_layers == load_config("tiny-gpt2").num_layers


# --- a stray safetensors file: DCP's HuggingFaceStorageReader reads every one of the folder ---------------------
def _stray(folder: str, key: str = "transformer.wte.weight", name: str = "zzz_stray.safetensors") -> torch.Tensor:
    from safetensors.torch import load_file, save_file
    real = load_file(os.path.join(folder, "model.safetensors"))[key]
    save_file({key: torch.zeros_like(real)}, os.path.join(folder, name))
    return real


def _converted_wte(out: str) -> torch.Tensor:
    from hybrid.checkpoint import safe_read, store
    it = store.final_path(out, 0)
    meta = safe_read.read_metadata(it)
    sd = {"model/wte.weight": torch.empty(tuple(meta.state_dict_metadata["model/wte.weight"].size))}
    safe_read.load(sd, it, no_dist=True)
    return sd["model/wte.weight"]


def test_a_stray_safetensors_file_was_read_over_the_weights(hf_folder, tmp_path, monkeypatch, capsys):  # noqa: F811
    """The misread is live: with the new check switched off, `convert --no-verify` of a folder holding a second file
    with the embedding (zeros) writes the zeros, without a word."""
    from hybrid.convert import common
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    shutil.copytree(hf_folder, src)
    real = _stray(src)
    monkeypatch.setattr(common, "check_one_copy_each", lambda *a, **k: None)
    _isolate(monkeypatch, tmp_path)
    hybrid.cli.main(["convert", src, out, "--no-verify"])
    wte = _converted_wte(out)
    assert bool((wte == 0).all()) and not torch.equal(wte, real.float())


def test_a_stray_safetensors_file_with_the_checkpoints_tensors_is_one_line(
        hf_folder, tmp_path, monkeypatch, capsys):  # noqa: F811
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    shutil.copytree(hf_folder, src)
    _stray(src)
    _isolate(monkeypatch, tmp_path)
    monkeypatch.setattr(dist, "init_process_group", _no_process_group)
    before = tree(src)
    line = one_line_error(hybrid.cli.main, ["convert", src, out], capsys)
    assert line == (f"hybrid convert: error: SRC {src}: tensor transformer.wte.weight is in zzz_stray.safetensors "
                    f"and in model.safetensors; convert reads every .safetensors file of the folder, so one would be "
                    f"read over the other: move the file that is not the checkpoint's out of the folder")
    assert tree(src) == before and not os.path.exists(out)


def test_a_safetensors_file_of_other_tensors_is_left_alone(hf_folder, tmp_path, monkeypatch, capsys):  # noqa: F811
    """An adapter beside the weights (its own tensor names) is no conflict: the conversion reads the weights."""
    from safetensors.torch import load_file, save_file
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    shutil.copytree(hf_folder, src)
    save_file({"base_model.lora_A.weight": torch.ones(2, 2)}, os.path.join(src, "adapter_model.safetensors"))
    _isolate(monkeypatch, tmp_path)
    hybrid.cli.main(["convert", src, out])
    real = load_file(os.path.join(src, "model.safetensors"))["transformer.wte.weight"]
    assert torch.equal(_converted_wte(out)[:real.shape[0]], real.float())


# --- a tokenizer that is not a regular file: read whole, a FIFO hung generate and /dev/zero filled memory ---------
@pytest.mark.parametrize("where", ["--tokenizer", "in-the-folder"])
def test_a_tokenizer_fifo_is_one_line_not_a_hang(where, hf_folder, tmp_path, monkeypatch, capsys):  # noqa: F811
    """A FIFO given as (or inside) the tokenizer: without the check generate blocks in read() -- here a writer
    thread feeds it `{}` so a regression fails on the message instead of hanging the suite."""
    import threading
    src = str(tmp_path / "src")
    shutil.copytree(hf_folder, src)
    # in the folder: beside its regular tokenizer.json (every .json of a tokenizer folder is parsed first)
    fifo = str(tmp_path / "tok.json") if where == "--tokenizer" else os.path.join(src, "vocab.json")
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "wb") as f:  # blocks until a reader opens it: only a regression does
            f.write(b"{}")
    threading.Thread(target=feed, daemon=True).start()
    _isolate(monkeypatch, tmp_path)
    monkeypatch.setattr(dist, "init_process_group", _no_process_group)
    argv = ["generate", src, "--prompt-ids", "1,2", "--max-new-tokens", "2"]
    line = one_line_error(hybrid.cli.main, argv + (["--tokenizer", fifo] if where == "--tokenizer" else []), capsys)
    why = "--tokenizer" if where == "--tokenizer" else "carried with SRC"
    assert line == (f"hybrid generate: error: tokenizer {fifo} ({why}): not a regular file (a FIFO, a device or a "
                    f"dangling link); give --tokenizer a tokenizer folder or its tokenizer.json, or --prompt-ids")
    os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # release the feeder


# --- hybrid -> transformers: what the export copies out of the checkpoint must be the checkpoint's --------------
SECRET = '{"auths": {"registry.example": {"auth": "c2VjcmV0OnRva2Vu"}}}'  # a credentials JSON of the user's


def _link_tokenizer(it_dir: str, secret: str) -> None:
    os.symlink(secret, os.path.join(it_dir, "tokenizer.json"))  # not in the manifest: the copy is not checked


def _recorded_tokenizer(it_dir: str, secret: str) -> None:
    from hybrid.checkpoint import store
    from test_trust import rehash
    path = os.path.join(it_dir, store.STATE)
    state = json.load(open(path))
    state["args"].update(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=secret)
    json.dump(state, open(path, "w"))
    rehash(it_dir)


EXPORT_CASES = [
    ("tokenizer-json-a-link", _link_tokenizer, "tokenizer.json is a symbolic link (to "),
    ("recorded-tokenizer-model-not-a-tokenizer", _recorded_tokenizer,
     "the run's --tokenizer-model {secret} (state.json): not a tokenizers file"),
]


@pytest.mark.parametrize("case", EXPORT_CASES, ids=[c[0] for c in EXPORT_CASES])
def test_the_export_never_copies_a_file_from_outside_the_checkpoint(
        case, saved, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Before: `hybrid convert CKPT DST` copied the target of a tokenizer.json link, or whatever JSON file state.json
    named as the run's --tokenizer-model, into DST/tokenizer.json -- a user's credentials in a folder made to be
    shared. Now one line, and no DST."""
    from hybrid.checkpoint import store
    name, plant, fragment = case
    secret = tmp_path / "home" / "config.json"
    secret.parent.mkdir()
    secret.write_text(SECRET)
    ck = str(tmp_path / "ckpt")
    shutil.copytree(saved, ck, symlinks=True)
    plant(store.final_path(ck, 2), str(secret))
    out = str(tmp_path / "out")
    _isolate(monkeypatch, tmp_path)
    monkeypatch.setattr(dist, "init_process_group", _no_process_group)
    line = one_line_error(hybrid.cli.main, ["convert", ck, out], capsys)
    assert line.startswith("hybrid convert: error: ") and fragment.format(secret=secret) in line, line
    assert not os.path.exists(out) and not [n for n in os.listdir(tmp_path) if n.startswith(".out.tmp")]
    found = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs
             if f != "config.json" and not os.path.islink(os.path.join(d, f))
             and SECRET.encode() in open(os.path.join(d, f), "rb").read()]
    assert found == [], found  # the secret is nowhere but where it was


# --- the state owners' plain values in state.json: taken as they were (a string counter ran to the end) ---------
OWNER_VALUES = [
    ("fault.nan_consecutive", "many", 'fault.nan_consecutive is "many", expected a non-negative integer'),
    ("fault.nan_skipped", {"a": 1}, 'fault.nan_skipped is {"a": 1}, expected a list of iterations'),
    ("fault.nan_skipped", [3, -1], "fault.nan_skipped is [3, -1], expected a list of iterations"),
    ("diloco.inflight", "x", 'diloco.inflight is "x", expected an integer >= -1'),
]


@pytest.mark.parametrize("key, value, fragment", OWNER_VALUES, ids=[f"{k}={v}" for k, v, _ in OWNER_VALUES])
def test_a_forged_owner_value_in_state_json_is_one_line_before_any_process_group(
        key, value, fragment, saved, tmp_path, monkeypatch, capsys):  # noqa: F811
    from hybrid.checkpoint import store
    from test_trust import rehash
    ck = str(tmp_path / "ckpt")
    shutil.copytree(saved, ck, symlinks=True)
    it = store.final_path(ck, 2)
    state = json.load(open(os.path.join(it, store.STATE)))
    state[key] = value
    json.dump(state, open(os.path.join(it, store.STATE), "w"))
    rehash(it)
    _isolate(monkeypatch, tmp_path)
    monkeypatch.setattr(dist, "init_process_group", _no_process_group)
    line = one_line_error(train_main.main, TINY[:-4] + ["--eval-iters", "1", "--load", ck, "--train-iters", "3"],
                          capsys)
    assert line.startswith("train.py: error: --load ") and f"state.json: {fragment}" in line, line
