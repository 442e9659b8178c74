"""The layout planner (hybrid/planner): each formula against its source, the parameter counts against the
runtime's own shards, the pipeline numbers against the schedule simulation, the search against brute force,
and the `hybrid plan` command end to end. Published-number validation: tests/test_planner_reference.py.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import dataclass, replace

import pytest

from hybrid.comm import CommLedger, Group
from hybrid.mesh import Axis, ParallelDims
from hybrid.pipeline import Costs, ScheduleKind, build_schedule, simulate
from hybrid.planner import (Cluster, Layout, Offload, Recompute, SearchSpace, SimulationTooLarge, Workload,
                            ZeroStage, evaluate, hardware, in_flight, model_state_bytes, model_states, plan_memory,
                            run_pipeline, search)
from hybrid.planner.cli import main as plan_main
from hybrid.planner.hardware import (GB, OVERLAP_SLOWDOWN, Collective, GroupPlacement, collective_seconds,
                                     group_bandwidth, wire_bytes)
from hybrid.planner.layout import dp_placement, layout_problems, pipeline_crosses_nodes, tp_placement
from hybrid.planner.predicted_comm import (dp_microbatch_ledger, dp_step_ledger, sp_grad_sync_ledger, step_ledger,
                                   tp_ledger, zero_units)
from hybrid.planner.predicted_memory import layer_activation_bytes, peak_memory, rank_parameters, step_transient_bytes
from hybrid.planner.model import ActivationProfile, Precision, Shard
from hybrid.planner.reference import gpt_model
from hybrid.planner.schedule import StageTimes, _chunk_peak, _in_flight, saturation_m
from hybrid.planner.search import SearchResult, _fitting_variants, _sizes
from hybrid.planner.time import exact_step_flops, megatron_step_flops, step_time
from hybrid.tp import TPContext
from models import build_pipeline_chunks, load_config

A100 = hardware("a100-80g")
ONE_F_ONE_B, INTERLEAVED = ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED


def _work(model="gpt2", batch=64, seq=1024, **kw) -> Workload:
    cfg = load_config(model) if isinstance(model, str) else model
    kw.setdefault("fp32_grads", False)  # bf16 gradients, as these tests were derived (Workload's default to round 23)
    return Workload(cfg, global_batch=batch, seq_length=seq, **kw)


# --- hardware ------------------------------------------------------------------------------------------

def test_presets_state_the_data_sheet_peaks():
    got = {k: (hardware(k).peak_tflops, hardware(k).memory_gb) for k in ("a100-80g", "h100-80g", "h200")}
    assert got == {"a100-80g": (312.0, 80.0), "h100-80g": (989.0, 80.0), "h200": (989.0, 141.0)}
    # what the cards hold (nvidia-smi MiB): an "80 GB" card is 80 GiB-class, ~85.9e9 bytes, not 80e9; the H200's
    # is CUDA's total as measured on one (tests/data/gpu_h200: 615 MiB less than nvidia-smi's 143771 MiB)
    env = json.loads(open(os.path.join(os.path.dirname(__file__), "data", "gpu_h200", "run2_dcd63a0.json")).read())
    capacity = {k: hardware(k).capacity_bytes for k in ("a100-80g", "h100-80g", "h200")}
    assert capacity == {"a100-80g": 81920 * 2**20, "h100-80g": 81559 * 2**20,
                        "h200": env["sections"]["env"]["result"]["total_memory_bytes"]}
    assert A100.with_overrides(memory_gb=40).capacity_bytes == 40e9  # a stated --gpu-memory is taken as stated
    assert A100.achievable_flops == pytest.approx(312e12 * A100.compute_efficiency)


def test_unknown_gpu_and_bad_values_name_the_flag():
    with pytest.raises(ValueError, match="--gpu 'v100'"):
        hardware("v100")
    with pytest.raises(ValueError, match="--gpu-memory"):
        A100.with_overrides(memory_gb=0)
    with pytest.raises(ValueError, match="--compute-efficiency"):
        A100.with_overrides(compute_efficiency=1.5)


@pytest.mark.parametrize("n", [1, 2, 4, 8, 64])
def test_wire_bytes_follow_nccl_tests(n):
    """all-reduce 2(n-1)/n S, all-gather and reduce-scatter (n-1)/n S per rank (nccl-tests PERFORMANCE.md)."""
    assert wire_bytes(Collective.ALL_REDUCE, 1000, n) == pytest.approx(2 * (n - 1) / n * 1000)
    for op in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
        assert wire_bytes(op, 1000, n) == pytest.approx((n - 1) / n * 1000)


def test_group_bandwidth_is_nvlink_inside_a_node_and_shared_nics_across():
    assert group_bandwidth(A100, GroupPlacement(size=8, per_node=8)) == A100.intra_node_gbps * GB
    assert group_bandwidth(A100, GroupPlacement(size=32, per_node=2)) == 2 * A100.inter_node_gbps * GB
    assert group_bandwidth(A100, GroupPlacement(size=64, per_node=8)) == min(230, 8 * 23.5) * GB
    assert collective_seconds(A100, Collective.ALL_REDUCE, 1e9, GroupPlacement(1, 1)) == 0.0
    t = collective_seconds(A100, Collective.ALL_REDUCE, 1e9, GroupPlacement(8, 8))
    assert t == pytest.approx(A100.intra_latency_s + 2 * 7 / 8 * 1e9 / (230 * GB))


# --- layouts ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout,fragment", [
    (Layout(tp=3, dp=2, pp=1), "tp 3 does not divide 32 heads"),
    (Layout(tp=16, dp=1), "tp 16 would span nodes of 8 GPUs (pass --allow-cross-node-tp to allow)"),
    (Layout(tp=1, dp=3, pp=2), "global batch 64 is not divisible by dp 3"),
    (Layout(tp=1, dp=1, pp=40), "pp 40 x v 1 = 40 stages exceed the 32 layers"),
    (Layout(tp=1, dp=1, pp=3), None),  # 32 layers on 3 stages: an uneven split, balanced by hybrid.partition
    (Layout(tp=1, dp=1, pp=2, v=2, micro_batch=1), None),
    (Layout(tp=1, dp=2, pp=1, micro_batch=3), "micro-batch 3 does not divide the 32 sequences per DP replica"),
    (Layout(tp=1, dp=2, sequence_parallel=True), "sequence parallelism needs tp > 1"),
    (Layout(tp=2, dp=1, zero=ZeroStage.OPTIMIZER), "partitions nothing"),
    (Layout(tp=1, dp=2, offload=Offload.OPTIMIZER), "optimizer offload needs ZeRO >= 1"),
    (Layout(tp=1, dp=2, zero=ZeroStage.GRADIENTS, offload=Offload.OPTIMIZER_AND_PARAMS),
     "parameter offload needs ZeRO 3"),
])
def test_layout_problems_say_what_is_wrong(layout, fragment):
    work = _work("llama-3-8b", batch=64)
    problems = layout_problems(work, Cluster(gpus=layout.world, hw=A100), layout)
    if fragment is None:
        assert problems == []
    else:
        assert any(fragment in p for p in problems), problems


def test_layout_rejects_bad_sizes_and_free_strings():
    with pytest.raises(ValueError, match="--micro-batch-size"):
        Layout(micro_batch=0)
    with pytest.raises(ValueError, match="Recompute"):
        Layout(recompute="full")


def _per_node_min(groups: list[list[int]], g: int) -> int:
    """Fewest members any group has in one of its nodes (what limits the ring)."""
    counts = [sum(1 for r in grp if r // g == node) for grp in groups for node in {r // g for r in grp}]
    return min(counts)


@pytest.mark.parametrize("tp,pp,dp", list(itertools.product((1, 2, 4, 8), (1, 2, 4), (1, 2, 4, 8))))
def test_group_placement_matches_the_runtime_rank_order(tp, pp, dp):
    """tp_placement / dp_placement / pipeline_crosses_nodes agree with ParallelDims' groups on 8-GPU nodes."""
    dims, g = ParallelDims(tp=tp, pp=pp, dp=dp), 8
    layout = Layout(tp=tp, pp=pp, dp=dp)
    cluster = Cluster(gpus=dims.world, hw=A100, allow_cross_node_tp=True)
    for axis, placement in ((Axis.TP, tp_placement(cluster, layout)), (Axis.DP, dp_placement(cluster, layout))):
        groups = dims.group_ranks(axis)
        assert placement.per_node == _per_node_min(groups, g)
        assert placement.spans_nodes == any(len({r // g for r in grp}) > 1 for grp in groups)
    crosses = any(a // g != b // g for grp in dims.group_ranks(Axis.PP) for a, b in zip(grp, grp[1:]))
    assert pipeline_crosses_nodes(cluster, layout) == crosses


# --- parameters: equal to the runtime's shards ---------------------------------------------------------

@dataclass
class _Rank0Group(Group):
    """A TP group seen from its rank 0, without processes (layers only read size and rank when built)."""

    @property
    def rank(self) -> int:
        return 0


def _odd_vocab_gpt2():
    return replace(load_config("tiny-gpt2"), vocab_size=251)  # padding to a multiple of tp is exercised


@pytest.mark.parametrize("model", ["tiny-gpt2", "tiny-llama", "tiny-qwen2", "odd-vocab-gpt2"])
def test_parameter_counts_equal_the_runtime_shards(model):
    """Psi per pipeline rank = the parameters build_pipeline_chunks gives TP rank 0, for tp 1/2/4 (kv-heads
    replicated at tp 4 for the Llama / Qwen2 presets), pp 1/2/4 and interleaved v = 2, tied and untied."""
    cfg = _odd_vocab_gpt2() if model == "odd-vocab-gpt2" else load_config(model)
    work = _work(cfg, batch=8, seq=16)
    for t, (pp, v) in itertools.product((1, 2, 4), ((1, 1), (2, 1), (2, 2), (4, 1))):
        group = _Rank0Group(name="tp", ranks=tuple(range(t)), pg=None, ledger=CommLedger())
        real = [sum(p.numel() for p in build_pipeline_chunks(cfg, TPContext(group), r, pp, v, seed=None).parameters())
                for r in range(pp)]
        assert list(rank_parameters(work, Layout(tp=t, pp=pp, v=v))) == real, (t, pp, v)


@pytest.mark.parametrize("model", ["gpt2", "gpt2-xl", "llama-3-8b", "llama-3-70b"])
def test_whole_model_count_equals_model_config(model):
    cfg = load_config(model)
    assert rank_parameters(_work(cfg, seq=128), Layout()) == (cfg.num_parameters,)


# --- activations: Korthikanti et al. 2022, Table 2 ------------------------------------------------------

@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_activations_reproduce_korthikanti_table2(t):
    s, b, h, a = 2048, 2, 4096, 32
    shard = Shard(gpt_model(4, h, a, 51200, s), t, 51200)
    sbh = s * b * h
    rep, split, core = shard.layer_activation_terms(b, s, sp=False)
    assert rep + split + core == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert sum(shard.layer_activation_terms(b, s, sp=True)) == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)))
    if t == 1:
        assert rep + split + core == pytest.approx(sbh * (34 + 5 * a * s / h))
    selective, _ = layer_activation_bytes(shard, b, s, True, Recompute.SELECTIVE)
    assert selective == pytest.approx(sbh * 34 / t)
    full, working = layer_activation_bytes(shard, b, s, False, Recompute.FULL)
    # the rerun re-saves the whole set, but its first tensor (the norm's input) is the kept 2sbh input itself:
    # tests/test_planner_runtime.py measures this peak with the recomputation ledger
    assert (full, working) == (pytest.approx(2 * sbh), pytest.approx(rep + split + core - 2 * sbh))


@pytest.mark.parametrize("t", [1, 8])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_bf16_flash_swaps_the_softmax_for_a_logsumexp(t, dropout):
    """bf16-flash is Korthikanti's count with the attention core 5as^2b/t (or 2as^2b/t without dropout)
    replaced by flash attention's fp32 logsumexp, 4asb/t: linear in s, so selective recomputation saves
    only that and its rerun adds nothing at the peak."""
    s, b, h, a = 8192, 1, 4096, 32
    cfg = replace(gpt_model(4, h, a, 51200, s), dropout=dropout)
    mat, flash = (Shard(cfg, t, 51200, profile) for profile in (ActivationProfile.KORTHIKANTI,
                                                                  ActivationProfile.BF16_FLASH))
    for sp in (False, True):
        *kept, core = mat.layer_activation_terms(b, s, sp)
        assert core == pytest.approx((5 if dropout else 2) * a * s * s * b / t)
        assert flash.layer_activation_terms(b, s, sp) == (*kept, pytest.approx(4 * a * s * b / t))
    assert layer_activation_bytes(flash, b, s, True, Recompute.SELECTIVE)[1] == 0.0
    none, _ = layer_activation_bytes(flash, b, s, True, Recompute.NONE)
    assert none == pytest.approx(s * b * h * (34 if dropout else 32) / t + 4 * a * s * b / t)


# --- FLOPs: Narayanan et al. 2021 eq. (3) --------------------------------------------------------------

@pytest.mark.parametrize("t", [1, 8])
def test_exact_flops_equal_megatron_eq3_for_gpt_shapes(t):
    l, h, a, V, s, B = 24, 2304, 24, 51200, 2048, 512
    work = _work(gpt_model(l, h, a, V, s), batch=B, seq=s)
    assert exact_step_flops(work, t, Recompute.FULL) == pytest.approx(megatron_step_flops(B, s, l, h, V, True))
    assert exact_step_flops(work, t, Recompute.NONE) == pytest.approx(megatron_step_flops(B, s, l, h, V, False))


# --- model states: ZeRO paper ---------------------------------------------------------------------------

@pytest.mark.parametrize("zero", list(ZeroStage))
@pytest.mark.parametrize("dp", [1, 4, 64])
def test_model_states_follow_the_zero_paper(zero, dp):
    psi, k = 1e9, 12
    want = {0: (2 + 2 + k) * psi, 1: 4 * psi + k * psi / dp, 2: 2 * psi + (2 + k) * psi / dp,
            3: (2 + 2 + k) * psi / dp}[int(zero)]
    assert model_state_bytes(psi, zero, dp) == pytest.approx(want)
    assert model_states(psi, zero, dp).device == pytest.approx(want)
    if zero >= ZeroStage.OPTIMIZER:  # offload moves the K Psi / Nd optimizer bytes to the host
        off = model_states(psi, zero, dp, Offload.OPTIMIZER)
        assert (off.device, off.host) == (pytest.approx(want - k * psi / dp), pytest.approx(k * psi / dp))


@pytest.mark.parametrize("zero", list(ZeroStage))
def test_fp32_gradients_price_4_bytes_a_gradient_and_no_step_transient(zero):
    """Workload.fp32_grads (Megatron's main grads): ZeRO 0 (2 + 4 + 12) Psi = 18 Psi, 1: 6 Psi + 12 Psi / Nd,
    2: 2 Psi + 16 Psi / Nd, 3: 18 Psi / Nd; the reduced fp32 gradient is the master gradient, so the step adds
    nothing, where bf16 gradients need a 4 Psi / Nd fp32 copy."""
    psi, dp, k = 1e9, 8, 12
    want = {0: (2 + 4 + k) * psi, 1: 6 * psi + k * psi / dp, 2: 2 * psi + (4 + k) * psi / dp,
            3: (2 + 4 + k) * psi / dp}[int(zero)]
    assert model_states(psi, zero, dp, fp32_grads=True).device == pytest.approx(want)
    assert step_transient_bytes(psi, zero, dp, fp32_grads=True) == 0
    assert step_transient_bytes(psi, zero, dp) == 4 * psi / (dp if zero >= ZeroStage.OPTIMIZER else 1)


def test_fp32_gradients_double_the_dp_gradient_traffic_and_slow_the_step():
    """Same layout, fp32 gradients: the step ledger's DP gradient reduce-scatters carry twice the bytes, the
    parameter all-gathers the same (up to padding: 4-byte gradients fill the 25 MiB buckets twice as fast, so
    there are more units, each padded by < dp elements); the predicted DP time grows and the device memory by
    2 Psi (ZeRO 1)."""
    cfg = load_config("gpt2-medium")
    work, fp32 = (Workload(cfg, global_batch=32, seq_length=1024, fp32_grads=f) for f in (False, True))
    layout = Layout(tp=2, pp=2, dp=2, zero=ZeroStage.OPTIMIZER, recompute=Recompute.FULL)
    a, b = step_ledger(work, layout, 0), step_ledger(fp32, layout, 0)
    units = len(zero_units(fp32, layout, 0))
    assert 0 <= b["reduce_scatter@dp"]["bytes"] - 2 * a["reduce_scatter@dp"]["bytes"] < 4 * layout.dp * units
    assert abs(b["all_gather@dp"]["bytes"] - a["all_gather@dp"]["bytes"]) < 2 * layout.dp * units
    cluster = Cluster(gpus=8, hw=hardware("a100-80g"))
    assert step_time(fp32, cluster, layout).dp_comm > step_time(work, cluster, layout).dp_comm
    psi = rank_parameters(work, layout)[0]
    device = [plan_memory(w, cluster, layout).ranks[0].states.device for w in (work, fp32)]
    assert device[1] - device[0] == pytest.approx(2 * psi)
    with pytest.raises(ValueError, match="--accumulate-allreduce-grads-in-fp32 needs --precision mixed"):
        Workload(cfg, global_batch=32, seq_length=1024, precision=Precision.FP32, fp32_grads=True)


# --- pipeline numbers from the simulation ----------------------------------------------------------------

def _schedule_configs():
    out = [(ONE_F_ONE_B, pp, m, 1) for pp in range(1, 6) for m in range(1, 3 * pp + 2)]
    out += [(INTERLEAVED, pp, m, v) for pp in range(2, 6) for v in (2, 3) for m in (pp, 2 * pp, 3 * pp, 4 * pp)]
    return out


def test_in_flight_equals_the_full_simulation_and_saturates():
    """The compute-only simulation gives the full lists' peaks; beyond the saturation point they stop growing."""
    for kind, pp, m, v in _schedule_configs():
        full = simulate(build_schedule(kind, pp, m, v), Costs(1.0, 2.0, 0.1))
        assert _in_flight(kind, pp, m, v).chunks == full.peak_in_flight, (kind, pp, m, v)
        # in_flight simulates min(m, saturation_m): equal to the full lists beyond that point too
        got = in_flight(kind, pp, m, v)
        assert got.chunks == full.peak_in_flight, (kind, pp, m, v, saturation_m(kind, pp, v))
        assert (got.first_chunk, got.last_chunk) == (_chunk_peak(full, 0, 0), _chunk_peak(full, pp - 1, v - 1))


def _uneven_times(pp: int, v: int) -> StageTimes:
    """Heavier first and last stages (embedding, LM head), a message cost: what the planner feeds."""
    fwd = [1.0 + 0.1 * (s % 3) for s in range(pp * v)]
    bwd = [3.0 - 0.2 * (s % 2) for s in range(pp * v)]
    fwd[-1] += 0.4
    bwd[-1] += 0.7
    return StageTimes(tuple(fwd), tuple(bwd), 0.05)


@pytest.mark.parametrize("kind,pp,v", [(ONE_F_ONE_B, 2, 1), (ONE_F_ONE_B, 3, 1), (ONE_F_ONE_B, 5, 1),
                                       (INTERLEAVED, 2, 2), (INTERLEAVED, 3, 2), (INTERLEAVED, 4, 3)])
def test_extrapolated_makespan_equals_the_full_simulation(kind, pp, v):
    m = 7 * pp
    times = _uneven_times(pp, v)
    run = run_pipeline(kind, pp, m, v, times)
    full = simulate(build_schedule(kind, pp, m, v), Costs(stage_forward=times.forward,
                                                          stage_backward=times.backward, comm=times.comm))
    assert run.extrapolated and max(run.simulated_m) < m
    assert run.makespan == pytest.approx(full.makespan, rel=1e-9)
    assert run.bubble_fraction == pytest.approx(full.bubble_fraction, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("pp,m", [(4, 8), (8, 64), (16, 40)])
def test_uniform_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(pp, m):
    run = run_pipeline(ONE_F_ONE_B, pp, m, 1, StageTimes((1.0,) * pp, (2.0,) * pp, 0.0))
    assert run.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1))


def test_a_schedule_beyond_the_budget_is_refused_with_the_fix():
    """The error names the flag and a value that works: pp (m v)^2 = 16 x 1024^2; with it the run goes through."""
    times = StageTimes((1.0,) * 32, (2.0,) * 32, 0.0)
    with pytest.raises(SimulationTooLarge, match=r"--sim-budget 16777216 "):
        run_pipeline(INTERLEAVED, 16, 512, 2, times, budget=1e3)
    run_pipeline(INTERLEAVED, 16, 512, 2, times, budget=16 * 1024**2)


# --- memory ---------------------------------------------------------------------------------------------

def test_first_stage_holds_pp_microbatches_under_1f1b():
    """Korthikanti Sec. 4.2: under 1F1B rank r holds pp - r micro-batches of its layers' activations."""
    work = _work("gpt2-medium", batch=64, seq=1024)
    layout = Layout(pp=4, dp=2, micro_batch=2, recompute=Recompute.SELECTIVE)
    mem = plan_memory(work, Cluster(8, A100), layout)
    assert mem.in_flight.chunks == (4, 3, 2, 1)
    shard = Shard(work.model, 1, work.padded_vocab(1))
    per_layer, working = layer_activation_bytes(shard, 2, 1024, False, Recompute.SELECTIVE)
    layers = work.model.num_layers // 4
    assert mem.ranks[1].activations == pytest.approx(3 * layers * per_layer + working)
    assert mem.ranks[0].activations == pytest.approx(4 * layers * per_layer + working
                                                     + 4 * shard.embedding_activation_bytes(2, 1024, False))


@pytest.mark.parametrize("layout", [
    Layout(tp=2, pp=2, dp=2, micro_batch=2, zero=ZeroStage.PARAMETERS, offload=Offload.OPTIMIZER_AND_PARAMS),
    Layout(tp=1, pp=4, dp=2, v=3, micro_batch=1, recompute=Recompute.FULL),
    Layout(tp=8, pp=1, dp=1, micro_batch=4, sequence_parallel=True),
])
def test_peak_memory_fast_path_equals_plan_memory(layout):
    work = _work("gpt2-large", batch=32, seq=1024)
    cluster = Cluster(8, A100)
    mem = plan_memory(work, cluster, layout)
    rank, device, host = peak_memory(work, cluster, layout)
    assert (rank, device, host) == (mem.peak.rank, pytest.approx(mem.peak.total), pytest.approx(mem.host_per_node))


# --- communication: the runtime's ledger convention --------------------------------------------------------

@pytest.mark.parametrize("t,sp", [(2, False), (2, True), (4, True)])
def test_tp_ledger_is_the_volume_the_runtime_records(t, sp):
    """The same numbers tests/test_comm_volume.py measures on the runtime (B=2, T=16, L=3, H=32, V=251, fp32)."""
    B, T, L, H, V, POS, BYTES = 2, 16, 3, 32, 251, 64, 4
    cfg = replace(load_config("tiny-gpt2"), num_layers=L, hidden_size=H, head_dim=8, ffn_hidden_size=4 * H,
                  vocab_size=V, max_position_embeddings=POS)
    shard = Shard(cfg, t, math.ceil(V / t) * t)
    got = tp_ledger(shard, B, T, L, True, True, sp, elem_bytes=BYTES)
    bsh, n = B * T * H * BYTES, 2 * L + 1
    loss = {"calls": 3, "bytes": 3 * B * T * 4}
    entry = {"calls": n, "bytes": n * bsh}
    if sp:
        want = {"forward": {"all_gather@tp": entry, "reduce_scatter@tp": entry, "all_reduce@tp": loss},
                "backward": {"all_gather@tp": entry, "reduce_scatter@tp": entry}}
        partial = L * 6 * H + 2 * H + POS * H
        assert sp_grad_sync_ledger(shard, L, True, True, BYTES) == {"all_reduce@tp": {"calls": 1,
                                                                                       "bytes": partial * BYTES}}
    else:
        want = {"forward": {"all_reduce@tp": {"calls": n + 3, "bytes": n * bsh + loss["bytes"]}},
                "backward": {"all_reduce@tp": entry}}
    assert got == want


@pytest.mark.parametrize("n", [2, 8, 64])
def test_dp_volume_is_2psi_and_3psi_for_zero3(n):
    """Wire bytes per rank: ZeRO 0-2 2(n-1)/n x 2 Psi bytes per step (the paper's 2 Psi at m = 1),
    ZeRO 3 1.5x that."""
    psi = 3e8

    def wire(ledger):
        return sum(wire_bytes(Collective(k.split("@")[0]), e["bytes"], n) for k, e in ledger.items())

    base = 2 * (n - 1) / n * 2 * psi
    for zero in (ZeroStage.NONE, ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS):
        micro = dp_microbatch_ledger(psi, zero, n)
        total = wire(dp_step_ledger(psi, zero, n)) + wire(micro["forward"]) + wire(micro["backward"])
        assert total == pytest.approx(base)
    micro = dp_microbatch_ledger(psi, ZeroStage.PARAMETERS, n)
    assert wire(micro["forward"]) + wire(micro["backward"]) == pytest.approx(1.5 * base)
    assert dp_step_ledger(psi, ZeroStage.PARAMETERS, n) == {}


# --- time -------------------------------------------------------------------------------------------------

def test_step_time_parts_add_up_and_recomputation_costs_time():
    work, cluster = _work("gpt2-xl", batch=64, seq=1024), Cluster(16, A100)
    times = {}
    for recompute in Recompute:
        t = step_time(work, cluster, Layout(tp=2, pp=2, dp=4, micro_batch=2, recompute=recompute))
        assert t.total == pytest.approx(t.pipeline + t.dp_comm + t.optimizer + t.other)
        assert t.pipeline >= t.compute + t.tp_comm - 1e-9
        times[recompute] = t.total
    assert times[Recompute.NONE] < times[Recompute.SELECTIVE] < times[Recompute.FULL]


def test_evaluate_refuses_an_impossible_layout_with_every_reason():
    with pytest.raises(ValueError, match="tp 3 does not divide 25 heads") as e:
        evaluate(_work("gpt2-xl"), Cluster(6, A100), Layout(tp=3, dp=2))
    assert "6 GPUs" not in str(e.value)


# --- search ----------------------------------------------------------------------------------------------

def test_search_ranks_by_step_time_and_keeps_the_reasons():
    work = _work("gpt2-medium", batch=32, seq=1024)
    result = search(work, Cluster(8, A100), top=4)
    steps = [p.time.total for p in result.plans]
    assert len(steps) == 4 and steps == sorted(steps)
    assert all(p.memory_gb <= A100.capacity_bytes / 1e9 for p in result.plans)
    assert result.timed >= 4 and result.considered > result.timed
    small = search(work, Cluster(8, A100.with_overrides(memory_gb=4)), top=1)
    assert any(r.reason.startswith("OOM on stage ") and r.reason.endswith("GB of 4") for r in small.rejected)


def test_search_records_tp_that_does_not_divide_the_heads():
    result = search(_work("gpt2-xl", batch=48, seq=512), Cluster(6, A100), top=1)
    reasons = {r.what: r.reason for r in result.rejected}
    assert reasons["tp 3"].startswith("tp 3 does not divide 25 heads")
    assert "tp 2 does not divide 25 heads" in reasons["tp 2"] and "tp 2" not in {p.layout.short() for p in
                                                                               result.plans}
    assert result.plans[0].layout.tp == 1


def test_search_top_1_is_the_fastest_of_every_fitting_layout():
    """Branch and bound against brute force: time every fitting, non-dominated layout and take the fastest."""
    work, cluster = _work("gpt2-medium", batch=16, seq=512), Cluster(8, A100.with_overrides(memory_gb=6))
    best = search(work, cluster, top=1).plans[0]
    scratch = SearchResult()
    candidates = [layout for base in _sizes(work, cluster, SearchSpace(), scratch.rejected)
                  for _, layout in _fitting_variants(work, cluster, SearchSpace(), base, scratch)]
    brute = min(step_time(work, cluster, layout).total for layout in candidates)
    assert best.time.total == pytest.approx(brute)


def test_pinned_dimensions_are_respected():
    space = SearchSpace(tp=(2,), pp=(2,), zero=(ZeroStage.OPTIMIZER,), recompute=(Recompute.FULL,),
                        sequence_parallel=(True,), micro_batch=(2,))
    result = search(_work("gpt2-large", batch=32), Cluster(8, A100), space, top=3)
    assert result.plans and all(
        (p.layout.tp, p.layout.pp, p.layout.zero, p.layout.recompute, p.layout.sequence_parallel,
         p.layout.micro_batch) == (2, 2, ZeroStage.OPTIMIZER, Recompute.FULL, True, 2) for p in result.plans)


# --- the command -------------------------------------------------------------------------------------------

BASE = ["--model", "gpt2-medium", "--gpus", "8", "--global-batch-size", "32", "--seq-length", "1024"]


def test_cli_prints_a_ranked_table(capsys):
    assert plan_main(BASE + ["--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "mem GB" in out and "tokens/s" in out and "MFU" in out and "bubble" in out
    assert out.count(" tp") >= 3 and "searched" in out


def test_cli_json_and_emit_args(capsys):
    assert plan_main(BASE + ["--json", "--top", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["plans"]) == 2 and data["plans"][0]["step_seconds"] <= data["plans"][1]["step_seconds"]
    assert plan_main(BASE + ["--emit-args", "--pipeline-model-parallel-size", "2", "--zero-stage", "1",
                             "--recompute-granularity", "full", "--sequence-parallel"]) == 0
    flags = capsys.readouterr().out.split()
    assert flags[:2] == ["--model", "gpt2-medium"]
    for flag, value in (("--pipeline-model-parallel-size", "2"), ("--zero-stage", "1"),
                        ("--recompute-granularity", "full"), ("--global-batch-size", "32")):
        assert flags[flags.index(flag) + 1] == value
    assert "--sequence-parallel" in flags


@pytest.mark.parametrize("plan_flags, fp32_grads", [([], True), (["--accumulate-allreduce-grads-in-fp32"], True),
                                                     (["--grad-reduce-in-bf16"], False)])
def test_cli_emit_args_and_auto_parallel_pass_the_gradient_dtype_through(capsys, monkeypatch, plan_flags, fp32_grads):
    """`hybrid plan --emit-args` at the default counts fp32 gradients (train.py's --bf16 default, round 23) and
    emits --bf16 alone; --accumulate-allreduce-grads-in-fp32 is accepted and the same; --grad-reduce-in-bf16 is
    emitted as given. train.py --auto-parallel plans the run's own dtype from the same flags."""
    assert plan_main(BASE + ["--emit-args"] + plan_flags) == 0
    flags = capsys.readouterr().out.split()
    assert "--bf16" in flags and "--accumulate-allreduce-grads-in-fp32" not in flags
    assert ("--grad-reduce-in-bf16" in flags) is not fp32_grads
    import hybrid.planner as planner
    from hybrid.train.args import apply_auto_parallel, parse_args
    seen, real = [], planner.search
    monkeypatch.setattr(planner, "search", lambda work, *a, **kw: seen.append(work) or real(work, *a, **kw))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    args = parse_args(["--auto-parallel", "--global-batch-size", "8", "--seq-length", "32", "--bf16"] + plan_flags)
    apply_auto_parallel(args, 2)
    assert [w.fp32_grads for w in seen] == [fp32_grads]


def test_cli_flash_profile_frees_the_score_memory(capsys):
    """`--activation-profile bf16-flash` reaches the plan: at s 4096 the materialised softmax (korthikanti)
    needs more memory on the same pinned layout than flash attention's logsumexp."""
    pin = ["--model", "llama-3-8b", "--gpus", "8", "--global-batch-size", "64", "--seq-length", "4096",
           "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "1", "--zero-stage", "0",
           "--recompute-granularity", "none", "--micro-batch-size", "1", "--json", "--top", "1"]
    mem = {}
    for profile in ("korthikanti", "bf16-flash"):
        assert plan_main(pin + ["--activation-profile", profile]) == 0
        mem[profile] = json.loads(capsys.readouterr().out)["plans"][0]["memory_gb"]
    assert mem["bf16-flash"] < mem["korthikanti"]


def test_cli_model_from_sizes_and_scan(capsys):
    sizes = ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16", "--num-query-groups", "4",
             "--ffn-hidden-size", "5632", "--vocab-size", "32000", "--swiglu", "--global-batch-size", "64",
             "--seq-length", "2048", "--gpu", "h100-80g"]
    assert plan_main(sizes + ["--scan-gpus", "8,16"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[0] == "GPUs" and [ln.split()[0] for ln in lines[1:]] == ["8", "16"]


@pytest.mark.parametrize("argv,fragment", [
    (["--model", "llama-3-405b", "--gpus", "8", "--global-batch-size", "64"], "no layout of the"),
    (["--model", "gpt2", "--gpus", "8", "--global-batch-size", "64", "--tensor-model-parallel-size", "5"],
     "tp 5 does not divide 12 heads"),
    (["--model", "no-such-model", "--gpus", "8", "--global-batch-size", "8"], "neither a preset"),
    (["--model", "gpt2", "--global-batch-size", "8"], "--gpus is required"),
    (["--model", "gpt2", "--gpus", "8", "--global-batch-size", "8", "--seq-length", "4096"], "learned positions"),
    # a batch no layout divides: the fix is the batch, not more memory
    (["--model", "gpt2", "--gpus", "8", "--global-batch-size", "7", "--micro-batch-size", "2",
      "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1"],
     "global batch 7 is not divisible by dp 8. Use a --global-batch-size that the data-parallel size divides"),
])
def test_cli_explains_impossible_requests_without_a_traceback(capsys, argv, fragment):
    assert plan_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hybrid plan: error: ") and fragment in err and "Traceback" not in err


def test_hybrid_command_has_the_plan_subcommand(capsys):
    from hybrid.cli import main as hybrid_main
    hybrid_main(["plan"] + BASE + ["--top", "1"])
    assert "tokens/s" in capsys.readouterr().out


def test_the_shared_compute_bound_counts_compute_not_time_waiting_in_tp_collectives():
    """Ranks sharing a CPU's cores (8 gloo ranks, 2 cores): the pipeline takes at least every rank's compute over
    the cores -- tp d m sum_r compute_r / units, from the stage costs without their TP collectives. A slower
    all-reduce (waiting, not computing) leaves the bound unchanged; it still lengthens the makespan. The step's
    pipeline term is the schedule simulated on the shared cores (round 13), at least the bound and the makespan."""
    import dataclasses

    from hybrid.planner import ActivationProfile, Precision, evaluate, hardware
    from hybrid.planner.schedule import run_shared
    from hybrid.planner.time import _stages, shared_compute_bound, stage_times
    from models import load_config

    cfg = load_config("tiny-gpt2")
    work = Workload(cfg, global_batch=16, seq_length=128, precision=Precision.FP32,
                    activations=ActivationProfile.FP32_FLASH)
    layout = Layout(tp=2, pp=2, dp=2, micro_batch=2)
    base = dataclasses.replace(hardware("cpu"), compute_units=2, gpus_per_node=8)
    bounds, makespans = [], []
    for latency in (1e-4, 1e-2):
        cluster = Cluster(gpus=8, hw=dataclasses.replace(base, intra_latency_s=latency))
        t = evaluate(work, cluster, layout).time
        times = stage_times(work, cluster, layout)[0]
        m = work.num_microbatches(layout)
        bound = shared_compute_bound(cluster, layout, t.run, m, times)
        assert bound == pytest.approx(2 * 2 * m * sum(times.rank_compute) / 2)
        # the pipeline term: the schedule simulated on the shared cores (run_shared), never below either bound
        shared = run_shared(layout.schedule, 2, m, 1, times, _stages(work, cluster, layout).cpu, 4, 2)
        assert t.pipeline == pytest.approx(max(shared, bound)) and shared >= t.run.makespan * (1 - 1e-12)
        bounds.append(bound)
        makespans.append(t.run.makespan)
    assert bounds[0] == pytest.approx(bounds[1]) and makespans[1] > makespans[0]


@pytest.mark.parametrize("zero", [ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS])
def test_zero_1_2_post_step_all_gather_is_priced_as_overlapping_the_next_forward(zero):
    """The runtime's default (ZeroConfig.overlap_param_gather): only the first bucket's gather, and what the
    rest does not fit under the first micro-batch's forward, is exposed; the hidden rest slows the forward under it
    by (1 - 1/sigma) of its seconds (Hardware.overlap_cost, as every hidden collective); ZeRO 1's reduce-scatter
    stays whole."""
    from hybrid.planner.predicted_comm import BUCKET_BYTES
    from hybrid.planner.time import _context, _dp_step_seconds, stage_times

    work = Workload(gpt_model(24, 2048, 16, 51200, 2048), global_batch=64, seq_length=2048, fp32_grads=False)
    cluster = Cluster(gpus=16, hw=hardware("a100-80g"))
    layout = Layout(tp=1, pp=2, dp=8, micro_batch=1, zero=zero)
    t = step_time(work, cluster, layout)
    ctx = _context(work, cluster, layout)
    psi = max(rank_parameters(work, layout))
    pr = work.precision
    gather = ctx.dp_seconds(dp_step_ledger(psi, ZeroStage.GRADIENTS, 8, pr.grad_bytes, pr.param_bytes))
    whole = ctx.dp_seconds(dp_step_ledger(psi, zero, 8, pr.grad_bytes, pr.param_bytes))
    n = math.ceil(pr.param_bytes * psi / BUCKET_BYTES)
    times = stage_times(work, cluster, layout)[0]
    forward = min(times.forward[0], times.forward[1])
    assert n > 1 and gather > 0
    exposed = gather / n + max(0.0, gather * (1 - 1 / n) - forward)
    cost = 1 - 1 / OVERLAP_SLOWDOWN  # the published NCCL-under-GEMM slowdown, not the code's own attribute
    assert t.dp_comm == pytest.approx(whole - gather + exposed + cost * (gather - exposed))
    assert t.dp_comm < whole and _dp_step_seconds(ctx, psi) == pytest.approx(whole)  # no forward: all exposed
