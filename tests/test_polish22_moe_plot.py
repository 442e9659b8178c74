"""Round 22: `hybrid plan --plot`'s bars of an MoE model count its experts.

The bars were drawn from the dense plan's fullest rank (`Plan.memory.peak`), which sees each MoE layer's MLP as one
dense SwiGLU; the experts' states (ExpertPlan.extra_bytes) were in the table's column (round 21) and train.py's
start-up line, not in the bars -- tiny-mixtral's parameters bar was 28 % of the model on one rank. Now the bars are
`Plan.fullest_rank`: the expert shards a rank holds in its parameters, gradients and optimizer states. The reference
is the model's own parameter count (ModelConfig.num_parameters, equal to transformers' numel:
tests/test_moe_models.py), not the planner's. In-process: the planner's search of tiny-mixtral, no ranks.
"""

from __future__ import annotations

import re

import pytest

from hybrid.planner import cli as plan_cli
from hybrid.planner import plot
from models import load_config

pytest.importorskip("matplotlib")

MIB = 2**20
CFG = load_config("tiny-mixtral")
EXPERT_PARAMS = CFG.num_layers * CFG.num_experts * 3 * CFG.hidden_size * CFG.moe_ffn_hidden_size  # all MoE layers
BASE = ["--model", "tiny-mixtral", "--global-batch-size", "16", "--seq-length", "128", "--zero-stage", "0",
        "--pipeline-model-parallel-size", "1", "--tensor-model-parallel-size", "1", "--top", "2"]


def _plot(tmp_path, monkeypatch, capsys, argv: list[str]):
    """The table's rows and the figure --plot drew (one search: the plans and the figure come from one run)."""
    figs, plans = [], []
    draw = plot.draw_memory

    def spy(ps, *a, **k):
        plans.extend(ps)
        figs.append(draw(ps, *a, **k))
        return figs[-1]
    monkeypatch.setattr(plot, "draw_memory", spy)
    assert plan_cli.main(BASE + argv + ["--plot", str(tmp_path / "mem.png")]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if re.match(r"\s*\d+\s+tp\d", line)]
    return rows, figs[0], plans


def _heights(fig, label: str) -> list[float]:
    """The bar heights of one part (`label`), one a layout."""
    (container,) = [c for c in fig.axes[0].containers if c.get_label() == label]
    return [bar.get_height() for bar in container]


@pytest.mark.parametrize("gpus,ep", [(1, 1), (4, 4)])
def test_plot_bars_hold_the_expert_shards_a_rank_holds(tmp_path, monkeypatch, capsys, gpus, ep):
    """ZeRO 0, tp 1, pp 1: every rank holds the whole dense part and E / ep experts of each MoE layer -- at one
    rank the whole model, num_parameters; at ep 4 a quarter of the experts."""
    _, fig, plans = _plot(tmp_path, monkeypatch, capsys, ["--gpus", str(gpus), "--gpu", "h100-80g",
                                                          "--expert-model-parallel-size", str(ep)])
    held = CFG.num_parameters - EXPERT_PARAMS + EXPERT_PARAMS // ep
    b = plans[0].memory.peak.states.params / plans[0].memory.peak.parameters  # the plan's bytes a parameter
    assert all(p.experts.ep == ep and p.layout.zero == 0 for p in plans)
    assert _heights(fig, "parameters") == pytest.approx([held * b / 1e9] * len(plans), rel=1e-12)
    grads = plans[0].memory.peak.states.grads / plans[0].memory.peak.parameters
    assert _heights(fig, "gradients") == pytest.approx([held * grads / 1e9] * len(plans), rel=1e-12)


def test_cpu_plot_of_an_moe_model_is_the_tables_rss(tmp_path, monkeypatch, capsys):
    """Each bar's label (the parts' sum, MiB of RSS) is the table's cell, which counts the experts; the experts add
    more than a MiB here (ep 1: each rank holds all 8), so a bar without them reads below its cell."""
    rows, fig, plans = _plot(tmp_path, monkeypatch, capsys, ["--gpus", "4", "--gpu", "cpu"])
    column = [row[row.index("none") + 2] for row in rows]  # "... z0 none ep1   275 ...": the cell after the ep
    labels = [t.get_text().split("\n")[0] for t in fig.axes[0].texts]
    assert labels == [f"{m} MiB" for m in column]
    assert all(p.experts.extra_bytes > MIB for p in plans)
    optimizer = _heights(fig, "optimizer states")
    dense = [p.memory.peak.states.optimizer / MIB for p in plans]
    extra = [p.experts.extra_states.optimizer / MIB for p in plans]
    assert optimizer == pytest.approx([d + e for d, e in zip(dense, extra)], rel=1e-12) and min(extra) > 0
