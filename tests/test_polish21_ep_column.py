"""Round 21 (newuser21's open finding): the plain `hybrid plan` table of an MoE model did not say which
expert-parallel size the plan chose (ep 1 here), nor did --emit-args (sizes 1 were left out as train.py's defaults).
An MoE model's layout cell ends in the chosen ep (and etp when > 1), as the --context-parallel-size table writes it,
and its flags name both sizes; a dense model's table and flags are as before (docs/planner.md quotes its header).
In-process: the planner's search (~0.2 s each)."""

from __future__ import annotations

from hybrid.planner import Cluster, Workload, hardware, search
from hybrid.planner.cli import _header, _report, train_args
from hybrid.planner.context import ContextPlan
from models import load_config

# docs/planner.md's Llama-3-70B table header (a dense model; tests/test_docs_commands.py checks its rows)
DENSE_HEADER = " #  layout                             mem GB   step s   tokens/s  TFLOP/s    MFU  bubble"


def _result(model: str, gpu: str = "h100-80g"):
    work = Workload(load_config(model), global_batch=16, seq_length=128, fp32_grads=False)
    cluster = Cluster(gpus=4, hw=hardware(gpu))
    return work, cluster, search(work, cluster, top=3)


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line[:2].strip().isdigit() and line[2:4] == "  "]


def test_an_moe_table_names_the_chosen_ep_as_the_cp_table_does():
    for gpu in ("h100-80g", "cpu"):
        work, cluster, result = _result("tiny-mixtral", gpu)
        text = _report(work, cluster, result, 3, baseline=200 * 2**20 if gpu == "cpu" else None)
        assert "ep: the experts' expert-parallel size (--expert-model-parallel-size)" in text.splitlines()[1]
        rows = _rows(text)
        assert len(rows) == len(result.plans) == 3
        for row, plan in zip(rows, result.plans):
            cell = f"{plan.layout.short()} ep{plan.experts.ep}" + (
                f" etp{plan.experts.etp}" if plan.experts.etp > 1 else "")
            assert row[4:].startswith(cell + " "), (row, plan.experts)
            assert cell == ContextPlan(1, None, plan, 0.0, 0.0, 0.0, 0.0, 0.0).short()  # the CP table's cell (cp 1)


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
    for row, plan in zip(_rows("\n".join(lines)), result.plans):
        assert row[4:].startswith(plan.layout.short() + " ") and " ep" not in row, row
    assert _header(len("tp4 pp2 dp8 v4 b1 z1 sp selective")) == DENSE_HEADER
    assert not [f for f in train_args(work, result.plans[0]) if "expert" in f]
