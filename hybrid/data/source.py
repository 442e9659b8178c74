"""What training reads: the train/valid/test samples of `--data-path` and the batches of a step.

A batch is a pure function of (seed, consumed samples): global batch k is blended samples
[consumed, consumed + G) of the train split, data-parallel rank r takes rows [r G/dp, (r + 1) G/dp) of it, cut
into micro-batches. Nothing depends on the layout or on how many steps ran before in this process, so a run
resumed from a checkpoint -- at any dp or micro-batch size -- sees exactly the samples an uninterrupted run sees.
A run resumed at another global batch reads on from the checkpoint's consumed samples (`train_samples`).
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, replace
from enum import IntEnum

import numpy as np
import torch

from hybrid.cliutil import plural
from hybrid.data import cache
from hybrid.data.gpt import Blend, GPTSamples, samples_per_dataset, split_ranges
from hybrid.data.indexed import IndexedDataset, InMemoryDocuments, bin_path, idx_path
from hybrid.data.text import BatchSpec, read_text


_WARNED: set[str] = set()  # default cache folders already named as not writable


class Split(IntEnum):
    TRAIN = 0
    VALID = 1
    TEST = 2


def text_documents(data: bytes, name: str) -> InMemoryDocuments:
    """A text as byte tokens, one document per paragraph (cut after each blank line, so the documents
    concatenated are the text again)."""
    cuts = [m.end() for m in re.finditer(rb"\n\n+", data)]
    bounds = [0] + [c for c in cuts if c < len(data)] + [len(data)]
    tokens = np.frombuffer(data, dtype=np.uint8)
    return InMemoryDocuments(tokens, np.diff(np.asarray(bounds, dtype=np.int64)), name)


def open_dataset(path: str | None) -> IndexedDataset | InMemoryDocuments:
    """A --data-path entry: a UTF-8 text file (byte tokens) or an indexed-dataset prefix (PREFIX.bin/.idx);
    None is Python's pydoc topics. ValueError naming --data-path otherwise."""
    if path is None:
        return text_documents(read_text(None), "the default corpus")
    sibling = {".bin": ".idx", ".idx": ".bin"}.get(path[-4:])
    if sibling and os.path.isfile(path[:-4] + sibling):
        raise ValueError(f"--data-path {path}: give the prefix without .bin/.idx ({path[:-4]})")
    if os.path.isfile(path):
        return text_documents(read_text(path), path)
    if os.path.exists(bin_path(path)) or os.path.exists(idx_path(path)):  # a FIFO too: IndexedDataset names it
        return IndexedDataset(path)
    if os.path.isdir(path):
        raise ValueError(f"--data-path {path!r} is a directory; give a UTF-8 text file or an indexed-dataset "
                         f"prefix (PREFIX.bin + PREFIX.idx)")
    if os.path.exists(path):  # a FIFO, socket or device, never opened (a FIFO's open blocks): was "no such file"
        raise ValueError(f"--data-path {path!r} is not a regular file (a FIFO, a socket or a device); give a UTF-8 "
                         f"text file or an indexed-dataset prefix (PREFIX.bin + PREFIX.idx)")
    raise ValueError(f"--data-path {path!r}: no such file, nor {bin_path(path)} / {idx_path(path)}; give a UTF-8 "
                     f"text file or a prefix written by scripts/preprocess_data.py")


def train_samples(train_iters: int, global_batch: int, start: int = 0, consumed: int = 0) -> int:
    """Samples the train split must hold: Megatron's train_iters x G, or, for a run resumed at iteration `start`
    with `consumed` samples read, the end of what it reads, consumed + (train_iters - start) G, when that is larger.
    It is larger exactly when the checkpoint read more than start x G (saved at a larger global batch): a split of
    train_iters x G would end before the run does, and Blend would wrap around to its first samples -- ones the
    saved run read (Megatron runs out of samples there instead). A split built larger keeps its order when its
    epoch plan is the same (gpt.py's epoch_plan), so the run then reads the saved order's next samples. A run with
    no step left (start >= train_iters) reads nothing: Megatron's size."""
    end = consumed + (train_iters - start) * global_batch if train_iters > start else 0
    return max(train_iters * global_batch, end)


def valid_samples(train_iters: int, global_batch: int, eval_interval: int, eval_iters: int, start: int = 0) -> int:
    """Samples the valid split must hold: Megatron's (train_iters // eval interval + 1) x eval iters x G, a block of
    eval iters x G per evaluation. The evaluation at the end of a run stopped at iteration N reads block
    ceil(N / interval) - 1 (train/evaluate.py), inside the split for every N <= train_iters (ceil(N / I) <= N // I
    + 1). A run resumed at iteration `start` > train_iters trains nothing and evaluates at N = start: sized for
    train_iters, Blend wrapped that block onto an earlier evaluation's samples -- so the split is sized for
    max(train_iters, start), the iteration the run ends at (Megatron's size whenever a step is left)."""
    return (max(train_iters, start) // eval_interval + 1) * eval_iters * global_batch


@dataclass(frozen=True)
class SplitSizes:
    """Samples each split must supply over the whole run (Megatron's train_val_test_num_samples):
    train = iterations x G (a resumed run's may be more: `train_samples`, DataSource.covering), valid =
    (iterations // eval interval + 1) x eval iters x G (a resumed run's may be more: `valid_samples`), test =
    eval iters x G."""

    train: int
    valid: int
    test: int

    @classmethod
    def for_run(cls, train_iters: int, global_batch: int, eval_interval: int, eval_iters: int) -> "SplitSizes":
        return cls(train_samples(train_iters, global_batch),
                   valid_samples(train_iters, global_batch, eval_interval, eval_iters), eval_iters * global_batch)


class DataSource:
    """Blended train/valid/test samples of one or more datasets, and the micro-batches of a step."""

    def __init__(self, datasets: list, weights: list[float], split: tuple[float, float, float], seq_length: int,
                 seed: int, sizes: SplitSizes, cache_path: str | None = None):
        self.datasets, self.weights, self.seq_length, self.seed = datasets, weights, seq_length, seed
        self.cache_path = cache_path  # --data-cache-path (checked writable by data.args.build); None: the default
        self.split, self.sizes = split, sizes
        self.splits: dict[Split, Blend | None] = {}
        for s, size in zip(Split, (sizes.train, sizes.valid, sizes.test)):
            self.splits[s] = self._build_split(s, split, size) if size > 0 else None

    def _build_split(self, s: Split, split: tuple[float, float, float], size: int) -> Blend | None:
        parts = []
        need = [size] if len(self.datasets) == 1 else samples_per_dataset(self.weights, size)
        for docs, n in zip(self.datasets, need):
            rng = split_ranges(split, len(docs))[s]
            if rng is None or rng[1] <= rng[0]:
                if s is Split.TRAIN:
                    raise ValueError(f"--data-path {docs.prefix}: --split gives its train split no document "
                                     f"({plural(len(docs), 'document')}); give more data or a larger train share")
                return None
            try:
                parts.append(GPTSamples(docs, np.arange(*rng), self.seq_length, n, self.seed, self._cache_dir(docs, n)))
            except ValueError as e:
                if s is Split.TRAIN:
                    raise ValueError(f"--data-path {e}; give more data or a shorter --seq-length") from None
                return None  # a valid/test split too small for one sample: no evaluation on it
        return Blend(parts, self.weights, size, self._cache_dir(self.datasets[0], size) if len(parts) > 1 else None)

    def _cache_dir(self, docs, samples: int) -> str | None:
        """Where an index of `samples` samples over `docs` is cached: --data-cache-path, else Megatron's default
        beside an indexed dataset (PREFIX/cache/GPTDataset_indices) for an index of CACHE_MIN_ENTRIES samples or
        more when it can be written; None (built in memory) otherwise, with one line the first time."""
        if self.cache_path:
            return self.cache_path
        if not isinstance(docs, IndexedDataset) or samples < cache.CACHE_MIN_ENTRIES:
            return None
        folder = cache.default_dir(docs.prefix)
        if cache.usable(folder):
            return folder
        if folder not in _WARNED:
            _WARNED.add(folder)
            print(f"data cache: {folder} cannot be made or written; the sample index is built in memory on every "
                  f"rank and every run (give --data-cache-path DIR to build it once)", flush=True)
        return None

    def covering(self, train: int, valid: int = 0) -> "DataSource":
        """This source with a train split of at least `train` samples and a valid split of at least `valid`
        (`train_samples`, `valid_samples` of a resumed run): itself when it holds that many, else a copy with the
        short splits built anew for those sizes (the others kept)."""
        grow = {s: n for s, n in ((Split.TRAIN, train), (Split.VALID, valid)) if n > self._size(s)}
        if not grow:
            return self
        out = copy.copy(self)
        out.sizes = replace(self.sizes, **{s.name.lower(): n for s, n in grow.items()})
        out.splits = {**self.splits, **{s: self._build_split(s, self.split, n) for s, n in grow.items()}}
        return out

    def _size(self, s: Split) -> int:
        return (self.sizes.train, self.sizes.valid, self.sizes.test)[s]

    def has(self, s: Split) -> bool:
        return self.splits[s] is not None

    def samples(self, s: Split, start: int, count: int) -> torch.Tensor:
        """(count, seq_length + 1) int64 tokens: samples [start, start + count) of split s."""
        blend = self.splits[s]
        return torch.from_numpy(np.stack([blend[i] for i in range(start, start + count)]))

    def batches(self, consumed_samples: int, spec: BatchSpec, dp_rank: int,
                s: Split = Split.TRAIN) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This dp rank's micro-batches of the global batch that starts at sample `consumed_samples`:
        (inputs, labels), each (micro_batch, seq_length); labels are the inputs shifted by one."""
        per_rank = spec.global_batch // spec.dp
        rows = self.samples(s, consumed_samples + dp_rank * per_rank, per_rank)
        return list(zip(rows[:, :-1].split(spec.micro_batch), rows[:, 1:].split(spec.micro_batch)))
