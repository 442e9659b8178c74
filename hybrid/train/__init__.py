"""Training entry point: flags and checks (`args`) into one typed `RunConfig` (`config`), the per-rank run
(`loop`), `main` (torchrun target).

`python -m hybrid.train` / `torchrun -m hybrid.train` run it from an installed package; `scripts/train.py`
is the same entry point for a checkout.
"""

from hybrid.train.args import apply_auto_parallel, check_args, parse_args, run_config
from hybrid.train.config import RunConfig
from hybrid.train.main import main

__all__ = ["RunConfig", "apply_auto_parallel", "check_args", "main", "parse_args", "run_config"]
