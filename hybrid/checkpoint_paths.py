"""What a checkpoint directory looks like on disk -- ours (iter_NNNNNNN/, `latest`), Megatron-LM's and DeepSpeed's
of the same shape -- and the guard every writer shares: no output among checkpoints. Standard library only, beside
the checkpoint package rather than in it: the data tools (hybrid/data) refuse an output there without importing
hybrid.checkpoint, which imports hybrid.data (checkpoint/inspect reads its BatchSpec); hybrid.checkpoint.store
re-exports every name."""
from __future__ import annotations

import os
import re

LATEST = "latest"
_ITER = re.compile(r"^iter_(\d{7,})$")
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"  # Megatron-LM's `latest`


def enclosing_checkpoint(path: str) -> str | None:
    """The checkpoint directory `path` is, or lies inside (real paths; `path` need not exist): the nearest folder at
    or above it holding a `latest` file or an iter_NNNNNNN folder -- ours, or Megatron-LM's and DeepSpeed's of the
    same shape (foreign_checkpoint) -- else None."""
    probe = os.path.realpath(path)
    while True:
        if os.path.isdir(probe):
            names = os.listdir(probe)
            if os.path.isfile(os.path.join(probe, LATEST)) or any(_ITER.match(n) for n in names) or \
                    foreign_checkpoint(probe):
                return probe
        if probe == os.path.dirname(probe):
            return None
        probe = os.path.dirname(probe)


def foreign_checkpoint(root: str) -> str | None:
    """Another tool's checkpoint in `root`, by the files that tool writes: "a Megatron-LM checkpoint (...)" or "a
    DeepSpeed checkpoint (...)"; None when there is none. Such a folder is not a hybrid store: its iter_* (Megatron)
    or `latest` (DeepSpeed) would pass for ours, to be loaded as unfinished saves or replaced by a save."""
    if not os.path.isdir(root):
        return None
    if os.path.isfile(os.path.join(root, MEGATRON_TRACKER)):
        return f"a Megatron-LM checkpoint ({MEGATRON_TRACKER})"
    if os.path.isfile(os.path.join(root, LATEST)) and any(n.startswith("global_step") for n in os.listdir(root)):
        return "a DeepSpeed checkpoint (latest + global_step*/)"
    return None


def check_outside_checkpoints(flag: str, shown: str, path: str, what: str) -> None:
    """`path` (an output file or folder) is not inside a checkpoint directory (a --save folder, DeepSpeed's,
    Megatron-LM's): among its iter_*/ a save replaces an iteration and --save-keep deletes it, taking the file along,
    and `hybrid convert` / `generate` read a tokenizer there as the model's. train.py's outputs and convert's DST are
    refused there since round 17; round 19 found the data tools writing there. The checkpoint directory itself is
    train_tokenizer.py's check_fresh_output's to name."""
    root = enclosing_checkpoint(path)
    if root is None or os.path.realpath(path) == root:
        return
    beside = os.path.relpath(os.path.join(os.path.dirname(root), os.path.basename(os.path.normpath(shown))))
    raise ValueError(f"{flag} {shown!r} is inside the checkpoint directory {root} (iter_*/, latest): {what} would be "
                     f"written among its checkpoints; give a path beside it, e.g. {flag} {beside}")
