"""The tokenizer an export carries, so that transformers' AutoTokenizer on the exported folder encodes text as the
run's data were encoded.

Which one (`export_tokenizer`, after the source's own tokenizer files were carried through):

* files carried with the source (a converted transformers folder's, the run's --model folder's): kept as they are;
* the run's --tokenizer-type HuggingFaceTokenizer --tokenizer-model: its tokenizer.json, with a
  tokenizer_config.json naming its end-of-document token (hybrid/data/tokenizer.py's EOD_NAMES);
* byte-level data (the default corpus, text files, --tokenizer-type ByteLevel): `byte_level_tokenizer`, a
  tokenizers BPE with one token per byte and no merges -- id b is byte b, as train.py reads text -- whose id 0 is
  the end-of-document token `<|endoftext|>` (hybrid/data/tokenizer.py's ByteLevel: EOD = byte 0, NUL, which text
  does not contain; the tiny presets' bos/eos id 0);
* anything else (indexed data whose tokenizer the run did not record): none, and the export says so.

Whichever it is, TOKENS_FILE (hybrid_tokens.json) records what the export's token ids are -- "tokenizer" (its
tokenizer files), "bytes" (UTF-8 bytes), "ids" (an indexed dataset's ids, its tokenizer not recorded: text cannot
be encoded for it) or "unknown" -- so that `hybrid generate EXPORT --prompt` refuses to read text as bytes for a
model of token ids (`export_tokens`) and still reads a byte-level export's prompt (README's `hybrid generate
exported/`). A carried TOKENS_FILE (an export converted back and exported again) is kept where this run adds
nothing.
"""

from __future__ import annotations

import json
import os
import shutil

EOD = "<|endoftext|>"
TOKENS_FILE = "hybrid_tokens.json"
TOKEN_KINDS = ("tokenizer", "bytes", "ids", "unknown")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which tokenizers' ByteLevel pre-tokenizer and decoder use."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = dict(zip(keep, map(chr, keep))), 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_level_tokenizer():
    """A `tokenizers.Tokenizer`: UTF-8 bytes as ids 1-255, id 0 the special end-of-document token."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    table = bytes_to_unicode()
    vocab = {table[b]: b for b in range(1, 256)}
    vocab[EOD] = 0
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOD, special=True)])
    return tok


def _config(dst: str, eod: str | None, max_length: int) -> None:
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length}
    if eod is not None:
        cfg.update(eos_token=eod, bos_token=eod)
    with open(os.path.join(dst, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)


def _is_byte_data(args: dict) -> bool:
    """The run read byte tokens: --tokenizer-type ByteLevel, or no tokenizer and only text files (or the default
    corpus) in --data-path."""
    kind = args.get("tokenizer_type")
    if kind is not None:
        return kind == "ByteLevel"
    if "data_path" not in args:  # not recorded (an older checkpoint): unknown
        return False
    from hybrid.data.args import not_text_files
    return not not_text_files(args["data_path"])


def export_tokenizer(dst: str, carried: list[str], state: dict, max_length: int) -> str:
    """Write the tokenizer files into `dst` (the export being staged) unless `carried` holds one, and TOKENS_FILE
    saying what the token ids are; the line that says which."""
    line, kind = _tokenizer_files(dst, carried, state, max_length)
    if kind != "unknown" or TOKENS_FILE not in carried:
        with open(os.path.join(dst, TOKENS_FILE), "w") as f:
            json.dump({"tokens": kind, "how": line}, f, indent=1)
    return line


def export_tokens(folder: str) -> str:
    """What a transformers folder's token ids are, as its TOKENS_FILE records ("unknown" without a readable one:
    a folder not exported here, or exported before round 25)."""
    try:
        with open(os.path.join(folder, TOKENS_FILE)) as f:
            kind = json.load(f).get("tokens")
    except (OSError, ValueError, AttributeError):
        return "unknown"
    return kind if kind in TOKEN_KINDS else "unknown"


def _tokenizer_files(dst: str, carried: list[str], state: dict, max_length: int) -> tuple[str, str]:
    """(the line, the TOKEN_KINDS entry) of the tokenizer files written into `dst`."""
    if "tokenizer.json" in carried or "tokenizer.model" in carried:
        return "tokenizer: carried with the source (" + ", ".join(n for n in carried if "token" in n) + ")", \
            "tokenizer"
    args = state.get("args") or {}
    if args.get("tokenizer_type") == "HuggingFaceTokenizer" and args.get("tokenizer_model"):
        from tokenizers import Tokenizer

        from hybrid.data.tokenizer import EOD_NAMES, tokenizer_file
        src = tokenizer_file(args["tokenizer_model"])
        try:  # a path state.json names: copied into the export only if it is a tokenizer (not any JSON, e.g. keys)
            Tokenizer.from_file(src)
        except Exception as e:  # tokenizers raises its own Exception type
            raise ValueError(f"the run's --tokenizer-model {args['tokenizer_model']} (state.json): not a tokenizers "
                             f"file ({(str(e).strip().splitlines() or [''])[0][:80]}); nothing copied -- copy the "
                             f"tokenizer files into the export yourself") from None
        shutil.copyfile(src, os.path.join(dst, "tokenizer.json"))
        with open(src) as f:
            names = {t.get("content") for t in json.load(f).get("added_tokens", [])}
        eod = next((n for n in EOD_NAMES if n in names), None)
        _config(dst, eod, max_length)
        return f"tokenizer: the run's --tokenizer-model {args['tokenizer_model']} (end of document: {eod})", "tokenizer"
    if _is_byte_data(args):
        byte_level_tokenizer().save(os.path.join(dst, "tokenizer.json"))
        _config(dst, EOD, max_length)
        return f"tokenizer: byte-level (the run read UTF-8 bytes; id = byte, {EOD} = id 0)", "bytes"
    came = state.get("converted_from")
    if isinstance(came, dict) and came.get("path"):  # no run (round 19: "the run recorded no tokenizer ... train with")
        return (f"tokenizer: none written -- SRC is a conversion of {came['path']}, which held no tokenizer files "
                f"(copy them into the export)"), "unknown"
    from hybrid.data.args import not_text_files
    indexed = not_text_files(args.get("data_path"))
    return ("tokenizer: none written -- the run recorded no tokenizer for its data (train with --tokenizer-type, "
            "or copy the tokenizer files into the export)"
            + (f"; {TOKENS_FILE} says its tokens are {indexed[0]}'s ids, so `hybrid generate` takes --prompt-ids "
               f"or --tokenizer" if indexed else "")), "ids" if indexed else "unknown"
