"""Round 24: the planner's Python `Workload` defaults to the gradient dtype train.py runs.

Since round 23 `hybrid plan --precision mixed` plans fp32 gradients, train.py's `--bf16` default (round 22, as
Megatron-LM's main grads), but `Workload(...)` itself still planned bf16 ones: a user of the API with its defaults
planned 16 bytes a parameter for a run that holds 18. Its default is now the precision's own (fp32 gradients under
MIXED); every published row's builder states its gradient dtype, so no published row moved
(`python -m hybrid.planner.families` and scripts/planner_dump.py byte-identical before and after)."""

from __future__ import annotations

import argparse

import pytest
import torch

from hybrid.planner import Workload
from hybrid.planner.cli import add_arguments, workload_from_args
from hybrid.planner.layout import Offload, ZeroStage
from hybrid.planner.predicted_memory import model_states
from hybrid.planner.reference import gpt_model
from hybrid.precision import Precision

GPT = gpt_model(4, 1024, 16, 51200, 1024)


def _plan_cli(flags: list[str]) -> Workload:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return workload_from_args(parser.parse_args(["--num-layers", "4", "--hidden-size", "1024",
                                                 "--num-attention-heads", "16", "--vocab-size", "51200", "--gpus",
                                                 "8", "--global-batch-size", "8", "--seq-length", "1024", *flags]),
                              GPT)


def test_the_api_default_is_hybrid_plans_and_train_pys_gradient_dtype():
    from hybrid.train.args import parse_args, run_config
    api = Workload(GPT, global_batch=8, seq_length=1024)
    assert api.precision is Precision.MIXED and api.fp32_grads is True
    assert _plan_cli(["--precision", "mixed"]).fp32_grads == api.fp32_grads  # `hybrid plan`'s default
    assert api.grad_bytes == 4
    run = run_config(parse_args(["--bf16", "--seq-length", "32", "--train-iters", "2"]), 1)  # train.py --bf16
    assert run.zero.grad_dtype == torch.float32 and torch.finfo(run.zero.grad_dtype).bits // 8 == api.grad_bytes


def test_the_default_prices_megatrons_18_bytes_a_parameter():
    """bf16 weights (2) + fp32 main gradients (4) + fp32 master weights and two Adam moments (12): Megatron-LM's
    distributed-optimizer guide's 18 bytes a parameter without ZeRO; bf16 gradients were 16."""
    for work, want in ((Workload(GPT, global_batch=8, seq_length=1024), 18),
                       (Workload(GPT, global_batch=8, seq_length=1024, fp32_grads=False), 16)):
        s = model_states(1.0, ZeroStage.NONE, 1, Offload.NONE, work.precision, work.fp32_grads)
        assert (s.params, s.grads, s.optimizer) == (2, want - 14, 12)


def test_other_precisions_keep_their_own_gradients_and_refuse_the_flag():
    fp32 = Workload(GPT, global_batch=8, seq_length=1024, precision=Precision.FP32)
    assert fp32.fp32_grads is False and fp32.grad_bytes == 4
    with pytest.raises(ValueError, match="needs --precision mixed"):
        Workload(GPT, global_batch=8, seq_length=1024, precision=Precision.FP32, fp32_grads=True)
