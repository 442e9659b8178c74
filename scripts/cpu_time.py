"""CPU time (user + sys) of a command's whole process tree, orphans included.

    python scripts/cpu_time.py [--json FILE] -- python -m pytest -q tests/test_zero.py

A process's rusage reaches its parent only when the parent reaps it, and a forkserver (hybrid.testing's,
torch.multiprocessing's) or a torchrun agent can outlive its parent: /usr/bin/time then misses its CPU. This
wrapper makes itself the child subreaper (prctl PR_SET_CHILD_SUBREAPER, Linux), so every orphaned descendant is
re-parented to it; it reaps them all before reading RUSAGE_CHILDREN. Wall time on a shared machine says little;
user + sys of the tree is the cost the suite puts on the CPUs.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def run(argv: list[str]) -> dict:
    """Run argv, reap every descendant, and return its exit code, wall, user and sys seconds."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    rc = subprocess.call(argv)
    wall = time.monotonic() - t0
    while True:  # orphans re-parented to us: wait until none is left
        try:
            os.wait()
        except ChildProcessError:
            break
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"rc": rc, "wall_s": round(wall, 2), "user_s": round(after.ru_utime - before.ru_utime, 2),
            "sys_s": round(after.ru_stime - before.ru_stime, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="append the result as one JSON line to this file")
    p.add_argument("--label", default="", help="a name stored with the result")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command")
    a = p.parse_args()
    if a.json and os.path.islink(a.json):  # appended: a line would land in whatever file the link names
        p.error(f"--json {a.json!r} is a symbolic link (to {os.readlink(a.json)!r}); give the file's own path")
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        p.error("give the command after --")
    res = run(cmd)
    res["cpu_s"] = round(res["user_s"] + res["sys_s"], 2)
    res["label"] = a.label or " ".join(cmd)
    print(f"cpu_time: {res['label']}: rc {res['rc']}, cpu {res['cpu_s']} s (user {res['user_s']}, "
          f"sys {res['sys_s']}), wall {res['wall_s']} s", file=sys.stderr)
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(res) + "\n")
    sys.exit(res["rc"])


if __name__ == "__main__":
    main()
