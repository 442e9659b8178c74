"""Imported by hybrid.testing's forkserver (its PRELOAD) and nowhere else: work every forked rank would otherwise
redo, done once before the forks.

DeepSpeed's CPU Adam: its first construction in a process loads the compiled extension -- deepspeed's import, its
CPU detection and torch's extension loader, which starts a compiler and ninja to check the cached build -- and every
construction asks py-cpuinfo, which starts a Python interpreter: ~1.2 s of CPU for the first, ~0.3 s for each
later one, children included, measured on this machine. Loaded here once, every rank that offloads with
`--cpu-adam auto` finds it in DeepSpeed's cache of loaded ops (OpBuilder._loaded_ops) and the CPU's description
already read. Only when the extension is
already built and no build is under way: a first build stays in the rank that needs it, under hybrid's build lock
(hybrid/zero/cpu_adam_build.py), with its progress messages. deepspeed imports neither transformers nor
torch.distributed.checkpoint (tests/test_presets.py). Nothing here may fail the forkserver: any error leaves the
ranks to load it themselves, as without this module.
"""

from __future__ import annotations

import gc
import os


def _load_cpu_adam() -> None:
    from hybrid.zero import cpu_adam_build as build
    if not build._prebuilt():
        directory = build.build_directory()
        if not os.path.exists(os.path.join(directory, f"{build.NAME}.so")) or \
                os.path.exists(os.path.join(directory, "lock")):
            return  # not built yet, or a build under way (or a stale lock, which the rank names): leave it
    import cpuinfo
    from deepspeed.ops.op_builder import CPUAdamBuilder
    with build.cpu_adam_build(log=lambda _: None):
        CPUAdamBuilder().load(verbose=False)
    # DeepSpeedCPUAdam.__init__ asks py-cpuinfo for the CPU's vendor (`from cpuinfo import get_cpu_info`), which runs
    # a new Python interpreter each time (~0.3 s of CPU a construction): the machine's answer, asked once here
    info = cpuinfo.get_cpu_info()
    cpuinfo.get_cpu_info = lambda: dict(info)


try:
    _load_cpu_adam()
except Exception:  # noqa: BLE001 -- see the module docstring: the ranks then load it as before
    pass


# Last of the forkserver's PRELOAD (hybrid/testing.py): everything imported above moves to the collector's permanent
# generation, which a fork's collections skip. Without it the first full collection in every forked rank walks the
# preloaded interpreter (torch, dynamo, hybrid: millions of objects) and writes each object's GC header, copying
# every page it touches (copy-on-write) -- Python's gc.freeze documentation gives this use. Measured, a 4-rank
# train.py run of 8 iterations saving 3 checkpoints (DCP's saves allocate enough to start full collections):
# 4.0 -> 2.9-3.0 s of CPU, ranks included; without saves 2.2 -> 2.0-2.1 s. Frozen objects are never collected:
# they are the forkserver's imports, alive for its lifetime anyway.
gc.freeze()
