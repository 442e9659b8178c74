"""--bf16's gradient dtype is Megatron-LM's (round 22): gradients accumulate over micro-batches and reduce over DP in
fp32 by default (megatron/training/arguments.py sets accumulate_allreduce_grads_in_fp32 under --bf16; megatron-core's
DDP then makes its main-grad buffer `torch.float if grad_reduce_in_fp32 else param.dtype`), and `--grad-reduce-in-bf16`
gives bf16 buffers -- both the accumulation and the reduce, as in Megatron, where the flag only clears
accumulate_allreduce_grads_in_fp32. --fp16 stays fp16 unless --accumulate-allreduce-grads-in-fp32 (Megatron's too).

The flags go through train.py's own checks (run_config) to the ZeroConfig every reader takes, then through the engine:
the gradient buffers' dtype and bytes and the DP ledger's bytes, against Psi counted on the model (not the engine).
A revert of the default (grads_in_fp32 back to the flag alone) fails the first and the last test; the DeepSpeed
and plan tests fail when their own mapping drops --grad-reduce-in-bf16 (each break tried, round 22).
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import pytest
import torch

from hybrid.mesh import Mesh, ParallelDims
from hybrid.measured_memory import StateKind
from hybrid.testing import run_distributed
from hybrid.train.args import parse_args, run_config
from hybrid.zero.accounting import DEVICE, paper_state_bytes
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)
from test_fp32_grads import Case, train
from test_zero import padding_bound

FLAGS = {"default": ["--bf16"], "bf16-grads": ["--bf16", "--grad-reduce-in-bf16"]}
BYTES = {"default": 4, "bf16-grads": 2}  # a gradient element: fp32 main grads, or bf16 as the compute dtype
STAGES = (0, 2)  # one of each DP reduction: all-reduce of the flat buffer, reduce-scatter per micro-batch
GLOBAL, MICRO = 8, 2  # dp 2: two micro-batches a rank, so the gradients accumulate once


def zero_of(argv: list[str]):
    """The ZeroConfig train.py builds from these flags (dp 2)."""
    return run_config(parse_args(argv), world=2).zero


def test_bf16_flags_give_megatrons_gradient_dtype():
    """--bf16 alone: fp32 (accumulate + reduce); --grad-reduce-in-bf16: bf16; --accumulate-allreduce-grads-in-fp32
    under --bf16: accepted, the default; --fp16: fp16, fp32 with the flag -- Megatron's four cases."""
    assert zero_of(["--bf16"]).grad_dtype == torch.float32
    assert zero_of(["--bf16", "--accumulate-allreduce-grads-in-fp32"]).grad_dtype == torch.float32
    assert zero_of(["--bf16", "--grad-reduce-in-bf16"]).grad_dtype == torch.bfloat16
    assert zero_of(["--fp16"]).grad_dtype == torch.float16
    assert zero_of(["--fp16", "--accumulate-allreduce-grads-in-fp32"]).grad_dtype == torch.float32


def test_deepspeed_grad_accum_dtype_bf16_gives_bf16_gradients(tmp_path):
    """DeepSpeed's data_types.grad_accum_dtype "bf16" under bf16 is --grad-reduce-in-bf16 now that fp32 is the
    default; "fp32" is the default itself."""
    import json
    for accum, want in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        path = tmp_path / f"{accum}.json"
        path.write_text(json.dumps({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": accum}}))
        assert zero_of(["--deepspeed-config", str(path)]).grad_dtype == want


@pytest.mark.parametrize("extra, fp32_grads", [([], False), (["--accumulate-allreduce-grads-in-fp32"], True)])
def test_plan_emits_the_gradient_dtype_it_counted(extra, fp32_grads):
    """`hybrid plan --precision mixed --emit-args` counts bf16 gradients (2 + 2 + 12 bytes) unless
    --accumulate-allreduce-grads-in-fp32: the emitted flags must make train.py run what the plan counted, so without
    the flag they carry --grad-reduce-in-bf16 (train.py's --bf16 alone would run fp32 gradients, 2 more bytes a
    parameter than the plan)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from hybrid.planner.cli import main as plan_main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert plan_main(["--model", "gpt2-medium", "--gpus", "8", "--global-batch-size", "32", "--seq-length",
                          "1024", "--precision", "mixed", "--emit-args"] + extra) == 0
    flags = out.getvalue().split()
    flags = flags[flags.index("--model"):]
    assert ("--grad-reduce-in-bf16" in flags) is not fp32_grads
    zero = run_config(parse_args(flags), world=8).zero
    assert zero.accumulate_fp32_grads is fp32_grads


def _run(rank, world):
    mesh = Mesh.build(ParallelDims.from_world(world))
    return {(name, stage): train(mesh, "tiny-llama", Case(zero_of(argv + ["--zero-stage", str(stage)]),
                                                          global_batch=GLOBAL, micro=MICRO, steps=1))
            for name, argv in FLAGS.items() for stage in STAGES}


@pytest.fixture(scope="module")
def dp2():
    return run_distributed(_run, 2, timeout=600)


def test_gradients_accumulate_and_reduce_in_the_dtype_the_flags_give(dp2):
    """Per rank, each stage: the gradient buffers held between steps are fp32 under --bf16 and bf16 under
    --grad-reduce-in-bf16, their bytes b Psi (stage 0) or b Psi / 2 (stage 2's shard, + padding), the memory
    formula's gradient term (paper_state_bytes, which the start-up memory line and the planner's run layout read
    off the same ZeroConfig); and the DP gradient collective of the step moves b bytes an element: stage 0 one
    all-reduce of exactly b Psi (no padding at stage 0), stage 2 one reduce-scatter per micro-batch, m b Psi' with
    Psi <= Psi' <= Psi + padding. The default moves exactly twice the opt-out's bytes in as many calls."""
    for per_rank in dp2:
        for stage in STAGES:
            runs = {name: per_rank[(name, stage)] for name in FLAGS}
            for name, got in runs.items():
                b, psi, m = BYTES[name], got["model"]["psi"], got["m"]
                zero = zero_of(FLAGS[name] + ["--zero-stage", str(stage)])
                pad = padding_bound(zero, got["model"], 2)
                assert got["grads"]["dtypes"] == {torch.float32 if b == 4 else torch.bfloat16}, (name, stage)
                n = 2 if stage >= 2 else 1
                assert b * psi // n <= got["grads"]["bytes"] <= b * (psi + pad) // n, (name, stage)
                assert paper_state_bytes(zero, psi, 2)[(StateKind.GRADIENTS, DEVICE)] == b * psi // n
                key = "all_reduce@dp" if stage == 0 else "reduce_scatter@dp"
                reductions = 1 if stage < 2 else m
                if stage == 0:
                    assert got["ledger"][key]["bytes"] == b * psi, (name, stage)
                else:
                    assert b * reductions * psi <= got["ledger"][key]["bytes"] <= b * reductions * (psi + pad)
            default, opt_out = runs["default"]["ledger"], runs["bf16-grads"]["ledger"]
            key = "all_reduce@dp" if stage == 0 else "reduce_scatter@dp"
            assert default[key]["bytes"] == 2 * opt_out[key]["bytes"] and default[key]["calls"] == opt_out[key]["calls"]
