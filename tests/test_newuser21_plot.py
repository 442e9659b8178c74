"""Round 21's new-user pass: `hybrid plan --plot`'s memory axis in the table's unit.

On a CPU (the cpu preset, a gloo calibration) the table's memory column is "RSS MiB" -- the peak resident memory a
rank reaches, as train.py's log line measures it -- but the plot drew the GPU figure in GB: the tensors plus the
planner's 2 GB CUDA reserve, "2.0 GB" over a table row of 263 MiB (and the table, measured after the plot imported
matplotlib, 12 MiB above the same command without --plot). Now each bar's label is the table's number in its unit, and
the y axis names the unit (MiB = 2^20 bytes on a host, GB = 1e9 bytes on a GPU). In-process: the planner's search of
a tiny model, no ranks.
"""

from __future__ import annotations

import re

import pytest

from hybrid.planner import cli as plan_cli
from hybrid.planner import plot

pytest.importorskip("matplotlib")

TINY = ["--model", "tiny-gpt2", "--gpus", "4", "--global-batch-size", "16", "--seq-length", "128",
        "--precision", "fp32", "--top", "3"]


def _plan_and_plot(tmp_path, monkeypatch, capsys, gpu: str) -> tuple[list[str], object]:
    """The table's memory column and the figure `--plot` wrote."""
    figs = []
    draw = plot.draw_memory
    monkeypatch.setattr(plot, "draw_memory", lambda *a, **k: figs.append(draw(*a, **k)) or figs[-1])
    assert plan_cli.main(TINY + ["--gpu", gpu, "--plot", str(tmp_path / "mem.png")]) == 0
    assert (tmp_path / "mem.png").read_bytes().startswith(b"\x89PNG")
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if re.match(r"\s*\d+\s+tp\d", line)]
    # '1  tp1 pp1 dp4 v1 b4 z3 none   252 0.00213 ...': the memory is the column after the layout's recompute word
    return [row[row.index("none") + 1] for row in rows], figs[0]


def _bar_labels(fig) -> list[str]:
    """The number over each bar ('252 MiB\\n0.00213 s/step' -> '252 MiB')."""
    return [t.get_text().split("\n")[0] for t in fig.axes[0].texts]


def test_cpu_plot_is_in_the_tables_rss_mib(tmp_path, monkeypatch, capsys):
    column, fig = _plan_and_plot(tmp_path, monkeypatch, capsys, "cpu")
    assert _bar_labels(fig) == [f"{m} MiB" for m in column]
    assert "MiB (2^20 bytes)" in fig.axes[0].get_ylabel() and "RSS" in fig.axes[0].get_ylabel()
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "workspace" not in legend and plot.PROCESS in legend  # no GPU reserve on a host


def test_gpu_plot_is_in_the_tables_gb(tmp_path, monkeypatch, capsys):
    column, fig = _plan_and_plot(tmp_path, monkeypatch, capsys, "h100-80g")
    assert _bar_labels(fig) == [f"{m} GB" for m in column]
    assert "GB" in fig.axes[0].get_ylabel() and "1e9 bytes" in fig.axes[0].get_ylabel()
