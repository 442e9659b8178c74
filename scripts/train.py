"""Train a GPT-2 or Llama-family model with tensor, pipeline and data parallelism. Launch with torchrun:

    torchrun --nproc-per-node 8 scripts/train.py --tensor-model-parallel-size 2 \
        --pipeline-model-parallel-size 2 --micro-batch-size 2 --global-batch-size 16 --seq-length 128

A thin entry point for a checkout: the code is `hybrid.train` (also `torchrun -m hybrid.train` from an
installed package). ZeRO (docs/zero.md): --zero-stage 0-3, --offload-optimizer, --offload-params, --bf16 /
--fp16, --clip-grad, or --deepspeed-config ds.json. Flags follow Megatron-LM's names.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hybrid.cliutil import interruptible_start  # noqa: E402 -- the standard library only: ready before torch

with interruptible_start("train.py"):  # a Ctrl-C during torch's import: one line and 130, not a traceback per rank
    from hybrid.train import apply_auto_parallel, check_args, main, parse_args, run_config  # noqa: E402,F401
    from hybrid.train.main import cli  # noqa: E402

if __name__ == "__main__":
    cli()
