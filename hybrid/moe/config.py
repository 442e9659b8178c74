"""The Mixture-of-Experts training choices: one frozen dataclass, built from the flags by hybrid/moe/args.py.

The architecture (how many experts, k, the expert width, which layers are MoE, the router's softmax order,
the shared expert) is the model's and lives in models/config.ModelConfig; this is how a run trains it:
load balancing, capacity, how tokens travel, and how the experts are laid out over the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class LoadBalancing(Enum):
    """`--moe-router-load-balancing-type`: the auxiliary loss that pushes the router towards even loads.

    With f_e the fraction of routed slots that go to expert e, P_e the mean router probability of e,
    E experts, k per token, T tokens:

    AUX_LOSS      Megatron's (Switch Transformer's) per layer and micro-batch:
                  coeff * E * sum_e f_e P_e with f_e = count_e / (k T); summed over the MoE layers.
    SEQ_AUX_LOSS  the same per sequence (DeepSeek-V2/V3's sequence-wise balance loss), averaged over
                  the sequences of the micro-batch; summed over the layers.
    HF_AUX_LOSS   transformers' load_balancing_loss_func with output_router_logits=True: counts and
                  probabilities pooled over all MoE layers of the model before the product, f_e without
                  the 1/k: coeff * E * sum_e (C_e / (L T)) (P_e / (L T)). Needs the whole model in one
                  stage (pipeline size 1).
    NONE          no auxiliary loss (e.g. with the expert bias instead).
    """

    AUX_LOSS = "aux_loss"
    SEQ_AUX_LOSS = "seq_aux_loss"
    HF_AUX_LOSS = "hf_aux_loss"
    NONE = "none"


class Dispatcher(Enum):
    """`--moe-token-dispatcher-type`: how routed tokens reach the expert-parallel rank holding their expert.

    ALLTOALL   each rank first sends every peer the number of its tokens bound for each of the peer's
               experts (all-to-all of E integers), then the tokens themselves (all-to-all with those
               split sizes); the combine is the inverse all-to-all. Moves only routed tokens.
    ALLGATHER  every rank gathers every peer's tokens (and routing), computes its own experts on the
               tokens routed to them, and a reduce-scatter returns each rank's outputs summed.
    """

    ALLTOALL = "alltoall"
    ALLGATHER = "allgather"


class ExpertsImpl(Enum):
    """`--moe-experts-impl`: how a rank's local experts run on their token groups.

    LOOP     one matmul per expert over its contiguous rows (transformers' and Megatron's SequentialMLP).
    GROUPED  torch's grouped GEMM (torch.nn.functional.grouped_mm) over the experts' stacked weights,
             one call per projection (torchtitan, Megatron's GroupedMLP); the stack is a copy per forward.
    AUTO     GROUPED on CUDA, LOOP on the CPU, where grouped_mm is no faster (scripts/bench_moe.py).
    """

    LOOP = "loop"
    GROUPED = "grouped"
    AUTO = "auto"


@dataclass(frozen=True)
class MoEConfig:
    """How a run trains and lays out the MoE layers.

    Attributes:
        expert_parallel: EP, ranks that split the experts of a layer and exchange tokens
            (`--expert-model-parallel-size`); must divide the number of experts.
        expert_tensor_parallel: ranks that split each expert's hidden width
            (`--expert-tensor-parallel-size`), gate/up column- and down row-parallel over the expert-TP
            group (Megatron's parallel folding); must divide the experts' width; alltoall dispatcher only.
        load_balancing: which auxiliary loss (`--moe-router-load-balancing-type`).
        aux_loss_coeff: its coefficient (`--moe-aux-loss-coeff`); 0 disables it.
        z_loss_coeff: coefficient of the router z-loss coeff * mean_t(logsumexp(logits_t)^2)
            (`--moe-z-loss-coeff`, ST-MoE); 0 disables it.
        expert_bias: DeepSeek-V3's auxiliary-loss-free balancing: a per-expert bias b added to the
            routing scores for the top-k choice only (`--moe-router-enable-expert-bias`).
        bias_update_rate: u in b_e += u * sign(mean_e' load_e' - load_e) after each step
            (`--moe-router-bias-update-rate`).
        score_function: "softmax" or "sigmoid" router scores (`--moe-router-score-function`; DeepSeek-V3:
            sigmoid). The model config's own router (softmax) unless given.
        capacity_factor: expert capacity = ceil(factor * k T / E) rows per expert and micro-batch,
            tokens beyond it are dropped by lowest probability (`--moe-expert-capacity-factor`);
            None: dropless (the default).
        pad_to_capacity: every expert gets exactly `capacity` rows, padded with zero rows
            (`--moe-pad-expert-input-to-capacity`; static shapes).
        dispatcher: how tokens travel over EP (`--moe-token-dispatcher-type`).
        experts_impl: grouped GEMM or a loop over the local experts (`--moe-experts-impl`).
    """

    expert_parallel: int = 1
    expert_tensor_parallel: int = 1
    load_balancing: LoadBalancing = LoadBalancing.AUX_LOSS
    aux_loss_coeff: float = 0.0
    z_loss_coeff: float = 0.0
    expert_bias: bool = False
    bias_update_rate: float = 1e-3
    score_function: str | None = None
    capacity_factor: float | None = None
    pad_to_capacity: bool = False
    dispatcher: Dispatcher = Dispatcher.ALLTOALL
    experts_impl: ExpertsImpl = ExpertsImpl.AUTO

    @property
    def aux_coeff(self) -> float:
        """The auxiliary loss coefficient in effect (0 with load_balancing NONE)."""
        return 0.0 if self.load_balancing is LoadBalancing.NONE else self.aux_loss_coeff
