"""Data flags of train.py (Megatron's names): `add_arguments` builds them, `check` validates them without
touching files, `build` opens the datasets and returns the DataSource -- all before any process group."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass

from hybrid.data.cache import usable
from hybrid.data.gpt import parse_split
from hybrid.data.source import DataSource, SplitSizes, open_dataset
from hybrid.data.text import BYTE_VOCAB, BatchSpec
from hybrid.data.tokenizer import TOKENIZER_TYPES, build_tokenizer

# token ids are checked against the model's vocabulary by reading the .bin files when they total at most this
SCAN_BYTES = 2 << 30
# Megatron's default is 100; at the end of a run both the valid and the test split are evaluated, so 100 would add
# 200 forward-only global batches -- more than a 200-iteration CPU run's whole training (docs/data.md). 10 is the
# default here; pass --eval-iters 100 for Megatron's.
EVAL_ITERS = 10


@dataclass(frozen=True)
class DataConfig:
    """Attributes:
        paths: dataset entries (text files or indexed prefixes); [None] = the built-in corpus.
        weights: blend weights, normalised to sum 1.
        split: train/valid/test document shares, normalised.
        eval_interval: iterations between validation runs (`--eval-interval`).
        eval_iters: global batches per validation run (`--eval-iters`; 0: no validation).
        cache_path: `--data-cache-path`: the sample-index cache's folder (None: the default, hybrid/data/cache.py).
    """

    paths: list[str | None]
    weights: list[float]
    split: tuple[float, float, float]
    eval_interval: int
    eval_iters: int
    cache_path: str | None = None


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data and validation")
    g.add_argument("--data-path", nargs="+", default=None, metavar="PATH",
                   help="a UTF-8 text file (byte tokens), an indexed-dataset prefix (PREFIX.bin/.idx from "
                        "scripts/preprocess_data.py), or a blend 'W1 P1 W2 P2 ...'; None: Python's pydoc topics")
    g.add_argument("--split", default="969, 30, 1", metavar="TEXT",
                   help="train, valid, test shares of each dataset's documents")
    g.add_argument("--tokenizer-type", choices=TOKENIZER_TYPES, default=None,
                   help="the tokenizer the data was preprocessed with: its vocabulary is checked against the model's")
    g.add_argument("--tokenizer-model", default=None, metavar="PATH",
                   help="HuggingFaceTokenizer: a tokenizer.json or a folder holding one")
    g.add_argument("--data-cache-path", default=None, metavar="DIR",
                   help="where the sample indices (document, shuffle, blend) are built once and kept as .npy files "
                        "for the other ranks and later runs (Megatron's flag); default: PREFIX/cache/"
                        "GPTDataset_indices beside an indexed dataset, for indices of 2^20 samples or more")
    g.add_argument("--eval-interval", type=int, default=1000, metavar="N",
                   help="validation loss every this many iterations (and at the end)")
    g.add_argument("--eval-iters", type=int, default=EVAL_ITERS, metavar="N",
                   help="global batches of the valid split per validation, and of the test split at the end "
                        "(0: none)")


def parse_blend(values: list[str] | None) -> tuple[list[str | None], list[float] | None]:
    """Megatron's --data-path: prefixes, or weight/prefix pairs '0.3 a 0.7 b' (all weighted or none)."""
    if not values:
        return [None], [1.0]
    for v in values:
        if not v.strip():
            raise ValueError("--data-path is empty; give a file, a prefix or a blend, or omit the flag")
    if len(values) % 2 == 0:
        weights = [_number(v) for v in values[::2]]
        if all(w is not None for w in weights):
            if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
                raise ValueError(f"--data-path weights {values[::2]} must be finite, >= 0, not all 0")
            return list(values[1::2]), [w / sum(weights) for w in weights]
        if any(w is not None for w in weights):
            raise ValueError(f"--data-path {' '.join(values)}: give weight/prefix pairs (0.3 A 0.7 B) or only "
                             f"prefixes")
    if len(values) > 1 and any(_number(v) is not None and not os.path.exists(v) for v in values):
        raise ValueError(f"--data-path {' '.join(values)}: a weight without its prefix; give pairs W1 P1 W2 P2")
    return list(values), None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def not_text_files(data_path: list[str] | None) -> list[str]:
    """The --data-path entries, blend weights skipped, that are no file here: indexed prefixes (PREFIX.bin/.idx, token
    ids of the tokenizer they were preprocessed with) or files gone. None of them: the run read bytes (text files or
    the built-in corpus)."""
    return [p for p in data_path or [] if _number(p) is None and not os.path.isfile(p)]


def check(args: argparse.Namespace) -> DataConfig:
    """The flags alone (no file opened): ValueError naming the flag."""
    paths, weights = parse_blend(args.data_path)
    split = parse_split(args.split)
    if args.eval_interval < 1:
        raise ValueError(f"--eval-interval must be >= 1, got {args.eval_interval} (Megatron-LM's 0 skips the "
                         f"periodic validation: here drop --eval-interval and give --eval-iters 0 for none at all, "
                         f"or an --eval-interval above --train-iters for the end-of-run one alone)")
    if args.eval_iters < 0:
        raise ValueError(f"--eval-iters must be >= 0 (0: no validation), got {args.eval_iters}")
    if args.eval_iters == 0 and "eval_interval" in getattr(args, "explicit", set()):
        raise ValueError(f"--eval-interval {args.eval_interval} sets how often validation runs, and --eval-iters 0 "
                         f"turns it off; give --eval-iters N > 0 or drop --eval-interval")
    if args.tokenizer_model and not args.tokenizer_type:
        raise ValueError("--tokenizer-model needs --tokenizer-type HuggingFaceTokenizer")
    if args.tokenizer_model and args.tokenizer_type == "ByteLevel":  # a token per byte: no model file is read
        raise ValueError("--tokenizer-model is read by --tokenizer-type HuggingFaceTokenizer; ByteLevel has no model "
                         "(a token per byte): drop --tokenizer-model or use --tokenizer-type HuggingFaceTokenizer")
    if split[0] == 0:
        raise ValueError(f"--split {args.split!r} gives training no data; give the train share first")
    _check_eval_split(args, split)
    cache_path = getattr(args, "data_cache_path", None)
    if cache_path is not None and (not cache_path.strip() or os.path.exists(cache_path)
                                   and not os.path.isdir(cache_path)):
        raise ValueError(f"--data-cache-path {cache_path!r} is not a folder; give a writable folder (made if missing) "
                         f"or omit it for the default beside the data")
    return DataConfig(paths=paths, weights=weights or [], split=split, eval_interval=args.eval_interval,
                      eval_iters=args.eval_iters, cache_path=cache_path)


def _check_eval_split(args: argparse.Namespace, split) -> None:
    """Periodic validation reads the valid split and the final evaluation the valid and test splits
    (hybrid/train/evaluate.py skips a split with no share): an evaluation flag given for splits --split leaves
    empty would do nothing."""
    given = getattr(args, "explicit", set())
    if split[1] == 0 and "eval_interval" in given:
        raise ValueError(f"--eval-interval {args.eval_interval} validates on the valid split, and --split "
                         f"{args.split!r} gives it no share; give one (e.g. --split 969,30,1) or drop --eval-interval")
    if split[1] == 0 and split[2] == 0 and "eval_iters" in given and args.eval_iters > 0:
        raise ValueError(f"--eval-iters {args.eval_iters} evaluates the valid and test splits, and --split "
                         f"{args.split!r} gives them no share; give one (e.g. --split 969,30,1) or drop --eval-iters")


def build(args: argparse.Namespace, data: DataConfig, batch: BatchSpec, vocab_size: int) -> DataSource:
    """Open every dataset (headers and sizes checked), check token ids fit the model's vocabulary, and build
    the train/valid/test sample indices for this run."""
    datasets = [open_dataset(p) for p in data.paths]
    weights = data.weights or [d.num_tokens / max(1, sum(x.num_tokens for x in datasets)) for d in datasets]
    if args.tokenizer_type:
        tok = build_tokenizer(args.tokenizer_type, args.tokenizer_model)
        if tok.vocab_size > vocab_size:
            raise ValueError(f"--tokenizer-model {args.tokenizer_model or args.tokenizer_type}: vocabulary "
                             f"{tok.vocab_size} exceeds the model's {vocab_size}; use a model with a larger "
                             f"vocab_size or the tokenizer the model was built for")
    check_token_ids(datasets, vocab_size)
    check_tokenizer_matches(datasets, args.tokenizer_type, args.tokenizer_model)
    if data.cache_path and not usable(data.cache_path):
        raise ValueError(f"--data-cache-path {data.cache_path}: cannot be made or written; give a writable folder or "
                         f"omit it for the default beside the data")
    sizes = SplitSizes.for_run(args.train_iters, batch.global_batch, data.eval_interval, data.eval_iters)
    return DataSource(datasets, weights, data.split, args.seq_length, args.seed, sizes, data.cache_path)


def check_tokenizer_matches(datasets: list, tokenizer_type: str | None, tokenizer_model: str | None) -> None:
    """The tokenizer a run names is the one its checkpoint records for `hybrid generate` and `hybrid convert`; it
    must be the data's. Text (and the default corpus) is read a byte per token whatever --tokenizer-type says, so
    HuggingFaceTokenizer there would record a tokenizer the model never saw; an indexed dataset holding an id >= 256
    was not written by ByteLevel (scanned when small, as check_token_ids). ValueError naming the fix."""
    for d in datasets:
        if tokenizer_type == "HuggingFaceTokenizer" and getattr(d, "byte_text", False):
            where = (f"--data-path {d.prefix} is text" if d.prefix != "the default corpus" else
                     "without --data-path the run reads the default corpus, text")
            raise ValueError(f"{where}, read a byte per token: --tokenizer-type HuggingFaceTokenizer would not "
                             f"tokenize it, only be recorded as the run's tokenizer (for generate and convert); "
                             f"tokenize it first (python scripts/preprocess_data.py --input FILE --output-prefix NAME "
                             f"--tokenizer-type HuggingFaceTokenizer --tokenizer-model {tokenizer_model}, then "
                             f"--data-path NAME_text_document), or drop the tokenizer flags")
        if tokenizer_type == "ByteLevel" and not getattr(d, "byte_text", False) \
                and d.num_tokens * d.dtype.itemsize <= SCAN_BYTES and (top := d.max_token()) >= BYTE_VOCAB:
            raise ValueError(f"--data-path {d.prefix}: token id {top} is beyond --tokenizer-type ByteLevel's "
                             f"{BYTE_VOCAB} byte tokens, so another tokenizer wrote it; give that one "
                             f"(--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR), the one the run "
                             f"records for generate and convert")


def check_token_ids(datasets: list, vocab_size: int) -> None:
    """Every token id < the model's vocabulary: byte text needs 256; indexed data is scanned when small enough
    (SCAN_BYTES), else its dtype bounds it."""
    for d in datasets:
        if getattr(d, "byte_text", False):
            top = BYTE_VOCAB - 1
        elif d.num_tokens * d.dtype.itemsize <= SCAN_BYTES:
            low, top = d.token_range()
            if low < 0:  # a signed dtype's negative id: an embedding lookup would fail mid-run (or read a wrong row)
                raise ValueError(f"--data-path {d.prefix}: token id {low} is negative; token ids are 0 .. "
                                 f"vocabulary - 1: preprocess again with scripts/preprocess_data.py")
        else:
            continue
        if top >= vocab_size:
            what = "byte tokens" if top == BYTE_VOCAB - 1 else f"token id {top}"
            raise ValueError(f"--data-path {d.prefix}: {what} need a vocabulary of {top + 1}, more than the "
                             f"model's {vocab_size}; preprocess with the model's tokenizer or use a larger model")
