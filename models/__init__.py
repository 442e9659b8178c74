"""The model zoo: GPT-2 and the Llama family, built on hybrid's tensor-parallel layers.

The configs (models.config, models.presets) and the recomputation enum import no torch, so the planner and
`hybrid plan` read a model without the runtime; the modules that need torch (the models, their layers) are
imported on first use of their names here (PEP 562 `__getattr__`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybrid.lazy import lazy_names
from models.config import ARCH_GPT2, ModelConfig, from_hf, load_config
from models.presets import PRESETS
from models.recompute import Recompute

if TYPE_CHECKING:
    import torch.nn as nn

    from hybrid.tp import TPContext
    from models.common import StageLayout

# name -> the module that defines it, imported on first access (each brings torch)
_LAZY = {"GPT2": "models.gpt2", "Llama": "models.llama", "StageLayout": "models.common",
         "set_recompute": "models.common", "shift_labels": "models.common"}
__getattr__ = lazy_names("models", _LAZY, globals())


def build_model(cfg: ModelConfig, tp: TPContext, stage: StageLayout | None = None, seed: int | None = 1234,
                pad_vocab_to: int = 1, recompute: Recompute = Recompute.NONE, moe=None) -> nn.Module:
    """The model (or one pipeline stage of it) for this TP rank; initialised from `seed` so every
    layout starts from the same full weights (seed=None leaves them to a checkpoint load). `moe`: the
    hybrid.moe.layer.ExpertContext of an MoE model (its flags and expert-parallel group)."""
    from hybrid.tp import init_parameters
    from models.common import set_recompute
    from models.gpt2 import GPT2
    from models.llama import Llama
    if cfg.arch == ARCH_GPT2:
        model = GPT2(cfg, tp, stage=stage, pad_vocab_to=pad_vocab_to)
    else:
        model = Llama(cfg, tp, stage=stage, pad_vocab_to=pad_vocab_to, moe=moe)
    if cfg.num_experts:
        from hybrid.moe.runtime import link_moe_layers
        link_moe_layers(model, cfg)
    model = set_recompute(model, recompute)
    if seed is not None:
        init_parameters(model, seed, tp.rank)
    return model


def build_pipeline_chunks(cfg: ModelConfig, tp: TPContext, pp_rank: int, pp: int, v: int = 1,
                          stages: list[tuple[int, ...]] | None = None, seed: int | None = 1234,
                          pad_vocab_to: int = 1, recompute: Recompute = Recompute.NONE,
                          stage_ids: list[int] | None = None, moe=None) -> nn.ModuleList:
    """This pipeline rank's v model chunks. Chunk c is global stage c*pp + pp_rank (Megatron's
    interleaved layout) unless `stage_ids` lists the global stage of each chunk (ZBV's V: pp_rank and
    2 pp - 1 - pp_rank); `stages` gives each global stage's layer ids (default: hybrid.partition's
    uniform split)."""
    import torch.nn as nn

    from hybrid.partition import partition_layers
    from models.common import StageLayout
    stages = stages or partition_layers(cfg.num_layers, pp, v)
    last = pp * v - 1
    stage_ids = stage_ids if stage_ids is not None else [c * pp + pp_rank for c in range(v)]
    return nn.ModuleList(
        build_model(cfg, tp, StageLayout(layer_ids=stages[s], first=s == 0, last=s == last), seed=seed,
                    pad_vocab_to=pad_vocab_to, recompute=recompute, moe=moe)
        for s in stage_ids)


__all__ = ["Recompute", "build_pipeline_chunks", "set_recompute", "GPT2", "Llama", "ModelConfig", "PRESETS", "StageLayout", "build_model", "from_hf", "load_config",
           "shift_labels"]
