"""Issue 26, round 9: torch's context_parallel ring as torchtitan runs it (RingSchedule.TORCH_ALLGATHER), priced
from torch's code (torch/distributed/tensor/experimental/_attention.py at pytorch/pytorch f2127dbd), not from the
check rows: one all-gather of every rank's K, V per pass, posted before the diagonal step and waited before step 1
(so it hides under one step, not c - 1); the fp32 dK, dV permuted after each backward step, the last exposed; the
fp32 output merges and concatenations between the attention calls as memory-bound bytes; and K, V at the query
width when the model repeats them before attention (torchtitan's repeat_kv). Expected values are written out here
from those byte counts and the presets' bandwidths, not taken from the code under test."""

from __future__ import annotations

import dataclasses

import pytest

from hybrid.cp.attention import CommType
from hybrid.planner.context import layer_cost, ring_schedule, torch_ring_merge_bytes
from hybrid.planner.hardware import GB, hardware
from hybrid.planner.layout import Cluster, Layout, Recompute, RingSchedule, Workload
from hybrid.planner.model import ActivationProfile
from hybrid.planner.ops import KernelProfile, Stack
from hybrid.planner.published_more import torchtitan_runs
from hybrid.planner.time import ring_step_seconds
from models import load_config

H100x64 = Cluster(gpus=64, hw=hardware("h100-80g"))


def _work(seq: int, ring: RingSchedule | None = None, repeated: bool = False) -> Workload:
    cfg = dataclasses.replace(load_config("llama-3-8b"), max_position_embeddings=seq)  # 32 q heads, 8 kv, d 128
    return Workload(cfg, global_batch=8, seq_length=seq, activations=ActivationProfile.BF16_FLASH,
                    kernels=KernelProfile.FUSED, stack=Stack.PYTORCH, cp_ring=ring, kv_repeated=repeated,
                    fp32_grads=False)


def test_the_workload_names_torchs_ring():
    layout = Layout(tp=8, dp=8)
    assert ring_schedule(_work(8192), layout) is RingSchedule.ACCUMULATOR  # PyTorch stack: this runtime's ring
    assert ring_schedule(_work(8192, RingSchedule.TORCH_ALLGATHER), layout) is RingSchedule.TORCH_ALLGATHER
    with pytest.raises(ValueError, match="cp_ring"):
        _work(8192, ring="torch-allgather")


def test_one_gather_hides_under_one_step_only():
    """tp 8 x cp 8 spans 8 nodes (one NIC each). Forward: the p2p ring sends c - 1 blocks of kv, each under a step
    it outlasts by little or not at all; torch's ring gathers c kv at once under the diagonal step, so it exposes
    gather - fwd. With the step's compute between one kv transfer and the whole gather, the p2p ring's forward hides
    everything and torch's shows gather - fwd, exactly, once per forward (twice under full recomputation)."""
    hw, cp, seq = H100x64.hw, 8, 131072
    s_c = seq // cp
    layout = Layout(tp=8, dp=8, recompute=Recompute.FULL)
    fwd, bwd = ring_step_seconds(_work(seq), H100x64, layout, s_c)
    kv = 2 * 1 * s_c * (8 // 8 * 128) * 2  # K and V of one rank: b s_c x one kv head (8 heads / tp 8) x bf16
    gather = hw.inter_latency_s + (cp - 1) / cp * cp * kv / (hw.inter_node_gbps * GB)
    one_step = hw.inter_latency_s + kv / (hw.inter_node_gbps * GB)
    assert one_step < fwd < gather  # the regime the mechanism is about (a 131k sequence over 8 nodes)
    acc = hw.inter_latency_s + 2 * kv / (hw.inter_node_gbps * GB)  # one step's fp32 dK, dV
    torch = layer_cost(_work(seq, RingSchedule.TORCH_ALLGATHER), H100x64, layout, cp, CommType.P2P)
    expected = 2 * (gather - fwd) + max(0.0, gather - bwd) + (cp - 1) * max(0.0, acc - bwd) + acc
    assert torch.exposed == pytest.approx(expected, rel=1e-9)
    runtime = layer_cost(_work(seq), H100x64, layout, cp, CommType.P2P)  # p2p, only the last accumulator shows
    assert runtime.exposed == pytest.approx(acc, rel=1e-9) and runtime.exposed < torch.exposed
    assert torch.attention == runtime.attention  # the same half blocks at the same flash rate


def test_repeated_kv_moves_the_query_width():
    """torchtitan's Llama repeats K, V to the 32 query heads before SDPA: every CP transfer is a / g = 4 x the
    kv heads' bytes (latency off, so seconds are bytes / bandwidth); the attention is unchanged."""
    hw = dataclasses.replace(H100x64.hw, inter_latency_s=0.0, intra_latency_s=0.0)
    cluster, layout = Cluster(gpus=64, hw=hw), Layout(tp=8, dp=8)
    plain = layer_cost(_work(131072, RingSchedule.TORCH_ALLGATHER), cluster, layout, 8, CommType.P2P)
    repeated = layer_cost(_work(131072, RingSchedule.TORCH_ALLGATHER, True), cluster, layout, 8, CommType.P2P)
    assert repeated.transfer == pytest.approx(4 * plain.transfer, rel=1e-12)
    assert repeated.attention == plain.attention and repeated.buffer_bytes == plain.buffer_bytes


def _merge_bytes_by_loop(x: int, y: int, cp: int) -> tuple[int, int]:
    """torch's loops for cp rank c - 1 (every step i >= 1 has i <= rank: whole query, first key half), walked
    step by step: bf16 2 bytes, fp32 4; an elementwise kernel reads its inputs and writes its output once."""
    fwd = 0
    for i in range(cp):
        if i < cp - 1:
            fwd += 2 * (2 * y) * 2  # torch.cat([key.flatten(), value.flatten()]): read, write
        fwd += x * (2 + 4)  # SDPAMerger.step: block out .to(float32)
        if i > 0:  # _merge_one: out - block_out; sigmoid(.) * that; out - that
            fwd += x * (4 + 4 + 4) + x * (4 + 4) + x * (4 + 4 + 4)
    fwd += x * (4 + 2)  # results(): back to bf16
    bwd = 4 * x + 4 * 2 * y  # zeros_like(..., float32) for dq, dk, dv
    for i in range(cp):
        if i != cp - 1:
            bwd += 2 * (2 * y) * 2  # the K, V concatenation
        if i == 0:
            bwd += 2 * y * (4 + 2 + 4)  # dk, dv += block grads
        else:  # _partial_update(add=True): chunk[0] += new (half), then torch.cat of both halves
            bwd += 2 * (y // 2 * (4 + 2 + 4) + y * (4 + 4))
        bwd += 2 * y * 4 * 2  # torch.cat of fp32 dk, dv for dkv_rotater
        bwd += x * (4 + 2 + 4)  # dq += block dq
    bwd += x * (4 + 2) + 2 * y * (4 + 2)  # dq .to(bf16); received dkv .to(key.dtype)
    return fwd, bwd


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_merge_bytes_follow_torchs_loop(cp):
    x, y = 4096 * 1024, 1024 * 1024
    assert torch_ring_merge_bytes(x, y, cp) == _merge_bytes_by_loop(x, y, cp)


def test_torchtitan_cp_rows_get_slower_by_the_mechanism():
    """torchtitan's published CP rows name torch's ring and the repeated K, V, and each is planned slower than with
    this runtime's ring (the direction torch's code says: one gather under one step, fp32 merges between calls)."""
    for run in torchtitan_runs():
        if getattr(run, "cp", 1) == 1:
            continue
        assert run.workload.cp_ring is RingSchedule.TORCH_ALLGATHER and run.workload.kv_repeated
        mine = run.predict()
        theirs = dataclasses.replace(run, workload=dataclasses.replace(run.workload, cp_ring=None)).predict()
        cluster = Cluster(gpus=run.gpus, hw=run.hardware())
        cost = layer_cost(run.workload, cluster, mine.base.layout, run.cp, CommType.P2P)
        assert cost.merge > 0 and mine.total_s > theirs.total_s
