"""Round 21 (newuser21's open finding): `hybrid plan --explain` on CPU hardware printed the experts' memory in GB
with the planner's 2 GB GPU reserve in it ("2.01 GB" a row) while the table above says the fullest rank's peak RSS
in MiB. On a CPU the experts line and every (ep, etp) row are now the table's unit and figure -- the chosen row's
RSS is the table's cell (the table's RSS counts the experts too: it left their bytes out) -- and a GPU preset's
--explain is the GB text it was. In-process: the planner's search of tiny-mixtral (~0.2 s)."""

from __future__ import annotations

import re

from hybrid.planner import Cluster, Workload, hardware, search
from hybrid.planner.cli import _memory, _report, explain, main
from hybrid.planner.hardware import GB
from models import load_config

MIB = 2**20
BASELINE = 200 * MIB  # a process's resident bytes, fixed (cli._baseline measures it)


def _plan(gpu: str):
    work = Workload(load_config("tiny-mixtral"), global_batch=16, seq_length=128, fp32_grads=False)
    cluster = Cluster(gpus=4, hw=hardware(gpu))
    return work, cluster, search(work, cluster, top=1)


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"\s+ep \d+\s+etp \d+ ", line)]


def test_explain_on_a_cpu_gives_the_experts_memory_as_the_tables_rss_mib():
    work, cluster, result = _plan("cpu")
    plan = result.plans[0]
    text = explain(work, cluster, plan, BASELINE)
    experts = text[text.index("  + experts:"):]
    assert " GB beside" not in experts and f"({plan.experts.extra_bytes / MIB:+.3g} MiB of RSS beside" in experts
    rows = _rows(text)
    assert rows and all(re.search(r", RSS [\d,]+ MiB( -- does not fit)?$", r) for r in rows), rows
    chosen = next(r for r in rows if re.match(rf"\s+ep {plan.experts.ep}\s+etp {plan.experts.etp} ", r))
    table = _report(work, cluster, result, 3, BASELINE).splitlines()
    cell = next(line for line in table if line.startswith(" 1  ")).split()[-6]  # the RSS MiB column
    assert chosen.endswith(f", RSS {cell} MiB"), (chosen, cell)
    # the table's cell is the demand with the experts, less the GPU reserve, plus the process
    with_experts = plan.memory.peak.total + plan.experts.extra_bytes - plan.memory.peak.workspace + BASELINE
    assert _memory(plan, BASELINE).strip() == f"{with_experts / MIB:,.0f}"


def test_explain_on_a_gpu_keeps_its_gb_text():
    work, cluster, result = _plan("h100-80g")
    plan = result.plans[0]
    text = explain(work, cluster, plan)
    assert f"({plan.experts.extra_bytes / GB:+.3g} GB beside the dense plan)" in text and "MiB" not in text
    rows = _rows(text)
    assert rows and all(re.search(r", [\d.e+-]+ GB( -- does not fit)?$", r) for r in rows), rows
    chosen = next(r for r in rows if re.match(rf"\s+ep {plan.experts.ep}\s+etp {plan.experts.etp} ", r))
    assert chosen.endswith(f", {(plan.memory.peak.total + plan.experts.extra_bytes) / GB:.3g} GB")


def test_hybrid_plan_explain_on_a_cpu_uses_the_tables_baseline(capsys):
    """The command: run() hands --explain the table's RSS baseline (one measure, so the figures agree)."""
    assert main(["--model", "tiny-mixtral", "--gpus", "4", "--gpu", "cpu", "--global-batch-size", "16",
                 "--seq-length", "128", "--top", "1", "--explain"]) == 0
    out = capsys.readouterr().out
    cell = next(line for line in out.splitlines() if line.startswith(" 1  ")).split()[-6]
    ep, etp = re.search(r"experts: ep (\d+) x expert-tp (\d+) chosen", out).groups()
    chosen = next(r for r in _rows(out) if re.match(rf"\s+ep {ep}\s+etp {etp} ", r))
    assert chosen.endswith(f", RSS {cell} MiB"), (chosen, cell)
    assert not re.search(r"[\d.]+ GB( -- does not fit)?$", out, re.M)
