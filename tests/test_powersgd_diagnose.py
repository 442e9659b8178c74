"""hybrid/compress/diagnose.py, the measurements behind docs/comm-efficient.md ("Why r = 4 misses"): the
instrumented reduction changes nothing (the same losses as PowerSGDReduction bit for bit, its extra all-reduces
outside the DP gradient bytes); `--only` sends the other groups whole and `--error-reset` every tensor on its steps,
with the bytes of the formula; the recorded
statistics are what their definitions give on a case computed by hand; EF21's shared estimate equals the mean of
EF21's per-worker estimates."""

from __future__ import annotations

import argparse

import pytest
import torch

from hybrid.compress import diagnose
from hybrid.compress import powersgd as psgd
from hybrid.compress.link import dp_gradient_bytes
from hybrid.testing import run_distributed

STEPS, START = 4, 2


def _args(**over) -> argparse.Namespace:
    base = dict(start=START, rank=2, steps=STEPS, global_batch=8, seq=32, seed=3, only=None, stats=False, adam=False,
                adamw=False, freeze_variance=None, ef21=False, error_reset=0, json=None)
    return argparse.Namespace(**{**base, **over})


def _bytes_rank(rank, world, args, plain):
    """diagnose._rank's run, and the DP gradient bytes of each step (the ledger's), with the plain
    PowerSGDReduction in place of the diagnosed one when `plain`."""
    import hybrid.compress.diagnose as d
    from hybrid.compress.reduction import PowerSGDReduction
    if plain:
        d.DiagnosedPowerSGD = lambda cfg, layout, *a: PowerSGDReduction(cfg, layout)
    import hybrid.train_step as ts
    sent = []
    step = ts.train_step

    def counted(chunks, batches, opt, mesh, **kw):
        before = dp_gradient_bytes(mesh.ledger, mesh.dp.name)
        loss = step(chunks, batches, opt, mesh, **kw)
        sent.append(dp_gradient_bytes(mesh.ledger, mesh.dp.name) - before)
        return loss
    ts.train_step = counted
    try:
        out = d._rank(rank, world, args)
    finally:
        ts.train_step = step
    return {**out, "sent": sent}


def _run(args, plain=False):
    return run_distributed(_bytes_rank, 2, args=(args, plain), timeout=600)[0]


@pytest.mark.slow  # four 2-rank runs of 4 steps
def test_diagnosed_reduction_equals_powersgd_and_only_sends_the_rest_whole():
    plain = _run(_args(), plain=True)
    stats = _run(_args(stats=True, adam=True))
    only = _run(_args(only=["mlp"], stats=True))
    reset = _run(_args(error_reset=2))  # compressed steps 2, 3: step 3 sends everything whole
    assert stats["losses"] == plain["losses"]  # the instrumentation changes nothing
    assert stats["sent"] == plain["sent"]  # its own all-reduces are not DP gradient bytes
    from models import load_config
    arch = load_config("tiny-llama")
    h, f, kv, v, L = arch.hidden_size, arch.ffn_hidden_size, arch.num_kv_heads * arch.head_dim, arch.vocab_size, \
        arch.num_layers
    r = 2
    mats = {"embed": [(v, h)], "head": [(v, h)], "attn": [(h, h), (kv, h), (kv, h), (h, h)] * L,
            "mlp": [(f, h), (f, h), (h, f)] * L}
    whole = 2 * L * h + h  # norms
    every = sum(n * m for ms in mats.values() for n, m in ms) + whole
    assert plain["sent"][:START] == [4 * every] * START
    assert plain["sent"][START:] == [4 * (sum(r * (n + m) for ms in mats.values() for n, m in ms) + whole)] * (
        STEPS - START)
    mlp_only = sum(r * (n + m) for n, m in mats["mlp"]) + every - sum(n * m for n, m in mats["mlp"])
    assert only["sent"][START:] == [4 * mlp_only] * (STEPS - START)
    assert reset["sent"] == plain["sent"][:START + 1] + [4 * every]
    assert only["losses"][:START + 1] == plain["losses"][:START + 1] and only["losses"] != plain["losses"]
    recs = diagnose.summarise(stats["records"])
    assert sorted(recs) == list(range(START, STEPS)) and set(recs[START]) == set(diagnose.GROUPS)
    for per in recs.values():
        for k, s in per.items():
            assert 0 < s["best"] <= s["err"] < 1 and 0 < s["cos"] <= 1 and s["ef"] > 0, (k, s)
    assert {k for per in diagnose.summarise(only["records"]).values() for k in per} == {"mlp"}
    assert set(stats["adam"][0]) == set(diagnose.GROUPS) | {"norm"}


def test_summarise_gives_the_definitions_on_a_case_by_hand():
    # sums: err^2 9 / 25, ef^2 = 16 / 4, <out, g> 6 over |out| 3, |g| 2
    recs = {5: {"mlp": [9.0, 25.0, 4.0, 16.0, 6.0, 9.0, 1.0, 1.0]}}
    s = diagnose.summarise(recs)[5]["mlp"]
    assert (s["err"], s["ef"], s["cos"], s["scale"], s["best"], s["best_g"]) == (0.6, 2.0, 1.0, 1.5, 0.2, 0.5)
    m = torch.diag(torch.tensor([4.0, 3.0, 2.0, 1.0]))  # singular values 4 3 2 1: beyond rank 2, 4 + 1
    assert diagnose._tail(m, 2) == 5.0


def _ef21_rank(rank, world):
    """Two DP ranks, one bucket of two 12 x 16 matrices (compressed at rank 2: 2 x 2 x 28 < 192), 4 steps of
    reduce_bucket_ef21 on random gradients (both ranks draw both ranks' gradients), beside EF21 written per worker:
    h_i starts at g_i, then h_i <- h_i + P P^T (g_i - h_i) with the step's shared orthonormal P. The applied
    estimate must be mean_i h_i."""
    from hybrid.mesh import Mesh, ParallelDims
    torch.set_num_threads(1)
    mesh = Mesh.build(ParallelDims.from_world(world, tp=1, pp=1))
    state = psgd.PowerSGDState(psgd.PowerSGDConfig(rank=2, start_iter=0))
    gen = torch.Generator().manual_seed(11)
    own, outs = None, []
    for _ in range(4):
        grads = [torch.randn(2 * N, generator=gen, dtype=torch.float64) for _ in range(world)]
        buf = grads[rank].clone()
        diagnose.reduce_bucket_ef21(state, 0, buf, [buf[:N].view(12, 16), buf[N:].view(12, 16)], mesh.dp)
        outs.append(buf.clone())
        if own is None:
            own = [g.clone() for g in grads]
            continue
        ps = state.p[0].view(2, 12, 2)  # the two matrices' P, in the hook's (shape-grouped) order
        for h, g in zip(own, grads):
            for j in range(2):
                h[N * j:N * (j + 1)] += (ps[j] @ ps[j].T @ (g - h)[N * j:N * (j + 1)].view(12, 16)).reshape(-1)
    return outs, sum(own) / world


N = 12 * 16


def test_ef21_shared_estimate_is_the_mean_of_ef21s_per_worker_estimates():
    (o0, mean0), (o1, _) = run_distributed(_ef21_rank, 2, timeout=300)
    assert all(torch.equal(a, b) for a, b in zip(o0, o1))  # every rank applies the same estimate
    assert torch.allclose(o0[-1], mean0, rtol=0, atol=1e-12)  # float64 sums of a few products
    assert not torch.allclose(o0[-1], o0[-2])
    for prev, cur in zip(o0[1:], o0[2:]):  # after the exact start, each step moves it by a rank-2 P Q^T
        for j in range(2):
            assert torch.linalg.matrix_rank((cur - prev)[N * j:N * (j + 1)].view(12, 16), atol=1e-10) == 2


def test_freeze_variance_is_fused_adamw_until_its_step_then_holds_v_and_its_bias_correction():
    torch.manual_seed(0)
    p, twin = (torch.nn.Parameter(torch.randn(16)) for _ in range(2))
    twin.data.copy_(p.data)
    kw = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01, fused=True)
    opt, ref = torch.optim.AdamW([p], **kw), torch.optim.AdamW([twin], **kw)
    diagnose.freeze_variance(opt, 2)
    grads = [torch.randn(16) for _ in range(5)]
    for g in grads[:2]:
        p.grad, twin.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    assert torch.equal(p, twin)  # before the freeze: torch's fused AdamW, bit for bit
    v = opt.state[p]["exp_avg_sq"].clone()
    m, w = opt.state[p]["exp_avg"].clone(), p.detach().clone()
    for t, g in enumerate(grads[2:], start=3):  # AdamW written out with v and 1 - b2^2 held
        p.grad = g.clone()
        opt.step()
        m = 0.9 * m + 0.1 * g
        w = w * (1 - 3e-3 * 0.01) - 3e-3 / (1 - 0.9 ** t) * m / (v.sqrt() / (1 - 0.95 ** 2) ** 0.5 + 1e-8)
        assert torch.equal(opt.state[p]["exp_avg_sq"], v)
        assert torch.allclose(p, w, rtol=1e-6, atol=0)  # fp32: a few roundings of O(1) values
