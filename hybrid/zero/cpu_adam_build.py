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
import time
from collections.abc import Callable, Iterator

NAME = "cpu_adam"  # deepspeed.ops.op_builder.CPUAdamBuilder.NAME: the extension's build directory


class StaleBuildLock(RuntimeError):
    """torch's build lock of DeepSpeed's CPU Adam was left by a build that no longer runs."""


def build_directory() -> str:
    """Where torch builds (and caches) the extension: $TORCH_EXTENSIONS_DIR/<py>_<device>/cpu_adam."""
    from torch.utils.cpp_extension import _get_build_directory
    return _get_build_directory(NAME, verbose=False)


def _prebuilt() -> bool:
    """DeepSpeed installed with the op compiled in (DS_BUILD_CPU_ADAM=1): nothing is built at run time."""
    try:
        from deepspeed.git_version_info import installed_ops
    except ImportError:
        return False
    return bool(installed_ops.get(NAME))


def check_stale_lock(directory: str) -> None:
    """StaleBuildLock naming `directory`/lock when it exists while no hybrid process builds (call holding the
    flock)."""
    lock = os.path.join(directory, "lock")
    if os.path.exists(lock):
        age = time.time() - os.path.getmtime(lock)
        raise StaleBuildLock(f"DeepSpeed's CPU Adam build lock {lock} was left by a build that was killed "
                             f"{age / 60:.0f} min ago (no build holds it: torch would wait for it for ever); remove "
                             f"it (rm {lock}) and run again, or pass --cpu-adam torch")


@contextlib.contextmanager
def cpu_adam_build(log: Callable[[str], None] = print, directory: str | None = None) -> Iterator[None]:
    """Around the construction of DeepSpeed's CPU Adam: one hybrid process of the machine at a time (the others wait
    for it here, then load the cached build); a stale `lock` is StaleBuildLock; a build to come is announced by
    `log` before it starts and timed after."""
    if _prebuilt():
        yield
        return
    directory = directory or build_directory()
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "hybrid.flock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released by the kernel if this process dies
        try:
            check_stale_lock(directory)
            built = os.path.exists(os.path.join(directory, f"{NAME}.so"))
            if not built:
                log(f"zero: building DeepSpeed's CPU Adam (first use on this machine: about a minute of C++; "
                    f"cached in {directory})")
            start = time.monotonic()
            yield
            if not built:
                log(f"zero: DeepSpeed's CPU Adam built in {time.monotonic() - start:.0f} s")
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
