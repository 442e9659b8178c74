"""Training entry point: flags and checks (`args`) into one typed `RunConfig` (`config`), the per-rank run
(`loop`), `main` (torchrun target).

`python -m hybrid.train` / `torchrun -m hybrid.train` run it from an installed package; `scripts/train.py`
is the same entry point for a checkout.

The names below load on first use (PEP 562), not at the package's import: `python -m hybrid.train` imports this
package before its `__main__` runs, and importing them imports torch (seconds; a minute on a loaded machine) --
a Ctrl-C there was Python's traceback through torch's import on every rank, where `__main__` (like
scripts/train.py) turns it into one line and status 130 (hybrid.cliutil.interruptible_start).
"""

from __future__ import annotations

import sys
import types

__all__ = ["RunConfig", "apply_auto_parallel", "check_args", "main", "parse_args", "run_config"]


class _Package(types.ModuleType):
    """The import system binds each submodule on its package once imported (`import hybrid.train.main` -- the
    forkserver's PRELOAD does -- sets `hybrid.train.main` to the submodule): `main` stays the function, as the eager
    `from hybrid.train.main import main` of this package left it, so `from hybrid.train import main` is the function
    whichever came first."""

    def __setattr__(self, name, value):
        if name == "main" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from hybrid.train.args import apply_auto_parallel, check_args, parse_args, run_config
    from hybrid.train.config import RunConfig
    from hybrid.train.main import main
    # bound as the eager imports bound them: `hybrid.train.main` is the function, not the submodule of that name
    globals().update(RunConfig=RunConfig, apply_auto_parallel=apply_auto_parallel, check_args=check_args, main=main,
                     parse_args=parse_args, run_config=run_config)
    return globals()[name]
