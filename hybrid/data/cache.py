"""The sample-index cache (Megatron's --data-cache-path): a large run's document, shuffle and blend indices built
once, written as .npy files, and loaded by every other rank and every restart.

- Key: sha256 of everything that defines the arrays -- the kind (GPT split or blend), this format's version, and
  for a split its sequence lengths (the split's documents, byte for byte), --seq-length, the samples asked for and
  --seed; for a blend its weights and size (blend_indices reads nothing else). Two runs share a file only when the
  arrays would be equal, whatever the paths (a dataset rewritten in place gets a new key; Megatron keys on the path
  and sizes).
- Where: --data-cache-path DIR, else Megatron's default PREFIX/cache/GPTDataset_indices beside an indexed dataset's
  PREFIX.bin when that can be made and written; else (a read-only data folder) the index is built in memory on
  every rank, as before, with one line saying so. Builds under CACHE_MIN_ENTRIES (milliseconds) are not cached
  unless --data-cache-path is given: nothing is written beside small datasets.
- Written atomically: each array to a temporary name, renamed; then KEY-description.json, which records each
  file's bytes and sha256, renamed last -- the commit point. A description and files that disagree (truncated,
  overwritten, another key's) are never trusted: the index is rebuilt and the files replaced, with one line naming
  the file. np.load(allow_pickle=False): reading a cache file executes nothing.
- Built once: the ranks start before any process group (a bad --data-path is refused there), so they serialise on
  an flock of KEY.lock in the cache folder: the first builds and writes, the others wait on the lock and then load.
  Correctness never rests on the lock: where flock is unsupported (some network filesystems) each rank builds, and
  the renames leave one whole, identical copy.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
import tempfile
import time
from typing import Callable

import numpy as np

from hybrid.cliutil import is_rank_zero

VERSION = 1
# index entries (document + shuffle index, or blend) under which nothing is cached by default: ~50 ms to build
CACHE_MIN_ENTRIES = 1 << 20
# builds at or above this many samples print a progress line
PROGRESS_MIN_SAMPLES = 1 << 20
BUILDS = {"count": 0}  # builds through a cache in this process (the tests count them)


def key_of(**fields) -> str:
    """sha256 of the fields (arrays by their bytes and dtype, the rest by JSON) -- the cache key."""
    h = hashlib.sha256(f"hybrid-index-v{VERSION}".encode())
    for name in sorted(fields):
        value = fields[name]
        h.update(name.encode())
        if isinstance(value, np.ndarray):
            h.update(str(value.dtype).encode() + np.ascontiguousarray(value).tobytes())
        else:
            h.update(json.dumps(value, sort_keys=True).encode())
    return h.hexdigest()[:32]


def default_dir(prefix: str) -> str:
    """Megatron's default beside an indexed dataset: PREFIX/cache/GPTDataset_indices."""
    return os.path.join(prefix, "cache", "GPTDataset_indices")


def usable(folder: str) -> bool:
    """The folder exists or can be made, and can be written."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK | os.X_OK)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def _load(folder: str, key: str, say: bool = True) -> dict[str, np.ndarray] | None:
    """The arrays of `key`, verified against the description; None when absent. A damaged entry: one line naming
    the file (when `say`), then None (rebuilt)."""
    desc = os.path.join(folder, f"{key}-description.json")
    if not os.path.exists(desc):
        return None
    try:
        with open(desc) as f:
            files = json.load(f)["files"]
        out = {}
        for name, meta in files.items():
            path = os.path.join(folder, f"{key}-{name}.npy")
            if os.path.getsize(path) != meta["bytes"] or _sha256(path) != meta["sha256"]:
                raise ValueError(f"{path} does not match its description (truncated or overwritten)")
            out[name] = np.load(path, mmap_mode="r", allow_pickle=False)
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        if say:
            print(f"data cache: {desc}: {e}; not trusted, rebuilding it", file=sys.stderr, flush=True)
        return None


def _save(folder: str, key: str, arrays: dict[str, np.ndarray], what: dict) -> None:
    """Each array under a temporary name then renamed; the description (sizes, sha256) renamed last."""
    from hybrid import fault_hook
    files = {}
    for name, arr in arrays.items():
        path = os.path.join(folder, f"{key}-{name}.npy")
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}-{name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.save(f, np.ascontiguousarray(arr), allow_pickle=False)
            files[name] = {"bytes": os.path.getsize(tmp), "sha256": _sha256(tmp)}
            os.replace(tmp, path)
        finally:  # a failed write (a full disk) leaves no temporary behind
            if os.path.exists(tmp):
                os.remove(tmp)
    fault_hook.crash_point("index_cache_written")  # arrays renamed, description not yet: nothing trusted
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}-description.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({"version": VERSION, "what": what, "files": files}, f, indent=1)
    os.replace(tmp, os.path.join(folder, f"{key}-description.json"))


def _quiet() -> bool:
    return not is_rank_zero()


def cached(folder: str | None, key: str, what: dict, build: Callable[[], dict[str, np.ndarray]], label: str,
           samples: int) -> dict[str, np.ndarray]:
    """The arrays of `key` from `folder` (verified), else built -- by the first process to take the folder's lock
    for this key, the others waiting on it -- and written there. `folder` None: built here, nothing written."""
    if folder is None:  # every rank builds its own: rank 0 alone says so
        return timed_build(build, label, samples, say=not _quiet())
    t0 = time.perf_counter()
    arrays = _load(folder, key)
    if arrays is None:
        with _locked(os.path.join(folder, f"{key}.lock")):
            arrays = _load(folder, key, say=False)  # another rank may have built it while this one waited
            if arrays is None:
                arrays = timed_build(build, label, samples)
                BUILDS["count"] += 1
                _save(folder, key, arrays, what)
                return arrays
    if not _quiet() and samples >= PROGRESS_MIN_SAMPLES:
        print(f"data: loaded {label} from {folder} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return arrays


def timed_build(build: Callable[[], dict[str, np.ndarray]], label: str, samples: int,
                say: bool = True) -> dict[str, np.ndarray]:
    """build(), with a progress line around a long one (PROGRESS_MIN_SAMPLES or more) when `say`."""
    big = say and samples >= PROGRESS_MIN_SAMPLES
    t0 = time.perf_counter()
    if big:
        print(f"data: building {label} ...", flush=True)
    arrays = build()
    if big:
        print(f"data: building {label} ... done ({time.perf_counter() - t0:.1f} s)", flush=True)
    return arrays


class _locked:
    """An exclusive flock on `path` for the with-block (none where the filesystem refuses flock)."""

    def __init__(self, path: str):
        self.path, self.f = path, None

    def __enter__(self):
        try:
            self.f = open(self.path, "a")
            fcntl.flock(self.f, fcntl.LOCK_EX)
        except OSError:
            if self.f:
                self.f.close()
            self.f = None
        return self

    def __exit__(self, *exc):
        if self.f:
            fcntl.flock(self.f, fcntl.LOCK_UN)
            self.f.close()
