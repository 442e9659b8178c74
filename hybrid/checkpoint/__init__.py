"""Sharded, atomic, optionally asynchronous checkpoints on torch.distributed.checkpoint, loadable at any
TP x PP x DP x ZeRO layout (docs/checkpoint.md).

    ckpt = RunCheckpoints(args, mesh, model, optimizer, rng)   # hybrid/train/loop.py
    start, consumed = ckpt.resume()
    ...
    ckpt.after_step(iteration, consumed)
    ckpt.finish(iteration, consumed)
"""

from hybrid.checkpoint.faults import SimulatedCrash
from hybrid.checkpoint.store import CorruptCheckpoint

__all__ = ["CorruptCheckpoint", "SimulatedCrash", "load", "param_names", "start_save", "verify"]


def __getattr__(name: str):
    """core's functions on first use: importing the package (train.py's flags do) must not import
    torch.distributed.checkpoint, ~0.7 s of CPU per rank that a run without --save / --load does not need."""
    if name in ("load", "param_names", "start_save", "verify"):
        from hybrid.checkpoint import core
        return getattr(core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
