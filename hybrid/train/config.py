"""The run's configuration: one frozen, typed `RunConfig`, grouped like torchtitan's JobConfig, and the one table of
train.py's own flags it is parsed from.

    run = hybrid.train.args.run_config(parse_args(argv), world)      # every check, before any process group
    run.parallel.dims.tp, run.zero.stage, run.optimizer.lr, run.checkpoint.save, ...
    hybrid.train.loop.run(run, corpus, device)

The argparse Namespace ends in hybrid/train/args.py: the checks read it, build these dataclasses, and nothing after
them sees a flag. `FLAGS` below is the single definition of train.py's core flags -- name, type, default, help, the
smallest sane value and the DeepSpeed JSON key that sets it -- which `--help` (args.build_parser), the DeepSpeed
config (args.apply_deepspeed_config) and `hybrid plan --emit-args` (`to_argv`) all read. Each feature keeps its own
flags beside its code (`hybrid/<feature>/args.py`: `add_arguments(parser)` and `check(args) -> <Feature>Config`) and
its config becomes one field of `RunConfig`, defaulting to "off" (docs/architecture.md, "Adding a feature's
flags").
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from hybrid.checkpoint.args import CheckpointConfig
from hybrid.compress.args import CompressConfig
from hybrid.cp.args import CPConfig
from hybrid.data import BatchSpec
from hybrid.data.args import DataConfig
from hybrid.diloco.args import DiLoCoConfig
from hybrid.fault.args import FaultConfig
from hybrid.mesh import ParallelDims
from hybrid.metrics.args import MetricsConfig
from hybrid.moe.config import MoEConfig
from hybrid.pipeline import ScheduleKind
from hybrid.train_step import OptimizerConfig
from hybrid.zero.config import CpuAdam, ZeroConfig
from models.recompute import Recompute
from models.config import ModelConfig

# --min-lr when not given: train.py's floor since its first round (kept, so a run resumes on its saved schedule),
# or Megatron-LM's default 0.0 where --lr (or the DeepSpeed JSON's optimizer.params.lr) is below it -- a floor above
# the peak would raise the rate, and Megatron's scheduler asserts max_lr >= min_lr (args.default_min_lr)
DEFAULT_MIN_LR = 1e-4
MAX_SEED = 2**32 - 1  # data.py draws from seed * 1_000_003 + iteration: stays far below a 64-bit generator seed


# --- the flags ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Flag:
    """One of train.py's own flags.

    Attributes:
        name: the flag, Megatron-LM's spelling (`--tensor-model-parallel-size`).
        group: the `--help` section it is listed under.
        help: its `--help` text.
        default: its value when not given.
        type: int, float or str for a flag that takes a value; None for a switch.
        switch: a store-true switch (`--bf16`).
        negatable: a switch with a `--no-` form (argparse.BooleanOptionalAction).
        choices: the values it accepts, when they are a fixed set.
        path: it names a file or directory (shown as PATH in `--help`).
        low: the smallest sane value (None: no bound); `low_open`: that value itself is excluded.
        deepspeed: (JSON key, attribute of hybrid.zero.ds_config.DeepSpeedConfig) when a DeepSpeed config sets it.
    """

    name: str
    group: str
    help: str
    default: object = None
    type: type | None = None
    switch: bool = False
    negatable: bool = False
    choices: tuple[str, ...] | None = None
    path: bool = False
    low: float | None = None
    low_open: bool = False
    deepspeed: tuple[str, str] | None = None

    @property
    def dest(self) -> str:
        return self.name[2:].replace("-", "_")

    def add_to(self, group: argparse._ArgumentGroup) -> None:
        if self.negatable:
            group.add_argument(self.name, action=argparse.BooleanOptionalAction, default=self.default, help=self.help)
        elif self.switch:
            group.add_argument(self.name, action="store_true", help=self.help)
        else:
            group.add_argument(self.name, type=self.type, default=self.default, choices=self.choices, help=self.help)


MODEL, PARALLEL, OPTIM, ZERO = "model and data", "parallelism", "optimization", "ZeRO and mixed precision"
FLAGS: tuple[Flag, ...] = (
    Flag("--model", MODEL, "preset name (hybrid models) or a transformers config.json / model directory",
         default="tiny-gpt2", type=str, path=True),
    Flag("--load", MODEL, "a --save directory to resume from (its latest complete checkpoint), or a transformers "
         "model directory (safetensors) for initial weights", type=str, path=True),
    Flag("--seq-length", MODEL, "tokens per sequence", default=128, type=int, low=1),
    Flag("--tensor-model-parallel-size", PARALLEL, "tp: ranks splitting each layer", default=1, type=int, low=1),
    Flag("--sequence-parallel", PARALLEL, "split norms/dropout along the sequence", switch=True),
    Flag("--pipeline-model-parallel-size", PARALLEL, "pp: pipeline stages", default=1, type=int, low=1),
    Flag("--num-layers-per-virtual-pipeline-stage", PARALLEL,
         "layers per model chunk; v = layers / (pp * this) chunks per rank (interleaved 1F1B)", type=int, low=1),
    Flag("--virtual-pipeline-model-parallel-size", PARALLEL,
         "v: model chunks per rank (interleaved 1F1B); with --pipeline-layers-per-stage (pp x v counts) or "
         "--pipeline-partition balanced the chunks may differ in size", type=int, low=1),
    Flag("--pipeline-schedule", PARALLEL, "None: interleaved with virtual stages, else 1f1b; zbh1 / zbv: zero bubble "
         "(each backward split into input and weight gradients; zbv: two chunks a rank in a V)", type=str,
         choices=tuple(k.value for k in ScheduleKind)),
    Flag("--pipeline-partition", PARALLEL, "balanced: split layers by FLOPs, counting the embedding and the LM head",
         default="uniform", type=str, choices=("uniform", "balanced")),
    Flag("--pipeline-layers-per-stage", PARALLEL, "layers of each stage by hand, e.g. 3,5,5,3", type=str),
    Flag("--recompute-granularity", PARALLEL,
         "recompute activations in backward: selective (attention core) or full (block)", type=str,
         choices=tuple(r.value for r in Recompute if r is not Recompute.NONE)),
    Flag("--recompute-method", PARALLEL, "with --recompute-granularity full, megatron-core's pair (it requires them): "
         "uniform with --recompute-num-layers 1, or block with N >= a model chunk's layers, is every layer on its "
         "own (what full runs); units of several layers and a subset of layers are not implemented", type=str,
         choices=("uniform", "block")),
    Flag("--recompute-num-layers", PARALLEL, "--recompute-method's N (uniform: 1; block: at least a chunk's layers)",
         type=int, low=1),
    Flag("--compile", PARALLEL, "torch.compile each Transformer block's forward (fused elementwise kernels; the "
         "first step pays the compilation); every ZeRO stage and --recompute-granularity (selective-op: no dropout, "
         "tp 1)", switch=True),
    Flag("--timeline", PARALLEL, "write the last step's per-rank Chrome trace (JSON) here", type=str, path=True),
    Flag("--micro-batch-size", PARALLEL, "sequences per forward/backward per rank", default=4, type=int, low=1,
         deepspeed=("train_micro_batch_size_per_gpu", "micro_batch")),
    Flag("--global-batch-size", PARALLEL, "sequences per optimizer step; None: micro batch x dp", type=int, low=1),
    Flag("--auto-parallel", PARALLEL, "let the planner choose tp, pp, v, micro batch, ZeRO stage, offload and SP for "
         "this world size and device memory (needs --global-batch-size)", switch=True),
    Flag("--hardware", PARALLEL, "a `hybrid calibrate` profile (JSON): MFU's peak, and with --auto-parallel the "
         "device to plan for", type=str, path=True),
    Flag("--distributed-timeout-minutes", PARALLEL, "bound on process-group start-up and on every collective: a "
         "rank that dies or stalls ends the job after this long, naming the lost rank", default=10.0, type=float,
         low=0.0, low_open=True),
    Flag("--train-iters", OPTIM, "optimizer steps", default=100, type=int, low=1),
    Flag("--lr", OPTIM, "peak learning rate", default=1e-3, type=float, low=0.0, low_open=True,
         deepspeed=("optimizer.params.lr", "lr")),
    Flag("--min-lr", OPTIM, f"learning rate at the end of the decay (the floor it then stays at); None: "
         f"{DEFAULT_MIN_LR:g}, or Megatron's 0 where --lr is below that", type=float, low=0.0),
    Flag("--lr-warmup-iters", OPTIM, "linear warm-up: step k <= N runs at lr k / N (Megatron's; 0: none)",
         default=10, type=int, low=0),
    Flag("--lr-warmup-fraction", OPTIM, "warm-up over this fraction of the decay, in [0, 1) (Megatron's): "
         "--lr-warmup-iters = fraction x --lr-decay-iters (unset: --train-iters), a whole number of iterations",
         type=float, low=0.0),
    Flag("--lr-decay-iters", OPTIM, "the step the decay reaches --min-lr (then stays); None: --train-iters. Keep "
         "it when a resumed run raises --train-iters, and the schedule stays the same", type=int, low=1),
    Flag("--lr-decay-style", OPTIM, "decay after warm-up", default="cosine", type=str,
         choices=("constant", "linear", "cosine")),
    Flag("--weight-decay", OPTIM, "AdamW decoupled weight decay (matrices only)", default=0.01, type=float, low=0.0,
         deepspeed=("optimizer.params.weight_decay", "weight_decay")),
    Flag("--adam-beta1", OPTIM, "Adam first-moment decay, in [0, 1)", default=0.9, type=float,
         deepspeed=("optimizer.params.betas[0]", "beta1")),
    Flag("--adam-beta2", OPTIM, "Adam second-moment decay, in [0, 1)", default=0.95, type=float,
         deepspeed=("optimizer.params.betas[1]", "beta2")),
    Flag("--clip-grad", OPTIM, "clip to this global gradient norm (0: off)", default=1.0, type=float, low=0.0,
         deepspeed=("gradient_clipping", "clip_grad")),
    Flag("--optimizer", OPTIM, "adam (AdamW) or sgd (torch's SGD, --sgd-momentum; Megatron's names); onebit-adam: "
         "1-bit Adam (--onebit-freeze-iters, docs/comm-efficient.md)", default="adam", type=str,
         choices=("adam", "sgd", "onebit-adam")),
    Flag("--sgd-momentum", OPTIM, "--optimizer sgd's momentum, in [0, 1) (Megatron's default 0.9)", default=0.9,
         type=float, low=0.0),
    Flag("--seed", OPTIM, f"initialisation and data order, in [0, {MAX_SEED}]", default=1234, type=int),
    Flag("--zero-stage", ZERO, "0 DP, 1 optimizer states, 2 + gradients, 3 + parameters", default=0, type=int,
         deepspeed=("zero_optimization.stage", "zero_stage")),
    Flag("--offload-optimizer", ZERO, "fp32 master weights, Adam and its step on the CPU", switch=True,
         deepspeed=("zero_optimization.offload_optimizer", "offload_optimizer")),
    Flag("--offload-params", ZERO, "stage 3: parameter shards in CPU memory", switch=True,
         deepspeed=("zero_optimization.offload_param", "offload_params")),
    Flag("--zero3-keep-gathered", ZERO, "stage 3: gather each layer once per step (all micro-batches), "
         "reduce-scatter once", switch=True),
    Flag("--zero-bucket-bytes", ZERO, "stages 0-2 gradient bucket size", default=25 * 2**20, type=int, low=1,
         deepspeed=("zero_optimization.reduce_bucket_size", "bucket_bytes")),
    Flag("--overlap-param-gather", ZERO, "stages 1-2: the next forward waits for each post-step parameter "
         "all-gather just before the block that uses it (default on; --no-overlap-param-gather waits in the step)",
         default=True, negatable=True),
    Flag("--shm-gather", ZERO, "stages 1-2, a 2-rank DP group on one x86-64 host (gloo): the post-step parameter "
         "all-gather through /dev/shm instead of loopback TCP, the same bytes (default on where it applies, gloo "
         "elsewhere; --no-shm-gather: gloo always)", default=True, negatable=True),
    Flag("--accumulate-allreduce-grads-in-fp32", ZERO, "--fp16: accumulate gradients over micro-batches and reduce "
         "them over DP in fp32 (4 bytes a parameter, twice the DP gradient bytes); --bf16 does so by default, as "
         "Megatron's does: accepted there, it changes nothing", switch=True),
    Flag("--grad-reduce-in-bf16", ZERO, "--bf16: accumulate gradients over micro-batches and reduce them over DP in "
         "bf16 instead of fp32 (Megatron's flag: 2 bytes a parameter, half the DP gradient bytes)", switch=True),
    Flag("--cpu-adam", ZERO, "offloaded step: DeepSpeed's CPU Adam (auto: when it builds) or torch's", default="auto",
         type=str, choices=tuple(c.value for c in CpuAdam)),
    Flag("--bf16", ZERO, "bf16 compute, fp32 master weights", switch=True, deepspeed=("bf16.enabled", "bf16")),
    Flag("--fp16", ZERO, "fp16 compute, fp32 master weights, dynamic loss scaling", switch=True,
         deepspeed=("fp16.enabled", "fp16")),
    Flag("--deepspeed-config", ZERO, "DeepSpeed JSON: its zero_optimization / batch / clipping / bf16 / fp16 / "
         "optimizer keys set the flags (a value that contradicts a flag given explicitly is an error)", type=str, path=True),
    Flag("--log-interval", ZERO, "print the loss every this many steps", default=10, type=int, low=1),
)
BY_DEST = {f.dest: f for f in FLAGS}


def to_argv(values: dict[str, object]) -> list[str]:
    """Command-line words for {dest: value} of train.py's flags (`hybrid plan --emit-args`): `--flag value`, the
    bare switch for True; False and None leave the flag at its default. KeyError for a dest that is no flag."""
    out: list[str] = []
    for dest, value in values.items():
        flag = BY_DEST[dest]
        if value is None or value is False:
            continue
        out += [flag.name] if flag.switch or flag.negatable else [flag.name, str(value)]
    return out


# --- the run's configuration ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PipelinePlan:
    """How the model is cut: the schedule, chunks per rank, each global stage's layer ids.

    Attributes:
        kind: the schedule (`--pipeline-schedule`; interleaved with virtual stages, else 1F1B).
        v: model chunks per rank (`--num-layers-per-virtual-pipeline-stage`, `--virtual-pipeline-model-parallel-size`).
        stages: the layer ids of each global stage, pp x v of them (`--pipeline-partition`,
            `--pipeline-layers-per-stage`).
    """

    kind: ScheduleKind
    v: int
    stages: list[tuple[int, ...]]


@dataclass(frozen=True)
class ParallelConfig:
    """How the ranks split the work.

    Attributes:
        dims: tp x cp x pp x dp (`--tensor-model-parallel-size`, `--context-parallel-size`,
            `--pipeline-model-parallel-size`; dp = world / (tp cp pp)).
        sequence_parallel: norms and dropout on sequence shards of the TP group (`--sequence-parallel`).
        pipeline: the schedule and the layers of each stage.
        timeout_minutes: bound on process-group start-up and every collective (`--distributed-timeout-minutes`).
    """

    dims: ParallelDims
    sequence_parallel: bool
    pipeline: PipelinePlan
    timeout_minutes: float = 10.0


@dataclass(frozen=True)
class ModelSetup:
    """The model and how its layers run.

    Attributes:
        name: `--model` as given (a preset, or a transformers config.json / model directory); checkpoints record it.
        arch: the architecture, with the dropout flags applied (`--hidden-dropout`, `--attention-dropout`).
        init_weights: a transformers model directory to initialise from (`--load` naming one); None: seeded init.
        recompute: activation recomputation (`--recompute-granularity`).
        compile: torch.compile each block's forward (`--compile`).
    """

    name: str
    arch: ModelConfig
    init_weights: str | None = None
    recompute: Recompute = Recompute.NONE
    compile: bool = False


@dataclass(frozen=True)
class TrainingConfig:
    """The loop around the steps.

    Attributes:
        batch: global batch, micro-batch, sequence length and dp (`--global-batch-size`, `--micro-batch-size`,
            `--seq-length`).
        train_iters: optimizer steps (`--train-iters`).
        log_interval: steps between log lines (`--log-interval`).
        seed: initialisation, data order and dropout streams (`--seed`).
        timeline: write the last step's Chrome trace here (`--timeline`); None: off.
        hardware: a `hybrid calibrate` profile (`--hardware`): MFU's peak and the predicted time split; None: off.
    """

    batch: BatchSpec
    train_iters: int = 100
    log_interval: int = 10
    seed: int = 1234
    timeline: str | None = None
    hardware: str | None = None


@dataclass(frozen=True)
class RunConfig:
    """Everything a training run was asked to do, checked. Built once by hybrid.train.args.run_config before any
    process group; `run()` and everything below it read this and never a flag.

    Attributes:
        parallel: the layout (tp, pp, dp, sequence parallelism, the pipeline cut, the collective timeout).
        model: the model, its initial weights, recomputation and compilation.
        training: the batch, the steps, logging, the seed, the timeline.
        optimizer: AdamW and the learning-rate schedule (hybrid/train_step.py).
        zero: ZeRO stage, precision, offload, buckets, loss scaling (hybrid/zero/config.py).
        data: datasets, blend, split and validation (hybrid/data/args.py).
        checkpoint: saves, resume, exits (hybrid/checkpoint/args.py).
        fault: watchdog, NaN guard, stragglers (hybrid/fault/args.py).
        metrics: TensorBoard, the JSON-lines file, MFU's peak (hybrid/metrics/args.py).
        cp: context parallelism and packed documents (hybrid/cp/args.py).
        moe: Mixture-of-Experts training and expert parallelism (hybrid/moe/args.py); None for a dense model.
        diloco: local updates over DP replicas (hybrid/diloco/args.py); None without --diloco-inner-steps.
        compress: gradient compression over DP (hybrid/compress/args.py); off by default.
        flags: every flag's final value (dest -> int / float / str / bool / None, or a tuple of them: --data-path),
            as checkpoints record it.
        ds_unsupported: keys of --deepspeed-config that hybrid does not read (a warning at start-up).
        warnings: what the checks turned off or changed, one line each, printed at start-up by rank 0 (e.g.
            --sequence-parallel at --tensor-model-parallel-size 1, turned off as Megatron-LM does).
    """

    parallel: ParallelConfig
    model: ModelSetup
    training: TrainingConfig
    optimizer: OptimizerConfig
    zero: ZeroConfig = field(default_factory=ZeroConfig)
    data: DataConfig | None = None
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    metrics: MetricsConfig = field(default_factory=lambda: MetricsConfig(None, None, None))
    cp: CPConfig = field(default_factory=CPConfig)
    moe: MoEConfig | None = None
    diloco: DiLoCoConfig | None = None
    compress: CompressConfig = field(default_factory=CompressConfig)
    flags: tuple[tuple[str, object], ...] = ()
    ds_unsupported: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def flag_values(self) -> dict[str, object]:
        """`flags` as a dict (a checkpoint's state.json "args")."""
        return dict(self.flags)
