"""Read the ZeRO-relevant part of a DeepSpeed config (`--deepspeed-config ds.json`).

Only keys with a meaning here are read; every other key is returned by name so the caller can warn
about it -- nothing is dropped silently. Values are validated with errors that name the key.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field

from hybrid.cliutil import in_range, is_integer, json_problem

SUPPORTED = {
    "zero_optimization": {"stage", "offload_optimizer", "offload_param", "reduce_bucket_size"},
    "offload_optimizer": {"device", "pin_memory"},
    "offload_param": {"device", "pin_memory"},
    "bf16": {"enabled"},
    "fp16": {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "min_loss_scale"},
    "data_types": {"grad_accum_dtype"},
}
TOP_LEVEL = {"zero_optimization", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
             "train_batch_size", "gradient_clipping", "bf16", "fp16", "data_types", "optimizer"}
GRAD_ACCUM_DTYPES = ("fp32", "bf16", "fp16")


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
        grad_accum_dtype: data_types.grad_accum_dtype ("fp32", "bf16" or "fp16"): the dtype gradients
            accumulate in; "fp32" under bf16/fp16 is --accumulate-allreduce-grads-in-fp32.
        optimizer: optimizer.type lower-cased ("adam", "adamw", "onebitadam").
        freeze_step: OneBitAdam's optimizer.params.freeze_step (`--onebit-freeze-iters`; hybrid/compress/args.py
            checks it against the flag); None for any other optimizer.
        lr, beta1, beta2, weight_decay: optimizer.params.lr, .betas[0], .betas[1], .weight_decay (--lr,
            --adam-beta1, --adam-beta2, --weight-decay).
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
    grad_accum_dtype: str | None = None
    optimizer: str | None = None
    freeze_step: int | None = None
    lr: float | None = None
    beta1: float | None = None
    beta2: float | None = None
    weight_decay: float | None = None
    unsupported: list[str] = field(default_factory=list)


def read_deepspeed_config(path: str) -> DeepSpeedSettings:
    """Read and type-check `path`; every error names the key (dotted) and what to write instead. The file is
    opened here only, once per command line (hybrid/train/args.deepspeed_settings keeps what it returns): every
    check reads these settings, so a file rewritten during the checks cannot give two configs."""
    ds = _load_json(path)
    _check_spelling(ds)
    _check_optimizer(ds)
    out = DeepSpeedSettings(unsupported=[k for k in ds if k not in TOP_LEVEL])
    _read_optimizer(ds, out)
    _refuse_scheduler(ds, out.lr)
    zero = _section(ds, "zero_optimization", out)
    out.zero_stage = _int(zero, "stage", "zero_optimization.stage", 0, 3)
    out.offload_optimizer = _offload(_section(zero, "offload_optimizer", out, "zero_optimization."),
                                     "zero_optimization.offload_optimizer")
    out.offload_params = _offload(_section(zero, "offload_param", out, "zero_optimization."),
                                  "zero_optimization.offload_param")
    bucket = _int(zero, "reduce_bucket_size", "zero_optimization.reduce_bucket_size", 1)
    out.bucket_bytes = None if bucket is None else 4 * bucket
    out.micro_batch = _int(ds, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu", 1)
    out.accumulation = _int(ds, "gradient_accumulation_steps", "gradient_accumulation_steps", 1)
    out.train_batch = _int(ds, "train_batch_size", "train_batch_size", 1)
    out.clip_grad = _float(ds, "gradient_clipping", "gradient_clipping", 0.0)
    for kind in ("bf16", "fp16"):
        setattr(out, kind, _bool(_section(ds, kind, out), "enabled", f"{kind}.enabled"))
    fp16 = ds.get("fp16", {})
    static = _float(fp16, "loss_scale", "fp16.loss_scale", 0.0)
    if static:  # DeepSpeed: 0 (its default) = dynamic scaling, any other value a fixed scale the run never changes
        raise ValueError(f"--deepspeed-config: fp16.loss_scale {static:g} is a static loss scale, which train.py "
                         "does not run (it scales dynamically); set it to 0 or remove it "
                         "(fp16.initial_scale_power sets the dynamic scale's start)")
    power = _int(fp16, "initial_scale_power", "fp16.initial_scale_power", 0, MAX_SCALE_POWER)
    out.initial_loss_scale = None if power is None else 2.0 ** power
    out.loss_scale_window = _int(fp16, "loss_scale_window", "fp16.loss_scale_window", 1)
    out.min_loss_scale = _float(fp16, "min_loss_scale", "fp16.min_loss_scale", 0.0, low_open=True)
    accum = _section(ds, "data_types", out).get("grad_accum_dtype")
    if accum is not None and accum not in GRAD_ACCUM_DTYPES:
        raise ValueError(f"--deepspeed-config: data_types.grad_accum_dtype must be one of "
                         f"{', '.join(map(json.dumps, GRAD_ACCUM_DTYPES))}, got {json.dumps(accum)}")
    out.grad_accum_dtype = accum
    return out


# DeepSpeed's other top-level keys (its config docs): present in real configs, not read here (a warning names them)
DEEPSPEED_KEYS = {"optimizer", "scheduler", "amp", "steps_per_print", "wall_clock_breakdown", "dump_state",
                  "prescale_gradients", "gradient_predivide_factor", "sparse_gradients", "zero_allow_untested_optimizer",
                  "zero_force_ds_cpu_optimizer", "activation_checkpointing", "flops_profiler", "tensorboard", "wandb",
                  "csv_monitor", "comms_logger", "autotuning", "elasticity", "aio", "communication_data_type",
                  "compression_training", "curriculum_learning", "data_efficiency", "pipeline", "checkpoint",
                  "memory_breakdown", "timers", "monitor_config", "seq_parallel_communication_data_type",
                  "torch_autocast", "compile", "nebula", "hybrid_engine", "sparse_attention", "eigenvalue",
                  "progressive_layer_drop", "quantize_training", "weight_quantization", "dataloader_drop_last",
                  "use_data_before_expert_parallelism", "graph_harvesting", "disable_allgather", "fp32_allreduce"}
OPTIMIZERS = {"adam", "adamw", "onebitadam"}  # what train.py runs for a DeepSpeed optimizer section

# round 22: the ignored keys a DeepSpeed user's config has most often, with what does their job here (the warning
# said only "ignored": wall_clock_breakdown true looked like a breakdown asked for and lost)
IGNORED_INSTEAD = {
    "steps_per_print": "the log line every --log-interval steps",
    "wall_clock_breakdown": "per-rank step times and the time split every --timing-log-interval log intervals",
    "tensorboard": "--tensorboard-dir DIR",
    "csv_monitor": "--metrics-file FILE (JSON lines)",
    "wandb": "not implemented: --tensorboard-dir DIR or --metrics-file FILE",
    "activation_checkpointing": "--recompute-granularity full or selective",
    "flops_profiler": "TFLOP/s on every log line, MFU with --hardware or --peak-tflops",
    **{f"zero_optimization.{k}": "`hybrid convert CKPT OUT` writes a checkpoint's whole weights (docs/convert.md)"
       for k in ("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save")},
}


def ignored_line(keys) -> str:
    """The start-up warning naming the keys present but not read, each with what does its job here where there is
    something (IGNORED_INSTEAD)."""
    named = [f"{k} ({IGNORED_INSTEAD[k]})" if k in IGNORED_INSTEAD else k for k in keys]
    return f"--deepspeed-config keys not supported, ignored: {', '.join(named)}"


def _check_spelling(ds: dict) -> None:
    """A top-level key that is none of DeepSpeed's but one edit from a key hybrid reads is a misspelling: refused,
    since ignoring it (a warning) would train with another ZeRO stage, batch or precision than the file meant."""
    import difflib
    for key in ds:
        if key in TOP_LEVEL or key in DEEPSPEED_KEYS:
            continue
        close = difflib.get_close_matches(key, sorted(TOP_LEVEL), n=1, cutoff=0.85)
        if close:
            raise ValueError(f"--deepspeed-config: {json.dumps(key)} is not a DeepSpeed key; did you mean "
                             f"{json.dumps(close[0])}?")


def _check_optimizer(ds: dict) -> None:
    """An optimizer section names the optimizer the file was written for: train.py runs AdamW (lr, betas, eps,
    weight decay from the flags) or OneBitAdam (hybrid/compress); another type is refused, not swapped for AdamW."""
    opt = ds.get("optimizer")
    if opt is None:
        return
    kind = opt.get("type") if isinstance(opt, dict) else None
    if not isinstance(kind, str) or kind.lower() not in OPTIMIZERS:
        hint = "use --optimizer sgd with --sgd-momentum" if isinstance(kind, str) and kind.lower() == "sgd" else \
            "remove the optimizer section (train.py's AdamW takes --lr, --adam-beta1/2, --weight-decay)"
        raise ValueError(f"--deepspeed-config: optimizer.type {json.dumps(kind)} is not one train.py runs "
                         f"(Adam, AdamW, OneBitAdam); {hint}")


# optimizer.params keys: what each means here. DeepSpeed passes params to the optimizer's constructor (its
# engine.py _configure_basic_optimizer); "Adam" runs decoupled weight decay unless adam_w_mode is false.
READ_PARAMS = {"lr", "betas", "weight_decay", "eps", "adam_w_mode", "bias_correction", "amsgrad"}
KERNEL_PARAMS = {"torch_adam", "fp32_optimizer_states", "cuda_aware", "comm_backend_name"}  # which kernel or
# backend runs the same math: not read (a warning names them), the result is the same
ONEBIT_PARAMS = {"freeze_step"}  # hybrid/compress/args.py reads it
ADAM_EPS = 1e-8  # hybrid.train_step.OptimizerConfig.eps: no flag sets it (DeepSpeed's and torch's default too)


def _refuse_param(key: str, kind: str, onebit: bool) -> None:
    """An optimizer.params key train.py does not read: a near spelling of one it reads is named (freez_step was
    "remove it", which would drop the 1-bit warm-up the file meant; round 23), any other key is to be removed."""
    import difflib
    valid = READ_PARAMS | KERNEL_PARAMS | (ONEBIT_PARAMS if onebit else set())
    close = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.75)
    fix = f"did you mean {close[0]}?" if close else "remove it"
    raise ValueError(f"--deepspeed-config: optimizer.params.{key} is not one train.py reads for {kind} (lr, betas, "
                     f"eps, weight_decay{', freeze_step' if onebit else ''}); {fix}")


def _read_optimizer(ds: dict, out: DeepSpeedSettings) -> None:
    """optimizer.params: lr, betas and weight_decay set --lr, --adam-beta1/2 and --weight-decay; eps,
    adam_w_mode, bias_correction and amsgrad are checked against what train.py runs; any other key is refused by
    name (it would change the math, and train.py would not)."""
    opt = ds.get("optimizer")
    if opt is None:
        return
    out.optimizer = opt["type"].lower()
    params = opt.get("params", {})
    if not isinstance(params, dict):
        raise ValueError(f"--deepspeed-config: optimizer.params must be an object, got {json.dumps(params)}")
    for key in params:
        if key in KERNEL_PARAMS:
            out.unsupported.append(f"optimizer.params.{key}")
        elif key not in READ_PARAMS and not (key in ONEBIT_PARAMS and out.optimizer == "onebitadam"):
            _refuse_param(key, opt["type"], out.optimizer == "onebitadam")
    out.lr = _float(params, "lr", "optimizer.params.lr", 0.0, low_open=True)
    if out.optimizer == "onebitadam":
        if "freeze_step" not in params:
            raise ValueError(f"--deepspeed-config: optimizer OneBitAdam needs params.freeze_step (the Adam warm-up "
                             f"steps, --onebit-freeze-iters)")
        out.freeze_step = _int(params, "freeze_step", "optimizer.params.freeze_step", 1)
    out.weight_decay = _float(params, "weight_decay", "optimizer.params.weight_decay", 0.0)
    if _given(params, "betas"):
        betas = params["betas"]
        if not (isinstance(betas, list) and len(betas) == 2):
            raise ValueError(f"--deepspeed-config: optimizer.params.betas must be a list of two numbers in [0, 1), "
                             f"got {json.dumps(betas)}")
        for i, name in enumerate(("beta1", "beta2")):
            value = _float({"b": betas[i]}, "b", f"optimizer.params.betas[{i}]", 0.0)
            if value >= 1:
                raise ValueError(f"--deepspeed-config: optimizer.params.betas[{i}] must be in [0, 1), got {value}")
            setattr(out, name, value)
    eps = _float(params, "eps", "optimizer.params.eps", 0.0, low_open=True)
    if eps is not None and eps != ADAM_EPS:
        raise ValueError(f"--deepspeed-config: optimizer.params.eps {eps:g} is not one train.py runs (Adam's eps is "
                         f"{ADAM_EPS:g}, no flag sets it); write {ADAM_EPS:g} or remove the key")
    for key, want in (("bias_correction", True), ("amsgrad", False)):
        if _bool(params, key, f"optimizer.params.{key}") not in (None, want):
            raise ValueError(f"--deepspeed-config: optimizer.params.{key} {json.dumps(not want)} is not one train.py "
                             f"runs (Adam with bias correction, no AMSGrad); remove the key")
    if _bool(params, "adam_w_mode", "optimizer.params.adam_w_mode") is False and out.weight_decay and \
            out.optimizer == "adam":
        raise ValueError("--deepspeed-config: optimizer.params.adam_w_mode false with weight_decay > 0 is Adam's L2 "
                         "penalty; train.py runs AdamW's decoupled decay (--weight-decay): remove adam_w_mode or "
                         "set weight_decay 0")


SCHEDULERS = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR")


def _refuse_scheduler(ds: dict, opt_lr: float | None) -> None:
    """A scheduler section is refused, with the nearest train.py flags. None of DeepSpeed's three has an exact
    equivalent (deepspeed/runtime/lr_schedules.py; tests/test_dsjson_inputs.py runs them): the engine steps the
    scheduler after each optimizer step, so steps 0 and 1 both run at warmup_min_lr and step k >= 1 at
    (k - 1) / N of the peak (linear; log: log(k) / log(N)), where Megatron's warm-up (--lr-warmup-iters W) runs
    step k at k / W. With W = N + 1 (WarmupLR, WarmupDecayLR; D = total_num_steps + 1) or W = N (WarmupCosineLR,
    whose decay counts one step sooner; D = total_num_steps) the warm-up ends and the decay runs on DeepSpeed's
    steps exactly; only the ramp differs, so the user must choose it, not be given it silently."""
    sch = ds.get("scheduler")
    if sch is None:
        return
    kind = sch.get("type") if isinstance(sch, dict) else None
    params = sch.get("params", {}) if isinstance(sch, dict) else {}
    flags = "--lr, --lr-warmup-iters, --lr-decay-style, --lr-decay-iters, --min-lr"
    if kind not in SCHEDULERS or not isinstance(params, dict):
        raise ValueError(f"--deepspeed-config: scheduler.type {json.dumps(kind)} is not one train.py runs; remove "
                         f"the scheduler section and set the schedule with {flags}")
    if AUTO in params.values():  # the HF Trainer's template: its schedule comes from its own arguments
        raise ValueError(f"--deepspeed-config: scheduler {kind} with \"auto\" params is the HF Trainer's template "
                         f"(it fills them from its arguments); remove the scheduler section and set the schedule "
                         f"with {flags}")
    n = max(2, _int(params, "warmup_num_steps", "scheduler.params.warmup_num_steps", 1) or 1000)  # DeepSpeed's
    total = _int(params, "total_num_steps", "scheduler.params.total_num_steps", 1)
    peak = opt_lr if kind == "WarmupCosineLR" else _float(params, "warmup_max_lr", "scheduler.params.warmup_max_lr",
                                                          0.0, low_open=True) or opt_lr
    why = ["its warm-up runs steps 0 and 1 at the start rate and step k at (k - 1) / warmup_num_steps of the peak, "
           "Megatron's step k at k / --lr-warmup-iters"]
    if params.get("warmup_type", "log") != "linear":
        why.append("warmup_type log (DeepSpeed's default) ramps as log(k) / log(warmup_num_steps)")
    start = "warmup_min_ratio" if kind == "WarmupCosineLR" else "warmup_min_lr"
    if params.get(start, 0) != 0:
        why.append(f"{start} is not 0 (train.py warms up from 0)")
    cosine = kind == "WarmupCosineLR"
    near = ([f"--lr {peak:g}"] if peak else []) + [f"--lr-warmup-iters {n if cosine else n + 1}"]
    if kind == "WarmupLR":
        near.append("--lr-decay-style constant")
    else:
        near += ["--lr-decay-style " + ("cosine" if cosine else "linear")]
        near += [f"--lr-decay-iters {total if cosine else total + 1}"] if total else []
        ratio = params.get("cos_min_ratio", 0.0001) if cosine else 0.0
        near.append(f"--min-lr {ratio * peak:g}" if peak else ("--min-lr 0" if not cosine else
                                                                f"--min-lr {ratio:g} x --lr"))
    raise ValueError(f"--deepspeed-config: scheduler {kind} has no exact train.py equivalent ({'; '.join(why)}); "
                     f"remove the scheduler section and pass the nearest flags: {' '.join(near)}")


MAX_SCALE_POWER = 127  # 2**127 is the largest power of two a float32 holds; the loss scale is one


def _load_json(path: str) -> dict:
    if not os.path.isfile(path):
        raise ValueError(f"--deepspeed-config {path!r} is not a file")

    def no_constant(name: str):
        raise ValueError(f"--deepspeed-config {path}: {name} is not a JSON number; write a finite number")
    try:
        with open(path, encoding="utf-8") as f:
            ds = json.load(f, parse_constant=no_constant)
    except json.JSONDecodeError as e:
        raise ValueError(f"--deepspeed-config {path}: not valid JSON ({json_problem(e)})") from None
    except UnicodeDecodeError:
        raise ValueError(f"--deepspeed-config {path}: not UTF-8 text; save the JSON as UTF-8") from None
    except (ValueError, RecursionError) as e:  # nesting deeper than the parser's stack, a 5000-digit number
        if str(e).startswith("--deepspeed-config"):  # no_constant's own
            raise
        raise ValueError(f"--deepspeed-config {path}: not a JSON file hybrid reads ({type(e).__name__}: "
                         f"{(str(e).splitlines() or [''])[0][:80]})") from None
    except OSError as e:
        raise ValueError(f"--deepspeed-config {path}: cannot read it ({e.strerror})") from None
    if not isinstance(ds, dict):
        raise ValueError(f"--deepspeed-config {path}: the top level must be a JSON object")
    return ds


# the keys DeepSpeed (0.19.8) itself accepts in the sections it validates with pydantic models that forbid any other
# (DeepSpeedZeroConfig, DeepSpeedZeroOffload{Optimizer,Param}Config, DeepSpeedFP16Config, DeepSpeedBF16Config, their
# aliases included): a key outside both these and SUPPORTED is one DeepSpeed would refuse too -- a misspelling
# ("stag"), refused here rather than warned about and ignored (the run would get another ZeRO stage than the file's)
DEEPSPEED_SECTION_KEYS = {
    "zero_optimization": {
        "allgather_bucket_size", "allgather_partitions", "allgather_sequential", "compute_grad_norm",
        "contiguous_gradients", "cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory", "elastic_checkpoint",
        "enable_sanity_checks", "gather_16bit_weights_on_model_save", "ignore_unused_parameters", "leaf_module",
        "legacy_stage1", "load_from_fp32_weights", "log_trace_cache_warnings", "max_live_parameters",
        "max_reuse_distance", "memory_efficient_linear", "model_persistence_threshold", "module_granularity_threshold",
        "overlap_comm", "override_module_apply", "param_persistence_threshold", "parameter_alignment",
        "pipeline_loading_checkpoint", "prefetch_bucket_size", "reduce_scatter", "round_robin_gradients",
        "save_muon_momentum_buffer_in_memory", "stage3_allgather_sequential",
        "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save", "stage3_max_live_parameters", "stage3_max_reuse_distance",
        "stage3_model_persistence_threshold", "stage3_module_granularity_threshold",
        "stage3_param_persistence_threshold", "stage3_prefetch_bucket_size", "stage3_use_all_reduce_for_fetch_params",
        "sub_group_size", "use_all_reduce_for_fetch_params", "use_multi_rank_bucket_allreduce", "zenflow",
        "zero_hpz_partition_size", "zero_quantized_gradients", "zero_quantized_nontrainable_weights",
        "zero_quantized_weights"},
    "offload_optimizer": {"buffer_count", "cpuadam_cores_perc", "fast_init", "nvme_path", "pipeline_read",
                          "pipeline_write", "ratio", "super_offload"},
    "offload_param": {"buffer_count", "buffer_size", "max_in_cpu", "nvme_path"},
    "fp16": {"auto_cast", "consecutive_hysteresis", "fp16_master_weights_and_grads", "hysteresis"},
    "bf16": {"bf16_master_weights_and_grads", "bf16_optimizer_states", "check_grad_overflow", "immediate_grad_update"},
}


def _section(parent: dict, key: str, out: DeepSpeedSettings, prefix: str = "") -> dict:
    sec = parent.get(key, {})
    if not isinstance(sec, dict):
        raise ValueError(f"--deepspeed-config: {prefix}{key} must be an object, got {json.dumps(sec)}")
    _check_section_keys(sec, f"{prefix}{key}", key)
    out.unsupported += [f"{prefix}{key}.{k}" for k in sec if k not in SUPPORTED[key]]
    return sec


def _check_section_keys(sec: dict, name: str, key: str) -> None:
    """A key of a section DeepSpeed validates that is neither read here nor one of DeepSpeed's: ValueError naming it
    (dotted) with the closest key (the ones read here first: "stag" is "stage"), as DeepSpeed's own model refuses
    it ("Extra inputs are not permitted")."""
    import difflib
    known = DEEPSPEED_SECTION_KEYS.get(key)
    if known is None:  # data_types: read by DeepSpeed with dict.get, its other keys ignored there too
        return
    for k in sec:
        if k in SUPPORTED[key] or k in known:
            continue
        close = difflib.get_close_matches(k, sorted(SUPPORTED[key]), n=1, cutoff=0.75) or \
            difflib.get_close_matches(k, sorted(known), n=1, cutoff=0.75)
        read = ", ".join(map(json.dumps, sorted(SUPPORTED[key])))
        hint = f"; did you mean {json.dumps(close[0])}?" if close else f" (train.py reads {read}); remove it"
        raise ValueError(f"--deepspeed-config: {name}.{k} is not a DeepSpeed key{hint}")


MAX_INT = 1 << 53  # above any count or size a run has (and exactly a float64): JSON allows 1e400-digit integers


AUTO = "auto"  # the HF Trainer's DeepSpeed configs: "take it from the command line" -- here, the flag or its default


def _given(sec: dict, key: str) -> bool:
    """`key` sets a value: present and not "auto". The HF Trainer fills "auto" from its arguments (its
    integrations/deepspeed.py); train.py's flags are those arguments, so "auto" leaves the flag's value (given, or its
    default) as an absent key does, and the file's other keys still apply."""
    return key in sec and sec[key] != AUTO


def _int(sec: dict, key: str, name: str, low: int, high: int | None = MAX_INT) -> int | None:
    if not _given(sec, key):
        return None
    value = sec[key]
    if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_INT:
        value = int(value)  # 5e8, as DeepSpeed's docs write bucket sizes: JSON's number, an integer's value
    if not is_integer(value):
        raise ValueError(f"--deepspeed-config: {name} must be an integer, got {json.dumps(value)}; write the number "
                         f"(or \"auto\": the flag's value)")
    if not in_range(value, low, high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        shown = value if abs(value) < 10**30 else f"an integer of {len(str(abs(value)))} digits"
        raise ValueError(f"--deepspeed-config: {name} must be {bound}, got {shown}")
    return value


def _float(sec: dict, key: str, name: str, low: float, low_open: bool = False) -> float | None:
    if not _given(sec, key):
        return None
    value = sec[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"--deepspeed-config: {name} must be a number, got {json.dumps(value)}")
    try:
        value = float(value)
    except OverflowError:  # an integer beyond any float
        raise ValueError(f"--deepspeed-config: {name} must be a finite number, got an integer of "
                         f"{len(str(abs(sec[key])))} digits") from None
    if not math.isfinite(value):  # 1e999 parses as inf
        raise ValueError(f"--deepspeed-config: {name} must be a finite number, got {json.dumps(sec[key])}")
    if not in_range(value, low, low_open=low_open):
        raise ValueError(f"--deepspeed-config: {name} must be {'>' if low_open else '>='} {low:g}, got {value}")
    return value


def _bool(sec: dict, key: str, name: str) -> bool | None:
    """JSON true/false only: the string "false" is truthy in Python and must not switch a mode on."""
    if not _given(sec, key):
        return None
    value = sec[key]
    if not isinstance(value, bool):
        raise ValueError(f"--deepspeed-config: {name} must be true or false (JSON booleans), got {json.dumps(value)}")
    return value


def _offload(sec: dict, name: str) -> bool | None:
    if "pin_memory" in sec:
        _bool(sec, "pin_memory", f"{name}.pin_memory")
    if "device" not in sec:
        return None
    device = sec["device"]
    if device not in ("cpu", "none"):
        raise ValueError(f"--deepspeed-config: {name}.device {device!r} is not supported; "
                         "use 'cpu' or 'none'")
    return device == "cpu"


def deepspeed_origins(ds: DeepSpeedSettings, explicit: set[str], flags: tuple[tuple[str, str, str], ...]
                      ) -> dict[str, str]:
    """Which train.py flags took their value from the DeepSpeed config (not given on the command line): flag ->
    the JSON key. `flags`: (dest, key, settings field) triples the caller applies (hybrid/train/args.DS_FLAGS);
    the global batch comes from train_batch_size, or the micro-batch x gradient_accumulation_steps."""
    out = {f"--{dest.replace('_', '-')}": key for dest, key, attr in flags
           if getattr(ds, attr) is not None and dest not in explicit}
    if ds.freeze_step is not None and "optimizer" not in explicit:  # "type": "OneBitAdam" set --optimizer
        out["--optimizer onebit-adam"] = 'optimizer.type "OneBitAdam"'
    if "global_batch_size" not in explicit:
        if ds.train_batch is not None:
            out["--global-batch-size"] = "train_batch_size"
        elif ds.accumulation is not None:
            out["--global-batch-size"] = "train_micro_batch_size_per_gpu x gradient_accumulation_steps"
        elif ds.micro_batch is not None:
            out["--global-batch-size"] = "train_micro_batch_size_per_gpu (x dp)"
    return out


def name_keys(message: str, origins: dict[str, str]) -> str:
    """A later check's message with each flag the DeepSpeed config set named by its JSON key instead: the user
    gave `gradient_clipping`, not --clip-grad."""
    for flag, key in origins.items():
        message = re.sub(re.escape(flag) + r"(?![\w-])", f"--deepspeed-config {key}", message)
    return message
