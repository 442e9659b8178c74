"""Megatron's GPT dataset: samples of seq_length + 1 tokens cut from documents packed end to end, in an order
fixed by the seed; the train/valid/test split by document; weighted blends of several datasets.

The same semantics as megatron-core 0.16's `GPTDataset` and `BlendedDataset` (gpt_dataset.py, helpers.cpp):

- split: weights "969,30,1" normalised to w; split s owns documents [round(c_s n), round(c_{s+1} n)) with c the
  cumulative sums (0, 0.969, 0.999, 1) -- disjoint, contiguous, by document.
- epochs: the fewest E with E * T >= num_samples * seq_length + 1 (T: the split's tokens).
- document index: the split's documents repeated E times, shuffled by numpy RandomState(seed); when the last
  epoch contributes fewer than 80% of an epoch's samples it is shuffled separately (Megatron's
  separate_final_epoch), so those few samples do not crowd out whole documents of the earlier epochs.
- sample j: tokens [j s, j s + s + 1) of the documents concatenated in that order (s = seq_length; samples share
  one boundary token: the last input's label is the next sample's first input). Megatron stores this as
  (document, offset) pairs (build_sample_idx); here a prefix sum over the document index and a binary search.
- shuffle index: a permutation of the samples (the final epoch's again separately), same RandomState.
- blend: sample i of the blend comes from the dataset whose count lags its weight most (argmax_d w_d max(i, 1)
  - n_d, ties to the lowest d): a deterministic interleaving whose counts stay within one sample of w_d i.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from hybrid.cliutil import plural
from hybrid.data import cache


class Documents(Protocol):
    """What a dataset offers: sequence lengths and slices (IndexedDataset, InMemoryDocuments)."""

    prefix: str
    sequence_lengths: np.ndarray

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray: ...


def parse_split(text: str) -> tuple[float, float, float]:
    """'969,30,1' -> normalised (0.969, 0.03, 0.001); ValueError naming --split otherwise. One or two numbers are
    padded with zeros as megatron-core's parse_and_normalize_split does ('98,2' is '98,2,0': no test split), so a
    Megatron-LM command line's --split means the same here. Quotes around it are dropped, as megatron-core's
    number-finding regex drops them: Megatron's examples/llama scripts pass "--split '99,1,0'" from a bash array
    expanded unquoted, so the quotes reach the program."""
    parts = [p.strip() for p in text.strip().strip("'\"").replace("/", ",").split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"--split {text!r}: give three numbers train,valid,test such as 969,30,1") from None
    values += [0.0] * (3 - len(values))
    if len(values) != 3 or any(not math.isfinite(v) or v < 0 for v in values) or sum(values) <= 0:
        raise ValueError(f"--split {text!r}: give at most three non-negative numbers train,valid,test with a "
                         f"positive sum, such as 969,30,1 (missing ones are 0)")
    total = sum(values)
    return tuple(v / total for v in values)  # type: ignore[return-value]


def split_ranges(weights: Sequence[float], num_docs: int) -> list[tuple[int, int] | None]:
    """Document ranges [beg, end) of train, valid, test (None where the weight is 0), as megatron-core's
    convert_split_vector_to_split_matrix + int(round(bookend * n))."""
    bookends = np.concatenate([[0.0], np.cumsum(weights)])
    out: list[tuple[int, int] | None] = []
    for s, w in enumerate(weights):
        if w == 0:
            out.append(None)
            continue
        out.append((int(round(bookends[s] * float(num_docs))), int(round(bookends[s + 1] * float(num_docs)))))
    return out


@dataclass
class GPTSamples:
    """The samples of one split of one dataset. `len(self)` >= the num_samples asked for; sample i is the
    (seq_length + 1) int64 tokens of shuffled sample shuffle_index[i]."""

    docs: Documents
    doc_ids: np.ndarray  # the split's sequence ids (contiguous)
    seq_length: int
    num_samples: int
    seed: int
    cache: str | None = None  # the folder of the index cache (hybrid/data/cache.py); None: built here, not kept

    def __post_init__(self) -> None:
        lengths = self.docs.sequence_lengths[self.doc_ids].astype(np.int64)
        tokens_per_epoch = int(lengths.sum())
        if tokens_per_epoch < self.seq_length + 1:
            raise ValueError(f"{self.docs.prefix}: {plural(tokens_per_epoch, 'token')} in this split, fewer than one "
                             f"sample of --seq-length {self.seq_length} + 1")
        self.epochs, separate = epoch_plan(tokens_per_epoch, self.seq_length, self.num_samples)
        # the arrays are a function of the split's lengths, seq_length, num_samples and seed alone: the cache key
        key = cache.key_of(kind="gpt", lengths=self.docs.sequence_lengths[self.doc_ids], first=int(self.doc_ids[0]),
                           seq_length=self.seq_length, num_samples=self.num_samples, seed=self.seed) \
            if self.cache else ""
        what = {"dataset": self.docs.prefix, "documents": [int(self.doc_ids[0]), int(self.doc_ids[-1]) + 1],
                "seq_length": self.seq_length, "num_samples": self.num_samples, "seed": self.seed}
        arrays = cache.cached(self.cache, key, what, lambda: self._build(tokens_per_epoch, separate),
                              f"the sample index of {self.num_samples:,} samples of {self.docs.prefix}",
                              self.num_samples)
        self.document_index, self.shuffle_index = arrays["document_index"], arrays["shuffle_index"]
        # ends[k]: tokens in the first k + 1 documents of the document index
        self._ends = np.cumsum(self.docs.sequence_lengths[self.document_index].astype(np.int64))

    def _build(self, tokens_per_epoch: int, separate: bool) -> dict[str, np.ndarray]:
        """The document index and the shuffle index, drawn from one RandomState(seed) in Megatron's order."""
        s, epochs = self.seq_length, self.epochs
        before = ((epochs - 1) * tokens_per_epoch - 1) // s
        rng = np.random.RandomState(self.seed)
        document_index = _document_index(self.doc_ids, epochs, rng, separate)
        total = (epochs * tokens_per_epoch - 1) // s  # whole samples in all epochs (drop the last partial)
        if separate:
            shuffle_index = np.concatenate([_shuffled(0, before, rng), _shuffled(before, total, rng)])
        else:
            shuffle_index = _shuffled(0, total, rng)
        return {"document_index": document_index, "shuffle_index": shuffle_index}

    def __len__(self) -> int:
        return len(self.shuffle_index)

    def __getitem__(self, i: int) -> np.ndarray:
        start = int(self.shuffle_index[i]) * self.seq_length
        need = self.seq_length + 1
        k = int(np.searchsorted(self._ends, start, side="right"))  # the document holding token `start`
        offset = start - (int(self._ends[k - 1]) if k else 0)
        parts = []
        while need:
            doc = int(self.document_index[k])
            piece = self.docs.get(doc, offset, min(need, int(self.docs.sequence_lengths[doc]) - offset))
            parts.append(piece)
            need -= len(piece)
            k, offset = k + 1, 0
        return np.concatenate(parts).astype(np.int64)


def epoch_plan(tokens_per_epoch: int, seq_length: int, num_samples: int) -> tuple[int, bool]:
    """(epochs, separate) of a split asked for `num_samples` samples: the epochs its shuffle spans, and whether
    the last one is shuffled alone (Megatron's threshold: a final epoch under 80% of an epoch's samples). The
    shuffle is a function of these and the seed: a run asking for more samples (a larger --train-iters) draws
    the same order exactly when both stay the same."""
    epochs = max(1, math.ceil((num_samples * seq_length + 1) / tokens_per_epoch))
    if epochs == 1:
        return 1, False
    before = ((epochs - 1) * tokens_per_epoch - 1) // seq_length
    per_epoch = (tokens_per_epoch - 1) // seq_length
    return epochs, num_samples - before < int(0.80 * per_epoch)


def _document_index(doc_ids: np.ndarray, epochs: int, rng: np.random.RandomState, separate: bool) -> np.ndarray:
    """megatron-core's _build_document_index: the ids repeated per epoch, shuffled (int32, as Megatron)."""
    if not separate or epochs == 1:
        index = np.tile(doc_ids, epochs).astype(np.int32)
        rng.shuffle(index)
        return index
    return np.concatenate([_document_index(doc_ids, epochs - 1, rng, False), _document_index(doc_ids, 1, rng, False)])


def _shuffled(start: int, stop: int, rng: np.random.RandomState) -> np.ndarray:
    dtype = np.uint32 if stop < np.iinfo(np.uint32).max - 1 else np.int64
    index = np.arange(start, stop, dtype=dtype)
    rng.shuffle(index)
    return index


def blend_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset of sample i, its sample number within that dataset), megatron-core's build_blending_indices:
    greedy on the error w_d max(i, 1) - n_d, so |n_d(i) - w_d i| <= 1 for every prefix i. Each pick depends on all
    the picks before it (no closed form reproduces its float ties), so it stays a loop -- plain Python with the
    inner max unrolled into locals (~0.3 us a sample for two datasets, 4x the max(key=lambda) form; Megatron's is
    C++); the cache (hybrid/data/cache.py) runs it once per run's blend."""
    w = [float(x) for x in weights]
    counts = [0] * len(w)
    which = bytearray(size) if len(w) <= 256 else [0] * size
    rest, w0 = range(1, len(w)), w[0]
    for i in range(size):
        t = i if i > 1 else 1  # max(i, 1)
        best, d = w0 * t - counts[0], 0
        for k in rest:
            e = w[k] * t - counts[k]
            if e > best:  # first maximum on ties, as C++'s strict >
                best, d = e, k
        which[i] = d
        counts[d] += 1
    picks = (np.frombuffer(which, dtype=np.uint8) if isinstance(which, bytearray) else np.asarray(which))
    picks = picks.astype(np.int16)
    within = np.empty(size, dtype=np.int64)
    for d in range(len(w)):  # sample number within dataset d: its picks counted in order
        at = np.flatnonzero(picks == d)
        within[at] = np.arange(len(at))
    return picks, within


class Blend:
    """Several GPTSamples interleaved by weight (one dataset: it alone, as Megatron)."""

    def __init__(self, parts: Sequence[GPTSamples], weights: Sequence[float], size: int, cache_dir: str | None = None):
        self.parts = list(parts)
        self.size = size
        if len(self.parts) == 1:
            self.which = np.zeros(size, dtype=np.int16)
            self.within = np.arange(size, dtype=np.int64)
            return
        w = [float(x) for x in weights]
        key = cache.key_of(kind="blend", weights=w, size=size) if cache_dir else ""
        arrays = cache.cached(cache_dir, key, {"weights": w, "size": size},
                              lambda: dict(zip(("which", "within"), blend_indices(w, size))),
                              f"the blend index of {size:,} samples of {len(w)} datasets", size)
        self.which, self.within = arrays["which"], arrays["within"]

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> np.ndarray:
        # past the planned samples: wrap around. Training never gets here (source.train_samples builds a resumed
        # run's split to the end of its reads); an evaluation numbered past the run's planned ones can
        i = i % self.size
        return self.parts[int(self.which[i])][int(self.within[i])]


def samples_per_dataset(weights: Sequence[float], size: int) -> list[int]:
    """Samples each dataset must supply for a blend of `size` (megatron-core's
    _get_size_per_split_per_dataset with its 0.5% surplus)."""
    return [int(math.ceil(math.ceil(size * w) * 1.005)) for w in weights]
