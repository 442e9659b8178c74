"""Untrusted files are data (issue 24): a checkpoint or model folder from elsewhere runs no code, reads nothing
outside its folder, and a bad one is one line naming the file -- through every entry point that reads it
(train.py --load, `hybrid convert`, `hybrid generate`, `hybrid checkpoint inspect`). No run replaces another's
checkpoint without consent, and the model is recognised by its config, not its path.

Each payload is a pickle whose unpickling opens (creates) a marker file: the test fails if the marker exists
afterwards. The checkpoint folder is hashed before and after: nothing in it is changed or lost."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import metadata as md
from torch.distributed.checkpoint.filesystem import _StorageInfo

import hybrid.cli
from hybrid import testing
from hybrid.checkpoint import safe_read, store
from hybrid.testing_inputs import OneLine, python_environment

train_main = importlib.import_module("hybrid.train.main")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--seq-length", "32", "--micro-batch-size", "2", "--log-interval", "1",
        "--eval-iters", "1"]  # a run's end-of-run validation and test: one batch each (no test here reads them)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HYBRID_FAULT",
                                                             "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RESTART_COUNT")}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    return env


def train(argv: list[str], cwd, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m hybrid.train ...` in `cwd`, a fork of hybrid.testing's forkserver (the environment of _env, then
    `env`)."""
    unset = {k: None for k in os.environ if k not in _env()}
    out = testing.run(["-m", "hybrid.train"] + TINY + argv, cwd=str(cwd), env={**unset, **_env(), **(env or {})},
                      timeout=600)
    if check:
        assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    """A real checkpoint: 2 steps of the default tiny model, one process, saved at iteration 2."""
    root = tmp_path_factory.mktemp("saved")
    train(["--train-iters", "2", "--save", str(root / "ckpt")], root)
    return str(root / "ckpt")


# --- what a hostile author of a checkpoint folder writes --------------------------------------------------------
class Payload:
    """Unpickling this calls open(marker, "w"): the marker's existence proves the pickle ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def rehash(it_dir: str, extra: dict | None = None) -> None:
    """Recompute the manifest over every file, as anyone can: a checksum is integrity, not authenticity."""
    files = {n: store.describe(os.path.join(it_dir, n)) for n in sorted(os.listdir(it_dir))
             if n != store.MANIFEST and os.path.isfile(os.path.join(it_dir, n))}
    files.update(extra or {})
    with open(os.path.join(it_dir, store.MANIFEST), "w") as f:
        json.dump({"format": store.FORMAT, "files": files}, f)


def _meta(it_dir: str) -> md.Metadata:
    with open(os.path.join(it_dir, ".metadata"), "rb") as f:
        return pickle.load(f)  # the test's own, trusted checkpoint


def _write_meta(it_dir: str, meta) -> None:
    with open(os.path.join(it_dir, ".metadata"), "wb") as f:
        pickle.dump(meta, f)


def _first_model_item(meta: md.Metadata):
    return next(i for i in meta.storage_data if i.fqn.startswith("model/"))


def plant_metadata_payload(it_dir, marker):
    with open(os.path.join(it_dir, ".metadata"), "wb") as f:
        pickle.dump(Payload(marker), f)
    rehash(it_dir)


def plant_metadata_payload_inside(it_dir, marker):
    """DCP's metadata, intact, with a payload hidden in a field (planner_data) -- the unpickler sees it first."""
    meta = _meta(it_dir)
    meta.planner_data = {"model/wte.weight": Payload(marker)}
    _write_meta(it_dir, meta)
    rehash(it_dir)


def plant_bytes_entry(it_dir, marker):
    """Only DCP's own classes, but a tensor declared as pickled bytes whose bytes are a payload: DCP's planner
    would torch.load(weights_only=False) them."""
    meta = _meta(it_dir)
    item = _first_model_item(meta)
    with open(os.path.join(it_dir, "payload.bin"), "wb") as f:
        buf = io.BytesIO()
        torch.save(Payload(marker), buf)
        f.write(buf.getvalue())
    meta.state_dict_metadata[item.fqn] = md.BytesStorageMetadata()
    meta.storage_data = {md.MetadataIndex(item.fqn): _StorageInfo("payload.bin", 0, len(buf.getvalue()))}
    _write_meta(it_dir, meta)
    rehash(it_dir)


def plant_data_payload(it_dir, marker):
    """Metadata well-formed and confined; the bytes of the first model tensor are a torch.save'd payload (DCP reads
    data with weights_only=True, which refuses it; we make that one line)."""
    meta = _meta(it_dir)
    item = _first_model_item(meta)
    data = os.path.join(it_dir, meta.storage_data[item].relative_path)
    buf = io.BytesIO()
    torch.save(Payload(marker), buf)
    start = os.path.getsize(data)
    with open(data, "ab") as f:
        f.write(buf.getvalue())
    meta.storage_data[item] = _StorageInfo(os.path.basename(data), start, len(buf.getvalue()))
    _write_meta(it_dir, meta)
    rehash(it_dir)


def _retarget(path: str):
    def plant(it_dir, marker):
        meta = _meta(it_dir)
        item = _first_model_item(meta)
        old = meta.storage_data[item]
        meta.storage_data[item] = _StorageInfo(path, old.offset, old.length)
        _write_meta(it_dir, meta)
        if path == "extra.distcp":
            shutil.copyfile(os.path.join(it_dir, old.relative_path), os.path.join(it_dir, path))
            rehash(it_dir)
            manifest = json.load(open(os.path.join(it_dir, store.MANIFEST)))
            del manifest["files"][path]
            json.dump(manifest, open(os.path.join(it_dir, store.MANIFEST), "w"))
        else:
            rehash(it_dir)
    return plant


def _meta_edit(fn):
    def plant(it_dir, marker):
        meta = _meta(it_dir)
        fn(meta)
        _write_meta(it_dir, meta)
        rehash(it_dir)
    return plant


def _outside_chunk(meta):
    t = meta.state_dict_metadata["model/wte.weight"]
    t.chunks[0] = md.ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([10**9, 64]))


def _resize(meta, key: str, size: list[int]) -> None:
    """A tensor declared larger than the model's (its chunks still inside it: only the shape check can tell)."""
    meta.state_dict_metadata[key].size = torch.Size(size)


def _offset_beyond(meta):
    item = _first_model_item(meta)
    old = meta.storage_data[item]
    meta.storage_data[item] = _StorageInfo(old.relative_path, 10**12, old.length)


def _transforms(meta):
    item = _first_model_item(meta)
    old = meta.storage_data[item]
    meta.storage_data[item] = _StorageInfo(old.relative_path, old.offset, old.length, ["zstd"])


def _json_edit(name: str, fn):
    def plant(it_dir, marker):
        path = os.path.join(it_dir, name)
        with open(path) as f:
            doc = json.load(f)
        doc = fn(doc)
        with open(path, "w") as f:
            f.write(doc if isinstance(doc, str) else json.dumps(doc))
        if name != store.MANIFEST:
            rehash(it_dir)
    return plant


def _bytes(name: str, content: bytes, rehashed: bool = True):
    def plant(it_dir, marker):
        with open(os.path.join(it_dir, name), "wb") as f:
            f.write(content)
        if rehashed and name != store.MANIFEST:
            rehash(it_dir)
    return plant


def _truncate(name: str):
    def plant(it_dir, marker):
        path = os.path.join(it_dir, name)
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[:len(data) // 2])
        rehash(it_dir)
    return plant


def _symlink(name: str, target: str):
    def plant(it_dir, marker):
        os.remove(os.path.join(it_dir, name))
        os.symlink(target, os.path.join(it_dir, name))
        rehash(it_dir, {name: {"bytes": 1, "sha256": "0" * 64}})
    return plant


def _set(key, value):
    def edit(doc):
        d = doc
        *path, last = key.split(".")
        for k in path:
            d = d[k]
        d[last] = value
        return doc
    return edit


# (id, how the folder is altered, the fragment the one error line must hold)
CASES = [
    ("metadata-pickle-payload", plant_metadata_payload, ".metadata: not DCP metadata (refers to io.open"),
    ("metadata-payload-inside", plant_metadata_payload_inside, "refers to io.open, which a hybrid checkpoint's metadata never"),
    ("metadata-bytes-entry", plant_bytes_entry, "refers to torch.distributed.checkpoint.metadata.BytesStorageMetadata"),
    ("metadata-path-traversal", _retarget("../../outside.distcp"), "not a file of the checkpoint folder"),
    ("metadata-absolute-path", _retarget("/etc/passwd"), "'/etc/passwd', not a file of the checkpoint folder"),
    ("metadata-unlisted-file", _retarget("extra.distcp"), "which manifest.json does not list"),
    ("metadata-offset-beyond-file", _meta_edit(_offset_beyond), "reads bytes [1000000000000"),
    ("metadata-chunk-outside-tensor", _meta_edit(_outside_chunk), "lies outside its size"),
    ("metadata-transforms", _meta_edit(_transforms), "with transforms"),
    ("metadata-shape-forged", _meta_edit(lambda m: _resize(m, "model/wte.weight", [512, 64])), "[512, 64]"),
    ("metadata-truncated", _truncate(".metadata"), ".metadata: not DCP metadata"),
    ("metadata-empty", _bytes(".metadata", b""), ".metadata: not DCP metadata"),
    ("metadata-a-list", _bytes(".metadata", pickle.dumps([1, 2])), "holds a list, not DCP's Metadata"),
    ("metadata-symlink", _symlink(".metadata", "/etc/hostname"), ".metadata: a symbolic link"),
    ("manifest-path-traversal", _json_edit(store.MANIFEST, lambda d: {**d, "files": {
        **d["files"], "../../x": {"bytes": 1, "sha256": "0" * 64}}}), "entry '../../x' is not a file of the checkpoint"),
    ("manifest-absolute", _json_edit(store.MANIFEST, lambda d: {**d, "files": {
        **d["files"], "/etc/passwd": {"bytes": 1, "sha256": "0" * 64}}}), "entry '/etc/passwd' is not a file"),
    ("manifest-files-a-list", _json_edit(store.MANIFEST, _set("files", [])), '"files" is list'),
    ("manifest-entry-string", _json_edit(store.MANIFEST, lambda d: {**d, "files": {**d["files"], "state.json": "x"}}),
     "expected {\"bytes\": <integer>"),
    ("manifest-bytes-negative", _json_edit(store.MANIFEST, lambda d: {**d, "files": {
        **d["files"], "state.json": {"bytes": -1, "sha256": "0" * 64}}}), "entry 'state.json' is"),
    ("manifest-top-level-list", _json_edit(store.MANIFEST, lambda d: [d]), "a JSON list, not an object"),
    ("manifest-not-json", _bytes(store.MANIFEST, b"{\"format\": "), "unreadable manifest.json"),
    ("manifest-not-utf8", _bytes(store.MANIFEST, b"{\"format\": \"\xff\"}"), "unreadable manifest.json"),
    ("manifest-deep-nesting", _bytes(store.MANIFEST, b"[" * 100000 + b"]" * 100000), "unreadable manifest.json"),
    ("manifest-no-metadata", _json_edit(store.MANIFEST, lambda d: {**d, "files": {
        k: v for k, v in d["files"].items() if k != ".metadata"}}), "lists no .metadata"),
    ("manifest-wrong-format", _json_edit(store.MANIFEST, _set("format", 7)), "format 7, expected"),
    ("state-iteration-string", _json_edit(store.STATE, _set("iteration", "2")),
     'state.json: iteration is "2", expected a non-negative integer'),
    ("state-iteration-other", _json_edit(store.STATE, _set("iteration", 7)), "iteration is 7, expected 2"),
    ("state-consumed-negative", _json_edit(store.STATE, _set("consumed_samples", -4)), "consumed_samples is -4"),
    ("state-layout-number", _json_edit(store.STATE, _set("layout", 3)), "layout is 3, expected an object"),
    ("state-layout-tp-zero", _json_edit(store.STATE, _set("layout.tp", 0)), "layout.tp is 0"),
    ("state-layout-zero-9", _json_edit(store.STATE, _set("layout.zero", 9)), "layout.zero is 9"),
    ("state-scaler-null", _json_edit(store.STATE, _set("scaler", None)), "scaler is null, expected an object"),
    ("state-scale-nan", _json_edit(store.STATE, _set("scaler.loss_scale", "NaN")), "scaler.loss_scale"),
    ("state-adam-step-float", _json_edit(store.STATE, _set("adam_step", 1.5)), "adam_step is 1.5"),
    ("state-model-list", _json_edit(store.STATE, _set("model", ["x"])), "model is [\"x\"]"),
    ("state-args-string", _json_edit(store.STATE, _set("args", "x")), "args is \"x\", expected an object"),
    ("state-top-level-list", _json_edit(store.STATE, lambda d: [d]), "state.json: a JSON list"),
    ("state-not-json", _bytes(store.STATE, b"{"), "unreadable state.json"),
    ("state-huge", _bytes(store.STATE, b" " * (17 << 20)), "more than any state.json hybrid writes"),
    ("state-symlink", _symlink(store.STATE, "/etc/hostname"), "state.json: a symbolic link"),
]
# what reads a checkpoint folder: (entry, argv after the folder, program name in the error line)
READERS = {
    "train": (lambda ck, out: (train_main.main, TINY + ["--load", ck, "--train-iters", "3"]), "train.py"),
    "convert": (lambda ck, out: (hybrid.cli.main, ["convert", ck, out]), "hybrid convert"),
    "generate": (lambda ck, out: (hybrid.cli.main, ["generate", ck, "--prompt-ids", "1,2", "--max-new-tokens", "2"]),
                 "hybrid generate"),
}


def tree(root) -> dict[str, str]:
    """Every file under root (links as their target) -> its sha256: what must not change."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            if os.path.islink(p):
                out[os.path.relpath(p, root)] = "-> " + os.readlink(p)
            elif os.path.isfile(p):
                out[os.path.relpath(p, root)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def _no_process_group(*a, **k):
    raise AssertionError("a process group was started for a bad checkpoint")


def _isolate(monkeypatch, cwd) -> None:
    monkeypatch.chdir(cwd)
    python_environment(monkeypatch)


def one_line_error(fn, argv, capsys) -> str:
    """`fn(argv)` ends with one line (hybrid.testing_inputs.OneLine), DeepSpeed's own import warnings aside."""
    return OneLine(capsys)(lambda: fn(argv), ignore=("[WARNING]",))


def _planted(saved, tmp_path, plant) -> tuple[str, str, str]:
    ck = str(tmp_path / "ckpt")
    shutil.copytree(saved, ck, symlinks=True)
    marker = str(tmp_path / "PAYLOAD_RAN")
    plant(store.final_path(ck, 2), marker)
    return ck, marker, str(tmp_path / "out")


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_hostile_checkpoint_is_one_line_runs_nothing_and_changes_nothing(saved, tmp_path, monkeypatch, capsys,
                                                                           case, reader):
    name, plant, fragment = case
    ck, marker, out = _planted(saved, tmp_path, plant)
    _isolate(monkeypatch, tmp_path)
    monkeypatch.setattr(dist, "init_process_group", _no_process_group)
    before = tree(ck)
    make, prog = READERS[reader]
    fn, argv = make(ck, out)
    line = one_line_error(fn, argv, capsys)
    assert line.startswith(f"{prog}: error: ") and fragment in line, line
    assert not os.path.exists(marker), "the payload ran"
    assert tree(ck) == before, "the checkpoint was changed"
    assert not os.path.exists(out) and not [n for n in os.listdir(tmp_path) if ".tmp." in n]


# inspect builds no model: a well-formed metadata with a tensor of another shape is found by the readers that load it
INSPECT_CASES = [c for c in CASES if c[0] != "metadata-shape-forged"]


@pytest.mark.parametrize("case", INSPECT_CASES, ids=[c[0] for c in INSPECT_CASES])
def test_inspect_names_the_bad_file_and_runs_nothing(saved, tmp_path, capsys, case):
    name, plant, fragment = case
    ck, marker, _ = _planted(saved, tmp_path, plant)
    before = tree(ck)
    with pytest.raises(SystemExit) as bad:  # a corrupt checkpoint: exit status 1
        hybrid.cli.main(["checkpoint", "inspect", ck])
    lines = capsys.readouterr().out.splitlines()
    assert bad.value.code == 1 and len(lines) == 2 and lines[1].startswith("  iter_0000002 (latest): ") and "CORRUPT: " in lines[1], lines
    assert fragment in lines[1], lines
    assert "ok: every checksum" not in lines[1]
    assert not os.path.exists(marker) and tree(ck) == before


def test_a_payload_in_the_tensor_data_is_refused_by_every_reader(saved, tmp_path, monkeypatch, capsys):
    """The metadata is well-formed and confined, so the up-front checks pass; DCP reads the data with
    torch.load(weights_only=True), which refuses the payload: one line naming the file, through train.py (after
    the process group: a real process), convert and generate."""
    ck, marker, out = _planted(saved, tmp_path, plant_data_payload)
    before = tree(ck)
    run = train(["--load", ck, "--train-iters", "3"], tmp_path, check=False)
    errors = [ln for ln in run.stderr.splitlines() if ln.strip() and "Warning" not in ln and "warn" not in ln]
    assert run.returncode != 0 and len(errors) == 1, run.stderr[-3000:]
    assert errors[0].startswith(f"train.py: error: --load {store.final_path(ck, 2)}: ") and "__0_0.distcp" in errors[0]
    assert "not the tensors DCP wrote" in errors[0] and "Traceback" not in run.stderr
    _isolate(monkeypatch, tmp_path)
    for reader in ("convert", "generate"):
        (make, prog) = READERS[reader]
        line = one_line_error(*make(ck, out), capsys)
        assert line.startswith(f"{prog}: error: ") and "__0_0.distcp: not the tensors DCP wrote" in line, line
    assert not os.path.exists(marker) and tree(ck) == before and not os.path.exists(out)


def test_the_restricted_unpickler_reads_what_dcp_writes_and_nothing_else(saved):
    meta = safe_read.read_metadata(store.final_path(saved, 2))
    assert meta.state_dict_metadata["model/wte.weight"].size == torch.Size([256, 64])
    for bad in (pickle.dumps(Payload("/nonexistent/x")), pickle.dumps(os.system), pickle.dumps(dict.fromkeys),
                b"\x80\x04\x8c\x07pathlib\x94\x8c\x0fPosixPath.touch\x94\x93\x94.",  # a method by a dotted name
                b"cpathlib\nPosixPath.touch\n."):
        with pytest.raises(pickle.UnpicklingError, match="metadata never holds"):
            safe_read.MetadataUnpickler(io.BytesIO(bad)).load()


def test_latest_pointing_at_a_device_or_a_fifo_is_not_read(saved, tmp_path):
    ck = str(tmp_path / "ckpt")
    shutil.copytree(saved, ck)
    os.remove(os.path.join(ck, store.LATEST))
    os.symlink("/dev/zero", os.path.join(ck, store.LATEST))
    assert store.read_latest(ck) is None and store.candidates(ck) == [2]
    os.remove(os.path.join(ck, store.LATEST))
    os.mkfifo(os.path.join(ck, store.LATEST))
    assert store.read_latest(ck) is None  # (opening a FIFO would block for ever)


# --- DeepSpeed folders: torch.load(weights_only=True) with an allow-list ------------------------------------
def _deepspeed_folder(root, model_states=None, optim_states=None, latest="global_step1") -> str:
    src = os.path.join(root, "ds")
    os.makedirs(os.path.join(src, "global_step1"))
    with open(os.path.join(src, "latest"), "w") as f:
        f.write(latest)
    for name, obj in (("zero_pp_rank_0_mp_rank_00_model_states.pt", model_states),
                      ("zero_pp_rank_0_mp_rank_00_optim_states.pt", optim_states)):
        plain = {"buffer_names": [], "module": {}, "param_shapes": [], "shared_params": {}, "ds_version": "0.19"}
        torch.save(obj if obj is not None else plain, os.path.join(src, "global_step1", name))
    return src


@pytest.mark.parametrize("where", ["model_states", "optim_states", "latest-traversal", "latest-absolute"])
def test_a_deepspeed_folder_runs_no_pickle_and_reads_only_its_own_folder(tmp_path, monkeypatch, capsys, where):
    marker = str(tmp_path / "PAYLOAD_RAN")
    (tmp_path / "outside").mkdir()
    payload = {"buffer_names": [], "module": {}, "param_shapes": [], "shared_params": {}, "ds_version": "0.19",
               "args": Payload(marker)}
    kw = {"model_states": payload} if where == "model_states" else {"optim_states": payload}
    if where.startswith("latest"):
        kw = {"latest": "../outside" if where == "latest-traversal" else str(tmp_path / "outside")}
    src = _deepspeed_folder(str(tmp_path), **kw)
    _isolate(monkeypatch, tmp_path)
    before = tree(src)
    line = one_line_error(hybrid.cli.main, ["convert", src, str(tmp_path / "out"), "--model", "tiny-llama"], capsys)
    if where.startswith("latest"):
        assert "latest: names" in line and "not a directory inside" in line, line
    else:
        assert f"{where}.pt: holds io.open, which a DeepSpeed ZeRO checkpoint's allow-list does not admit" \
            in line and "refused, nothing in it was run" in line, line
    assert not os.path.exists(marker) and tree(src) == before and not os.path.exists(tmp_path / "out")


# --- every float flag of every command refuses NaN and infinity ---------------------------------------------
class _Captured(Exception):
    pass


def _parser_built_by(fn) -> argparse.ArgumentParser:
    """The parser a script's parse_args builds (captured at its parse, before any check runs)."""
    from hybrid.cliutil import OneLineParser
    got = []

    def grab(self, *a, **k):
        got.append(self)
        raise _Captured
    with mock.patch.object(argparse.ArgumentParser, "parse_known_args", grab), \
            mock.patch.object(OneLineParser, "parse_known_args", grab):
        try:
            fn([])
        except _Captured:
            pass
    assert got, fn
    return got[0]


def _float_flags(parser: argparse.ArgumentParser, prefix: tuple = ()) -> list[tuple[tuple, str]]:
    """(subcommand path, flag) of every option whose type yields floats, through sub-commands."""
    out = []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                out += _float_flags(sub, prefix + (name,))
        elif a.option_strings and a.type is not None and _yields_float(a.type):
            out.append((prefix, a.option_strings[0]))
    return out


def _yields_float(kind) -> bool:
    """The flag's type turns some number into a float (float itself, cliutil.float_in, a size parser...)."""
    for text in ("0.5", "1.5", "2.5", "100.5", "1e-3"):
        try:
            return isinstance(kind(text), float)
        except (argparse.ArgumentTypeError, ValueError, TypeError):
            continue
    return False


def _script_entries() -> dict:
    from tests.test_inputs import _script
    entries = {}
    for f in sorted(os.listdir(os.path.join(ROOT, "scripts"))):
        module = _script(f[:-3]) if f.endswith(".py") else None
        if module is not None and hasattr(module, "parse_args"):
            entries[f[:-3]] = module.parse_args
    from hybrid.data import preprocess, train_tokenizer
    entries["preprocess_data"] = lambda argv: preprocess.build_parser().parse_args(argv)
    entries["train_tokenizer"] = lambda argv: train_tokenizer.build_parser().parse_args(argv)
    return entries


def _float_flag_cases() -> list:
    from hybrid.train.args import build_parser
    cases = [("train.py", (), flag) for _, flag in _float_flags(build_parser())]
    cases += [("hybrid", path, flag) for path, flag in _float_flags(hybrid.cli.build_parser())]
    for name, fn in _script_entries().items():
        if name != "train":  # scripts/train.py is train.py's parser, walked above
            cases += [(name, (), flag) for _, flag in _float_flags(_parser_built_by(fn))]
    return cases


FLOAT_FLAGS = _float_flag_cases()


def test_the_walk_finds_the_float_flags_of_every_command():
    progs = {c[0] for c in FLOAT_FLAGS}
    assert {"train.py", "hybrid", "gpu_check", "plot_schedule"} <= progs and len(FLOAT_FLAGS) >= 24, FLOAT_FLAGS
    assert ("train.py", (), "--watchdog-timeout") in FLOAT_FLAGS and ("train.py", (), "--straggler-factor") in FLOAT_FLAGS


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("case", FLOAT_FLAGS, ids=[f"{c[0]}:{' '.join(c[1])}:{c[2]}" for c in FLOAT_FLAGS])
def test_every_float_flag_refuses_nan_and_infinity_by_name(case, value, tmp_path, monkeypatch, capsys):
    """train.py through its whole validation (before any process group); the other commands at their parse."""
    prog, path, flag = case
    _isolate(monkeypatch, tmp_path)
    monkeypatch.setattr(dist, "init_process_group", _no_process_group)
    if prog == "train.py":
        fn, argv = train_main.validate, [flag, value]
    elif prog == "hybrid":
        fn, argv = hybrid.cli.main, list(path) + [f"{flag}={value}"]
    else:
        fn, argv = _script_entries()[prog], [f"{flag}={value}"]
    with pytest.raises(SystemExit) as e:
        fn(argv)
    text = capsys.readouterr().err + (str(e.value.code) if isinstance(e.value.code, str) else "")
    assert e.value.code not in (0, None) and flag in text and "Traceback" not in text, text


# --- DeepSpeed's CPU Adam: a first build says so, a stale lock is named -----------------------------------
KILLED_BUILD = """
import os, sys, time
from hybrid.zero.cpu_adam_build import cpu_adam_build
with cpu_adam_build(lambda line: print(line, flush=True), sys.argv[1]):
    open(os.path.join(sys.argv[1], "lock"), "w").close()  # torch's FileBaton, as a real build takes it
    print("building", flush=True)
    time.sleep(600)  # killed here
"""


def _start(code: str, directory: str) -> testing.Forked:
    """`python -c CODE DIRECTORY` in the environment of _env: a fork of hybrid.testing's forkserver, a process of
    its own (its own locks, killed by a signal) without a fresh interpreter's ~3 s of imports."""
    return testing.start(["-c", code, directory], env={**{k: None for k in os.environ if k not in _env()}, **_env()})


def _wait_for(child: testing.Forked, text: str, timeout: float = 120.0) -> None:
    """Until `text` is in the child's output (it says so once it holds its locks)."""
    deadline = time.monotonic() + timeout
    while text not in child.stdout():
        assert child.poll() is None and time.monotonic() < deadline, (child.stdout(), child.stderr())
        time.sleep(0.05)


def _fake_deepspeed_adam(monkeypatch, directory: str, seconds: float = 0.0):
    """DeepSpeedCPUAdam whose construction 'builds' (writes cpu_adam.so) -- the real build takes minutes."""
    import deepspeed.ops.adam

    class Fake(torch.optim.AdamW):
        def __init__(self, params, adamw_mode=True, **kw):
            time.sleep(seconds)
            open(os.path.join(directory, "cpu_adam.so"), "w").close()
            super().__init__(params, **kw)
    monkeypatch.setattr(deepspeed.ops.adam, "DeepSpeedCPUAdam", Fake)
    monkeypatch.setattr("hybrid.zero.cpu_adam_build._prebuilt", lambda name="cpu_adam": False)


def test_a_first_cpu_adam_build_prints_progress_and_a_killed_builds_lock_is_named(tmp_path, monkeypatch, capsys):
    from hybrid.zero.config import CpuAdam
    from hybrid.zero.cpu_adam_build import build_directory
    from hybrid.zero.engine import cpu_adamw
    # the forkserver (_start's) takes the environment of its first use, and its PRELOAD loads CPU Adam from that
    # build directory: started under the one below, every later fork of this process built CPU Adam afresh
    # (test_harness_cases' no-process check failed after this test on the same worker)
    from multiprocessing import forkserver
    testing._forkserver()
    forkserver.ensure_running()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    directory = build_directory()
    assert directory.startswith(str(tmp_path / "ext"))
    os.makedirs(directory, exist_ok=True)
    _fake_deepspeed_adam(monkeypatch, directory)
    groups = [{"params": [torch.zeros(4, requires_grad=True)]}]
    _, kind = cpu_adamw(groups, CpuAdam.DEEPSPEED, lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    out = capsys.readouterr().out
    assert kind == "deepspeed-cpu-adam" and "zero: building DeepSpeed's CPU Adam (first use" in out, out
    assert "zero: DeepSpeed's CPU Adam built in" in out
    cpu_adamw(groups, CpuAdam.DEEPSPEED, lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    assert "building" not in capsys.readouterr().out, "a cached build is silent"
    # a real process builds (holds hybrid's flock and torch's lock file) and is SIGKILLed mid-build
    os.remove(os.path.join(directory, "cpu_adam.so"))
    child = _start(KILLED_BUILD, directory)
    _wait_for(child, "building")
    child.kill()
    child.wait()
    start = time.monotonic()
    with pytest.raises(SystemExit) as e:
        cpu_adamw(groups, CpuAdam.DEEPSPEED, lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    assert time.monotonic() - start < 10, "named at once, not waited on"
    line = str(e.value.code)
    assert line.startswith("train.py: error: DeepSpeed's CPU Adam build lock ") and "\n" not in line
    assert f"rm {os.path.join(directory, 'lock')}" in line
    _, kind = cpu_adamw(groups, CpuAdam.AUTO, lr=1e-3, betas=(0.9, 0.95), eps=1e-8)  # auto: named, falls back
    assert kind == "torch-fused" and "warning: DeepSpeed's CPU Adam build lock" in capsys.readouterr().out


def test_a_build_in_progress_is_waited_for_not_called_stale(tmp_path, monkeypatch):
    """A live build holds hybrid's flock: the next process waits for it (then loads the cached build)."""
    from hybrid.zero.cpu_adam_build import cpu_adam_build
    directory = str(tmp_path / "cpu_adam")
    os.makedirs(directory)
    live = ("import os, sys, time\nfrom hybrid.zero.cpu_adam_build import cpu_adam_build\n"
            "with cpu_adam_build(lambda line: print(line, flush=True), sys.argv[1]):\n"
            "    open(os.path.join(sys.argv[1], 'lock'), 'w').close()\n    print('building', flush=True)\n"
            "    time.sleep(2)\n    open(os.path.join(sys.argv[1], 'cpu_adam.so'), 'w').close()\n"
            "    os.remove(os.path.join(sys.argv[1], 'lock'))\n")
    child = _start(live, directory)
    _wait_for(child, "building")
    lines = []
    start = time.monotonic()
    with cpu_adam_build(lines.append, directory):
        waited = time.monotonic() - start
    child.wait()
    assert waited > 0.5 and lines == [], (waited, lines)  # waited for the build; nothing left to build


# --- transformers folders and tokenizers: truncated or malformed files are one line -------------------------
@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> str:
    """A tiny GPT-2 saved by transformers' save_pretrained, with a tokenizer trained by train_tokenizer.py."""
    from transformers import AutoModelForCausalLM

    from hybrid.data.train_tokenizer import train as train_tokenizer
    from models.presets import transformers_config
    root = tmp_path_factory.mktemp("hf")
    AutoModelForCausalLM.from_config(transformers_config("tiny-gpt2")).save_pretrained(root / "hf")
    text = root / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 50)
    train_tokenizer([str(text)], 300, str(root / "hf"))
    return str(root / "hf")


def _cut(name: str, keep: int | None = None):
    def edit(folder):
        path = os.path.join(folder, name)
        data = open(path, "rb").read()
        open(path, "wb").write(data[:len(data) // 2 if keep is None else keep])
    return edit


def _write(name: str, text: str):
    def edit(folder):
        open(os.path.join(folder, name), "w").write(text)
    return edit


# (id, how the folder is altered, argv after SRC for generate, the fragment)
FOLDER_CASES = [
    ("safetensors-truncated", _cut("model.safetensors"), [], "not a readable safetensors checkpoint"),
    ("safetensors-header-cut", _cut("model.safetensors", 100), [], "not a readable safetensors checkpoint"),
    ("safetensors-empty", _cut("model.safetensors", 0), [], "not a readable safetensors checkpoint"),
    ("safetensors-not-one", _write("model.safetensors", "hello"), [], "not a readable safetensors checkpoint"),
    ("index-names-missing-shard", _write("model.safetensors.index.json",
                                         '{"weight_map": {"transformer.wte.weight": "gone.safetensors"}}'), [],
     "missing shard files: gone.safetensors"),
    ("index-path-traversal", _write("model.safetensors.index.json",
                                    '{"weight_map": {"transformer.wte.weight": "../outside.safetensors"}}'), [],
     "maps 'transformer.wte.weight' to '../outside.safetensors', not a file of the folder"),
    ("index-absolute-path", _write("model.safetensors.index.json",
                                   '{"weight_map": {"transformer.wte.weight": "/etc/passwd"}}'), [],
     "to '/etc/passwd', not a file of the folder"),
    ("index-not-json", _write("model.safetensors.index.json", '{"weight_map": '), [],
     "model.safetensors.index.json is not the index save_pretrained writes (JSONDecodeError: truncated?)"),
    ("tokenizer-truncated", _cut("tokenizer.json"), ["--prompt", "hi"], "tokenizer.json (carried with SRC): not readable"),
    ("tokenizer-empty-object", _write("tokenizer.json", "{}"), ["--prompt", "hi"], "not a readable tokenizer"),
    ("tokenizer-config-truncated", _cut("tokenizer_config.json"), ["--prompt", "hi"],
     "tokenizer_config.json (carried with SRC): not readable JSON"),
    ("tokenizer-flag-truncated", _cut("tokenizer.json"), ["--prompt", "hi", "--tokenizer", "{src}/tokenizer.json"],
     "tokenizer.json (--tokenizer): not readable JSON"),
]


FOLDER_RUNS = [(c, cmd) for c in FOLDER_CASES for cmd in ("generate", "convert") if cmd == "generate" or not c[2]]


@pytest.mark.parametrize("case, command", FOLDER_RUNS, ids=[f"{c[0]}-{cmd}" for c, cmd in FOLDER_RUNS])
def test_a_truncated_model_or_tokenizer_file_is_one_line(hf_folder, tmp_path, monkeypatch, capsys, case, command):
    """generate reads weights and the tokenizer; convert reads the weights (it copies tokenizer files as they are)."""
    name, edit, argv, fragment = case
    src = str(tmp_path / "src")
    shutil.copytree(hf_folder, src)
    edit(src)
    _isolate(monkeypatch, tmp_path)
    monkeypatch.setattr(dist, "init_process_group", _no_process_group)
    before = tree(src)
    if command == "convert":
        args = [command, src, str(tmp_path / "out")]
    else:
        args = ([command, src, "--max-new-tokens", "2"] + [a.replace("{src}", src) for a in argv]
                + (["--prompt-ids", "1,2"] if not argv else []))
    line = one_line_error(hybrid.cli.main, args, capsys)
    assert line.startswith(f"hybrid {command}: error: ") and fragment in line, line
    assert tree(src) == before and not os.path.exists(tmp_path / "out")


# --- the model a checkpoint holds: by its config, not its path --------------------------------------------------
def _config_folder(path, **changes) -> str:
    from models.presets import transformers_config
    hf = transformers_config("tiny-gpt2")  # the model `saved` was trained with (train.py's default --model)
    for k, v in changes.items():
        setattr(hf, k, v)
    hf.save_pretrained(path)
    return str(path)


def test_inspect_shows_the_model_identity_hash(saved, capsys):
    from hybrid.checkpoint.identity import model_identity
    from models import load_config
    hybrid.cli.main(["checkpoint", "inspect", saved])
    line = capsys.readouterr().out.splitlines()[1]
    assert f"model tiny-gpt2 (config {model_identity(load_config('tiny-gpt2'))['sha256']})" in line, line


def test_another_config_is_one_line_naming_the_first_differing_field(saved, tmp_path, monkeypatch, capsys):
    _isolate(monkeypatch, tmp_path)
    monkeypatch.setattr(dist, "init_process_group", _no_process_group)
    edited = _config_folder(tmp_path / "edited", n_layer=3)
    line = one_line_error(train_main.main, TINY + ["--load", saved, "--model", edited, "--train-iters", "3"], capsys)
    assert "holds another model: its num_layers is 4, --model" in line and "has 3" in line, line
    wider = _config_folder(tmp_path / "wider", vocab_size=300)
    line = one_line_error(train_main.main, TINY + ["--load", saved, "--model", wider, "--train-iters", "3"], capsys)
    assert "its vocab_size is 256" in line and "has 300" in line, line


@pytest.mark.slow  # a train.py run that trains (forked)
def test_an_edited_config_under_the_same_path_is_one_line_not_a_size_mismatch(tmp_path, monkeypatch, capsys):
    """The issue's case: train with --model DIR, edit DIR/config.json (a wider vocabulary, more layers), --load with
    the same --model DIR -- it was load_state_dict's size-mismatch traceback; the path is the same, the model is
    not, and the checkpoint is left as it was."""
    model = _config_folder(tmp_path / "m")
    train(["--model", model, "--train-iters", "1", "--save", str(tmp_path / "ck")], tmp_path)
    before = tree(tmp_path / "ck")
    _isolate(monkeypatch, tmp_path)
    monkeypatch.setattr(dist, "init_process_group", _no_process_group)
    for field, saved_value, edit in (("vocab_size", 256, {"vocab_size": 300}), ("num_layers", 4, {"n_layer": 6})):
        config = json.load(open(os.path.join(model, "config.json")))
        json.dump({**config, **edit}, open(os.path.join(model, "config.json"), "w"))
        argv = TINY + ["--model", model, "--load", str(tmp_path / "ck"), "--train-iters", "2"]
        line = one_line_error(train_main.main, argv, capsys)
        assert line.startswith("train.py: error: --load ") and "holds another model: " in line, line
        assert f"its {field} is {saved_value}, --model {model} has {list(edit.values())[0]}" in line, line
        json.dump(config, open(os.path.join(model, "config.json"), "w"))
    assert tree(tmp_path / "ck") == before


def test_a_forged_moment_shape_is_one_line_before_any_process_group(saved, tmp_path, monkeypatch, capsys):
    ck, _, _ = _planted(saved, tmp_path, _meta_edit(lambda m: _resize(m, "optim.exp_avg/wpe.weight", [300, 64])))
    _isolate(monkeypatch, tmp_path)
    monkeypatch.setattr(dist, "init_process_group", _no_process_group)
    line = one_line_error(train_main.main, TINY + ["--load", ck, "--train-iters", "3"], capsys)
    assert "optim.exp_avg/wpe.weight is saved with shape [300, 64], --model's model has [256, 64]" in line, line


@pytest.mark.slow  # train.py runs that train (forked)
def test_the_same_config_under_another_path_resumes_and_overwrite_save_replaces_another_run(saved, tmp_path):
    """A run of --model <a folder with tiny-gpt2's config> resumes a checkpoint saved as `--model tiny-gpt2`; a run
    into a --save folder holding another run's checkpoints needs --overwrite-save, which removes them once its own
    first checkpoint is complete."""
    same = _config_folder(tmp_path / "same")
    out = train(["--load", saved, "--model", same, "--train-iters", "3"], tmp_path)
    assert f"checkpoint: resumed from {store.final_path(saved, 2)}" in out.stdout
    other = str(tmp_path / "other")
    shutil.copytree(saved, other)
    refused = train(["--save", other, "--train-iters", "1"], tmp_path, check=False)
    assert refused.returncode != 0 and "holds another run's checkpoints" in refused.stderr
    assert store.complete_iterations(other) == [2]
    done = train(["--save", other, "--overwrite-save", "--train-iters", "1"], tmp_path)
    assert "--overwrite-save: removed the earlier run's 1 checkpoint(s)" in done.stdout
    assert store.complete_iterations(other) == [1] and store.read_latest(other) == 1


# --- tools never replace a good output with a worse one ----------------------------------------------------------
@pytest.mark.parametrize("bad", ["empty", "whitespace", "not-json", "not-utf8", "no-key", "fifo"])
def test_a_bad_input_never_replaces_a_good_tokenizer_or_dataset(tmp_path, monkeypatch, capsys, bad):
    """train_tokenizer.py and preprocess_data.py read every input before writing: a bad one is one line and the
    tokenizer / indexed dataset already at the output stays byte for byte."""
    from hybrid.data import preprocess, train_tokenizer
    monkeypatch.chdir(tmp_path)
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"text": f"document {i} about foxes and dogs"}) + "\n" for i in range(40)))
    train_tokenizer.main(["--input", str(good), "--output", "tok", "--vocab-size", "300"])
    preprocess.main(["--input", str(good), "--output-prefix", "data", "--tokenizer-type", "ByteLevel"])
    capsys.readouterr()
    path = tmp_path / "bad.jsonl"
    if bad == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes({"empty": b"", "whitespace": b"\n \n", "not-json": b"{\"text\": \n",
                          "not-utf8": b"{\"text\": \"\xff\xfe\"}\n", "no-key": b"{\"body\": \"x\"}\n"}[bad])
    before = tree(tmp_path)
    for fn, argv in ((train_tokenizer.main, ["--input", str(path), "--output", "tok", "--vocab-size", "300"]),
                     (preprocess.main, ["--input", str(path), "--output-prefix", "data", "--tokenizer-type",
                                        "ByteLevel"])):
        line = one_line_error(fn, argv, capsys)
        assert "error: --input" in line and "bad.jsonl" in line, line
    assert tree(tmp_path) == before, "a good output was replaced"


# --- the NaN guard: non-finite weights at load, a skipped first step -----------------------------------------------
def test_non_finite_loaded_weights_are_one_line_naming_the_parameter(hf_folder, tmp_path):
    """A --load folder with a NaN weight: the guard stops before the first step (exit 65), one line naming it -- it
    was an AttributeError at the first log line."""
    from safetensors.torch import load_file, save_file
    src = str(tmp_path / "nan")
    shutil.copytree(hf_folder, src)
    weights = load_file(os.path.join(src, "model.safetensors"))
    weights["transformer.h.1.mlp.c_fc.weight"][3, 5] = float("nan")
    save_file(weights, os.path.join(src, "model.safetensors"), metadata={"format": "pt"})
    out = train(["--load", src, "--model", src, "--train-iters", "3"], tmp_path, check=False)
    errors = [ln for ln in out.stderr.splitlines() if "error" in ln]
    assert out.returncode == 65 and len(errors) == 1, out.stderr[-2000:]
    assert errors[0].startswith("train.py: error: nan-guard: the weights at the start of training are not finite "
                                "(0.h.1.mlp.c_fc.weight on rank 0") and "Traceback" not in out.stderr


def test_a_nan_weight_in_a_hybrid_checkpoint_is_one_line_naming_it(saved, tmp_path):
    """The same through a hybrid (DCP) checkpoint: the saved model tensors rewritten with one NaN (DCP's own
    torch-save round trip, the manifest re-hashed), --load stops before the first step naming the parameter."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp
    ck = str(tmp_path / "ckpt")
    shutil.copytree(saved, ck)
    it_dir = store.final_path(ck, 2)
    full = str(tmp_path / "full.pt")
    dcp_to_torch_save(it_dir, full)  # the test's own, trusted checkpoint
    state = torch.load(full, weights_only=True)
    state["model/h.1.mlp.c_fc.weight"][3, 5] = float("nan")
    torch.save(state, full)
    for name in os.listdir(it_dir):
        if name == ".metadata" or name.endswith(".distcp"):
            os.remove(os.path.join(it_dir, name))
    torch_save_to_dcp(full, it_dir)
    rehash(it_dir)
    out = train(["--load", ck, "--train-iters", "3"], tmp_path, check=False)
    errors = [ln for ln in out.stderr.splitlines() if "error" in ln]
    assert out.returncode == 65 and len(errors) == 1, out.stderr[-2000:]
    assert errors[0].startswith("train.py: error: nan-guard: the weights at the start of training are not finite "
                                "(0.h.1.mlp.c_fc.weight on rank 0") and "Traceback" not in out.stderr


@pytest.mark.slow  # train.py runs that train (forked)
def test_a_skipped_first_step_is_logged_not_an_attribute_error(tmp_path):
    env_fault = {"HYBRID_FAULT": "nan:rank=0,iterations=1"}
    out = train(["--train-iters", "2"], tmp_path, env=env_fault)
    assert "nan-guard: iteration 1: skipped the step on every rank" in out.stdout
    first = next(ln for ln in out.stdout.splitlines() if ln.startswith(" iteration      1/"))
    assert "grad norm" not in first, first  # the skipped step has no norm (it was last_report None: AttributeError)


def test_a_stale_build_lock_of_deepspeeds_cpu_collectives_is_named_and_setup_prebuilds_them(tmp_path, monkeypatch):
    """deepspeed.initialize on CPU JIT-builds its shared-memory collectives (deepspeed_shm_comm) behind torch's file
    lock; a build killed under a time limit left that lock and every later DeepSpeed peer (benchmarks, conversion
    tests) hung. The peers now load it first under hybrid's build lock, which names a stale lock at once, and
    scripts/setup.sh builds every op of DEEPSPEED_OPS before any test or benchmark runs."""
    from hybrid.zero import cpu_adam_build as build
    monkeypatch.setattr(build, "_prebuilt", lambda name="cpu_adam": False)
    directory = tmp_path / "deepspeed_shm_comm"
    directory.mkdir()
    (directory / "lock").touch()
    start = time.monotonic()
    with pytest.raises(build.StaleBuildLock) as e:
        with build.cpu_adam_build(name="deepspeed_shm_comm", directory=str(directory)):
            pass
    assert time.monotonic() - start < 10
    assert str(e.value).startswith("DeepSpeed's deepspeed_shm_comm build lock ") and "--cpu-adam" not in str(e.value)
    assert set(build.DEEPSPEED_OPS) == {"cpu_adam", "deepspeed_shm_comm", "fused_adam"}
    setup = (Path(__file__).resolve().parents[1] / "scripts" / "setup.sh").read_text()
    assert "python -m hybrid.zero.cpu_adam_build" in setup.replace('"$PY"', "python")
    for name in ("bench_zero.py", "bench_checkpoint.py"):
        text = (Path(__file__).resolve().parents[1] / "scripts" / name).read_text()
        # loaded before deepspeed.initialize, never around it (initialize runs collectives: a rank holding the
        # build lock there waits for a peer that waits for the lock)
        for op in ("deepspeed_shm_comm", "fused_adam"):  # fused_adam: the configs' AdamW (a hang seen in round 17)
            assert 0 < text.index(f'load_op("{op}")') < text.index("deepspeed.initialize("), (name, op)
