"""ZeRO configuration: one typed dataclass, validated on construction (flags named in errors)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields

import torch

from hybrid.cliutil import check_number
from hybrid.precision import Precision


class CpuAdam(str, enum.Enum):
    """Which AdamW runs an offloaded optimizer step."""

    AUTO = "auto"  # DeepSpeed's CPU Adam when it builds, torch's otherwise
    DEEPSPEED = "deepspeed"  # deepspeed.ops.adam.DeepSpeedCPUAdam (AVX C++ kernel, built on first use)
    TORCH = "torch"  # torch.optim.AdamW, fused CPU kernel: the kernel the non-offloaded path runs, so
    #                  offloading with it changes no rounding
    TORCH_LOOP = "torch-loop"  # torch.optim.AdamW's per-tensor loop (torch's CPU default); slowest


@dataclass(frozen=True)
class ZeroConfig:
    """How model state is partitioned over the data-parallel group (Rajbhandari et al. 2020).

    Attributes:
        stage: 0 = plain data parallelism (gradients all-reduced, everything replicated);
            1 = optimizer states (and fp32 master weights) sharded; 2 = gradients sharded too;
            3 = parameters sharded too, gathered per layer just before use (`--zero-stage`).
        precision: compute dtype of parameters and gradients (`--bf16`, `--fp16`).
        offload_optimizer: fp32 master weights, Adam moments and the optimizer step live in host
            memory (`--offload-optimizer`); pinned when the model is on a GPU.
        offload_params: stage 3 only: parameter shards live in host memory and are copied to the
            device per layer, just before the all-gather (`--offload-params`).
        keep_gathered: stage 3 with gradient accumulation (pipelines): gather each layer once per
            step and keep it through every micro-batch; gradients accumulate at full size and are
            reduce-scattered once, after the last micro-batch (`--zero3-keep-gathered`). Trades
            stage-1 memory during the step for 2 Psi instead of 3 m Psi traffic.
        bucket_bytes: stages 0-2: gradients are reduced in buckets of about this many bytes,
            launched as backward produces them (`--zero-bucket-bytes`).
        overlap_param_gather: stages 1-2: the post-step all-gather of the updated parameters is posted
            and not waited for; the next forward waits for each bucket just before the first block (or
            chunk edge) that uses it, so the gathers overlap the forward (Megatron's
            `--overlap-param-gather`, DeepSpeed's and FSDP's prefetch). `--no-overlap-param-gather`
            waits for all of them in the step, as before.
        accumulate_fp32_grads: --bf16/--fp16 only: gradients accumulate over micro-batches and are reduced
            over DP in fp32 "main grads" (Megatron's `--accumulate-allreduce-grads-in-fp32`): each backward's
            compute-dtype .grad is added into an fp32 buffer and released. Gradient memory 4 bytes a parameter (a
            shard's at stages 2-3) instead of 2, DP gradient traffic twice the bytes, no fp32 master-gradient copy
            in the step. train.py sets it from its flags (hybrid/train/args.py: grads_in_fp32): on with --bf16
            unless --grad-reduce-in-bf16, as Megatron-LM (round 22), off with --fp16 unless the flag. False here, the
            typed config's default, for callers that build it by hand (fp32 precision by default).
        reduce_from_grads: stages 1-2 over a 2-rank gloo DP group on the host (compute-dtype gradients, no
            compressor): each unit's reduce-scatter sends and adds autograd's gradient tensors where they lie,
            piece by piece, instead of first copying them into a flat gradient buffer (hybrid/zero/direct.py; the
            same bytes on the wire, the same sums bit for bit, 8 bytes a parameter less memory traffic a step).
            Stage 1 only in steps of one micro-batch (it accumulates micro-batches in its flat buffer). False: the
            flat path throughout (docs/zero.md round 8 measures one against the other).
        step_in_gather_order: stages 1-2 with overlap_param_gather (torch's optimizers, no compressor): the
            optimizer steps the units in the order the next forward uses them, one call per group a forward hook
            waits for (the inputs, each block, the output side), and posts each unit's all-gather right after its
            group's call, so the first gathers the forward waits for (the embedding's) are on the wire while the
            later groups step (Megatron and FSDP post gathers bucket by bucket too).
            The same kernel on the same elements, bit for bit. False: one optimizer call over every shard, then
            every gather (round 11's step; docs/zero.md round 12 measures one against the other).
        shm_gather: stages 1-2 over a 2-rank gloo DP group on one x86-64 host -- the default, wherever that
            holds: the post-step parameter all-gather through shared memory (hybrid/zero/shm.py: each rank's flat
            parameters in a /dev/shm file both map, the peer's half copied once, no socket) instead of gloo's
            loopback TCP; the same bytes, bit for bit, on the ledger as the gather. Where it cannot run (another
            host, no room in /dev/shm, not x86-64, CUDA/NCCL, a group of another size, a gradient compressor, stages
            0 and 3, MoE experts' units) both ranks keep gloo's gather; nothing to set. False
            (`--no-shm-gather`): gloo's gather everywhere. Every writer of the shards waits for the peer's take first
            (`ZeroOptimizer.before_param_writes`). On by default since round 14 (docs/zero.md).
        cpu_adam: the optimizer used when offloading (see CpuAdam).
        initial_loss_scale: fp16: first loss scale (power of two).
        loss_scale_window: fp16: steps without overflow before the scale doubles.
        min_loss_scale: fp16: the scale never halves below this.
    """

    stage: int = 0
    precision: Precision = Precision.FP32
    offload_optimizer: bool = False
    offload_params: bool = False
    keep_gathered: bool = False
    bucket_bytes: int = 25 * 2**20
    overlap_param_gather: bool = True
    accumulate_fp32_grads: bool = False
    reduce_from_grads: bool = True
    step_in_gather_order: bool = True
    shm_gather: bool = True
    cpu_adam: CpuAdam = CpuAdam.AUTO
    initial_loss_scale: float = 2.0**16
    loss_scale_window: int = 1000
    min_loss_scale: float = 1.0

    def __post_init__(self) -> None:
        self._check_types()
        if self.stage not in (0, 1, 2, 3):
            raise ValueError(f"--zero-stage must be 0, 1, 2 or 3, got {self.stage}")
        if self.offload_params and self.stage != 3:
            raise ValueError(f"--offload-params needs --zero-stage 3 (got stage {self.stage}): "
                             "only stage 3 partitions the parameters")
        if self.keep_gathered and self.stage != 3:
            raise ValueError("--zero3-keep-gathered applies to --zero-stage 3 only")
        if self.accumulate_fp32_grads and self.precision is Precision.FP32:
            raise ValueError("--accumulate-allreduce-grads-in-fp32 needs --bf16 or --fp16 (fp32 training already "
                             "accumulates and reduces fp32 gradients): add --bf16 or drop the flag")
        if self.bucket_bytes < 1:
            raise ValueError(f"--zero-bucket-bytes must be >= 1, got {self.bucket_bytes}")
        if self.initial_loss_scale <= 0 or self.min_loss_scale <= 0 or self.loss_scale_window < 1:
            raise ValueError("loss scaling: initial and minimum scale must be > 0 and the window >= 1")

    def _check_types(self) -> None:
        """A switch that is not a bool, a precision or CPU Adam that is not its enum: ValueError naming the field.
        A string would pass a truth test (ZeroConfig(step_in_gather_order="false") stepped in gather order) or fail
        deep in the engine (precision "bf16" has no .dtype)."""
        for name in (f.name for f in fields(self) if f.type == "bool"):  # every switch, a new one included
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ZeroConfig.{name} must be True or False, got {getattr(self, name)!r}")
        for name, kind in (("precision", Precision), ("cpu_adam", CpuAdam)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"ZeroConfig.{name} must be a {kind.__name__} "
                                 f"({', '.join(f'{kind.__name__}.{m.name}' for m in kind)}), "
                                 f"got {getattr(self, name)!r}")
        for name in ("stage", "bucket_bytes", "loss_scale_window"):
            check_number(f"ZeroConfig.{name}", getattr(self, name), integer=True)
        for name in ("initial_loss_scale", "min_loss_scale"):  # NaN passed the `<= 0` check below
            check_number(f"ZeroConfig.{name}", getattr(self, name))

    @property
    def sharded(self) -> bool:
        """Optimizer state partitioned over DP (stages 1-3)."""
        return self.stage >= 1

    @property
    def grad_dtype(self) -> torch.dtype:
        """Dtype of the gradient buffers and of their DP collectives: fp32 with accumulate_fp32_grads, else the
        compute dtype."""
        return torch.float32 if self.accumulate_fp32_grads else self.precision.dtype
