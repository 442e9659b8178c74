"""The gradient path's speed work (issue 27) changes no value: a gradient buffer is never zeroed (the first
gradient of a slot is copied, slots no gradient reached are zeroed at the reduction), the reduction's temporaries
come from a reused pool, and a reduce-scatter lands in place (into this rank's chunk of the full gradient) through
a reused receive buffer -- equal bit for bit to gloo's own reduce_scatter_tensor at 2 ranks (the exchange) and at
3 (gloo's collective, given an output apart from its input). The ZeRO equivalence tests (tests/test_zero.py,
test_fp32_grads.py) cover the engine end to end."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from hybrid.comm import CommLedger, Group
from hybrid.testing import run_distributed
from hybrid.zero.buffers import BufferPool
from hybrid.zero.units import FlatUnit


def test_pool_serves_the_smallest_buffer_that_fits_and_keeps_what_it_is_given():
    pool = BufferPool()
    big, small = pool.take(100, torch.float32, torch.device("cpu")), pool.take(10, torch.float32,
                                                                                 torch.device("cpu"))
    pool.give(big)
    pool.give(small)
    a = pool.take(8, torch.float32, torch.device("cpu"))  # the 10-element buffer, not the 100
    assert a.numel() == 8 and a.untyped_storage().data_ptr() == small.untyped_storage().data_ptr()
    b = pool.take(50, torch.float32, torch.device("cpu"))
    assert b.untyped_storage().data_ptr() == big.untyped_storage().data_ptr()
    assert pool.take(50, torch.float64, torch.device("cpu")).dtype == torch.float64  # no match: a new one
    pool.give(a)
    pool.give(b)
    assert pool.nbytes == 110 * 4  # whole buffers come back, not the views handed out
    pool.clear()
    assert pool.nbytes == 0


def test_first_gradient_is_copied_later_ones_added_unreached_slots_zeroed():
    """FlatUnit.add_grad / bind_grad on a garbage-filled buffer give what zero-then-add gave."""
    ps = [nn.Parameter(torch.zeros(3, 2)), nn.Parameter(torch.zeros(5)), nn.Parameter(torch.zeros(4))]
    u = FlatUnit("u", ps, parts=2, part=0)
    buf = torch.full((u.padded,), float("nan"))
    u.new_full_grad(buf)
    g = [torch.randn(p.shape) for p in ps]
    for i in (0, 1):
        ps[i].grad = g[i].clone()
        u.add_grad(buf, ps[i])
        assert ps[i].grad is None
    ps[0].grad = g[0].clone()
    u.add_grad(buf, ps[0])  # a second micro-batch: added
    full = u.take_full_grad()  # ps[2] got no gradient: zeros
    want = torch.cat([(g[0] + g[0]).flatten(), g[1], torch.zeros(4), torch.zeros(u.padded - u.numel)])
    assert torch.equal(full, want) and u.full_grad is None
    # stages 0-1: p.grad bound to its slot after the first copy; autograd then accumulates into the slot itself
    flat = torch.full((u.padded,), float("nan"))
    u.written.clear()
    ps[1].grad = g[1].clone()
    u.bind_grad(flat, ps[1])
    assert ps[1].grad.data_ptr() == u.grad_view(flat, ps[1]).data_ptr() and torch.equal(ps[1].grad, g[1])
    ps[1].grad += g[1]  # what autograd's in-place accumulation does
    u.bind_grad(flat, ps[1])
    u.zero_unwritten(flat)
    assert torch.equal(flat[:u.numel], torch.cat([torch.zeros(6), g[1] + g[1], torch.zeros(4)]))


def _in_place(rank: int, world: int) -> dict:
    """Reduce-scatters into this rank's own chunk of the full tensor, two in flight, with and without a receive
    buffer, on a pair (the exchange) and on the world of 3 (gloo's collective)."""
    ledger, results = CommLedger(), {}
    groups = {"world": Group("world", (0, 1, 2), dist.new_group([0, 1, 2]), ledger)}
    pg = dist.new_group([0, 1])
    if rank < 2:
        groups["pair"] = Group("pair", (0, 1), pg, ledger)
    for name, g in groups.items():
        fulls = [torch.randn(g.size * (40 + i), generator=torch.Generator().manual_seed(100 * rank + i))
                 for i in range(2)]
        want = []
        for f in fulls:
            w = torch.empty(f.numel() // g.size)
            dist.reduce_scatter_tensor(w, f.clone(), group=g.pg)
            want.append(w)
        outs = [f.chunk(g.size)[g.rank] for f in fulls]
        recv = torch.full((outs[0].numel(),), float("nan"))
        works = [g.reduce_scatter_into(outs[0], fulls[0], recv), g.reduce_scatter_into(outs[1], fulls[1])]
        for w in reversed(works):
            w.wait()
        results[name] = all(torch.equal(o, w) for o, w in zip(outs, want))
    results["ledger"] = {k: (e.calls, e.bytes) for k, e in ledger.entries.items()}
    return results


def test_reduce_scatter_in_place_with_a_receive_buffer_equals_gloo_s():
    for rank, res in enumerate(run_distributed(_in_place, 3)):
        ledger = res.pop("ledger")
        assert res and all(res.values()), (rank, res)
        assert ledger[("reduce_scatter", "world")] == (2, 4 * 3 * (40 + 41)), ledger  # the full tensors' bytes
        if rank < 2:
            assert ledger[("reduce_scatter", "pair")] == (2, 4 * 2 * (40 + 41)), ledger
