"""Read the ZeRO-relevant part of a DeepSpeed config (`--deepspeed-config ds.json`).

Only keys with a meaning here are read; every other key is returned by name so the caller can warn
about it -- nothing is dropped silently. Values are validated with errors that name the key.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

SUPPORTED = {
    "zero_optimization": {"stage", "offload_optimizer", "offload_param", "reduce_bucket_size"},
    "offload_optimizer": {"device", "pin_memory"},
    "offload_param": {"device", "pin_memory"},
    "bf16": {"enabled"},
    "fp16": {"enabled", "initial_scale_power", "loss_scale_window", "min_loss_scale"},
}
TOP_LEVEL = {"zero_optimization", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
             "train_batch_size", "gradient_clipping", "bf16", "fp16"}


@dataclass
class DeepSpeedSettings:
    """What a DeepSpeed config sets (None: not set there).

    Attributes:
        zero_stage: zero_optimization.stage.
        offload_optimizer / offload_params: offload_*.device == "cpu" ("none" = off; "nvme" is refused).
        micro_batch: train_micro_batch_size_per_gpu (sequences per micro-batch per rank).
        accumulation: gradient_accumulation_steps (micro-batches per step per DP rank).
        train_batch: train_batch_size (global batch; must equal micro x accumulation x dp).
        clip_grad: gradient_clipping.
        bf16 / fp16: the *.enabled flags.
        bucket_bytes: zero_optimization.reduce_bucket_size (elements in DeepSpeed; bytes here, x4).
        initial_loss_scale, loss_scale_window, min_loss_scale: fp16 dynamic loss scaling.
        unsupported: dotted names of the keys present but not read.
    """

    zero_stage: int | None = None
    offload_optimizer: bool | None = None
    offload_params: bool | None = None
    micro_batch: int | None = None
    accumulation: int | None = None
    train_batch: int | None = None
    clip_grad: float | None = None
    bf16: bool | None = None
    fp16: bool | None = None
    bucket_bytes: int | None = None
    initial_loss_scale: float | None = None
    loss_scale_window: int | None = None
    min_loss_scale: float | None = None
    unsupported: list[str] = field(default_factory=list)


def read_deepspeed_config(path: str) -> DeepSpeedSettings:
    if not os.path.isfile(path):
        raise ValueError(f"--deepspeed-config {path!r} is not a file")
    try:
        with open(path) as f:
            ds = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"--deepspeed-config {path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(ds, dict):
        raise ValueError(f"--deepspeed-config {path}: the top level must be a JSON object")
    out = DeepSpeedSettings(unsupported=[k for k in ds if k not in TOP_LEVEL])
    zero = _section(ds, "zero_optimization", out)
    out.zero_stage = _int(zero, "stage", "zero_optimization.stage")
    out.offload_optimizer = _offload(_section(zero, "offload_optimizer", out, "zero_optimization."),
                                     "zero_optimization.offload_optimizer.device")
    out.offload_params = _offload(_section(zero, "offload_param", out, "zero_optimization."),
                                  "zero_optimization.offload_param.device")
    if "reduce_bucket_size" in zero:
        out.bucket_bytes = 4 * _int(zero, "reduce_bucket_size", "zero_optimization.reduce_bucket_size")
    out.micro_batch = _int(ds, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu")
    out.accumulation = _int(ds, "gradient_accumulation_steps", "gradient_accumulation_steps")
    out.train_batch = _int(ds, "train_batch_size", "train_batch_size")
    if "gradient_clipping" in ds:
        out.clip_grad = float(ds["gradient_clipping"])
    for kind in ("bf16", "fp16"):
        sec = _section(ds, kind, out)
        if "enabled" in sec:
            setattr(out, kind, bool(sec["enabled"]))
    fp16 = ds.get("fp16", {}) if isinstance(ds.get("fp16"), dict) else {}
    if "initial_scale_power" in fp16:
        out.initial_loss_scale = 2.0 ** _int(fp16, "initial_scale_power", "fp16.initial_scale_power")
    out.loss_scale_window = _int(fp16, "loss_scale_window", "fp16.loss_scale_window")
    if "min_loss_scale" in fp16:
        out.min_loss_scale = float(fp16["min_loss_scale"])
    return out


def _section(parent: dict, key: str, out: DeepSpeedSettings, prefix: str = "") -> dict:
    sec = parent.get(key, {})
    if not isinstance(sec, dict):
        raise ValueError(f"--deepspeed-config: {prefix}{key} must be an object")
    out.unsupported += [f"{prefix}{key}.{k}" for k in sec if k not in SUPPORTED[key]]
    return sec


def _int(sec: dict, key: str, name: str) -> int | None:
    if key not in sec:
        return None
    value = sec[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"--deepspeed-config: {name} must be an integer, got {value!r} "
                         "('auto' values are not resolved here; write the number)")
    return value


def _offload(sec: dict, name: str) -> bool | None:
    if "device" not in sec:
        return None
    device = sec["device"]
    if device not in ("cpu", "none"):
        raise ValueError(f"--deepspeed-config: {name} {device!r} is not supported; use 'cpu' or 'none'")
    return device == "cpu"
