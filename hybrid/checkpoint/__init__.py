"""Sharded, atomic, optionally asynchronous checkpoints on torch.distributed.checkpoint, loadable at any
TP x PP x DP x ZeRO layout (docs/checkpoint.md).

    ckpt = RunCheckpoints(args, mesh, model, optimizer, rng)   # hybrid/train/loop.py
    start, consumed = ckpt.resume()
    ...
    ckpt.after_step(iteration, consumed)
    ckpt.finish(iteration, consumed)
"""

from hybrid.checkpoint.core import load, param_names, start_save, verify
from hybrid.checkpoint.faults import SimulatedCrash
from hybrid.checkpoint.store import CorruptCheckpoint

__all__ = ["CorruptCheckpoint", "SimulatedCrash", "load", "param_names", "start_save", "verify"]
