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


def test_a_dense_model_has_no_moe_config():
    assert check(["--model", "tiny-llama"]).moe is None


BAD = [
    (["--model", "tiny-llama", "--expert-model-parallel-size", "2"], 2, "--expert-model-parallel-size: --model tiny-llama has no experts"),
    (["--model", "tiny-llama", "--moe-aux-loss-coeff", "0.01"], 1, "--moe-aux-loss-coeff: --model tiny-llama has no experts"),
    (["--model", "tiny-mixtral", "--expert-model-parallel-size", "3"], 3, "--expert-model-parallel-size 3 does not divide the model's 8 experts"),
    (["--model", "tiny-mixtral", "--expert-model-parallel-size", "4"], 2, "must divide the 2 ranks of a pipeline stage"),
    (["--model", "tiny-mixtral", "--expert-tensor-parallel-size", "2"], 2, "--expert-tensor-parallel-size 2: only 1 is implemented"),
    (["--model", "tiny-mixtral", "--tensor-model-parallel-size", "2"], 2, "needs --sequence-parallel"),
    (["--model", "tiny-mixtral", "--moe-aux-loss-coeff", "-1"], 1, "--moe-aux-loss-coeff must be a finite number >= 0"),
    (["--model", "tiny-mixtral", "--moe-z-loss-coeff", "nan"], 1, "--moe-z-loss-coeff must be a finite number >= 0"),
    (["--model", "tiny-mixtral", "--moe-expert-capacity-factor", "0"], 1, "--moe-expert-capacity-factor must be a finite number > 0"),
    (["--model", "tiny-mixtral", "--moe-pad-expert-input-to-capacity"], 1, "needs --moe-expert-capacity-factor"),
    (["--model", "tiny-mixtral", "--moe-pad-expert-input-to-capacity", "--moe-expert-capacity-factor", "1",
      "--moe-token-dispatcher-type", "allgather"], 1, "alltoall only"),
    (["--model", "tiny-mixtral", "--moe-router-load-balancing-type", "hf_aux_loss", "--moe-aux-loss-coeff", "0.01",
      "--pipeline-model-parallel-size", "2"], 2, "hf_aux_loss pools every MoE layer's counts"),
    (["--model", "tiny-mixtral", "--context-parallel-size", "2"], 2, "--context-parallel-size 2 with an MoE model"),
]


@pytest.mark.parametrize("argv,world,message", BAD, ids=[m for _, _, m in BAD])
def test_bad_moe_flags_are_refused_by_name(argv, world, message):
    with pytest.raises(ValueError) as e:
        check(argv, world)
    assert message in str(e.value) and "\n" not in str(e.value)
