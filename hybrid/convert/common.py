"""What every direction shares: the destination (checked, written in a temporary directory, renamed), the
model config (read, and written back for transformers), the tokenizer files passed through."""

from __future__ import annotations

import contextlib
import copy
import os
import math
import shutil
import sys
import tempfile
from collections.abc import Iterator

import torch

from hybrid.cliutil import check_output_dir, check_outside_packages
from hybrid.fault_hook import crash_point
from models.config import ARCH_GPT2, ModelConfig, load_config

# files of a transformers folder that are not weights and that we carry through unchanged
PASS_THROUGH = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                "tokenizer.model", "added_tokens.json", "chat_template.jinja", "generation_config.json",
                "hybrid_tokens.json")
ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen2": "Qwen2ForCausalLM", "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# --- progress: a 7B model in fp32 is 28 GB, 291 tensors, 6 files of 5 GB -- minutes of work ---------------------
PROGRESS_PARTS = 10  # a tensor-by-tensor phase prints at most this many lines, plus one at the end of each file


class Progress:
    """`hybrid convert`'s progress lines ("convert: ..."), on stderr: stdout keeps the summary lines a script may
    read, unchanged. quiet (--quiet): none -- nor verify's announcement nor transformers' loading bar."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet

    def __call__(self, line: str) -> None:
        if not self.quiet:
            print(f"convert: {line}", file=sys.stderr, flush=True)


QUIET = Progress(quiet=True)


def progress_step(total: int) -> int:
    """Report after every this many of `total` items: at most PROGRESS_PARTS lines for the phase."""
    return max(1, math.ceil(total / PROGRESS_PARTS))


def size_text(n: int) -> str:
    """Bytes as a person reads them: 28.00 GB, 4.97 GB, 512.0 MB, 66.3 kB (powers of 1000, as --max-shard-size's
    5GB)."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GB" else f"{n / scale:.1f} {unit}"
    return f"{n} B"


def check_dst(dst: str) -> None:
    """DST is new (or an empty directory) in a writable place; ValueError otherwise."""
    if os.path.islink(dst):  # the staged output is renamed onto DST: it could not fill the link's target
        raise ValueError(f"DST {dst!r} is a symbolic link (to {os.readlink(dst)!r}); give the directory itself "
                         f"(nothing is written through a link)")
    if os.path.exists(dst) and not os.path.isdir(dst):
        raise ValueError(f"DST {dst!r} is a file, not a directory; give a new directory (nothing is overwritten)")
    if os.path.exists(dst) and os.listdir(dst):
        raise ValueError(f"DST {dst!r} exists and is not empty; give a new directory (nothing is overwritten)")
    check_output_dir("DST", dst)
    check_outside_packages("DST", dst, "the converted checkpoint")


def check_dst_outside_src(src: str, dst: str) -> None:
    """DST is not SRC nor inside it: the conversion stages and renames DST beside itself, so a DST inside SRC would
    write into the checkpoint it reads (and a hybrid SRC's manifest would no longer describe its folder)."""
    s, d = os.path.realpath(src), os.path.realpath(dst)
    if d == s or os.path.commonpath([s, d]) == s:
        raise ValueError(f"DST {dst!r} is inside SRC {src!r}; the conversion would write into the checkpoint it "
                         f"reads: give a DST outside SRC")


def check_dst_outside_checkpoints(dst: str) -> None:
    """DST is not a checkpoint directory (train.py's --save, DeepSpeed's, Megatron-LM's) nor inside one: the export
    would sit among its iter_*/ and `latest` -- inside an iteration, in a folder a save replaces and --save-keep
    deletes; beside them, in the folder a resume copies and `hybrid checkpoint inspect` reads. ValueError naming
    the checkpoint and a DST beside it."""
    from hybrid.checkpoint import store
    root = store.enclosing_checkpoint(dst)
    if root is None:
        return
    name = os.path.basename(os.path.normpath(dst))
    beside = os.path.relpath(os.path.join(os.path.dirname(root), name if os.path.realpath(dst) != root else
                                          name + "_converted"))
    where = "is the checkpoint directory" if os.path.realpath(dst) == root else "is inside the checkpoint directory"
    raise ValueError(f"DST {dst!r} {where} {root} (iter_*/, latest): the conversion would be written among its "
                     f"checkpoints; give a directory of its own, e.g. {beside}")


@contextlib.contextmanager
def staged_dst(dst: str) -> Iterator[str]:
    """A temporary directory beside DST, renamed onto DST when the body succeeds and removed when it raises:
    a failed or interrupted conversion leaves no DST (a crash leaves only a .DST.tmp.* directory)."""
    parent = os.path.dirname(os.path.abspath(dst))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(dst))}.tmp.", dir=parent)
    try:
        yield tmp
        crash_point("export_written")  # test-only: the conversion whole (verified) under `tmp`; no DST yet
        os.chmod(tmp, 0o755)
        if os.path.isdir(dst):
            os.rmdir(dst)  # empty (check_dst)
        os.replace(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_safetensors(src: str, what: str = "SRC", every_file: bool = False) -> None:
    """Every safetensors file of a transformers folder opens (its header parses and covers the file) and every
    shard its index names exists: a truncated or corrupt one is one line naming it, before any work."""
    from models.hf_io import CheckpointReader
    try:
        reader = CheckpointReader(src)
    except Exception as e:  # safetensors' header error, a malformed index; ours (an index naming a file outside)
        if isinstance(e, ValueError) and str(e).startswith("--model"):
            raise ValueError(what + str(e)[len("--model"):]) from None
        raise ValueError(f"{what} {src}: not a readable safetensors checkpoint ({type(e).__name__}: "
                         f"{(str(e).strip().splitlines() or [''])[0][:160]})") from None
    missing = sorted({os.path.basename(f) for f in reader.files.values() if not os.path.isfile(f)})
    if missing:
        raise ValueError(f"{what} {src}: the index names missing shard files: {', '.join(missing[:3])}")
    if every_file:
        check_one_copy_each(src, {k: os.path.basename(f) for k, f in reader.files.items()}, what)


def check_one_copy_each(src: str, owner: dict[str, str], what: str = "SRC") -> None:
    """DCP's HuggingFaceStorageReader (convert's read) takes EVERY .safetensors file of the folder, not the index's:
    a tensor found in a second file -- a shard of an older save, a file dropped in -- was read over the one the
    index names, silently. Each tensor must be in one file, the one `owner` (the index, or model.safetensors) names;
    files with other tensors only (an adapter) are left alone. ValueError naming the file otherwise."""
    from safetensors import safe_open
    seen: dict[str, str] = {}
    for name in sorted(n for n in os.listdir(src) if n.endswith(".safetensors")):
        try:
            with safe_open(os.path.join(src, name), framework="pt") as f:
                keys = list(f.keys())
        except Exception as e:  # DCP's reader would open it too: its header error, as one line
            raise ValueError(f"{what} {src}: {name} is not a readable safetensors file ({type(e).__name__}: "
                             f"{(str(e).strip().splitlines() or [''])[0][:120]}); convert reads every .safetensors "
                             f"file of the folder: move it out") from None
        for key in keys:
            if key in seen or owner.get(key, name) != name:
                first = seen.get(key, owner.get(key))
                raise ValueError(f"{what} {src}: tensor {key} is in {name} and in {first}; convert reads every "
                                 f".safetensors file of the folder, so one would be read over the other: move the "
                                 f"file that is not the checkpoint's out of the folder")
            seen[key] = name


def read_config(path: str, what: str) -> ModelConfig:
    """load_config with its messages naming `what` (SRC / --model) instead of train.py's --model."""
    try:
        return load_config(path)
    except ValueError as e:
        msg = str(e)
        raise ValueError(what + msg[len("--model"):] if msg.startswith("--model") else msg) from None


def hf_config(cfg: ModelConfig, dtype: torch.dtype):
    """The transformers config to write beside exported weights: the source's, with the sizes our config
    holds (the checkpoint's own vocabulary, tying) and the architecture AutoModelForCausalLM builds."""
    hf = copy.deepcopy(cfg.hf)
    hf.vocab_size = cfg.vocab_size
    if cfg.arch != ARCH_GPT2:
        hf.tie_word_embeddings = cfg.tie_embeddings
    hf.architectures = [ARCHITECTURES[hf.model_type]]
    hf.dtype = dtype
    return hf


def copy_pass_through(src_dirs: list[str], dst: str) -> list[str]:
    """Tokenizer (and generation-config) files from the first of `src_dirs` holding each; their names."""
    copied = []
    for name in PASS_THROUGH:
        for d in src_dirs:
            path = os.path.join(d, name) if d else ""
            if path and os.path.islink(path):  # copyfile follows it: ~/.ssh/id_rsa into the export
                raise ValueError(f"{path} is a symbolic link (to {os.readlink(path)!r}); a model folder's files are "
                                 f"copied into DST only as regular files of the folder: replace the link with the "
                                 f"file itself")
            if d and os.path.isfile(os.path.join(d, name)):
                shutil.copyfile(os.path.join(d, name), os.path.join(dst, name))
                copied.append(name)
                break
    return copied
