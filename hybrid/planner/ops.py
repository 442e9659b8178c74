"""The non-matmul work of a Transformer layer, op by op: the bytes each memory-bound kernel moves through HBM and
the number of kernels it launches, per token, on one TP rank. time.py prices them as

    seconds = bytes / Hardware.elementwise_bytes_per_s + kernels x Hardware.kernel_overhead_s

(a measured achievable bandwidth, and a per-kernel latency: the launch, the first and the last wave of a kernel
too small to fill the device). The GEMMs are timed on the GEMM curve and flash attention at its own rate
(hardware.py); this module is everything else.

How many bytes an op moves depends on how it is implemented, so the inventory has two kernel profiles
(`KernelProfile`, `--kernels`):

* FUSED -- Megatron-LM / Megatron-core with apex or Transformer Engine: one kernel per norm (LayerNorm or
  RMSNorm), a fused bias-GELU or SwiGLU, a fused bias-dropout-add for each residual, a fused scale-mask-softmax,
  a fused RoPE kernel for q and k together, flash attention writing straight into the layout the output
  projection reads. What the Megatron papers' runs (Narayanan 2021, Korthikanti 2022, MT-NLG, BLOOM) ran.
* EAGER -- plain PyTorch ops, as this repository's runtime (hybrid/tp/layers.py, models/) and torchtitan without
  torch.compile run them: RMSNorm in fp32 as seven kernels (cast, square, mean, add + rsqrt, multiply, cast back,
  weight), RoPE by rotate-half (neg, cat, two multiplies, add: five kernels a tensor), SiLU and the gate product
  as two kernels, each residual add its own kernel, the attention output copied to (b, s, h) before o_proj.
  LayerNorm and GELU are single kernels even in eager PyTorch (F.layer_norm, F.gelu).

Bytes per element are read + written, e = the activation element (2 bf16, 4 fp32); internals of the fp32 norm
are 4 bytes. A backward kernel reads what its forward read plus the incoming gradient and writes the outgoing
one: FUSED backward kernels move 1.5x their forward's bytes in the same number of kernels, EAGER autograd
backward nodes 2x the bytes in 2x the kernels (most eager ops have two inputs whose gradients are separate
kernels). The backward also sums the two residual branches' gradients (two adds a layer, 3e bytes each).

Widths per token on one TP rank: h_r = h (h / t under SP) for the norms, residuals and dropouts; q = a d / t,
k = g d / t for RoPE; f = ffn / t for the MLP's activation; S = a s / t for a materialised softmax (one row of s
scores per head). Flash attention is one kernel forward and two backward (preprocess + main); its FLOPs are timed
at Hardware.flash_efficiency in time.py.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hybrid.planner.model import ActivationProfile, Shard

FP32 = 4
MASK = 1  # torch's dropout keeps a bool mask (Korthikanti et al. count it as one byte)


class KernelProfile(enum.Enum):
    """How the non-matmul ops are implemented (`--kernels`); see the module docstring."""

    FUSED = "fused"  # Megatron-LM / Megatron-core (apex, Transformer Engine)
    EAGER = "eager"  # plain PyTorch ops: this runtime, torchtitan without torch.compile


class Stack(enum.Enum):
    """The training software stack (`--stack`): what sets the sustained tensor-core clock (Hardware.eager_clock),
    apart from which ops are fused (KernelProfile). PYTORCH: PyTorch-native trainers, eager or torch.compile'd
    (this runtime, torchtitan, Composer / llm-foundry, OLMo-core, IBM fms-fsdp); MEGATRON: Megatron-LM /
    Megatron-core / NeMo with Transformer Engine, and the fused 2021-24 production stacks (Llama 3, MT-NLG)."""

    PYTORCH = "pytorch"
    MEGATRON = "megatron"


class Fp8Scaling(enum.Enum):
    """How an FP8 linear finds the scale of the tensor it casts (`--fp8-scaling`, Workload.fp8_scaling).

    DELAYED: Transformer Engine's DelayedScaling recipe (its default; Composer's `amp_fp8` / llm-foundry, TE 1.x
    Megatron / NeMo runs): the scale comes from an amax history and the cast kernel records the new amax as it
    goes, one pass over the tensor. CURRENT: the tensor's own amax, a reduction pass before the cast (TE's
    Float8CurrentScaling; torchao float8's dynamic tensorwise scaling, torchtitan's Float8)."""

    DELAYED = "delayed"
    CURRENT = "current"


@dataclass(frozen=True)
class Op:
    """One memory-bound op of a layer (or of the head), per token on one TP rank.

    Attributes:
        name: what it is ("rmsnorm", "rope", "swiglu", "residual", "softmax", ...).
        fwd_bytes, bwd_bytes: HBM bytes moved (read + written) by its forward / backward kernels.
        fwd_kernels, bwd_kernels: kernels launched.
        core: part of the attention core (what Megatron's selective recomputation reruns).
    """

    name: str
    fwd_bytes: float
    bwd_bytes: float
    fwd_kernels: int
    bwd_kernels: int
    core: bool = False


def _op(name: str, fwd_bytes: float, fwd_kernels: int, kernels: KernelProfile, core: bool = False) -> Op:
    """An op with the backward rule of its profile (FUSED 1.5x bytes, same kernels; EAGER 2x, 2x)."""
    if kernels is KernelProfile.FUSED:
        return Op(name, fwd_bytes, 1.5 * fwd_bytes, fwd_kernels, fwd_kernels, core)
    return Op(name, fwd_bytes, 2.0 * fwd_bytes, fwd_kernels, 2 * fwd_kernels, core)


def _norm(shard: Shard, width: float, e: int, kernels: KernelProfile) -> Op:
    """A LayerNorm (GPT-2; one kernel even in eager PyTorch) or RMSNorm over `width` elements a token.
    Eager RMSNorm in fp32 (hybrid/tp/layers.py, torchtitan): cast in, square, mean, add + rsqrt, multiply, cast out,
    weight -- 2e + 8 + 4 + 8 + 2e + 2e bytes an element with bf16 input (the casts vanish in fp32)."""
    if kernels is KernelProfile.FUSED or shard.is_gpt2:
        return _op("layernorm" if shard.is_gpt2 else "rmsnorm", 2 * e * width, 1, kernels)
    casts = 0 if e == FP32 else 2 * (e + FP32)
    return _op("rmsnorm", (casts + 8 + 4 + 8 + 2 * e) * width, 6 + (0 if e == FP32 else 2), kernels)


def layer_ops(shard: Shard, s: int, sp: bool, e: int, kernels: KernelProfile,
              te_full_layer: bool = False) -> tuple[Op, ...]:
    """The memory-bound ops of one layer's forward (and their backward), per token on this TP rank
    (`te_full_layer`: Workload.fc1_bias_grad_in_kernel)."""
    cfg = shard.cfg
    h_r = cfg.hidden_size / (shard.t if sp else 1)
    q, k, f = shard.q_width, shard.kv_width, shard.ffn_width
    dropout = cfg.dropout > 0
    fused = kernels is KernelProfile.FUSED
    ops = [_norm(shard, h_r, e, kernels)]
    if not shard.is_gpt2:  # RoPE on q and k: fused one kernel; eager rotate-half five a tensor
        ops.append(_op("rope", 2 * e * (q + k), 1, kernels) if fused else _op("rope", 10 * e * (q + k), 10, kernels))
    ops += _core_ops(shard, s, e, kernels)
    if not fused:  # the attention output back to (b, s, a d / t) for o_proj
        ops.append(_op("attn-out copy", 2 * e * q, 1, kernels))
    ops += _residual_ops(h_r, e, dropout, kernels)
    ops.append(_norm(shard, h_r, e, kernels))
    if shard.is_gpt2:  # (bias-)GELU: one kernel either way
        ops.append(_op("gelu", 2 * e * f, 1, kernels))
    else:  # SwiGLU: silu(gate) * up -- fused reads 2f writes f; eager silu then the product
        ops.append(_op("swiglu", 3 * e * f, 1, kernels) if fused else _op("swiglu", 5 * e * f, 2, kernels))
    ops += _residual_ops(h_r, e, dropout, kernels)
    if not te_full_layer:
        ops += _bias_grad_ops(shard, e, kernels)
    return tuple(ops)


def _bias_grad_ops(shard: Shard, e: int, kernels: KernelProfile) -> list[Op]:
    """FUSED (Megatron-LM / Megatron-core): fc1's bias gradient, a reduction autograd runs outside every fused
    kernel (docs/planner/round21-gpt-arch.md). Megatron's MLP builds fc1 with `skip_bias_add=True` and adds the
    bias in its bias-GELU (fusions/fused_bias_gelu.py), whose GeLUFunction.backward returns `tmp, tmp`: the
    [s, b, f / t] input gradient for the bias too, which autograd's engine sums down to the bias's [f / t]
    (at::sum_to): one more kernel reading e bytes of each of the f / t elements a token. Not priced: the proj /
    fc2 biases, added inside the torch.compile'd (2024; nvFuser's TorchScript in 2022) bias-dropout-add, whose
    backward can fuse their sums with the dropout's gradient; the QKV bias, which Transformer Engine reduces in
    its weight-gradient GEMM's epilogue or FP8 cast (Megatron-LM's own linear sums it apart); EAGER autograd's;
    and none under Workload.fc1_bias_grad_in_kernel: TE's whole layer (te_full_layer), whose LayerNormMLP
    reduces fc1's bias gradient inside TE (its FP8 backward's cast-transpose-bgrad-dgelu kernel, its BF16
    bgrad_dgelu_fused), or flash-attn's FusedDenseGeluDense on the PyTorch stack (cuBLASLt bgrad epilogues)."""
    cfg = shard.cfg
    if kernels is not KernelProfile.FUSED or not cfg.mlp_bias:
        return []
    return [Op("fc1 bias grad", 0.0, e * (shard.mlp_matrices - 1) * shard.ffn_width, 0, 1)]


def _residual_ops(h_r: float, e: int, dropout: bool, kernels: KernelProfile) -> list[Op]:
    """A residual branch joining the stream: fused bias-dropout-add (one kernel, its mask) or eager dropout + add;
    the backward's sum of the two branches' gradients (an add, 3e) is counted here too."""
    if dropout and kernels is KernelProfile.FUSED:
        main = _op("bias-dropout-add", (3 * e + MASK) * h_r, 1, kernels)
    elif dropout:
        return [_op("dropout", (2 * e + MASK) * h_r, 1, kernels), _op("residual add", 3 * e * h_r, 1, kernels),
                Op("residual grad sum", 0.0, 3 * e * h_r, 0, 1)]
    else:
        main = _op("residual add", 3 * e * h_r, 1, kernels)
    return [main, Op("residual grad sum", 0.0, 3 * e * h_r, 0, 1)]


def _core_ops(shard: Shard, s: int, e: int, kernels: KernelProfile) -> list[Op]:
    """The attention core's memory-bound part: a materialised scale-mask-softmax and its dropout over S = a s / t
    scores a token (KORTHIKANTI profile), or flash attention's launches (its bytes stay on chip)."""
    if shard.profile is not ActivationProfile.KORTHIKANTI:
        return [Op("flash attention", 0.0, 0.0, 1, 2, core=True)]
    scores = shard.cfg.num_heads // shard.t * s
    fused = kernels is KernelProfile.FUSED
    ops = [_op("scale-mask-softmax", 2 * e * scores, 1, kernels, core=True) if fused
           else _op("scale-mask-softmax", 6 * e * scores, 3, kernels, core=True)]
    if shard.cfg.attention_dropout > 0 or shard.cfg.dropout > 0:
        ops.append(_op("attention dropout", (2 * e + MASK) * scores, 1, kernels, core=True))
    return ops


def head_ops(shard: Shard, sp: bool, e: int, kernels: KernelProfile, gathered: bool = False,
             megatron_unfused: bool = False) -> tuple[Op, ...]:
    """The last stage's final norm and the loss over V_p / t logits a token (V_p when `gathered`: the head
    gathers the logits to every TP rank, Workload.gathered_logits), cross-entropy in fp32:
    FUSED (Megatron's vocab-parallel loss): cast, max, subtract, exp, sum forward (priced e + 24 bytes a logit,
    five kernels -- the five as listed, each reading and writing its own fp32 tensor, move e + 28: round 25's review
    found the 4 bytes short; left as is, since every NeMo / Megatron row is planned with this price), softmax minus
    one-hot and the cast back in backward (12 + e, two kernels). `megatron_unfused`
    (Workload.megatron_unfused_loss; FUSED only): Megatron-core's `_VocabParallelCrossEntropy` as its code runs it,
    the cast (e + 4), max (4), in-place subtract (8), in-place exp (8), sum (4) and the in-place `div_` that makes
    the saved softmax (8): e + 36 bytes in six kernels. EAGER (F.cross_entropy on .float() logits; hybrid's
    vocab-parallel loss alike): cast and log-softmax forward (e + 16, three kernels), the nll and log-softmax
    gradients and the cast back (20 + e, four kernels)."""
    h_r = shard.cfg.hidden_size / (shard.t if sp else 1)
    logits = shard.vocab if gathered else shard.vocab / shard.t
    if kernels is KernelProfile.FUSED and megatron_unfused:
        loss = Op("cross-entropy", (e + 36) * logits, (12 + e) * logits, 6, 2)
    elif kernels is KernelProfile.FUSED:
        loss = Op("cross-entropy", (e + 24) * logits, (12 + e) * logits, 5, 2)
    else:
        loss = Op("cross-entropy", (e + 16) * logits, (20 + e) * logits, 3, 4)
    return _norm(shard, h_r, e, kernels), loss


def embedding_ops(shard: Shard, sp: bool, e: int, kernels: KernelProfile) -> tuple[Op, ...]:
    """The first stage's lookup (one row of h written a token; its backward an index-add into the table's
    gradient), plus GPT-2's position add and the embedding dropout."""
    h = shard.cfg.hidden_size
    ops = [Op("embedding", e * h, 3 * e * h, 1, 1)]
    if shard.is_gpt2:
        ops.append(_op("position add", 3 * e * h, 1, kernels))
    if shard.cfg.dropout > 0:
        ops.append(_op("embedding dropout", (2 * e + MASK) * h / (shard.t if sp else 1), 1, kernels))
    return tuple(ops)


@dataclass(frozen=True)
class Traffic:
    """Totals of some ops per token: bytes and kernels, forward and backward."""

    fwd_bytes: float = 0.0
    bwd_bytes: float = 0.0
    fwd_kernels: int = 0
    bwd_kernels: int = 0

    @classmethod
    def of(cls, ops: tuple[Op, ...] | list[Op]) -> "Traffic":
        return cls(sum(o.fwd_bytes for o in ops), sum(o.bwd_bytes for o in ops),
                   sum(o.fwd_kernels for o in ops), sum(o.bwd_kernels for o in ops))


def fp8_casts(shard: Shard, tokens: int, e: int, scaling: Fp8Scaling) -> Traffic:
    """--fp8: the casts an FP8 linear adds, per token of a micro-batch of `tokens` tokens, one layer, one TP rank.

    What Transformer Engine's Linear runs (transformer_engine/pytorch/module/linear.py: `fp8_cast_transpose_fused`
    on the input and, in every micro-batch that does not pass `is_first_microbatch`, on the weight; the backward's
    `grad_output_preprocess` runs `fp8_cast_transpose_bgrad_fused` on the output gradient): each cast reads the
    bf16 tensor once and writes it twice in FP8, as it is and transposed -- Hopper's FP8 GEMM takes only the
    "TN" layout, so the weight-gradient product needs the transposed input and output gradient, and the input-
    gradient product the transposed weight: e + 2 bytes an element, one kernel. CURRENT scaling adds the amax
    reduction before the cast (one more read of e, one more kernel); DELAYED records it inside the cast.

    The inputs cast are the layer's distinct linear inputs -- q, k and v share one (a fused QKV linear: MPT,
    Megatron; torch.compile merges the three casts of torchtitan's separate projections), so do SwiGLU's gate and
    up -- plus the attention output (o's input) and the MLP's hidden (the down projection's); every linear's output
    gradient is cast; the weights once per micro-batch (their bytes over the micro-batch's tokens). The amax
    history and scale updates (a few small kernels a step) are not priced."""
    cast = (2 * e + 2) if scaling is Fp8Scaling.CURRENT else (e + 2)
    kernels = 2 if scaling is Fp8Scaling.CURRENT else 1
    gemms = shard.linear_gemms_in_order(1, 1)
    down = gemms[-1]
    inputs = shard.cfg.hidden_size * 2 + shard.q_width + down.k  # qkv, o, the MLP's up (and gate), down
    outputs = sum(g.n for g in gemms)
    weights = sum(g.n * g.k for g in gemms)
    linears = 4  # fused QKV, o, up (SwiGLU: gate and up fused), down: a weight cast and a gradient cast each
    casts_fwd, casts_bwd = 4 + linears, linears  # the 4 distinct inputs and the weights; the output gradients
    return Traffic(cast * (inputs + weights / tokens), cast * outputs, kernels * casts_fwd, kernels * casts_bwd)
