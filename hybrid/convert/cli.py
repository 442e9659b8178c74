"""`hybrid convert SRC DST`: the source format is detected, `--to` picks the target (default: the other one)."""

from __future__ import annotations

import argparse

from hybrid.cliutil import HelpFormatter, int_in
from hybrid.convert.common import (DTYPES, QUIET, Progress, check_dst_outside_checkpoints,
                                   check_dst_outside_src)
from hybrid.convert.detect import Format, detect
from hybrid.convert.presharded import MICRO_BATCH, PP_FLAG, SEQ_LENGTH, TP_FLAG, TargetLayout
from hybrid.convert.safetensors_out import parse_size


def run(args: argparse.Namespace) -> None:
    from hybrid.convert import deepspeed_to_hybrid, hf_to_hybrid, hybrid_to_hf
    fmt = detect(args.src)
    check_dst_outside_src(args.src, args.dst)
    check_dst_outside_checkpoints(args.dst)
    to = args.to or ("hf" if fmt is Format.HYBRID else "hybrid")
    verify = not args.no_verify
    progress = QUIET if args.quiet else Progress()
    target = TargetLayout(args.target_tensor_parallel_size, args.target_pipeline_parallel_size,
                          args.pipeline_partition, args.pipeline_layers_per_stage, args.seq_length,
                          args.micro_batch_size)
    if fmt is Format.HYBRID:
        given = _target_flags_given(args)
        if given:
            raise ValueError(f"{given[0]} pre-shards a conversion to hybrid; SRC {args.src!r} is a hybrid "
                             f"checkpoint, which train.py loads at any layout as it is")
        if to != "hf":
            raise ValueError(f"--to hybrid: SRC {args.src!r} is already a hybrid checkpoint (train.py loads it at "
                             f"any layout); use --to hf")
        hybrid_to_hf(args.src, args.dst, DTYPES[args.dtype], parse_size(args.max_shard_size), args.model,
                     args.iteration, verify, progress=progress)
        return
    if to != "hybrid":
        raise ValueError(f"--to hf: SRC {args.src!r} is a {fmt.value} checkpoint; only a hybrid checkpoint exports "
                         f"to transformers (convert to hybrid first)")
    whys = {"--dtype": "a hybrid checkpoint holds fp32 master weights",
            "--iteration": f"it picks an iteration of a hybrid SRC, not of a {fmt.value} one",
            "--max-shard-size": "a hybrid checkpoint is written as train.py saves it, one file per rank"}
    for flag, given in (("--dtype", args.dtype != "fp32"), ("--iteration", args.iteration is not None),
                        ("--max-shard-size", args.max_shard_size != "5GB")):
        if given:
            why = whys[flag]
            raise ValueError(f"{flag} applies to --to hf only ({why}); drop {flag}")
    _check_partition_flags(args)
    if fmt is Format.HF:
        if args.model is not None:
            raise ValueError("--model: a transformers SRC carries its own config.json; drop --model")
        hf_to_hybrid(args.src, args.dst, verify, target=target, progress=progress)
    else:
        if args.model is None:
            raise ValueError(f"SRC {args.src!r} is a DeepSpeed checkpoint, which holds no model config; give "
                             f"--model (the transformers config folder or preset it was trained from)")
        deepspeed_to_hybrid(args.src, args.dst, args.model, verify, target=target, progress=progress)


def _check_partition_flags(args: argparse.Namespace) -> None:
    """The partition flags split the layers over --target-pipeline-parallel-size stages; --seq-length and
    --micro-batch-size price the balanced split only. Given where nothing reads them, they would be ignored."""
    default = TargetLayout()
    split = [flag for flag, given in (("--pipeline-partition balanced", args.pipeline_partition != default.partition),
                                      ("--pipeline-layers-per-stage", args.pipeline_layers_per_stage is not None))
             if given]
    if split and args.target_pipeline_parallel_size == 1:
        raise ValueError(f"{split[0]} splits the layers over {PP_FLAG} stages, and it is 1: give "
                         f"{PP_FLAG} N (the run's pipeline size) or drop {split[0].split()[0]}")
    if args.pipeline_partition != "balanced":
        for flag, value, usual in (("--seq-length", args.seq_length, default.seq_length),
                                   ("--micro-batch-size", args.micro_batch_size, default.micro_batch)):
            if value != usual:
                raise ValueError(f"{flag} prices the layers of --pipeline-partition balanced only; add "
                                 f"--pipeline-partition balanced (with {PP_FLAG} N) or drop {flag}")


def _target_flags_given(args: argparse.Namespace) -> list[str]:
    """The pre-sharding flags set away from their defaults."""
    default = TargetLayout()
    return [flag for flag, value, usual in (
        (TP_FLAG, args.target_tensor_parallel_size, default.tp),
        (PP_FLAG, args.target_pipeline_parallel_size, default.pp),
        ("--pipeline-partition", args.pipeline_partition, default.partition),
        ("--pipeline-layers-per-stage", args.pipeline_layers_per_stage, default.layers_per_stage),
        ("--seq-length", args.seq_length, default.seq_length),
        ("--micro-batch-size", args.micro_batch_size, default.micro_batch)) if value != usual]


# Megatron-LM's tools/checkpoint/convert.py flags, which a Megatron user types first: where each setting lives here
# (the unknown-flag line, hybrid.cliutil.OneLineParser's `hints`, instead of "see --help")
MEGATRON_CONVERTER_HINTS = {
    "--model-type": "--model-type: the model comes from SRC's config.json (or --model CONFIG); drop it",
    "--loader": "--loader: SRC's format is detected from its files; drop it",
    "--saver": "--saver: the target format is --to hf or --to hybrid (default: the other one)",
    "--load-dir": "--load-dir: give the source as SRC (hybrid convert LOAD_DIR SAVE_DIR)",
    "--save-dir": "--save-dir: give the target as DST (hybrid convert LOAD_DIR SAVE_DIR)",
    # round 17: the output flags of other converters and of this project's other commands ("see --help")
    **{flag: f"{flag}: give the target as DST, the second word (hybrid convert SRC DST)"
       for flag in ("--out", "--output", "--output-dir", "--output_dir", "--dst", "--save")},
    # round 15: "did you mean --target-pipeline-parallel-size?" for Megatron's MoE saver flag
    "--target-expert-parallel-size": "--target-expert-parallel-size: experts are stored whole and train.py's "
                                     "--load splits them over any --expert-model-parallel-size; drop the flag",
    "--target-expert-model-parallel-size": "--target-expert-model-parallel-size: experts are stored whole and "
                                           "train.py's --load splits them over any --expert-model-parallel-size; "
                                           "drop the flag",
}


# round 16's new-user pass: transformers' save_pretrained / train.py's names for what convert names otherwise ("see
# --help"; --dtype bfloat16, torch's name, "invalid choice" alone)
_DTYPE = "give --dtype bf16 (or fp16, fp32: the exported weights' dtype, --to hf)"
MEGATRON_CONVERTER_HINTS.update({
    "--torch-dtype": f"--torch-dtype: {_DTYPE}",
    "--torch_dtype": f"--torch_dtype: {_DTYPE}",
    "--ckpt-step": "--ckpt-step: give --iteration N (or SRC as the checkpoint's iter_NNNNNNN directory)",
    "--safe-serialization": "--safe-serialization: the weights are always written as safetensors; drop the flag",
    "--push-to-hub": "--push-to-hub: not implemented (nothing here goes online): upload DST with huggingface_hub's "
                     "upload_folder; drop the flag",
    **{f"--dtype={name}": f"torch's {name} is --dtype {short} here" for name, short in (
        ("bfloat16", "bf16"), ("float16", "fp16"), ("half", "fp16"), ("float32", "fp32"), ("float", "fp32"))},
})


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("convert",
                              help="convert checkpoints: transformers <-> hybrid, DeepSpeed (ZeRO, MoE) -> hybrid",
                              description=__doc__ + "\n\nSee docs/convert.md.", formatter_class=HelpFormatter,
                              hints=MEGATRON_CONVERTER_HINTS)
    p.add_argument("src", metavar="SRC", help="a transformers model folder, a hybrid checkpoint directory (or one "
                   "iter_*/ of it) or a DeepSpeed checkpoint folder (latest + global_step*/; a DeepSpeed-MoE one, with "
                   "layer_*_expert_* files, imports into a Mixtral --model)")
    p.add_argument("dst", metavar="DST", help="a new (or empty) directory; written in a temporary one and renamed")
    p.add_argument("--to", choices=("hf", "hybrid"), default=None,
                   help="target format (default: hf for a hybrid SRC, hybrid otherwise)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp32", help="--to hf: dtype of the exported weights")
    p.add_argument("--max-shard-size", default="5GB", metavar="SIZE",
                   help="--to hf: largest safetensors file (above it: shards + model.safetensors.index.json)")
    p.add_argument("--model", default=None, metavar="CONFIG",
                   help="the model config (preset, config folder or config.json): needed for a DeepSpeed SRC; for "
                        "a hybrid SRC it overrides the config the checkpoint records")
    p.add_argument("--iteration", type=int_in(0), default=None, metavar="N",
                   help="hybrid SRC: export iteration N (default: the one `latest` names)")
    p.add_argument(TP_FLAG, type=int_in(1), default=1, metavar="N",
                   help="--to hybrid: write the chunks a run at tensor-parallel size N saves (loading reshards to "
                        "any layout either way; this makes the first load at N read one chunk per rank)")
    p.add_argument(PP_FLAG, type=int_in(1), default=1, metavar="N",
                   help="--to hybrid: as above, for N pipeline stages, split as train.py splits them with the "
                        "partition flags below")
    g = p.add_argument_group("pipeline partition (--to hybrid with --target-pipeline-parallel-size; train.py's "
                             "flags: give the run's)")
    g.add_argument("--pipeline-partition", choices=("uniform", "balanced"), default="uniform",
                   help="balanced: split layers by FLOPs, counting the embedding and the LM head")
    g.add_argument("--pipeline-layers-per-stage", default=None, metavar="N,N,...",
                   help="layers of each stage by hand, e.g. 1,2 (3 layers on 2 stages)")
    g.add_argument("--seq-length", type=int_in(1), default=SEQ_LENGTH, metavar="N",
                   help="--pipeline-partition balanced: the run's sequence length (the split's FLOPs depend on it)")
    g.add_argument("--micro-batch-size", type=int_in(1), default=MICRO_BATCH, metavar="N",
                   help="--pipeline-partition balanced: the run's micro-batch size")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the logits check of the converted model against the source")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines on stderr (each file read, every tenth of the tensors written, each "
                        "rank's chunks, the verification); the summary lines on stdout stay")
    p.set_defaults(func=run)
    return p
