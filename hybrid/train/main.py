"""Entry point: `torchrun --nproc-per-node N -m hybrid.train ...` (or `scripts/train.py`, the same code).

    torchrun --nproc-per-node 8 -m hybrid.train --tensor-model-parallel-size 2 \
        --pipeline-model-parallel-size 2 --micro-batch-size 2 --global-batch-size 16 --seq-length 128

Every flag is checked before any process group starts; a bad one exits with a one-line error naming it.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from hybrid.data import load_corpus
from hybrid.mesh import default_backend
from hybrid.train.args import apply_auto_parallel, check_args, parse_args
from hybrid.train.loop import run


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        if args.auto_parallel:
            apply_auto_parallel(args, world)
        cfg, dims, batch, plan = check_args(args, world)
        corpus = load_corpus(args.data_path)
    except ValueError as e:
        raise SystemExit(f"train.py: error: {e}") from None
    if args.ds_unsupported and int(os.environ.get("RANK", "0")) == 0:
        print(f"train.py: warning: --deepspeed-config keys not supported, ignored: {', '.join(args.ds_unsupported)}",
              file=sys.stderr, flush=True)

    backend, device = default_backend()
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    else:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    try:
        run(args, cfg, dims, batch, plan, corpus, device)
    finally:
        dist.destroy_process_group()


