"""Dropout under tensor parallelism (hybrid/tp/random.py, Megatron's model-parallel RNG):
replicated-region masks are equal on every TP rank, sharded-region masks differ, a seed gives
bit-identical runs, recomputation redraws the original masks, the drop rate is p, and the
`--hidden-dropout` / `--attention-dropout` flags reach the model.

The TP ranks do not import transformers (~1.2 s of CPU a rank): their config is made here, in the test process,
and passed without the transformers config object it was read from (GPT-2 has no RoPE to compute from it)."""

from __future__ import annotations

import dataclasses
import math
import sys

import pytest
import torch

from hybrid.comm import Group
from hybrid.mesh import Mesh, ParallelDims
from hybrid.testing import run_distributed
from hybrid.tp import Dropout, ParallelRNG, Region, TPContext, gather_full, sync_partial_grads
from hybrid.tp.random import PP_SEED_STRIDE, TP_SEED_OFFSET
from models import Recompute, build_model, from_hf, shift_labels
from models.common import ParallelAttention

P = 0.1
BATCH, SEQ = 2, 16


def gpt2_cfg(p: float = P):
    from transformers import GPT2Config  # in the test process only (the module doc)
    return from_hf(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=256, n_positions=64, resid_pdrop=p,
                              embd_pdrop=p, attn_pdrop=p, bos_token_id=0, eos_token_id=0))


def ids():
    return torch.randint(0, 256, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))


def binomial_bound(n: int, p: float) -> float:
    """6 standard deviations of the drop fraction of n Bernoulli(p) draws: a correct dropout
    leaves it only with probability ~2e-9 (normal approximation, n p >> 1)."""
    return 6 * math.sqrt(p * (1 - p) / n)


# ---- single process -------------------------------------------------------------------------

def test_stream_seeds_are_megatrons():
    """Megatron: default (replicated) seed = seed + 100 pp_rank; model-parallel seed = that + 2718 + tp_rank."""
    rng = ParallelRNG(1234, tp_rank=3, pp_rank=2)
    assert (PP_SEED_STRIDE, TP_SEED_OFFSET) == (100, 2718)
    assert rng.stream_seed(Region.REPLICATED) == 1234 + 200
    assert rng.stream_seed(Region.TENSOR_PARALLEL) == 1234 + 200 + 2718 + 3


def test_fork_leaves_the_default_generator_where_it_was():
    torch.manual_seed(5)
    expected = torch.rand(8)
    torch.manual_seed(5)
    rng = ParallelRNG(7)
    with rng.fork(Region.TENSOR_PARALLEL):
        torch.rand(100)
    assert torch.equal(torch.rand(8), expected)


def test_get_state_set_state_resume_both_streams():
    rng = ParallelRNG(7)
    drop = {r: Dropout(0.5, rng, r).train() for r in Region}
    x = torch.ones(1000)
    state = rng.get_state()
    first = {r: d(x) for r, d in drop.items()}
    assert not torch.equal(first[Region.REPLICATED], first[Region.TENSOR_PARALLEL])
    rng.set_state(state)
    assert all(torch.equal(drop[r](x), first[r]) for r in Region)
    with pytest.raises(ValueError, match="lacks the stream"):
        rng.set_state({"replicated": state["replicated"]})


def test_hidden_dropout_drop_rate_and_scale():
    n = 200_000
    y = Dropout(P, ParallelRNG(3), Region.REPLICATED).train()(torch.ones(n))
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - P) <= binomial_bound(n, P)
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 1 / (1 - P)))  # survivors scaled by 1/(1-p)


def test_attention_dropout_drop_rate():
    """q = k = 0 makes the causal attention uniform, P_ij = 1/(i+1), and v = identity makes the
    output out_ij = P_ij m_ij / (1-p): each zero below the diagonal is one dropped probability."""
    cfg = gpt2_cfg()
    B, H, T = 8, 4, 64
    attn = ParallelAttention(cfg, TPContext(Group.solo("tp")), out_std=0.02).train()
    q = torch.zeros(B, H, T, T)
    v = torch.eye(T).expand(B, H, T, T)
    out = attn.core(q, q, v)
    causal = torch.ones(T, T).tril().bool()
    kept = out[..., causal]
    n = kept.numel()
    assert abs((kept == 0).float().mean().item() - P) <= binomial_bound(n, P)
    uniform = (1 / torch.arange(1, T + 1).float())[:, None].expand(T, T)[causal] / (1 - P)
    nz = kept != 0
    assert torch.allclose(kept[nz], uniform.expand_as(kept)[nz], rtol=1e-6)
    assert (out[..., ~causal] == 0).all()


def _loss_and_grads(cfg, rng, recompute=Recompute.NONE, train=True):
    model = build_model(cfg, TPContext(Group.solo("tp"), rng=rng), seed=3, recompute=recompute).train(train)
    loss = model(ids(), shift_labels(ids()))
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


def test_eval_mode_is_dropout_free():
    ref, _ = _loss_and_grads(gpt2_cfg(0.0), ParallelRNG(1), train=False)
    evaluated, _ = _loss_and_grads(gpt2_cfg(), ParallelRNG(1), train=False)
    trained, _ = _loss_and_grads(gpt2_cfg(), ParallelRNG(1))
    assert torch.equal(evaluated, ref) and not torch.equal(trained, ref)


@pytest.mark.parametrize("recompute", [Recompute.SELECTIVE, Recompute.FULL])
def test_recomputation_redraws_the_original_masks(recompute):
    """Bit-identical gradients with and without recomputation, dropout on: the recomputed forward
    must replay both streams (torch's checkpoint replays only the default generator)."""
    loss, grads = _loss_and_grads(gpt2_cfg(), ParallelRNG(1))
    loss_r, grads_r = _loss_and_grads(gpt2_cfg(), ParallelRNG(1), recompute)
    assert torch.equal(loss, loss_r)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_r))


def test_dropout_flags_reach_the_model():
    from hybrid.train.args import check_args, parse_args

    args = parse_args(["--model", "tiny-llama", "--hidden-dropout", "0.2", "--attention-dropout", "0.05"])
    cfg = check_args(args, 1)[0]
    model = build_model(cfg, TPContext(Group.solo("tp")), seed=0)
    drops = {m.p for m in model.modules() if isinstance(m, Dropout)}
    attn = {m.dropout for m in model.modules() if isinstance(m, ParallelAttention)}
    assert (drops, attn) == ({0.2}, {0.05})
    default = check_args(parse_args(["--model", "tiny-gpt2"]), 1)[0]
    assert (default.dropout, default.attention_dropout) == (0.0, 0.0)  # the config's own values
    with pytest.raises(ValueError, match=r"--hidden-dropout 1.5 must be in \[0, 1\)"):
        check_args(parse_args(["--hidden-dropout", "1.5"]), 1)


def test_llama_attention_dropout_comes_from_its_config():
    from transformers import LlamaConfig
    cfg = from_hf(LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=4, attention_dropout=0.3))
    assert (cfg.dropout, cfg.embedding_dropout, cfg.attention_dropout) == (0.0, 0.0, 0.3)


# ---- two TP ranks, one launch ----------------------------------------------------------------

def _tp_run(mesh, cfg, seed, sp=False, capture=None):
    """Loss, full gradients and (optionally) every hidden-dropout output of a tp=2 GPT-2 step."""
    tp = TPContext(mesh.tp, sequence_parallel=sp, rng=ParallelRNG(seed, tp_rank=mesh.tp.rank))
    model = build_model(cfg, tp, seed=3).train()
    if capture is not None:
        for name, m in model.named_modules():
            if isinstance(m, Dropout):
                m.register_forward_hook(lambda mod, inp, out, name=name: capture.append((name, inp[0], out)))
    loss = model(ids(), shift_labels(ids()))
    loss.backward()
    sync_partial_grads(model.parameters(), mesh.tp)
    return loss.detach(), [gather_full(p.grad, p.shard, mesh.tp) for p in model.parameters()], model


def _ranks(rank, world, cfg):
    mesh = Mesh.build(ParallelDims.from_world(world, tp=world))
    out = {}
    captured = []
    loss, grads, model = _tp_run(mesh, cfg, 11, capture=captured)
    out["replicated"] = [(n, i, o) for n, i, o in captured]
    loss2, grads2, _ = _tp_run(mesh, cfg, 11)
    out["same_seed_identical"] = torch.equal(loss, loss2) and all(torch.equal(a, b) for a, b in zip(grads, grads2))
    out["other_seed_loss_differs"] = not torch.equal(_tp_run(mesh, cfg, 12)[0], loss)
    # identical q, k, v on both ranks: the attention core's dropout is per TP rank
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(BATCH, 2, SEQ, 8, generator=g) for _ in range(3))
    out["attention"] = model.h["0"].attn.core(q, k, v)
    # under SP the residual stream is split over TP: identical inputs get per-rank masks too
    tp = TPContext(mesh.tp, sequence_parallel=True, rng=ParallelRNG(11, tp_rank=mesh.tp.rank))
    out["sp_region"] = build_model(cfg, tp, seed=3).train().h["0"].drop.region
    out["sp_hidden"] = Dropout(P, tp.rng, tp.activation_region).train()(torch.ones(4096))
    assert "transformers" not in sys.modules, "a rank imported transformers (the module doc)"
    return out


@pytest.fixture(scope="module")
def per_rank():
    return run_distributed(_ranks, 2, args=(dataclasses.replace(gpt2_cfg(), hf_config=None),), timeout=300)


def test_replicated_region_masks_are_equal_on_every_tp_rank(per_rank):
    r0, r1 = per_rank[0]["replicated"], per_rank[1]["replicated"]
    assert [n for n, _, _ in r0] == [n for n, _, _ in r1] and len(r0) == 5  # embedding + 2 per block
    for (name, in0, out0), (_, in1, out1) in zip(r0, r1):
        assert torch.equal(in0, in1) and torch.equal(out0, out1), name
        dropped = ((out0 == 0) & (in0 != 0)).float().mean().item()
        assert abs(dropped - P) <= binomial_bound(in0.numel(), P), name  # and dropout is really on


def test_sharded_region_masks_differ_across_tp_ranks(per_rank):
    a0, a1 = per_rank[0]["attention"], per_rank[1]["attention"]
    assert not torch.equal(a0, a1)
    assert per_rank[0]["sp_region"] is Region.TENSOR_PARALLEL
    h0, h1 = per_rank[0]["sp_hidden"], per_rank[1]["sp_hidden"]
    assert not torch.equal(h0 == 0, h1 == 0)


def test_one_seed_gives_bit_identical_runs(per_rank):
    assert all(r["same_seed_identical"] for r in per_rank)
    assert all(r["other_seed_loss_differs"] for r in per_rank)
