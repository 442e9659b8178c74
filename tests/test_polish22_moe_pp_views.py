"""Round 22: `hybrid plan` of an MoE model with pipeline parallelism on the cpu preset -- the table, --explain,
--plot and the zero-bubble note name the same layout and the same memory.

Found by running the three views of one plan (tiny-mixtral, 8 ranks, pp 2): --explain's first line and --plot's bars
named the layout without the chosen EP the table's cell ends with ('... zbv' beside '... zbv ep1'); the note that
ZBV beat 1F1B compared the ZBV plan's memory without its experts to the 1F1B plan's with them ('1,913 vs 1,915':
ZBV looked smaller), and on a CPU gave the device demand with the 2 GB GPU reserve, not the table's tensors. With
--context-parallel-size: tests/test_cpviews22.py (round 22: they were refused alike).
In-process: the planner's search, no ranks.
"""

from __future__ import annotations

import re

import pytest

from hybrid.planner import Cluster, SearchSpace, Workload, hardware, search
from hybrid.planner import cli as plan_cli
from hybrid.planner import plot
from hybrid.planner.hardware import GB
from models import load_config

MIB = 2**20
ARGS = ["--model", "tiny-mixtral", "--gpus", "8", "--gpu", "cpu", "--global-batch-size", "16", "--seq-length",
        "256", "--pipeline-model-parallel-size", "2", "--top", "3"]


def _table_cells(out: str) -> list[str]:
    """The layout cells of the table's rows ('tp1 pp2 dp4 v2 b1 z0 none zbv ep1')."""
    return [re.match(r"\s*\d+\s+(tp.*? ep\d+(?: etp\d+)?)\s", line).group(1)
            for line in out.splitlines() if re.match(r"\s*\d+\s+tp\d", line)]


def test_explain_names_the_tables_layout_cell(capsys):
    assert plan_cli.main(ARGS + ["--explain"]) == 0
    out = capsys.readouterr().out
    cells = _table_cells(out)
    assert re.search(rf"^why {re.escape(cells[0])} takes ", out, re.M), (cells[0], out[-3000:])


def test_plot_bars_name_the_tables_layout_cell(tmp_path, monkeypatch, capsys):
    figs = []
    draw = plot.draw_memory
    monkeypatch.setattr(plot, "draw_memory", lambda *a, **k: figs.append(draw(*a, **k)) or figs[-1])
    assert plan_cli.main(ARGS + ["--plot", str(tmp_path / "mem.png")]) == 0
    cells = _table_cells(capsys.readouterr().out)
    ticks = [t.get_text().split("\n") for t in figs[0].axes[0].get_xticklabels()]
    assert [" ".join(t[1:3]) for t in ticks] == cells  # '#1', 'tp1 pp2 dp4 v2 b1', 'z0 none zbv ep1', '(stage 0)'


@pytest.mark.parametrize("gpu", ["cpu", "h100-80g"])
def test_zero_bubble_note_compares_both_plans_with_their_experts(gpu):
    """The note's first figure is the zero-bubble plan's own memory, experts included: on a CPU its tensors (the
    table's RSS less the process) in MiB, on a GPU memory_gb in GB."""
    work = Workload(load_config("tiny-mixtral"), global_batch=16, seq_length=256, fp32_grads=False)
    result = search(work, Cluster(gpus=8, hw=hardware(gpu)), SearchSpace(pp=(2,)), top=3)
    plans = {p.layout.short(): p for p in result.plans}
    checked = 0
    for layout, note in result.notes.items():
        match = re.search(r"over 1f1b on this layout: .*fullest stage ([\d,.]+) vs [\d,.]+ (MiB of tensors|GB)",
                          note)
        if match and layout in plans:
            twin = plans[layout]
            own = ((twin.memory_gb * GB - twin.memory.peak.workspace) / MIB if gpu == "cpu" else twin.memory_gb)
            assert float(match.group(1).replace(",", "")) == pytest.approx(own, abs=0.05), (note, own)
            assert twin.experts is not None
            checked += 1
    assert checked
