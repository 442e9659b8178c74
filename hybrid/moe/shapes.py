"""Checks of the MoE fields of a ModelConfig (no torch: models/config.py asks these while building one)."""

from __future__ import annotations

MOE_FAMILIES = ("mixtral", "qwen2_moe")


def check_model_fields(cfg) -> None:
    """ValueError naming the first inconsistent MoE field of `cfg` (a models.config.ModelConfig)."""
    E, k = cfg.num_experts, cfg.moe_top_k
    if not isinstance(E, int) or E < 1:
        raise ValueError(f"--model: num_experts {E!r} must be a positive integer")
    if not isinstance(k, int) or not 1 <= k <= E:
        raise ValueError(f"--model: moe_top_k {k!r} must be an integer in [1, num_experts {E}]")
    if cfg.moe_ffn_hidden_size < 1:
        raise ValueError(f"--model: moe_ffn_hidden_size {cfg.moe_ffn_hidden_size} must be >= 1")
    bad = [i for i in cfg.moe_layers if not 0 <= i < cfg.num_layers]
    if bad:
        raise ValueError(f"--model: moe_layers {list(cfg.moe_layers)} name layer {bad[0]} outside the "
                         f"{cfg.num_layers} layers")
    if cfg.model_type not in MOE_FAMILIES:
        raise ValueError(f"--model: model_type {cfg.model_type!r} with experts; MoE models are "
                         f"{', '.join(MOE_FAMILIES)} (their checkpoint naming of the expert tensors)")
    if cfg.moe_shared_expert_gate and not cfg.moe_shared_expert_ffn_hidden_size:
        raise ValueError("--model: moe_shared_expert_gate needs a shared expert "
                         "(moe_shared_expert_ffn_hidden_size > 0)")
