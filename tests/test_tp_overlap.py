"""ColumnParallelLinear entering the TP region itself (enter=True, no sequence parallelism) runs f and X A_i as one
autograd node whose backward posts the input-gradient all-reduce before the weight gradient and waits after it
(Megatron's allreduce_dgrad overlap). One 2-rank job, a tiny MLP Y = GeLU(X A) B at tp 2, checks:

* against an unsharded reference (the full A, B on one rank): the output, the input gradient and every weight and bias
  gradient, gathered to full shape, within 1e-5 relative in fp32 (as tests/test_tp_models.py);
* against the separate nodes it replaces (tp.enter, then F.linear on the same shards): the same bits;
* the order in backward: all-reduce posted, then the weight-gradient mm and the bias sum, then the wait;
* the ledger: one all-reduce of B*T*h*4 bytes forward (B's partial sums) and one backward (dX), none backward when
  the input needs no gradient;
* the zero-bubble halves (B, then W) run each product once: the all-reduce in B only, the same gradient bits;
* a shared entry (`enter_linears`, SwiGLU's gate and up) likewise: same bits, one all-reduce over both weight
  gradients;
* no copy-type ATen op (clone, copy_, cat, ...) in the block's forward and backward.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from hybrid.testing import run_distributed

B, T, H = 2, 4, 8
RTOL = 1e-5


class _OpLog(TorchDispatchMode):
    """ATen ops in order; the spy below appends "post" / "wait" for the all-reduce into the same list."""

    def __init__(self, log: list):
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.log.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _rank(rank: int, world: int) -> dict:
    from hybrid.comm import Group, Work
    from hybrid.mesh import Mesh, ParallelDims
    from hybrid.tp import ColumnParallelLinear, RowParallelLinear, TPContext, gather_full, init_parameters, spec_of

    torch.manual_seed(0)
    mesh = Mesh.build(ParallelDims.from_world(world, tp=world), device=torch.device("cpu"))
    tp = TPContext(mesh.tp)
    fc, proj = ColumnParallelLinear(H, 4 * H, tp), RowParallelLinear(4 * H, H, tp)
    mlp = nn.ModuleDict({"fc": fc, "proj": proj})
    init_parameters(mlp, seed=0, tp_rank=tp.rank)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, H, generator=gen).requires_grad_()  # (B, T, h), the same on both ranks
    go = torch.randn(B, T, H, generator=gen)
    params = list(mlp.parameters())

    def run(forward, needs_input_grad=True):
        for p in params:
            p.grad = None
        xi = x.detach().requires_grad_(needs_input_grad)
        y = forward(xi)
        y.backward(go)
        return [y.detach(), xi.grad] + [p.grad.clone() for p in params]

    def separate(xi):  # what enter=True ran before: f as its own node, then the linear
        return proj(F.gelu(F.linear(tp.enter(xi), fc.weight, fc.bias)))

    log: list = []
    post, wait = Group.all_reduce_async, Work.wait

    def spy_post(self, t, tag=""):
        log.append("post")
        return post(self, t, tag)

    def spy_wait(self):
        wait(self)
        log.append("wait")

    Group.all_reduce_async, Work.wait = spy_post, spy_wait
    mesh.tp.ledger.reset()
    try:
        with _OpLog(log):
            # xi.view_as(xi): the block's input gradient reaches the test's leaf through a view (a fresh tensor
            # AccumulateGrad can steal). Given straight to the leaf, the all-reduced tensor is still referenced for
            # an instant by gloo's finished Work, and AccumulateGrad then clones it (new_empty_strided + copy_: 1
            # run in ~6-14 failed so) -- the test's leaf, not the block (in a model the input gradient goes on to
            # the previous op); the parameters' gradients are still checked to land in .grad uncopied.
            fused = run(lambda xi: proj(F.gelu(fc(xi.view_as(xi)))))
    finally:
        Group.all_reduce_async, Work.wait = post, wait
    ledger = {"calls": mesh.tp.ledger.calls("all_reduce", "tp"), "bytes": mesh.tp.ledger.bytes("all_reduce", "tp")}
    mesh.tp.ledger.reset()
    run(lambda xi: proj(F.gelu(fc(xi))), needs_input_grad=False)
    no_input_grad = {"calls": mesh.tp.ledger.calls("all_reduce", "tp"),
                     "bytes": mesh.tp.ledger.bytes("all_reduce", "tp")}
    old = run(separate)
    shared = _shared_entry(tp, x, go)
    split = _split_halves(lambda xi: proj(F.gelu(fc(xi))), x, go, params, mesh.tp.ledger)

    # unsharded reference from the gathered weights (the full A (4h, h), B (h, 4h))
    full = {n: gather_full(p.detach(), spec_of(p), mesh.tp) for n, p in mlp.named_parameters()}
    xr = x.detach().requires_grad_()
    wr = {n: t.clone().requires_grad_() for n, t in full.items()}
    yr = F.linear(F.gelu(F.linear(xr, wr["fc.weight"], wr["fc.bias"])), wr["proj.weight"], wr["proj.bias"])
    yr.backward(go)
    grads = {n: gather_full(g, spec_of(p), mesh.tp) for (n, p), g in zip(mlp.named_parameters(), fused[2:])}
    ref = {"y": (fused[0], yr.detach()), "x.grad": (fused[1], xr.grad),
           **{n: (grads[n], wr[n].grad) for n in full}}
    return {"shared": shared, "log": log, "ledger": ledger, "no_input_grad": no_input_grad,
            "same_bits": [torch.equal(a, b) for a, b in zip(fused, old)],
            "split": {**split.pop("counts"),
                      "same_bits": [torch.equal(a, b) for a, b in zip(fused[1:], split["grads"])]},
            "rel": {k: ((a - b).abs().max() / b.abs().max()).item() for k, (a, b) in ref.items()}}


def _shared_entry(tp, x, go) -> dict:
    """SwiGLU's shape: gate and up (enter=False, one with a bias, one without) behind one entry, then a row-parallel
    down. enter_linears against tp.enter + F.linear each: the same bits, one all-reduce backward, posted before
    the two weight-gradient mm and waited after them."""
    from hybrid.comm import Group, Work
    from hybrid.tp import ColumnParallelLinear, RowParallelLinear, enter_linears, init_parameters

    gate = ColumnParallelLinear(H, 2 * H, tp, enter=False)
    up = ColumnParallelLinear(H, 2 * H, tp, bias=False, enter=False)
    down = RowParallelLinear(2 * H, H, tp)
    mods = nn.ModuleList([gate, up, down])
    init_parameters(mods, seed=2, tp_rank=tp.rank)
    params = list(mods.parameters())

    def fused(xi):
        g, u = enter_linears(xi, (gate, up), tp)
        return down(F.silu(g) * u)

    def separate(xi):
        xe = tp.enter(xi)
        return down(F.silu(F.linear(xe, gate.weight, gate.bias)) * F.linear(xe, up.weight))

    out, log = {}, []
    post, wait = Group.all_reduce_async, Work.wait
    for name, fn in (("fused", fused), ("separate", separate)):
        for p in params:
            p.grad = None
        xi = x.detach().requires_grad_()
        y = fn(xi)
        tp.group.ledger.reset()
        if name == "fused":
            Group.all_reduce_async = lambda self, t, tag="": (log.append("post"), post(self, t, tag))[1]
            Work.wait = lambda self: (wait(self), log.append("wait"))[0]
        try:
            with _OpLog(log) if name == "fused" else nullcontext():
                y.backward(go)
        finally:
            Group.all_reduce_async, Work.wait = post, wait
        out[name] = [y.detach(), xi.grad] + [p.grad.clone() for p in params]
        out[name + " backward all-reduces"] = tp.group.ledger.calls("all_reduce", "tp")
    between = log[log.index("post") + 1:log.index("wait")] if "post" in log and "wait" in log else []
    return {"same_bits": [torch.equal(a, b) for a, b in zip(out["fused"], out["separate"])],
            "all_reduces": (out["fused backward all-reduces"], out["separate backward all-reduces"]),
            "mm_in_flight": between.count("mm"), "posts": log.count("post")}


def _split_halves(forward, x, go, params, ledger) -> dict:
    """The zero-bubble halves (hybrid/pipeline/split_backward.py) over the same block: B then W, counting the
    all-reduces and the mm kernels of each."""
    from hybrid.pipeline.executor import _backward
    from hybrid.pipeline.split_backward import backward_input, backward_weight

    for p in params:
        p.grad = None
    xi = x.detach().requires_grad_()
    y = forward(xi)
    counts = {}
    for half in ("B", "W"):
        ledger.reset()
        log: list = []
        with _OpLog(log):
            if half == "B":
                dx, work = backward_input(y, go, xi, params, _backward)
            else:
                backward_weight(work, _backward)
        counts[half] = {"all_reduce": ledger.calls("all_reduce", "tp"), "mm": log.count("mm")}
    return {"counts": counts, "grads": [dx] + [p.grad.clone() for p in params]}


@pytest.fixture(scope="module")
def results():
    return run_distributed(_rank, 2)


def test_enter_linear_matches_the_unsharded_mlp(results):
    for r in results:
        assert set(r["rel"]) == {"y", "x.grad", "fc.weight", "fc.bias", "proj.weight", "proj.bias"}
        for name, rel in r["rel"].items():
            assert rel <= RTOL, (name, rel)


def test_enter_linear_gives_the_bits_of_the_separate_nodes(results):
    for r in results:
        assert all(r["same_bits"]), r["same_bits"]  # y, x.grad, then every parameter gradient


def test_input_gradient_all_reduce_is_posted_before_the_weight_gradient_and_waited_after(results):
    for r in results:
        log = r["log"]
        assert log.count("post") == 1 and log.count("wait") == 1, log
        between = log[log.index("post") + 1:log.index("wait")]
        assert "mm" in between and "sum" in between, log  # dA_i = G^T X and db_i while the all-reduce is in flight


COPY_OPS = {"clone", "copy_", "_to_copy", "cat", "stack", "contiguous", "empty_like"}


def test_the_block_copies_no_tensor_forward_or_backward(results):
    """The tp 2 MLP, forward and backward, runs no copy-type ATen op, as megatron-core's block runs none (the op
    counts of docs/results/bench_tp.md): f, g and the fused entry clone nothing (g sums in place), and every gradient
    lands in .grad without one (AccumulateGrad clones a gradient whose layout differs from its parameter's)."""
    for r in results:
        ops = [op for op in r["log"] if op not in ("post", "wait")]
        # the log: x.detach(), the block's forward and backward, then `run`'s copies of the 4 gradients
        assert ops[0] == "detach" and ops[-4:] == ["clone"] * 4 and "mm" in ops, ops
        block = ops[1:-4]
        assert [op for op in block if op in COPY_OPS] == [], block


def test_ledger_counts_one_all_reduce_each_way_and_none_backward_without_an_input_gradient(results):
    activation = B * T * H * 4  # fp32 bytes of (B, T, h)
    for r in results:
        assert r["ledger"] == {"calls": 2, "bytes": 2 * activation}, r["ledger"]
        assert r["no_input_grad"] == {"calls": 1, "bytes": activation}, r["no_input_grad"]


def test_zero_bubble_halves_split_the_fused_node_without_repeating_work(results):
    """B computes the two input gradients (row's dY B^T, the entry's G A_i) and the one all-reduce; W the two weight
    gradients and no all-reduce; together the bits of the full backward."""
    for r in results:
        split = r["split"]
        assert split["B"] == {"all_reduce": 1, "mm": 2} and split["W"] == {"all_reduce": 0, "mm": 2}, split
        assert all(split["same_bits"]), split["same_bits"]


def test_a_shared_entry_overlaps_its_all_reduce_with_every_weight_gradient_in_the_same_bits(results):
    for r in results:
        shared = r["shared"]
        assert all(shared["same_bits"]), shared["same_bits"]  # y, x.grad, gate's, up's, down's gradients
        assert shared["all_reduces"] == (1, 1) and shared["posts"] == 1, shared
        assert shared["mm_in_flight"] == 2, shared  # gate's and up's weight gradients while dX is summed
