"""`python -m hybrid.train ...` / `torchrun --nproc-per-node N -m hybrid.train ...` (hybrid/train/main.py)."""

from hybrid.cliutil import interruptible_start  # the standard library only: ready before torch

with interruptible_start("train.py"):  # a Ctrl-C during torch's import: one line and 130, as scripts/train.py
    from hybrid.train.main import cli

cli()
