"""Round 22 (issue 26): `hybrid plan --context-parallel-size` with --explain, --json, --emit-args and --plot -- all
four were refused ("not implemented for CP plans"), so a long-sequence user planning CP got no why.

* --explain: the plain term list (time.TERMS: the reduced plan's, a rank at s/c tokens) with CP's after attention
  (context.CP_TERMS: the other ranks' key blocks, the exposed exchange, torch's merges); the terms add up to the
  table's step (an MoE model's experts aside, as for a plain plan); the exchange line says how much is hidden; the
  memory line is the table's column, GB on a GPU and RSS MiB on the cpu preset;
* --json: the same terms (summing to step_seconds), the layout at its true dp with the CP size and comm type;
* --emit-args: train.py's own parser and checks take the flags and give the planned tp, pp, dp, cp, comm type;
* --plot: the bars of a CP plan add up to its table row's memory (the ring's buffers a part of their own);
* --scan-gpus: runs with CP since round 23 (tests/test_planner23_scan_cp.py); it was refused by name here.
In-process, one CLI call each (~0.1-1 s).
"""

from __future__ import annotations

import json
import re

import pytest

from hybrid.cp.comm_type import CommType
from hybrid.planner import Cluster, SearchSpace, Workload, context, hardware
from hybrid.planner.cli import main
from hybrid.planner.model import ActivationProfile
from hybrid.planner.time import TERMS
from models.config import load_config

# a GPU preset: llama-3-8b at 8k on 16 H100, tp 4 pinned, cp 2 (p2p wins: some of its exchange hidden)
GPU = ["--model", "llama-3-8b", "--gpus", "16", "--gpu", "h100-80g", "--global-batch-size", "8", "--seq-length",
       "8192", "--activation-profile", "bf16-flash", "--tensor-model-parallel-size", "4", "--top", "3",
       "--context-parallel-size", "2"]
# the cpu preset (fp32, RSS MiB), and an MoE model on it with a pipeline (the experts' seconds beside the terms)
CPU = ["--model", "tiny-llama", "--gpus", "4", "--gpu", "cpu", "--global-batch-size", "8", "--seq-length", "128",
       "--top", "3", "--context-parallel-size", "2"]
MOE = ["--model", "tiny-mixtral", "--gpus", "4", "--gpu", "cpu", "--global-batch-size", "8", "--seq-length", "128",
       "--top", "2", "--context-parallel-size", "2", "--pipeline-model-parallel-size", "2"]
ORDER = [n for name, _ in TERMS for n in ([name] + [c for c, _ in context.CP_TERMS] if name == "attention" else [name])]
NUM = r"[-\d.e+]+"


def _run(capsys, argv: list[str]) -> str:
    assert main(argv) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def _table_row(out: str) -> list[str]:
    """The first row of context.report's table: # layout... mem step CP-s tokens/s MFU."""
    return next(line.split() for line in out.splitlines() if re.match(r"\s*1  tp", line))


def _explained(out: str) -> tuple[dict[str, float], float, float]:
    """(terms, the step the first line says, the experts' seconds it adds) of --explain's output."""
    first = next(line for line in out.splitlines() if line.startswith("why "))
    step, experts = re.search(rf" takes ({NUM}) s(?: \+ the experts' ({NUM}) s)?", first).groups()
    rows = [line.split() for line in out.splitlines() if line.startswith("  ") and line.split()[0] in ORDER]
    assert [r[0] for r in rows] == ORDER
    return {r[0]: float(r[1]) for r in rows}, float(step), float(experts or 0.0)


def test_explain_takes_a_gpu_cp_step_apart_and_the_terms_add_up_to_the_table(capsys):
    out = _run(capsys, GPU + ["--cp-comm-type", "p2p", "--explain"])
    row = _table_row(out)
    assert "cp2 p2p" in " ".join(row) and f"why {' '.join(row[1:-5])} takes " in out  # Plan.short's name
    terms, step, _ = _explained(out)
    assert sum(terms.values()) == pytest.approx(step, rel=1e-3) and step == pytest.approx(float(row[-4]), rel=1e-3)
    assert terms["cp_attention"] > 0 and terms["cp_exchange"] > 0 and terms["cp_merge"] == 0  # TE-less p2p ring
    assert terms["cp_attention"] + terms["cp_exchange"] == pytest.approx(float(row[-3]), rel=1e-3)  # the CP s column
    cp_line = next(line for line in out.splitlines() if line.startswith("  CP: "))
    moved, hidden = map(float, re.search(rf"transfers take ({NUM}) s, ({NUM}) s of them hidden", cp_line).groups())
    assert 0 < hidden < moved and moved - hidden == pytest.approx(terms["cp_exchange"], rel=1e-3)
    mem = next(line for line in out.splitlines() if line.startswith("  memory: "))
    assert f") {row[-5]} GB = " in mem and "MiB" not in mem  # the table's mem GB


def test_explain_on_the_cpu_preset_gives_the_tables_rss_mib(capsys):
    out = _run(capsys, CPU + ["--explain"])
    row = _table_row(out)
    terms, step, _ = _explained(out)
    assert sum(terms.values()) == pytest.approx(step, rel=1e-3) and step == pytest.approx(float(row[-4]), rel=1e-3)
    mem = next(line for line in out.splitlines() if line.startswith("  memory: "))
    assert f") {row[-5]} RSS MiB = " in mem and " GB" not in mem  # one baseline for the table and the line


def test_explain_of_a_cp_moe_plan_adds_up_with_its_experts(capsys):
    out = _run(capsys, MOE + ["--explain"])
    row = _table_row(out)
    terms, step, experts = _explained(out)
    assert experts > 0 and row[-6].startswith("ep")  # the table names the EP; the first line adds its seconds
    assert sum(terms.values()) == pytest.approx(step, rel=1e-3)
    assert step + experts == pytest.approx(float(row[-4]), rel=1e-3)


@pytest.mark.parametrize("argv", [GPU, CPU], ids=["h100", "cpu"])
def test_json_holds_the_cp_plans_with_their_terms(capsys, argv):
    doc = json.loads(_run(capsys, argv + ["--json"]))
    plan = doc["plans"][0]
    assert list(plan["terms"]) == ORDER
    assert sum(plan["terms"].values()) == pytest.approx(plan["step_seconds"], rel=1e-9)
    lay, cp = plan["layout"], plan["context_parallel"]
    assert lay["context_parallel_size"] == 2 and lay["cp_comm_type"] == cp["comm_type"] in [c.value for c in CommType]
    assert lay["tp"] * lay["pp"] * lay["dp"] * 2 == doc["gpus"]  # the true dp, not the reduced dp x cp
    assert sum(plan["terms"][c] for c, _ in context.CP_TERMS) == pytest.approx(cp["extra_seconds"], rel=1e-9)
    assert cp["transfer_seconds"] - cp["hidden_seconds"] == pytest.approx(plan["terms"]["cp_exchange"], rel=1e-9)
    assert "--context-parallel-size" in plan["train_args"] and plan["memory_gb"] > 0 and plan["tflops_per_gpu"] > 0


@pytest.mark.parametrize("argv,world", [(GPU + ["--cp-comm-type", "p2p"], 16), (CPU, 4)], ids=["h100", "cpu"])
def test_emitted_args_parse_back_to_the_planned_cp_layout(capsys, argv, world):
    from hybrid.train.args import check_args, parse_args
    flags = _run(capsys, argv + ["--emit-args"]).split()
    doc = json.loads(_run(capsys, argv + ["--json"]))["plans"][0]["layout"]
    args = parse_args(flags)
    _, dims, _, _ = check_args(args, world=world)  # train.py's own checks, before any process group
    assert (dims.tp, dims.pp, dims.dp, dims.cp) == (doc["tp"], doc["pp"], doc["dp"], 2)
    assert args.cp_comm_type == doc["cp_comm_type"]
    assert (args.micro_batch_size, args.zero_stage, args.sequence_parallel) == (
        doc["micro_batch"], doc["zero_stage"], doc["sequence_parallel"])


def test_plot_bars_of_cp_plans_add_up_to_their_table_memory(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    from hybrid.planner.plot import GPU_UNIT, RING, bar_parts
    out = tmp_path / "cp.png"
    _run(capsys, GPU + ["--plot", str(out)])
    assert out.stat().st_size > 0
    work = Workload(load_config("llama-3-8b"), global_batch=8, seq_length=8192,
                    activations=ActivationProfile.BF16_FLASH, fp32_grads=False)
    plans = context.search_cp(work, Cluster(gpus=16, hw=hardware("h100-80g")), SearchSpace(tp=(4,)), cps=(2,),
                              comms=tuple(CommType), top=3)
    assert any(p.ring_bytes > 0 for p in plans)  # p2p and allgather hold buffers (a2a none)
    for p in plans:
        parts = bar_parts(p, GPU_UNIT)
        assert parts[RING] == pytest.approx(p.ring_bytes / 1e9, rel=1e-12)
        assert sum(parts.values()) == pytest.approx(p.memory_gb, rel=1e-9)  # the table's mem GB


def test_plain_plot_bars_add_up_to_the_tables_memory_with_the_loss_gradient():
    """The bars are RankMemory.total part by part: the last rank's loss gradient over the logits was not drawn
    (1.0 of 41.3 GB short for this layout's bar)."""
    from hybrid.planner import search
    from hybrid.planner.plot import bar_parts
    work = Workload(load_config("llama-3-8b"), global_batch=8, seq_length=8192,
                    activations=ActivationProfile.BF16_FLASH, fp32_grads=False)
    plans = search(work, Cluster(gpus=8, hw=hardware("h100-80g")), SearchSpace(tp=(4,), pp=(1,)), top=2).plans
    assert plans and all(p.memory.peak.backward_transient > 0 for p in plans)
    for p in plans:
        assert sum(bar_parts(p).values()) == pytest.approx(p.memory_gb, rel=1e-9)
