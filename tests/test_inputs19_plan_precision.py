"""Round 18's left-over: `hybrid plan --hardware <a CPU profile from hybrid calibrate> --emit-args` emitted `--bf16`
(and priced the profile's bf16 matmul rate) unless --precision fp32 was given, though train.py's gloo ranks train in
fp32 on a CPU. Now the hardware sets the default: fp32 on a CPU (a profile measured over gloo -- its compute_units,
the cores its ranks share -- or --gpu cpu), mixed on GPUs; an explicit --precision still wins. In-process, on a
hand-written profile of each kind (no calibration run)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hybrid.planner import cli as plan_cli
from hybrid.planner import hardware
from hybrid.planner.profile import FORMAT

FP32_TFLOPS, BF16_TFLOPS = 0.05, 0.02  # a CPU's bf16 GEMMs are slower than its fp32 ones (no bf16 units)
PLAN = ["--model", "tiny-gpt2", "--gpus", "2", "--global-batch-size", "8", "--seq-length", "32", "--emit-args"]


def _profile(tmp_path, preset: str, compute_units: int | None, name: str):
    hw = dataclasses.replace(hardware(preset), compute_units=compute_units, name=name)
    path = tmp_path / f"{preset}.json"
    path.write_text(json.dumps({"format": FORMAT, "hardware": dataclasses.asdict(hw),
                                "matmul_tflops": {"fp32": FP32_TFLOPS, "bf16": BF16_TFLOPS},
                                "matmul_overhead_s": {"fp32": 1e-5, "bf16": 2e-5}}))
    return str(path)


@pytest.fixture
def cpu_profile(tmp_path):
    """As `hybrid calibrate --ranks 2` writes on a 2-core machine: gloo ranks sharing 2 cores."""
    return _profile(tmp_path, "cpu", 2, "calibrated host (2 x gloo)")


def _emitted(argv, capsys) -> list[str]:
    assert plan_cli.main(argv) == 0
    return capsys.readouterr().out.split()


def test_a_cpu_profile_plans_fp32_by_default_and_emits_no_bf16(cpu_profile, capsys):
    assert "--bf16" not in _emitted(PLAN + ["--hardware", cpu_profile], capsys)
    args = _parse(PLAN + ["--hardware", cpu_profile])
    assert plan_cli.cluster_from_args(args, 2).hw.peak_tflops == FP32_TFLOPS  # the fp32 rate, not the bf16


def test_an_explicit_precision_still_wins_on_a_cpu_profile(cpu_profile, capsys):
    assert "--bf16" in _emitted(PLAN + ["--hardware", cpu_profile, "--precision", "mixed"], capsys)
    assert "--bf16" not in _emitted(PLAN + ["--hardware", cpu_profile, "--precision", "fp32"], capsys)


def test_the_cpu_preset_defaults_to_fp32_and_gpus_to_mixed(tmp_path, capsys):
    assert "--bf16" not in _emitted(PLAN + ["--gpu", "cpu"], capsys)
    assert "--bf16" in _emitted(PLAN, capsys)  # the a100-80g preset
    gpu = _profile(tmp_path, "h100-80g", None, "calibrated host (8 x nccl)")  # a GPU profile: no shared cores
    assert "--bf16" in _emitted(PLAN + ["--hardware", gpu], capsys)


def _parse(argv):
    import argparse
    parser = argparse.ArgumentParser()
    plan_cli.add_arguments(parser)
    return parser.parse_args(argv)
