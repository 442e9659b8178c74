"""MoE flags of train.py: defaults, and every bad combination refused with one line naming the flag, before any
process group (hybrid/moe/args.py, through hybrid/train/args.check_args)."""

from __future__ import annotations

import pytest

from hybrid.moe.config import Dispatcher, ExpertsImpl, LoadBalancing, MoEConfig
from hybrid.train.args import parse_args, run_config


def check(argv, world=1):
    return run_config(parse_args(["--seq-length", "32", *argv]), world)


def test_defaults_are_megatrons():
    """Dropless, alltoall, aux_loss type with coefficient 0 (Megatron's and transformers' defaults: no
    balancing loss unless asked), EP 1."""
    moe = check(["--model", "tiny-mixtral"]).moe
    assert moe == MoEConfig() and moe.dispatcher is Dispatcher.ALLTOALL
    assert moe.load_balancing is LoadBalancing.AUX_LOSS and moe.aux_coeff == 0.0
    assert moe.capacity_factor is None and moe.experts_impl is ExpertsImpl.AUTO


def test_expert_tensor_parallel_is_accepted_where_it_divides():
    """ETP 2 on a stage of 2 ranks (tiny-mixtral's expert width 64): expert-TP 2 x EP 1 x expert-DP 1."""
    assert check(["--model", "tiny-mixtral", "--expert-tensor-parallel-size", "2"], 2).moe.expert_tensor_parallel == 2


def test_a_dense_model_has_no_moe_config():
    assert check(["--model", "tiny-llama"]).moe is None


BAD = [
    (["--model", "tiny-llama", "--expert-model-parallel-size", "2"], 2, "--expert-model-parallel-size: --model tiny-llama has no experts"),
    (["--model", "tiny-llama", "--moe-aux-loss-coeff", "0.01"], 1, "--moe-aux-loss-coeff: --model tiny-llama has no experts"),
    (["--model", "tiny-mixtral", "--expert-model-parallel-size", "3"], 3, "--expert-model-parallel-size 3 does not divide the model's 8 experts"),
    (["--model", "tiny-mixtral", "--expert-model-parallel-size", "4"], 2, "must divide the 2 ranks of a pipeline stage"),
    (["--model", "tiny-mixtral", "--expert-tensor-parallel-size", "4"], 2, "--expert-model-parallel-size 1 x --expert-tensor-parallel-size 4 must divide the 2 ranks"),
    (["--model", "tiny-mixtral", "--expert-tensor-parallel-size", "3"], 3, "--expert-tensor-parallel-size 3 does not divide the experts' width"),
    (["--model", "tiny-mixtral", "--expert-tensor-parallel-size", "2", "--moe-token-dispatcher-type", "allgather"], 2,
     "--moe-token-dispatcher-type allgather with --expert-tensor-parallel-size 2 is not implemented"),
    (["--model", "tiny-mixtral", "--tensor-model-parallel-size", "2"], 2, "needs --sequence-parallel"),
    (["--model", "tiny-mixtral", "--moe-aux-loss-coeff", "-1"], 1, "--moe-aux-loss-coeff must be a finite number >= 0"),
    (["--model", "tiny-mixtral", "--moe-z-loss-coeff", "nan"], 1, "--moe-z-loss-coeff must be a finite number >= 0"),
    (["--model", "tiny-mixtral", "--moe-expert-capacity-factor", "0"], 1, "--moe-expert-capacity-factor must be a finite number > 0"),
    (["--model", "tiny-mixtral", "--moe-pad-expert-input-to-capacity"], 1, "needs --moe-expert-capacity-factor"),
    (["--model", "tiny-mixtral", "--moe-token-dispatcher-type", "allgather", "--moe-expert-capacity-factor", "1e308"],
     1, "--moe-expert-capacity-factor 1e+308 is above E / k = 4"),
    (["--model", "tiny-llama", "--moe-experts-impl", "loop"], 1, "--moe-experts-impl: --model tiny-llama has no experts"),
    (["--model", "tiny-mixtral", "--moe-pad-expert-input-to-capacity", "--moe-expert-capacity-factor", "1",
      "--moe-token-dispatcher-type", "allgather"], 1, "alltoall only"),
    (["--model", "tiny-mixtral", "--moe-router-load-balancing-type", "hf_aux_loss", "--moe-aux-loss-coeff", "0.01",
      "--pipeline-model-parallel-size", "2"], 2, "hf_aux_loss pools every MoE layer's counts"),
    (["--model", "tiny-mixtral", "--context-parallel-size", "2", "--expert-model-parallel-size", "4"], 2,
     "--expert-model-parallel-size 4 x --expert-tensor-parallel-size 1 must divide the 2 ranks of a pipeline stage "
     "(tp x cp x dp)"),
]


@pytest.mark.parametrize("argv,world,message", BAD, ids=[m for _, _, m in BAD])
def test_bad_moe_flags_are_refused_by_name(argv, world, message):
    with pytest.raises(ValueError) as e:
        check(argv, world)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_hybrid_layout_shows_which_ranks_hold_which_experts(capsys):
    """`hybrid layout` at world 8 = tp 2 x dp 2 x pp 2, EP 2, 8 experts: each stage's 4 consecutive ranks fold as
    ep 2 x expert-dp 2 -- EP groups are consecutive rank pairs (the all-to-all stays beside TP), expert-DP groups
    the ranks 2 apart in a stage, and EP rank r holds experts [4 r, 4 r + 4) (hand-derived, docs/moe.md)."""
    from hybrid.cli import main

    main(["layout", "--world", "8", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
          "--expert-model-parallel-size", "2", "--num-experts", "8"])
    out = capsys.readouterr().out
    assert "each stage's 4 ranks = expert-tp 1 x ep 2 x expert-dp 2 (order etp-ep-edp); 8 experts, 4 per rank" in out
    assert "ep groups (token all-to-all): [[0, 1], [2, 3], [4, 5], [6, 7]]" in out
    assert "expert-dp groups (expert gradients, ZeRO): [[0, 2], [1, 3], [4, 6], [5, 7]]" in out
    for rank in range(8):
        assert f"  rank {rank}: experts {'0-3' if rank % 2 == 0 else '4-7'}" in out


def test_hybrid_layout_refuses_an_ep_that_does_not_divide(capsys):
    from hybrid.cli import main

    with pytest.raises(SystemExit) as e:
        main(["layout", "--world", "4", "--expert-model-parallel-size", "3", "--num-experts", "6"])
    assert str(e.value.code) == ("hybrid layout: error: --expert-model-parallel-size 3 x --expert-tensor-parallel-size "
                                 "1 must divide the 4 ranks of a pipeline stage (tp x cp x dp); give "
                                 "--expert-model-parallel-size 1, 2 or 4")
