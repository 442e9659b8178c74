"""Command-line flags of the training entry point and every check that needs no process group.

Flags follow Megatron-LM's names; train.py's own are one table (hybrid/train/config.py: FLAGS), each feature's in
its folder (hybrid/<feature>/args.py). The data-parallel size and the number of micro-batches are derived:
dp = world / (tp * pp), micro-batches per step = global batch / (micro batch * dp). `run_config` reads the parsed
flags and returns the frozen, typed `RunConfig`; the argparse Namespace ends here (the checks work on their own
copy of it). Every check raises ValueError naming the flag and the fix; hybrid.train.main turns it into one line
before any process group.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from hybrid.cliutil import (HelpFormatter, OneLineParser, check_output_file, divisors, in_range, is_finite,
                            nearest_multiples, one_of)
from hybrid.compress import args as compress_args
from hybrid.checkpoint import args as ckpt_args
from hybrid.cp import args as cp_args
from hybrid.data import BatchSpec
from hybrid.data import args as data_args
from hybrid.diloco import args as diloco_args
from hybrid.fault import args as fault_args
from hybrid.launch import MAX_TIMEOUT_MINUTES
from hybrid.mesh import ParallelDims, validate_model_dims
from hybrid.metrics import args as metrics_args
from hybrid.moe import args as moe_args
from hybrid.partition import PartitionMethod, parse_layers_per_stage, partition_layers, stage_costs_from_config
from hybrid.pipeline import ScheduleKind
from hybrid.pipeline.args import check_zero_bubble
from hybrid.pipeline.timeline import check_replaceable
from hybrid.precision import Precision
from hybrid.train import other_flags
from hybrid.train.config import (DEFAULT_MIN_LR, FLAGS, MAX_SEED, ModelSetup, ParallelConfig,  # noqa: F401
                                 PipelinePlan, RunConfig, TrainingConfig)
from hybrid.train_step import OptimizerConfig
from hybrid.zero import CpuAdam, ZeroConfig
from hybrid.zero.ds_config import DeepSpeedSettings, deepspeed_origins, name_keys, read_deepspeed_config
from models import Recompute, load_config
from models import cli as model_cli
from models.config import ModelConfig

DESCRIPTION = "Train a GPT-2 or Llama-family model with tensor, pipeline and data parallelism."
EPILOG = """launch (one process per device; dp = world / (tp x cp x pp) is derived):
  torchrun --nproc-per-node 8 -m hybrid.train --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \\
      --micro-batch-size 2 --global-batch-size 16 --seq-length 128 --train-iters 200 --log-interval 20
  python -m hybrid.train --train-iters 20          # one process, no torchrun
  (scripts/train.py is the same entry point in a checkout)

Every input is checked before any process group starts; a bad one exits with one line naming it
(docs/troubleshooting.md lists the errors)."""


def build_parser() -> argparse.ArgumentParser:
    """train.py's own flags from the FLAGS table (in its groups and order), then each feature's."""
    p = OneLineParser(prog="train.py", description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter,
                      hints=other_flags.hints(), warn_repeated=False)  # main.validate prints them with the others
    groups: dict[str, argparse._ArgumentGroup] = {}
    for flag in FLAGS:
        if flag.group not in groups:
            groups[flag.group] = p.add_argument_group(flag.group)
        flag.add_to(groups[flag.group])
    model_cli.add_arguments(p)
    data_args.add_arguments(p)
    metrics_args.add_arguments(p)
    fault_args.add_arguments(p)
    ckpt_args.add_arguments(p)
    cp_args.add_arguments(p)
    moe_args.add_arguments(p)
    diloco_args.add_arguments(p)
    compress_args.add_arguments(p)
    _short_metavars(p)
    return p


def _short_metavars(p: argparse.ArgumentParser) -> None:
    """N for counts, X for numbers, PATH for files: keeps each option of --help on one line."""
    for a in p._actions:
        if a.option_strings and a.metavar is None and a.choices is None and a.nargs is None and a.const is None:
            a.metavar = {int: "N", float: "X"}.get(a.type, "PATH" if a.dest in PATHS else "TEXT")


PATHS = {f.dest for f in FLAGS if f.path}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags; `args.explicit` holds the dests given on the command line (DeepSpeed conflicts are checked
    against them)."""
    p = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    args.repeated = tuple(p.repeated)  # a flag given twice: which value won (warned once the checks pass; a tuple,
    # so a checkpoint's "args" does not record it as a flag: hybrid/train/args._recorded)
    actions = {s: a.dest for a in p._actions for s in a.option_strings}
    args.explicit = {actions[t.split("=", 1)[0]] for t in argv if t.split("=", 1)[0] in actions}
    return args


MAX_COUNT = 1 << 53  # every count and size flag: far above any run, exact in a float64


def check_numbers(args: argparse.Namespace) -> None:
    """Zero, negative, NaN and infinity wherever they make no sense (each flag's `low` in FLAGS); ValueError
    naming the flag."""
    for flag in FLAGS:
        value = getattr(args, flag.dest)
        if flag.low is None or value is None:
            continue
        if flag.type is float and not is_finite(value):
            raise ValueError(f"{flag.name} must be a finite number, got {value}")
        if flag.type is int and value > MAX_COUNT:  # 10**400 would overflow the float arithmetic of later checks
            raise ValueError(f"{flag.name} must be at most {MAX_COUNT}, got an integer of {len(str(value))} digits")
        if not in_range(value, flag.low, low_open=flag.low_open):
            raise ValueError(f"{flag.name} must be {'>' if flag.low_open else '>='} {flag.low}, got {value}")
    # a decay of 1 or more never forgets a gradient: Adam's moments and SGD's velocity grow without bound
    for flag, beta in (("--adam-beta1", args.adam_beta1), ("--adam-beta2", args.adam_beta2),
                       ("--sgd-momentum", args.sgd_momentum)):
        if not 0 <= beta < 1:
            raise ValueError(f"{flag} must be in [0, 1), got {beta}")
    if args.min_lr is not None and args.min_lr > args.lr:  # given: above --lr (given, default or the JSON's)
        raise ValueError(f"--min-lr {args.min_lr:g} exceeds --lr {args.lr:g}; the decay would raise the rate: "
                         f"lower --min-lr (or drop it: {DEFAULT_MIN_LR:g}, 0 below that)")
    if args.distributed_timeout_minutes > MAX_TIMEOUT_MINUTES:
        raise ValueError(f"--distributed-timeout-minutes must be at most {MAX_TIMEOUT_MINUTES} (a week), "
                         f"got {args.distributed_timeout_minutes}")
    if not 0 <= args.seed <= MAX_SEED:
        raise ValueError(f"--seed must be in [0, {MAX_SEED}], got {args.seed}")
    check_optimizer_flags(args)


def default_min_lr(lr: float) -> float:
    """--min-lr when not given: DEFAULT_MIN_LR (1e-4) at --lr >= 1e-4, so every run that ran before keeps its
    schedule and resumes; below it Megatron-LM's default 0.0 (its --min-lr; `OptimizerParamScheduler` asserts
    max_lr >= min_lr), so a small --lr (or a DeepSpeed optimizer.params.lr) decays to 0 as a Megatron user expects
    instead of failing until --min-lr is given."""
    return DEFAULT_MIN_LR if lr >= DEFAULT_MIN_LR else 0.0


def check_optimizer_flags(args: argparse.Namespace) -> None:
    """Flags given on the command line that the chosen optimizer or schedule would never read: a silent no-op is
    an error naming the flag (as Megatron's `lr_warmup_steps < lr_decay_steps` assertion)."""
    explicit = getattr(args, "explicit", set())  # a Namespace built by hand has none
    apply_warmup_fraction(args)
    if "sgd_momentum" in explicit and args.optimizer != "sgd":
        raise ValueError(f"--sgd-momentum is --optimizer sgd's; the run's optimizer is {args.optimizer}: "
                         f"add --optimizer sgd or drop --sgd-momentum")
    for dest in ("adam_beta1", "adam_beta2"):
        if dest in explicit and args.optimizer == "sgd":
            flag = "--" + dest.replace("_", "-")
            raise ValueError(f"{flag} is Adam's; --optimizer sgd does not read it (its momentum is --sgd-momentum): "
                             f"drop {flag} or use --optimizer adam")
    # step k <= W warms up and k > D runs at --min-lr (train_step.OptimizerConfig.lr_at): W >= D never decays
    # and, for W > --train-iters, never reaches --lr
    w, d = args.lr_warmup_iters, args.lr_decay_iters or args.train_iters
    if ({"lr_warmup_iters", "lr_decay_iters"} & explicit and args.lr_decay_style != "constant" and w > 0
            and w >= d):
        decay = f"--lr-decay-iters {d}" if args.lr_decay_iters else f"--lr-decay-iters (unset: --train-iters {d})"
        raise ValueError(f"--lr-warmup-iters {w} is not below {decay}: the warm-up would end at or after the "
                         f"decay; use --lr-warmup-iters < {d}, a larger --lr-decay-iters, or --lr-decay-style constant")


def apply_warmup_fraction(args: argparse.Namespace) -> None:
    """--lr-warmup-fraction F, Megatron's: its scheduler warms up over lr_warmup_steps = F x lr_decay_steps, both in
    samples (iterations x the global batch), so W = F x D iterations with D = --lr-decay-iters (unset:
    --train-iters). Sets --lr-warmup-iters on the checks' copy -- the schedule line, the checkpoint's flags and a
    resume's comparison then read W. lr_at counts whole steps: a W that is not whole (Megatron runs step 0 at 0 and
    decays from step 1 for 0 < W < 1) is refused with the nearest iterations. Idempotent (the checks run twice)."""
    f = getattr(args, "lr_warmup_fraction", None)
    if f is None:
        return
    if f >= 1:
        raise ValueError(f"--lr-warmup-fraction must be in [0, 1) (the warm-up must end before the decay does), "
                         f"got {f:g}")
    d = args.lr_decay_iters or args.train_iters
    w = f * d
    if "lr_warmup_iters" in getattr(args, "explicit", set()) and args.lr_warmup_iters not in (0, round(w)):
        raise ValueError(f"--lr-warmup-fraction {f:g} and --lr-warmup-iters {args.lr_warmup_iters} both set the "
                         f"warm-up (Megatron-LM refuses both too); give one of them")
    if abs(w - round(w)) > 1e-9 * max(w, 1.0):  # 0.001 x 430000 is 430.00000000000006 in floats: whole
        decay = f"--lr-decay-iters {d}" if args.lr_decay_iters else f"--train-iters {d}"
        raise ValueError(f"--lr-warmup-fraction {f:g} x {decay} = {w:g} iterations of warm-up, not a whole number; "
                         f"the warm-up here counts iterations: give --lr-warmup-iters {round(w)} (or a fraction "
                         f"that gives whole iterations)")
    args.lr_warmup_iters = round(w)


def check_files(args: argparse.Namespace, cfg: ModelConfig) -> None:
    """Inputs exist and have the right format, outputs can be written -- before any work."""
    for flag, value in (("--timeline", args.timeline), ("--load", args.load),
                        ("--hardware", args.hardware), ("--deepspeed-config", args.deepspeed_config),
                        ("--pipeline-layers-per-stage", args.pipeline_layers_per_stage)):
        if value is not None and not value.strip():
            raise ValueError(f"{flag} is empty; give a value or omit the flag")
    if args.timeline is not None:
        check_output_file("--timeline", args.timeline)
        check_replaceable("--timeline", args.timeline)
        if args.metrics_file is not None and os.path.realpath(args.metrics_file) == os.path.realpath(args.timeline):
            raise ValueError(f"--timeline and --metrics-file are both {args.timeline!r}: the timeline would replace "
                             f"the metrics at the end of the run; give each its own file")
    if args.load is not None:
        check_checkpoint(args.load, cfg, args.model)


def check_checkpoint(path: str, cfg: ModelConfig, model: str) -> None:
    """--load: a directory whose safetensors header(s) open and whose config.json, if any, is the --model's."""
    from models.hf_io import CheckpointReader

    if not os.path.isdir(path):
        what = "does not exist" if not os.path.exists(path) else "is not a directory"
        raise ValueError(f"--load {path!r} {what}; give an earlier run's --save directory (a checkpoint) or a "
                         f"transformers model directory (safetensors)")
    try:
        reader = CheckpointReader(path)
        missing = sorted({f for f in reader.files.values() if not os.path.isfile(f)})
    except ValueError as e:
        raise ValueError(str(e).replace("--model", "--load", 1)) from None
    except Exception as e:  # safetensors' header error, a malformed index (JSONDecodeError, KeyError)
        raise ValueError(f"--load {path}: not a readable safetensors checkpoint ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})") from None
    if missing:
        raise ValueError(f"--load {path}: the index names missing shard files: {', '.join(missing[:3])}")
    if os.path.isfile(os.path.join(path, "config.json")):
        saved = load_config(path)
        shape = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "vocab_size", "ffn_hidden_size")
        if saved.arch != cfg.arch or any(getattr(saved, k) != getattr(cfg, k) for k in shape):
            raise ValueError(f"--load {path} holds a different model than --model {model} "
                             f"({saved.arch} {saved.num_layers} layers x {saved.hidden_size} vs {cfg.arch} "
                             f"{cfg.num_layers} x {cfg.hidden_size}); pass --model {path}")


def check_host(run: RunConfig, world: int) -> None:
    """What depends on this machine, not on the layout (so `hybrid plan --emit-args`, which runs check_args for
    a cluster, skips it): the batch of token ids and the model's weights fit its memory."""
    check_batch_memory(run.training.batch)
    check_model_fits_host(run.model.arch, world, run.model.name)


def check_batch_memory(batch: BatchSpec) -> None:
    """Every rank draws the whole global batch of token ids before taking its rows (hybrid.data.global_batch
    stacks global_batch int64 windows of seq + 1 tokens; inputs and labels are views of it): that must fit in
    this machine's memory."""
    need = batch.global_batch * (batch.seq_length + 1) * 8
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        raise ValueError(f"--global-batch-size {batch.global_batch} x --seq-length {batch.seq_length} tokens need "
                         f"{need / 2**30:.3g} GiB of token ids per rank, more than this machine's "
                         f"{have / 2**30:.0f} GiB; use a smaller batch")


def check_model_fits_host(cfg: ModelConfig, world: int, model: str) -> None:
    """On CPU: the fp32 weights alone, each stored once over the world in the best case (ZeRO-3 shards them over
    dp, tp and pp split them), times the ranks on this host, must fit its memory -- a lower bound that every
    layout and offload choice adds to. A GPU run is sized by `hybrid plan` / --auto-parallel instead."""
    if torch.cuda.is_available():
        return
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if os.environ.get("LOCAL_WORLD_SIZE", "").isdigit() \
        else world
    need = cfg.num_parameters * 4 * local / world
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        raise ValueError(f"--model {model}: its {cfg.num_parameters / 1e9:.3g}B parameters need at least "
                         f"{need / 2**30:.0f} GiB (fp32) on this host's {local} rank(s), more than its "
                         f"{have / 2**30:.0f} GiB; run `hybrid plan` to size the job")


def check_corpus(args: argparse.Namespace, run: RunConfig):
    """Open --data-path (hybrid/data/args.py): every dataset readable, enough tokens for one sequence plus its
    shifted label in the train split, token ids within the model's vocabulary. Returns the DataSource."""
    return data_args.build(args, run.data, run.training.batch, run.model.arch.vocab_size)


def check_pipeline(args: argparse.Namespace, cfg: ModelConfig, dims: ParallelDims, batch: BatchSpec) -> PipelinePlan:
    v = 1
    if args.num_layers_per_virtual_pipeline_stage is not None:
        per = args.num_layers_per_virtual_pipeline_stage
        if per < 1 or cfg.num_layers % (dims.pp * per):
            fits = [d for d in divisors(cfg.num_layers) if cfg.num_layers % (dims.pp * d) == 0]
            raise ValueError(f"--num-layers-per-virtual-pipeline-stage {per} must divide the {cfg.num_layers} layers "
                             f"/ --pipeline-model-parallel-size {dims.pp}"
                             + (f"; give {one_of(fits)}" if fits else f", which is not a whole number of layers"))
        v = cfg.num_layers // (dims.pp * per)
    if args.virtual_pipeline_model_parallel_size is not None:
        if args.num_layers_per_virtual_pipeline_stage is not None:
            raise ValueError("--virtual-pipeline-model-parallel-size and --num-layers-per-virtual-pipeline-stage both "
                             "set the chunks per rank; give one of them")
        v = args.virtual_pipeline_model_parallel_size
    kind = ScheduleKind(args.pipeline_schedule or ("interleaved" if v > 1 else "1f1b"))
    v = check_zero_bubble(args, kind, v, dims.pp, cfg.num_layers,  # zbv: 2 chunks a rank (hybrid/pipeline/args.py)
                          ranks=dims.world // (dims.tp * dims.cp))
    if kind is ScheduleKind.INTERLEAVED and v == 1:  # at pp 1 too: one chunk on one rank runs the plain step
        _one_chunk(args, cfg.num_layers, dims.pp)
    check_virtual_stages(args, v, dims.pp)
    _check_one_stage(args, dims.pp * v)
    if kind not in (ScheduleKind.INTERLEAVED, ScheduleKind.ZBV) and v > 1:
        flag = _v_flag(args)
        raise ValueError(f"{flag} {getattr(args, flag[2:].replace('-', '_'))} needs --pipeline-schedule interleaved "
                         f"(or zbv), not {kind.value}; drop --pipeline-schedule or {flag}")
    if args.recompute_granularity == "selective-op" and kind in (ScheduleKind.ZB_H1, ScheduleKind.ZBV):
        raise ValueError(f"--recompute-granularity selective-op does not run with --pipeline-schedule {kind.value}: "
                         "its W reruns a block a second time and torch's selective checkpoint frees what it stored "
                         "after the first; use --recompute-granularity full or selective, or 1f1b")
    m = batch.num_micro_batches
    if kind is ScheduleKind.INTERLEAVED and m % dims.pp:
        raise ValueError(f"interleaved 1F1B needs the micro-batches per step ({m} = --global-batch-size / "
                         f"(--micro-batch-size x dp)) to be a multiple of --pipeline-model-parallel-size {dims.pp}")
    chunks = _chunks_by(args, kind, v)
    if args.pipeline_layers_per_stage:  # with --pipeline-partition balanced: partition_layers names the conflict
        method = PartitionMethod.BALANCED if args.pipeline_partition == "balanced" else None  # (it was ignored)
        stages = partition_layers(cfg.num_layers, dims.pp, v, method=method, chunks=chunks,
                                  layers_per_stage=parse_layers_per_stage(args.pipeline_layers_per_stage))
    elif args.pipeline_partition == "balanced":
        costs = stage_costs_from_config(cfg, args.seq_length, args.micro_batch_size)
        stages = partition_layers(cfg.num_layers, dims.pp, v, method=PartitionMethod.BALANCED, chunks=chunks,
                                  **costs.as_kwargs())
    else:
        stages = partition_layers(cfg.num_layers, dims.pp, v, chunks=chunks)
    return PipelinePlan(kind=kind, v=v, stages=stages)


def _chunks_by(args: argparse.Namespace, kind: ScheduleKind, v: int) -> str | None:
    """What set the v chunks a rank, for partition_layers' messages: None for --virtual-pipeline-model-parallel-size
    (its default wording); --pipeline-schedule zbv, which fixes 2; --num-layers-per-virtual-pipeline-stage L."""
    if args.virtual_pipeline_model_parallel_size is not None:
        return None
    if args.num_layers_per_virtual_pipeline_stage is not None:
        return f"{v} chunks a rank of --num-layers-per-virtual-pipeline-stage " \
               f"{args.num_layers_per_virtual_pipeline_stage}"
    return f"the {v} chunks a rank of --pipeline-schedule {kind.value}" if kind is ScheduleKind.ZBV else None


def _v_flag(args: argparse.Namespace) -> str:
    """The flag that set the chunks per rank (--num-layers-per-virtual-pipeline-stage when neither was given)."""
    return ("--virtual-pipeline-model-parallel-size" if args.virtual_pipeline_model_parallel_size is not None
            else "--num-layers-per-virtual-pipeline-stage")


def _one_chunk(args: argparse.Namespace, layers: int, pp: int) -> None:
    """--pipeline-schedule interleaved with one chunk a rank: none asked for, or a flag whose value gives one
    (--num-layers-per-virtual-pipeline-stage L = layers / pp, --virtual-pipeline-model-parallel-size 1) -- the
    error names what was given and the value that interleaves (L = layers / (2 pp), two chunks a rank)."""
    given = (args.num_layers_per_virtual_pipeline_stage is not None
             or args.virtual_pipeline_model_parallel_size is not None)
    if not given:
        raise ValueError("--pipeline-schedule interleaved needs --num-layers-per-virtual-pipeline-stage "
                         "(or --virtual-pipeline-model-parallel-size)"
                         + (" and --pipeline-model-parallel-size >= 2" if pp == 1 else ""))
    if pp == 1:
        raise ValueError("--pipeline-schedule interleaved needs --pipeline-model-parallel-size >= 2 (its chunks "
                         "shrink a pipeline's bubble; one stage has none): give --pipeline-model-parallel-size N "
                         "or use --pipeline-schedule 1f1b")
    flag = _v_flag(args)
    layers_flag = flag == "--num-layers-per-virtual-pipeline-stage" and layers % (2 * pp) == 0
    two = f"{flag} {layers // (2 * pp)}" if layers_flag else "--virtual-pipeline-model-parallel-size 2"
    raise ValueError(f"{flag} {getattr(args, flag[2:].replace('-', '_'))} gives one chunk a rank ({layers} layers / "
                     f"--pipeline-model-parallel-size {pp}), and --pipeline-schedule interleaved needs two or more: "
                     f"give {two}, or --pipeline-schedule 1f1b")


def check_virtual_stages(args: argparse.Namespace, v: int, pp: int) -> None:
    """v > 1 chunks a rank at --pipeline-model-parallel-size 1: refused, as Megatron-LM's validate_args refuses
    virtual stages below pp 2. Interleaving shrinks the pipeline bubble, (pp - 1) / (v m) of the step against
    1F1B's (pp - 1) / m; at pp 1 there is no bubble, so the v chunks on the one rank would only run the plain
    step's arithmetic in v pieces (and `hybrid plan` never proposes it). v = 1 (the flag giving every layer to
    one chunk) is the default layout and stays accepted."""
    if pp > 1 or v == 1:
        return
    if args.pipeline_schedule == "zbv":  # zbv fixes v = 2 itself: the flag that asked for it is the schedule
        raise ValueError("--pipeline-schedule zbv needs --pipeline-model-parallel-size >= 2 (its two chunks a "
                         "rank fill a pipeline's bubble; one stage has none): give --pipeline-model-parallel-size "
                         "N or use --pipeline-schedule 1f1b")
    flag = ("--num-layers-per-virtual-pipeline-stage" if args.num_layers_per_virtual_pipeline_stage is not None
            else "--virtual-pipeline-model-parallel-size")
    given = getattr(args, flag[2:].replace("-", "_"))
    raise ValueError(f"{flag} {given} makes {v} virtual stages a rank, and --pipeline-model-parallel-size is 1: "
                     f"interleaving shrinks a pipeline's bubble and one stage has none (Megatron-LM refuses the "
                     f"same); give --pipeline-model-parallel-size N >= 2 or drop {flag}")


def _check_one_stage(args: argparse.Namespace, stages: int) -> None:
    """The partition flags split the layers over pp x v stages; at one stage there is nothing to split (hybrid
    convert refuses the same with --target-pipeline-parallel-size 1)."""
    given = [f for f, on in (("--pipeline-partition balanced", args.pipeline_partition == "balanced"),
                             ("--pipeline-layers-per-stage", args.pipeline_layers_per_stage)) if on]
    if stages == 1 and given:
        raise ValueError(f"{given[0]} splits the layers over the pipeline's stages, and there is one "
                         f"(--pipeline-model-parallel-size 1, no virtual stages): give "
                         f"--pipeline-model-parallel-size N or drop {given[0].split()[0]}")


# (flag dest, DeepSpeed JSON key, DeepSpeedConfig attribute): the flags a DeepSpeed config sets (FLAGS' column)
DS_FLAGS = tuple((f.dest, *f.deepspeed) for f in FLAGS if f.deepspeed)


def _conflict(args: argparse.Namespace, attr: str, key: str, value) -> None:
    """A DeepSpeed value that contradicts a flag given on the command line: an error naming both."""
    if attr in args.explicit and getattr(args, attr) != value:
        flag = f"--{attr.replace('_', '-')}"
        given = flag if isinstance(value, bool) else f"{flag} {getattr(args, attr)}"
        shown = json.dumps(value) if isinstance(value, bool) else value
        raise ValueError(f"--deepspeed-config sets {key} = {shown} but {given} was given; remove one of them")


def deepspeed_settings(args: argparse.Namespace) -> DeepSpeedSettings | None:
    """The --deepspeed-config file parsed once per command line and kept on the checks' Namespace
    (`args.ds_settings`): every later check (the flags it sets, --auto-parallel's conflicts, 1-bit Adam's
    freeze_step in hybrid/compress/args.py, the JSON keys an error names) reads these settings, never the file
    again -- a file rewritten during the checks cannot give two configs. None without --deepspeed-config."""
    if getattr(args, "ds_settings", None) is None and args.deepspeed_config:
        args.ds_settings = read_deepspeed_config(args.deepspeed_config)
    return getattr(args, "ds_settings", None)


def apply_deepspeed_config(args: argparse.Namespace, world: int) -> list[str]:
    """Set the flags a DeepSpeed config sets (an explicit flag it contradicts is an error); returns the keys it has
    that are not read."""
    ds = deepspeed_settings(args)
    args.explicit = getattr(args, "explicit", set())  # a Namespace built by hand has none
    for attr, key, field in DS_FLAGS:
        value = getattr(ds, field)
        if value is not None:
            _conflict(args, attr, key, value)
            setattr(args, attr, value)
    if ds.grad_accum_dtype is not None:
        _apply_grad_accum_dtype(args, ds.grad_accum_dtype)
    if ds.optimizer in ("adam", "adamw") and "optimizer" in args.explicit and args.optimizer != "adam":
        raise ValueError(f"--deepspeed-config sets optimizer.type {ds.optimizer!r} (AdamW) but --optimizer "
                         f"{args.optimizer} was given; remove one of them")
    args.loss_scaling = {k: v for k, v in (("initial_loss_scale", ds.initial_loss_scale),
                                           ("loss_scale_window", ds.loss_scale_window),
                                           ("min_loss_scale", ds.min_loss_scale)) if v is not None}
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    dp = world // (tp * pp) if tp >= 1 and pp >= 1 else 1
    if ds.accumulation is not None:
        gbs = args.micro_batch_size * max(dp, 1) * ds.accumulation
        if "global_batch_size" in args.explicit and args.global_batch_size != gbs:
            raise ValueError(f"--deepspeed-config gradient_accumulation_steps {ds.accumulation} gives a global "
                             f"batch of micro batch {args.micro_batch_size} x dp {dp} x {ds.accumulation} = {gbs}, "
                             f"but --global-batch-size {args.global_batch_size} was given; remove one of them")
        args.global_batch_size = gbs
    if ds.train_batch is not None:
        if args.global_batch_size is not None and ds.train_batch != args.global_batch_size:
            given = ("--global-batch-size" if ds.accumulation is None else
                     "train_micro_batch_size_per_gpu x gradient_accumulation_steps x dp")
            raise ValueError(f"--deepspeed-config: train_batch_size {ds.train_batch} != {given} = "
                             f"{args.global_batch_size}; make them agree")
        args.global_batch_size = ds.train_batch
    return ds.unsupported


def _apply_grad_accum_dtype(args: argparse.Namespace, dtype: str) -> None:
    """DeepSpeed's data_types.grad_accum_dtype: "fp32" under fp16 is --accumulate-allreduce-grads-in-fp32 (and under
    bf16 the default, the flag accepted and harmless); "bf16" under bf16 is --grad-reduce-in-bf16; the compute dtype
    itself (fp32 in fp32 training, fp16 under fp16) is the default. A 16-bit dtype other than the compute dtype is not
    something hybrid runs: an error naming the key."""
    compute = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    if dtype not in ("fp32", compute):
        raise ValueError(f"--deepspeed-config sets data_types.grad_accum_dtype = {dtype!r} but the compute dtype is "
                         f"{compute}: gradients accumulate in the compute dtype or in fp32; write {compute!r} or "
                         f"'fp32'")
    want = dtype == "fp32" and compute != "fp32"
    for attr, flag, value in (("accumulate_allreduce_grads_in_fp32", "--accumulate-allreduce-grads-in-fp32", want),
                              ("grad_reduce_in_bf16", "--grad-reduce-in-bf16", compute == "bf16" and not want)):
        if attr in args.explicit and getattr(args, attr, False) != value:
            raise ValueError(f"--deepspeed-config sets data_types.grad_accum_dtype = {dtype!r} but {flag} was given; "
                             f"remove one of them")
        setattr(args, attr, value)


def grads_in_fp32(args: argparse.Namespace) -> bool:
    """Whether gradients accumulate over micro-batches and reduce over DP in fp32 ("main grads"): the one reading of
    the flags every consumer takes (ZeroConfig.accumulate_fp32_grads, hence the engine's buckets, the memory and comm
    ledgers and the `zero:` line; --auto-parallel's plan). Megatron-LM's rule (megatron/training/arguments.py): --bf16
    accumulates and reduces in fp32 unless --grad-reduce-in-bf16 (bf16 has 8 significand bits: summing m micro-batches
    and n ranks in it loses low bits of every gradient); --fp16 in fp16 unless --accumulate-allreduce-grads-in-fp32
    (loss scaling keeps its gradients in range, its 11 bits); fp32 trivially in fp32 (the flag there is an error,
    ZeroConfig's check). A hand-built Namespace without the newer flag reads it as not given."""
    if args.bf16 and not getattr(args, "grad_reduce_in_bf16", False):
        return True
    return bool(args.accumulate_allreduce_grads_in_fp32)


def check_grad_dtype_flags(args: argparse.Namespace) -> None:
    """--grad-reduce-in-bf16 only means something under --bf16, and says the opposite of
    --accumulate-allreduce-grads-in-fp32 (Megatron lets it win silently; here the contradiction is one line)."""
    if not getattr(args, "grad_reduce_in_bf16", False):
        return
    if not args.bf16:
        raise ValueError("--grad-reduce-in-bf16 needs --bf16 (it reduces bf16 gradients in bf16; --fp16 gradients "
                         "are fp16 unless --accumulate-allreduce-grads-in-fp32): add --bf16 or drop the flag")
    if args.accumulate_allreduce_grads_in_fp32:
        raise ValueError("--grad-reduce-in-bf16 and --accumulate-allreduce-grads-in-fp32 contradict each other "
                         "(bf16 or fp32 gradients); choose one (fp32 is the default under --bf16)")


def check_shm_gather(args: argparse.Namespace, zero: ZeroConfig, dims: ParallelDims, diloco, compressed: bool
                     ) -> None:
    """--shm-gather given by name where it cannot run, for a reason known now: one line (check_zero refuses it at
    stages 0 and 3). The default falls back to gloo's gather quietly; asked for by name, a silent fallback would
    leave the user believing it ran. ZeRO's group is dp x cp ranks, or a DiLoCo replica's dp / R x cp. What only the
    set-up can tell (room in /dev/shm, the pair on one host) is said at start-up instead (hybrid/train/loop.py)."""
    if "shm_gather" not in getattr(args, "explicit", set()) or not args.shm_gather or zero.stage not in (1, 2):
        return
    from hybrid.mesh import default_backend
    from hybrid.zero.shm import unusable_before_start
    group = dims.dp // (diloco.replicas or dims.dp) * dims.cp if diloco is not None else dims.dp * dims.cp
    why = unusable_before_start(group, default_backend()[1].type, compressed)
    if why:
        why += (f" (ZeRO runs inside each DiLoCo replica: dp / R ranks{' x cp' if dims.cp > 1 else ''})"
                if diloco is not None and group != 2 else "")
        raise ValueError(f"--shm-gather: {why}; drop the flag (the default takes the shared-memory gather wherever "
                         f"it runs, gloo's elsewhere)")


def check_zero(args: argparse.Namespace) -> ZeroConfig:
    if args.bf16 and args.fp16:
        raise ValueError("--bf16 and --fp16 are exclusive; choose one")
    if "cpu_adam" in getattr(args, "explicit", set()) and not args.offload_optimizer:
        # the engine runs torch's AdamW on the device unless the step is offloaded: the flag would do nothing
        raise ValueError(f"--cpu-adam {args.cpu_adam} picks the offloaded optimizer step; add --offload-optimizer "
                         f"or drop --cpu-adam")
    if "overlap_param_gather" in getattr(args, "explicit", set()) and args.zero_stage not in (1, 2):
        flag = "--overlap-param-gather" if args.overlap_param_gather else "--no-overlap-param-gather"
        raise ValueError(f"{flag} applies to --zero-stage 1 or 2 (stage 3 gathers each layer just before use, "
                         f"stage 0 gathers nothing); got --zero-stage {args.zero_stage}: drop the flag")
    if "shm_gather" in getattr(args, "explicit", set()) and args.shm_gather and args.zero_stage not in (1, 2):
        # asked for by name, it would do nothing: only stages 1-2 have a post-step gather (--no-shm-gather, gloo
        # always, is what every other stage does anyway, so it stays accepted)
        raise ValueError(f"--shm-gather applies to --zero-stage 1 or 2 (their post-step parameter all-gather); got "
                         f"--zero-stage {args.zero_stage}: drop the flag")
    check_grad_dtype_flags(args)
    precision = Precision.BF16 if args.bf16 else Precision.FP16 if args.fp16 else Precision.FP32
    return ZeroConfig(stage=args.zero_stage, precision=precision, offload_optimizer=args.offload_optimizer,
                      offload_params=args.offload_params, keep_gathered=args.zero3_keep_gathered,
                      bucket_bytes=args.zero_bucket_bytes, cpu_adam=CpuAdam(args.cpu_adam),
                      overlap_param_gather=args.overlap_param_gather, shm_gather=args.shm_gather,
                      accumulate_fp32_grads=grads_in_fp32(args),
                      **getattr(args, "loss_scaling", {}))


def run_config(args: argparse.Namespace, world: int) -> RunConfig:
    """Every check that needs no process group, then the typed config; raises ValueError naming the flag and the
    fix. `args` is left as given: the checks work on a copy (the DeepSpeed JSON fills in flags, a --load naming a
    checkpoint directory moves to the checkpoint config), which ends here."""
    ns = argparse.Namespace(**vars(args))
    check_numbers(ns)
    unsupported = apply_deepspeed_config(ns, world) if ns.deepspeed_config else []
    check_numbers(ns)  # again: the DeepSpeed config may have set them
    ns.min_lr = default_min_lr(ns.lr) if ns.min_lr is None else ns.min_lr  # after the JSON's optimizer.params.lr
    zero = ns.zero = check_zero(ns)  # metrics_args.check reads the precision from it
    fault = fault_args.check(ns)
    data = data_args.check(ns)
    ckpt_args.check_other_outputs(ns.save, {"--timeline": ns.timeline, "--metrics-file": ns.metrics_file,
                                            "--tensorboard-dir": ns.tensorboard_dir}, frozenset({"--tensorboard-dir"}))
    metrics = metrics_args.check(ns, world)
    checkpoint = ckpt_args.check(ns)  # a --load naming a checkpoint directory moves to checkpoint.load
    metrics_args.check_not_another_run(ns.metrics_file, ns.tensorboard_dir, continues=checkpoint.load is not None
                                       or checkpoint.fresh_start_note is not None)
    cfg = load_config(ns.model)
    check_files(ns, cfg)  # --load readable, outputs writable
    cfg = model_cli.check(ns, cfg)  # dropout flags; --load tensor shapes
    cp = cp_args.check(ns)
    dims = ParallelDims.from_world(world, tp=ns.tensor_model_parallel_size, pp=ns.pipeline_model_parallel_size,
                                   cp=cp.size)
    validate_model_dims(dims, cfg.num_heads, cfg.num_kv_heads, cfg.num_layers, cfg.ffn_hidden_size)
    warnings = check_sequence_parallel(ns, dims.tp) + fault_args.timeout_warnings(ns, dims.world)
    warnings += deepspeed_schedule_warning(ns)
    cp_args.check_model(cp, cfg, dims.tp, ns.seq_length, ns.sequence_parallel)
    moe = moe_args.check(ns, cfg, dims)  # hybrid/moe: None for a dense model
    if moe is not None and moe.expert_bias:  # the bias a resume needs is in the checkpoint
        moe_args.check_resume(ckpt_args.resume_keys(checkpoint))
    compress = compress_args.check(ns, dims.dp * dims.cp, resuming=checkpoint.load is not None,  # hybrid/compress
                                   moe=moe is not None)
    warnings += compress_args.onebit_warnings(compress, ns)
    diloco = diloco_args.check_run(ns, dims, checkpoint, zero, moe)  # hybrid/diloco: None without
    warnings += diloco_args.single_replica_warning(diloco, dims.dp)
    warnings += diloco_args.unsharded_zero_warning(diloco, dims, zero.stage)
    check_shm_gather(ns, zero, dims, diloco, compress.enabled)
    if ns.seq_length > cfg.max_position_embeddings:
        raise ValueError(f"--seq-length {ns.seq_length} exceeds the model's {cfg.max_position_embeddings} "
                         f"positions; use at most {cfg.max_position_embeddings}")
    if ns.sequence_parallel and ns.seq_length % dims.tp:
        fits = one_of([s for s in nearest_multiples(ns.seq_length, dims.tp) if s <= cfg.max_position_embeddings]
                      or [dims.tp])
        raise ValueError(f"--sequence-parallel needs --seq-length ({ns.seq_length}) divisible by "
                         f"--tensor-model-parallel-size ({dims.tp}); give --seq-length {fits}")
    check_compile(ns, cfg, dims.tp, moe is not None, cp.size)
    gbs = ns.global_batch_size or ns.micro_batch_size * dims.dp
    batch = BatchSpec(global_batch=gbs, micro_batch=ns.micro_batch_size, seq_length=ns.seq_length, dp=dims.dp)
    pipeline = check_pipeline(ns, cfg, dims, batch)
    return RunConfig(
        parallel=ParallelConfig(dims, ns.sequence_parallel, pipeline, ns.distributed_timeout_minutes),
        model=ModelSetup(ns.model, cfg, init_weights=ns.load, recompute=check_recompute(ns, pipeline),
                         compile=ns.compile),
        training=TrainingConfig(batch, train_iters=ns.train_iters, log_interval=ns.log_interval, seed=ns.seed,
                                timeline=ns.timeline, hardware=ns.hardware),
        optimizer=OptimizerConfig(lr=ns.lr, min_lr=ns.min_lr, weight_decay=ns.weight_decay, beta1=ns.adam_beta1,
                                  beta2=ns.adam_beta2, warmup_iters=ns.lr_warmup_iters, decay_style=ns.lr_decay_style,
                                  train_iters=ns.train_iters, clip_grad=ns.clip_grad, decay_iters=ns.lr_decay_iters,
                                  optimizer=ns.optimizer, sgd_momentum=ns.sgd_momentum),
        zero=zero, data=data, checkpoint=checkpoint, fault=fault, metrics=metrics, cp=cp, moe=moe, diloco=diloco,
        compress=compress,
        flags=tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(vars(ns).items()) if _recorded(v)),
        ds_unsupported=tuple(unsupported), warnings=warnings)


def check_recompute(args: argparse.Namespace, pipeline: PipelinePlan) -> Recompute:
    """--recompute-granularity, with megatron-core's --recompute-method / --recompute-num-layers, which it requires
    beside full granularity and refuses beside selective (TransformerConfig). Full here checkpoints each layer on its
    own: Megatron's uniform with units of 1 layer, and its block with N >= the layers of every model chunk (block
    checkpoints each of a chunk's first N layers alone, TransformerBlock._checkpointed_forward). Units of several
    layers (one saved input for N) and a subset of a chunk's layers are not implemented: refused by name."""
    method, n = args.recompute_method, args.recompute_num_layers
    given = [f for f, v in (("--recompute-method", method), ("--recompute-num-layers", n)) if v is not None]
    if not given:
        return Recompute(args.recompute_granularity or "none")
    both = " and ".join(given)
    if args.recompute_granularity != "full":
        now = f"--recompute-granularity {args.recompute_granularity}" if args.recompute_granularity else \
            "no --recompute-granularity"
        raise ValueError(f"{both} {'choose' if len(given) > 1 else 'chooses'} which layers --recompute-granularity "
                         f"full recomputes, and the run has "
                         f"{now} (megatron-core refuses it too); add --recompute-granularity full or drop {both}")
    most = max(len(stage) for stage in pipeline.stages)  # the layers of the largest model chunk
    if method is None or n is None:
        raise ValueError(_half_recompute_pair(method, n, most))
    if (method, n) == ("uniform", 1) or (method == "block" and n >= most):
        return Recompute.FULL
    if method == "uniform":
        raise ValueError(f"--recompute-method uniform --recompute-num-layers {n} checkpoints units of {n} layers "
                         f"(one saved input a unit), which is not implemented: full recomputes each layer on its "
                         f"own; give --recompute-num-layers 1 (or drop both flags: the same)")
    raise ValueError(f"--recompute-method block --recompute-num-layers {n} recomputes {n} layers of each model chunk "
                     f"(up to {most} layers here), and recomputing a subset is not implemented: give "
                     f"--recompute-num-layers {most} (every layer, as --recompute-granularity full alone), or "
                     f"--recompute-granularity selective (the attention core of every layer)")


def _half_recompute_pair(method: str | None, n: int | None, most: int) -> str:
    """The one line for --recompute-method without --recompute-num-layers or the reverse, naming the other flag's
    value that makes full (every layer alone). Megatron-LM's --recompute-num-layers defaulted to 1 until 2023
    (commit 2e193ae, before core 0.4: "make recompute-num-layers default to None"); megatron-core's TransformerConfig
    now refuses full granularity without it -- so a script that leans on the old default is refused here too, with
    the value it meant (1 for uniform) rather than run on a guess."""
    if n is None:
        given, fix = f"--recompute-method {method}", f"--recompute-num-layers {1 if method == 'uniform' else most}"
    else:  # uniform takes units of 1 only, block N >= a chunk's layers only (check_recompute)
        given = f"--recompute-num-layers {n}"
        fix = "--recompute-method " + ("uniform" if n == 1 else "block" if n >= most
                                       else f"block --recompute-num-layers {most}")
    return (f"{given} needs {fix.split()[0]} too (megatron-core's pair: Megatron-LM's --recompute-num-layers "
            f"defaults to None since 2023, and TransformerConfig refuses full without it); give {fix} (every layer "
            f"recomputed alone), or drop {given.split()[0]}: --recompute-granularity full alone is the same run")


SCHEDULE_DESTS = ("lr_warmup_iters", "lr_warmup_fraction", "lr_decay_style", "lr_decay_iters", "min_lr")


def deepspeed_schedule_warning(ns: argparse.Namespace) -> tuple[str, ...]:
    """A DeepSpeed config with an optimizer section and no scheduler (a scheduler section is refused with its
    nearest flags: ds_config._refuse_scheduler) runs at optimizer.params.lr throughout under DeepSpeed; here train.py's
    default schedule (a warm-up, a cosine decay) would run unless a schedule flag says otherwise. Said once at
    start-up when no schedule flag was given (round 22: the schedule line said it, without the why)."""
    ds = getattr(ns, "ds_settings", None)
    if ds is None or ds.optimizer is None or set(SCHEDULE_DESTS) & getattr(ns, "explicit", set()) or \
            (ns.lr_decay_style == "constant" and not ns.lr_warmup_iters):
        return ()
    warm = f"a warm-up over {ns.lr_warmup_iters} iterations, " if ns.lr_warmup_iters else ""
    decay = "" if ns.lr_decay_style == "constant" else f"{ns.lr_decay_style} decay to --min-lr {ns.min_lr:g}"
    return (f"--deepspeed-config has an optimizer section and no scheduler, which DeepSpeed runs at its lr "
            f"{ns.lr:g} throughout; this run has train.py's default schedule, {warm}{decay}".rstrip(", ")
            + ": for DeepSpeed's, pass --lr-decay-style constant --lr-warmup-iters 0",)


def check_sequence_parallel(ns: argparse.Namespace, tp: int) -> tuple[str, ...]:
    """--sequence-parallel splits norms and dropout over the TP group: at tp 1 there is no group to split over.
    Megatron-LM's validate_args turns it off there with a warning ("Disabling sequence parallelism because tensor
    model parallelism is disabled"); so do we, on the checks' copy, so the flags a checkpoint records say what ran.
    Returns the start-up warnings (hybrid/train/main.py prints them once, on rank 0)."""
    if not ns.sequence_parallel or tp > 1:
        return ()
    ns.sequence_parallel = False
    return ("--sequence-parallel is off: it splits norms and dropout over the tensor-parallel group and "
            "--tensor-model-parallel-size is 1 (Megatron-LM turns it off the same way); drop the flag, or raise "
            "--tensor-model-parallel-size",)


def _recorded(value) -> bool:
    """A flag value a checkpoint records: a scalar, or a list of them (--data-path)."""
    scalar = (str, int, float, bool, type(None))
    return isinstance(value, scalar) or (isinstance(value, list) and all(isinstance(x, scalar) for x in value))


def check_args(args: argparse.Namespace, world: int) -> tuple[ModelConfig, ParallelDims, BatchSpec, PipelinePlan]:
    """`run_config`'s checks; (model config, dims, batch, pipeline plan) of the run they accept (`hybrid plan
    --emit-args` asks it of each plan)."""
    run = run_config(args, world)
    return run.model.arch, run.parallel.dims, run.training.batch, run.parallel.pipeline


def configure(args: argparse.Namespace, world: int):
    """The whole command line, as train.py runs it: --auto-parallel's plan (when asked), every check, the host's
    memory, then the datasets opened. Returns (RunConfig, DataSource); `args` is left as given. The DeepSpeed JSON
    is read once, first (`deepspeed_settings`); a later check's error names a value it set by its JSON key (the
    user wrote `gradient_clipping`, not --clip-grad: ds_config.name_keys)."""
    ns = argparse.Namespace(**vars(args))
    ds = deepspeed_settings(ns)
    try:
        check_numbers(ns)
        if ns.auto_parallel:
            apply_auto_parallel(ns, world)
        run = run_config(ns, world)
        check_host(run, world)
        return run, check_corpus(ns, run)
    except ValueError as e:
        if ds is None:
            raise
        raise ValueError(name_keys(str(e), deepspeed_origins(ds, getattr(args, "explicit", set()), DS_FLAGS))) \
            from None


COMPILE_ZERO_STAGES = (0, 1, 2, 3)


def check_compile(args: argparse.Namespace, cfg: ModelConfig, tp: int, moe: bool, cp: int = 1) -> None:
    """--compile (a compiled forward per block, hybrid/train/loop.py compile_blocks) with what it has been run with:
    every ZeRO stage (ZeRO 3's hooks gather a block's parameters before its compiled code runs and free them after:
    the storage shrinks to 0 bytes, shapes and strides stay, so dynamo's guards hold, as torchtitan's FSDP2 +
    per-block compile), context parallelism with every comm type, and full and selective recomputation of dense and
    MoE models (tests/test_compile_recompute.py, tests/test_compose20_compile.py): they keep the checkpoint eager
    around the compiled block body (it replays the tensor-parallel dropout streams, which torch.compile cannot
    trace, and the MoE router's choices; selective: the attention core's checkpoint inside the body). The MoE layer
    and the CP attention's exchange run eagerly inside the compiled body (hybrid/moe/layer.py, hybrid/cp/attention.py):
    a graph break each. selective-op's op-level policy must see the block's operators, so its checkpoint is traced
    inside the compiled forward -- and a traced checkpoint cannot hold a graph break: dynamo then runs the whole
    block eagerly (measured: 0 graphs compiled with an MoE layer or a CP exchange in it). So selective-op needs a
    block with no dropout stream to replay and no graph break in it: no TP collective, no MoE layer, no CP."""
    if not args.compile or args.recompute_granularity != "selective-op":
        return
    if cfg.dropout > 0 or (cfg.attention_dropout or 0) > 0:
        raise ValueError("--compile with --recompute-granularity selective-op needs --hidden-dropout 0 and "
                         "--attention-dropout 0 (the dropout streams' replay cannot be traced into the compiled "
                         "checkpoint); use --recompute-granularity full or selective")
    check_traced_checkpoint(tp, cp, moe)


def check_traced_checkpoint(tp: int, cp: int, moe: bool) -> None:
    """--compile with selective-op: its checkpoint is traced inside the compiled block, which holds no graph break
    (check_compile)."""
    breaks = [(tp > 1, f"runs at --tensor-model-parallel-size 1 (the TP collectives break the graph of the traced "
                       f"checkpoint; got {tp})"),
              (cp > 1, f"runs at --context-parallel-size 1 (the CP attention's exchange runs eagerly, a graph break "
                       f"the traced checkpoint cannot hold: nothing of the block would compile; got {cp})"),
              (moe, "does not run on an MoE model (its MoE layer runs eagerly, a graph break the traced checkpoint "
                    "cannot hold: nothing of the block would compile)")]
    for broken, why in breaks:
        if broken:
            raise ValueError(f"--compile with --recompute-granularity selective-op {why}; use "
                             f"--recompute-granularity full or selective")


def apply_auto_parallel(args: argparse.Namespace, world: int) -> None:
    """Ask the planner for the fastest layout that fits (hybrid/planner) and set the layout flags it decides
    (hybrid/planner/train_flags.py: the one plan-to-flags mapping); check_args then checks them as any flags.

    The device is this process's: a CUDA GPU's memory and the nearest GPU preset, or on CPU the `cpu`
    preset with this machine's memory shared by the local ranks. Recomputation is pinned to what was given
    (none by default); the planner models our runtime exactly on CPU (fp32, flash attention: docs/planner.md).
    With --context-parallel-size > 1 the CP size and --cp-comm-type stay the user's and the rest is planned
    around them (`_plan_with_cp`)."""
    import dataclasses

    from hybrid.planner import Cluster, SearchSpace, Workload
    from hybrid.planner.layout import ZeroStage
    from hybrid.planner.ops import KernelProfile
    from hybrid.planner.train_flags import MAX_GLOBAL_BATCH, layout_flags

    check_auto_parallel_conflicts(args)
    if args.global_batch_size is None:
        raise ValueError("--auto-parallel needs --global-batch-size (the planner picks the micro-batch)")
    if args.global_batch_size > MAX_GLOBAL_BATCH:
        raise ValueError(f"--auto-parallel plans a --global-batch-size of at most {MAX_GLOBAL_BATCH}, "
                         f"got {args.global_batch_size}")
    precision = Precision.BF16 if (args.bf16 or args.fp16) else Precision.FP32
    cfg = load_config(args.model)
    if args.compile and args.recompute_granularity == "selective-op":  # refused whatever the plan: before the search
        check_traced_checkpoint(1, args.context_parallel_size, cfg.num_experts > 0)
    hw, profile = _planning_device(args, world, precision.planned)
    work = Workload(cfg, global_batch=args.global_batch_size, seq_length=args.seq_length,
                    precision=precision.planned, activations=profile, kernels=KernelProfile.EAGER,  # our layers
                    fp32_grads=grads_in_fp32(args) and precision.mixed)
    # --compile runs with every ZeRO stage (check_compile): the search keeps to what the run accepts
    pinned_ep = "expert_model_parallel_size" in getattr(args, "explicit", set())  # MoE: else the planner's EP
    pinned_etp = "expert_tensor_parallel_size" in getattr(args, "explicit", set())  # and expert-TP
    if cfg.num_experts and (pinned_ep or pinned_etp):  # one that cannot fold is its one line, not "no layout fits"
        from hybrid.moe.parallel import ExpertLayout  # (a stage's ranks divide the world: pp 1 is the widest)
        ExpertLayout(ParallelDims(dp=world), args.expert_model_parallel_size,
                     args.expert_tensor_parallel_size).check_experts(cfg.num_experts, cfg.moe_ffn_hidden_size)
    # and no zero-bubble schedule (check_zero_bubble refuses it with --compile: B could not leave W to later)
    traced_sac = args.compile and args.recompute_granularity == "selective-op"  # check_compile: at tp 1 only
    space = SearchSpace(recompute=(Recompute(args.recompute_granularity or "none"),), tp=(1,) if traced_sac else None,
                        zero=tuple(ZeroStage(z) for z in COMPILE_ZERO_STAGES) if args.compile else None,
                        zero_bubble=(False,) if args.compile else None,
                        expert_parallel=(args.expert_model_parallel_size,) if pinned_ep else None,
                        expert_tensor_parallel=(args.expert_tensor_parallel_size,) if pinned_etp else None,
                        dp_replicate=(1,))  # no HSDP: this runtime's ZeRO 3 shards over all the DP ranks
    cluster = Cluster(gpus=world, hw=hw)
    cp = args.context_parallel_size
    plan, seconds, note = (_plan_with_cp(args, work, cluster, space) if cp > 1 else _plan_without_cp(work, cluster, space))
    if plan is None:
        at = f" at --context-parallel-size {cp} ({args.cp_comm_type})" if cp > 1 else ""
        raise ValueError(f"--auto-parallel: no layout of {args.model} fits {world} x {hw.memory_gb:.1f} GB{at}; "
                         f"run `hybrid plan` to see why")
    lay = plan.layout if cp == 1 else dataclasses.replace(plan.layout, dp=plan.layout.dp // cp)  # the true dp
    for dest, value in layout_flags(work, lay).items():
        setattr(args, dest, value)
    experts = plan.experts  # an MoE model: the planner's EP (hybrid/planner/moe.py)
    if experts is not None:
        args.expert_model_parallel_size, args.expert_tensor_parallel_size = experts.ep, experts.etp
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"auto-parallel: tp {lay.tp} x pp {lay.pp} (v {lay.v}) x dp {lay.dp}"
              + (f" x cp {cp} ({args.cp_comm_type})" if cp > 1 else "") + f", micro-batch {lay.micro_batch}, "
              f"ZeRO {int(lay.zero)}, offload {lay.offload.value}, sp {lay.sequence_parallel}, schedule "
              f"{lay.schedule.value}" + (f", ep {experts.ep}" if experts else "")
              + (f", expert-tp {experts.etp}" if experts and experts.etp > 1 else "")
              + f" ({auto_parallel_time(seconds, hw.name, not args.hardware and not torch.cuda.is_available())})"
              + (f"; {note}" if note else ""), flush=True)


def auto_parallel_time(seconds: float, hw_name: str, placeholder: bool) -> str:
    """The auto-parallel line's time: the plan's step on the device's rates, or on a CPU without --hardware the
    cpu preset's placeholder rates, which rank the layouts but time nothing -- the run's own `planner:` line says
    "no time" for them (round 21: the two lines disagreed, "predicted 0.002 s/step on cpu" above "no time")."""
    if placeholder:
        return (f"ranked on the {hw_name} preset's placeholder rates, no time: `hybrid calibrate --out cpu.json`, "
                f"then --hardware cpu.json")
    return f"predicted {seconds:.3g} s/step on {hw_name}"


def _plan_without_cp(work, cluster, space):
    """(the best Plan or None, its step seconds, why its schedule) from the plain search."""
    from hybrid.planner import search

    result = search(work, cluster, space, top=1)
    if not result.plans:
        return None, 0.0, None
    best = result.plans[0]
    return best, best.seconds, result.notes.get(best.layout.short())


def _plan_with_cp(args: argparse.Namespace, work, cluster, space):
    """--auto-parallel with --context-parallel-size CP: the CP size and --cp-comm-type are the user's (held
    fixed: the sequence length that needs CP is the user's decision, and `hybrid plan --context-parallel-size
    1,2,4,8` searches it); the planner lays the rest out around them (hybrid/planner/context.py's search_cp:
    the reduced problem at s / CP tokens a rank, plus CP's attention and transfers). Returns the reduced Plan
    (its dp counts dp x CP) of the fastest CP layout train.py accepts (sequence parallelism needs each CP rank's
    s / CP tokens divisible by tp: hybrid/cp/args.py), its step seconds (CP included), None for the note."""
    from hybrid.cp.attention import CommType
    from hybrid.planner import context

    cp, seq = args.context_parallel_size, args.seq_length
    if seq % (2 * cp) or cluster.gpus % cp:
        raise ValueError(f"--auto-parallel with --context-parallel-size {cp}: it must divide the {cluster.gpus} "
                         f"ranks and 2 x {cp} the --seq-length {seq} (load-balanced causal chunks)")
    plans = context.search_cp(work, cluster, space, cps=(cp,), comms=(CommType(args.cp_comm_type),),
                              top=context.SEARCH_MARGIN)
    ok = [p for p in plans if not p.base.layout.sequence_parallel or (seq // cp) % p.base.layout.tp == 0]
    return (ok[0].base, ok[0].total_s, None) if ok else (None, 0.0, None)


def _planning_device(args: argparse.Namespace, world: int, precision: Precision):
    """(Hardware, ActivationProfile) of this process's device: a CUDA GPU (its memory, the nearest preset, flash
    attention in bf16), or the CPU preset with this host's memory shared by the local ranks (fp32 flash);
    --hardware's profile when given."""
    import dataclasses

    from hybrid.planner import ActivationProfile, hardware

    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        kind = next((k for k in ("h200", "h100-80g") if k.split("-")[0] in props.name.lower()), "a100-80g")
        hw = dataclasses.replace(hardware(kind), memory_gb=props.total_memory / 1e9,
                                 memory_bytes=float(props.total_memory))  # what this card holds
        profile = ActivationProfile.BF16_FLASH  # models/common.py attends with SDPA: flash on a GPU
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        hw = dataclasses.replace(hardware("cpu"), memory_gb=total / local / 1e9, gpus_per_node=local,
                                 memory_bytes=None)
        profile = ActivationProfile.FP32_FLASH
    if args.hardware:
        from hybrid.planner import calibrate
        if not os.path.isfile(args.hardware):
            raise ValueError(metrics_args.missing_profile(args.hardware))
        hw = calibrate.load_hardware(args.hardware, precision).with_overrides(memory_gb=hw.memory_gb)
    return hw, profile


# the flags whose values --auto-parallel chooses (dest, what it chooses), and the DeepSpeed keys that set them
AUTO_CHOSEN = (("tensor_model_parallel_size", "tp"), ("pipeline_model_parallel_size", "pp"),
               ("num_layers_per_virtual_pipeline_stage", "the virtual stages"),
               ("virtual_pipeline_model_parallel_size", "the virtual stages"),
               ("pipeline_schedule", "the schedule (interleaved when it picks virtual stages)"),
               ("pipeline_layers_per_stage", "the layers of each stage"),
               ("micro_batch_size", "the micro-batch"), ("zero_stage", "the ZeRO stage"),
               ("sequence_parallel", "sequence parallelism"), ("offload_optimizer", "the offload"),
               ("offload_params", "the offload"))
AUTO_CHOSEN_DS = (("zero_stage", "zero_optimization.stage", "the ZeRO stage"),
                  ("offload_optimizer", "zero_optimization.offload_optimizer", "the offload"),
                  ("offload_params", "zero_optimization.offload_param", "the offload"),
                  ("micro_batch", "train_micro_batch_size_per_gpu", "the micro-batch"))


def check_auto_parallel_conflicts(args: argparse.Namespace) -> None:
    """--auto-parallel sets the layout flags itself: one also given on the command line (or by the DeepSpeed
    JSON) would be silently overwritten, or would overwrite the plan -- an error naming both instead."""
    explicit = getattr(args, "explicit", set())
    for dest, what in AUTO_CHOSEN:
        if dest in explicit:
            raise ValueError(f"--auto-parallel chooses {what}, but --{dest.replace('_', '-')} was given; "
                             f"drop one of them")
    ds = deepspeed_settings(args)
    if ds is not None:
        for attr, key, what in AUTO_CHOSEN_DS:
            if getattr(ds, attr) is not None:
                raise ValueError(f"--auto-parallel chooses {what}, but --deepspeed-config sets {key}; drop the key "
                                 f"or --auto-parallel")
