"""Per-TP-rank arithmetic of one Transformer: parameters, FLOPs and activation bytes of a layer, of the
embedding and of the LM head. Counts follow the runtime's sharding (hybrid/tp, models/): column-parallel
weights and biases split over t, row-parallel weights split and their biases replicated, norms replicated,
key/value heads split when t divides them and one whole head per rank otherwise, the vocabulary padded to a
multiple of t and split by rows.

Notation: b micro-batch, s sequence, h hidden, a query heads, g key/value heads, d head width, f MLP width,
t tensor-parallel size, V_p padded vocabulary. Mixed precision: activations 2 bytes, dropout masks 1 byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from models.config import ARCH_GPT2, ModelConfig

ACT_BYTES = 2  # bf16 / fp16 activations
MASK_BYTES = 1  # dropout masks (Korthikanti et al. 2022 count them as one byte)


@dataclass(frozen=True)
class Shard:
    """A model seen from one TP rank at size t.

    Attributes:
        cfg: the model.
        t: tensor-parallel size.
        vocab: padded vocabulary V_p (a multiple of t).
    """

    cfg: ModelConfig
    t: int
    vocab: int

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
          / t -> 5as^2b/t.

        GPT shapes with dropout give Table 2: sbh(10 + 24/t + 5as/(ht)), with SP sbh(34/t + 5as/(ht))."""
        cfg, h = self.cfg, self.cfg.hidden_size
        dropout = cfg.dropout > 0
        # four (s, b, h) tensors -- two norm inputs, the QKV input, the first MLP GEMM's input -- and two masks
        replicated = 4 * s * b * h * ACT_BYTES + (2 * s * b * h * MASK_BYTES if dropout else 0)
        if sp:
            replicated /= self.t
        mlp = (2 if self.is_gpt2 else 4) * self.ffn_width
        split = s * b * (self.q_width + 2 * self.kv_width + self.q_width + mlp) * ACT_BYTES
        per_score = ACT_BYTES + (MASK_BYTES + ACT_BYTES if dropout else 0)
        core = (cfg.num_heads // self.t) * s * s * b * per_score
        return replicated, split, core

    def layer_input_bytes(self, b: int, s: int, sp: bool) -> float:
        """Full recomputation keeps only the layer input: 2sbh (2sbh/t under SP, where it is sequence-split)."""
        return s * b * self.cfg.hidden_size * ACT_BYTES / (self.t if sp else 1)

    def embedding_activation_bytes(self, b: int, s: int, sp: bool) -> float:
        """Stage 0 per micro-batch in flight: the embedding dropout mask, sbh bytes (/t under SP)."""
        if self.cfg.dropout <= 0:
            return 0.0
        return s * b * self.cfg.hidden_size * MASK_BYTES / (self.t if sp else 1)

    def head_activation_bytes(self, b: int, s: int, sp: bool) -> float:
        """Last stage per micro-batch in flight: final-norm input 2sbh (/t under SP), LM-head input 2sbh
        (gathered), logits 2sbV_p/t in bf16 and 4sbV_p/t in fp32 for the vocab-parallel cross-entropy."""
        h = self.cfg.hidden_size
        norm_in = s * b * h * ACT_BYTES / (self.t if sp else 1)
        head_in = s * b * h * ACT_BYTES
        logits = s * b * self.vocab / self.t * (ACT_BYTES + 4)
        return norm_in + head_in + logits
