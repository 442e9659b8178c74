"""`hybrid plan --explain` and the plan JSON show each term of the predicted step, and the terms add up to it;
the whole-layer terms behave as ops.py says (an eager layer moves more bytes in more kernels than a fused one,
FP8 halves the GEMM time of the linears but not of the head, selective-op reruns every second matmul)."""

from __future__ import annotations

import json

import pytest

from hybrid.planner import Cluster, Layout, Recompute, Workload, ZeroStage, evaluate, hardware
from hybrid.planner.cli import main
from hybrid.planner.model import ActivationProfile
from hybrid.planner.ops import KernelProfile, Traffic, layer_ops
from hybrid.planner.time import TERMS
from models.config import load_config

FLAGS = ["--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-80g", "--global-batch-size", "16", "--seq-length",
         "4096", "--activation-profile", "bf16-flash", "--tensor-model-parallel-size", "2",
         "--pipeline-model-parallel-size", "2", "--micro-batch-size", "1", "--zero-stage", "1", "--top", "1"]


def test_explain_prints_every_term_and_they_add_up_to_the_step(capsys):
    assert main(FLAGS + ["--explain", "--pipeline-p2p", "blocking"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("  ") and line.split()[0] in dict(TERMS)]
    assert [r[0] for r in rows] == [name for name, _ in TERMS]
    step = float(out.split(" takes ")[1].split(" s a step")[0])
    assert sum(float(r[1]) for r in rows) == pytest.approx(step, rel=1e-3)
    assert float(dict((r[0], r[1]) for r in rows)["pp_p2p"]) > 0  # blocking messages are paid in the passes


def test_plan_json_carries_the_terms(capsys):
    assert main(FLAGS + ["--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plans"][0]
    assert set(plan["terms"]) == {name for name, _ in TERMS}
    assert sum(plan["terms"].values()) == pytest.approx(plan["step_seconds"], rel=1e-9)
    assert plan["terms"]["bubble"] > 0 and plan["terms"]["tp"] > 0 and plan["terms"]["memory_bound"] > 0


def test_fp8_on_a_gpu_without_fp8_is_one_line(capsys):
    flags = list(FLAGS)
    flags[flags.index("h100-80g")] = "a100-80g"
    assert main(flags + ["--fp8"]) == 2
    err = capsys.readouterr().err
    assert "--fp8" in err and "a100-80g" in err and len(err.strip().splitlines()) == 1


def _work(**kw) -> Workload:
    kw.setdefault("fp32_grads", False)  # bf16 gradients, as these tests were derived (Workload's default to round 23)
    return Workload(load_config("llama-3-8b"), global_batch=8, seq_length=4096,
                    activations=ActivationProfile.BF16_FLASH, **kw)


def test_eager_layers_move_more_bytes_in_more_kernels_than_fused():
    shard = _work().shard(1)
    fused = Traffic.of(layer_ops(shard, 4096, False, 2, KernelProfile.FUSED))
    eager = Traffic.of(layer_ops(shard, 4096, False, 2, KernelProfile.EAGER))
    assert eager.fwd_bytes > 2 * fused.fwd_bytes and eager.fwd_kernels > 3 * fused.fwd_kernels
    cluster, layout = Cluster(gpus=1, hw=hardware("h100-80g")), Layout(micro_batch=1)
    t_fused = evaluate(_work(kernels=KernelProfile.FUSED), cluster, layout).time
    t_eager = evaluate(_work(kernels=KernelProfile.EAGER), cluster, layout).time
    assert t_eager.term("memory_bound") > 2 * t_fused.term("memory_bound")
    # the same matmuls, on the device as eager PyTorch sees it (Hardware.for_stack: the H100's eager clock)
    clocked = Cluster(gpus=1, hw=hardware("h100-80g").for_stack(pytorch=True))
    assert t_eager.term("gemm") == pytest.approx(evaluate(_work(kernels=KernelProfile.FUSED), clocked, layout)
                                                 .time.term("gemm"))


def test_fp8_runs_the_linears_at_the_fp8_peak_and_keeps_their_inputs_in_one_byte():
    cluster, layout = Cluster(gpus=1, hw=hardware("h100-80g")), Layout(micro_batch=1)
    bf16, fp8 = evaluate(_work(), cluster, layout), evaluate(_work(fp8=True), cluster, layout)
    assert 0.5 < fp8.time.term("gemm") / bf16.time.term("gemm") < 0.65  # the LM head stays bf16
    assert fp8.time.term("memory_bound") > bf16.time.term("memory_bound")  # the casts and amax passes
    assert fp8.memory.ranks[0].activations < bf16.memory.ranks[0].activations


def test_selective_op_reruns_every_second_matmul_and_keeps_less_than_none():
    cluster = Cluster(gpus=1, hw=hardware("h200"))
    work = _work(kernels=KernelProfile.EAGER)
    none = evaluate(work, cluster, Layout(micro_batch=1))
    sop = evaluate(work, cluster, Layout(micro_batch=1, recompute=Recompute.SELECTIVE_OP))
    full = evaluate(work, cluster, Layout(micro_batch=1, recompute=Recompute.FULL))
    shard = work.shard(1)
    rerun = sum(g.flops for g in shard.selective_op_rerun_gemms(1, 4096, True))
    forward = sum(g.flops for g in shard.linear_gemms_in_order(1, 4096))
    assert 0.3 < rerun / forward < 0.45  # k, o, up of q, k, v, o, gate, up, down
    assert shard.selective_op_rerun_gemms(1, 4096, False) == shard.selective_op_rerun_gemms(1, 4096, True)  # down kept
    assert none.time.total < sop.time.total < full.time.total
    assert full.memory_gb < sop.memory_gb < none.memory_gb
