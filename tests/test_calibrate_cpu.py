"""More ranks than cores (issue 26, the main job: 8 gloo ranks on 2 cores): the cores do the collectives' CPU work
as well as the compute. `hybrid calibrate` measures gloo's CPU seconds per call, per message and per byte on
pairs of ranks; the planner's shared-compute bound adds them for every collective and message of the step."""

from __future__ import annotations

import dataclasses
import time

import pytest

from hybrid.planner import ActivationProfile, Cluster, Layout, Precision, Workload, evaluate
from hybrid.planner.calibrate import CPU_CLOCK, _timed, block_median, fit_comm_cpu, solo_clock
from hybrid.planner.hardware import GpuKind, hardware
from hybrid.planner.ops import KernelProfile
from hybrid.planner.time import STEP_SCALAR_ALL_REDUCES, comm_cpu_seconds, stage_times
from models import PRESETS

import torch

MAIN_JOB = Layout(tp=2, pp=2, dp=2, micro_batch=2)  # README: tp 2 x pp 2 x dp 2, micro-batch 2, global batch 16


def main_job() -> Workload:
    return Workload(PRESETS["tiny-gpt2"], global_batch=16, seq_length=128, precision=Precision.FP32,
                    activations=ActivationProfile.FP32_FLASH, kernels=KernelProfile.EAGER)


def cpu(**fields) -> "object":
    """A 2-core CPU of 8 gloo ranks with the given gloo CPU costs (the cpu preset's other fields)."""
    return dataclasses.replace(hardware(GpuKind.CPU), gpus_per_node=8, compute_units=2, **fields)


def test_comm_cpu_counts_every_collective_and_message_of_the_main_job():
    """Per rank and step, counted by hand from Megatron's layer (2 all-reduces forward, 2 backward), m = 4
    micro-batches of 2 layers a stage: stage 0 + the embedding's forward all-reduce, stage 1 + the LM-head
    input's backward one and the vocab-parallel cross-entropy's 3; a message out and one in per micro-batch
    (activation forward and its gradient back); the DP gradient all-reduce in 2 buckets and the tied embedding's
    gradient all-reduce; and train.py's 7 scalar all-reduces. Each pair all-reduce costs c, a message p."""
    c, p = 1e-3, 5e-4
    hw = cpu(collective_cpu_s=c, p2p_cpu_s=p)
    work, cluster = main_job(), Cluster(gpus=8, hw=hw)
    m = 4
    tp_calls = [m * (4 * 2 + 1), m * (4 * 2 + 1 + 3)]
    dp_calls, tied, messages, scalars = 2, 1, 2 * m, len(STEP_SCALAR_ALL_REDUCES)
    for r in range(2):
        expected = (tp_calls[r] + dp_calls + tied + scalars) * c + messages * p
        assert comm_cpu_seconds(work, cluster, MAIN_JOB, r) == pytest.approx(expected, rel=1e-12)
    # per byte: each TP all-reduce of a pair moves its b s h x 4 bytes once (2(n-1)/n = 1)
    per_byte = cpu(comm_cpu_s_per_byte=1e-9)
    tp_bytes = tp_calls[0] * 2 * 128 * 64 * 4
    assert comm_cpu_seconds(work, Cluster(gpus=8, hw=per_byte), MAIN_JOB, 0) > tp_bytes * 1e-9


def test_a_ring_over_more_ranks_costs_its_steps_and_gpus_cost_nothing():
    """An all-reduce over n ranks takes 2(n - 1) ring steps to a pair's 2: tp 4 costs 3x a pair per TP call.
    Devices that do not share compute units (GPUs), or a profile without the fields, add no CPU."""
    work = main_job()
    hw = cpu(collective_cpu_s=1e-3)
    two = comm_cpu_seconds(work, Cluster(gpus=8, hw=hw), Layout(tp=2, pp=1, dp=4, micro_batch=2), 0)
    four = comm_cpu_seconds(work, Cluster(gpus=8, hw=hw), Layout(tp=4, pp=1, dp=2, micro_batch=2), 0)
    assert four > two
    assert comm_cpu_seconds(work, Cluster(gpus=8, hw=cpu()), MAIN_JOB, 0) == 0.0
    gpu = dataclasses.replace(hardware(GpuKind.H100_80G), collective_cpu_s=1e-3, p2p_cpu_s=1e-3)
    assert comm_cpu_seconds(work, Cluster(gpus=8, hw=gpu), MAIN_JOB, 0) == 0.0


def test_the_oversubscribed_step_takes_at_least_the_nodes_cpu_seconds_over_its_cores():
    """With the gloo costs the step is at least (compute + collectives' CPU of all 8 ranks) / 2 cores + the
    optimizer, and the costs make it longer than without them -- the missing CPU of the main job."""
    work, cost = main_job(), dict(collective_cpu_s=4e-4, p2p_cpu_s=4e-4, comm_cpu_s_per_byte=2e-10)
    base = cpu(peak_tflops=0.1, elementwise_tbps=0.005, layer_forward_overhead_s=2e-3,
               layer_backward_overhead_s=1e-3, intra_latency_s=1e-4)
    with_cpu = dataclasses.replace(base, **cost)
    t0 = evaluate(work, Cluster(gpus=8, hw=base), MAIN_JOB).time
    t1 = evaluate(work, Cluster(gpus=8, hw=with_cpu), MAIN_JOB).time
    times = stage_times(work, Cluster(gpus=8, hw=with_cpu), MAIN_JOB)[0]
    m = work.num_microbatches(MAIN_JOB)
    node = 4 * (m * sum(times.rank_compute) + sum(comm_cpu_seconds(work, Cluster(gpus=8, hw=with_cpu), MAIN_JOB, r)
                                                  for r in range(2)))
    assert t1.total >= node / 2 + t1.optimizer - 1e-12
    assert t1.total > t0.total
    assert sum(v for _, v in t1.terms) == pytest.approx(t1.total, rel=1e-12)  # --explain's terms still add up


def test_two_ranks_on_two_cores_are_unchanged():
    """No more ranks than cores (the 2-rank ranking check): nothing is shared, the costs change nothing."""
    work = main_job()
    lay = Layout(tp=2, pp=1, dp=1, micro_batch=2)
    base = dataclasses.replace(cpu(), gpus_per_node=2)
    costly = dataclasses.replace(base, collective_cpu_s=1e-3, p2p_cpu_s=1e-3, comm_cpu_s_per_byte=1e-9)
    assert (evaluate(work, Cluster(gpus=2, hw=base), lay).time.total
            == evaluate(work, Cluster(gpus=2, hw=costly), lay).time.total)


def test_fit_comm_cpu_takes_medians_the_call_and_the_byte():
    rows = [{"tp_layer": [(49152, c)], "send_recv": [(8, p), (2**20, p + 2**20 * 1e-9)]}
            for c, p in ((4e-4, 3e-4), (5e-4, 3e-4), (6e-4, 3e-4))] + [None]
    fit = fit_comm_cpu(rows)
    assert fit["p2p_cpu_s"] == pytest.approx(3e-4)
    assert fit["comm_cpu_s_per_byte"] == pytest.approx(1e-9 * 2**20 / (2**20 - 8))
    assert fit["collective_cpu_s"] == pytest.approx(5e-4 - 49152 * fit["comm_cpu_s_per_byte"])


def test_probes_alone_are_timed_on_the_cpu_clock():
    """A CPU rank's probes count its CPU seconds: a call that sleeps costs none (wall would count the sleep,
    and on a loaded machine the time the rank waits for a core)."""
    assert solo_clock(torch.device("cpu")) is CPU_CLOCK
    assert _timed(lambda: time.sleep(0.01), 0.0, min_calls=2, clock=CPU_CLOCK) < 0.005
    assert _timed(lambda: time.sleep(0.01), 0.0, min_calls=2) >= 0.01


def test_a_stalled_block_does_not_move_the_block_median():
    """calibrate's CPU probes keep the median of their blocks (round 10: one block is one draw of the scheduler):
    a block that met a 10x stall leaves it where the others are; the mean of the blocks would move by 1.8x."""
    assert block_median([1.0, 1.0, 1.0, 1.0, 10.0]) == 1.0
    assert block_median([2.0, 1.0, 3.0]) == 2.0
    with pytest.raises(ValueError, match="no blocks"):
        block_median([])

