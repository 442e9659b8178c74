"""Which model a checkpoint holds: its config's fields and a hash of them, recorded in state.json -- not the
path it was trained from.

    identity = model_identity(cfg)     # {"config": {"arch": "llama", "hidden_size": 64, ...}, "sha256": "3fa2..."}
    why = mismatch(state, it_dir, identity, "--model path")   # None, or one line naming the first differing field

The config is every field of models.config.ModelConfig that decides the parameters' shapes or the function
they compute (architecture, sizes, heads, biases, norm epsilon, activation, sliding window), in the dataclass's
order; the dropout probabilities are left out (a resumed run may change them, as Megatron's --hidden-dropout
may). The same config.json under another path is the same model; an edited one under the same path is not.
The hash (sha256 of the canonical JSON, 16 hex digits) is what `hybrid checkpoint inspect` shows.

A checkpoint saved before identities were recorded is compared through the config its `model` names (or the
config.json a conversion wrote beside it); when neither is readable, by the name itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

NOT_IDENTITY = ("dropout", "embedding_dropout", "attention_dropout")  # a resume may change these


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value


def config_fields(cfg) -> dict:
    """The identity fields of a ModelConfig, in declaration order (JSON values)."""
    return {f.name: _jsonable(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)
            if f.compare and f.name not in NOT_IDENTITY}


def digest(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def model_identity(cfg) -> dict:
    """What state.json records of the model: {"config": fields, "sha256": digest}."""
    fields = config_fields(cfg)
    return {"config": fields, "sha256": digest(fields)}


def _defaults(cfg_type) -> dict:
    out = {}
    for f in dataclasses.fields(cfg_type):
        if f.default is not dataclasses.MISSING:
            out[f.name] = _jsonable(f.default)
    return out


def first_difference(saved: dict, current: dict, defaults: dict | None = None) -> tuple[str, object, object] | None:
    """(field, saved value, current value) of the first identity field that differs; a field the saved config
    lacks (saved by an older hybrid) counts as its default."""
    defaults = defaults or {}
    for key, value in current.items():
        old = saved.get(key, defaults.get(key, "<absent>"))
        if old != value:
            return key, old, value
    return None


def _legacy_fields(state: dict, directory: str) -> dict | None:
    """The identity of a checkpoint saved without one: its `model`'s config, else the config.json beside it."""
    from models import load_config
    for source in (state.get("model"), os.path.join(directory, "config.json"),
                   os.path.join(os.path.dirname(os.path.abspath(directory)), "config.json")):
        if source and (os.path.sep not in source or os.path.exists(source)):
            try:
                return config_fields(load_config(source))
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return None


def mismatch(state: dict, directory: str, identity: dict, model: str, cfg_type=None) -> str | None:
    """None when the checkpoint in `directory` (its state.json `state`) holds the model `identity` describes;
    else one line naming the first differing field and the fix. `model` is the --model given (for the message)."""
    saved = state.get("model_identity")
    fields = saved.get("config") if isinstance(saved, dict) else None
    if not isinstance(fields, dict):
        fields = _legacy_fields(state, directory)
    if fields is None:
        if state.get("model") == model:
            return None
        return (f"--load {directory} holds model {state.get('model')!r}, whose config is not readable here, and "
                f"this run trains {model!r}; give the --model it was saved with")
    defaults = _defaults(cfg_type) if cfg_type is not None else {}
    diff = first_difference(fields, identity["config"], defaults)
    if diff is None:
        return None
    key, old, new = diff
    return (f"--load {directory} holds another model: its {key} is {json.dumps(old)}, --model {model} has "
            f"{json.dumps(new)}; give the --model it was saved with (its config is compared, not its path: saved "
            f"as {state.get('model')!r})")


def shape_mismatch(meta, cfg, directory: str) -> str | None:
    """The first `model/NAME` tensor of DCP's metadata whose size is not the one `cfg`'s model has (or that it
    lacks), or an Adam moment (`optim.exp_avg/NAME`, `optim.exp_avg_sq/NAME`, when saved) of another size, one line;
    None when every parameter is there with its shape."""
    import torch

    from hybrid.comm import Group
    from hybrid.tp import TPContext
    from models import build_model
    sizes = meta.state_dict_metadata
    with torch.device("meta"):  # names and full (tp 1, unpadded) shapes, no memory
        model = build_model(cfg, TPContext(Group.solo("tp")), seed=None)
    for name, p in model.named_parameters():
        key = f"model/{name}"
        if key not in sizes:
            return f"--load {directory}: its metadata has no tensor {key}, which --model's model has"
        for k in (key, f"optim.exp_avg/{name}", f"optim.exp_avg_sq/{name}"):
            if k in sizes and tuple(sizes[k].size) != tuple(p.shape):
                return (f"--load {directory}: {k} is saved with shape {list(sizes[k].size)}, --model's model has "
                        f"{list(p.shape)}")
    return None
