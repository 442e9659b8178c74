"""Model FLOPs of a training step (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters", Appendix; PaLM's 6N + 12 L H Q T), generalised to GQA, SwiGLU and any FFN width.

A matmul of an (m, k) activation by a (k, n) weight costs 2 m k n FLOPs forward and twice that backward (input
and weight gradients), so each weight costs 6 FLOPs per token for forward + backward. Per token of a sequence of s:

    layers     6 L (P_attn + P_mlp)        P_attn = h (q + 2 kv) + q h, P_mlp = 2 h f (GELU) or 3 h f (SwiGLU)
    attention  12 L s q                    Q K^T and A V: 2 s q each forward, x 3 for forward + backward
    LM head    6 h V

(q = heads x head_dim, kv = kv_heads x head_dim). For GPT-2 (q = kv = h, f = 4 h) this is
72 L h^2 + 12 L s h + 6 h V = 72 L h^2 (1 + s / (6 h) + V / (12 L h)), Narayanan's eq. (3) without recomputation.
Norms, biases, softmax and embedding lookups are left out, as there. Hardware FLOPs add what recomputation reruns:
full recomputation one more forward of the layers (+ 2 L (P_attn + P_mlp) + 4 L s q: Narayanan's 96 L h^2
(1 + s / (6 h) + V / (16 L h)) for GPT-2), selective the attention core (+ 4 L s q).
"""

from __future__ import annotations

from models.config import ARCH_GPT2, ModelConfig


def layer_matmul_params(cfg: ModelConfig) -> int:
    """Weights of one block's matmuls (biases excluded)."""
    h, f = cfg.hidden_size, cfg.ffn_hidden_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    mlp = (2 if cfg.arch == ARCH_GPT2 else 3) * h * f
    return h * (q + 2 * kv) + q * h + mlp


def model_flops_per_token(cfg: ModelConfig, seq_length: int) -> int:
    """Forward + backward model FLOPs per trained token (no recomputation counted)."""
    q = cfg.num_heads * cfg.head_dim
    layers = 6 * cfg.num_layers * layer_matmul_params(cfg)
    attention = 12 * cfg.num_layers * seq_length * q
    return layers + attention + 6 * cfg.hidden_size * cfg.vocab_size


def selective_op_rerun_params(cfg: ModelConfig) -> int:
    """Weights of the matmuls `--recompute-granularity selective-op` reruns in one block: models/common.py's
    SelectiveOpPolicy keeps the outputs of the 1st, 3rd, ... matmul in forward order (q, v, c_fc / gate, down) and
    the attention kernel's; torch's checkpoint reruns the forward only as far as the last tensor backward needs
    (its early stop), so k (h x kv) and o (q x h) run again, and SwiGLU's up (h x f, read by gate * up's
    backward) -- GELU's c_proj, the block's last matmul, does not (its output is saved by nothing) unless hidden
    dropout follows it: the dropout's mask is then the last tensor backward needs, so the rerun runs c_proj again
    (the planner's rule: planner/model.py Shard.selective_op_rerun_gemms). Counted by torch's FlopCounterMode in
    tests/test_inputs19_train_axes.py."""
    h, f = cfg.hidden_size, cfg.ffn_hidden_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    if cfg.arch != ARCH_GPT2:
        return h * kv + q * h + h * f  # k, o and SwiGLU's up
    return h * kv + q * h + (f * h if cfg.dropout > 0 else 0)  # k, o and, with hidden dropout, c_proj


def hardware_flops_per_token(cfg: ModelConfig, seq_length: int, recompute: str = "none") -> int:
    """Model FLOPs plus the forward work that activation recomputation repeats (2 FLOPs a weight a token for each
    rerun matmul; 4 s q a layer for the attention core)."""
    q = cfg.num_heads * cfg.head_dim
    extra = {"none": 0, "selective": 4 * cfg.num_layers * seq_length * q,
             "selective-op": 2 * cfg.num_layers * selective_op_rerun_params(cfg),
             "full": 2 * cfg.num_layers * layer_matmul_params(cfg) + 4 * cfg.num_layers * seq_length * q}[recompute]
    return model_flops_per_token(cfg, seq_length) + extra


# dense bf16 peak TFLOP/s of one device, by a name fragment of torch.cuda.get_device_name (vendor data sheets:
# half the "with sparsity" figure), first match wins: the H100 PCIe (1513 sparse) and NVL (1671) before the SXM
# part ("NVIDIA H100 80GB HBM3", 1979); V100 has no bf16, its fp16 tensor-core peak
PEAK_TFLOPS = (("h200", 989.0), ("h100 pcie", 756.0), ("h100 nvl", 835.0), ("h100", 989.0), ("a100", 312.0),
               ("l40s", 362.0), ("a10g", 125.0), ("v100", 125.0))


def device_peak_tflops(name: str) -> float | None:
    """The bf16 peak of a device named `name` (None when unknown: MFU is then not reported)."""
    low = name.lower()
    return next((p for key, p in PEAK_TFLOPS if key in low), None)
