"""Tokenizers for preprocessing and for the vocabulary check of training.

`HuggingFaceTokenizer`: a `tokenizers` JSON (tokenizer.json, or a transformers tokenizer folder holding one);
read with the `tokenizers` library alone, so preprocessing workers do not import transformers.
`ByteLevel`: UTF-8 bytes, vocabulary 256, end of document = byte 0 (NUL, which text does not contain), so it
trains the byte-vocabulary presets (tiny-gpt2, tiny-llama) unchanged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TOKENIZER_TYPES = ("HuggingFaceTokenizer", "ByteLevel")

# what a Megatron-LM user's tokenizer flags are here: the unknown-flag / invalid-choice line of every parser with
# --tokenizer-type (train.py, scripts/preprocess_data.py; hybrid.cliutil.OneLineParser's `hints`)
_AS_JSON = ("tokenizer.json here: --tokenizer-type HuggingFaceTokenizer --tokenizer-model tokenizer.json "
            "(transformers' AutoTokenizer.save_pretrained writes it)")
# Megatron's GPT-2 files (gpt2-vocab.json + gpt2-merges.txt) into one tokenizer.json: the same ids (round 22: a
# preprocess with the converted folder wrote the .bin of the tokenizer the files came from byte for byte)
FROM_VOCAB_MERGES = ("from Megatron's files: python -c \"from transformers import GPT2TokenizerFast as T; "
                     "T('gpt2-vocab.json', 'gpt2-merges.txt').save_pretrained('tok/')\", then --tokenizer-model tok/")
TOKENIZER_HINT = f"a GPT-2 BPE tokenizer is one {_AS_JSON}; {FROM_VOCAB_MERGES}"
# Megatron's --tokenizer-type names (its tokenizer.py) of tokenizers a tokenizer.json holds
MEGATRON_TOKENIZERS = ("GPT2BPETokenizer", "Llama2Tokenizer", "Llama3Tokenizer", "SentencePieceTokenizer",
                       "GPTSentencePieceTokenizer", "TikTokenizer", "MistralTokenizer")


def tokenizer_hints() -> dict[str, str]:
    """{"--tokenizer-type=NAME": hint} for Megatron's tokenizer names and {"--vocab-file" / "--merge-file": hint}."""
    out = {f"--tokenizer-type={name}": f"Megatron's {name} is a {_AS_JSON}" for name in MEGATRON_TOKENIZERS}
    out["--tokenizer-type=GPT2BPETokenizer"] += f"; {FROM_VOCAB_MERGES}"
    out.update({flag: f"{flag}: {TOKENIZER_HINT}" for flag in ("--vocab-file", "--merge-file")})
    return out


EOD_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[EOS]")


@dataclass
class Tokenizer:
    """encode(text) -> ids; vocab_size; eod (the end-of-document id, None if the tokenizer has none)."""

    kind: str
    model: str | None
    vocab_size: int
    eod: int | None

    def __post_init__(self) -> None:
        self._tok = None

    def encode(self, text: str) -> list[int]:
        if self.kind == "ByteLevel":
            return list(text.encode("utf-8"))
        if self._tok is None:
            self._tok = _load(self.model)
        return self._tok.encode(text, add_special_tokens=False).ids


def tokenizer_file(model: str | None, flag: str = "--tokenizer-model") -> str:
    """The tokenizer.json of `model` (a file, or a folder holding one)."""
    if not model:
        raise ValueError(f"--tokenizer-type HuggingFaceTokenizer needs {flag} (a tokenizer.json or a folder "
                         f"holding one; scripts/train_tokenizer.py writes one)")
    path = os.path.join(model, "tokenizer.json") if os.path.isdir(model) else model
    if not os.path.isfile(path):
        raise ValueError(f"{flag} {model}: no tokenizer.json there; give a file written by the tokenizers library "
                         f"or a transformers tokenizer folder")
    return path


def _load(model: str | None):
    from tokenizers import Tokenizer as HFTokenizer

    path = tokenizer_file(model)
    try:
        return HFTokenizer.from_file(path)
    except Exception as e:  # tokenizers raises its own Exception type on a bad JSON
        raise ValueError(f"--tokenizer-model {model}: not a tokenizers JSON ({str(e).splitlines()[0][:120]})") from None


def build_tokenizer(kind: str, model: str | None) -> Tokenizer:
    """The tokenizer of --tokenizer-type / --tokenizer-model; ValueError naming the flag when unusable."""
    if kind == "ByteLevel":
        return Tokenizer(kind, None, 256, 0)
    if kind != "HuggingFaceTokenizer":
        raise ValueError(f"--tokenizer-type {kind!r}: choose one of {', '.join(TOKENIZER_TYPES)}")
    tok = _load(model)
    vocab = tok.get_vocab(with_added_tokens=True)
    eod = next((vocab[n] for n in EOD_NAMES if n in vocab), None)
    return Tokenizer(kind, model, tok.get_vocab_size(with_added_tokens=True), eod)
