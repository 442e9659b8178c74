"""Context-parallel attention on 4 gloo ranks against full attention in one process: every comm type (p2p ring,
a2a Ulysses, allgather) at CP 2 and 4, MHA / GQA / MQA, plain causal, a sliding window shorter than a
load-balanced chunk (3 < T/2CP) and longer than the local shard (20 > T/CP), packed documents with and without a
window. Forward output and the gradients of q, k, v (each rank's shard, reassembled) within 1e-5 of the largest
value in fp32; the reference is fp64 attention with an independently built mask (tests/test_cp_softmax.py).
Bytes on the ledger equal the formulas of hybrid/cp/ring.py and attention.py, per collective."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from hybrid.comm import CommLedger, Group
from hybrid.cp import AttentionMask, CommType, CPContext, shard, unshard
from hybrid.cp.attention import check_ulysses_heads
from hybrid.cp.ring import ring_bytes
from hybrid.testing import run_distributed
from tests.test_cp_softmax import _segments, close, reference_attention, reference_mask

B, T, D = 2, 32, 8
HEADS = {"mha": (4, 4), "gqa": (4, 2), "mqa": (4, 1)}
MASKS = {"causal": (None, False), "window-3": (3, False), "window-20": (20, False), "docs": (None, True),
         "window-docs": (5, True)}
CASES = [(cp, comm, heads, mask) for cp in (2, 4) for comm in CommType for heads in HEADS for mask in MASKS
         if comm is not CommType.A2A or all(n % cp == 0 for n in HEADS[heads])]


def _inputs(heads: str):
    a, g = HEADS[heads]
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(B, n, T, D, generator=gen) for n in (a, g, g))
    return q, k, v, torch.randn(B, a, T, D, generator=gen)


def _mask(kind: str) -> AttentionMask:
    window, docs = MASKS[kind]
    return AttentionMask(window=window, segments=_segments(B, T) if docs else None)


def _groups(rank: int, ledger: CommLedger) -> dict[int, Group]:
    """The CP group of this rank at CP 4 (everyone) and CP 2 ([0, 1], [2, 3]); new_group is collective."""
    out = {}
    for cp in (2, 4):
        for start in range(0, 4, cp):
            ranks = tuple(range(start, start + cp))
            pg = dist.new_group(list(ranks))
            if rank in ranks:
                out[cp] = Group("cp", ranks, pg, ledger)
    return out


def _worker(rank: int, world: int):
    ledger = CommLedger()
    groups = _groups(rank, ledger)
    out = {}
    for cp, comm, heads, kind in CASES:
        group = groups[cp]
        q, k, v, do = _inputs(heads)
        q, k, v = (shard(t, group.rank, cp, dim=2).requires_grad_() for t in (q, k, v))
        ledger.reset()
        o = CPContext(group, comm).attention(q, k, v, _mask(kind))
        o.backward(shard(do, group.rank, cp, dim=2))
        out[(cp, comm.value, heads, kind)] = (o.detach(), q.grad, k.grad, v.grad, ledger.summary())
    return out


@functools.lru_cache(maxsize=1)
def results():
    return run_distributed(_worker, 4, timeout=600)


@pytest.mark.parametrize("cp,comm,heads,kind", [(c, m.value, h, k) for c, m, h, k in CASES])
def test_cp_attention_equals_full_attention(cp, comm, heads, kind):
    per_rank = [results()[r][(cp, comm, heads, kind)] for r in range(cp)]  # the CP group of ranks 0 .. cp-1
    q, k, v, do = _inputs(heads)
    window, docs = MASKS[kind]
    qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
    o_ref, _ = reference_attention(qr, kr, vr, reference_mask(T, window, _segments(B, T) if docs else None))
    o_ref.backward(do.double())
    for i, ref in enumerate((o_ref, qr.grad, kr.grad, vr.grad)):
        got = unshard([p[i] for p in per_rank], dim=2)
        assert close(got, ref), f"{['o', 'dq', 'dk', 'dv'][i]}"


def _bytes(summary: dict, key: str) -> int:
    return summary.get(key, {}).get("bytes", 0)


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("heads", ["mha", "gqa"])
def test_cp_ledger_bytes_equal_formulas(cp, heads):
    a, g = HEADS[heads]
    tl = T // cp
    kv = 2 * B * g * tl * D * 4  # one rank's K and V, fp32
    q_bytes = B * a * tl * D * 4
    fwd, bwd = ring_bytes(2 * B * g * tl * D, cp, 4)
    assert (fwd, bwd) == ((cp - 1) * kv, (cp - 1) * kv + cp * kv)  # fp32: the accumulators are kv-sized
    for r in range(cp):
        ring = results()[r][(cp, "p2p", heads, "causal")][4]
        assert _bytes(ring, "send@cp") == _bytes(ring, "recv@cp") == fwd + bwd
        ag = results()[r][(cp, "allgather", heads, "causal")][4]
        assert _bytes(ag, "all_gather@cp") == _bytes(ag, "reduce_scatter@cp") == cp * kv
        assert set(ag) == {"all_gather@cp", "reduce_scatter@cp"}
        if g % cp == 0:
            a2a = results()[r][(cp, "a2a", heads, "causal")][4]
            # forward q, k, v in and o out; backward the same four, reversed
            assert _bytes(a2a, "all_to_all@cp") == 2 * (2 * q_bytes + kv)
            assert a2a["all_to_all@cp"]["calls"] == 8


def test_ulysses_rejects_more_cp_ranks_than_kv_heads_by_name():
    with pytest.raises(ValueError, match="--cp-comm-type a2a .*--context-parallel-size 4.* 2 key/value heads"):
        check_ulysses_heads(8, 2, 4)
    check_ulysses_heads(8, 4, 4)
