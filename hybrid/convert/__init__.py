"""Model conversion: transformers <-> hybrid checkpoints, DeepSpeed ZeRO and DeepSpeed-MoE -> hybrid (docs/convert.md).

    hybrid convert path/to/hf_model ckpt/          # transformers -> hybrid (model weights, iteration 0)
    hybrid convert ckpt/ exported/ --dtype bf16    # hybrid (any layout, any ZeRO stage) -> transformers
    hybrid convert ds_run/ ckpt/ --model cfg_dir   # DeepSpeed ZeRO checkpoint -> hybrid
    hybrid convert ds_moe/ ckpt/ --model mixtral   # DeepSpeed-MoE (per-expert files) -> hybrid Mixtral
    hybrid convert hf/ ckpt/ --target-tensor-parallel-size 2 --target-pipeline-parallel-size 2   # pre-sharded
    hybrid generate ckpt/ --prompt "..." [--temperature 0.8 --top-p 0.9]      # the sanity check after

A hybrid checkpoint holds every parameter as its global (TP-unsharded, unpadded) tensor under `model/NAME`
(hybrid/checkpoint/core.py), cut into the chunks the saving ranks held, so conversion is a single process with
no process group: DCP reads whole global tensors out of any chunks, a conversion writes the chunks a run at
the target layout would (presharded.py), and a later multi-rank load at any layout reshards by itself.
"""

from hybrid.convert.detect import Format, detect
from hybrid.convert.to_hf import hybrid_to_hf
from hybrid.convert.to_hybrid import deepspeed_to_hybrid, hf_to_hybrid

__all__ = ["Format", "deepspeed_to_hybrid", "detect", "hf_to_hybrid", "hybrid_to_hf"]

import warnings

# DCP warns on every no-process-group load/save that it assumes one process: that is the design here
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
