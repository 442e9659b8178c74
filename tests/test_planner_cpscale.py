"""Issue 26, round 8: what context parallelism and Megatron-core's DP overlap cost in the planner.

CP (hybrid/planner/context.py): with Megatron's two chunks a rank, causal ring attention is load-balanced -- every
ring step is half an (s/c)^2 block, so each rank does 1/c of the sequence's causal attention, priced like the plain
step's own attention; each transfer runs under one step's compute and only what outlasts it shows; Transformer
Engine's ring (the Megatron stack) sends dK, dV with the next K, V, so no transfer is left after the loop, where the
runtime's (and torch's) last fp32 accumulator is. DP (time._dp_step_seconds): `overlap_grad_reduce` hides the
gradient reduction under the last micro-batch's backward, but for its last bucket and the compute it slows.
Expected values come from FLOP counts and byte counts written out here, not from the code under test."""

from __future__ import annotations

import dataclasses
import math

import pytest

from hybrid.cp.attention import CommType
from hybrid.planner.context import RingSchedule, _ring, evaluate_cp, layer_cost, ring_schedule
from hybrid.planner.hardware import GB, hardware
from hybrid.planner.layout import Cluster, Layout, Recompute, Workload, ZeroStage
from hybrid.planner.model import ActivationProfile
from hybrid.planner.ops import KernelProfile, Stack
from hybrid.planner.published_more import mcore_weak_runs, more_runs
from hybrid.planner.search import evaluate
from hybrid.planner.time import FLASH_BACKWARD, _context, _dp_step_seconds
from models import load_config

H100x64 = Cluster(gpus=64, hw=hardware("h100-80g"))
P2P_RINGS = (RingSchedule.ACCUMULATOR, RingSchedule.TRAVELLING)  # _ring's (torch's ring: test_planner_torchring)


def _work(seq: int, stack: Stack = Stack.MEGATRON, batch: int = 8) -> Workload:
    cfg = dataclasses.replace(load_config("llama-3-8b"), max_position_embeddings=seq)
    return Workload(cfg, global_batch=batch, seq_length=seq, activations=ActivationProfile.BF16_FLASH,
                    kernels=KernelProfile.FUSED, stack=stack, fp32_grads=False)


def _flash_seconds(flops: float, hw) -> float:
    """Flash attention at the H100 preset's rate on the Megatron stack (no eager clock): FLOPs / (share x peak)."""
    return flops / (hw.flash_efficiency * hw.peak_tflops * 1e12)


@pytest.mark.parametrize("recompute", [Recompute.NONE, Recompute.FULL])
def test_cp_attention_is_c_minus_one_half_blocks_at_the_flash_rate(recompute):
    """Llama 3 8B (32 heads of 128) at tp 8, s 131072, cp 8: each of the 7 other ring steps attends a rank's 16384
    queries to half of another rank's 16384 keys: 2 b s_c^2 a_t d FLOPs forward (QK^T and PV, 2 FLOPs a
    multiply-add, over half the s_c x s_c pairs), x FLASH_BACKWARD backward, once more when recomputed. A full
    block (the old count) or the GEMM curve would not give this."""
    work, cp = _work(131072), 8
    layout = Layout(tp=8, dp=8, recompute=recompute)  # the reduced layout: dp x cp
    s_c, heads, d = 131072 // cp, 32 // 8, 128
    forward = _flash_seconds(2.0 * s_c * s_c * heads * d, H100x64.hw)
    passes = 1 + FLASH_BACKWARD + (recompute is Recompute.FULL)
    cost = layer_cost(work, H100x64, layout, cp, CommType.P2P)
    assert cost.attention == pytest.approx((cp - 1) * passes * forward, rel=1e-12)


def test_load_balanced_ring_moves_no_attention_work():
    """Llama 3 8B, s 65536, 8 sequences on 64 H100 at tp 8: plain (d 8, a sequence a rank) and cp 4 (d 2, four
    ranks a sequence, four sequences a rank). Causal work splits evenly over a CP group, so a rank's attention --
    its own causal block (the reduced plan's term) plus its c - 1 ring steps (CP's extra, all attention here: TE's
    ring hides every transfer at this length) -- equals the plain plan's for the same tokens a GPU. Full blocks
    would make it (2c - 1) / c = 1.75 x."""
    work, cp = _work(65536, batch=8), 4
    plain = evaluate(work, H100x64, Layout(tp=8, dp=8))
    plan = evaluate_cp(work, H100x64, Layout(tp=8, dp=2), cp)
    cost = layer_cost(work, H100x64, plan.base.layout, cp, CommType.P2P)
    assert cost.exposed == 0.0 and plan.extra_s == pytest.approx(4 * 32 * cost.attention, rel=1e-12)  # m x layers
    per_rank = plan.base.time.term("attention") + plan.extra_s
    assert per_rank == pytest.approx(plain.time.term("attention"), rel=1e-9)


def test_ring_exposes_only_what_outlasts_each_step():
    """One ring step's transfer is hidden under that step's compute: exposed = sum of max(0, transfer - compute).
    Long compute: TE's ring hides everything, the accumulator ring shows only its last fp32 dK, dV; no compute:
    everything shows."""
    hw, kv_elements, cp = hardware("h100-80g"), 10**8, 4
    for schedule in P2P_RINGS:
        transfer, hidden_all, _ = _ring(hw, True, kv_elements, cp, 1e3, 1e3, False, schedule)
        _, exposed_all, _ = _ring(hw, True, kv_elements, cp, 0.0, 0.0, False, schedule)
        assert exposed_all == pytest.approx(transfer, rel=1e-12)
        last = hw.inter_latency_s + kv_elements * 4 / (hw.inter_node_gbps * GB)  # the fp32 accumulator, after the loop
        assert hidden_all == (0.0 if schedule is RingSchedule.TRAVELLING else pytest.approx(last, rel=1e-12))
    kv_s = hw.inter_latency_s + 2 * kv_elements / (hw.inter_node_gbps * GB)  # one K, V transfer in bf16
    _, exposed, _ = _ring(hw, True, kv_elements, cp, kv_s / 2, 1e3, False, RingSchedule.TRAVELLING)
    assert exposed == pytest.approx((cp - 1) * kv_s / 2, rel=1e-12)  # forward: each step shows half its transfer


@pytest.mark.parametrize("schedule", P2P_RINGS)
def test_ring_bytes_per_schedule(schedule):
    """Bytes on the wire (latency 0, so seconds x bandwidth = bytes), kv = a rank's bf16 K and V: forward c - 1 kv;
    backward TE 2 (c - 1) kv (dK, dV in bf16 travel with the next K, V), the runtime's ring (c - 1) kv plus c fp32
    accumulators (2 kv each: hybrid/cp/ring.py ring_bytes)."""
    hw = dataclasses.replace(hardware("h100-80g"), inter_latency_s=0.0)
    kv_elements, cp = 10**8, 8
    kv = 2 * kv_elements
    transfer, _, _ = _ring(hw, True, kv_elements, cp, 0.0, 0.0, False, schedule)
    backward = 2 * (cp - 1) * kv if schedule is RingSchedule.TRAVELLING else (cp - 1) * kv + cp * 2 * kv
    assert transfer * hw.inter_node_gbps * GB == pytest.approx((cp - 1) * kv + backward, rel=1e-12)


def test_the_stack_picks_the_ring():
    layout = Layout(tp=8, dp=8)
    assert ring_schedule(_work(8192, Stack.MEGATRON), layout) is RingSchedule.TRAVELLING
    assert ring_schedule(_work(8192, Stack.PYTORCH), layout) is RingSchedule.ACCUMULATOR
    long_ = {st: layer_cost(_work(131072, st), H100x64, layout, 8, CommType.P2P) for st in Stack}
    assert long_[Stack.MEGATRON].exposed == 0.0 < long_[Stack.PYTORCH].exposed


def _zero1(overlap: bool, psi: float = 1e9, slowdown: float = 1.73):
    work = dataclasses.replace(_work(4096), fp32_grads=True, overlap_grad_reduce=overlap)
    cluster = Cluster(gpus=384, hw=dataclasses.replace(hardware("h100-80g"), overlap_slowdown=slowdown))
    return lambda zero, fwd, bwd: _dp_step_seconds(_context(work, cluster, Layout(tp=8, dp=48, zero=zero)), psi,
                                                   fwd, bwd)


def test_overlap_grad_reduce_hides_all_but_the_last_bucket_and_costs_the_compute_under_it():
    """ZeRO 1 at d 48: the reduce-scatter (4 Psi bytes) = ZeRO 1's DP step - ZeRO 2's (the same all-gather alone).
    Hidden under a long last backward: all but its last of n = ceil(4 Psi / 25 MiB) buckets, each hidden second
    costing 1 - 1/1.73 of one; with no backward to hide under, nothing changes; off, nothing changes."""
    psi, slowdown = 1e9, 1.73
    on, off = _zero1(True, psi, slowdown), _zero1(False, psi, slowdown)
    reduce = off(ZeroStage.OPTIMIZER, 0.0, 0.0) - off(ZeroStage.GRADIENTS, 0.0, 0.0)
    n = math.ceil(4 * psi / (25 * 2**20))
    hidden = reduce * (1 - 1 / n)
    want = off(ZeroStage.OPTIMIZER, 0.0, 0.0) - hidden + hidden * (1 - 1 / slowdown)
    assert on(ZeroStage.OPTIMIZER, 0.0, math.inf) == pytest.approx(want, rel=1e-12)
    assert on(ZeroStage.OPTIMIZER, 0.0, 0.0) == pytest.approx(off(ZeroStage.OPTIMIZER, 0.0, 0.0), rel=1e-12)
    assert off(ZeroStage.OPTIMIZER, 0.0, math.inf) == off(ZeroStage.OPTIMIZER, 0.0, 0.0)
    half = on(ZeroStage.OPTIMIZER, 0.0, hidden / 2)  # half of it fits under the backward
    assert half == pytest.approx(off(ZeroStage.OPTIMIZER, 0.0, 0.0) - hidden / 2 / slowdown, rel=1e-12)
    assert on(ZeroStage.GRADIENTS, 0.0, math.inf) == off(ZeroStage.GRADIENTS, 0.0, math.inf)  # ZeRO 2: per micro-batch


def test_the_hidden_parameter_gather_costs_the_forward_under_it():
    """ZeRO 1-2's post-step all-gather (2 Psi bytes, ZeRO 2's whole DP step) under a long first forward: all but
    its first of n = ceil(2 Psi / 25 MiB) buckets hidden, each hidden second costing the forward 1 - 1/sigma of one
    (NCCL's CTAs under the GEMMs, as for the hidden reduce-scatter above); free at sigma = 1 (a CPU)."""
    psi = 1e9
    gather = _zero1(False, psi)(ZeroStage.GRADIENTS, 0.0, 0.0)  # no forward: all of it exposed
    hidden = gather * (1 - 1 / math.ceil(2 * psi / (25 * 2**20)))
    for slowdown in (1.0, 1.73):
        under = _zero1(False, psi, slowdown)(ZeroStage.GRADIENTS, math.inf, 0.0)
        assert under == pytest.approx(gather - hidden + hidden * (1 - 1 / slowdown), rel=1e-12)
    half = _zero1(False, psi)(ZeroStage.GRADIENTS, hidden / 2, 0.0)  # half of it fits under the forward
    assert half == pytest.approx(gather - hidden / 2 / 1.73, rel=1e-12)


def test_only_the_runs_that_state_it_overlap_the_gradient_reduction():
    """Megatron-core's weak-scaling benchmark states --overlap-grad-reduce (README "Performance Benchmarking"), and
    round 24 plans NeMo 24.07's Nemotron-340B with its config's `overlap_grad_sync: True`
    (published24b_pipelines.as_stated); no other row of published_more states it."""
    mcore = {r.name for r in mcore_weak_runs()}
    stating = mcore | {"NeMo 24.07 Nemotron-340B FP8, 128 H100, t8 p8 v12, b1, GBS 32"}
    assert mcore and all(r.workload.overlap_grad_reduce is (r.name in stating) for r in more_runs())
