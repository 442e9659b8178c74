"""Command-line flags of the training entry point and every check that needs no process group.

Flags follow Megatron-LM's names. The data-parallel size and the number of micro-batches are derived:
dp = world / (tp * pp), micro-batches per step = global batch / (micro batch * dp). `check_args` raises
ValueError naming the flag and the fix; `hybrid.train.main` turns it into one line before any process group.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import torch

from hybrid.data import BYTE_VOCAB, BatchSpec
from hybrid.fault import args as fault_args
from hybrid.mesh import ParallelDims, validate_model_dims
from hybrid.partition import PartitionMethod, parse_layers_per_stage, partition_layers, stage_costs_from_config
from hybrid.pipeline import ScheduleKind
from hybrid.zero import CpuAdam, Precision, ZeroConfig
from hybrid.zero.ds_config import read_deepspeed_config
from models import Recompute, load_config
from models.config import ModelConfig

DESCRIPTION = "Train a GPT-2 or Llama-family model with tensor, pipeline and data parallelism."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=DESCRIPTION)
    g = p.add_argument_group("model and data")
    g.add_argument("--model", default="tiny-gpt2", help="preset name or a transformers model/config directory")
    g.add_argument("--load", default=None, help="transformers checkpoint directory to start from (safetensors)")
    g.add_argument("--data-path", default=None, help="UTF-8 text file (default: Python's pydoc topics)")
    g.add_argument("--seq-length", type=int, default=128)
    g = p.add_argument_group("parallelism")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--sequence-parallel", action="store_true", help="split norms/dropout along the sequence")
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None,
                   help="layers per model chunk; v = layers / (pp * this) chunks per rank (interleaved 1F1B)")
    g.add_argument("--pipeline-schedule", choices=[k.value for k in ScheduleKind], default=None,
                   help="default: interleaved with virtual stages, else 1f1b")
    g.add_argument("--pipeline-partition", choices=("uniform", "balanced"), default="uniform",
                   help="balanced: split layers by FLOPs, counting the embedding and the LM head")
    g.add_argument("--pipeline-layers-per-stage", default=None, help="layers of each stage by hand, e.g. 3,5,5,3")
    g.add_argument("--recompute-granularity", choices=[r.value for r in Recompute if r is not Recompute.NONE],
                   default=None, help="recompute activations in backward: selective (attention core) or full (block)")
    g.add_argument("--timeline", default=None, help="write the last step's per-rank Chrome trace (JSON) here")
    g.add_argument("--micro-batch-size", type=int, default=4)
    g.add_argument("--global-batch-size", type=int, default=None, help="default: micro batch x dp")
    g.add_argument("--auto-parallel", action="store_true",
                   help="let the planner choose tp, pp, v, micro batch, ZeRO stage, offload and SP for this world "
                        "size and device memory (needs --global-batch-size)")
    g.add_argument("--hardware", default=None, help="with --auto-parallel: a `hybrid calibrate` profile (JSON) "
                                                    "to plan with instead of the device preset")
    g = p.add_argument_group("optimization")
    g.add_argument("--train-iters", type=int, default=100)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--min-lr", type=float, default=1e-4)
    g.add_argument("--lr-warmup-iters", type=int, default=10)
    g.add_argument("--lr-decay-style", choices=("constant", "cosine"), default="cosine")
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.95)
    g.add_argument("--clip-grad", type=float, default=1.0, help="clip to this global gradient norm (0: off)")
    g.add_argument("--seed", type=int, default=1234)
    g = p.add_argument_group("ZeRO and mixed precision")
    g.add_argument("--zero-stage", type=int, default=0, help="0 DP, 1 optimizer states, 2 + gradients, 3 + parameters")
    g.add_argument("--offload-optimizer", action="store_true", help="fp32 master weights, Adam and its step on the CPU")
    g.add_argument("--offload-params", action="store_true", help="stage 3: parameter shards in CPU memory")
    g.add_argument("--zero3-keep-gathered", action="store_true",
                   help="stage 3: gather each layer once per step (all micro-batches), reduce-scatter once")
    g.add_argument("--zero-bucket-bytes", type=int, default=25 * 2**20, help="stages 0-2 gradient bucket size")
    g.add_argument("--cpu-adam", choices=[c.value for c in CpuAdam], default="auto",
                   help="offloaded step: DeepSpeed's CPU Adam (auto: when it builds) or torch's")
    g.add_argument("--bf16", action="store_true", help="bf16 compute, fp32 master weights")
    g.add_argument("--fp16", action="store_true", help="fp16 compute, fp32 master weights, dynamic loss scaling")
    g.add_argument("--deepspeed-config", default=None,
                   help="DeepSpeed JSON: its zero_optimization / batch / clipping / bf16 / fp16 keys override the flags")
    g.add_argument("--log-interval", type=int, default=10)
    fault_args.add_arguments(p)
    return p.parse_args(argv)


@dataclass(frozen=True)
class PipelinePlan:
    """How the model is cut: the schedule, chunks per rank, each global stage's layer ids."""

    kind: ScheduleKind
    v: int
    stages: list[tuple[int, ...]]


def check_pipeline(args: argparse.Namespace, cfg: ModelConfig, dims: ParallelDims, batch: BatchSpec) -> PipelinePlan:
    v = 1
    if args.num_layers_per_virtual_pipeline_stage is not None:
        per = args.num_layers_per_virtual_pipeline_stage
        if per < 1 or cfg.num_layers % (dims.pp * per):
            raise ValueError(f"--num-layers-per-virtual-pipeline-stage {per} must divide the {cfg.num_layers} layers "
                             f"/ --pipeline-model-parallel-size {dims.pp}")
        v = cfg.num_layers // (dims.pp * per)
    kind = ScheduleKind(args.pipeline_schedule or ("interleaved" if v > 1 else "1f1b"))
    if kind is ScheduleKind.INTERLEAVED and v == 1 and dims.pp > 1:
        raise ValueError("--pipeline-schedule interleaved needs --num-layers-per-virtual-pipeline-stage")
    if kind is not ScheduleKind.INTERLEAVED and v > 1:
        raise ValueError(f"--num-layers-per-virtual-pipeline-stage needs --pipeline-schedule interleaved, not {kind.value}")
    m = batch.num_micro_batches
    if kind is ScheduleKind.INTERLEAVED and m % dims.pp:
        raise ValueError(f"interleaved 1F1B needs the micro-batches per step ({m} = --global-batch-size / "
                         f"(--micro-batch-size x dp)) to be a multiple of --pipeline-model-parallel-size {dims.pp}")
    if args.pipeline_layers_per_stage:
        stages = partition_layers(cfg.num_layers, dims.pp, v,
                                  layers_per_stage=parse_layers_per_stage(args.pipeline_layers_per_stage))
    elif args.pipeline_partition == "balanced":
        costs = stage_costs_from_config(cfg, args.seq_length, args.micro_batch_size)
        stages = partition_layers(cfg.num_layers, dims.pp, v, method=PartitionMethod.BALANCED, **costs.as_kwargs())
    else:
        stages = partition_layers(cfg.num_layers, dims.pp, v)
    return PipelinePlan(kind=kind, v=v, stages=stages)


def apply_deepspeed_config(args: argparse.Namespace, world: int) -> list[str]:
    """Overwrite the flags a DeepSpeed config sets; returns the keys it has that are not read."""
    ds = read_deepspeed_config(args.deepspeed_config)
    for attr, value in (("zero_stage", ds.zero_stage), ("offload_optimizer", ds.offload_optimizer),
                        ("offload_params", ds.offload_params), ("micro_batch_size", ds.micro_batch),
                        ("clip_grad", ds.clip_grad), ("bf16", ds.bf16), ("fp16", ds.fp16),
                        ("zero_bucket_bytes", ds.bucket_bytes)):
        if value is not None:
            setattr(args, attr, value)
    args.loss_scaling = {k: v for k, v in (("initial_loss_scale", ds.initial_loss_scale),
                                           ("loss_scale_window", ds.loss_scale_window),
                                           ("min_loss_scale", ds.min_loss_scale)) if v is not None}
    dp = world // (args.tensor_model_parallel_size * args.pipeline_model_parallel_size) or 1
    if ds.accumulation is not None:
        args.global_batch_size = args.micro_batch_size * dp * ds.accumulation
    if ds.train_batch is not None:
        if args.global_batch_size is not None and ds.train_batch != args.global_batch_size:
            raise ValueError(f"--deepspeed-config: train_batch_size {ds.train_batch} != train_micro_batch_size_per_gpu "
                             f"x gradient_accumulation_steps x dp = {args.global_batch_size}; make them agree")
        args.global_batch_size = ds.train_batch
    return ds.unsupported


def check_zero(args: argparse.Namespace) -> ZeroConfig:
    if args.bf16 and args.fp16:
        raise ValueError("--bf16 and --fp16 are exclusive; choose one")
    if args.clip_grad < 0:
        raise ValueError(f"--clip-grad must be >= 0 (0 disables clipping), got {args.clip_grad}")
    precision = Precision.BF16 if args.bf16 else Precision.FP16 if args.fp16 else Precision.FP32
    return ZeroConfig(stage=args.zero_stage, precision=precision, offload_optimizer=args.offload_optimizer,
                      offload_params=args.offload_params, keep_gathered=args.zero3_keep_gathered,
                      bucket_bytes=args.zero_bucket_bytes, cpu_adam=CpuAdam(args.cpu_adam),
                      **getattr(args, "loss_scaling", {}))


def check_args(args: argparse.Namespace, world: int) -> tuple[ModelConfig, ParallelDims, BatchSpec, PipelinePlan]:
    """Every check that needs no process group; raises ValueError naming the flag and the fix.
    Also sets `args.zero` (the ZeroConfig) and `args.ds_unsupported` (DeepSpeed keys not read)."""
    args.ds_unsupported = apply_deepspeed_config(args, world) if args.deepspeed_config else []
    args.zero = check_zero(args)
    args.fault = fault_args.check(args)
    for flag in ("seq_length", "micro_batch_size", "train_iters", "log_interval"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.lr <= 0:
        raise ValueError(f"--lr must be > 0, got {args.lr}")
    cfg = load_config(args.model)
    dims = ParallelDims.from_world(world, tp=args.tensor_model_parallel_size, pp=args.pipeline_model_parallel_size)
    validate_model_dims(dims, cfg.num_heads, cfg.num_kv_heads, cfg.num_layers)
    if args.seq_length > cfg.max_position_embeddings:
        raise ValueError(f"--seq-length {args.seq_length} exceeds the model's {cfg.max_position_embeddings} "
                         f"positions; use at most {cfg.max_position_embeddings}")
    if args.sequence_parallel and args.seq_length % dims.tp:
        raise ValueError(f"--sequence-parallel needs --seq-length ({args.seq_length}) divisible by "
                         f"--tensor-model-parallel-size ({dims.tp})")
    if cfg.vocab_size < BYTE_VOCAB:
        raise ValueError(f"--model vocabulary ({cfg.vocab_size}) is smaller than the {BYTE_VOCAB} byte tokens")
    gbs = args.global_batch_size or args.micro_batch_size * dims.dp
    batch = BatchSpec(global_batch=gbs, micro_batch=args.micro_batch_size, seq_length=args.seq_length, dp=dims.dp)
    if args.timeline and not os.path.isdir(os.path.dirname(os.path.abspath(args.timeline))):
        raise ValueError(f"--timeline {args.timeline}: its directory does not exist")
    return cfg, dims, batch, check_pipeline(args, cfg, dims, batch)


def apply_auto_parallel(args: argparse.Namespace, world: int) -> None:
    """Ask the planner for the fastest layout that fits (hybrid/planner) and set the layout flags from it.

    The device is this process's: a CUDA GPU's memory and the nearest GPU preset, or on CPU the `cpu`
    preset with this machine's memory shared by the local ranks. Recomputation is pinned off (train.py has
    none); the planner models our runtime exactly on CPU (fp32, flash attention: docs/planner.md)."""
    import dataclasses

    from hybrid.planner import ActivationProfile, Cluster, Precision, Recompute, SearchSpace, Workload, hardware, search

    if args.global_batch_size is None:
        raise ValueError("--auto-parallel needs --global-batch-size (the planner picks the micro-batch)")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        kind = next((k for k in ("h200", "h100-80g") if k.split("-")[0] in props.name.lower()), "a100-80g")
        hw = dataclasses.replace(hardware(kind), memory_gb=props.total_memory / 1e9)
        profile = ActivationProfile.KORTHIKANTI
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        hw = dataclasses.replace(hardware("cpu"), memory_gb=total / local / 1e9, gpus_per_node=local)
        profile = ActivationProfile.FP32_FLASH
    precision = Precision.MIXED if (args.bf16 or args.fp16) else Precision.FP32
    if args.hardware:
        from hybrid.planner import calibrate
        if not os.path.isfile(args.hardware):
            raise ValueError(f"--hardware {args.hardware!r} is not a file; write one with `hybrid calibrate --out FILE`")
        hw = calibrate.load_hardware(args.hardware, precision).with_overrides(memory_gb=hw.memory_gb)
    work = Workload(load_config(args.model), global_batch=args.global_batch_size, seq_length=args.seq_length,
                    precision=precision, activations=profile)
    result = search(work, Cluster(gpus=world, hw=hw), SearchSpace(recompute=(Recompute.NONE,)), top=1)
    if not result.plans:
        raise ValueError(f"--auto-parallel: no layout of {args.model} fits {world} x {hw.memory_gb:.1f} GB; "
                         f"run `hybrid plan` to see why")
    lay = result.plans[0].layout
    args.tensor_model_parallel_size, args.pipeline_model_parallel_size = lay.tp, lay.pp
    args.micro_batch_size, args.zero_stage, args.sequence_parallel = lay.micro_batch, int(lay.zero), lay.sequence_parallel
    args.offload_optimizer = lay.offload.value != "none"
    args.offload_params = lay.offload.value == "optimizer+params"
    args.num_layers_per_virtual_pipeline_stage = (work.model.num_layers // (lay.pp * lay.v)) if lay.v > 1 else None
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"auto-parallel: tp {lay.tp} x pp {lay.pp} (v {lay.v}) x dp {lay.dp}, micro-batch {lay.micro_batch}, "
              f"ZeRO {int(lay.zero)}, offload {lay.offload.value}, sp {lay.sequence_parallel} "
              f"(predicted {result.plans[0].time.total:.3g} s/step on {hw.name})", flush=True)


