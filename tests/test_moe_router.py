"""The router and dispatch functions alone, against Megatron-core's own (moe_utils) and transformers' routers on the
same inputs: routing, load-balancing loss, z-loss, capacity dropping, permutation; the pure dispatch arithmetic;
DeepSeek-V3's bias update."""

from __future__ import annotations

import warnings

import pytest
import torch

from hybrid.moe import dispatch as dsp
from hybrid.moe.router import (SIGMOID, route, seq_aux_loss, switch_aux_loss, tokens_per_expert, updated_expert_bias,
                               z_loss)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.transformer.moe import moe_utils as mcore

N, E, K = 64, 8, 2


def logits(seed=0, n=N, e=E):
    return torch.randn(n, e, generator=torch.Generator().manual_seed(seed))


def dense(r, e=E):
    """(N, E) probabilities and routing map of a Routing, as Megatron returns them."""
    probs = torch.zeros(r.experts.shape[0], e).scatter(1, r.experts, r.probs)
    return probs, torch.zeros(r.experts.shape[0], e, dtype=torch.bool).scatter(1, r.experts, True)


@pytest.mark.parametrize("pre", [True, False])
def test_routing_equals_megatron_pre_and_post_softmax(pre):
    x = logits()
    r = route(x, K, pre_softmax=pre, norm_topk=False)
    probs, routing_map = mcore.topk_routing_with_score_function(x, K, use_pre_softmax=pre)
    ours_probs, ours_map = dense(r)
    assert torch.equal(ours_map, routing_map)
    torch.testing.assert_close(ours_probs, probs, rtol=0, atol=1e-7)


def test_sigmoid_routing_with_expert_bias_equals_megatron():
    """DeepSeek-V3: choose with sigmoid + bias, weigh with the sigmoid alone, renormalised."""
    x, bias = logits(1), torch.linspace(-0.5, 0.5, E)
    r = route(x, K, norm_topk=True, score_function=SIGMOID, bias=bias)
    probs, routing_map = mcore.topk_routing_with_score_function(x, K, score_function="sigmoid", expert_bias=bias)
    ours_probs, ours_map = dense(r)
    assert torch.equal(ours_map, routing_map)
    torch.testing.assert_close(ours_probs, probs, rtol=0, atol=1e-7)
    unbiased = route(x, K, norm_topk=True, score_function=SIGMOID)
    assert not torch.equal(unbiased.experts.sort(1).values, r.experts.sort(1).values)  # the bias changed choices
    top1 = route(x, 1, norm_topk=True, score_function=SIGMOID, bias=bias)  # top-1: the sigmoid itself, as Megatron
    probs, _ = mcore.topk_routing_with_score_function(x, 1, score_function="sigmoid", expert_bias=bias)
    torch.testing.assert_close(dense(top1)[0], probs, rtol=0, atol=1e-7)
    assert (top1.probs < 1).all()


def test_routing_equals_transformers_routers():
    """Mixtral's router (softmax, top-k, renormalise) and Qwen2-MoE's (no renormalisation) on the same logits."""
    from transformers import MixtralConfig, Qwen2MoeConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter
    h = torch.randn(N, 16, generator=torch.Generator().manual_seed(2))
    for router, norm in ((MixtralTopKRouter(MixtralConfig(hidden_size=16, num_local_experts=E, num_experts_per_tok=K)), True),
                         (Qwen2MoeTopKRouter(Qwen2MoeConfig(hidden_size=16, num_experts=E, num_experts_per_tok=K, norm_topk_prob=False)), False)):
        torch.nn.init.normal_(router.weight, std=0.5)
        lg, scores, idx = router(h)
        r = route(lg, K, pre_softmax=True, norm_topk=norm)
        assert torch.equal(r.experts, idx)
        torch.testing.assert_close(r.probs, scores.float(), rtol=0, atol=1e-7)


def test_load_balancing_loss_equals_megatron_core():
    """Our switch loss = Megatron-core's switch_load_balancing_loss_func on the same router outputs, the value and
    its gradient with respect to the logits."""
    x = logits(3).requires_grad_()
    r = route(x, K)
    counts = tokens_per_expert(r.experts, E)
    ours_ = switch_aux_loss(r.scores, counts, N, K, coeff=0.01)
    ref = mcore.switch_load_balancing_loss_func(r.scores, counts, N, K, E, 0.01)
    assert torch.equal(ours_, ref)
    g1, = torch.autograd.grad(ours_, x, retain_graph=True)
    g2, = torch.autograd.grad(ref, x)
    assert torch.equal(g1, g2)


def test_seq_aux_loss_equals_megatron_reshape_trick():
    """Megatron's seq_aux_loss reshapes (T, B E) and divides by B; ours averages the per-sequence switch loss."""
    B, T = 4, 16
    x = logits(4, B * T)
    r = route(x, K)
    per_seq = torch.zeros(B, E).scatter_add_(1, r.experts.view(B, -1), torch.ones(B, T * K))
    ours_ = seq_aux_loss(r.scores.view(B, T, E), per_seq, T, K, coeff=0.01)
    # Megatron's layout is sequence-major (T, B): token (t, b) is row t B + b
    s_tb = r.scores.view(B, T, E).transpose(0, 1).reshape(T, B * E)
    ref = mcore.switch_load_balancing_loss_func(s_tb, per_seq.flatten(), T, K, E, 0.01) / B
    torch.testing.assert_close(ours_, ref, rtol=1e-6, atol=0)


def test_z_loss_equals_megatron_core():
    x = logits(5)
    assert torch.equal(z_loss(x, 1e-3), mcore.z_loss_func(x, 1e-3))


def test_expert_bias_update_is_deepseek_v3_rule():
    """b_e += u sign(mean load - load_e): underloaded experts up, overloaded down, at-mean unchanged."""
    counts = torch.tensor([10.0, 30.0, 20.0, 20.0])
    b = updated_expert_bias(torch.zeros(4), counts, 1e-3)
    assert b.tolist() == pytest.approx([1e-3, -1e-3, 0.0, 0.0])


# --- dispatch: pure functions of (routing map, counts) ------------------------------------------------
def test_permutation_equals_megatron_permute():
    """Rows grouped by expert, token order within each: Megatron's permute gives the same token order."""
    r = route(logits(6), K)
    d = dsp.permutation(r.experts, E)
    _, routing_map = dense(r)
    tokens = torch.randn(N, 4)
    permuted, _, sorted_indices = mcore.permute(tokens, routing_map)
    assert torch.equal(d.rows // K, sorted_indices)
    assert torch.equal(d.counts, routing_map.sum(0))
    assert torch.equal(tokens[d.rows // K], permuted)


def test_permutation_is_a_bijection_onto_the_slots():
    r = route(logits(7), K)
    d = dsp.permutation(r.experts, E)
    assert torch.equal(d.rows.sort().values, torch.arange(N * K))
    assert torch.equal(r.experts.flatten()[d.rows], torch.repeat_interleave(torch.arange(E), d.counts))


def test_capacity_drop_equals_megatron_token_dropping():
    """Capacity ceil(f N k / E); each expert keeps its highest-probability slots (drop policy "probs")."""
    r = route(logits(8), K)
    cap = dsp.capacity(N, E, K, 0.75)
    assert cap == mcore.get_capacity(N * K, E, 0.75) == 12
    for n, f in ((10, 1.0), (64, 0.3), (7, 1.5)):  # N k f / E not whole: rounded up, never down
        assert dsp.capacity(n, E, K, f) == mcore.get_capacity(n * K, E, f) > n * K * f / E
    keep = dsp.capacity_keep(r.probs, r.experts, E, cap)
    probs, routing_map = dense(r)
    _, final_map = mcore.apply_router_token_dropping(probs, routing_map, K, 0.75)
    ours_map = torch.zeros(N, E, dtype=torch.bool).scatter(1, r.experts, keep)
    assert torch.equal(ours_map, final_map)
    assert int(dsp.permutation(r.experts, E, keep).counts.max()) <= cap


def test_padding_fills_every_expert_to_capacity():
    r = route(logits(9), K)
    cap = dsp.capacity(N, E, K, 1.0)
    keep = dsp.capacity_keep(r.probs, r.experts, E, cap)
    unpadded = dsp.permutation(r.experts, E, keep)
    d = dsp.permutation(r.experts, E, keep, pad_to=cap)
    assert d.num_rows == E * cap and d.counts.tolist() == [cap] * E
    blocks = d.rows.view(E, cap)
    for e in range(E):  # each block: the expert's kept rows in order, then -1 padding
        real = unpadded.rows[unpadded.counts[:e].sum():unpadded.counts[:e + 1].sum()]
        assert torch.equal(blocks[e, :len(real)], real) and (blocks[e, len(real):] == -1).all()


def test_expert_major_reorders_received_blocks():
    """Rows from 2 source ranks, 3 local experts each: (source, expert) blocks -> (expert, source) blocks."""
    counts = torch.tensor([[1, 0, 2], [2, 1, 0]])
    # received buffer: s0e0 s0e2 s0e2 s1e0 s1e0 s1e1 -> rows 0..5
    order = dsp.expert_major(counts)
    assert order.tolist() == [0, 3, 4, 5, 1, 2]
    assert dsp.rank_splits(torch.tensor([1, 2, 3, 4]), 2).tolist() == [3, 7]
