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

import contextlib
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass

from hybrid.checkpoint_paths import (_ITER, LATEST, MEGATRON_TRACKER, enclosing_checkpoint,  # noqa: F401 (re-exported)
                                     foreign_checkpoint)
from hybrid.cliutil import is_finite, new_temporary

MANIFEST, STATE = "manifest.json", "state.json"
FORMAT = "hybrid-dcp/1"


class CorruptCheckpoint(ValueError):
    """A file of a checkpoint is missing, truncated or altered (its manifest says so)."""


def iter_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def iteration_of(directory: str) -> int | None:
    """N for a directory named iter_NNNNNNN (trailing separators ignored), else None."""
    m = _ITER.match(os.path.basename(os.path.normpath(directory)))
    return int(m.group(1)) if m else None


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


# what to do with a Megatron-LM checkpoint, which neither train.py --load nor hybrid convert reads
MEGATRON_EXPORT = "export it to a transformers folder with Megatron-LM's checkpoint converter"


def foreign_advice(root: str, what: str) -> str:
    """What to do with another tool's checkpoint `root` (`what`: foreign_checkpoint's answer), for every command
    that refuses one (train.py --load, hybrid checkpoint inspect)."""
    if "DeepSpeed" in what:
        return f"convert it first: hybrid convert {root} CKPT --model CONFIG, then --load CKPT (docs/convert.md)"
    return f"{MEGATRON_EXPORT}, then give that folder to --load"


def read_latest_name(root: str) -> str | None:
    """The iter_NNNNNNN name `latest` holds (complete or not); None when it holds none or is no regular file."""
    path = os.path.join(root, LATEST)
    if not os.path.isfile(path):  # a FIFO or a device (a link to /dev/zero) is not read
        return None
    try:
        with open(path, "rb") as f:
            m = _ITER.match(f.read(64).decode("ascii", "replace").strip())
    except OSError:
        return None
    return m.group(0) if m else None


def read_latest(root: str) -> int | None:
    """The iteration `latest` names, when it names a complete checkpoint."""
    name = read_latest_name(root)
    m = _ITER.match(name) if name else None
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


def write_durable(path: str, text: str, before_rename=None) -> None:
    """Write `path` as tmp + fsync + rename + fsync of its directory. The temporary is a new file of a unique name
    (mkstemp: O_CREAT | O_EXCL, which never follows a link): a fixed `path + ".tmp"` that someone made a link to a
    file outside the folder would have been written through -- that file overwritten -- and the link renamed onto
    `path`. A link at `path` itself is replaced, its target untouched."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = new_temporary(path)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename()  # test-only crash point (finalize's `latest`): the temporary whole, not yet renamed
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    fsync_path(directory)


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
    if os.path.islink(final) or os.path.isfile(final):  # a re-save of the same iteration (a resumed run), or a
        os.unlink(final)  # file of that name (--overwrite-save consented: checkpoint/args.py's _check_not_ours)
    elif os.path.exists(final):
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_path(root)
    write_durable(os.path.join(root, LATEST), iter_name(iteration) + "\n",
                  before_rename=lambda: crash_point("before_latest", iteration))
    return final


def clean_partial(root: str) -> list[str]:
    """Remove leftover .tmp directories (a save that died) and `latest`'s temporaries (write_durable's, killed
    before its rename); returns their names. A link is unlinked, never followed: rmtree refuses one (and
    ignore_errors hid that), so an iter_N.tmp linked to another folder stayed, and the save then failed on it."""
    gone = []
    if os.path.isdir(root):
        for name in sorted(os.listdir(root)):
            path = os.path.join(root, name)
            if name.startswith(f".{LATEST}.") and name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    os.unlink(path)
            elif name.endswith(".tmp") and iteration_of(name[:-4]) is not None:  # tmp_path's names only (round 22:
                # any iter_*.tmp went, a user's iter_notes.tmp/ folder with it)
                if os.path.islink(path) or not os.path.isdir(path):
                    os.unlink(path)
                else:
                    shutil.rmtree(path, ignore_errors=True)
                gone.append(name)
    return gone


def remove_iterations(root: str, iterations: list[int]) -> list[int]:
    """Delete these complete checkpoints (a directory that is a link is unlinked, its target kept)."""
    gone = []
    for i in iterations:
        path = final_path(root, i)
        if os.path.islink(path):
            os.unlink(path)
        elif os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            continue
        gone.append(i)
    return gone


def retain(root: str, keep: int) -> list[int]:
    """Delete all but the `keep` newest complete checkpoints; the one `latest` names is always kept."""
    done = complete_iterations(root)
    head = read_latest(root)
    doomed = [i for i in done[:max(0, len(done) - keep)] if i != head]
    for i in doomed:
        shutil.rmtree(final_path(root, i), ignore_errors=True)
    return doomed


MAX_JSON_BYTES = {MANIFEST: 64 << 20, STATE: 16 << 20}  # far above any real one: a bound on what is parsed
_HEX = re.compile(r"^[0-9a-f]{64}$")


def is_plain_name(name: str) -> bool:
    """A file name inside one folder: no separator, not `.` or `..`, no NUL (a manifest or metadata entry naming
    `../../x` or `/etc/passwd` would read outside the checkpoint)."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
            and "\0" not in name and os.path.basename(name) == name)


def _regular_file(directory: str, name: str) -> str:
    """directory/name, a regular file and not a link (a link could point outside the folder); CorruptCheckpoint
    naming it otherwise."""
    path = os.path.join(directory, name)
    if os.path.islink(path):
        raise CorruptCheckpoint(f"{path}: a symbolic link; a checkpoint's files are regular files inside its folder")
    if not os.path.isfile(path):
        raise CorruptCheckpoint(f"{path}: {'not a regular file' if os.path.exists(path) else 'missing'}")
    return path


def _read_json(directory: str, name: str):
    """A small JSON file of a checkpoint: a regular file (not a link, FIFO or device), bounded in size, valid
    UTF-8 JSON; CorruptCheckpoint naming it otherwise."""
    path = _regular_file(directory, name)
    if os.path.getsize(path) > MAX_JSON_BYTES[name]:
        raise CorruptCheckpoint(f"{path}: {os.path.getsize(path)} bytes, more than any {name} hybrid writes")
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CorruptCheckpoint(f"{path}: unreadable {name} ({type(e).__name__})") from None


def _count(value) -> bool:
    return type(value) is int and value >= 0


def read_manifest(directory: str) -> dict:
    """manifest.json, checked: {"format": FORMAT, "files": {name: {"bytes": n, "sha256": hex}}} with every name a
    plain file of the folder and DCP's .metadata and state.json among them; CorruptCheckpoint naming the key."""
    manifest = _read_json(directory, MANIFEST)
    where = os.path.join(directory, MANIFEST)
    if not isinstance(manifest, dict):
        raise CorruptCheckpoint(f"{where}: a JSON {type(manifest).__name__}, not an object")
    if manifest.get("format") != FORMAT:
        raise CorruptCheckpoint(f"{where}: format {manifest.get('format')!r:.80}, expected {FORMAT!r}")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise CorruptCheckpoint(f"{where}: \"files\" is {type(files).__name__}, not an object of file entries")
    for name, want in files.items():
        if not is_plain_name(name) or name == MANIFEST:
            raise CorruptCheckpoint(f"{where}: entry {name!r:.80} is not a file of the checkpoint folder (paths "
                                    f"are confined to it)")
        if not isinstance(want, dict) or not _count(want.get("bytes")) or \
                not (isinstance(want.get("sha256"), str) and _HEX.match(want["sha256"])):
            raise CorruptCheckpoint(f"{where}: entry {name!r} is {json.dumps(want)[:80]}, expected "
                                    f"{{\"bytes\": <integer>, \"sha256\": <64 hex digits>}}")
    for name in (".metadata", STATE):
        if name not in files:
            raise CorruptCheckpoint(f"{where}: lists no {name}")
    return manifest


def verify_file(directory: str, name: str, want: dict, checksum: bool = True) -> None:
    """CorruptCheckpoint (one line) when the file is missing, a link, of another size, or of another sha256.
    checksum=False: all but the sha256 (a stat per file, for the checks before any process group)."""
    if not is_plain_name(name):
        raise CorruptCheckpoint(f"{os.path.join(directory, MANIFEST)}: entry {name!r:.80} is not a file of the "
                                f"checkpoint folder")
    path = _regular_file(directory, name)
    size = os.path.getsize(path)
    if size != want["bytes"]:
        raise CorruptCheckpoint(f"{path}: {size} bytes, the manifest says {want['bytes']} (truncated?)")
    if checksum and sha256(path) != want["sha256"]:
        raise CorruptCheckpoint(f"{path}: sha256 differs from the manifest (corrupted)")


# state.json: key -> (check, what it must be); the keys the resume and `inspect` read
_LAYOUT = {"tp": 1, "pp": 1, "dp": 1, "zero": 0}


def read_state(directory: str) -> dict:
    """state.json, checked: the fields a resume reads have their types and ranges, and the iteration is the one
    the directory is named for; CorruptCheckpoint naming the field otherwise."""
    state = _read_json(directory, STATE)
    where = os.path.join(directory, STATE)

    def bad(key: str, value, want: str) -> CorruptCheckpoint:
        return CorruptCheckpoint(f"{where}: {key} is {json.dumps(value)[:80]}, expected {want}")
    if not isinstance(state, dict):
        raise CorruptCheckpoint(f"{where}: a JSON {type(state).__name__}, not an object")
    for key in ("iteration", "consumed_samples"):
        if not _count(state.get(key)):
            raise bad(key, state.get(key), "a non-negative integer")
    if "adam_step" in state and not _count(state["adam_step"]):
        raise bad("adam_step", state["adam_step"], "a non-negative integer")
    if not isinstance(state.get("model"), str) or not state["model"]:
        raise bad("model", state.get("model"), "the --model it was trained with (a string)")
    layout = state.get("layout")
    if not isinstance(layout, dict):
        raise bad("layout", layout, "an object")
    for key, low in _LAYOUT.items():
        if type(layout.get(key)) is not int or not low <= layout[key] <= (3 if key == "zero" else 1 << 20):
            raise bad(f"layout.{key}", layout.get(key), f"an integer >= {low}")
    for key in ("args", "model_identity", "scaler", "converted_from"):
        if key in state and not isinstance(state[key], dict):
            raise bad(key, state[key], "an object")
    _check_owner_values(state, bad)
    if state.get("contents", "full") not in ("full", "model"):
        raise bad("contents", state.get("contents"), '"full" or "model"')
    if state.get("contents") != "model":
        _check_scaler(state, bad)
    named = iteration_of(directory)
    if named is not None and named != state["iteration"]:
        raise bad("iteration", state["iteration"], f"{named} (the directory's name)")
    return state


def _check_owner_values(state: dict, bad) -> None:
    """The plain values the state owners put beside their tensors (hybrid/stateful.py), which their load_state_dict
    takes as they are: the NaN guard's counters (a string there was accepted, and failed only at the next skipped
    step) and DiLoCo's fragment in flight."""
    if "fault.nan_consecutive" in state and not _count(state["fault.nan_consecutive"]):
        raise bad("fault.nan_consecutive", state["fault.nan_consecutive"], "a non-negative integer")
    skipped = state.get("fault.nan_skipped", [])
    if not isinstance(skipped, list) or not all(_count(i) for i in skipped):
        raise bad("fault.nan_skipped", skipped, "a list of iterations (non-negative integers)")
    if "diloco.inflight" in state and (type(state["diloco.inflight"]) is not int or state["diloco.inflight"] < -1):
        raise bad("diloco.inflight", state["diloco.inflight"], "an integer >= -1 (-1: none in flight)")
    for key, fields in _COMPRESS_COUNTERS.items():
        _check_counters(state, key, fields, bad)


# the compression owners' counters (hybrid/compress/state.py, momentum.py): the step count and the layout it was
# saved at, which before_load reads to map the tensors (a string there was a TypeError deep in the load, after the
# process groups); PowerSGD's also its rank (the Q width)
_COMPRESS_COUNTERS = {"compress/powersgd": ("iter", "dp", "tp", "pp", "rank"),
                      "compress/momentum_powersgd": ("iter", "dp", "tp", "pp", "rank"),
                      "compress/onebit": ("iter", "dp", "tp", "pp")}


def _check_counters(state: dict, key: str, fields: tuple[str, ...], bad) -> None:
    if key not in state:
        return
    value = state[key]
    if not isinstance(value, dict) or set(value) != set(fields):
        raise bad(key, value, f"an object with exactly {', '.join(fields)}")
    for f in fields:
        low = 0 if f == "iter" else 1
        if type(value[f]) is not int or not low <= value[f] <= 1 << 40:
            raise bad(f"{key}.{f}", value[f], f"an integer >= {low}")


def _check_scaler(state: dict, bad) -> None:
    """A training run's state.json: the Adam step and the fp16 loss scaler (read when the optimizer is loaded)."""
    if "adam_step" not in state:
        raise bad("adam_step", None, "a non-negative integer")
    scaler = state.get("scaler")
    if not isinstance(scaler, dict):
        raise bad("scaler", scaler, "an object")
    scale = scaler.get("loss_scale")
    if not is_finite(scale) or scale <= 0:
        raise bad("scaler.loss_scale", scale, "a finite number > 0")
    for key in ("good_steps", "skipped_steps"):
        if not _count(scaler.get(key)):
            raise bad(f"scaler.{key}", scaler.get(key), "a non-negative integer")


@dataclass(frozen=True)
class Verdict:
    """What `hybrid checkpoint inspect` reports about one checkpoint directory."""

    path: str
    complete: bool
    error: str | None  # the first corrupt file, None when every checksum matches
    bytes: int


def verify_all(directory: str) -> Verdict:
    """The manifest, state.json and DCP's .metadata well-formed and confined (safe_read.check_checkpoint), then
    every file against the manifest (single process)."""
    total = sum(os.lstat(os.path.join(directory, n)).st_size for n in os.listdir(directory))
    if not os.path.lexists(os.path.join(directory, MANIFEST)):
        return Verdict(directory, False, "no manifest.json (an unfinished save)", total)
    from hybrid.checkpoint.safe_read import check_checkpoint
    try:
        check_checkpoint(directory)  # the small files well-formed, .metadata through the restricted unpickler
        manifest = read_manifest(directory)
        for name, want in sorted(manifest["files"].items()):
            verify_file(directory, name, want)
    except CorruptCheckpoint as e:
        return Verdict(directory, True, str(e), total)
    return Verdict(directory, True, None, total)
