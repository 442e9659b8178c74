"""Byte-level text and the random-window batches of the unit tests.

The default corpus ships with Python: `pydoc_data.topics` (~460 KB of English from Python's
reference manual), so a fresh machine trains with nothing downloaded. Tokens are bytes (vocabulary
256): no tokenizer files needed; a model whose vocabulary is larger simply never sees ids >= 256.

Batches are a pure function of (seed, iteration): the global batch of step i is the same whatever
the layout, and each data-parallel rank takes its own rows of it. That is what lets a parallel run
be compared step for step with a single-process run.
"""

from __future__ import annotations

import codecs
import os
from dataclasses import dataclass

import torch

from hybrid.cliutil import check_number, divisors, nearest_multiples, one_of, plural

BYTE_VOCAB = 256


def load_corpus(path: str | None = None) -> torch.Tensor:
    """The corpus as a 1-D tensor of byte ids; `path` None = Python's pydoc topics."""
    return torch.frombuffer(bytearray(read_text(path)), dtype=torch.uint8).long()


def read_text(path: str | None = None) -> bytes:
    """The bytes of a UTF-8 text file (ValueError naming --data-path if it is not one); None: Python's pydoc
    topics."""
    if path is None:
        import pydoc_data.topics
        text = "\n\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
        data = text.encode("utf-8")
    else:
        if not os.path.isfile(path):
            raise ValueError(f"--data-path {path!r} is not a file; give a UTF-8 text file or omit the flag")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ValueError(f"--data-path {path!r}: cannot read it ({e.strerror})") from None
        if not data:
            raise ValueError(f"--data-path {path!r} is empty; give a UTF-8 text file")
        try:  # the head is enough to tell text from a binary file given by mistake
            codecs.getincrementaldecoder("utf-8")().decode(data[:1 << 16], final=False)
        except UnicodeDecodeError as e:
            raise ValueError(f"--data-path {path!r}: not UTF-8 text (byte {e.start}); give a UTF-8 text file") from None
        _refuse_json_lines(path, data)
    return data


def _refuse_json_lines(path: str, data: bytes) -> None:
    """A JSON-lines corpus given as --data-path would be trained on as bytes, braces and keys included: it is
    preprocess_data.py's input, so say so. Told by the first non-blank line being a JSON object."""
    import json
    first = next((ln for ln in data[:1 << 16].splitlines() if ln.strip()), b"")
    try:
        obj = json.loads(first.decode("utf-8"))
    except (ValueError, RecursionError):  # prose, or a line cut at the 64 KiB head
        return
    if isinstance(obj, dict):
        prefix = os.path.splitext(os.path.basename(path))[0]
        raise ValueError(f"--data-path {path!r} is JSON lines (its first line is a JSON object), which would be "
                         f"trained on as raw text; tokenize it first: python scripts/preprocess_data.py --input "
                         f"{path} --output-prefix {prefix} --tokenizer-type ByteLevel, then --data-path "
                         f"{prefix}_text_document")


@dataclass(frozen=True)
class BatchSpec:
    """Shapes of one training step.

    Attributes:
        global_batch: sequences per step over all data-parallel ranks (`--global-batch-size`).
        micro_batch: sequences per forward/backward (`--micro-batch-size`).
        seq_length: tokens per sequence (`--seq-length`).
        dp: data-parallel size; accumulation steps = global / (micro * dp).
    """

    global_batch: int
    micro_batch: int
    seq_length: int
    dp: int

    def __post_init__(self) -> None:
        for flag, value in (("--global-batch-size", self.global_batch), ("--micro-batch-size", self.micro_batch),
                            ("--seq-length", self.seq_length), ("data-parallel size", self.dp)):
            check_number(flag, value, 1, integer=True)
        if self.global_batch % (self.micro_batch * self.dp) != 0:
            raise ValueError(
                f"--global-batch-size {self.global_batch} must be a multiple of --micro-batch-size "
                f"{self.micro_batch} x data-parallel size {self.dp} = {self.micro_batch * self.dp}; "
                f"{batch_fixes(self.global_batch, self.micro_batch, self.dp)}")

    @property
    def num_micro_batches(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)


def batch_fixes(global_batch: int, micro_batch: int, dp: int) -> str:
    """The nearest values that split: the multiples of m = micro x dp either side of the global batch G (the one
    below only when it is >= m), and, when dp divides G, the micro-batch sizes that divide G / dp (the same
    batch, more or fewer accumulation steps): the nearest divisor of G / dp either side of the micro-batch."""
    fix = f"give --global-batch-size {one_of(nearest_multiples(global_batch, micro_batch * dp))}"
    if global_batch % dp == 0:
        fits = divisors(global_batch // dp)
        near = [d for d in fits if d < micro_batch][-1:] + [d for d in fits if d > micro_batch][:1]
        fix += f", or --micro-batch-size {one_of(near)} (the same global batch)"
    return fix


def global_batch(corpus: torch.Tensor, spec: BatchSpec, seed: int, iteration: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels), each (global_batch, seq_length): random windows of the corpus; labels are
    the inputs shifted by one token."""
    if corpus.numel() <= spec.seq_length + 1:
        raise ValueError(f"--seq-length {spec.seq_length} is longer than the corpus "
                         f"({plural(corpus.numel(), 'token')})")
    gen = torch.Generator().manual_seed(seed * 1_000_003 + iteration)
    starts = torch.randint(0, corpus.numel() - spec.seq_length - 1, (spec.global_batch,), generator=gen)
    windows = torch.stack([corpus[s:s + spec.seq_length + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


def micro_batches(corpus: torch.Tensor, spec: BatchSpec, seed: int, iteration: int,
                  dp_rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This data-parallel rank's micro-batches of step `iteration`: rows
    [dp_rank * G/dp, (dp_rank + 1) * G/dp) of the global batch, cut into micro-batches."""
    inputs, labels = global_batch(corpus, spec, seed, iteration)
    per_rank = spec.global_batch // spec.dp
    rows = slice(dp_rank * per_rank, (dp_rank + 1) * per_rank)
    return list(zip(inputs[rows].split(spec.micro_batch), labels[rows].split(spec.micro_batch)))
