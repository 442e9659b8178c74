"""`hybrid checkpoint inspect DIR`: what a checkpoint directory holds and whether it loads.

    hybrid checkpoint inspect runs/ckpt                 # every checkpoint in a --save directory
    hybrid checkpoint inspect runs/ckpt/iter_0000200    # one

For each: iteration, consumed samples, the layout it was saved at, size, and the verdict -- complete and
every checksum matching, incomplete (an unfinished save), or the first corrupt file. Any layout whose tp
and pp divide the model loads it (DCP reshards); nothing here needs a process group.
"""

from __future__ import annotations

import argparse
import os

from hybrid.checkpoint import store
from hybrid.cliutil import HelpFormatter


def _one(path: str, latest: int | None) -> str:
    v = store.verify_all(path)
    name = os.path.basename(os.path.normpath(path))
    size = f"{v.bytes / 2**20:.2f} MiB"
    if not v.complete:
        return f"{name}: incomplete (no manifest.json: a save that did not finish; removed by the next save) | {size}"
    s = store.read_state(path)
    lay = s.get("layout", {})
    mark = " (latest)" if latest is not None and store.iter_name(latest) == name else ""
    verdict = "ok: every checksum matches" if v.error is None else f"CORRUPT: {v.error}"
    return (f"{name}{mark}: iteration {s.get('iteration')} | consumed samples {s.get('consumed_samples')} | "
            f"model {s.get('model')} | saved at tp {lay.get('tp')} x pp {lay.get('pp')} x dp {lay.get('dp')}, "
            f"ZeRO {lay.get('zero')} | adam step {s.get('adam_step')} | {size} | {verdict}")


def run(args: argparse.Namespace) -> None:
    path = args.dir
    if not os.path.isdir(path):
        raise ValueError(f"{path!r} is not a directory; give a --save directory or one of its iter_* directories")
    if os.path.isfile(os.path.join(path, store.MANIFEST)) or os.path.basename(os.path.normpath(path)).startswith("iter_"):
        print(_one(path, None))
        return
    if not store.is_checkpoint_dir(path):
        raise ValueError(f"{path!r} holds no checkpoint (no iter_* directories, no `latest`)")
    latest = store.read_latest(path)
    print(f"{path}: latest -> {store.iter_name(latest) if latest is not None else 'none'}")
    for name in sorted(n for n in os.listdir(path) if n.startswith("iter_")):
        print("  " + _one(os.path.join(path, name), latest))


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("checkpoint", help="inspect checkpoints", description=__doc__,
                              formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    q = sub.add_parser("inspect", help="iteration, layout, size and checksum verdict of checkpoints",
                       formatter_class=HelpFormatter)
    q.add_argument("dir", metavar="DIR", help="a --save directory or one iter_* directory")
    q.set_defaults(func=run)
