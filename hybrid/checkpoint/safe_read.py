"""Reading a checkpoint someone else may have written: its files are data -- no code runs, nothing outside its
folder is read.

A checkpoint folder travels between people and clusters, and its manifest's sha256 is integrity, not
authenticity: anyone who can replace a file can re-hash it. So every file is read as untrusted input:

* DCP's `.metadata` is a pickle (FileSystemReader.read_metadata calls pickle.load, which runs whatever callable
  the stream names). `read_metadata` unpickles it with `MetadataUnpickler`, which resolves only the classes DCP
  itself writes there (torch 2.13: torch/distributed/checkpoint/metadata.py and filesystem._StorageInfo, plus
  torch.Size, torch dtypes and layouts, pathlib.PosixPath for `checkpoint_id`); any other global is refused before
  it is looked up, so nothing else can be called. The result is then checked field by field (`check_metadata`).
* A `BytesStorageMetadata` entry would make DCP's planner unpickle that item's bytes with
  `torch.load(weights_only=False)` (DefaultLoadPlanner.load_bytes): hybrid never writes one, so it is refused.
* The data files (`__<rank>_<n>.distcp`) are read by DCP with `torch.load(weights_only=True)`, which admits tensors
  only; `SafeReader.read_data` turns its refusal into one line naming the file.
* Every path the metadata names is a plain file name in the checkpoint folder, listed in its manifest, and every
  (offset, length) lies inside that file: `Path(dir) / "/etc/passwd"` would be /etc/passwd.

    reader = SafeReader(it_dir)                    # instead of dcp.FileSystemReader(it_dir)
    load(state_dict, it_dir, no_dist=True)         # dcp.load through it; CorruptCheckpoint (one line) on bad data
    check_checkpoint(it_dir)                       # manifest, state.json and .metadata well-formed and confined
"""

from __future__ import annotations

import os
import pickle
from pathlib import PosixPath, PurePosixPath

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import metadata as md
from torch.distributed.checkpoint.filesystem import _StorageInfo

from hybrid.checkpoint import store
from hybrid.checkpoint.store import CorruptCheckpoint

METADATA = ".metadata"
# (module, name) -> the object the unpickler may resolve: what DCP's FileSystemWriter pickles into .metadata
ALLOWED = {
    ("torch.distributed.checkpoint.metadata", "Metadata"): md.Metadata,
    ("torch.distributed.checkpoint.metadata", "StorageMeta"): md.StorageMeta,
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"): md.MetadataIndex,
    ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"): md.TensorStorageMetadata,
    ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"): md.ChunkStorageMetadata,
    ("torch.distributed.checkpoint.metadata", "TensorProperties"): md.TensorProperties,
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"): md._MEM_FORMAT_ENCODING,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,  # a lookup in torch's layouts
    ("pathlib", "PosixPath"): PosixPath,
    ("pathlib", "PurePosixPath"): PurePosixPath,
}
ALLOWED.update({("torch", name): v for name, v in vars(torch).items() if isinstance(v, torch.dtype)})
# what BUILD may set on each admitted class (its dataclass fields; TensorProperties has its own __setstate__)
_FIELDS = {cls: set(cls.__dataclass_fields__) for cls in ALLOWED.values() if hasattr(cls, "__dataclass_fields__")}


class MetadataUnpickler(pickle.Unpickler):
    """pickle.Unpickler that resolves only ALLOWED globals (the Python docs' "Restricting Globals" recipe); a
    persistent id, which .metadata never holds, is refused too."""

    def find_class(self, module: str, name: str):
        try:
            return ALLOWED[(module, name)]
        except (KeyError, TypeError):
            raise pickle.UnpicklingError(f"refers to {module}.{name}, which a hybrid checkpoint's metadata never "
                                         f"holds") from None

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("holds a persistent reference, which a hybrid checkpoint's metadata never holds")


def _bad(directory: str, why: str) -> CorruptCheckpoint:
    return CorruptCheckpoint(f"{os.path.join(directory, METADATA)}: {why}; not loaded (nothing in it was run)")


def read_metadata(directory: str, files: dict | None = None) -> md.Metadata:
    """DCP's Metadata of the checkpoint `directory`, unpickled with MetadataUnpickler and checked
    (check_metadata); CorruptCheckpoint naming the file otherwise. `files`: the manifest's file table (read
    here when None) -- every data file the metadata names must be in it."""
    path = os.path.join(directory, METADATA)
    if os.path.islink(path) or not os.path.isfile(path):
        what = "a symbolic link" if os.path.islink(path) else "not a regular file" if os.path.exists(path) else "missing"
        raise CorruptCheckpoint(f"{path}: {what}; a checkpoint's files are regular files inside its folder")
    if files is None:
        files = store.read_manifest(directory)["files"]
    if METADATA in files and os.path.getsize(path) != files[METADATA]["bytes"]:
        raise CorruptCheckpoint(f"{path}: {os.path.getsize(path)} bytes, the manifest says "
                                f"{files[METADATA]['bytes']} (truncated?)")
    with open(path, "rb") as f:
        try:
            meta = MetadataUnpickler(f).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, KeyError, IndexError,
                RuntimeError, MemoryError, RecursionError, OverflowError, UnicodeDecodeError) as e:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise _bad(directory, f"not DCP metadata ({why[:200]})") from None
    check_metadata(meta, directory, files)
    return meta


def _size(value, what: str, directory: str) -> tuple[int, ...]:
    if not isinstance(value, torch.Size) or any(type(n) is not int or n < 0 for n in value):
        raise _bad(directory, f"{what} is not a size ({value!r:.80})")
    return tuple(value)


def _check_tensor(key: str, t: md.TensorStorageMetadata, directory: str) -> None:
    if not isinstance(t.properties, md.TensorProperties) or not isinstance(t.properties.dtype, torch.dtype):
        raise _bad(directory, f"{key!r} has no tensor dtype")
    shape = _size(t.size, f"the size of {key!r}", directory)
    if not isinstance(t.chunks, list):
        raise _bad(directory, f"the chunks of {key!r} are not a list")
    for c in t.chunks:
        if not isinstance(c, md.ChunkStorageMetadata):
            raise _bad(directory, f"a chunk of {key!r} is a {type(c).__name__}")
        off, size = _size(c.offsets, f"a chunk offset of {key!r}", directory), _size(c.sizes, "a chunk size", directory)
        if len(off) != len(shape) or len(size) != len(shape) or any(o + s > n for o, s, n in zip(off, size, shape)):
            raise _bad(directory, f"a chunk of {key!r} at {list(off)} + {list(size)} lies outside its size "
                                  f"{list(shape)}")


def _check_storage(index, info, directory: str, files: dict, sizes: dict) -> None:
    if not isinstance(index, md.MetadataIndex) or not isinstance(index.fqn, str):
        raise _bad(directory, f"a storage key is a {type(index).__name__}, not a MetadataIndex")
    if not isinstance(info, _StorageInfo):
        raise _bad(directory, f"the storage of {index.fqn!r} is a {type(info).__name__}")
    name = info.relative_path
    if not isinstance(name, str) or not store.is_plain_name(name):
        raise _bad(directory, f"{index.fqn!r} is stored at {name!r}, not a file of the checkpoint folder")
    if name not in files:
        raise _bad(directory, f"{index.fqn!r} is stored in {name!r}, which manifest.json does not list")
    if info.transform_descriptors:
        raise _bad(directory, f"{index.fqn!r} is stored with transforms {info.transform_descriptors!r:.80}, "
                              f"which hybrid never writes")
    if type(info.offset) is not int or type(info.length) is not int or info.offset < 0 or info.length < 0:
        raise _bad(directory, f"{index.fqn!r} has offset {info.offset!r:.40} and length {info.length!r:.40}")
    size = sizes.setdefault(name, files[name]["bytes"])
    if info.offset + info.length > size:
        raise _bad(directory, f"{index.fqn!r} reads bytes [{info.offset}, {info.offset + info.length}) of "
                              f"{name} ({size} bytes)")


def check_metadata(meta, directory: str, files: dict) -> None:
    """Every field DCP's load reads: tensors only (no BytesStorageMetadata), chunks inside their tensor, storage in
    files the manifest lists, at offsets inside them."""
    if not isinstance(meta, md.Metadata):
        raise _bad(directory, f"holds a {type(meta).__name__}, not DCP's Metadata")
    for obj in (meta, meta.storage_meta):
        if obj is not None and not set(vars(obj)) <= _FIELDS.get(type(obj), set()):
            raise _bad(directory, f"{type(obj).__name__} has fields {sorted(set(vars(obj)) - _FIELDS[type(obj)])}")
    if not isinstance(meta.state_dict_metadata, dict):
        raise _bad(directory, "state_dict_metadata is not a dict")
    for key, value in meta.state_dict_metadata.items():
        if not isinstance(key, str):
            raise _bad(directory, f"a key is a {type(key).__name__}")
        if isinstance(value, md.BytesStorageMetadata):
            raise _bad(directory, f"{key!r} is stored as pickled bytes (DCP would unpickle them with "
                                  f"weights_only=False); hybrid saves tensors only")
        if not isinstance(value, md.TensorStorageMetadata):
            raise _bad(directory, f"{key!r} is a {type(value).__name__}, not a tensor")
        _check_tensor(key, value, directory)
    if not isinstance(meta.storage_data, dict):
        raise _bad(directory, "storage_data is not a dict")
    sizes: dict[str, int] = {}
    for index, info in meta.storage_data.items():
        _check_storage(index, info, directory, files, sizes)
    if meta.planner_data is not None and not isinstance(meta.planner_data, dict):
        raise _bad(directory, "planner_data is not a dict")


class SafeReader(dcp.FileSystemReader):
    """DCP's FileSystemReader with `.metadata` read by read_metadata (restricted, checked, confined) and the data
    files' refusals (torch.load weights_only) as one line naming the file."""

    def read_metadata(self, *args, **kwargs) -> md.Metadata:
        if kwargs.get("rank") is not None:  # per-rank metadata files: hybrid never writes them
            raise CorruptCheckpoint(f"{self.path}: per-rank metadata is not read")
        meta = read_metadata(str(self.path))
        if meta.storage_meta is None:
            meta.storage_meta = md.StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta

    def read_data(self, plan, planner):
        try:
            return super().read_data(plan, planner)
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, AssertionError, OSError) as e:
            names = sorted({self.storage_data[r.storage_index].relative_path for r in plan.items})
            why = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise CorruptCheckpoint(f"{os.path.join(str(self.path), names[0] if len(names) == 1 else '__*.distcp')}"
                                    f": not the tensors DCP wrote ({type(e).__name__}: {why[:160]}); not loaded "
                                    f"(nothing in it was run)") from None


def load(state_dict: dict, directory: str, **kwargs) -> None:
    """dcp.load(state_dict) from `directory` through SafeReader; CorruptCheckpoint (one line) when a file is not
    what DCP wrote. kwargs: dcp.load's (process_group, no_dist, planner)."""
    try:
        dcp.load(state_dict, storage_reader=SafeReader(directory), **kwargs)
    except dcp.api.CheckpointException as e:
        raise CorruptCheckpoint(_first_failure(e)) from None


def _first_failure(e) -> str:
    """The first rank's error of a CheckpointException (DCP gathers every rank's exception and traceback)."""
    for _, (exc, _trace) in sorted(e.failures.items()):
        if isinstance(exc, CorruptCheckpoint):
            return str(exc)
        inner = getattr(exc, "failures", None)  # nested (a gather inside the load's own gather)
        if inner:
            return _first_failure(exc)
        return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
    return "DCP load failed"


def check_checkpoint(directory: str) -> md.Metadata:
    """manifest.json, state.json and .metadata of one complete checkpoint directory: well-formed, confined to the
    folder, no code; CorruptCheckpoint naming the file and the field otherwise. Reads the three small files only
    (the checksums are store.verify_file's)."""
    files = store.read_manifest(directory)["files"]
    store.read_state(directory)
    return read_metadata(directory, files)


__all__ = ["ALLOWED", "MetadataUnpickler", "SafeReader", "check_checkpoint", "check_metadata", "load",
           "read_metadata"]
