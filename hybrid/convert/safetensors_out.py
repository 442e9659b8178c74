"""A streaming, sharded safetensors writer: each tensor is written as soon as it is produced, so exporting
holds one tensor at a time (safetensors' own save_file, and DCP's HuggingFaceStorageWriter, take the whole
state dict at once).

The safetensors format (https://github.com/huggingface/safetensors#format): 8 bytes little-endian header
length N, N bytes of JSON {key: {dtype, shape, data_offsets: [begin, end)}, "__metadata__": {...}} padded with
spaces to a multiple of 8, then the tensors' bytes back to back in data_offsets order. Every shape and
dtype is known before the first byte (from the checkpoint's metadata), so each file's header is written
first and the data streamed after it. Shards follow transformers' names: model.safetensors when one file
holds everything, else model-0000i-of-0000n.safetensors and model.safetensors.index.json.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from collections.abc import Iterable, Iterator

import torch

from hybrid.convert.common import Progress, progress_step, size_text

DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
INDEX = "model.safetensors.index.json"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """'5GB' / '500MB' / '2GiB' / '1000000' -> bytes (transformers' max_shard_size spelling)."""
    m = _SIZE.match(text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"--max-shard-size {text!r}: give a size such as 5GB, 500MB or a number of bytes")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").upper()])


def nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def plan_shards(entries: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype, max_bytes: int) -> list[list[str]]:
    """Keys in order, cut into files of at most `max_bytes` (a larger single tensor gets a file of its own, as
    in transformers)."""
    shards: list[list[str]] = [[]]
    size = 0
    for key, shape in entries:
        n = nbytes(shape, dtype)
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += n
    return shards


def _header(keys: list[str], shapes: dict[str, tuple[int, ...]], dtype: torch.dtype) -> bytes:
    entries, offset = {}, 0
    for k in keys:
        n = nbytes(shapes[k], dtype)
        entries[k] = {"dtype": DTYPES[dtype], "shape": list(shapes[k]), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps({"__metadata__": {"format": "pt"}, **entries}, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def file_names(n: int) -> list[str]:
    return ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def write_sharded(directory: str, shapes: dict[str, tuple[int, ...]], tensors: Iterable[tuple[str, torch.Tensor]],
                  dtype: torch.dtype, max_bytes: int, progress: Progress = Progress()) -> list[str]:
    """Write `tensors` (key, tensor), arriving in `shapes`' order, cast to `dtype`; returns the files written.
    `progress`: a line every progress_step(total) tensors and at the end of each file (which tensor of how many,
    which file of how many, the bytes written of the total)."""
    shards = plan_shards(list(shapes.items()), dtype, max_bytes)
    names = file_names(len(shards))
    stream: Iterator[tuple[str, torch.Tensor]] = iter(tensors)
    total, total_bytes = len(shapes), sum(nbytes(s, dtype) for s in shapes.values())
    step, done, written = progress_step(total), 0, 0
    for j, (keys, name) in enumerate(zip(shards, names), 1):
        with open(os.path.join(directory, name), "wb") as f:
            f.write(_header(keys, shapes, dtype))
            for i, want in enumerate(keys, 1):
                key, t = next(stream)
                if key != want or tuple(t.shape) != shapes[key]:
                    raise RuntimeError(f"safetensors writer: got {key} {list(t.shape)}, expected {want} "
                                       f"{list(shapes[want])}")
                # the tensor's own bytes through the buffer protocol: no further copy (to() and contiguous() copy
                # only when the dtype or the layout changes)
                f.write(memoryview(t.detach().to("cpu", dtype).contiguous().reshape(-1).view(torch.uint8).numpy()))
                del t
                done, written = done + 1, written + nbytes(shapes[key], dtype)
                if done % step == 0 or i == len(keys):
                    progress(f"tensor {done}/{total} ({key}) -> {name} (file {j}/{len(names)}), "
                             f"{size_text(written)} of {size_text(total_bytes)}")
            f.flush()
            os.fsync(f.fileno())
    if len(shards) > 1:
        index = {"metadata": {"total_size": total_bytes},
                 "weight_map": {k: name for keys, name in zip(shards, names) for k in keys}}
        with open(os.path.join(directory, INDEX), "w") as f:
            json.dump(index, f, indent=2, sort_keys=True)
    return names
