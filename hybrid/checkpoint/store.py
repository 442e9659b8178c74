"""The checkpoint directory: names, completeness, checksums, `latest`, retention -- no process group here.

    DIR/iter_0000010.tmp/     being written (never loaded; removed by the next save)
    DIR/iter_0000010/         complete: DCP's .metadata and __<rank>_<n>.distcp files, state.json,
                              manifest.json (bytes + sha256 of every other file)
    DIR/latest                "iter_0000010": the newest complete checkpoint (written by rename)

Order of a save: every rank writes and fsyncs its files into the .tmp directory; rank 0 writes state.json
and manifest.json, fsyncs them, renames the directory, fsyncs DIR, then writes `latest` by tmp + rename.
A crash at any point leaves `latest` naming a complete directory (or no `latest` at all).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass

MANIFEST, STATE, LATEST = "manifest.json", "state.json", "latest"
FORMAT = "hybrid-dcp/1"
_ITER = re.compile(r"^iter_(\d{7,})$")


class CorruptCheckpoint(ValueError):
    """A file of a checkpoint is missing, truncated or altered (its manifest says so)."""


def iter_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def tmp_path(root: str, iteration: int) -> str:
    return os.path.join(root, iter_name(iteration) + ".tmp")


def final_path(root: str, iteration: int) -> str:
    return os.path.join(root, iter_name(iteration))


def complete_iterations(root: str) -> list[int]:
    """Iterations of the complete checkpoints in `root` (renamed directories with a manifest), ascending."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        m = _ITER.match(name)
        if m and os.path.isfile(os.path.join(root, name, MANIFEST)):
            out.append(int(m.group(1)))
    return sorted(out)


def is_checkpoint_dir(root: str) -> bool:
    """`root` holds a hybrid checkpoint (a `latest` file or an iter_* directory), complete or not."""
    return os.path.isdir(root) and (os.path.isfile(os.path.join(root, LATEST)) or
                                    any(n.startswith("iter_") for n in os.listdir(root)))


def read_latest(root: str) -> int | None:
    """The iteration `latest` names, when it names a complete checkpoint."""
    try:
        with open(os.path.join(root, LATEST)) as f:
            m = _ITER.match(f.read().strip())
    except OSError:
        return None
    if m and int(m.group(1)) in complete_iterations(root):
        return int(m.group(1))
    return None


def candidates(root: str) -> list[int]:
    """Complete checkpoints to try, best first: the one `latest` names, then the others newest first."""
    done = sorted(complete_iterations(root), reverse=True)
    head = read_latest(root)
    return ([head] if head is not None else []) + [i for i in done if i != head]


def sha256(path: str, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def describe(path: str) -> dict:
    return {"bytes": os.path.getsize(path), "sha256": sha256(path)}


def fsync_path(path: str) -> None:
    """Make a file's data, or a directory's entries, durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: str, text: str) -> None:
    """Write `path` as tmp + fsync + rename + fsync of its directory."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(os.path.dirname(os.path.abspath(path)))


def rank_files(directory: str, rank: int) -> list[str]:
    """The data files rank `rank` wrote (FileSystemWriter names them __<rank>_<n>.distcp)."""
    return sorted(n for n in os.listdir(directory) if n.startswith(f"__{rank}_") and n.endswith(".distcp"))


def finalize(root: str, iteration: int, files: dict[str, dict], state: dict) -> str:
    """Rank 0, after every rank's files are durable: state.json, manifest.json, rename, `latest`."""
    tmp = tmp_path(root, iteration)
    write_durable(os.path.join(tmp, STATE), json.dumps(state, indent=1, sort_keys=True))
    files = dict(files)
    for name in (".metadata", STATE):
        fsync_path(os.path.join(tmp, name))
        files[name] = describe(os.path.join(tmp, name))
    write_durable(os.path.join(tmp, MANIFEST), json.dumps({"format": FORMAT, "files": files}, indent=1,
                                                          sort_keys=True))
    from hybrid.checkpoint.faults import crash_point
    crash_point("before_rename", iteration)  # test-only: a crash with every file written but the directory not renamed
    final = final_path(root, iteration)
    if os.path.exists(final):  # a re-save of the same iteration (a resumed run): replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_path(root)
    write_durable(os.path.join(root, LATEST), iter_name(iteration) + "\n")
    return final


def clean_partial(root: str) -> list[str]:
    """Remove leftover .tmp directories (a save that died); returns their names."""
    gone = []
    if os.path.isdir(root):
        for name in sorted(os.listdir(root)):
            if name.startswith("iter_") and name.endswith(".tmp"):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
                gone.append(name)
    return gone


def retain(root: str, keep: int) -> list[int]:
    """Delete all but the `keep` newest complete checkpoints; the one `latest` names is always kept."""
    done = complete_iterations(root)
    head = read_latest(root)
    doomed = [i for i in done[:max(0, len(done) - keep)] if i != head]
    for i in doomed:
        shutil.rmtree(final_path(root, i), ignore_errors=True)
    return doomed


def read_manifest(directory: str) -> dict:
    try:
        with open(os.path.join(directory, MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise CorruptCheckpoint(f"{directory}: unreadable {MANIFEST} ({type(e).__name__})") from None
    if manifest.get("format") != FORMAT:
        raise CorruptCheckpoint(f"{directory}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def verify_file(directory: str, name: str, want: dict) -> None:
    """CorruptCheckpoint (one line) when the file is missing, of another size, or of another sha256."""
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        raise CorruptCheckpoint(f"{path}: missing")
    size = os.path.getsize(path)
    if size != want["bytes"]:
        raise CorruptCheckpoint(f"{path}: {size} bytes, the manifest says {want['bytes']} (truncated?)")
    if sha256(path) != want["sha256"]:
        raise CorruptCheckpoint(f"{path}: sha256 differs from the manifest (corrupted)")


def read_state(directory: str) -> dict:
    with open(os.path.join(directory, STATE)) as f:
        return json.load(f)


@dataclass(frozen=True)
class Verdict:
    """What `hybrid checkpoint inspect` reports about one checkpoint directory."""

    path: str
    complete: bool
    error: str | None  # the first corrupt file, None when every checksum matches
    bytes: int


def verify_all(directory: str) -> Verdict:
    """Every file against the manifest (single process)."""
    total = sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory))
    if not os.path.isfile(os.path.join(directory, MANIFEST)):
        return Verdict(directory, False, "no manifest.json (an unfinished save)", total)
    try:
        manifest = read_manifest(directory)
        for name, want in sorted(manifest["files"].items()):
            verify_file(directory, name, want)
    except CorruptCheckpoint as e:
        return Verdict(directory, True, str(e), total)
    return Verdict(directory, True, None, total)
