"""Train a byte-level BPE tokenizer offline with the `tokenizers` library (scripts/train_tokenizer.py).

    python scripts/train_tokenizer.py --output tok/ --vocab-size 4096 [--input a.txt b.jsonl]

Without --input it trains on Python's pydoc topics (ships with Python). Writes a transformers tokenizer folder:
tokenizer.json (what preprocess_data.py and train.py read with `tokenizers` alone) plus tokenizer_config.json and
special_tokens_map.json (what transformers' AutoTokenizer.from_pretrained reads). `<|endoftext|>` is id 0, the
end-of-document token of --append-eod.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Iterator

from hybrid.checkpoint_paths import check_outside_checkpoints
from hybrid.cliutil import (HelpFormatter, OneLineParser, check_output_dir, check_outside_packages, fail, int_in,
                            new_temporary)
from hybrid.data.preprocess import input_not_a_file, json_lines_hint, non_utf8
from hybrid.data.text import read_text
from hybrid.fault_hook import crash_point

PROG = "train_tokenizer.py"
EOD = "<|endoftext|>"
WRITTEN = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")  # the folder `train` writes
# what marks a directory as a checkpoint or model folder: a hybrid or DeepSpeed store's `latest`, a transformers
# folder's config.json, a store's iterations
CHECKPOINT_MARKS = ("latest", "config.json")
CHECKPOINT_PREFIXES = ("iter_", "global_step")


# preprocess_data.py's names for what this script names otherwise, which a user carries over (round 16: "see --help")
HINTS = {
    "--output-prefix": "--output-prefix: the tokenizer is a folder: give --output DIR (preprocess_data.py's "
                       "--output-prefix names the dataset it writes)",
    "--tokenizer-type": "--tokenizer-type: this trains a byte-level BPE tokenizer.json (use it with --tokenizer-type "
                        "HuggingFaceTokenizer --tokenizer-model DIR); ByteLevel needs no training; drop the flag",
}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter, hints=HINTS)
    p.add_argument("--input", nargs="*", default=None, metavar="PATH",
                   help="text (.txt) or JSON-lines files; none: Python's pydoc topics")
    # preprocess_data.py's (and Megatron's tools/preprocess_data.py) name, so one command line's key carries over;
    # --json-key, this script's name before round 17, is kept as its alias
    p.add_argument("--json-keys", "--json-key", dest="json_keys", nargs="+", default=["text"], metavar="KEY",
                   help="the keys of JSON lines whose text trains the tokenizer (preprocess_data.py's --json-keys)")
    p.add_argument("--vocab-size", type=int_in(257, 1 << 20), default=4096, metavar="N",
                   help="vocabulary, including the 256 byte tokens and <|endoftext|>")
    p.add_argument("--output", required=True, metavar="DIR", help="the tokenizer folder to write")
    return p


def texts(paths: list[str] | None, keys: list[str]) -> Iterator[str]:
    """The documents of --input (or pydoc's topics); ValueError naming the file and line on anything unreadable."""
    if not paths:
        yield read_text(None).decode("utf-8")
        return
    for path in paths:
        if not os.path.isfile(path):
            folder = f", e.g. --input {path.rstrip(os.sep)}/*.txt" if os.path.isdir(path) else ""
            raise ValueError(input_not_a_file(path, f"text (.txt) or JSON-lines files{folder}"))
        try:
            with open(path, encoding="utf-8") as f:
                if path.endswith(".txt"):
                    yield f.read()
                    continue
                for n, line in enumerate(f, 1):
                    if line.strip():
                        yield from _json_texts(path, n, line, keys)
        except UnicodeDecodeError:
            raise ValueError(non_utf8(path)) from None


def _json_texts(path: str, n: int, line: str, keys: list[str]) -> Iterator[str]:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as e:
        why = (str(e).splitlines() or [type(e).__name__])[0]
        raise ValueError(f"--input {path}: line {n} is not JSON ({why}); {json_lines_hint(path, n, line)}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"--input {path}: line {n} is not a JSON object; {json_lines_hint(path, n, line)}")
    for key in keys:
        if not isinstance(obj, dict) or not isinstance(obj.get(key), str):
            found = f" (its keys: {', '.join(list(obj)[:5])})" if isinstance(obj, dict) and obj else ""
            raise ValueError(f"--input {path}: line {n} has no string {key!r}{found}; pass --json-keys with the "
                             f"text's key")
        yield obj[key]


def check_inputs(paths: list[str] | None, keys: list[str]) -> int:
    """Read every input once before training (nothing is written on a bad one): the characters of text they
    hold. An input with no text would train a tokenizer of the byte alphabet alone -- an error, so an empty or
    mistyped file never replaces a good tokenizer."""
    if paths == []:  # `--input $FILES` with FILES empty: the flag without a file trained on pydoc's topics (round 19)
        raise ValueError("--input was given no file; give the text or JSON-lines files, or drop --input to train on "
                         "Python's pydoc topics")
    chars = sum(len(t.strip()) for t in texts(paths, keys))
    if not chars:
        raise ValueError(f"--input {' '.join(paths or [])} holds no text (empty or whitespace only); nothing "
                         f"written")
    return chars


def train(paths: list[str] | None, vocab_size: int, output: str, keys: tuple[str, ...] = ("text",)):
    """Byte-level BPE (GPT-2's pre-tokenizer and decoder) on the texts; saves and returns the Tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOD], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts(paths, list(keys)), trainer=trainer)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOD, "eos_token": EOD, "unk_token": EOD,
              "model_max_length": 1 << 30}
    special = {"bos_token": EOD, "eos_token": EOD, "unk_token": EOD}
    os.makedirs(output, exist_ok=True)
    # each file written beside its final name and renamed over it only once all three are written; the
    # temporaries are new files of unique names (mkstemp: O_EXCL, never through a link -- a fixed
    # `.tokenizer.json.tmp` someone linked elsewhere was written through). tokenizer.json is renamed last: it is
    # the file every reader opens, so a kill between the renames leaves no tokenizer.json beside a half set (the
    # two small files, which a rerun refuses to replace, by name) -- never a tokenizer that loads without its config
    staged = []
    try:
        for name, write in (("tokenizer_config.json", lambda p: _dump(config, p)),
                            ("special_tokens_map.json", lambda p: _dump(special, p)),
                            ("tokenizer.json", lambda p: tok.save(p))):
            fd, tmp = new_temporary(os.path.join(output, name))
            os.close(fd)
            staged.append((tmp, os.path.join(output, name)))
            write(tmp)
    except BaseException:
        for tmp, _ in staged:
            os.remove(tmp)
        raise
    crash_point("tokenizer_staged")  # test-only: the three files whole under temporary names
    for n, (tmp, final) in enumerate(staged):
        os.replace(tmp, final)
        if n == 0:
            crash_point("tokenizer_first_renamed")  # test-only: one file in place, the other two not
    return tok


def check_fresh_output(path: str) -> None:
    """--output must not replace a tokenizer: data preprocessed with the old one hold its ids, which a new
    vocabulary reads as other tokens, without a word. Nor go into a checkpoint or model folder: `hybrid generate`
    and `hybrid convert` take the tokenizer files found there as that model's. ValueError naming the flag."""
    if not os.path.isdir(path):
        return
    there = [name for name in WRITTEN if os.path.lexists(os.path.join(path, name))]
    if there:
        raise ValueError(f"--output {path!r} already holds a tokenizer ({', '.join(there)}); data preprocessed with "
                         f"it would no longer match a new one: give a new directory, or delete those files first")
    names = os.listdir(path)
    if any(n in CHECKPOINT_MARKS or n.startswith(CHECKPOINT_PREFIXES) for n in names):
        raise ValueError(f"--output {path!r} is a checkpoint or model folder (it holds latest, config.json or "
                         f"iter_*); hybrid generate and convert would take a tokenizer written there as that "
                         f"model's: give the tokenizer a directory of its own")



def _dump(obj: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        check_output_dir("--output", args.output)
        check_outside_packages("--output", args.output, "the tokenizer")
        check_outside_checkpoints("--output", args.output, args.output, "the tokenizer")
        check_inputs(args.input, args.json_keys)  # first: a bad input is named as such whatever --output holds
        check_fresh_output(args.output)
        tok = train(args.input, args.vocab_size, args.output, args.json_keys)
    except (ValueError, OSError) as e:
        raise fail(f"{PROG}: error: {e}") from None
    print(f"{PROG}: vocabulary {tok.get_vocab_size()} ({EOD} = {tok.token_to_id(EOD)}) -> {args.output}", flush=True)
