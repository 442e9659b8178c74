"""Round 23's new-user pass over docs/pipeline.md ("Running it", "The pictures"). In-process.

1. The page said a --timeline trace names F3 / B3, but a zbv run's trace (2 ranks, `--pipeline-schedule zbv
   --timeline zbv_timeline.json`) holds F3.1, W3.0, send_act, recv_grad and wait events too, and timeline.py's
   docstring said transfers appear as "comm" events, a name no event has. The page and the docstring now list the
   names; checked on the trace function.
2. `scripts/plot_schedule.py --trace zbv_timeline.json --schedule zbv` (or --pp 2, ...) drew the trace and ignored
   the simulation flag silently; refused by name now, as --all refuses them.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from hybrid.pipeline.executor import TimelineEvent
from hybrid.pipeline.timeline import chrome_trace


def _names(ops: list[str], v: int) -> list[str]:
    events = [TimelineEvent(op, 3, 1, float(i), float(i) + 0.5) for i, op in enumerate(ops)]
    trace = chrome_trace({0: events}, {0: 0}, v=v)
    return [e["name"] for e in trace["traceEvents"] if e["ph"] == "X"]


def test_the_trace_names_are_the_pages():
    ops = ["forward", "backward_input", "backward_weight", "send_act", "recv_act", "send_grad", "recv_grad", "wait"]
    assert _names(ops, v=2) == ["F3.1", "B3.1", "W3.1", "send_act", "recv_act", "send_grad", "recv_grad", "wait"]
    assert _names(["forward", "backward"], v=1) == ["F3", "B3"]


def test_the_page_lists_each_name():
    text = " ".join((Path(__file__).parents[1] / "docs" / "pipeline.md").read_text().split())
    for name in ("F3 / B3", "W3", "F3.1", "send_act / recv_act / send_grad / recv_grad", "wait ="):
        assert name in text, name


def _plot_schedule():
    path = Path(__file__).parents[1] / "scripts" / "plot_schedule.py"
    spec = importlib.util.spec_from_file_location("plot_schedule", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("flag, value", [("--schedule", "zbv"), ("--pp", "2"), ("--microbatches", "4"), ("--v", "2"),
                                         ("--tb-ratio", "2")])
def test_plot_schedule_refuses_a_simulation_flag_beside_a_trace(tmp_path, one_line, flag, value):
    trace = tmp_path / "zbv_timeline.json"
    trace.write_text('{"traceEvents": []}')
    argv = ["--trace", str(trace), flag, value, "--out", str(tmp_path / "t.png")]
    assert one_line(lambda: _plot_schedule().parse_args(argv)) == (
        f"plot_schedule.py: error: {flag} does not go with --trace (the trace draws the run's own schedule, ranks and "
        f"micro-batches, as timed); drop one")
    assert _plot_schedule().parse_args(argv[:2] + argv[4:]).trace == str(trace)
    assert not (tmp_path / "t.png").exists()
