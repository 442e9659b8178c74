"""Round 24: a resume that casts PowerSGD's error feedback between gradient dtypes says so in one start-up line.

Round 23 (polish23) tested the cast itself bit for bit (tests/test_compress23_bf16_grads.py: a checkpoint saved with
--grad-reduce-in-bf16 loads into a default --bf16 run and back); the run said nothing of it. The line is one of
hybrid/train/explain.py's resume lines (rank 0 prints them at start-up), a function of the checkpoint's state.json
and this run's run_info, so it is checked here from train.py's own flags in one process, no process group. The
gradient dtype it names is checked against the one the run builds its buffers in (ZeroConfig.grad_dtype), an
independent reading of the same flags."""

from __future__ import annotations

import pytest
import torch

from hybrid.train import explain
from hybrid.train.args import parse_args, run_config
from hybrid.train.loop import run_info

BASE = ["--seq-length", "32", "--train-iters", "16", "--global-batch-size", "8", "--powersgd-rank", "2",
        "--powersgd-start-iter", "2"]
BF16_GRADS, FP32_GRADS = ["--bf16", "--grad-reduce-in-bf16"], ["--bf16"]  # --bf16's default: fp32 gradients


def _info(flags: list[str]) -> tuple[dict, torch.dtype]:
    run = run_config(parse_args(BASE + flags), 2)  # dp 2: PowerSGD has a DP reduction to compress
    return run_info(run), run.zero.grad_dtype


def _saved(flags: list[str], iteration: int = 4) -> dict:
    """A checkpoint's state.json: the run's record and PowerSGD's counters (hybrid/compress/state.py)."""
    return {**_info(flags)[0], "compress/powersgd": {"iter": iteration, "dp": 2, "tp": 1, "pp": 1, "rank": 2}}


def _cast_lines(saved: dict, now_flags: list[str]) -> list[str]:
    return [line for line in explain.resume_lines(saved, _info(now_flags)[0], 4, 32, None, 8) if "PowerSGD" in line]


@pytest.mark.parametrize("flags, dtype", [(BF16_GRADS, torch.bfloat16), (FP32_GRADS, torch.float32),
                                          ([], torch.float32), (["--fp16"], torch.float16)])
def test_the_gradient_dtype_read_from_the_flags_is_the_one_the_run_allocates(flags, dtype):
    info, grad_dtype = _info(flags)
    assert grad_dtype == dtype
    assert explain.grads_dtype(info["args"]) == {torch.bfloat16: "bf16", torch.float32: "fp32",
                                                 torch.float16: "fp16"}[dtype]


def test_bf16_error_feedback_resumed_in_fp32_names_an_exact_cast():
    assert _cast_lines(_saved(BF16_GRADS), FP32_GRADS) == [
        "resume: PowerSGD's error feedback and warm-start Q cast from the checkpoint's bf16 gradients "
        "(--grad-reduce-in-bf16) to this run's fp32: exact"]


def test_fp32_error_feedback_resumed_in_bf16_names_the_rounding():
    assert _cast_lines(_saved(FP32_GRADS), BF16_GRADS) == [
        "resume: PowerSGD's error feedback and warm-start Q cast from the checkpoint's fp32 gradients to this run's "
        "bf16 (--grad-reduce-in-bf16): each value rounded to bf16 once, as this run rounds its own residual every "
        "step"]


def test_a_checkpoint_from_before_round_22_reduced_bf16_in_bf16():
    """Before --grad-reduce-in-bf16 existed (round 22), --bf16 reduced in bf16 unless
    --accumulate-allreduce-grads-in-fp32: a state.json without the flag is read that way."""
    saved = _saved(FP32_GRADS)
    del saved["args"]["grad_reduce_in_bf16"]
    assert explain.grads_dtype(saved["args"]) == "bf16"
    assert len(_cast_lines(saved, FP32_GRADS)) == 1
    saved["args"]["accumulate_allreduce_grads_in_fp32"] = True
    assert _cast_lines(saved, FP32_GRADS) == []


def test_no_line_without_a_cast():
    assert _cast_lines(_saved(FP32_GRADS), FP32_GRADS) == []  # the same dtype
    assert _cast_lines(_saved(BF16_GRADS, iteration=2), FP32_GRADS) == []  # no compressed step saved: starts empty
    without = _saved(BF16_GRADS)
    del without["compress/powersgd"]
    assert _cast_lines(without, FP32_GRADS) == []  # saved without PowerSGD: nothing loaded
    plain = run_info(run_config(parse_args(["--seq-length", "32", "--train-iters", "16", "--global-batch-size", "8",
                                            "--bf16"]), 2))
    assert [line for line in explain.resume_lines(_saved(BF16_GRADS), plain, 4, 32, None, 8)
            if "PowerSGD" in line] == []  # this run compresses nothing: the state is not loaded
