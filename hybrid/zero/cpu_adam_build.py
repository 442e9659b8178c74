"""DeepSpeed's CPU Adam is compiled on first use (torch.utils.cpp_extension.load, about a minute of C++ behind a
silent call): say so, and never wait for ever on a lock a killed build left behind.

torch's extension loader guards a build with a plain file, `<build dir>/lock` (FileBaton): whoever creates it builds,
everyone else polls until it disappears. A build that is killed (Ctrl-C, OOM, a job's time limit) leaves the file,
and every later run then polls for ever with nothing on screen. The file cannot say whether its builder is alive.
So hybrid serialises the first use through its own lock beside it, an `fcntl.flock` on `hybrid.flock`, which the
kernel releases when its holder dies: holding that lock, no hybrid process is building, and a `lock` file found
then is stale -- named, with the command that removes it, instead of a hang.

    with cpu_adam_build(log):      # around the first DeepSpeedCPUAdam(...) of a process
        opt = DeepSpeedCPUAdam(...)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Callable, Iterator

NAME = "cpu_adam"  # deepspeed.ops.op_builder.CPUAdamBuilder.NAME: the extension's build directory


# DeepSpeed's JIT-compiled ops this project loads: CPU Adam (ZeRO offload's optimizer), the shared-memory
# collectives that deepspeed.initialize loads on CPU (deepspeed.comm.torch.build_shm_op), and FusedAdam, which
# deepspeed.initialize builds for a config's "type": "AdamW" (on the CPU accelerator op_builder/cpu/fused_adam.py) --
# the DeepSpeed peers of the benchmarks and of the checkpoint-conversion tests. Name (build directory) ->
# (op_builder class, what messages call it).
DEEPSPEED_OPS = {NAME: ("CPUAdamBuilder", "CPU Adam"),
                 "deepspeed_shm_comm": ("ShareMemCommBuilder", "deepspeed_shm_comm"),
                 "fused_adam": ("FusedAdamBuilder", "FusedAdam")}


class StaleBuildLock(RuntimeError):
    """torch's build lock of DeepSpeed's CPU Adam was left by a build that no longer runs."""


def build_directory(name: str = NAME) -> str:
    """Where torch builds (and caches) the extension: $TORCH_EXTENSIONS_DIR/<py>_<device>/<name>."""
    from torch.utils.cpp_extension import _get_build_directory
    return _get_build_directory(name, verbose=False)


def _prebuilt(name: str = NAME) -> bool:
    """DeepSpeed installed with the op compiled in (DS_BUILD_CPU_ADAM=1): nothing is built at run time."""
    try:
        from deepspeed.git_version_info import installed_ops
    except ImportError:
        return False
    return bool(installed_ops.get(name))


def _loaded_from(name: str, directory: str) -> bool:
    """Whether this process has already loaded the op from `directory`'s build (DeepSpeed's cache of loaded ops,
    OpBuilder._loaded_ops: a later load returns that module and touches no file): then a construction builds and
    loads nothing, and the lock, held machine-wide, would only queue it behind every other process's (measured:
    test_checkpoint's 8 forked ranks -- each inherits the op from hybrid.testing_preload -- waited 8.7 s a
    construction for it at a load of ~20, 121 s of rank 0's wall in one launch). deepspeed not imported yet: not
    loaded."""
    builder = sys.modules.get("deepspeed.ops.op_builder.builder")
    module = getattr(builder, "OpBuilder", None) and builder.OpBuilder._loaded_ops.get(name)
    path = getattr(module, "__file__", None)
    return path is not None and os.path.dirname(os.path.realpath(path)) == os.path.realpath(directory)


def check_stale_lock(directory: str, what: str = "CPU Adam") -> None:
    """StaleBuildLock naming `directory`/lock when it exists while no hybrid process builds (call holding the
    flock)."""
    lock = os.path.join(directory, "lock")
    if os.path.exists(lock):
        age = time.time() - os.path.getmtime(lock)
        raise StaleBuildLock(f"DeepSpeed's {what} build lock {lock} was left by a build that was killed "
                             f"{age / 60:.0f} min ago (no build holds it: torch would wait for it for ever); remove "
                             f"it (rm {lock}) and run again")


@contextlib.contextmanager
def cpu_adam_build(log: Callable[[str], None] = print, directory: str | None = None,
                   name: str = NAME) -> Iterator[None]:
    """Around the construction of DeepSpeed's CPU Adam (or the first load of another DeepSpeed op, `name` its build
    directory): one hybrid process of the machine at a time (the others wait for it here, then load the cached
    build); a stale `lock` is StaleBuildLock; a build to come is announced by `log` before it starts and timed
    after."""
    if _prebuilt(name):
        yield
        return
    what = DEEPSPEED_OPS[name][1]
    directory = directory or build_directory(name)
    if _loaded_from(name, directory):
        yield  # nothing to build or load: no lock, so the constructions of a machine's processes do not queue
        return
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "hybrid.flock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released by the kernel if this process dies
        try:
            check_stale_lock(directory, what)
            built = os.path.exists(os.path.join(directory, f"{name}.so"))
            if not built:
                log(f"zero: building DeepSpeed's {what} (first use on this machine: about a minute of C++; "
                    f"cached in {directory})")
            start = time.monotonic()
            yield
            if not built:
                log(f"zero: DeepSpeed's {what} built in {time.monotonic() - start:.0f} s")
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)



def load_op(name: str, log: Callable[[str], None] = print) -> None:
    """Load (building if needed) the DeepSpeed op `name` of DEEPSPEED_OPS in this process, under hybrid's build
    lock, so that a later call inside DeepSpeed finds it in its cache of loaded ops. Call it before
    deepspeed.initialize, never around it: initialize runs collectives, and a rank holding the lock there would
    wait for a peer that waits for the lock."""
    from deepspeed.ops import op_builder
    builder = getattr(op_builder, DEEPSPEED_OPS[name][0])()
    if not builder.is_compatible(verbose=False):
        return
    with cpu_adam_build(log, name=name):
        builder.load(verbose=False)


def prebuild(log: Callable[[str], None] = print) -> None:
    """Build every op of DEEPSPEED_OPS now (scripts/setup.sh), each under hybrid's build lock: a later first use --
    a test or a benchmark under its time limit, several ranks at once -- then only loads the cache, and a build
    killed by such a limit (which leaves torch's `lock` and hangs every later run) cannot happen there."""
    for name in DEEPSPEED_OPS:
        load_op(name, log)


if __name__ == "__main__":  # python -m hybrid.zero.cpu_adam_build: scripts/setup.sh
    prebuild()
