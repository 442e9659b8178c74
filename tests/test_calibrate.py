"""`hybrid calibrate` at tiny sizes: the profile it writes round-trips into the planner."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from hybrid.planner import Cluster, Layout, evaluate
from hybrid.planner.calibrate import (FORMAT, CalibrationConfig, bus_bandwidth, calibrate, load_hardware,
                                      save_profile)
from hybrid.planner.cli import main as plan_main
from hybrid.planner.layout import Workload
from hybrid.planner.model import ActivationProfile, Precision
from models import load_config

TINY = CalibrationConfig(ranks=2, matmul_n=64, copy_bytes=2**20, sizes=(8, 4096), seconds=0.02)


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("calibrate") / "cpu.json"
    save_profile(calibrate(TINY, timeout=120), str(path))
    return path


def test_bus_bandwidth_follows_the_nccl_tests_convention():
    algbw, busbw = bus_bandwidth("all_reduce", 8e6, 0.5, 4)
    assert algbw == 16e6 and busbw == pytest.approx(16e6 * 2 * 3 / 4)
    assert bus_bandwidth("all_gather", 8e6, 0.5, 4)[1] == pytest.approx(16e6 * 3 / 4)


def test_profile_records_what_was_measured(profile_path):
    profile = json.loads(profile_path.read_text())
    assert profile["format"] == FORMAT
    hw, measured = profile["hardware"], profile["measured"]
    assert measured["ranks"] == hw["gpus_per_node"] == 2
    assert [e["bytes"] for e in measured["collectives"]["all_reduce"]] == [8, 4096]
    largest = measured["collectives"]["all_reduce"][-1]
    assert hw["intra_node_gbps"] == largest["busbw_gbps"] == pytest.approx(largest["algbw_gbps"] * 2 * 1 / 2)
    assert hw["intra_latency_s"] == measured["collectives"]["all_reduce"][0]["seconds"] > 0
    assert profile["matmul_tflops"]["fp32"] > 0 and hw["compute_efficiency"] == 1.0
    assert hw["compute_units"] == os.cpu_count()  # gloo ranks share this machine's cores


def test_profile_round_trips_into_the_planner(profile_path):
    profile = json.loads(profile_path.read_text())
    hw = load_hardware(str(profile_path), Precision.FP32)
    assert hw.peak_tflops == profile["matmul_tflops"]["fp32"] and hw.achievable_flops == hw.peak_tflops * 1e12
    assert hw.hbm_tbps == profile["hardware"]["hbm_tbps"]
    work = Workload(load_config("tiny-gpt2"), global_batch=8, seq_length=32, precision=Precision.FP32,
                    activations=ActivationProfile.FP32_FLASH)
    plan = evaluate(work, Cluster(gpus=2, hw=hw), Layout(tp=1, pp=2, dp=1, micro_batch=2))
    assert plan.time.total > 0 and plan.memory.peak.states.device > 0


def test_the_elementwise_rate_makes_the_planners_layer_take_the_measured_time(profile_path):
    """Calibrate times one real GPT-2 layer at LAYER_SHAPE and solves for the rate of its memory-bound kernels:
    with that rate the planner's layer (GEMMs on the profile's fp32 curve + the traffic it counts) takes exactly
    the measured forward + backward seconds; a layer no slower than its GEMMs leaves the field None."""
    from hybrid.planner.calibrate import LAYER_SHAPE, elementwise_rate, layer_config
    from hybrid.planner.time import layer_parts

    profile = json.loads(profile_path.read_text())
    measured = profile["measured"]
    assert measured["layer_shape_b_s_h_heads"] == list(LAYER_SHAPE)
    layer = measured["layer_forward_backward_seconds"]
    assert len(layer) == 2 and min(layer) > 0
    hw = load_hardware(str(profile_path), Precision.FP32)
    b, s = LAYER_SHAPE[:2]
    work = Workload(layer_config(), global_batch=b, seq_length=s, precision=Precision.FP32,
                    activations=ActivationProfile.FP32_FLASH)
    gemm_fwd, gemm_bwd, traffic = layer_parts(work, Cluster(gpus=1, hw=hw), Layout(micro_batch=b))
    if hw.elementwise_tbps is None:  # the tiny run's layer ran no slower than its GEMMs
        assert sum(layer) <= gemm_fwd + gemm_bwd
    else:
        assert measured["elementwise_gbps"] == pytest.approx(hw.elementwise_tbps * 1e3)
        assert gemm_fwd + gemm_bwd + traffic / hw.elementwise_bytes_per_s == pytest.approx(sum(layer), rel=1e-12)
    assert elementwise_rate(hw, (gemm_fwd / 2, gemm_bwd / 2)) is None


def test_hybrid_plan_reads_the_profile(profile_path, capsys):
    assert plan_main(["--model", "tiny-gpt2", "--gpus", "2", "--global-batch-size", "8", "--seq-length", "32",
                      "--hardware", str(profile_path), "--precision", "fp32", "--activation-profile",
                      "fp32-flash", "--top", "2"]) == 0
    assert "calibrated" in capsys.readouterr().out


def test_a_file_that_is_not_a_profile_is_refused(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="hybrid calibrate"):
        load_hardware(str(bad))


def test_ranks_sharing_cores_cannot_be_busier_together_than_the_cores(profile_path):
    """With 4 ranks on 1 compute unit the pipeline takes at least the 4 ranks' summed busy time (the bubble
    is not lost: an idle rank's core serves the others); as separate devices it is the simulated makespan."""
    hw = load_hardware(str(profile_path), Precision.FP32)
    work = Workload(load_config("tiny-gpt2"), global_batch=16, seq_length=32, precision=Precision.FP32,
                    activations=ActivationProfile.FP32_FLASH)
    layout = Layout(tp=1, pp=2, dp=2, micro_batch=2)
    alone = evaluate(work, Cluster(gpus=4, hw=dataclasses.replace(hw, compute_units=None, gpus_per_node=4)), layout).time
    shared = evaluate(work, Cluster(gpus=4, hw=dataclasses.replace(hw, compute_units=1, gpus_per_node=4)), layout).time
    assert alone.pipeline == alone.run.makespan
    assert shared.pipeline == pytest.approx(max(shared.run.makespan, 2 * sum(shared.run.busy)))
    assert shared.total > alone.total
