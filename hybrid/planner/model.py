"""Per-TP-rank arithmetic of one Transformer: parameters, FLOPs and activation bytes of a layer, of the
embedding and of the LM head. Counts follow the runtime's sharding (hybrid/tp, models/): column-parallel
weights and biases split over t, row-parallel weights split and their biases replicated, norms replicated,
key/value heads split when t divides them and one whole head per rank otherwise, the vocabulary padded to a
multiple of t and split by rows.

Notation: b micro-batch, s sequence, h hidden, a query heads, g key/value heads, d head width, f MLP width,
t tensor-parallel size, V_p padded vocabulary.

Three activation profiles (`ActivationProfile`), i.e. three answers to "which tensors does autograd keep":

* KORTHIKANTI (the default, for published GPU runs): Megatron in fp16 / bf16 with dropout and a materialised
  softmax, Korthikanti et al. 2022, Table 2 -- activations 2 bytes, dropout masks 1 byte, 5as^2b per layer for
  the attention core.
* BF16_FLASH: the same run with flash attention (Dao et al. 2022), as Megatron-core, torchtitan and Meta's
  Llama 3 stack train today: the attention core keeps one fp32 logsumexp per query row and head, 4asb/t,
  instead of the s x s softmax (its dropout, if any, is regenerated from the RNG state, so no mask either).
  Everything else is Korthikanti's count.
* FP32_FLASH: this repository's runtime as tests/test_planner_runtime.py measures it -- fp32, no dropout,
  CPU flash attention (a per-row logsumexp instead of the s x s matrix), the tensors torch saves for our
  layers (hybrid/measured_memory.py derives them one by one). Exact, byte for byte, for the layouts that test runs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hybrid.planner.hardware import Gemm
from hybrid.precision import Precision  # noqa: F401  (re-exported: the planner's --precision)
from models.config import ARCH_GPT2, ModelConfig

ACT_BYTES = 2  # bf16 / fp16 activations
MASK_BYTES = 1  # dropout masks (Korthikanti et al. 2022 count them as one byte)
FP32 = 4
INDEX_BYTES = 8  # int64 token ids and positions
BOOL_BYTES = 1


class ActivationProfile(enum.Enum):
    """Which tensors a layer keeps for backward (`--activation-profile`); see the module docstring."""

    KORTHIKANTI = "korthikanti"
    BF16_FLASH = "bf16-flash"
    FP32_FLASH = "fp32-flash"


@dataclass(frozen=True)
class Shard:
    """A model seen from one TP rank at size t.

    Attributes:
        cfg: the model.
        t: tensor-parallel size.
        vocab: padded vocabulary V_p (a multiple of t).
        profile: which tensors a layer keeps (Workload.activations).
        fp8: FP8 linears (Workload.fp8).
        fused_cross_entropy: the loss is a fused cross-entropy kernel over the bf16 logits
            (Workload.fused_cross_entropy): no fp32 copy of them is kept.
        gathered_logits: t > 1 and the head gathers the whole logits to every TP rank, whose loss runs over all
            V_p of them as at t = 1 (Workload.gathered_logits): the loss's memory is the t = 1 loss's.
        bf16_cross_entropy: torch's cross-entropy on the bf16 logits, no upcast (Workload.bf16_cross_entropy).
    """

    cfg: ModelConfig
    t: int
    vocab: int
    profile: ActivationProfile = ActivationProfile.KORTHIKANTI
    fp8: bool = False
    fused_cross_entropy: bool = False
    gathered_logits: bool = False
    bf16_cross_entropy: bool = False

    def __post_init__(self) -> None:
        if self.profile is ActivationProfile.FP32_FLASH and self.cfg.dropout > 0:
            raise ValueError(f"activation profile fp32-flash models our runtime without dropout (the model has "
                             f"dropout {self.cfg.dropout}); use the korthikanti profile or a model with dropout 0")

    @property
    def is_gpt2(self) -> bool:
        return self.cfg.arch == ARCH_GPT2

    @property
    def q_width(self) -> int:
        """a d / t: this rank's query (and attention output) width."""
        return self.cfg.num_heads * self.cfg.head_dim // self.t

    @property
    def kv_width(self) -> int:
        """This rank's key (= value) width: g d / t, or one head d when t exceeds g (replicated)."""
        cfg = self.cfg
        if cfg.num_kv_heads % self.t == 0:
            return cfg.num_kv_heads * cfg.head_dim // self.t
        return cfg.head_dim

    @property
    def ffn_width(self) -> int:
        return self.cfg.ffn_hidden_size // self.t

    @property
    def mlp_matrices(self) -> int:
        """2 for GPT-2's GELU MLP (c_fc, c_proj), 3 for SwiGLU (gate, up, down)."""
        return 2 if self.is_gpt2 else 3

    # --- parameters ------------------------------------------------------------------------------
    def layer_matmul_params(self) -> int:
        """Weights of the layer's linears on this rank (what the matmul FLOPs scale with)."""
        h = self.cfg.hidden_size
        attention = h * (self.q_width + 2 * self.kv_width) + self.q_width * h
        return attention + self.mlp_matrices * h * self.ffn_width

    def layer_params(self) -> int:
        """All parameters of one layer on this rank: weights, biases, norms."""
        cfg, h = self.cfg, self.cfg.hidden_size
        biases = cfg.qkv_bias * (self.q_width + 2 * self.kv_width) + cfg.out_bias * h
        biases += cfg.mlp_bias * ((self.mlp_matrices - 1) * self.ffn_width + h)
        norms = 2 * (2 * h if self.is_gpt2 else h)
        return self.layer_matmul_params() + biases + norms

    def layer_replicated_params(self) -> int:
        """Parameters of one layer every TP rank holds whole: norms and row-parallel biases (under SP their
        gradients are partial sums, all-reduced over TP once per step)."""
        cfg, h = self.cfg, self.cfg.hidden_size
        return 2 * (2 * h if self.is_gpt2 else h) + (cfg.out_bias + cfg.mlp_bias) * h

    def embedding_params(self) -> int:
        """First stage: the vocabulary rows of this rank, plus GPT-2's learned positions (replicated)."""
        h = self.cfg.hidden_size
        positions = self.cfg.max_position_embeddings * h if self.is_gpt2 else 0
        return self.vocab // self.t * h + positions

    def head_params(self, shares_embedding: bool) -> int:
        """Last stage: the final norm and the LM head. A tied head is the embedding itself when the first
        and the last stage are the same rank (`shares_embedding`); otherwise the last stage holds a copy."""
        h = self.cfg.hidden_size
        norm = 2 * h if self.is_gpt2 else h
        head = 0 if (self.cfg.tie_embeddings and shares_embedding) else self.vocab // self.t * h
        return norm + head

    # --- FLOPs (multiply-add = 2; Narayanan et al. 2021 count the full s x s scores) --------------
    def layer_forward_flops(self, b: int, s: int) -> float:
        """One layer's forward on one micro-batch, this rank: 2 b s (weights) + 4 b s^2 (a d / t).
        For GPT shapes summed over t ranks: 24 b s h^2 + 4 b s^2 h (Narayanan et al. 2021, Sec. 3.5)."""
        return 2.0 * b * s * self.layer_matmul_params() + self.attention_core_flops(b, s)

    def attention_core_flops(self, b: int, s: int) -> float:
        """QK^T and softmax(.)V: 2 x 2 b s^2 (a d / t); what selective recomputation reruns."""
        return 4.0 * b * s * s * self.q_width

    def head_forward_flops(self, b: int, s: int) -> float:
        """Logits: one (b s x h) (h x V_p / t) product."""
        return 2.0 * b * s * self.cfg.hidden_size * self.vocab / self.t

    # --- the matmuls behind those FLOPs (what the GEMM curve times, hardware.Hardware.gemm_seconds) ----
    def layer_linear_gemms(self, b: int, s: int) -> tuple[Gemm, ...]:
        """The linears of one layer's forward on this rank, (b s) tokens each: QKV (h -> (a + 2g) d / t), the
        attention output (a d / t -> h), the MLP's up projections (GELU: one, SwiGLU: gate and up, h -> f / t)
        and its down projection (f / t -> h). Their FLOPs sum to 2 b s x layer_matmul_params."""
        h, tokens = self.cfg.hidden_size, b * s
        ups = (Gemm(tokens, self.ffn_width, h),) * (self.mlp_matrices - 1)
        return (Gemm(tokens, self.q_width + 2 * self.kv_width, h), Gemm(tokens, h, self.q_width), *ups,
                Gemm(tokens, h, self.ffn_width))

    def attention_core_gemms(self, b: int, s: int) -> tuple[Gemm, ...]:
        """QK^T (s x d)(d x s) and softmax(.) V (s x s)(s x d), batched over b x the rank's a / t heads."""
        d = self.cfg.head_dim
        heads = b * (self.q_width // d)
        return Gemm(s, s, d, heads), Gemm(s, d, s, heads)

    def flash_backward_gemms(self, b: int, s: int) -> tuple[Gemm, ...]:
        """BF16_FLASH: flash attention's backward recomputes the scores QK^T from the kept Q, K and logsumexp
        (Dao et al. 2022, Alg. 4): 5 core matmuls in backward instead of 4. Not counted for FP32_FLASH, whose
        per-layer rates `hybrid calibrate` fits to measured CPU layers, which include it."""
        if self.profile is not ActivationProfile.BF16_FLASH:
            return ()
        return self.attention_core_gemms(b, s)[:1]

    def linear_gemms_in_order(self, b: int, s: int) -> tuple[Gemm, ...]:
        """The layer's linears one by one in the order its forward runs them, as the runtime's separate
        projections: q, k, v, o, then GELU's c_fc, c_proj or SwiGLU's gate, up, down."""
        h, tokens = self.cfg.hidden_size, b * s
        ups = (Gemm(tokens, self.ffn_width, h),) * (self.mlp_matrices - 1)
        return (Gemm(tokens, self.q_width, h), Gemm(tokens, self.kv_width, h), Gemm(tokens, self.kv_width, h),
                Gemm(tokens, h, self.q_width), *ups, Gemm(tokens, h, self.ffn_width))

    def selective_op_rerun_gemms(self, b: int, s: int, stops_early: bool) -> tuple[Gemm, ...]:
        """SELECTIVE_OP (op-level SAC: models/common.py SelectiveOpPolicy, torchtitan's "every second mm"): the
        matmuls whose outputs are not kept -- every second one in forward order (k, o and, SwiGLU, up; a non-gated
        MLP's c_proj / down) -- rerun in backward, except where the rerun stops first.

        `stops_early` (time.recompute_stops_early: torch's non-reentrant checkpoint over torch's linears, no
        hidden dropout): the rerun ends once the last tensor the backward needs is saved again, and autograd
        saves a linear's input before it runs the matmul. A non-gated MLP (GPT-2's c_proj, Nemotron's down: an
        even count of matmuls) ends the block on a rerun matmul that nothing after it needs, so it does not run
        again; SwiGLU's down is kept anyway. With hidden dropout the mask after it is a saved tensor and it
        reruns. Counted on torch in tests/test_planner20_selective_op.py (GPT-2, Llama, Nemotron-like; t 1, 2)."""
        order = self.linear_gemms_in_order(b, s)
        rerun = order[1::2]
        return rerun[:-1] if stops_early and len(order) % 2 == 0 else rerun

    def selective_op_kept_bytes(self, b: int, s: int, sp: bool) -> float:
        """SELECTIVE_OP, bytes one layer keeps per micro-batch: its input (sequence-split under SP), the outputs of
        the odd-numbered matmuls (q, v, c_fc or gate, and down: a row-parallel product's local output is h wide)
        and the attention's output and logsumexp (fp32, a / t a token)."""
        elem = FP32 if self.profile is ActivationProfile.FP32_FLASH else ACT_BYTES
        tokens, h = b * s, self.cfg.hidden_size
        widths = [g.n for g in self.linear_gemms_in_order(b, s)[0::2]]
        lse = (self.cfg.num_heads // self.t) * FP32
        return tokens * (elem * (h / (self.t if sp else 1) + sum(widths) + self.q_width) + lse)

    def selective_op_extra_bytes(self, b: int, s: int, sp: bool = False) -> float:
        """SELECTIVE_OP: stored outputs that autograd would not have saved: while a layer is rerun they exist beside
        its recomputed set. Llama: q before RoPE (the rotation saves only cos and sin) and down's output (nothing
        saves it). GPT-2's q, v and c_fc outputs are saved tensors anyway (SDPA's q and v, GELU's input) -- except
        under SP with biases: on the gathered sequence-major input torch's linear runs a matmul and then adds the
        bias, the policy stores the matmul's output and autograd saves the sum, two tensors where addmm (no SP)
        leaves one. The same holds for a biased v and gate (Qwen2-style) in a Llama block (not measured)."""
        elem = FP32 if self.profile is ActivationProfile.FP32_FLASH else ACT_BYTES
        cfg = self.cfg
        extra = 0 if self.is_gpt2 else self.q_width + cfg.hidden_size
        if sp and self.t > 1:  # stored column-parallel outputs taken before their bias
            extra += cfg.qkv_bias * ((self.q_width if self.is_gpt2 else 0) + self.kv_width)
            extra += cfg.mlp_bias * self.ffn_width
        return b * s * elem * extra

    def layer_gemms(self, b: int, s: int) -> tuple[Gemm, ...]:
        """Every matmul of one layer's forward; FLOPs sum to layer_forward_flops."""
        return self.layer_linear_gemms(b, s) + self.attention_core_gemms(b, s)

    def head_gemm(self, b: int, s: int) -> Gemm:
        """The logits (b s x h)(h x V_p / t)."""
        return Gemm(b * s, self.vocab // self.t, self.cfg.hidden_size)

    # --- activations (Korthikanti et al. 2022, Sec. 4, generalised) -------------------------------
    def layer_activation_terms(self, b: int, s: int, sp: bool) -> tuple[float, float, float]:
        """Bytes one layer keeps for backward on this rank, split into (replicated or sequence-split,
        tensor-split, attention core):

        * replicated (divided by t under SP): both norm inputs 4sbh, the inputs of the QKV and first MLP
          GEMMs 2sbh each, the two residual dropout masks sbh each -> 10 sbh with dropout;
        * tensor-split: Q, K, V 2sb(ad + 2gd)/t, the attention output (o_proj input) 2sb(ad)/t, the MLP
          intermediates -- GELU: its input and output 4sbf/t; SwiGLU: gate, up, silu(gate), product 8sbf/t.
          For GPT (f = 4h, g = a) 24sbh/t;
        * attention core: softmax output 2 a s^2 b / t, plus with attention dropout its mask and output 3 a s^2 b
          / t -> 5as^2b/t; BF16_FLASH: the fp32 logsumexp 4asb/t (flash attention's backward recomputes the
          scores from Q, K, V, which are kept anyway).

        GPT shapes with dropout give Table 2: sbh(10 + 24/t + 5as/(ht)), with SP sbh(34/t + 5as/(ht)).

        FP32_FLASH profile: see `_runtime_layer_terms`."""
        if self.profile is ActivationProfile.FP32_FLASH:
            return self._runtime_layer_terms(b, s, sp)
        cfg, h = self.cfg, self.cfg.hidden_size
        dropout = cfg.dropout > 0
        g = 1 if self.fp8 else ACT_BYTES  # a linear's saved input: its FP8 cast under --fp8 (TE, torchao float8)
        # four (s, b, h) tensors -- two norm inputs, the QKV input, the first MLP GEMM's input -- and two masks
        replicated = s * b * h * (2 * ACT_BYTES + 2 * g) + (2 * s * b * h * MASK_BYTES if dropout else 0)
        if sp:
            replicated /= self.t
        # MLP: GELU's input and c_proj's input; SwiGLU's gate, up, silu(gate) and down's input
        mlp = ((1 if self.is_gpt2 else 3) * ACT_BYTES + g) * self.ffn_width
        split = s * b * ((self.q_width + 2 * self.kv_width) * ACT_BYTES + self.q_width * g + mlp)
        if self.profile is ActivationProfile.BF16_FLASH:
            return replicated, split, (cfg.num_heads // self.t) * s * b * FP32
        per_score = ACT_BYTES + (MASK_BYTES + ACT_BYTES if dropout else 0)
        core = (cfg.num_heads // self.t) * s * s * b * per_score
        return replicated, split, core

    def _runtime_layer_terms(self, b: int, s: int, sp: bool) -> tuple[float, float, float]:
        """Our runtime's saved tensors (fp32, no dropout, CPU flash attention; hybrid/measured_memory.py), per token:

        * sequence-split under SP: the two norms' saved tensors -- LayerNorm input, mean, rstd (h + 2);
          RMSNorm input, rsqrt, normalised x (2h + 1);
        * the column-parallel GEMMs' input, h: without SP one tensor per region entry, shared by the
          GEMMs behind it (2: attention, MLP); under SP the entry all-gathers into a sequence-major buffer
          (`out.movedim`), which F.linear copies for each GEMM -- q, k, v and the MLP's 1 (GELU) or 2
          (gate, up) GEMMs each save their own h;
        * tensor-split: rotated q and k, v, the attention output (o_proj input) (2ad + 2 kv)/t, the MLP --
          fused GELU input and c_proj input 2f/t, or SwiGLU's gate, silu, up and down input 4f/t;
        * attention core: the flash-attention logsumexp a/t (the s x s scores are recomputed in backward
          anyway), the one tensor selective recomputation drops (its q, k, v are its saved inputs, its output
          is the o_proj input)."""
        cfg, h = self.cfg, self.cfg.hidden_size
        tokens = b * s
        norms = 2 * (h + 2 if self.is_gpt2 else 2 * h + 1) * tokens * FP32
        if sp:
            norms /= self.t
            gemm_inputs = (3 + (1 if self.is_gpt2 else 2)) * h * tokens * FP32
        else:
            gemm_inputs = 2 * h * tokens * FP32
        mlp = (2 if self.is_gpt2 else 4) * self.ffn_width
        split = tokens * (2 * self.q_width + 2 * self.kv_width + mlp) * FP32
        return norms + gemm_inputs, split, tokens * (cfg.num_heads // self.t) * FP32

    def mlp_activation_bytes(self, b: int, s: int) -> float:
        """The MLP intermediates of one layer (GELU input and output, or SwiGLU's four f-wide tensors): freed by
        the MLP's backward, before the same layer's attention-core backward runs."""
        elem = FP32 if self.profile is ActivationProfile.FP32_FLASH else ACT_BYTES
        return s * b * (2 if self.is_gpt2 else 4) * self.ffn_width * elem

    def chunk_activation_bytes(self, b: int, s: int) -> float:
        """Per chunk and micro-batch, shared by its layers: Llama's RoPE cos and sin, 2 s d fp32 (FP32_FLASH;
        the Korthikanti profile does not count them)."""
        if self.profile is ActivationProfile.FP32_FLASH and not self.is_gpt2:
            return 2.0 * s * self.cfg.head_dim * FP32
        return 0.0

    def layer_input_bytes(self, b: int, s: int, sp: bool) -> float:
        """Full recomputation keeps only the layer input: 2sbh (2sbh/t under SP, where it is sequence-split)."""
        elem = FP32 if self.profile is ActivationProfile.FP32_FLASH else ACT_BYTES
        return s * b * self.cfg.hidden_size * elem / (self.t if sp else 1)

    def embedding_activation_bytes(self, b: int, s: int, sp: bool) -> float:
        """Stage 0 per micro-batch in flight: the embedding dropout mask, sbh bytes (/t under SP).
        FP32_FLASH: the vocab-parallel lookup's int64 row indices and bool out-of-range mask (9 bytes a token),
        plus GPT-2's int64 positions (s of them: under SP a rank's slice is a view of the whole arange)."""
        if self.profile is ActivationProfile.FP32_FLASH:
            return b * s * (INDEX_BYTES + BOOL_BYTES) + (s * INDEX_BYTES if self.is_gpt2 else 0)
        if self.cfg.dropout <= 0:
            return 0.0
        return s * b * self.cfg.hidden_size * MASK_BYTES / (self.t if sp else 1)

    def head_activation_bytes(self, b: int, s: int, sp: bool) -> float:
        """Last stage per micro-batch in flight: final-norm input 2sbh (/t under SP), LM-head input 2sbh
        (gathered), logits 2sbV_p/t in bf16 and 4sbV_p/t in fp32 for the vocab-parallel cross-entropy; over all
        V_p logits on every rank under gathered_logits; bf16_cross_entropy keeps the bf16 logits and torch's
        bf16 log-softmax, 2 + 2 bytes a logit."""
        h = self.cfg.hidden_size
        if self.profile is ActivationProfile.FP32_FLASH:
            return self._runtime_head_bytes(b, s, sp)
        norm_in = s * b * h * ACT_BYTES / (self.t if sp else 1)
        head_in = s * b * h * ACT_BYTES
        if self.fused_cross_entropy:  # flash-attn's CrossEntropyLoss: the bf16 logits and a fp32 logsumexp a token
            return norm_in + head_in + s * b * (self.loss_vocab * ACT_BYTES + FP32)
        logits = s * b * self.loss_vocab * (ACT_BYTES + (ACT_BYTES if self.bf16_cross_entropy else 4))
        return norm_in + head_in + logits

    @property
    def loss_vocab(self) -> float:
        """Logits a token the loss reads on one rank: V_p / t (vocab-parallel), V_p under gathered_logits."""
        return self.vocab if self.gathered_logits else self.vocab / self.t

    def head_backward_transient_bytes(self, b: int, s: int) -> float:
        """What the loss's backward allocates over one micro-batch's logits beyond what the forward kept, for a
        moment, on the last stage (this runtime's profiles; Korthikanti's Table 2 counts saved tensors only: 0).
        t = 1, torch's fused cross-entropy on fp32 logits: the gradient w.r.t. its log-softmax and the
        log-softmax's input gradient, both fp32: 8 bytes a logit (measured on an H200: a 1.2B Llama at s 4096
        peaked 4.2 GB = 8.0 x 4096 x 128256 bytes above its kept activations, docs/results/gpu_h200.md); the
        same two in bf16 under bf16_cross_entropy, 4 bytes a logit. gathered_logits: the t = 1 loss over all
        V_p logits on every rank. t > 1, hybrid's vocab-parallel cross-entropy writes its gradient into the
        saved fp32 softmax in place: only the cast back to the bf16 logits' dtype, 2 bytes a logit (none in
        fp32). Derived, not measured."""
        if self.profile is ActivationProfile.KORTHIKANTI:
            return 0.0
        logits = b * s * self.loss_vocab
        if self.fused_cross_entropy:  # its backward writes one bf16 gradient over the logits (not in place)
            return ACT_BYTES * logits
        if self.t == 1 or self.gathered_logits:
            return 2 * (ACT_BYTES if self.bf16_cross_entropy else FP32) * logits
        return 0.0 if self.profile is ActivationProfile.FP32_FLASH else ACT_BYTES * logits

    def _runtime_head_bytes(self, b: int, s: int, sp: bool) -> float:
        """FP32_FLASH, last stage per micro-batch: the final norm's saved tensors (h + 2 or 2h + 1 a token, /t
        under SP), the LM-head GEMM input h (gathered), and the loss. At t > 1 the vocab-parallel
        cross-entropy keeps its fp32 softmax V_p/t, its int64 target index and bool ownership mask and the
        loss's bool ignore mask (10 bytes a token), and the int64 token count the mean divides by; at t = 1
        torch's fused cross-entropy keeps its fp32 log-softmax V_p, the int64 targets and a 4-byte total
        weight (hybrid/tp/cross_entropy.py)."""
        h, tokens = self.cfg.hidden_size, b * s
        norm = (h + 2 if self.is_gpt2 else 2 * h + 1) * tokens * FP32 / (self.t if sp else 1)
        head_in = h * tokens * FP32
        softmax = tokens * self.vocab // self.t * FP32
        if self.t == 1:
            return norm + head_in + softmax + tokens * INDEX_BYTES + FP32
        return norm + head_in + softmax + tokens * (INDEX_BYTES + 2 * BOOL_BYTES) + INDEX_BYTES
