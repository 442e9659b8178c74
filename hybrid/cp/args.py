"""Context-parallel and packed-document flags of train.py (Megatron-LM's names): `add_arguments` builds them,
`check` validates the flags alone, `check_model` what needs the model and the layout -- all before any process
group. hybrid/train/args.py calls them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from hybrid.cliutil import check_number
from hybrid.cp.attention import CommType, CPContext, check_ulysses_heads
from hybrid.cp.balance import check_divisible
from hybrid.cp.data import TokenSharding


@dataclass(frozen=True)
class CPConfig:
    """Attributes:
        size: ranks splitting each sequence (`--context-parallel-size`); 1: no context parallelism.
        comm_type: how keys and values reach every query (`--cp-comm-type`): p2p ring, a2a Ulysses, allgather.
        reset_attention_mask: each token attends only within its document of a packed sample
            (`--reset-attention-mask`; documents end with the tokenizer's end-of-document token).
        reset_position_ids: positions restart at 0 in each document (`--reset-position-ids`).
        eod: the end-of-document token id (from `--tokenizer-type`), when a reset flag needs it; else None.
    """

    size: int = 1
    comm_type: CommType = CommType.P2P
    reset_attention_mask: bool = False
    reset_position_ids: bool = False
    eod: int | None = None

    def sharding(self, cp_rank: int) -> TokenSharding:
        """How the data loader cuts each micro-batch for CP rank `cp_rank`."""
        return TokenSharding(self.size, cp_rank, self.reset_attention_mask, self.reset_position_ids, self.eod)

    def context(self, mesh) -> CPContext | None:
        """The attention layers' context (None without CP)."""
        return CPContext(mesh.cp, self.comm_type) if self.size > 1 else None


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("context parallelism and packed documents")
    g.add_argument("--context-parallel-size", type=int, default=1, metavar="CP",
                   help="ranks splitting each sequence (load-balanced causal chunks); dp = world / (tp x cp x pp)")
    g.add_argument("--cp-comm-type", choices=[c.value for c in CommType], default=CommType.P2P.value,
                   help="p2p: ring attention, KV passed round the CP ring overlapped with compute; a2a: Ulysses "
                        "all-to-all (heads per TP rank divisible by CP); allgather: gather K, V")
    g.add_argument("--reset-attention-mask", action="store_true",
                   help="attend only within each document of a packed sample (documents end with the "
                        "tokenizer's end-of-document token; needs --tokenizer-type)")
    g.add_argument("--reset-position-ids", action="store_true",
                   help="restart position ids at 0 after each end-of-document token (needs --tokenizer-type)")


def check(args: argparse.Namespace) -> CPConfig:
    """The flags alone: ValueError naming the flag. Reads the tokenizer for its end-of-document id when a reset
    flag is given."""
    size = args.context_parallel_size
    check_number("--context-parallel-size", size, 1, integer=True)
    if size == 1 and "cp_comm_type" in getattr(args, "explicit", set()):  # as `hybrid plan`: no CP, no exchange
        raise ValueError("--cp-comm-type picks how the --context-parallel-size ranks exchange keys and values; at "
                         "--context-parallel-size 1 nothing is exchanged: give --context-parallel-size > 1 or drop "
                         "--cp-comm-type")
    eod = None
    resets = [f for f, on in (("--reset-attention-mask", args.reset_attention_mask),
                              ("--reset-position-ids", args.reset_position_ids)) if on]
    if resets:
        if not getattr(args, "tokenizer_type", None):
            raise ValueError(f"{resets[0]} finds documents by the end-of-document token: give --tokenizer-type "
                             f"(ByteLevel, or HuggingFaceTokenizer with --tokenizer-model) of the data")
        from hybrid.data.tokenizer import build_tokenizer
        eod = build_tokenizer(args.tokenizer_type, getattr(args, "tokenizer_model", None)).eod
        if eod is None:
            raise ValueError(f"{resets[0]}: --tokenizer-model {args.tokenizer_model} has no end-of-document token "
                             f"(<|endoftext|>, </s>, ...); drop {resets[0]} or use a tokenizer with one")
    return CPConfig(size=size, comm_type=CommType(args.cp_comm_type), reset_attention_mask=args.reset_attention_mask,
                    reset_position_ids=args.reset_position_ids, eod=eod)


def kv_heads_per_tp_rank(num_kv_heads: int, tp: int) -> int:
    """Key/value heads a TP rank holds: kv / tp, or one (replicated) when tp exceeds them (models.common.kv_spec)."""
    return num_kv_heads // tp if num_kv_heads % tp == 0 else 1


def check_model(cp: CPConfig, cfg, tp: int, seq_length: int, sequence_parallel: bool) -> None:
    """What CP needs of the model and the layout; ValueError naming the flag and the fix. --compile runs with
    every comm type (the attention's exchange stays eager: hybrid/cp/attention.py CPContext.attention); with
    selective-op recomputation hybrid/train/args.py check_compile refuses it."""
    if cp.size > 1 or cp.reset_attention_mask:
        if cfg.attention_dropout > 0:
            what = f"--context-parallel-size {cp.size}" if cp.size > 1 else "--reset-attention-mask"
            raise ValueError(f"{what} does not implement attention dropout (the model's attention_dropout "
                             f"{cfg.attention_dropout}); set --attention-dropout 0")
    if cp.size == 1:
        return
    check_divisible(seq_length, cp.size)
    if sequence_parallel and (seq_length // cp.size) % tp:
        raise ValueError(f"--sequence-parallel needs each CP rank's {seq_length // cp.size} tokens (--seq-length / "
                         f"--context-parallel-size) divisible by --tensor-model-parallel-size ({tp})")
    if cp.comm_type is CommType.A2A:
        check_ulysses_heads(cfg.num_heads // tp, kv_heads_per_tp_rank(cfg.num_kv_heads, tp), cp.size)
