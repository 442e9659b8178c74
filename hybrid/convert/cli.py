"""`hybrid convert SRC DST`: the source format is detected, `--to` picks the target (default: the other one)."""

from __future__ import annotations

import argparse

from hybrid.cliutil import HelpFormatter, int_in
from hybrid.convert.common import DTYPES
from hybrid.convert.detect import Format, detect
from hybrid.convert.presharded import PP_FLAG, TP_FLAG, TargetLayout
from hybrid.convert.safetensors_out import parse_size


def run(args: argparse.Namespace) -> None:
    from hybrid.convert import deepspeed_to_hybrid, hf_to_hybrid, hybrid_to_hf
    fmt = detect(args.src)
    to = args.to or ("hf" if fmt is Format.HYBRID else "hybrid")
    verify = not args.no_verify
    target = TargetLayout(args.target_tensor_parallel_size, args.target_pipeline_parallel_size)
    if fmt is Format.HYBRID:
        if target != TargetLayout():
            flag = TP_FLAG if target.tp != 1 else PP_FLAG
            raise ValueError(f"{flag} pre-shards a conversion to hybrid; SRC {args.src!r} is a hybrid checkpoint, "
                             f"which train.py loads at any layout as it is")
        if to != "hf":
            raise ValueError(f"--to hybrid: SRC {args.src!r} is already a hybrid checkpoint (train.py loads it at "
                             f"any layout); use --to hf")
        hybrid_to_hf(args.src, args.dst, DTYPES[args.dtype], parse_size(args.max_shard_size), args.model,
                     args.iteration, verify)
        return
    if to != "hybrid":
        raise ValueError(f"--to hf: SRC {args.src!r} is a {fmt.value} checkpoint; only a hybrid checkpoint exports "
                         f"to transformers (convert to hybrid first)")
    for flag, given in (("--dtype", args.dtype != "fp32"), ("--iteration", args.iteration is not None),
                        ("--max-shard-size", args.max_shard_size != "5GB")):
        if given:
            raise ValueError(f"{flag} applies to --to hf only (a hybrid checkpoint holds fp32 master weights)")
    if fmt is Format.HF:
        if args.model is not None:
            raise ValueError("--model: a transformers SRC carries its own config.json; drop --model")
        hf_to_hybrid(args.src, args.dst, verify, target=target)
    else:
        if args.model is None:
            raise ValueError(f"SRC {args.src!r} is a DeepSpeed checkpoint, which holds no model config; give "
                             f"--model (the transformers config folder or preset it was trained from)")
        deepspeed_to_hybrid(args.src, args.dst, args.model, verify, target=target)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("convert", help="convert checkpoints: transformers <-> hybrid, DeepSpeed -> hybrid",
                              description=__doc__ + "\n\nSee docs/convert.md.", formatter_class=HelpFormatter)
    p.add_argument("src", metavar="SRC", help="a transformers model folder, a hybrid checkpoint directory (or one "
                   "iter_*/ of it) or a DeepSpeed checkpoint folder (latest + global_step*/)")
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
                   help="--to hybrid: as above, for N pipeline stages (train.py's uniform partition)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the logits check of the converted model against the source")
    p.set_defaults(func=run)
    return p
