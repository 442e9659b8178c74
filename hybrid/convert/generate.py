"""`hybrid generate`: greedy decoding from a hybrid checkpoint or a transformers folder, one process, tp 1, no
KV cache (each new token re-runs the whole prefix: O(T^2) work, enough for the sanity check after a conversion
or a run). The prompt is text -- through the folder's tokenizer when one was carried along, else UTF-8 bytes
(the byte-level vocabulary train.py's data uses) -- or explicit token ids.

    x_{t+1} = argmax_v z_t(v),   z = model(x_1 .. x_t)[-1]
"""

from __future__ import annotations

import argparse
import os

import torch

from hybrid.cliutil import HelpFormatter, int_in
from hybrid.convert.detect import Format, detect


@torch.no_grad()
def greedy(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, max_len: int) -> torch.Tensor:
    """(1, T) prompt -> (1, T + n) with n = min(new_tokens, max_len - T) tokens appended by argmax."""
    for _ in range(min(new_tokens, max_len - ids.shape[1])):
        nxt = model(ids)[:, -1].float().argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
    return ids


def load_model(src: str, model: str | None = None):
    """(our model at tp 1 in eval mode, its config, the folder its tokenizer files would be in)."""
    from hybrid.comm import Group
    from hybrid.convert.common import read_config
    from hybrid.convert.to_hf import check_against, checkpoint_config, iteration_dir
    from hybrid.convert.verify import load_ours
    from hybrid.tp import TPContext
    from models import build_model
    from models.hf_io import load_hf_checkpoint
    if detect(src) is Format.HYBRID:
        it_dir = iteration_dir(src, None)
        cfg = checkpoint_config(it_dir, model)
        check_against(cfg, it_dir)
        return load_ours(cfg, it_dir), cfg, it_dir
    if detect(src) is not Format.HF:
        raise ValueError(f"SRC {src!r}: generate reads a hybrid checkpoint or a transformers folder; convert it first")
    cfg = read_config(src, "SRC")
    net = build_model(cfg, TPContext(Group.solo("tp")), seed=None).eval()
    load_hf_checkpoint(net, src, 0)
    return net, cfg, src


def prompt_ids(args: argparse.Namespace, cfg, folder: str):
    """Token ids of the prompt, and a decoder for the output."""
    tok = None
    if any(os.path.isfile(os.path.join(folder, n)) for n in ("tokenizer.json", "tokenizer.model")):
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(folder)
    if args.prompt_ids is not None:
        try:
            ids = [int(x) for x in args.prompt_ids.split(",")]
        except ValueError:
            raise ValueError(f"--prompt-ids {args.prompt_ids!r}: give comma-separated token ids, e.g. 1,2,3") from None
    elif tok is not None:
        ids = tok(args.prompt)["input_ids"]
    else:
        ids = list(args.prompt.encode("utf-8"))
    bad = [i for i in ids if not 0 <= i < cfg.vocab_size]
    if not ids or bad:
        raise ValueError(f"prompt: {len(ids)} tokens, {len(bad)} outside the vocabulary [0, {cfg.vocab_size}); "
                         f"give a non-empty --prompt or --prompt-ids below {cfg.vocab_size}")
    if len(ids) >= cfg.max_position_embeddings:
        raise ValueError(f"prompt: {len(ids)} tokens, the model's context is {cfg.max_position_embeddings}")
    decode = tok.decode if tok is not None else (lambda t: bytes(x for x in t if x < 256).decode("utf-8", "replace"))
    return torch.tensor([ids]), decode


def run(args: argparse.Namespace) -> None:
    if (args.prompt is None) == (args.prompt_ids is None):
        raise ValueError("give one of --prompt TEXT or --prompt-ids 1,2,3")
    model, cfg, folder = load_model(args.src, args.model)
    ids, decode = prompt_ids(args, cfg, folder)
    out = greedy(model, ids, args.max_new_tokens, cfg.max_position_embeddings)
    new = out[0, ids.shape[1]:].tolist()
    print(f"generate: {len(new)} new tokens (greedy): {','.join(map(str, new))}")
    print(decode(out[0].tolist()))


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("generate", help="greedy generation from a hybrid checkpoint or transformers folder",
                              description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("src", metavar="SRC", help="a hybrid checkpoint directory or a transformers model folder")
    p.add_argument("--prompt", default=None, help="prompt text (the tokenizer carried with SRC, else UTF-8 bytes)")
    p.add_argument("--prompt-ids", default=None, metavar="IDS", help="prompt as comma-separated token ids")
    p.add_argument("--max-new-tokens", type=int_in(1), default=32, metavar="N", help="tokens to generate")
    p.add_argument("--model", default=None, metavar="CONFIG", help="hybrid SRC: the model config, if not recorded")
    p.set_defaults(func=run)
    return p
