"""Round 21 (newuser21's open finding): the plain `hybrid plan` table of an MoE model did not say which
expert-parallel size the plan chose (ep 1 here), nor did --emit-args (sizes 1 were left out as train.py's defaults).
An MoE model's table has `ep etp` columns and its flags name both sizes; a dense model's table and flags are as
before (docs/planner.md quotes its header). In-process: the planner's search (~0.2 s each)."""

from __future__ import annotations

from hybrid.planner import Cluster, Workload, hardware, search
from hybrid.planner.cli import _header, _report, train_args
from models import load_config

# docs/planner.md's Llama-3-70B table header (a dense model; tests/test_docs_commands.py checks its rows)
DENSE_HEADER = " #  layout                             mem GB   step s   tokens/s  TFLOP/s    MFU  bubble"


def _result(model: str, gpu: str = "h100-80g"):
    work = Workload(load_config(model), global_batch=16, seq_length=128)
    cluster = Cluster(gpus=4, hw=hardware(gpu))
    return work, cluster, search(work, cluster, top=3)


def test_an_moe_table_names_the_chosen_ep_and_etp():
    for gpu in ("h100-80g", "cpu"):
        work, cluster, result = _result("tiny-mixtral", gpu)
        lines = _report(work, cluster, result, 3, baseline=200 * 2**20 if gpu == "cpu" else None).splitlines()
        header = next(line for line in lines if line.startswith(" #  layout"))
        assert header.split()[2:4] == ["ep", "etp"], header
        assert "ep etp: the experts' expert-parallel and expert-TP sizes" in lines[1]
        for i, plan in enumerate(result.plans):
            row = next(line for line in lines if line.startswith(f"{i + 1:>2}  {plan.layout.short()} "))
            cells = row[len(f"{i + 1:>2}  {plan.layout.short()}"):].split()
            assert cells[:2] == [str(plan.experts.ep), str(plan.experts.etp)], (row, plan.experts)


def test_moe_flags_name_ep_and_etp_even_at_1():
    work, _, result = _result("tiny-mixtral")
    plan = result.plans[0]
    assert (plan.experts.ep, plan.experts.etp) == (1, 1)  # the finding's case: the default sizes chosen
    flags = train_args(work, plan)
    assert flags[flags.index("--expert-model-parallel-size") + 1] == "1"
    assert flags[flags.index("--expert-tensor-parallel-size") + 1] == "1"


def test_a_dense_table_and_its_flags_are_unchanged():
    work, cluster, result = _result("tiny-llama")
    lines = _report(work, cluster, result, 3).splitlines()
    assert lines[1] == ("layout: tp pp dp v(chunks/rank) b(micro-batch) z(ZeRO) [offload] [sp] recompute; "
                        "TFLOP/s per GPU incl. recomputation; MFU without")
    assert lines[2].split() == ["#", "layout", "mem", "GB", "step", "s", "tokens/s", "TFLOP/s", "MFU", "bubble"]
    assert _header(len("tp4 pp2 dp8 v4 b1 z1 sp selective")) == DENSE_HEADER
    assert not [f for f in train_args(work, result.plans[0]) if "expert" in f]
