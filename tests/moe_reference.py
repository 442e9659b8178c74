"""Shared helpers of the MoE tests: tiny transformers Mixtral / Qwen2-MoE models as the unsharded reference,
their gradients under the Hub's per-expert checkpoint keys, and transformers' own load-balancing loss."""

from __future__ import annotations

import os
import re
import tempfile

import torch

SMALL = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
             max_position_embeddings=64, attention_dropout=0.0, tie_word_embeddings=False)


def hf_config(kind: str, layers: int = 2, **kw):
    """mixtral: 4 experts, top-2. qwen2_moe: 8 fine-grained experts, top-4 without renormalisation, a gated shared
    expert, and (with >= 2 layers) layer 1 dense (mlp_only_layers), so MoE and dense layers mix."""
    base = dict(SMALL, num_hidden_layers=layers)
    if kind == "mixtral":
        from transformers import MixtralConfig
        return MixtralConfig(**base, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, **kw)
    from transformers import Qwen2MoeConfig
    return Qwen2MoeConfig(**base, intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=40,
                          num_experts=8, num_experts_per_tok=4, norm_topk_prob=False,
                          mlp_only_layers=[1] if layers >= 2 else [], **kw)


def hf_model(kind: str, layers: int = 2, seed: int = 0, **kw):
    from transformers import MixtralForCausalLM, Qwen2MoeForCausalLM
    cls = MixtralForCausalLM if kind == "mixtral" else Qwen2MoeForCausalLM
    torch.manual_seed(seed)
    return cls(hf_config(kind, layers, **kw)).eval()


def save(model) -> str:
    path = tempfile.mkdtemp(prefix="hf-moe-")
    model.save_pretrained(path)
    return path


_FUSED = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)")


def per_expert(model, kind: str, grads: bool = True) -> dict[str, torch.Tensor]:
    """transformers' parameters (or their gradients) under the checkpoint keys save_pretrained writes: the fused
    (E, 2f, h) gate_up_proj and (E, h, f) down_proj split per expert (gate first: transformers' own
    conversion), Mixtral's under block_sparse_moe.experts.<e>.w1 / w3 / w2."""
    out = {}
    for name, p in model.named_parameters():
        t = p.grad if grads else p.detach()
        m = _FUSED.fullmatch(name)
        if kind == "mixtral":
            name = name.replace(".mlp.", ".block_sparse_moe.")
        if m is None:
            out[name] = t
            continue
        layer, what = m.groups()
        for e in range(t.shape[0]):
            prefix = f"model.layers.{layer}." + ("block_sparse_moe" if kind == "mixtral" else "mlp") + f".experts.{e}."
            names = (("w1", "w3") if kind == "mixtral" else ("gate_proj", "up_proj")) if what == "gate_up_proj" \
                else (("w2",) if kind == "mixtral" else ("down_proj",))
            for part, n in zip(t[e].chunk(len(names)), names):
                out[prefix + n + ".weight"] = part
    return out


def saved_keys(path: str) -> set[str]:
    from safetensors import safe_open
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        return set(f.keys())


def hf_layer_aux(router_logits, num_experts: int, k: int) -> torch.Tensor:
    """transformers' load_balancing_loss_func on each layer's router logits alone, summed over the layers:
    E sum_e f_e P_e per layer with f_e = count_e / T (no 1/k)."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    return sum(load_balancing_loss_func((lg,), num_experts, k) for lg in router_logits)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()
