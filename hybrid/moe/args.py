"""Mixture-of-Experts flags of train.py (Megatron-LM's names): `add_arguments`, and `check` -> MoEConfig before
any process group; every bad value is a ValueError naming the flag."""

from __future__ import annotations

import argparse

from hybrid.cliutil import check_number
from hybrid.mesh import ParallelDims
from hybrid.moe.config import Dispatcher, ExpertsImpl, LoadBalancing, MoEConfig
from hybrid.moe.parallel import ExpertLayout


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("mixture of experts", "for MoE models (Mixtral, Qwen2-MoE; docs/moe.md)")
    g.add_argument("--expert-model-parallel-size", type=int, default=1, metavar="N",
                   help="EP: ranks that split each MoE layer's experts and exchange tokens (folded over the "
                        "stage's tp x cp x dp ranks)")
    g.add_argument("--expert-tensor-parallel-size", type=int, default=1, metavar="N",
                   help="expert-TP: ranks splitting each expert's width like a TP MLP (gate/up column-, down "
                        "row-parallel), folded with EP and expert-DP over the stage's ranks; 1: each expert whole")
    g.add_argument("--moe-token-dispatcher-type", choices=[d.value for d in Dispatcher], default="alltoall",
                   help="alltoall: counts, then the routed tokens, to the experts' ranks; allgather: every rank "
                        "gathers all tokens, reduce-scatter back")
    g.add_argument("--moe-router-load-balancing-type", choices=[b.value for b in LoadBalancing], default="aux_loss",
                   help="aux_loss: Megatron's per layer and micro-batch; seq_aux_loss: per sequence; hf_aux_loss: "
                        "transformers' (output_router_logits=True), pooled over the model's layers (pp 1); none")
    g.add_argument("--moe-aux-loss-coeff", type=float, default=0.0, metavar="X",
                   help="coefficient of the load-balancing loss (0: off; transformers' router_aux_loss_coef with "
                        "hf_aux_loss)")
    g.add_argument("--moe-z-loss-coeff", type=float, default=0.0, metavar="X",
                   help="coefficient of the router z-loss mean(logsumexp(logits)^2) (ST-MoE; 0: off)")
    g.add_argument("--moe-router-score-function", choices=("softmax", "sigmoid"), default=None,
                   help="router scores; default: the model's (softmax)")
    g.add_argument("--moe-router-enable-expert-bias", action="store_true",
                   help="DeepSeek-V3's auxiliary-loss-free balancing: a per-expert bias on the routing scores, "
                        "updated after each step by --moe-router-bias-update-rate x sign(mean load - load)")
    g.add_argument("--moe-router-bias-update-rate", type=float, default=1e-3, metavar="X",
                   help="the expert bias's step u")
    g.add_argument("--moe-expert-capacity-factor", type=float, default=None, metavar="X",
                   help="rows per expert = ceil(X k tokens / E); slots beyond are dropped by lowest probability "
                        "(unset: dropless)")
    g.add_argument("--moe-pad-expert-input-to-capacity", action="store_true",
                   help="pad every expert's rows to the capacity (static shapes; alltoall dispatcher)")
    g.add_argument("--moe-experts-impl", choices=[i.value for i in ExpertsImpl], default="auto",
                   help="local experts as torch's grouped GEMM or a loop of matmuls (auto: grouped on CUDA)")


FLAGS = ("expert_model_parallel_size", "expert_tensor_parallel_size", "moe_router_load_balancing_type",
         "moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_router_score_function", "moe_router_enable_expert_bias",
         "moe_router_bias_update_rate", "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
         "moe_token_dispatcher_type", "moe_experts_impl")
DEFAULTS = {"expert_model_parallel_size": 1, "expert_tensor_parallel_size": 1, "moe_router_load_balancing_type":
            "aux_loss", "moe_aux_loss_coeff": 0.0, "moe_z_loss_coeff": 0.0, "moe_router_score_function": None,
            "moe_router_enable_expert_bias": False, "moe_router_bias_update_rate": 1e-3,
            "moe_expert_capacity_factor": None,
            "moe_pad_expert_input_to_capacity": False, "moe_token_dispatcher_type": "alltoall",
            "moe_experts_impl": "auto"}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check(args: argparse.Namespace, cfg, dims: ParallelDims) -> MoEConfig | None:
    """The MoEConfig of an MoE model (None for a dense one, which must not be given MoE flags)."""
    _check_numbers(args)  # first: a non-finite value is refused by name whatever the model
    if not cfg.num_experts:
        given = [f for f in FLAGS if getattr(args, f, DEFAULTS[f]) != DEFAULTS[f]]
        if given:
            raise ValueError(f"{_flag(given[0])}: --model {args.model} has no experts (a dense model); drop the flag")
        return None
    rate_given = args.moe_router_bias_update_rate != DEFAULTS["moe_router_bias_update_rate"] or \
        "moe_router_bias_update_rate" in getattr(args, "explicit", set())  # the default 1e-3 written out too
    if not args.moe_router_enable_expert_bias and rate_given:  # the rate moves the expert bias, which is off
        raise ValueError("--moe-router-bias-update-rate sets how fast the expert bias moves; add "
                         "--moe-router-enable-expert-bias or drop the rate")
    _check_balancing(args)
    moe = MoEConfig(
        expert_parallel=args.expert_model_parallel_size, expert_tensor_parallel=args.expert_tensor_parallel_size,
        load_balancing=LoadBalancing(args.moe_router_load_balancing_type), aux_loss_coeff=args.moe_aux_loss_coeff,
        z_loss_coeff=args.moe_z_loss_coeff, expert_bias=args.moe_router_enable_expert_bias,
        bias_update_rate=args.moe_router_bias_update_rate, score_function=args.moe_router_score_function,
        capacity_factor=args.moe_expert_capacity_factor, pad_to_capacity=args.moe_pad_expert_input_to_capacity,
        dispatcher=Dispatcher(args.moe_token_dispatcher_type), experts_impl=ExpertsImpl(args.moe_experts_impl))
    ExpertLayout(dims, moe.expert_parallel, moe.expert_tensor_parallel).check_experts(cfg.num_experts,
                                                                                     cfg.moe_ffn_hidden_size)
    _check_combinations(args, cfg, dims, moe)
    return moe


def check_resume(saved: tuple[str, frozenset[str]] | None) -> None:
    """A run with --moe-router-enable-expert-bias resuming the checkpoint `saved` (its directory and the tensor
    keys of its DCP metadata; None without a resume). The expert bias is checkpointed state
    (moe/<layer>.gate.expert_bias, runtime.ExpertBiasState): a checkpoint with none (saved without the flag, or a
    `hybrid convert` of a transformers model) failed after start-up, "Missing key in checkpoint state_dict:
    moe/...". Named here, before any process group. (The reverse, a saved bias resumed without the flag, runs
    without it; the resume's "flags changed" line names the change.)"""
    if saved is None:
        return
    directory, keys = saved
    if not any(key.startswith("moe/") for key in keys):
        raise ValueError(f"--moe-router-enable-expert-bias: the checkpoint --load resumes ({directory}) holds no "
                         f"expert bias (saved without the flag, or converted from transformers); drop the flag to "
                         f"resume it, or start from its weights with the bias at zero: `hybrid convert {directory} "
                         f"DIR`, then --load DIR (a fresh optimizer)")


def _check_numbers(args: argparse.Namespace) -> None:
    for dest in ("moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_router_bias_update_rate"):
        check_number(_flag(dest), getattr(args, dest), 0)
    if args.moe_expert_capacity_factor is not None:
        check_number("--moe-expert-capacity-factor", args.moe_expert_capacity_factor, 0, low_open=True)


def _check_balancing(args: argparse.Namespace) -> None:
    """The balancing loss is coeff x loss: a coefficient with no loss (type none), or a loss type given with the
    coefficient left at 0, would change nothing -- refused by name rather than ignored."""
    kind, coeff = args.moe_router_load_balancing_type, args.moe_aux_loss_coeff
    if kind == LoadBalancing.NONE.value and coeff > 0:
        raise ValueError(f"--moe-aux-loss-coeff {coeff:g} weighs the load-balancing loss, which "
                         f"--moe-router-load-balancing-type none turns off; drop one of them")
    if "moe_router_load_balancing_type" in getattr(args, "explicit", set()) and kind != LoadBalancing.NONE.value \
            and coeff == 0:
        raise ValueError(f"--moe-router-load-balancing-type {kind} adds nothing at --moe-aux-loss-coeff 0 (the "
                         f"default); give a coefficient such as --moe-aux-loss-coeff 0.01")


def _check_combinations(args: argparse.Namespace, cfg, dims: ParallelDims, moe: MoEConfig) -> None:
    shared = cfg.moe_shared_expert_ffn_hidden_size
    if shared and shared % dims.tp:
        raise ValueError(f"--tensor-model-parallel-size {dims.tp} does not divide the shared expert's width {shared}; "
                         f"use a divisor of {shared}")
    if dims.tp > 1 and not args.sequence_parallel:
        raise ValueError(f"--tensor-model-parallel-size {dims.tp} with an MoE model needs --sequence-parallel (each "
                         f"TP rank routes its own slice of the tokens, as Megatron requires)")
    if moe.pad_to_capacity and moe.capacity_factor is None:
        raise ValueError("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor")
    # capacity = ceil(factor * k * tokens / E): at factor E / k an expert can take every token it could be sent
    # (no token is ever dropped), so a larger factor only pads -- and a huge one overflows the integer capacity
    top = cfg.num_experts / cfg.moe_top_k
    if moe.capacity_factor is not None and moe.capacity_factor > top:
        raise ValueError(f"--moe-expert-capacity-factor {moe.capacity_factor:g} is above E / k = {top:g}, where no "
                         f"token is dropped; drop the flag (dropless) or use a factor <= {top:g}")
    if moe.expert_tensor_parallel > 1 and moe.dispatcher is Dispatcher.ALLGATHER:
        raise ValueError(f"--moe-token-dispatcher-type allgather with --expert-tensor-parallel-size "
                         f"{moe.expert_tensor_parallel} is not implemented; use alltoall")
    if moe.pad_to_capacity and moe.dispatcher is Dispatcher.ALLGATHER:
        raise ValueError("--moe-pad-expert-input-to-capacity is implemented for --moe-token-dispatcher-type "
                         "alltoall only")
    if moe.expert_parallel == 1 and "moe_token_dispatcher_type" in getattr(args, "explicit", set()):
        # layer.py's _dispatch: at EP 1 every token stays on its rank and neither dispatcher runs a collective
        raise ValueError(f"--moe-token-dispatcher-type {moe.dispatcher.value} picks how tokens travel between the "
                         f"--expert-model-parallel-size ranks; at --expert-model-parallel-size 1 every token stays "
                         f"on its rank: give --expert-model-parallel-size > 1 or drop --moe-token-dispatcher-type")
    if moe.expert_bias and moe.bias_update_rate == 0:
        raise ValueError("--moe-router-enable-expert-bias with --moe-router-bias-update-rate 0 keeps the bias at "
                         "zero (it moves by the rate x sign(mean load - load) each step): give a rate > 0 (the "
                         "default 1e-3, DeepSeek-V3's) or drop --moe-router-enable-expert-bias")
    if moe.load_balancing is LoadBalancing.HF_AUX_LOSS and moe.aux_coeff > 0:
        chunks = (args.virtual_pipeline_model_parallel_size or 1) > 1 or \
            args.num_layers_per_virtual_pipeline_stage not in (None, cfg.num_layers)
        if dims.pp > 1 or chunks:
            raise ValueError("--moe-router-load-balancing-type hf_aux_loss pools every MoE layer's counts and needs "
                             "the whole model in one stage (--pipeline-model-parallel-size 1); use aux_loss")
    if moe.expert_bias and not (cfg.moe_router_pre_softmax or moe.score_function == "sigmoid"):
        raise ValueError("--moe-router-enable-expert-bias needs scores to choose with: a pre-softmax router or "
                         "--moe-router-score-function sigmoid")
