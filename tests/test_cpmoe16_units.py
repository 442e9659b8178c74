"""CP x EP, the MoE block's side, in one process: a CP rank's balancing losses, z-loss, expert-bias loads and
step statistics against the unsharded block, the CP peers stood in by groups that add the other ranks' values
(as tests/test_mutation_catches3.py stands in TP). The multi-rank run of the whole model against transformers is
tests/test_cpmoe16_parallel.py; these pin each term of hybrid/moe/layer.py and runtime.py to its reason.

A CP rank holds T/cp tokens of each of the micro-batch's sequences (which ones does not matter to a token-local
block). Its share of the loss uses the counts of the whole sequences (summed over CP), and the gradient of its
share is scaled by cp -- the engine divides the DP x CP sum by dp x cp, and the LM loss is cp x its share
(hybrid/cp/loss.py) -- so the CP ranks' router gradients sum to cp x the unsharded block's. Bounds: fp32 sums in
another order, rtol 1e-5 (the MoE tests' RTOL) on the gradients, 1e-6 relative on the loss values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from hybrid.mesh import ParallelDims
from hybrid.moe.config import LoadBalancing, MoEConfig
from hybrid.moe.parallel import ExpertAxis, ExpertLayout

E, K, H = 4, 2, 8


class _Adds:
    """A group of `size` ranks whose other ranks contribute `other` to a SUM all-reduce."""

    def __init__(self, other: torch.Tensor, size: int = 2):
        self.other, self.size, self.calls = other, size, 0

    def all_reduce(self, t: torch.Tensor, tag: str = "") -> torch.Tensor:
        self.calls += 1
        return t.add_(self.other)


def _layer(mc: MoEConfig, cp=None):
    """One MoE block (4 experts, top 2, h 8) in training mode, seeded; tp 1, its CP group `cp` (a stand-in)."""
    from hybrid.moe.layer import ExpertContext, MoELayer
    from hybrid.tp.sharding import REPLICATED
    cfg = SimpleNamespace(num_experts=E, hidden_size=H, moe_ffn_hidden_size=16, moe_top_k=K,
                          moe_router_pre_softmax=True, moe_norm_topk_prob=True, moe_shared_expert_gate=False)
    tp = SimpleNamespace(size=1, sequence_parallel=False, replicated_spec=lambda: REPLICATED, group=None)
    torch.manual_seed(0)
    layer = MoELayer(cfg, tp, ExpertContext(mc, cp=cp), F.silu).train()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape) * 0.5)
    return layer


def _top(layer, x: torch.Tensor) -> torch.Tensor:
    """(B, T, k) the experts each token of x (B, T, h) is routed to: top-k of the softmax scores."""
    B, T, h = x.shape
    return torch.topk(torch.softmax(F.linear(x.reshape(-1, h), layer.gate.weight), -1), K, dim=-1).indices.view(B, T, K)


def _counts(layer, x: torch.Tensor, per_sequence: bool) -> torch.Tensor:
    """Slots per expert of x's tokens: (E,), or (B, E) per sequence."""
    hot = F.one_hot(_top(layer, x), E).float()  # (B, T, k, E)
    return hot.sum((1, 2)) if per_sequence else hot.sum((0, 1, 2))


# the CP split: rank 0 the first and last quarter of each sequence, rank 1 the middle (hybrid/cp/balance.py's
# load-balanced chunks at cp 2; any split would do for a token-local block)
SPLIT = (torch.tensor([0, 1, 6, 7]), torch.tensor([2, 3, 4, 5]))


@pytest.mark.parametrize("kind", ["aux_loss", "seq_aux_loss", "z_loss"])
def test_cp_ranks_shares_sum_to_the_unsharded_loss_and_cp_times_its_router_gradient(kind):
    """aux_loss / seq_aux_loss (counts summed over CP: the stand-in adds the other rank's) and the z-loss (1 / cp of
    each rank's mean): the two CP ranks' values sum to the unsharded block's loss, their router gradients to cp x
    its gradient."""
    if kind == "z_loss":
        mc = MoEConfig(load_balancing=LoadBalancing.NONE, z_loss_coeff=0.1)
    else:
        mc = MoEConfig(load_balancing=LoadBalancing(kind), aux_loss_coeff=0.1)
    x = torch.randn(2, 8, H, generator=torch.Generator().manual_seed(4))
    full = _layer(mc)
    (full(x) * 0).sum().backward()  # the LM loss adds nothing: only the router's losses reach the router
    stand_in = _Adds(torch.zeros(1))
    cp = _layer(mc, stand_in)
    for j, idx in enumerate(SPLIT):
        stand_in.other = _counts(cp, x[:, SPLIT[1 - j]], per_sequence=kind == "seq_aux_loss")
        (cp(x[:, idx]) * 0).sum().backward()
    value = full.stat_z if kind == "z_loss" else full.stat_aux
    got = cp.stat_z if kind == "z_loss" else cp.stat_aux
    assert value > 0 and abs(got - value) < 1e-6 * value
    torch.testing.assert_close(cp.gate.weight.grad, 2 * full.gate.weight.grad, rtol=1e-5, atol=1e-8)
    assert stand_in.calls == (0 if kind == "z_loss" else 2)  # the counts all-reduced over CP once per forward


def test_hf_pooled_loss_at_cp_2_sums_to_the_unsharded_loss_and_cp_times_its_router_gradient():
    """hf_aux_loss (transformers' loss pooled over the model's MoE layers; one layer here): each CP rank's forward
    pools its counts summed over CP, so the two ranks' shares sum to the unsharded value, their router gradients to
    cp x the unsharded one."""
    mc = MoEConfig(load_balancing=LoadBalancing.HF_AUX_LOSS, aux_loss_coeff=0.1)
    x = torch.randn(2, 8, H, generator=torch.Generator().manual_seed(5))
    full = _layer(mc)
    full.pool_owner = True
    (full(x) * 0).sum().backward()
    stand_in = _Adds(torch.zeros(E))
    cp = _layer(mc, stand_in)
    cp.pool_owner = True
    for j, idx in enumerate(SPLIT):
        stand_in.other = _counts(cp, x[:, SPLIT[1 - j]], per_sequence=False)
        (cp(x[:, idx]) * 0).sum().backward()
    value, got = sum(p.value() for p in full.pools), sum(p.value() for p in cp.pools)
    assert value > 0 and abs(got - value) < 1e-6 * value
    torch.testing.assert_close(cp.gate.weight.grad, 2 * full.gate.weight.grad, rtol=1e-5, atol=1e-8)


def test_cp_counts_of_one_rank_alone_give_another_loss():
    """The check above fails when the counts stay this rank's (the CP all-reduce left out): the per-rank loss of
    the rank's own counts differs from its share of the whole sequences'."""
    mc = MoEConfig(load_balancing=LoadBalancing.AUX_LOSS, aux_loss_coeff=0.1)
    x = torch.randn(2, 8, H, generator=torch.Generator().manual_seed(4))
    full = _layer(mc)
    full(x)
    alone = _layer(mc, _Adds(torch.zeros(E)))  # the other rank adds nothing
    for idx in SPLIT:
        alone(x[:, idx])
    assert abs(alone.stat_aux - full.stat_aux) > 1e-3 * full.stat_aux


def test_expert_bias_update_reads_the_loads_of_the_cp_peers():
    """DeepSeek-V3's bias update (runtime.after_step) counts every token of the global batch: with CP, the other
    halves of the sequences too. The CP peer's loads flip the sign for some expert."""
    from hybrid.moe.router import updated_expert_bias
    from hybrid.moe.runtime import after_step
    layer = _layer(MoEConfig(load_balancing=LoadBalancing.NONE, expert_bias=True, bias_update_rate=0.01))
    layer(torch.randn(2, 8, H, generator=torch.Generator().manual_seed(2)))
    own = layer.stat_counts.clone()  # 32 slots over 4 experts
    cp_peer = torch.tensor([0.0, 70.0, 0.0, 0.0])
    none = torch.zeros(E)
    after_step(layer, SimpleNamespace(tp=_Adds(none), cp=_Adds(cp_peer), dp=_Adds(none)))
    want = updated_expert_bias(torch.zeros(E), own + cp_peer, 0.01)
    assert torch.equal(layer.gate.expert_bias, want)
    assert not torch.equal(updated_expert_bias(torch.zeros(E), own, 0.01), want)


def test_step_statistics_sum_the_cp_ranks_shares():
    """The log line's aux loss (runtime.step_statistics) at cp 2: this rank's share plus the CP peer's (the stand-in
    adds a row for the layer: its slots and its share), over dp 1 and one micro-batch."""
    import torch.nn as nn

    from hybrid.moe.runtime import step_statistics
    stage = nn.Module()
    stage.cfg = SimpleNamespace(num_experts=E, num_layers=1)
    stage.layers = nn.ModuleList([nn.Module()])
    stage.layers[0].mlp = _layer(MoEConfig(aux_loss_coeff=0.1), _Adds(torch.zeros(E)))
    stage.layers[0].mlp(torch.randn(2, 4, H, generator=torch.Generator().manual_seed(6)))
    own = stage.layers[0].mlp.stat_aux
    other = torch.zeros(1, E + 3, dtype=torch.float64)  # columns: slots, aux, z, stage
    other[0, :E + 1] = torch.tensor([5.0, 5.0, 3.0, 3.0, 0.25])
    same = _Adds(torch.zeros(1, E + 3, dtype=torch.float64), size=1)
    mesh = SimpleNamespace(tp=same, cp=_Adds(other), dp=same, pp=same, device=torch.device("cpu"))
    st = step_statistics(stage, mesh, micro_batches=1)
    assert st.aux_loss == pytest.approx(own + 0.25, rel=1e-12)


def test_expert_layout_carves_expert_dp_out_of_dp_x_cp():
    """Megatron's parallel_state: the expert rank generator has no CP axis, so expert-DP = tp cp dp / (etp ep).
    tp 2 x cp 2 x dp 2 (8 ranks, rank = tp + 2 (cp + 2 dp)): EP 2 pairs the TP ranks, expert-DP spans CP and DP;
    EP 4 spans TP and CP; with expert-TP 2 the EP pairs are the CP pairs. The tp_cp group (the counts) holds one
    replica's four ranks. Hand-derived."""
    dims = ParallelDims.from_world(8, tp=2, cp=2)
    lay = ExpertLayout(dims, ep=2)
    assert lay.edp == 4 and lay.group_ranks(ExpertAxis.EP) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert lay.group_ranks(ExpertAxis.EDP) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert lay.groups()["tp_cp"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    lay = ExpertLayout(dims, ep=4)
    assert lay.group_ranks(ExpertAxis.EP) == [[0, 1, 2, 3], [4, 5, 6, 7]] and lay.edp == 2
    lay = ExpertLayout(dims, ep=2, etp=2)
    assert sorted(lay.group_ranks(ExpertAxis.EP)) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert "tp_cp" not in ExpertLayout(ParallelDims.from_world(8, cp=2), ep=2).groups()  # tp 1: the CP group does
