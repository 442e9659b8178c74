"""hybrid checkpoint (any layout, any ZeRO stage) -> a transformers folder AutoModelForCausalLM loads.

A hybrid checkpoint holds each parameter once, as its global tensor (`model/NAME`, the fp32 master weights,
TP-unsharded and without vocabulary padding) cut into whatever chunks the saving ranks owned. A DCP load with
no process group of one key into one full-size tensor gathers its chunks, whatever layout wrote them -- the
analogue of DeepSpeed's zero_to_fp32. Keys are loaded one at a time, fused into transformers' layout (GPT-2's
c_attn) and streamed into safetensors files (safetensors_out.py): the process never holds more than one
transformers tensor and its pieces.
"""

from __future__ import annotations

import os

import torch

from hybrid.checkpoint import safe_read, store
from hybrid.convert import mapping
from hybrid.convert.common import Progress, check_dst, copy_pass_through, hf_config, read_config, staged_dst
from hybrid.convert.detect import is_iteration_dir
from hybrid.convert.safetensors_out import write_sharded
from hybrid.convert.tokenizer_out import export_tokenizer
from hybrid.convert.verify import verify_hybrid_against
from models.config import ModelConfig


def iteration_dir(src: str, iteration: int | None) -> str:
    """The complete, intact checkpoint directory to export: `src` itself when it is one, else `iteration`'s
    (default: the one `latest` names) in the store `src`."""
    if is_iteration_dir(src):
        _check_iteration_of_its_own_dir(src, iteration)
        it_dir = src
    else:
        done = store.complete_iterations(src)
        if not done:
            raise ValueError(f"SRC {src!r} holds no complete checkpoint (only unfinished saves)")
        if iteration is not None and iteration not in done:
            raise ValueError(f"--iteration {iteration}: {src!r} has no complete checkpoint of it (it has "
                             f"{', '.join(map(str, done[-5:]))})")
        pick = iteration if iteration is not None else (store.read_latest(src) or done[-1])
        it_dir = store.final_path(src, pick)
    v = store.verify_all(it_dir)
    if v.error:
        raise ValueError(f"SRC {v.error}")
    return it_dir


def _check_iteration_of_its_own_dir(src: str, iteration: int | None) -> None:
    """SRC one iter_NNNNNNN/ is that iteration: an --iteration naming another would be ignored (round 19: `hybrid
    convert ck/iter_0000003 out --iteration 0` exported iteration 3 and said nothing)."""
    named = store.iteration_of(src)
    if iteration is None or named == iteration:
        return
    store_dir = os.path.dirname(os.path.normpath(src)) or "."
    what = f"iteration {named}'s folder" if named is not None else "one checkpoint's folder"
    raise ValueError(f"--iteration {iteration}: SRC {src!r} is {what}; give the checkpoint directory "
                     f"({store_dir} --iteration {iteration}) or drop --iteration")


def checkpoint_config(it_dir: str, model: str | None) -> ModelConfig:
    """--model when given, else the config.json a conversion wrote, else the --model the run was trained with
    (state.json)."""
    if model is not None:
        return read_config(model, "--model")
    for d in (it_dir, os.path.dirname(os.path.abspath(it_dir))):
        if os.path.isfile(os.path.join(d, "config.json")):
            return read_config(d, f"SRC config {d}/config.json")
    saved = store.read_state(it_dir).get("model")
    if not saved:
        raise ValueError(f"SRC {it_dir}: state.json names no model; give --model (its preset or config folder)")
    try:
        return read_config(saved, "the run's --model")
    except ValueError as e:
        raise ValueError(f"{e}; give --model (the preset or config folder it was trained with)") from None


def check_against(cfg: ModelConfig, it_dir: str) -> dict:
    """Every parameter the config implies is in the checkpoint with that shape, and nothing else is."""
    meta = safe_read.read_metadata(it_dir).state_dict_metadata  # restricted unpickler, checked, confined
    ours = {f"model/{p.name}": p.shape for p in mapping.params(cfg)}
    for key, shape in ours.items():
        if key not in meta:
            raise ValueError(f"SRC {it_dir}: no tensor {key}; the checkpoint is of another model than the config "
                             f"({cfg.hf.model_type}, {cfg.num_layers} layers); give --model with its config")
        if tuple(meta[key].size) != shape:
            raise ValueError(f"SRC {it_dir}: {key} has shape {list(meta[key].size)}, the config implies "
                             f"{list(shape)}; give --model with the config it was trained with")
    extra = sorted(k for k in meta if k.startswith("model/") and k not in ours)
    if extra:
        raise ValueError(f"SRC {it_dir}: {extra[0]} (and {len(extra) - 1} more) is not a parameter of the "
                         f"config's model; give --model with the config it was trained with")
    return meta


def hybrid_to_hf(src: str, dst: str, dtype: torch.dtype = torch.float32, max_shard_bytes: int = 5 * 10**9,
                 model: str | None = None, iteration: int | None = None, verify: bool = True, log=print,
                 progress: Progress = Progress()) -> str:
    """Export the hybrid checkpoint `src` as a new transformers folder `dst`; the verification line. `progress`:
    the lines of the long phases (each tensor read and written, the verification), `log`: the summary."""
    check_dst(dst)
    it_dir = iteration_dir(src, iteration)
    cfg = checkpoint_config(it_dir, model)
    meta = check_against(cfg, it_dir)

    def read(p: mapping.Param) -> torch.Tensor:
        key = f"model/{p.name}"
        t = torch.empty(p.shape, dtype=meta[key].properties.dtype)
        safe_read.load({key: t}, it_dir, no_dist=True)
        return t
    stored = mapping.hf_shapes(cfg)
    shapes = {k: stored[k] for k in mapping.hf_keys(cfg)}  # the order hf_tensors yields them in
    line = "verify: skipped (--no-verify)"
    with staged_dst(dst) as tmp:
        # the small files first: a tokenizer refused (a link, not a tokenizer) is the one line, before the weights
        hf_config(cfg, dtype).to_json_file(os.path.join(tmp, "config.json"))
        state = store.read_state(it_dir)
        saved = state.get("model") or ""
        carried = copy_pass_through([it_dir, os.path.dirname(os.path.abspath(it_dir)),
                                     saved if os.path.isdir(saved) else ""], tmp)
        tokenizer = export_tokenizer(tmp, carried, state, cfg.max_position_embeddings)  # AutoTokenizer loads it
        files = write_sharded(tmp, shapes, mapping.hf_tensors(cfg, read), dtype, max_shard_bytes, progress)
        if verify:  # our model from SRC against transformers' reading of what was just written
            from transformers import AutoModelForCausalLM
            line = verify_hybrid_against(cfg, it_dir, lambda: AutoModelForCausalLM.from_pretrained(
                tmp, dtype=torch.float32), dtype, progress.quiet)
    log(f"convert: {it_dir} (hybrid checkpoint, {cfg.hf.model_type}, {cfg.num_parameters / 1e6:.2f}M parameters) "
        f"-> {dst} (transformers, {len(files)} safetensors file{'s' if len(files) > 1 else ''}, "
        f"{str(dtype).removeprefix('torch.')})")
    log(tokenizer)
    log(line)
    return line
