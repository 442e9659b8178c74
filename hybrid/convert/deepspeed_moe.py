"""DeepSpeed-MoE checkpoints (`deepspeed.moe.layer.MoE` layers saved by `engine.save_checkpoint`) -> the
per-expert transformers keys of a Mixtral model, which to_hybrid.py then writes like any other source.

What DeepSpeed 0.19 writes into DIR/<tag>/ (deepspeed/runtime/engine.py):

    mp_rank_00_model_states.pt      "module": every parameter but the experts (`_get_non_moe_state_dict`), the
                                    gates `<P>.deepspeed_moe.gate.wg.weight` (E, h) included; "num_experts": E of
                                    each MoE layer, in module order
    layer_<i>_expert_<e>_mp_rank_00_model_states.pt
                                    expert e (numbered globally: `_save_moe_checkpoint` turns a rank's local id l
                                    into ep_rank x E / EP + l) of the i-th MoE module in `named_modules` order, its
                                    keys `<P>.deepspeed_moe.experts.deepspeed_experts.<e>.<name>`

so the files hold each expert exactly once, whatever expert-parallel size saved them. The map onto Mixtral:

    <P>.deepspeed_moe.gate.wg.weight                 -> model.layers.<L>.block_sparse_moe.gate.weight
    <P>...deepspeed_experts.<e>.w1 | gate_proj       -> model.layers.<L>.block_sparse_moe.experts.<e>.w1
    <P>...deepspeed_experts.<e>.w3 | up_proj         -> ... .w3
    <P>...deepspeed_experts.<e>.w2 | down_proj       -> ... .w2
    every other key                                  -> itself (the model around the MoE layers is a transformers
                                                        Mixtral with its MLPs replaced: P = model.layers.<L>.<...>)

It maps because the math is the same: an expert that is a bias-free SwiGLU, w2(silu(w1 x) * w3 x) (Mixtral's
expert block, or a Llama MLP's down(silu(gate x) * up x)); DeepSpeed's gate takes softmax(x W_g^T) over all E
experts, then its top-2 (`top2gating`) or top-k (`topkgating`) divides the k chosen probabilities by their sum,
as Mixtral does. The top-k itself is not in the files: it is --model's num_experts_per_tok.

Refused, one line each, by name: residual MoE (`use_residual`: a dense MLP mixed in by a learned coefficient,
no Mixtral counterpart); an expert of another shape (biases, a GELU MLP, ...); a missing expert file; a top-1
--model (DeepSpeed's top-1 scales by the softmax probability, Mixtral's renormalised top-1 by 1); a model that
is not Mixtral (Qwen2-MoE's shared expert has no DeepSpeed-MoE counterpart) or has a layer without experts;
tensor-parallel (mp_rank_01..) and ZeRO-3 saves; AutoEP layers; the pre-0.6 `expert_<e>_mp_rank_XX` layout.
Training-time routing (capacity and token dropping, random token selection, jitter, the 2nd expert's Gumbel
sampling) is a setting of the run, not a weight: hybrid runs dropless unless --moe-expert-capacity-factor.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import torch

from models.config import ModelConfig

MAIN = "mp_rank_00_model_states.pt"
EXPERT_FILE = re.compile(r"layer_(\d+)_expert_(\d+)_mp_rank_(\d+)_model_states\.pt")
OLD_EXPERT_FILE = re.compile(r"expert_(\d+)_mp_rank_(\d+)_model_states\.pt")
GATE = "deepspeed_moe.gate.wg.weight"
EXPERTS = "deepspeed_moe.experts.deepspeed_experts."
# the SwiGLU expert's parameter names DeepSpeed's files may carry -> Mixtral's (w1 gate, w3 up, w2 down)
SWIGLU = ({"w1.weight": "w1", "w3.weight": "w3", "w2.weight": "w2"},
          {"gate_proj.weight": "w1", "up_proj.weight": "w3", "down_proj.weight": "w2"})
_LAYER = re.compile(r"model\.layers\.(\d+)\.")

Load = Callable[[str], dict]


def is_moe_checkpoint(tag_dir: str) -> bool:
    """The tag directory holds DeepSpeed-MoE expert files (either layout)."""
    return any(EXPERT_FILE.fullmatch(n) or OLD_EXPERT_FILE.fullmatch(n) for n in os.listdir(tag_dir))


def _check_files(tag_dir: str) -> None:
    """One mp rank, no ZeRO-3 partitions, the per-layer expert layout, the module states present."""
    names = sorted(os.listdir(tag_dir))
    for n in names:
        if OLD_EXPERT_FILE.fullmatch(n):
            raise ValueError(f"SRC {os.path.join(tag_dir, n)}: the pre-0.6 DeepSpeed-MoE layout (one file per expert "
                             f"for all layers) is not read; load it in DeepSpeed and save it again")
        m = re.search(r"mp_rank_(\d+)", n)
        if m and int(m.group(1)) != 0:
            raise ValueError(f"SRC {os.path.join(tag_dir, n)}: saved with tensor (model) parallelism > 1; a "
                             f"DeepSpeed-MoE import reads an mp-size-1 checkpoint (hybrid cannot know how your "
                             f"model split its tensors); merge the mp ranks first")
        if n.startswith("zero_pp_rank_") and n.endswith("_model_states.pt"):
            raise ValueError(f"SRC {os.path.join(tag_dir, n)}: a ZeRO-3 save of a DeepSpeed-MoE model (its non-expert "
                             f"weights partitioned over the ranks' files) is not imported; save under ZeRO 0-2")
    if MAIN not in names:
        raise ValueError(f"SRC {tag_dir}: no {MAIN} beside the expert files (DeepSpeed writes the non-expert "
                         f"weights and gates there)")


def _moe_prefixes(module: dict, where: str) -> list[tuple[str, int]]:
    """(module prefix P ending in '.', transformer layer L) of each DeepSpeed MoE layer, in the module order of
    the state dict: the order of DeepSpeed's layer_<i> files (both walk named_modules)."""
    out = []
    for key in module:
        if key.endswith(GATE):
            prefix = key[:-len(GATE)]
            m = _LAYER.match(prefix)
            if m is None:
                raise ValueError(f"SRC {where}: MoE gate {key!r} is not inside a decoder layer "
                                 f"(model.layers.<L>.); a Mixtral import needs one MoE block per layer")
            out.append((prefix, int(m.group(1))))
    return out


def _check_model(cfg: ModelConfig, main: dict, moe: list[tuple[str, int]], where: str) -> None:
    """--model is a Mixtral of k >= 2 whose every layer holds one DeepSpeed MoE block of E experts."""
    if cfg.hf.model_type != "mixtral":
        why = ("its shared expert has no DeepSpeed-MoE counterpart" if cfg.hf.model_type == "qwen2_moe"
               else "it has no experts")
        raise ValueError(f"--model is a {cfg.hf.model_type} model and SRC a DeepSpeed-MoE checkpoint: its experts "
                         f"import into a Mixtral config only ({why})")
    if cfg.moe_top_k < 2:
        raise ValueError("--model has num_experts_per_tok 1: DeepSpeed's top-1 gate scales a token by its softmax "
                         "probability, Mixtral's renormalised top-1 by 1, so no Mixtral computes that model; "
                         "top-k >= 2 maps")
    if main.get("ds_autoep_layers"):
        raise ValueError(f"SRC {where}: holds DeepSpeed AutoEP layers (ds_autoep_layers), which are not imported; "
                         f"deepspeed.moe.layer.MoE checkpoints are")
    layers = [L for _, L in moe]
    missing = [L for L in range(cfg.num_layers) if L not in layers]
    if missing:
        raise ValueError(f"SRC {where}: layer {missing[0]} has no DeepSpeed MoE block, but Mixtral (--model) has "
                         f"experts in every layer")
    twice = [L for L in layers if layers.count(L) > 1]
    if twice:
        raise ValueError(f"SRC {where}: layer {twice[0]} holds two DeepSpeed MoE blocks; Mixtral has one")
    counts = main.get("num_experts")
    if list(counts or []) != [cfg.num_experts] * len(moe):
        raise ValueError(f"SRC {where}: num_experts {counts} per MoE layer, but --model has "
                         f"{cfg.num_experts} experts in each of its {cfg.num_layers} layers")
    for key in main["module"]:
        for prefix, _ in moe:
            if key.startswith(prefix) and not key.endswith(GATE):
                if key.startswith((prefix + "coefficient.", prefix + "mlp.")):
                    raise ValueError(f"SRC {where}: {key} is a residual MoE's (use_residual=True: a dense MLP mixed "
                                     f"with the experts by a learned coefficient), which Mixtral has no place for")
                raise ValueError(f"SRC {where}: {key} is inside MoE block {prefix[:-1]} but is neither its gate nor "
                                 f"an expert; not imported")


def _expert_names(file: str, prefix: str, e: int, keys: list[str]) -> dict[str, str]:
    """The expert's parameter names in `file` -> Mixtral's (w1, w3, w2); one line when they are not a SwiGLU."""
    head = f"{prefix}{EXPERTS}{e}."
    stray = [k for k in keys if not k.startswith(head)]
    if stray:
        raise ValueError(f"SRC {file}: holds {stray[0]!r}, not a tensor of expert {e} of {prefix[:-1]} (DeepSpeed "
                         f"names each file's tensors with the expert's global number)")
    names = sorted(k[len(head):] for k in keys)
    for table in SWIGLU:
        if set(names) == set(table):
            return {head + n: table[n] for n in names}
    raise ValueError(f"SRC {file}: the expert has parameters {', '.join(names)}; hybrid's experts are bias-free "
                     f"SwiGLUs (w1, w3, w2 as Mixtral's, or gate_proj, up_proj, down_proj), another expert shape "
                     f"is not imported")


def mixtral_state_dict(tag_dir: str, cfg: ModelConfig, load: Load) -> tuple[dict[str, torch.Tensor], str]:
    """Every tensor of the DeepSpeed-MoE checkpoint in `tag_dir` under Mixtral's save_pretrained keys, as saved
    (dtype unchanged), each file read through `load` (torch.load with weights_only and an allow-list); and a
    phrase describing what was read."""
    _check_files(tag_dir)
    main = load(os.path.join(tag_dir, MAIN))
    module = {k.removeprefix("module."): v for k, v in main["module"].items()}
    moe = _moe_prefixes(module, os.path.join(tag_dir, MAIN))
    _check_model(cfg, dict(main, module=module), moe, os.path.join(tag_dir, MAIN))
    expected = {f"layer_{i}_expert_{e}_mp_rank_00_model_states.pt"
                for i in range(len(moe)) for e in range(cfg.num_experts)}
    extra = sorted(n for n in os.listdir(tag_dir) if EXPERT_FILE.fullmatch(n) and n not in expected)
    if extra:
        raise ValueError(f"SRC {os.path.join(tag_dir, extra[0])}: an expert file for an MoE layer or expert the "
                         f"module states do not have ({len(moe)} layers x {cfg.num_experts} experts)")
    out = {}
    for key, t in module.items():
        hit = next(((p, L) for p, L in moe if key.startswith(p)), None)
        out[key if hit is None else f"model.layers.{hit[1]}.block_sparse_moe.gate.weight"] = t
    for i, (prefix, L) in enumerate(moe):
        for e in range(cfg.num_experts):
            file = os.path.join(tag_dir, f"layer_{i}_expert_{e}_mp_rank_00_model_states.pt")
            if not os.path.isfile(file):
                raise ValueError(f"SRC {file}: missing; DeepSpeed writes one file per expert of each MoE layer "
                                 f"(expert {e} of layer {L}); without it the expert's weights are unknown")
            tensors = load(file)
            for key, name in _expert_names(file, prefix, e, list(tensors)).items():
                out[f"model.layers.{L}.block_sparse_moe.experts.{e}.{name}.weight"] = tensors[key]
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in out.values()})
    return out, (f"{len(moe)} MoE layers x {cfg.num_experts} experts from "
                 f"{len(moe) * cfg.num_experts} expert files, {'/'.join(dtypes)} weights as saved")
