"""Round 23's new-user pass over docs/pipeline.md ("Running it"): the page said a --timeline trace names F3 / B3,
but a zbv run's trace (2 ranks, `--pipeline-schedule zbv --timeline zbv_timeline.json`) holds F3.1, W3.0, send_act,
recv_grad and wait events too, and timeline.py's docstring said transfers appear as "comm" events, a name no event
has. The page and the docstring now list the names; this checks them on the trace function. In-process.
"""

from __future__ import annotations

from pathlib import Path

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
