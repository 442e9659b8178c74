"""Every collective of a training run goes through a counted `hybrid.comm.Group` (the ledger and the hang watchdog's
op trail): torch.distributed's collectives are wrapped for the length of a real run -- train.py's own `run()` with
ZeRO, checkpoint saves in the background, a resume, the timeline, the metrics file and the SIGTERM agreement -- and
each call must come from inside a Group method, or from a library routine a Group handed its process group to
(`Group.delegate`: DCP's save and load plans). A call on the default group from anywhere else fails the test,
naming the file and line it came from.
"""

from __future__ import annotations

import inspect
import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from hybrid.testing import run_distributed

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
               "reduce_scatter_tensor", "reduce_scatter_single", "broadcast", "barrier", "monitored_barrier",
               "all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list", "gather",
               "scatter", "reduce", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv",
               "batch_isend_irecv")
COMM = os.path.join("hybrid", "comm.py")


def _where() -> str:
    """The first frame outside torch and this file: who called the collective."""
    f = sys._getframe(2)
    while f is not None and ("torch" + os.sep in f.f_code.co_filename or f.f_code.co_filename == __file__):
        f = f.f_back
    return "?" if f is None else f"{os.path.relpath(f.f_code.co_filename)}:{f.f_lineno} ({f.f_code.co_name})"


def _through_group(group) -> bool:
    from hybrid import comm
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename.endswith(COMM):
            return True
        f = f.f_back
    return comm.delegated(group)


def _wrap(name: str, fn, calls: list):
    sig = inspect.signature(fn)

    def counted(*args, **kwargs):
        try:
            group = sig.bind_partial(*args, **kwargs).arguments.get("group")
        except TypeError:
            group = kwargs.get("group")
        if name == "batch_isend_irecv":
            group = getattr(args[0][0], "group", None) if args and args[0] else None
        calls.append((name, _through_group(group), _where()))
        return fn(*args, **kwargs)
    return counted


def _patch(calls: list) -> None:
    for name in COLLECTIVES:
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        wrapped = _wrap(name, fn, calls)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is fn:
            setattr(dist, name, wrapped)


def _train(rank: int, world: int, argv: list[str]):
    """train.py's run on this rank (the ranks' process group is the harness's), every collective recorded."""
    from hybrid.mesh import Mesh
    from hybrid.train import loop
    from hybrid.train.args import configure, parse_args
    run, corpus = configure(parse_args(argv), world)
    calls: list = []
    meshes: list = []
    build = Mesh.build.__func__
    loop.Mesh.build = classmethod(lambda cls, *a, **k: meshes.append(build(cls, *a, **k)) or meshes[-1])
    _patch(calls)
    loop.run(run, corpus, torch.device("cpu"))
    return calls, meshes[0].ledger.summary()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("counted")
    common = ["--model", "tiny-gpt2", "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
              "--zero-stage", "1", "--log-interval", "1", "--save", str(d / "ckpt"), "--save-interval", "1",
              "--async-save", "--exit-signal-handler", "--metrics-file", str(d / "m.jsonl"), "--eval-iters", "0"]
    first = run_distributed(_train, 2, args=(common + ["--train-iters", "2", "--timeline", str(d / "t.json")],),
                            timeout=300)
    resumed = run_distributed(_train, 2, args=(common + ["--train-iters", "3", "--load", str(d / "ckpt")],),
                              timeout=300)
    return first, resumed


def test_no_collective_of_a_run_with_checkpoints_bypasses_the_ledger(runs):
    """Saves (async), a resume (verify + load), the timeline, the metrics' memory peaks and the SIGTERM check:
    every torch.distributed collective came through a Group."""
    for calls, _ in [r for run in runs for r in run]:
        bypass = sorted({where for name, via, where in calls if not via})
        assert not bypass, f"collectives outside hybrid.comm.Group: {bypass}"
        assert len(calls) > 20  # the wrapper saw the run's collectives


def test_the_ledger_counts_the_world_and_checkpoint_groups(runs):
    """What used to run on the default group is on the ledger now: node ids and memory peaks on `world`, the
    timeline's gather, the checkpoint's barriers, manifests and DCP plans on `ckpt`, verify and SIGTERM on
    `ckpt_ctl`."""
    (_, first), (_, resumed) = runs[0][0], runs[1][0]
    for key in ("all_gather_object@world", "all_gather@world", "barrier@ckpt", "all_gather_object@ckpt",
                "dcp_save@ckpt", "all_reduce@ckpt_ctl:sigterm", "reduce_scatter@dp"):
        assert first.get(key, {}).get("calls", 0) > 0, (key, sorted(first))
    assert resumed["dcp_load@ckpt"]["calls"] == 1 and resumed["all_gather_object@ckpt_ctl"]["calls"] >= 1
    assert first["all_gather@world"]["bytes"] == 2 * 8 * 2  # 2 log lines x (2 ranks x one int64 peak)
