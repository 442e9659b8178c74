"""Which format a conversion source is in, from its files alone."""

from __future__ import annotations

import enum
import glob
import os

from hybrid.checkpoint import store


class Format(enum.Enum):
    HF = "transformers"  # config.json + model.safetensors(.index.json)
    HYBRID = "hybrid"  # DIR/latest + DIR/iter_NNNNNNN/ (or one iter_NNNNNNN/ directory itself)
    DEEPSPEED = "deepspeed"  # DIR/latest + DIR/global_step*/ (DeepSpeed's engine.save_checkpoint)


def is_iteration_dir(path: str) -> bool:
    """One checkpoint directory of a hybrid store (DCP's .metadata beside state.json)."""
    return os.path.isfile(os.path.join(path, ".metadata")) and os.path.isfile(os.path.join(path, store.STATE))


def detect(path: str, deepspeed: bool = True) -> Format:
    """The format of `path`; ValueError (one line, naming what was looked for) when it is none of them. `deepspeed`:
    whether the command reads a DeepSpeed checkpoint (`hybrid generate` does not, and its errors do not offer one)."""
    if not os.path.exists(path):
        raise ValueError(f"SRC {path!r} does not exist")
    if not os.path.isdir(path):
        kinds = "a transformers model folder, a hybrid checkpoint directory" + \
            (" or a DeepSpeed checkpoint folder" if deepspeed else " or one iter_*/ of it")
        raise ValueError(f"SRC {path!r} is a file; give a directory ({kinds})")
    if glob.glob(os.path.join(path, "global_step*")) and os.path.isfile(os.path.join(path, "latest")):
        return Format.DEEPSPEED
    if os.path.isfile(os.path.join(path, store.MEGATRON_TRACKER)):
        raise ValueError(f"SRC {path!r} is a Megatron-LM checkpoint ({store.MEGATRON_TRACKER}), which hybrid convert "
                         f"does not read; {store.MEGATRON_EXPORT}, then convert that folder")
    if store.is_checkpoint_dir(path) or is_iteration_dir(path):
        return Format.HYBRID
    has_weights = any(os.path.isfile(os.path.join(path, n))
                      for n in ("model.safetensors", "model.safetensors.index.json"))
    if has_weights and os.path.isfile(os.path.join(path, "config.json")):
        return Format.HF
    parent = os.path.dirname(os.path.normpath(path)) or "."
    if os.path.basename(os.path.normpath(path)).startswith("iter_") and store.is_checkpoint_dir(parent):
        raise ValueError(f"SRC {path!r} is not a complete checkpoint of {parent} (no .metadata or state.json: a save "
                         f"that did not finish, or a damaged copy); give {parent} (its newest complete one) -- `hybrid "
                         f"checkpoint inspect {parent}` lists them")  # (round 19: "not a transformers model folder")
    if has_weights:
        raise ValueError(f"SRC {path!r} has safetensors weights but no config.json; a transformers model folder "
                         f"holds both (save_pretrained writes them)")
    if os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"SRC {path!r} has a config.json but no model.safetensors(.index.json); save the model "
                         f"with save_pretrained(..., safe_serialization=True) (.bin weights are not read)")
    if not deepspeed:
        raise ValueError(f"SRC {path!r} is not a transformers model folder (config.json + model.safetensors) nor a "
                         f"hybrid checkpoint (latest + iter_*/)")
    raise ValueError(f"SRC {path!r} is not a transformers model folder (config.json + model.safetensors), a "
                     f"hybrid checkpoint (latest + iter_*/) or a DeepSpeed checkpoint (latest + global_step*/)")
