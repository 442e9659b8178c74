"""Model flags of the training entry point: Megatron's dropout overrides, and the `--load`
checkpoint's shapes checked against the model config before any process group starts.

    add_arguments(parser)      # in hybrid/train/args.py's parse_args
    cfg = check(args, cfg)     # in check_args, after load_config
"""

from __future__ import annotations

import argparse
import dataclasses

from models.config import ModelConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("dropout", "None keeps the model config's probabilities")
    g.add_argument("--hidden-dropout", type=float, default=None,
                   help="dropout on the embedding output and each residual branch (GPT-2: embd_pdrop and "
                        "resid_pdrop; Llama family: none)")
    g.add_argument("--attention-dropout", type=float, default=None,
                   help="dropout on the attention probabilities (GPT-2: attn_pdrop; Llama family: attention_dropout)")


def check(args: argparse.Namespace, cfg: ModelConfig) -> ModelConfig:
    """`cfg` with the dropout flags applied; ValueError for a probability outside [0, 1) or a
    `--load` checkpoint whose tensors do not have the shapes `cfg` implies."""
    for flag in ("hidden_dropout", "attention_dropout"):
        p = getattr(args, flag, None)
        if p is not None and not 0.0 <= p < 1.0:
            raise ValueError(f"--{flag.replace('_', '-')} {p} must be in [0, 1)")
    if getattr(args, "hidden_dropout", None) is not None:
        cfg = dataclasses.replace(cfg, dropout=args.hidden_dropout, embedding_dropout=args.hidden_dropout)
    if getattr(args, "attention_dropout", None) is not None:
        cfg = dataclasses.replace(cfg, attention_dropout=args.attention_dropout)
    if getattr(args, "load", None):
        from models.hf_io import check_checkpoint
        check_checkpoint(cfg, args.load)
    return cfg
