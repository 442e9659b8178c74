"""Mixtral and Qwen2-MoE, one process, against transformers: logits, loss, the load-balancing loss and every
gradient (each expert's) within 1e-5 relative in fp32; the balancing variants against transformers' and
Megatron-core's own functions; grouped GEMM = the loop.

transformers computes its balancing loss with output_router_logits=True, pooled over all MoE layers
(`--moe-router-load-balancing-type hf_aux_loss`, coefficient router_aux_loss_coef); Megatron's per-layer
aux_loss / seq_aux_loss are checked against transformers' function applied per layer and per sequence."""

from __future__ import annotations

import pytest
import torch

from hybrid.comm import Group
from hybrid.moe.config import ExpertsImpl, LoadBalancing, MoEConfig
from hybrid.moe.layer import ExpertContext
from hybrid.moe.runtime import moe_layers, set_aux_grad_scale, step_statistics
from hybrid.mesh import Mesh
from hybrid.tp import TPContext
from models import build_model, from_hf, load_config, shift_labels
from models.hf_io import export_hf_state_dict, load_hf_checkpoint
from moe_reference import hf_layer_aux, hf_model, per_expert, rel, save, saved_keys

RTOL = 1e-5
COEFF = 0.1
BATCH, SEQ = 2, 16


def ours(kind, hf, path, cfg: MoEConfig):
    model = build_model(from_hf(hf.config), TPContext(Group.solo("tp")), seed=None, moe=ExpertContext(cfg))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))  # the load must write every expert
    load_hf_checkpoint(model, path, 0)
    return model


def run_pair(kind, cfg: MoEConfig, layers=2):
    hf = hf_model(kind, layers, router_aux_loss_coef=COEFF)
    path = save(hf)
    ids = torch.randint(0, 64, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    model = ours(kind, hf, path, cfg)
    logits = model(ids)
    for layer in moe_layers(model):
        layer.reset_stats()  # the statistics then cover the one forward-backward below
    loss = model(ids, shift_labels(ids))
    loss.backward()
    stats = step_statistics(model, Mesh.single(), micro_batches=1)
    grads = export_hf_state_dict(model, Group.solo("tp"), grads=True)
    return hf, path, ids, logits, loss, stats, grads


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_equals_transformers_with_its_load_balancing_loss(kind):
    """hf_aux_loss with coefficient router_aux_loss_coef is transformers' loss with output_router_logits=True:
    logits, LM loss, balancing loss, and every gradient -- every expert's, under the checkpoint keys."""
    hf, path, ids, logits, loss, stats, grads = run_pair(
        kind, MoEConfig(load_balancing=LoadBalancing.HF_AUX_LOSS, aux_loss_coeff=COEFF))
    ref = hf(ids, labels=ids, output_router_logits=True)
    ref.loss.backward()
    assert rel(logits, ref.logits) < RTOL
    assert rel(loss.detach(), (ref.loss - COEFF * ref.aux_loss).detach()) < RTOL
    assert rel(torch.tensor(stats.aux_loss), (COEFF * ref.aux_loss).detach()) < RTOL
    want = per_expert(hf, kind)
    assert set(grads) == set(want) == saved_keys(path)  # no expert (nor anything else) missing
    worst = max(rel(grads[k], want[k]) for k in want)
    assert worst < RTOL, worst


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_megatron_aux_loss_per_layer_equals_transformers_function_per_layer(kind):
    """aux_loss: coeff E / (k T^2) sum_e n_e P_e per layer (Megatron) = coeff / k x transformers'
    load_balancing_loss_func of that layer's logits alone; gradients = those of that reference."""
    hf, path, ids, logits, loss, stats, grads = run_pair(kind, MoEConfig(aux_loss_coeff=COEFF))
    ref = hf(ids, labels=ids, output_router_logits=True)
    k = hf.config.num_experts_per_tok
    E = getattr(hf.config, "num_local_experts", None) or hf.config.num_experts
    aux = COEFF / k * hf_layer_aux(ref.router_logits, E, k)
    (ref.loss - COEFF * ref.aux_loss + aux).backward()  # transformers' LM loss + the per-layer reference
    assert rel(torch.tensor(stats.aux_loss), aux.detach()) < RTOL
    want = per_expert(hf, kind)
    assert max(rel(grads[k_], want[k_]) for k_ in want) < RTOL


def test_seq_aux_loss_is_the_per_sequence_loss_averaged():
    """seq_aux_loss = the mean over the batch's sequences of the per-layer loss of each sequence alone."""
    kind = "mixtral"
    hf, path, ids, logits, loss, stats, grads = run_pair(
        kind, MoEConfig(load_balancing=LoadBalancing.SEQ_AUX_LOSS, aux_loss_coeff=COEFF))
    ref = hf(ids, labels=ids, output_router_logits=True)
    E, k = 4, 2
    per_seq = [COEFF / k * hf_layer_aux([lg.view(BATCH, SEQ, E)[b] for lg in ref.router_logits], E, k)
               for b in range(BATCH)]
    aux = sum(per_seq) / BATCH
    (ref.loss - COEFF * ref.aux_loss + aux).backward()
    assert rel(torch.tensor(stats.aux_loss), aux.detach()) < RTOL
    want = per_expert(hf, kind)
    assert max(rel(grads[k_], want[k_]) for k_ in want) < RTOL


def test_z_loss_and_no_balancing_loss():
    """z-loss: coeff mean_t logsumexp(logits_t)^2 per layer, summed over layers (from transformers' router
    logits); load balancing `none` adds nothing."""
    kind, zc = "qwen2_moe", 1e-2
    hf, path, ids, logits, loss, stats, grads = run_pair(
        kind, MoEConfig(load_balancing=LoadBalancing.NONE, aux_loss_coeff=COEFF, z_loss_coeff=zc))
    ref = hf(ids, labels=ids, output_router_logits=True)
    z = sum(torch.logsumexp(lg, -1).square().mean() for lg in ref.router_logits) * zc
    (ref.loss - COEFF * ref.aux_loss + z).backward()
    assert stats.aux_loss == 0.0
    assert rel(torch.tensor(stats.z_loss), z.detach()) < RTOL
    want = per_expert(hf, kind)
    assert max(rel(grads[k_], want[k_]) for k_ in want) < RTOL


def test_aux_gradient_scale_follows_micro_batches():
    """set_aux_grad_scale(1/m): the balancing loss enters the gradient as the LM loss does (divided by m)."""
    hf = hf_model("mixtral")
    path = save(hf)
    ids = torch.randint(0, 64, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    grads = []
    for scale in (1.0, 0.25):
        model = ours("mixtral", hf, path, MoEConfig(aux_loss_coeff=1.0))
        set_aux_grad_scale(model, scale)
        (model(ids, shift_labels(ids)) * scale).backward()
        grads.append(model.layers["0"].mlp.gate.weight.grad.clone())
    assert rel(grads[1], grads[0] * 0.25) < RTOL


def test_grouped_gemm_equals_the_loop():
    """torch's grouped_mm over the stacked expert weights gives the loop's outputs and gradients."""
    hf = hf_model("qwen2_moe")
    path = save(hf)
    ids = torch.randint(0, 64, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    out = {}
    for impl in (ExpertsImpl.LOOP, ExpertsImpl.GROUPED):
        model = ours("qwen2_moe", hf, path, MoEConfig(experts_impl=impl))
        model(ids, shift_labels(ids)).backward()
        out[impl] = export_hf_state_dict(model, Group.solo("tp"), grads=True)
    assert max(rel(out[ExpertsImpl.GROUPED][k], out[ExpertsImpl.LOOP][k]) for k in out[ExpertsImpl.LOOP]) < RTOL


@pytest.mark.parametrize("preset,hf_class", [("tiny-mixtral", "MixtralConfig"), ("tiny-qwen2-moe", "Qwen2MoeConfig")])
def test_presets_count_parameters_as_transformers(preset, hf_class):
    import transformers
    cfg = load_config(preset)
    assert cfg.num_experts == 8 and cfg.moe_layers == (0, 1, 2, 3)
    hf_cls = {"MixtralConfig": transformers.MixtralForCausalLM, "Qwen2MoeConfig": transformers.Qwen2MoeForCausalLM}
    with torch.device("meta"):
        hf = hf_cls[hf_class](cfg.hf)
    assert cfg.num_parameters == sum(p.numel() for p in hf.parameters())


def test_full_recompute_replays_the_routing(monkeypatch):
    """Full recomputation reruns the block in backward; a last-bit difference in its router logits could flip a
    near tie and change every size after it. The original choice is replayed: even with a top-k that would choose
    other experts while recomputing, the gradients equal those without recomputation."""
    from hybrid.moe.layer import in_recompute
    from models import Recompute, set_recompute
    topk = torch.topk
    monkeypatch.setattr(torch, "topk", lambda t, k, dim=-1, **kw: topk(-t if in_recompute() else t, k, dim=dim, **kw))
    hf = hf_model("mixtral")
    path = save(hf)
    ids = torch.randint(0, 64, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    out = {}
    for granularity in (Recompute.NONE, Recompute.FULL):
        model = set_recompute(ours("mixtral", hf, path, MoEConfig(aux_loss_coeff=COEFF)), granularity)
        model(ids, shift_labels(ids)).backward()
        out[granularity] = export_hf_state_dict(model, Group.solo("tp"), grads=True)
        assert all(not layer._replay for layer in moe_layers(model))  # every stored choice was used
    none, full = out[Recompute.NONE], out[Recompute.FULL]
    assert max(rel(full[k], none[k]) for k in none) < RTOL
