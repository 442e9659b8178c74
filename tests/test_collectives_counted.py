"""Every collective of a training run goes through a counted `hybrid.comm.Group` (the ledger and the hang watchdog's
op trail): torch.distributed's collectives are wrapped for the length of a real run -- train.py's own `run()` with
ZeRO, checkpoint saves in the background, a resume, the timeline, the metrics file and the SIGTERM agreement -- and
each call must come from inside a Group method, or from a library routine a Group handed its process group to
(`Group.delegate`: DCP's save and load plans). A call on the default group from anywhere else fails the test,
naming the file and line it came from. A static check reads every module of hybrid/ and models/ for the same: a
collective named outside hybrid/comm.py, or a DCP save or load on a process group no Group handed over.
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


# --- statically: no module of hybrid/ or models/ can call a collective past a Group -----------------------------
# The run above sees only the paths it takes; this reads every module, so a collective added on a path no run
# here takes (MoE, CP, a schedule, a tool) fails too. Names are resolved through each module's imports
# (`import torch.distributed as dist`, `from torch import distributed`, `from torch.distributed import barrier`).
DIST = ("torch.distributed", "torch.distributed.distributed_c10d")
DCP_ENTRIES = {"torch.distributed.checkpoint." + n for n in ("save", "load", "async_save", "save_state_dict",
                                                            "load_state_dict")} | {"hybrid.checkpoint.safe_read.load"}
# modules allowed to name torch.distributed collectives directly, and why
ALLOWED = {
    COMM: "the Group itself",
    os.path.join("hybrid", "planner", "calibrate.py"): "`hybrid calibrate` times torch.distributed's own all-reduce and "
                                                       "all-gather on a throw-away job (no run, no mesh); its numbers "
                                                       "price what Group calls",
}
FORWARDERS = {(os.path.join("hybrid", "checkpoint", "safe_read.py"), "load")}  # passes its caller's process_group on


def _aliases(tree) -> dict[str, str]:
    import ast
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _dotted(node, aliases: dict[str, str]) -> str | None:
    import ast
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id]] + parts[::-1])


def bypasses(source: str, path: str) -> list[str]:
    """'path:line name' for each torch.distributed collective named outside a Group, and each DCP save / load that
    runs on a process group no Group handed over (neither `no_dist=True` nor inside `group.delegate(op, lambda pg:
    ...)`)."""
    import ast
    tree = ast.parse(source)
    aliases = _aliases(tree)
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def enclosing(node, kinds):
        while node in parent:
            node = parent[node]
            if isinstance(node, kinds):
                return node
        return None

    def delegated(call) -> bool:
        lam = enclosing(call, (ast.Lambda,))
        outer = parent.get(lam)
        return (lam is not None and isinstance(outer, ast.Call) and isinstance(outer.func, ast.Attribute)
                and outer.func.attr in ("delegate", "delegate_async") and lam in outer.args)

    found = []
    for node in ast.walk(tree):
        name = _dotted(node, aliases) if isinstance(node, (ast.Attribute, ast.Name)) else None
        if name and name.rsplit(".", 1)[0] in DIST and name.rsplit(".", 1)[1] in COLLECTIVES \
                and path not in ALLOWED:
            found.append(f"{path}:{node.lineno} {name}")
        if isinstance(node, ast.Call) and _dotted(node.func, aliases) in DCP_ENTRIES:
            no_dist = any(k.arg == "no_dist" and isinstance(k.value, ast.Constant) and k.value.value is True
                          for k in node.keywords)
            fn = enclosing(node, (ast.FunctionDef,))
            if not (no_dist or delegated(node) or (path, fn and fn.name) in FORWARDERS):
                found.append(f"{path}:{node.lineno} {_dotted(node.func, aliases)} (not through Group.delegate)")
    return found


def test_no_module_names_a_collective_outside_a_group():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found, seen = [], 0
    for top in ("hybrid", "models"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.relpath(os.path.join(d, f), root)
                    found += bypasses(open(os.path.join(root, path)).read(), path)
                    seen += 1
    assert seen > 50 and not found, found


@pytest.mark.parametrize("snippet", [
    "import torch.distributed as dist\ndist.all_reduce(t)",
    "import torch\ntorch.distributed.barrier()",
    "from torch import distributed\ndistributed.all_gather_object(out, x)",
    "from torch.distributed import broadcast\nbroadcast(t, 0)",
    "import torch.distributed.distributed_c10d as c10d\nc10d.batch_isend_irecv(ops)",
    "import torch.distributed as dist\nf = lambda: dist.all_reduce(t)",  # named, not yet called
    "import torch.distributed.checkpoint as dcp\ndcp.save(sd, storage_writer=w)",
    "import torch.distributed.checkpoint as dcp\ndcp.load(sd, storage_reader=r, process_group=group.pg)",
    "from hybrid.checkpoint import safe_read\nsafe_read.load(sd, d, process_group=pg)",
    "import torch.distributed.checkpoint as dcp\ng.barrier(lambda pg: dcp.save(sd, process_group=pg))",
])
def test_the_static_check_catches_each_way_past_the_group(snippet):
    assert bypasses(snippet, "hybrid/x.py"), snippet


@pytest.mark.parametrize("snippet", [
    "def f(group, t):\n    return group.all_reduce(t)",
    "import torch.distributed as dist\nr = dist.get_rank(); op = dist.ReduceOp.MAX",
    "import torch.distributed.checkpoint as dcp\ng.delegate('dcp_save', lambda pg: dcp.save(sd, process_group=pg))",
    "from hybrid.checkpoint import safe_read\nsafe_read.load(sd, d, no_dist=True)",
])
def test_the_static_check_passes_what_goes_through_a_group(snippet):
    assert not bypasses(snippet, "hybrid/x.py"), snippet
