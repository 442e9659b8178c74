"""Tokenize a corpus into Megatron's indexed format (scripts/preprocess_data.py; Megatron-LM's
tools/preprocess_data.py flags).

    python scripts/preprocess_data.py --input corpus.jsonl --json-keys text --output-prefix data/corpus \\
        --tokenizer-type HuggingFaceTokenizer --tokenizer-model tok/ --append-eod --workers 4

writes data/corpus_text_document.bin/.idx (one per --json-keys key). `--input` is JSON lines (one object per
line) or, for a .txt file, plain text whose paragraphs (blank-line separated) are the documents. Documents are
tokenized by --workers processes in input order; the files are written under temporary names and renamed at
the end, so a failed run leaves nothing that looks complete.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from typing import Iterator

from hybrid.checkpoint_paths import check_outside_checkpoints
from hybrid.cliutil import (HelpFormatter, OneLineParser, check_output_file, check_outside_packages, fail, int_in,
                            plural, positive_int)
from hybrid.data.indexed import IndexedDatasetWriter, bin_path, idx_path, optimal_dtype
from hybrid.data.tokenizer import TOKENIZER_TYPES, Tokenizer, build_tokenizer, tokenizer_hints

PROG = "preprocess_data.py"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter,
                      hints=tokenizer_hints())
    p.add_argument("--input", required=True, metavar="PATH", help="JSON lines (.jsonl/.json) or plain text (.txt)")
    p.add_argument("--json-keys", nargs="+", default=["text"], metavar="KEY", help="keys of each JSON object to tokenize")
    p.add_argument("--output-prefix", required=True, metavar="PATH",
                   help="writes PATH_{key}_document.bin and .idx")
    p.add_argument("--tokenizer-type", choices=TOKENIZER_TYPES, required=True, help="the tokenizer")
    p.add_argument("--tokenizer-model", default=None, metavar="PATH",
                   help="HuggingFaceTokenizer: tokenizer.json or a folder holding one")
    p.add_argument("--append-eod", action="store_true", help="end every document with the end-of-document token")
    p.add_argument("--workers", type=positive_int, default=1, metavar="N",
                   help="tokenizing processes, at most the CPUs this process may run on (more are capped, with a "
                        "warning: they would only share those cores)")
    p.add_argument("--log-interval", type=int_in(1), default=10000, metavar="N",
                   help="print documents/s and MB/s every this many documents")
    return p


def documents(path: str, keys: list[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, {key: text}) per document; ValueError naming the line for bad JSON or a missing key, and the
    file for text that is not UTF-8."""
    try:
        yield from _documents(path, keys)
    except UnicodeDecodeError:
        raise ValueError(non_utf8(path)) from None


def input_not_a_file(path: str, give: str) -> str:
    """Why --input `path` cannot be read, and what to give (round 19: "is not a file" for a folder and for a path that
    is not there, alike)."""
    if not os.path.lexists(path):
        return f"--input {path!r} does not exist; give {give}"
    if os.path.isdir(path):
        return f"--input {path!r} is a directory; give {give}"
    return f"--input {path!r} is not a regular file (a FIFO, a device or a dangling link); give {give}"


def json_lines_hint(path: str, n: int, line: str) -> str:
    """What to do when line n of --input is not a JSON object. Round 19: a JSON array (`json.dump` of a list, the
    `datasets` library's to_json(lines=False)) and a .md or .csv file of text were each "line 1 is not JSON ...; give
    one JSON object per line"; only a .txt file is read as plain text."""
    if n == 1 and line.lstrip().startswith("["):
        stem = os.path.splitext(path)[0]
        return f"the file is one JSON array, not JSON lines: write an object per line, e.g. jq -c '.[]' {path} > " \
               f"{stem}.jsonl"
    if not path.endswith((".json", ".jsonl")):
        return (f"JSON lines are read from .jsonl / .json files, plain text (paragraphs as documents) from .txt: "
                f"name the file {os.path.splitext(os.path.basename(path))[0]}.txt if it is text")
    return "give one JSON object per line"


def non_utf8(path: str) -> str:
    """The line naming where `path` stops being UTF-8: found by a second, binary pass (an error path only). Round 19:
    the text-mode reader's position was "byte 2609 of a read block", after 10,000 documents, with no line."""
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                return (f"--input {path}: line {n} is not UTF-8 text (byte {e.start + 1} of the line is "
                        f"0x{line[e.start]:02x}); convert the file to UTF-8, e.g. iconv -f latin1 -t utf-8")
    return f"--input {path}: not UTF-8 text; convert it to UTF-8"


def _documents(path: str, keys: list[str]) -> Iterator[tuple[int, dict[str, str]]]:
    if path.endswith(".txt"):
        with open(path, encoding="utf-8") as f:
            para, start = [], 1
            for n, line in enumerate(f, 1):
                if line.strip():
                    para.append(line)
                elif para:
                    yield start, {k: "".join(para) for k in keys}
                    para = []
                if not para:
                    start = n + 1
            if para:
                yield start, {k: "".join(para) for k in keys}
        return
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"--input {path}: line {n} is not JSON ({e.msg}); {json_lines_hint(path, n, line)}")
            except (ValueError, RecursionError) as e:  # nesting deeper than the parser's stack, a huge number
                raise ValueError(f"--input {path}: line {n} is not JSON this tool reads ({type(e).__name__})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"--input {path}: line {n} is not a JSON object; {json_lines_hint(path, n, line)}")
            missing = [k for k in keys if not isinstance(obj.get(k), str)]
            if missing:
                raise ValueError(f"--input {path}: line {n} has no string {missing[0]!r} (keys: "
                                 f"{', '.join(list(obj)[:5])}); pass --json-keys with the text's key")
            yield n, {k: obj[k] for k in keys}


_TOKENIZER: Tokenizer | None = None


def _init_worker(tok: Tokenizer) -> None:
    global _TOKENIZER
    _TOKENIZER = tok


def _encode(item: tuple[int, dict[str, str]]) -> tuple[dict[str, list[int]], int]:
    _, doc = item
    return {k: _TOKENIZER.encode(v) for k, v in doc.items()}, sum(len(v.encode("utf-8")) for v in doc.values())


def check(args: argparse.Namespace) -> Tokenizer:
    if not os.path.isfile(args.input):
        raise ValueError(input_not_a_file(args.input, "a JSON-lines or .txt file (one --input: join several with cat)"))
    if args.input.endswith(".txt") and args.json_keys != ["text"]:  # every key would get the same paragraphs
        raise ValueError(f"--json-keys {' '.join(args.json_keys)}: a .txt --input has no keys (its paragraphs are "
                         f"the documents, written as {output_name(args.output_prefix, 'text')}); drop --json-keys")
    repeated = sorted({k for k in args.json_keys if args.json_keys.count(k) > 1})
    if repeated:  # (round 19: `--json-keys text text` ran two writers of the same PREFIX_text_document files)
        raise ValueError(f"--json-keys {' '.join(args.json_keys)}: {repeated[0]!r} is given twice; each key writes "
                         f"its own {output_name(args.output_prefix, repeated[0])}.bin/.idx once: give it once")
    if args.output_prefix.endswith(os.sep):  # DIR/ would write DIR/_text_document.bin, a hidden-looking name
        raise ValueError(f"--output-prefix {args.output_prefix!r} names a directory; give DIR/NAME (writes "
                         f"DIR/NAME_{args.json_keys[0]}_document.bin and .idx)")
    for key in args.json_keys:
        for path in (bin_path(output_name(args.output_prefix, key)), idx_path(output_name(args.output_prefix, key))):
            check_output_file("--output-prefix", path)
    check_outside_packages("--output-prefix", args.output_prefix, "the dataset")
    check_outside_checkpoints("--output-prefix", args.output_prefix,
                              bin_path(output_name(args.output_prefix, args.json_keys[0])), "the dataset")
    tok = build_tokenizer(args.tokenizer_type, args.tokenizer_model)
    if args.append_eod and tok.eod is None:
        raise ValueError(f"--append-eod: --tokenizer-model {args.tokenizer_model} has no end-of-document token "
                         f"(one of <|endoftext|>, </s>, ...); add one or drop --append-eod")
    check_not_replacing(args)
    return tok


def check_not_replacing(args: argparse.Namespace) -> None:
    """Never replace a dataset: a .bin/.idx at --output-prefix may be what a run reads (or resumes into: its
    samples are indices into these files), so a second tokenization must go to a new prefix. Megatron's tool
    overwrites silently; this one refuses before tokenizing. The input's own errors are still named first (they are
    what the user must fix either way), by one parse-only pass over it, made only when the output exists."""
    existing = [p for key in args.json_keys for p in (bin_path(output_name(args.output_prefix, key)),
                                                       idx_path(output_name(args.output_prefix, key)))
                if os.path.lexists(p)]
    if not existing:
        return
    docs = text = 0
    for _, doc in documents(args.input, args.json_keys):  # ValueError naming --input, if bad; streamed, not kept
        docs, text = docs + 1, text or any(doc.values())
    if not text:
        raise ValueError(f"--input {args.input} holds no {'documents' if not docs else 'tokens'} (empty, or no "
                         f"text under --json-keys {' '.join(args.json_keys)}); nothing written")
    first = existing[0]
    other = idx_path(first[:-4]) if first.endswith(".bin") else bin_path(first[:-4])
    if not os.path.lexists(other):  # half a pair is no dataset: what a write killed between its renames leaves
        raise ValueError(f"--output-prefix {args.output_prefix}: {first} already exists without its {other[-4:]} "
                         f"(left by a preprocess that was killed, or one still writing: no run can read it); delete "
                         f"{first} if none is running, or give a new --output-prefix")
    raise ValueError(f"--output-prefix {args.output_prefix}: {first} already exists (a dataset a run may be "
                     f"reading); give a new --output-prefix, or delete {output_name(args.output_prefix, '*')}"
                     f".bin/.idx first")


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (taskset, a cgroup cpuset, a Slurm allocation), which
    os.cpu_count() -- the machine's -- overstates; os.cpu_count() where there is no mask (macOS)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def capped_workers(requested: int, cpus: int) -> tuple[int, str | None]:
    """(--workers to fork, the warning when capped). Tokenizing is CPU-bound, so workers beyond the usable CPUs only
    time-share them, each with its own tokenizer copy and fork (`--workers 10000` forked 10000 processes).
    Megatron-LM's preprocess_data.py takes any count, advising workers x partitions = the CPU cores; one input file
    here (no --partitions) makes that workers = CPUs. Not capped by the number of documents: the input is streamed,
    its count unknown until it is read (a worker given no chunk only waits)."""
    if requested <= cpus:
        return requested, None
    return cpus, (f"{PROG}: warning: --workers {requested} is more than the {plural(cpus, 'CPU')} this process may "
                  f"run on; using {cpus} (tokenizing processes beyond the cores only share them): give --workers "
                  f"{cpus} or fewer")


def output_name(prefix: str, key: str) -> str:
    return f"{prefix}_{key}_document"


def run(args: argparse.Namespace, tok: Tokenizer, out=None) -> dict:
    """Tokenize and write; returns counts and timings (documents, tokens, bytes, seconds)."""
    writers = {k: IndexedDatasetWriter(output_name(args.output_prefix, k), optimal_dtype(tok.vocab_size))
               for k in args.json_keys}
    t0 = time.perf_counter()
    docs = nbytes = tokens = 0
    pool = multiprocessing.get_context("fork").Pool(args.workers, _init_worker, (tok,)) if args.workers > 1 else None
    try:
        if pool is None:
            _init_worker(tok)
        items = documents(args.input, args.json_keys)
        encoded = pool.imap(_encode, items, chunksize=64) if pool else map(_encode, items)
        for ids, size in encoded:
            for k, seq in ids.items():
                if args.append_eod:
                    seq.append(tok.eod)
                writers[k].add_document(seq)
                tokens += len(seq)
            docs, nbytes = docs + 1, nbytes + size
            if docs % args.log_interval == 0:
                dt = time.perf_counter() - t0
                print(f"Processed {plural(docs, 'document')} ({docs / dt:.0f} docs/s, {nbytes / dt / 1e6:.2f} MB/s).",
                      file=out or sys.stderr, flush=True)  # the stream of the call (not of the import)
        if not tokens:  # an empty input would replace a good dataset at --output-prefix with an empty one
            raise ValueError(f"--input {args.input} holds no {'documents' if not docs else 'tokens'} (empty, or "
                             f"no text under --json-keys {' '.join(args.json_keys)}); nothing written")
        for w in writers.values():
            w.finalize()
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    finally:
        if pool:
            pool.terminate()
    dt = time.perf_counter() - t0
    return {"documents": docs, "tokens": tokens, "bytes": nbytes, "seconds": dt}


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    try:
        tok = check(args)
        args.workers, warning = capped_workers(args.workers, usable_cpus())  # after the checks: an error is one line
        if warning:
            print(warning, file=sys.stderr, flush=True)
        stats = run(args, tok)
    except ValueError as e:
        raise fail(f"{PROG}: error: {e}") from None
    dt = max(stats["seconds"], 1e-9)
    print(f"{PROG}: {plural(stats['documents'], 'document')}, {plural(stats['tokens'], 'token')}, "
          f"{stats['bytes'] / 1e6:.2f} MB in "
          f"{dt:.2f} s ({stats['documents'] / dt:.0f} docs/s, {stats['bytes'] / dt / 1e6:.2f} MB/s, "
          f"{plural(args.workers, 'worker')}) -> "
          f"{', '.join(output_name(args.output_prefix, k) for k in args.json_keys)}"
          f".bin/.idx", flush=True)
    return stats
