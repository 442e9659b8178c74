"""gloo all-gathers and reduce-scatters as point-to-point exchanges (hybrid/comm.py `Group._exchange_gather`,
`Group._exchange_reduce_scatter`): the same bytes as torch's all_gather_into_tensor, and the sum in group order
(at 2 ranks equal to gloo's reduce_scatter_tensor bit for bit), on groups of 2, 3 and 4 ranks, with several in
flight on one group, and the ledger unchanged (one record of the collective's logical bytes per call)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from hybrid.comm import CommLedger, Group
from hybrid.testing import run_distributed


def _groups(rank: int, world: int, ledger: CommLedger) -> dict[str, Group]:
    """The world (4), a pair ([0, 1] / [2, 3]) and a triple ([0, 1, 2]); new_group is collective over the world."""
    out = {"world": Group("world", tuple(range(world)), dist.new_group(list(range(world))), ledger)}
    for ranks in ([0, 1], [2, 3]):
        pg = dist.new_group(ranks)
        if rank in ranks:
            out["pair"] = Group("pair", tuple(ranks), pg, ledger)
    pg = dist.new_group([0, 1, 2])
    if rank < 3:
        out["triple"] = Group("triple", (0, 1, 2), pg, ledger)
    return out


def _check(rank: int, world: int) -> dict:
    ledger = CommLedger()
    results = {}
    for name, g in _groups(rank, world, ledger).items():
        assert g._gathers_by_exchange(torch.empty(4)), "gloo + host tensors take the exchange"
        shards = [torch.randn(1000 + 7 * i, generator=torch.Generator().manual_seed(10 * rank + i)) for i in range(3)]
        outs = [torch.full((g.size * s.numel(),), float("nan")) for s in shards]
        works = [g.all_gather_into(o, s) for o, s in zip(outs, shards)]  # three in flight before any wait
        for w in reversed(works):
            w.wait()
        for o, s in zip(outs, shards):
            want = torch.empty_like(o)
            dist.all_gather_into_tensor(want, s, group=g.pg)
            results[(name, s.numel())] = torch.equal(o, want)
        flat = torch.full((g.size * 9,), float("nan"))  # in place: this rank's chunk already in the output
        flat.view(g.size, 9)[g.rank] = torch.arange(9.0) + 100 * g.ranks[g.rank]
        g.all_gather_in_place(flat).wait()
        results[(name, "in place")] = torch.equal(flat, torch.cat([torch.arange(9.0) + 100 * r for r in g.ranks]))
        x = torch.randn(2, 5, generator=torch.Generator().manual_seed(rank))  # the blocking form, along dim 1
        want = torch.cat([torch.randn(2, 5, generator=torch.Generator().manual_seed(r)) for r in g.ranks], dim=1)
        results[(name, "dim1")] = torch.equal(g.all_gather(x, dim=1), want)
        _check_reduce_scatter(g, rank, results, name)
    results["ledger"] = {k: (e.calls, e.bytes) for k, e in ledger.entries.items()}
    return results


def _full(r: int, i: int, n: int) -> torch.Tensor:
    return torch.randn(n * (500 + 3 * i), generator=torch.Generator().manual_seed(1000 * r + i))


def _check_reduce_scatter(g: Group, rank: int, results: dict, name: str) -> None:
    """Three reduce-scatters in flight, waited out of order: gloo's own reduce_scatter_tensor bit for bit; at 2
    ranks through the exchange (x_0 + x_1), at 3 and 4 through gloo's (its summation order, which the ZeRO stage 0-1
    bit-for-bit tests rely on)."""
    results[(name, "exchange iff 2 ranks")] = g._reduces_by_exchange(torch.empty(4)) == (g.size == 2)
    fulls = [_full(rank, i, g.size) for i in range(3)]
    outs = [torch.full((f.numel() // g.size,), float("nan")) for f in fulls]
    works = [g.reduce_scatter_into(o, f) for o, f in zip(outs, fulls)]
    for w in reversed(works):
        w.wait()
    for i, o in enumerate(outs):
        native = torch.empty_like(o)
        dist.reduce_scatter_tensor(native, fulls[i], group=g.pg)
        results[(name, "reduce_scatter", i)] = torch.equal(o, native)


def test_exchange_all_gather_equals_gloo_s_own_with_gathers_in_flight():
    per_rank = run_distributed(_check, 4)
    for rank, res in enumerate(per_rank):
        ledger = res.pop("ledger")
        assert res and all(res.values()), (rank, [k for k, ok in res.items() if not ok])
        sizes = {"world": 4, "pair": 2, "triple": 3}
        for name in ("world", "pair") + (("triple",) if rank < 3 else ()):
            n = sizes[name]
            want_bytes = 4 * n * sum(1000 + 7 * i for i in range(3)) + 4 * 2 * 5 * n + 4 * 9 * n
            assert ledger[("all_gather", name)] == (5, want_bytes), (rank, name, ledger)
            assert ledger[("reduce_scatter", name)] == (3, 4 * n * sum(500 + 3 * i for i in range(3))), (rank, name)
