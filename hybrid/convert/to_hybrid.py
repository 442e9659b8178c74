"""transformers folder (or DeepSpeed ZeRO / DeepSpeed-MoE checkpoint) -> hybrid checkpoint of model weights.

Reading a transformers folder goes through DCP's own HuggingFaceStorageReader (torch.distributed.checkpoint):
a DCP load of a state dict keyed by transformers names, with the dtype cast to fp32 done by the reader's copy.
Our key mapping (mapping.py) is the adapter to hybrid's names. The hybrid side is written, still in one process,
as the ranks of a run at the target layout (default tp 1 x pp 1) would save it (presharded.py): `model/NAME`
ShardedTensors cut into each rank's TP shard, one file per rank. A later load at any TP x PP x DP layout reads
its chunks of them (DCP reshards), exactly as it reads a checkpoint a training run wrote.

The checkpoint has the store layout of hybrid/checkpoint/store.py (DST/iter_0000000/ + DST/latest, manifest
with checksums) and state.json marks it `"contents": "model"`: iteration 0, no optimizer moments, no RNG.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Callable

import torch
import torch.distributed.checkpoint as dcp

from hybrid.checkpoint import store
from hybrid.checkpoint.identity import model_identity
from hybrid.convert import deepspeed_moe, mapping
from hybrid.convert.common import (Progress, check_dst, check_safetensors, copy_pass_through, hf_config,
                                   read_config, size_text, staged_dst)
from hybrid.convert.presharded import TargetLayout, check_target, rank_state_dicts, save_as_ranks
from hybrid.convert.verify import verify_hybrid_against
from models.config import ModelConfig
from models.hf_io import CheckpointReader, per_expert_state_dict

MODEL_ONLY = "model"  # state.json "contents" of a converted checkpoint (a training run's: "full")


def _check_shapes(cfg: ModelConfig, found: dict[str, tuple[int, ...]], where: str) -> None:
    for key, want in mapping.hf_shapes(cfg).items():
        if key not in found:
            raise ValueError(f"{where}: no tensor {key!r}, which the config's {cfg.hf.model_type} model needs "
                             f"(a checkpoint of another model, or missing shards?)")
        if tuple(found[key]) != tuple(want):
            raise ValueError(f"{where}: tensor {key} has shape {list(found[key])}, but config.json implies "
                             f"{list(want)}; use the config.json saved with these weights")


def _read_hf_folder(src: str, cfg: ModelConfig, progress: Progress = Progress()) -> dict[str, torch.Tensor]:
    """Every transformers tensor the model needs, fp32, through DCP's HuggingFaceStorageReader: one load per
    safetensors file (a progress line before each), each of that file's tensors."""
    reader = CheckpointReader(src)  # resolves "transformer."/"model."-less keys of bare-model checkpoints
    names: dict[str, str] = {}
    found: dict[str, tuple[int, ...]] = {}
    for key in mapping.hf_shapes(cfg):
        try:
            names[key] = reader.resolve(key)
        except KeyError:
            continue
        if not os.path.isfile(reader.files[names[key]]):
            raise ValueError(f"SRC {src}: {os.path.basename(reader.files[names[key]])} (listed in the index for "
                             f"{names[key]}) is missing")
        found[key] = tuple(reader.get_slice(key).get_shape())
    _check_shapes(cfg, found, f"SRC {src}")
    buffers = {names[k]: torch.empty(s, dtype=torch.float32) for k, s in found.items()}
    by_file: dict[str, list[str]] = {}
    for name in buffers:
        by_file.setdefault(reader.files[name], []).append(name)
    for j, (file, keys) in enumerate(sorted(by_file.items()), 1):
        size = sum(buffers[k].numel() * 4 for k in keys)
        progress(f"reading {os.path.basename(file)} (file {j}/{len(by_file)}): {len(keys)} tensor"
                 f"{'s' if len(keys) > 1 else ''}, "
                 f"{size_text(size)} as float32")
        dcp.load({k: buffers[k] for k in keys}, storage_reader=dcp.HuggingFaceStorageReader(src), no_dist=True)
    return {k: buffers[names[k]] for k in found}


def _write(tmp_root: str, cfg: ModelConfig, stored: Callable[[str], torch.Tensor], state: dict,
           pass_through: list[str], target: TargetLayout, progress: Progress = Progress()) -> str:
    """Save our tensors into tmp_root/iter_0000000.tmp as the ranks of a run at `target` would (presharded.py),
    then the store's finalize (manifest, rename, `latest`). Returns the iteration directory."""
    it_dir = store.tmp_path(tmp_root, 0)
    os.makedirs(it_dir)
    ours = {p.name: mapping.ours_from_hf(p, stored(p.source.key)) for p in mapping.params(cfg)}
    save_as_ranks(rank_state_dicts(cfg, target, ours.__getitem__), it_dir, progress)
    del ours
    hf = hf_config(cfg, torch.float32)
    for d in (it_dir, tmp_root):  # root: `--model DST` builds the model from it
        hf.to_json_file(os.path.join(d, "config.json"))
    copy_pass_through(pass_through, it_dir)
    files = {n: store.describe(os.path.join(it_dir, n)) for n in os.listdir(it_dir) if n != ".metadata"}
    return store.finalize(tmp_root, 0, files, state)


def model_state(cfg: ModelConfig, model: str, source: dict, target: TargetLayout) -> dict:
    """state.json of a converted checkpoint. `model` is what train.py's --model must then be (the ckpt resume
    compares it); the layout is the one the chunks are cut for (a run at tp x pp, dp 1, ZeRO 0)."""
    return {"format": store.FORMAT, "contents": MODEL_ONLY, "iteration": 0, "consumed_samples": 0, "adam_step": 0,
            "model": model, "model_identity": model_identity(cfg), "converted_from": source,
            "layout": target.layout(cfg),
            "args": {}}


def hf_to_hybrid(src: str, dst: str, verify: bool = True, log=print, target: TargetLayout = TargetLayout(),
                 progress: Progress = Progress()) -> str:
    """Convert the transformers folder `src` into a new hybrid checkpoint `dst` pre-sharded for `target`; the
    verification line. `progress`: the lines of the long phases (each file read, each rank's chunks written, the
    verification); `log`: the summary."""
    check_dst(dst)
    cfg = read_config(src, "SRC")
    check_target(cfg, target)
    check_safetensors(src, every_file=True)  # DCP's reader below reads every .safetensors file of the folder
    tensors = _read_hf_folder(src, cfg, progress)
    state = model_state(cfg, src, {"format": "transformers", "path": os.path.abspath(src)}, target)
    line = "verify: skipped (--no-verify)"
    with staged_dst(dst) as tmp:
        it_dir = _write(tmp, cfg, tensors.__getitem__, state, [src], target, progress)
        del tensors
        if verify:
            from transformers import AutoModelForCausalLM
            line = verify_hybrid_against(cfg, it_dir, lambda: AutoModelForCausalLM.from_pretrained(
                src, dtype=torch.float32), torch.float32, progress.quiet)
    log(f"convert: {src} (transformers {cfg.hf.model_type}, {cfg.num_parameters / 1e6:.2f}M parameters) -> "
        f"{dst} (hybrid checkpoint, model weights, iteration 0, chunks for tp {target.tp} x pp {target.pp}"
        f"{target.describe(cfg)})")
    log(line)
    return line


def _deepspeed_allowed() -> list:
    """The classes a DeepSpeed ZeRO checkpoint pickles beside tensors and containers (which torch's weights-only
    unpickler admits by itself): the ZeRO stage enum, the fp16 loss scalers, bf16's parameter-fragment addresses,
    and the argparse Namespace a Megatron-DeepSpeed run stores as `args`. Each is a plain data class: unpickling
    sets its fields and calls nothing else."""
    import argparse

    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address
    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address, argparse.Namespace]


class _WeightsOnlyTorch:
    """`torch` as DeepSpeed's zero_to_fp32 module sees it while we call it: its torch.load(..., weights_only=False)
    becomes torch.load(weights_only=True) under the allow-list, and a refusal is one line naming the file. (The
    DeepSpeed-MoE reader calls its `load` directly.)"""

    def __init__(self, allowed: list, kind: str = "DeepSpeed ZeRO checkpoint"):
        self.allowed = allowed
        self.kind = kind

    def __getattr__(self, name):
        return getattr(torch, name)

    def load(self, f, *args, **kwargs):
        kwargs["weights_only"] = True
        if isinstance(f, (str, os.PathLike)) and not os.path.isfile(f):  # a FIFO blocked torch.load's open for ever
            raise ValueError(f"SRC {f}: not a regular file (a FIFO, a device or a directory); copy the {self.kind} "
                             f"again")
        try:
            with torch.serialization.safe_globals(self.allowed):
                return torch.load(f, *args, **kwargs)
        except pickle.UnpicklingError as e:
            found = re.search(r"GLOBAL ([\w.]+)", str(e))
            if not found and "Unsupported operand" in str(e):  # not a pickle at all: no opcode torch knows
                raise ValueError(self.unreadable(f)) from None
            what = f"holds {found.group(1)}, which" if found else "holds an object that"
            raise ValueError(f"SRC {f}: {what} a {self.kind}'s allow-list does not admit (tensors, "
                             f"containers, {', '.join(c.__name__ for c in self.allowed)}); refused, nothing in it "
                             f"was run") from None
        except (EOFError, KeyError, RuntimeError):  # empty, a legacy pickle's bad magic number, a broken zip
            raise ValueError(self.unreadable(f)) from None

    def unreadable(self, f) -> str:
        """Round 19: these bytes ended the conversion as "DeepSpeed cannot read it (KeyError: 174812789)", the file
        unnamed."""
        return (f"SRC {f}: not a file torch.save wrote (empty, truncated or another format); copy the {self.kind} "
                f"again")


def _deepspeed_tag(src: str) -> str:
    """The checkpoint directory `latest` names, confined to `src` (DeepSpeed would join any path it holds)."""
    path = os.path.join(src, "latest")
    if not os.path.isfile(path):
        raise ValueError(f"SRC {path}: not a regular file (DeepSpeed's `latest` names the global_step directory)")
    with open(path, "rb") as f:
        tag = f.read(256).decode("utf-8", "replace").strip()
    where = os.path.join(src, tag)
    if not store.is_plain_name(tag) or not os.path.isdir(where) or os.path.islink(where):
        raise ValueError(f"SRC {path}: names {tag[:80]!r}, not a directory inside {src!r}; write the global_step "
                         f"directory's name there")
    links = [n for n in sorted(os.listdir(where)) if os.path.islink(os.path.join(where, n))]
    if links:
        raise ValueError(f"SRC {os.path.join(where, links[0])}: a symbolic link; a checkpoint's files are read from "
                         f"its own folder only")
    return tag


def _deepspeed_state_dict(src: str, cfg: ModelConfig) -> tuple[dict[str, torch.Tensor], str, bool]:
    """The weights of a DeepSpeed checkpoint, what it was, and whether it held DeepSpeed-MoE expert files. Such a
    one (expert files beside the module states) goes through deepspeed_moe.py's reader, under Mixtral's
    save_pretrained keys; any other through DeepSpeed's own consolidation of a ZeRO (1/2/3) checkpoint into one
    fp32 state dict (a live transformers module's keys). Either way every pickle is read with
    torch.load(weights_only=True) and an allow-list (_WeightsOnlyTorch): a checkpoint's files run no code."""
    from unittest import mock
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # reading needs no accelerator
    tag = _deepspeed_tag(src)
    if deepspeed_moe.is_moe_checkpoint(os.path.join(src, tag)):
        reader = _WeightsOnlyTorch(_deepspeed_allowed(), "DeepSpeed-MoE checkpoint")
        sd, detail = deepspeed_moe.mixtral_state_dict(os.path.join(src, tag), cfg, lambda f: reader.load(f, "cpu"))
        return sd, f"DeepSpeed-MoE checkpoint of {cfg.hf.model_type}: {detail}", True
    from deepspeed.utils import zero_to_fp32
    # (its tqdm bars and prints -- "Processing zero checkpoint ...", then the stage and counts -- would be lines
    # beside an error's one line; the conversion prints its own summary)
    with mock.patch.object(zero_to_fp32, "torch", _WeightsOnlyTorch(_deepspeed_allowed())), \
            mock.patch.object(zero_to_fp32, "tqdm", lambda it, *a, **k: it), \
            mock.patch.object(zero_to_fp32, "print", lambda *a, **k: None, create=True):
        try:
            sd = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(src, tag=tag)
        except ValueError:
            raise
        except Exception as e:  # DeepSpeed's own errors on a malformed folder: FileNotFoundError, KeyError, ...
            why = (str(e).strip().splitlines() or [""])[0][:200]
            raise ValueError(f"SRC {src}: DeepSpeed cannot read it as a ZeRO checkpoint ({type(e).__name__}: "
                             f"{why})") from None
    return ({k.removeprefix("module."): v for k, v in sd.items()}, f"DeepSpeed ZeRO checkpoint of {cfg.hf.model_type}",
            False)


def _from_saved_keys(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> torch.nn.Module:
    """transformers' model (fp32) loaded by its own from_pretrained from `tensors` under save_pretrained's keys
    (its conversion fuses per-expert keys into the live model's experts: a reference independent of ours)."""
    import tempfile

    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # (a bar beside the conversion's own two lines)
    try:
        with tempfile.TemporaryDirectory(prefix="hybrid-verify-") as d:
            hf_config(cfg, torch.float32).to_json_file(os.path.join(d, "config.json"))
            save_file({k: t.float().contiguous() for k, t in tensors.items()}, os.path.join(d, "model.safetensors"))
            return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _check_no_extra(cfg: ModelConfig, sd: dict[str, torch.Tensor], src: str) -> None:
    """Every tensor of a DeepSpeed-MoE checkpoint has a place in --model's Mixtral (none silently dropped)."""
    want = mapping.hf_shapes(cfg)
    extra = [k for k in sd if k not in want]
    if extra:
        raise ValueError(f"SRC {src}: holds {extra[0]!r}, which the {cfg.hf.model_type} model --model describes has "
                         f"no place for (a checkpoint of another model?)")


def deepspeed_to_hybrid(src: str, dst: str, model: str, verify: bool = True, log=print,
                        target: TargetLayout = TargetLayout(), progress: Progress = Progress()) -> str:
    """A DeepSpeed checkpoint -- ZeRO of a transformers model, or DeepSpeed-MoE of a Mixtral (deepspeed_moe.py)
    -- (`model`: its config folder, config.json or preset) -> a new hybrid checkpoint `dst` pre-sharded for
    `target`."""
    check_dst(dst)
    cfg = read_config(model, "--model")
    check_target(cfg, target)
    live, what, moe_layers = _deepspeed_state_dict(src, cfg)  # one call, with no line before it: its checks come
    # as it reads, and a bad file must be the one line printed (as DeepSpeed's own bars and prints are silenced)
    if moe_layers:
        _check_no_extra(cfg, live, src)
    sd = per_expert_state_dict(live, cfg.hf.model_type)  # MoE: transformers' fused experts -> per-expert keys
    bare = {k.split(".", 1)[1]: k for k in sd}

    def get(key: str) -> torch.Tensor:
        return sd[key] if key in sd else sd[bare[key.split(".", 1)[1]]]
    found = {k: tuple(get(k).shape) for k in mapping.hf_shapes(cfg) if k in sd or k.split(".", 1)[1] in bare}
    _check_shapes(cfg, found, f"SRC {src}")
    progress(f"read {src}: {len(found)} tensors, {size_text(sum(get(k).nbytes for k in found))} as saved")
    state = model_state(cfg, model, {"format": "deepspeed", "path": os.path.abspath(src)}, target)
    line = "verify: skipped (--no-verify)"
    with staged_dst(dst) as tmp:
        it_dir = _write(tmp, cfg, lambda k: get(k).float(), state, [model if os.path.isdir(model) else ""], target,
                        progress)
        if verify:
            def reference():
                if moe_layers:
                    return _from_saved_keys(cfg, {k: get(k) for k in found})
                from transformers import AutoModelForCausalLM
                m = AutoModelForCausalLM.from_config(cfg.hf, dtype=torch.float32)
                m.load_state_dict({k: get(k) for k in found} if sd is live else live, strict=False)
                return m
            line = verify_hybrid_against(cfg, it_dir, reference, torch.float32, progress.quiet)
    log(f"convert: {src} ({what}) -> {dst} (hybrid checkpoint, model "
        f"weights, iteration 0, chunks for tp {target.tp} x pp {target.pp}{target.describe(cfg)})")
    log(line)
    return line
