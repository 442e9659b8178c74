"""Megatron's indexed dataset (`MMIDIDX`): token ids in `PREFIX.bin`, their layout in `PREFIX.idx`.

Byte for byte the format megatron-core 0.16 writes and reads (megatron/core/datasets/indexed_dataset.py,
`IndexedDatasetBuilder` / `IndexedDataset`), so data preprocessed by either tool trains in the other:

    .bin  the token ids of every sequence, back to back, little-endian, in the index's dtype
    .idx  offset  size            field
          0       9               magic b"MMIDIDX\\x00\\x00"
          9       8  <Q           version, 1
          17      1  <B           dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
                                  7 float32, 8 uint16
          18      8  <Q           N, the number of sequences
          26      8  <Q           D, the number of document-index entries (documents + 1)
          34      4 N  int32      length of each sequence, in tokens
          34+4N   8 N  int64      byte offset of each sequence in .bin
          34+12N  8 D  int64      document index: sequence ids where documents start, 0 first, N last
          (34+12N+8D  N  int8     per-sequence modes, multimodal datasets only)

Without Megatron's --split-sentences every document is one sequence, and the GPT dataset (gpt.py) treats
sequences as its documents, as megatron-core's GPTDataset does. Both files are memory-mapped: a 10 GB corpus
costs page cache, not resident memory.
"""

from __future__ import annotations

import os
import struct
from typing import Iterable

import numpy as np

from hybrid.cliutil import new_temporary, plural
from hybrid.fault_hook import crash_point

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_BYTES = 34  # magic 9 + version 8 + dtype 1 + N 8 + D 8
DTYPES: dict[int, type] = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
                           7: np.float32, 8: np.uint16}
CODES = {np.dtype(t): c for c, t in DTYPES.items()}


def optimal_dtype(vocab_size: int) -> type:
    """megatron-core's `DType.optimal_dtype`: uint16 below 65500 token ids, else int32."""
    return np.uint16 if vocab_size < 65500 else np.int32


def bin_path(prefix: str) -> str:
    return prefix + ".bin"


def idx_path(prefix: str) -> str:
    return prefix + ".idx"


class IndexedDatasetWriter:
    """Streams documents to `PREFIX.bin`; `finalize()` writes `PREFIX.idx`. Both are written under temporary
    names and renamed at the end, so an interrupted run leaves no dataset that looks complete.

    `add_document(tokens)` is megatron-core's `add_document(tokens, [len(tokens)])`: one sequence per document.
    """

    def __init__(self, prefix: str, dtype: type = np.int32):
        if np.dtype(dtype) not in CODES:
            raise ValueError(f"indexed dataset dtype {dtype} not in {sorted(t.__name__ for t in DTYPES.values())}")
        self.prefix, self.dtype = prefix, np.dtype(dtype)
        # unique new files (mkstemp: O_EXCL, never through a link): a fixed PREFIX.bin.tmp was written through a
        # link planted there, and shared by two runs on one prefix (each then abort()ed the other's)
        self._tmp_bin, self._tmp_idx = _temporary(bin_path(prefix)), _temporary(idx_path(prefix))
        self._bin = open(self._tmp_bin, "wb")
        self.sequence_lengths: list[int] = []
        self.document_indices: list[int] = [0]

    def add_document(self, tokens: Iterable[int] | np.ndarray) -> None:
        arr = np.asarray(tokens, dtype=self.dtype)
        self._bin.write(arr.tobytes(order="C"))
        self.sequence_lengths.append(int(arr.size))
        self.document_indices.append(len(self.sequence_lengths))

    def finalize(self) -> None:
        self._bin.close()
        write_index(self._tmp_idx, self.dtype, self.sequence_lengths, self.document_indices)
        crash_point("dataset_written")  # test-only: both files whole under temporary names
        self._publish()

    def _publish(self) -> None:
        """Rename the pair into place, whole-or-nothing as a reader sees it. Two renames cannot be one (and the
        format, Megatron's, has no field for a token the pair could share), so the order does it: an older
        PREFIX.idx is removed first, then .bin and .idx are renamed. A kill at any point leaves the old pair, or
        a PREFIX.bin without PREFIX.idx -- which the reader names as missing (IndexedDataset) and preprocess as an
        interrupted write -- or the new pair; never a new .bin beside the old .idx (round 17's order: a dataset
        neither run wrote, read without a word when the sizes agreed)."""
        if os.path.lexists(idx_path(self.prefix)):
            os.remove(idx_path(self.prefix))
        os.replace(self._tmp_bin, bin_path(self.prefix))
        crash_point("dataset_bin_renamed")  # test-only
        os.replace(self._tmp_idx, idx_path(self.prefix))

    def abort(self) -> None:
        """Remove this writer's own temporaries (nothing else)."""
        self._bin.close()
        for p in (self._tmp_bin, self._tmp_idx):
            if os.path.lexists(p):
                os.remove(p)


def _temporary(path: str) -> str:
    """A new empty file beside `path` (cliutil.new_temporary: `.NAME.XXXXXXXX.tmp`, never through a link)."""
    fd, tmp = new_temporary(path)
    os.close(fd)
    return tmp


def write_index(path: str, dtype: np.dtype, lengths: list[int], document_indices: list[int]) -> None:
    """The .idx file (megatron-core's `_IndexWriter.write`, no modes)."""
    lengths_arr = np.asarray(lengths, dtype=np.int32)
    # byte offset of sequence i = itemsize * (tokens before it); int64 as megatron-core's pointers
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths_arr[:-1].astype(np.int64) * np.dtype(dtype).itemsize, out=pointers[1:])
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", VERSION))
        f.write(struct.pack("<B", CODES[np.dtype(dtype)]))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(document_indices)))
        f.write(lengths_arr.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(np.asarray(document_indices, dtype=np.int64).tobytes(order="C"))


class _Sequences:
    """What both document sources count from their `sequence_lengths` (int32, one per sequence)."""

    sequence_lengths: np.ndarray

    def __len__(self) -> int:
        """Sequences (= documents without --split-sentences)."""
        return len(self.sequence_lengths)

    @property
    def num_tokens(self) -> int:
        return int(self.sequence_lengths.sum(dtype=np.int64))


class IndexedDataset(_Sequences):
    """A read-only, memory-mapped MMIDIDX dataset. Every check the format allows without reading the token ids
    runs at open: ValueError naming the file and what is wrong (a missing or non-regular file, magic, version,
    dtype, an index whose size or offsets disagree with itself, a .bin whose size disagrees with the index)."""

    def __init__(self, prefix: str, flag: str = "--data-path"):
        self.prefix = prefix
        ipath, bpath = idx_path(prefix), bin_path(prefix)
        for path, other in ((ipath, bpath), (bpath, ipath)):
            if os.path.exists(path) and not os.path.isfile(path):  # refused before any open: a FIFO's would block
                raise ValueError(f"{flag} {prefix}: {path} is not a regular file (a FIFO, a device or a directory); "
                                 f"give the .bin/.idx pair scripts/preprocess_data.py writes")
            if not os.path.isfile(path):
                raise ValueError(f"{flag} {prefix}: {path} is missing (found {other if os.path.isfile(other) else 'neither file'}); "
                                 f"run scripts/preprocess_data.py to write both")
        self._read_index(ipath, flag)
        itemsize = self.dtype.itemsize
        total = int(self.sequence_lengths.sum(dtype=np.int64)) * itemsize
        size = os.path.getsize(bpath)
        if size != total:
            raise ValueError(f"{flag} {prefix}: {bpath} has {size} bytes but the index describes {total} "
                             f"({self.num_tokens} tokens of {self.dtype.name}); the .bin is truncated or not this "
                             f"index's -- preprocess again")
        self._bin = np.memmap(bpath, dtype=self.dtype, mode="r") if size else np.zeros(0, dtype=self.dtype)

    def _read_index(self, path: str, flag: str) -> None:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
        if len(head) < HEADER_BYTES or head[:9] != MAGIC:
            raise ValueError(f"{flag} {path}: not a Megatron indexed dataset index (magic {head[:9]!r}, expected "
                             f"{MAGIC!r})")
        version, code, n, d = struct.unpack("<QBQQ", head[9:])
        if version != VERSION:
            raise ValueError(f"{flag} {path}: index version {version}, only {VERSION} is known")
        if code not in DTYPES:
            raise ValueError(f"{flag} {path}: unknown dtype code {code}")
        if np.dtype(DTYPES[code]).kind == "f":  # the format allows them; token ids cast from 2.5 or NaN would not be
            raise ValueError(f"{flag} {path}: dtype code {code} ({np.dtype(DTYPES[code]).name}): token ids are "
                             f"integers; preprocess again (scripts/preprocess_data.py writes uint16 or int32)")
        plain, modes = HEADER_BYTES + 12 * n + 8 * d, HEADER_BYTES + 13 * n + 8 * d
        if size not in (plain, modes):
            raise ValueError(f"{flag} {path}: {size} bytes, but {n} sequences and {d} document entries need "
                             f"{plain}; the index is truncated or corrupt")
        self.dtype = np.dtype(DTYPES[code])
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        self.sequence_lengths = np.frombuffer(mm, dtype=np.int32, count=n, offset=HEADER_BYTES)
        self.sequence_pointers = np.frombuffer(mm, dtype=np.int64, count=n, offset=HEADER_BYTES + 4 * n)
        self.document_indices = np.frombuffer(mm, dtype=np.int64, count=d, offset=HEADER_BYTES + 12 * n)
        # the first sequence at byte 0 (megatron-core's writer; the differences alone left the first pointer free,
        # and get() then sliced past the .bin's end -- a short sample -- or, negative, wrapped to its tail)
        if n and self.sequence_pointers[0] != 0:
            raise ValueError(f"{flag} {path}: the first sequence starts at byte {int(self.sequence_pointers[0])} of "
                             f"the .bin, not 0; the index is corrupt -- preprocess again")
        if n and (self.sequence_lengths.min() < 0
                  or np.any(self.sequence_pointers[1:] - self.sequence_pointers[:-1]
                                                           != self.sequence_lengths[:-1].astype(np.int64)
                                                           * self.dtype.itemsize)):
            raise ValueError(f"{flag} {path}: sequence offsets disagree with the lengths; the index is corrupt")
        if d == 0 or self.document_indices[0] != 0 or self.document_indices[-1] != n or \
                np.any(np.diff(self.document_indices) < 0):
            raise ValueError(f"{flag} {path}: the document index must rise from 0 to the {plural(n, 'sequence')}")

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens [offset, offset + length) of sequence i, a view of the memory map."""
        start = int(self.sequence_pointers[i]) // self.dtype.itemsize + offset
        n = int(self.sequence_lengths[i]) - offset if length is None else length
        return self._bin[start:start + n]

    def max_token(self, chunk: int = 1 << 26) -> int:
        """The largest token id (reads the whole .bin once, in chunks; -1 when empty)."""
        return self.token_range(chunk)[1]

    def token_range(self, chunk: int = 1 << 26) -> tuple[int, int]:
        """(smallest, largest) token id (reads the whole .bin once, in chunks; (0, -1) when empty)."""
        low, best = 0, -1
        for s in range(0, self._bin.size, chunk):
            part = self._bin[s:s + chunk]
            low, best = min(low, int(part.min())), max(best, int(part.max()))
        return low, best


class InMemoryDocuments(_Sequences):
    """Documents held in memory with IndexedDataset's reading interface (the byte-level text corpus)."""

    byte_text = True  # any byte may appear: the model needs the whole 256-token byte vocabulary

    def __init__(self, tokens: np.ndarray, lengths: np.ndarray, name: str):
        self.prefix, self.dtype = name, tokens.dtype
        self._tokens = tokens
        self.sequence_lengths = lengths.astype(np.int32)
        starts = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        self._starts = starts

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        start = int(self._starts[i]) + offset
        n = int(self.sequence_lengths[i]) - offset if length is None else length
        return self._tokens[start:start + n]

    def max_token(self) -> int:
        return int(self._tokens.max()) if self._tokens.size else -1

    def token_range(self) -> tuple[int, int]:
        return (min(0, int(self._tokens.min())), self.max_token()) if self._tokens.size else (0, -1)
