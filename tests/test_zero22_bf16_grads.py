"""--bf16's gradient dtype is Megatron-LM's (round 22): gradients accumulate over micro-batches and reduce over DP in
fp32 by default (megatron/training/arguments.py sets accumulate_allreduce_grads_in_fp32 under --bf16; megatron-core's
DDP then makes its main-grad buffer `torch.float if grad_reduce_in_fp32 else param.dtype`), and `--grad-reduce-in-bf16`
gives bf16 buffers -- both the accumulation and the reduce, as in Megatron, where the flag only clears
accumulate_allreduce_grads_in_fp32. --fp16 stays fp16 unless --accumulate-allreduce-grads-in-fp32 (Megatron's too).

The flags go through train.py's own checks (run_config) to the ZeroConfig every reader takes, then through the engine:
the gradient buffers' dtype and bytes and the DP ledger's bytes, against Psi counted on the model (not the engine).
A revert of the default (grads_in_fp32 back to the flag alone) fails the first and the last test; the DeepSpeed
and plan tests fail when their own mapping drops --grad-reduce-in-bf16 (each break tried, round 22).

Round 23: `hybrid plan`'s default is the runtime's too (fp32 gradients; --grad-reduce-in-bf16 the opt-out, as
train.py's). The plan tests go plan -> --json / --explain / --emit-args -> train.py's own parsing, and compare the
plan made from `hybrid plan`'s own flags with the dp 2 runs' ledgers and gradient buffers (no launch of their own;
one more run in it, README's headline ZeRO 3 + offload flags at --bf16's default, checks that plan too).
The planner's default reverted (bf16 unless --accumulate-allreduce-grads-in-fp32) fails the four default cases; the
emitted --grad-reduce-in-bf16 dropped fails test_plan_emits_the_gradient_dtype_it_counted[bf16-grads] (tried).
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from hybrid.mesh import Mesh, ParallelDims
from hybrid.planner.hardware import GB
from hybrid.measured_memory import StateKind
from hybrid.testing import run_distributed
from hybrid.train.args import parse_args, run_config
from hybrid.zero.accounting import DEVICE, paper_state_bytes
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)
from test_fp32_grads import SEQ, Case, train
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


# `hybrid plan`'s flags for each run above: its default is train.py's (round 23), the opt-out the same flag
PLAN_FLAGS = {"default": [], "bf16-grads": ["--grad-reduce-in-bf16"]}


PLAN = ["--model", "gpt2-medium", "--gpus", "8", "--global-batch-size", "32", "--seq-length", "1024"]


def _plan(argv: list[str]) -> str:
    """`hybrid plan ARGV`'s stdout (in this process)."""
    from hybrid.planner.cli import main as plan_main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert plan_main(argv) == 0
    return out.getvalue()


@pytest.mark.parametrize("name", PLAN_FLAGS)
def test_plan_emits_the_gradient_dtype_it_counted(name):
    """`hybrid plan` at its defaults (a GPU preset: --precision mixed) counts fp32 gradients, as train.py's --bf16
    runs them; with --grad-reduce-in-bf16, bf16. The plan says which (--json's grad_dtype, each plan's gradient
    bytes), and the flags --emit-args prints, read by train.py's own parser, give train.py's grads_in_fp32 and
    ZeroConfig that dtype -- both ways: a plan that dropped the opt-out, or emitted it at the default, fails."""
    from hybrid.train.args import grads_in_fp32
    plan = json.loads(_plan(PLAN + ["--json", "--top", "1"] + PLAN_FLAGS[name]))["plans"][0]
    assert plan["grad_dtype"] == {4: "fp32", 2: "bf16"}[BYTES[name]]
    stage = plan["memory_per_stage_gb"][0]  # the states' gradient term: b Psi, over dp at ZeRO 2-3
    shards = plan["layout"]["dp"] if plan["layout"]["zero_stage"] >= 2 else 1
    assert stage["grads"] * GB == pytest.approx(BYTES[name] * stage["parameters"] / shards, rel=1e-12)
    flags = _plan(PLAN + ["--emit-args"] + PLAN_FLAGS[name]).split()
    assert flags == ["--model", "gpt2-medium"] + plan["train_args"]  # the JSON's best plan, as emitted
    assert ("--grad-reduce-in-bf16" in flags) is (name != "default")
    args = parse_args(flags)
    assert grads_in_fp32(args) is (plan["grad_dtype"] == "fp32")
    assert run_config(args, world=8).zero.grad_dtype == {"fp32": torch.float32, "bf16": torch.bfloat16}[
        plan["grad_dtype"]]


# README's headline ZeRO flags at --bf16's default gradients (torch's CPU Adam: no extension build in a test)
OFFLOAD = ["--bf16", "--zero-stage", "3", "--offload-optimizer", "--offload-params", "--cpu-adam", "torch"]


def _run(rank, world):
    mesh = Mesh.build(ParallelDims.from_world(world))
    out = {(name, stage): train(mesh, "tiny-llama", Case(zero_of(argv + ["--zero-stage", str(stage)]),
                                                         global_batch=GLOBAL, micro=MICRO, steps=1))
           for name, argv in FLAGS.items() for stage in STAGES}
    out["offload"] = train(mesh, "tiny-llama", Case(zero_of(OFFLOAD), global_batch=GLOBAL, micro=MICRO, steps=1))
    return out


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


@pytest.mark.parametrize("name", PLAN_FLAGS)
def test_explain_says_the_gradient_dtype_as_train_pys_zero_line_does(name):
    """--explain's `gradients:` line gives the dtype and bytes the plan counted, and quotes the gradient part of the
    `zero:` line train.py prints for the emitted flags (hybrid/train/loop.py _grads_part of their ZeroConfig)."""
    from hybrid.train.loop import _grads_part
    line = next(x for x in _plan(PLAN + ["--explain", "--top", "1"] + PLAN_FLAGS[name]).splitlines()
                if x.startswith("  gradients: "))
    assert line.startswith(f"  gradients: {'fp32' if BYTES[name] == 4 else 'bf16'}, {BYTES[name]} bytes a parameter")
    zero = run_config(parse_args(_plan(PLAN + ["--emit-args"] + PLAN_FLAGS[name]).split()), world=8).zero
    assert f"`zero:` line says '{_grads_part(zero)[3:]}'" in line


def _planned(name: str, stage: int):
    """`hybrid plan`'s own reading of its flags (at its defaults, or --grad-reduce-in-bf16) for the dp 2 runs
    above: the Workload, the layout they ran, its planned memory."""
    import argparse

    from hybrid.planner import Cluster, Layout, hardware, plan_memory
    from hybrid.planner.cli import add_arguments, model_from_args, workload_from_args
    from hybrid.planner.layout import ZeroStage
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", "tiny-llama", "--gpus", "2", "--global-batch-size", str(GLOBAL),
                              "--seq-length", str(SEQ)] + PLAN_FLAGS[name])
    work = workload_from_args(args, model_from_args(args))
    layout = Layout(dp=2, micro_batch=MICRO, zero=ZeroStage(stage))
    return work, layout, plan_memory(work, Cluster(gpus=2, hw=hardware("a100-80g")), layout)


@pytest.mark.parametrize("name", PLAN_FLAGS)
def test_the_plans_gradient_bytes_and_dp_traffic_are_the_runs(dp2, name):
    """The plan `hybrid plan` makes at its defaults (fp32 gradients) and with --grad-reduce-in-bf16 (bf16), against
    the dp 2 runs of train.py's matching flags (--bf16; --bf16 --grad-reduce-in-bf16), each stage: every DP
    collective of the step (predicted_comm.step_ledger: the gradient all-reduce or reduce-scatters in the
    gradients' bytes, the bf16 parameter all-gathers) equals the run's ledger entry by entry, and the planned
    gradient memory is the run's gradient buffers up to the ZeRO padding (the planner counts Psi, the engine pads
    each unit to a multiple of dp). A plan at the old default (bf16 gradients) moves half the run's bytes."""
    from hybrid.planner.predicted_comm import step_ledger
    for per_rank in dp2:
        for stage in STAGES:
            got = per_rank[(name, stage)]
            work, layout, memory = _planned(name, stage)
            assert step_ledger(work, layout, 0) == got["ledger"], (name, stage)
            planned, psi = memory.ranks[0], got["model"]["psi"]
            assert planned.parameters == psi
            pad = padding_bound(zero_of(FLAGS[name] + ["--zero-stage", str(stage)]), got["model"], 2)
            n = 2 if stage >= 2 else 1
            assert planned.states.grads == BYTES[name] * psi / n
            assert planned.states.grads <= got["grads"]["bytes"] <= BYTES[name] * (psi + pad) / n, (name, stage)


def test_the_default_plan_with_offload_is_the_runs(dp2):
    """`hybrid plan` at its defaults with ZeRO 3 and both offloads pinned (README's headline flags), against train.py's
    --bf16 run of them (fp32 gradients, round 22's default): every DP collective of the step equals
    predicted_comm.step_ledger with Offload.OPTIMIZER_AND_PARAMS, and the planned device gradient shard is the run's
    fp32 shard, 4 Psi / 2 up to the padding. (tests/test_planner_runtime.py's headline case runs bf16 gradients.)"""
    from dataclasses import replace

    from hybrid.planner import Cluster, hardware, plan_memory
    from hybrid.planner.layout import Offload
    from hybrid.planner.predicted_comm import step_ledger
    work, layout, _ = _planned("default", 3)
    layout = replace(layout, offload=Offload.OPTIMIZER_AND_PARAMS)
    memory = plan_memory(work, Cluster(gpus=2, hw=hardware("a100-80g")), layout)
    for per_rank in dp2:
        got, psi = per_rank["offload"], per_rank["offload"]["model"]["psi"]
        assert got["grads"]["dtypes"] == {torch.float32}
        assert step_ledger(work, layout, 0) == got["ledger"]
        pad = padding_bound(zero_of(OFFLOAD), got["model"], 2)
        assert memory.ranks[0].states.grads == 4 * psi / 2 <= got["grads"]["bytes"] <= 4 * (psi + pad) / 2
