"""What the training step does for the MoE layers, outside the model's forward and backward.

    link_moe_layers(model, cfg)          once, at build: the stage's MoE layers share one pooled-loss slot
    set_aux_grad_scale(model, scale)     before each step: aux-loss gradients scaled as the LM loss
    after_step(model, mesh, cfg)         after each step: DeepSeek-V3's expert-bias update
    step_statistics(model, mesh)         at a log line: tokens per expert, the balancing and z losses
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from hybrid.moe.layer import MoELayer
from hybrid.moe.router import updated_expert_bias


def moe_layers(model: nn.Module) -> list[MoELayer]:
    """Every MoE block of `model` (a module or a ModuleList of pipeline chunks), in forward order."""
    return [m for m in model.modules() if isinstance(m, MoELayer)]


def link_moe_layers(model: nn.Module, cfg) -> None:
    """The first MoE layer of a stage opens each forward's pooled-loss slot (hf_aux_loss); all share it."""
    layers = moe_layers(model)
    slot: list = [None]
    for i, layer in enumerate(layers):
        layer.pool_ref, layer.pool_owner, layer.moe_layers = slot, i == 0, len(cfg.moe_layers)


def set_aux_grad_scale(model: nn.Module, scale: float) -> None:
    """d(total loss)/d(aux loss) of this step: 1 / micro-batches (the LM loss is averaged over them), times the
    fp16 loss scale -- what Megatron's MoEAuxLossAutoScaler.set_loss_scale sets."""
    for layer in moe_layers(model):
        layer.aux_grad_scale = scale


class ExpertBiasState:
    """The MoE routers' expert biases (DeepSeek-V3) as the checkpoint's Stateful (hybrid/stateful.py), under
    `moe/<layer name>.gate.expert_bias`: a whole tensor per layer, the same on every rank holding the layer (its
    update is summed over the stage's ranks), so the checkpoint keeps one copy and every layout reads it back."""

    def __init__(self, model: nn.Module):
        chunks = model if isinstance(model, (list, nn.ModuleList)) else [model]
        self.buffers = {f"{name}.gate.expert_bias": m.gate.expert_bias for chunk in chunks
                        for name, m in chunk.named_modules()
                        if isinstance(m, MoELayer) and m.gate.expert_bias is not None}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.buffers)

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for k, t in state.items():
            self.buffers[k].copy_(t)


def owners(model: nn.Module) -> dict:
    """The MoE state the checkpoint collects, by key prefix ({} without expert biases)."""
    state = ExpertBiasState(model)
    return {"moe/": state} if state.buffers else {}


@torch.no_grad()
def after_step(model: nn.Module, mesh) -> None:
    """DeepSeek-V3's expert-bias update from this step's loads, summed over the stage's ranks (TP, CP and DP: every
    token of the global batch), the same on every rank."""
    for layer in moe_layers(model):
        if layer.gate.expert_bias is None or layer.bias_counts is None:
            continue
        counts, layer.bias_counts = layer.bias_counts, None
        mesh.tp.all_reduce(counts, tag="moe")
        mesh.cp.all_reduce(counts, tag="moe")
        mesh.dp.all_reduce(counts, tag="moe")
        layer.gate.expert_bias.copy_(updated_expert_bias(layer.gate.expert_bias, counts,
                                                         layer.moe.config.bias_update_rate))


@dataclass(frozen=True)
class MoEStatistics:
    """The routing of the last step(s), over the whole global batch.

    Attributes:
        tokens_min / tokens_max: fewest / most slots any expert of any layer got.
        imbalance: max over layers of (most loaded expert) / (mean load): 1 is perfectly even, E / k the worst.
        aux_loss: the balancing loss, mean over micro-batches and replicas, summed over layers (as it
            enters the total loss).
        z_loss: the router z-loss, likewise.
        hot_expert: (layer id, expert id, rank holding it) of the most loaded expert.
    """

    tokens_min: float
    tokens_max: float
    imbalance: float
    aux_loss: float
    z_loss: float
    hot_expert: tuple[int, int, int]


def step_statistics(model: nn.Module, mesh, micro_batches: int, layout=None) -> MoEStatistics | None:
    """Collective over the world (every rank must call it): the statistics since the last call, then reset.
    `layout` (hybrid.moe.parallel.ExpertLayout) names the rank of the hot expert."""
    layers = moe_layers(model)
    E = _cfg(model).num_experts
    ids = [int(name.split(".")[-2]) for name, m in model.named_modules() if isinstance(m, MoELayer)]
    num_layers = _max_layers(model)
    table = torch.zeros(num_layers, E + 3, dtype=torch.float64, device=mesh.device)  # slots, aux, z, stage
    for lid, layer in zip(ids, layers):
        if layer.stat_counts is not None:
            table[lid, :E] = layer.stat_counts.double()
        table[lid, E] = layer.stat_aux + sum(p.value() for p in layer.pools)
        table[lid, E + 1] = layer.stat_z
        if layout is not None:  # summed over the stage's S = tp cp dp ranks below: S (pp rank + 1)
            table[lid, E + 2] = mesh.pp.rank + 1
        layer.reset_stats()
    for group in (mesh.tp, mesh.cp, mesh.dp, mesh.pp):  # each stage's layers over its ranks, stages' rows over PP
        group.all_reduce(table, tag="moe")
    counts = table[:, :E]
    used = counts.sum(1) > 0
    if not used.any():
        return None
    c = counts[used]
    hot = int(torch.argmax(counts.flatten()))
    layer_id, expert = divmod(hot, E)
    owner = _owner(layout, E, expert, float(table[layer_id, E + 2])) if layout is not None else 0
    replicas = mesh.dp.size * micro_batches
    return MoEStatistics(tokens_min=float(c.min()), tokens_max=float(c.max()),
                         imbalance=float((c.max(1).values / c.mean(1)).max()),
                         aux_loss=float(table[:, E].sum()) / replicas, z_loss=float(table[:, E + 1].sum()) / replicas,
                         hot_expert=(layer_id, expert, owner))


def _owner(layout, num_experts: int, expert: int, stage_sum: float) -> int:
    """The first rank (expert-DP replica 0) holding `expert` in the pipeline stage that holds its layer, from the
    table's stage column, S (pp rank + 1). Every stage holds experts 0..E-1 of its own layers, so without the stage
    the hot expert of a later stage was named on stage 0's ranks (at pp 2 stage 1's are ranks S..2S-1)."""
    stage = round(stage_sum / layout.stage_size) - 1
    return next(r for r, ex in layout.placement(num_experts) if expert in ex and layout.coords(r).pp == stage)


def _cfg(model: nn.Module):
    """The ModelConfig of a model or of its first pipeline chunk."""
    return (model[0] if isinstance(model, nn.ModuleList) else model).cfg


def _max_layers(model: nn.Module) -> int:
    return _cfg(model).num_layers


def log_fields(model: nn.Module, mesh, micro_batches: int, layout=None) -> tuple[str, dict]:
    """(' | moe tokens/expert 24-42 (imbalance 1.31, hot: layer 3 expert 5 on rank 2) | aux loss 0.0123', the same
    numbers for TensorBoard / JSON lines); ('', {}) for a dense model. Collective: every rank calls it."""
    if not _cfg(model).num_experts:
        return "", {}
    st = step_statistics(model, mesh, micro_batches, layout)
    if st is None:
        return "", {}
    layer, expert, rank = st.hot_expert
    line = (f" | moe tokens/expert {st.tokens_min:.0f}-{st.tokens_max:.0f} (imbalance {st.imbalance:.2f}, hot: "
            f"layer {layer} expert {expert} on rank {rank})")
    line += f" | aux loss {st.aux_loss:.4g}" if st.aux_loss else ""
    line += f" | z loss {st.z_loss:.4g}" if st.z_loss else ""
    return line, {"moe_tokens_per_expert_min": st.tokens_min, "moe_tokens_per_expert_max": st.tokens_max,
                  "moe_imbalance": st.imbalance, "moe_aux_loss": st.aux_loss, "moe_z_loss": st.z_loss,
                  "moe_hot_expert": [layer, expert, rank]}
