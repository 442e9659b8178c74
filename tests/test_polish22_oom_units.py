"""Round 22: the planner's OOM reasons in the plan table's unit.

On CPU hardware (the cpu preset, a gloo calibration) the table, --plot and --explain give memory in MiB (2^20
bytes: train.py's peak RSS), but a layout rejected because its experts do not fit said "needs 2.0 GB of 2.01" --
GB, and a need that rounds to the capacity read as if it fitted. Now a CPU's reason is MiB, naming the planner's
workspace reserve (the table's RSS leaves it out), to as many places as tell need and capacity apart; a GPU's is
the GB text it was (the stage reason's rule for a need that rounds to the capacity now holds for the experts' too).
The reference is the byte count converted here, not the formatter. In-process: tiny-mixtral, no ranks.
"""

from __future__ import annotations

import re

import pytest

from hybrid.planner import Cluster, Layout, Workload, hardware, moe
from hybrid.planner.cli import main
from hybrid.planner.hardware import GB
from hybrid.planner.layout import ZeroStage
from hybrid.planner.search import memory_problem
from models import load_config

MIB = 2**20
WORK = Workload(load_config("tiny-mixtral"), global_batch=16, seq_length=128, fp32_grads=False)
LAYOUT = Layout(tp=1, pp=1, dp=4, micro_batch=4, zero=ZeroStage.NONE)
CPU_RUN = ["--model", "tiny-mixtral", "--gpus", "4", "--global-batch-size", "16", "--seq-length", "128",
           "--gpu-memory", "2.01", "--expert-model-parallel-size", "1", "--zero-stage", "0", "--show-rejected", "20"]


def _experts_reason(gpu: str, base: float) -> tuple[str, float, float]:
    """The experts' OOM reason beside a dense plan of `base` bytes, the bytes it needs and the device's."""
    cluster = Cluster(gpus=4, hw=hardware(gpu))
    reason = moe.memory_problem(WORK, cluster, LAYOUT, base, pinned=(1,), pinned_etp=(1,))
    return reason, base + moe.expert_plan(WORK, cluster, LAYOUT, 1).extra_bytes, cluster.hw.capacity_bytes


def test_experts_oom_on_a_cpu_is_in_mib():
    reason, need, cap = _experts_reason("cpu", 70e9)
    assert reason == (f"OOM on the experts: even ep 1 needs {need / MIB:,.0f} MiB of {cap / MIB:,.0f} (with the "
                      f"planner's 1,907 MiB workspace reserve)"), reason
    assert "GB" not in reason and cap / MIB == pytest.approx(61035.16)


@pytest.mark.parametrize("base", [90e9, 95.66e9, 120e9])
def test_experts_oom_on_a_gpu_is_the_gb_text_it_was(base):
    reason, need, cap = _experts_reason("h100-80g", base)
    assert reason == f"OOM on the experts: even ep 1 needs {need / GB:.1f} GB of {cap / GB:.4g}"  # round 21's
    assert "MiB" not in reason


def test_stage_oom_on_a_gpu_is_the_gb_text_it_was():
    cluster = Cluster(gpus=4, hw=hardware("h100-80g"))
    assert memory_problem(cluster, 1, 93.1e9, 0.0) == "OOM on stage 1: needs 93.1 GB of 85.52"
    assert memory_problem(cluster, 0, 85.55e9, 0.0) == "OOM on stage 0: needs 85.550 GB of 85.52"  # the excess


def test_a_need_that_rounds_to_the_capacity_shows_its_excess():
    """CPU: 1,913.1 MiB of 1,913.0 (not '1,913 of 1,913'); GPU: the stage reason's '2.011 GB of 2.01' (round 21's
    experts reason read '2.0 GB of 2.01': as if it fitted)."""
    cpu = Cluster(gpus=4, hw=hardware("cpu").with_overrides(memory_gb=1913.04 * MIB / GB))
    assert memory_problem(cpu, 0, 1913.1 * MIB, 0.0).startswith("OOM on stage 0: needs 1,913.1 MiB of 1,913.0 ")
    reason, need, cap = _experts_reason("h100-80g", 0.0)
    gpu = Cluster(gpus=4, hw=hardware("h100-80g").with_overrides(memory_gb=2.01))
    base = 2.01e9 + 1e6 - (need - 0.0)  # the experts overshoot 2.01 GB by 1 MB
    assert moe.memory_problem(WORK, gpu, LAYOUT, base, pinned=(1,), pinned_etp=(1,)) == \
        "OOM on the experts: even ep 1 needs 2.011 GB of 2.01"


def test_hybrid_plan_on_a_cpu_names_the_experts_oom_in_mib(capsys):
    """The command (the cpu preset at 2.01 GB a rank): the rejected layout's line and the table agree on MiB."""
    assert main(CPU_RUN + ["--gpu", "cpu"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "OOM on the experts" in line]
    assert lines and all(re.search(r"needs [\d,.]+ MiB of [\d,.]+ \(with the planner's 1,907 MiB workspace "
                                   r"reserve\)$", line) for line in lines), lines
    assert not re.search(r"OOM.* GB", out) and "RSS MiB" in out


def test_hybrid_plan_on_a_gpu_names_the_experts_oom_in_gb(capsys):
    assert main(CPU_RUN + ["--gpu", "h100-80g"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "OOM on the experts" in line]
    assert lines and all(re.search(r"needs \d+\.\d+ GB of 2\.01$", line) for line in lines), lines
    assert "MiB" not in out


def test_the_closest_cpu_oom_is_the_smallest_mib_need():
    """summarize_rejections' example of an OOM group is the layout that came closest: its parse reads MiB with
    thousands' commas (it read GB only: every CPU need was inf, and the first layout stood as the closest)."""
    from hybrid.planner.search import Rejection, summarize_rejections
    cpu = Cluster(gpus=4, hw=hardware("cpu").with_overrides(memory_gb=1.0))
    rejected = [Rejection(f"layout{i}", memory_problem(cpu, 0, b, 0.0)) for i, b in enumerate((3e9, 2.1e9, 2.5e9))]
    [(count, example)] = summarize_rejections(rejected)
    assert count == 3 and example.what == "layout1", example
    assert example.reason.startswith(f"OOM on stage 0: needs {2.1e9 / MIB:,.0f} MiB of {1e9 / MIB:,.0f} ")


@pytest.mark.parametrize("gpu", ["cpu", "h100-80g"])
def test_schedule_notes_are_in_the_reasons_unit(gpu):
    """The zero-bubble notes beside the table ('fullest stage 8.1 vs 7.0 MiB of tensors', 'zbh1 does not fit (OOM on
    stage 1: needs ...; 1f1b 2.0 GB)') in one unit with their OOM reason: MiB on a CPU, GB (as before) on a GPU."""
    from hybrid.planner import SearchSpace, search
    work = Workload(load_config("tiny-gpt2"), global_batch=16, seq_length=128, fp32_grads=False)
    result = search(work, Cluster(gpus=4, hw=hardware(gpu).with_overrides(memory_gb=2.0089)), SearchSpace(pp=(2,)))
    notes = " ".join(result.notes.values())
    assert notes
    if gpu == "cpu":
        assert re.search(r"fullest stage [\d,.]+ vs [\d,.]+ MiB of tensors", notes) and " GB" not in notes, notes
    else:
        assert re.search(r"needs \d\.\d{3} GB of 2\.009; 1f1b \d\.\d GB\)", notes) and "MiB" not in notes, notes
