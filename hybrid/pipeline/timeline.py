"""Pipeline timelines as Chrome-trace JSON (open in Perfetto or chrome://tracing).

Each rank's executed actions (`PipelineExecutor.events`) become complete ("X") events: one track
(pid) per pipeline stage, one row (tid) per global rank, named like the schedule pictures -- F3 is
the forward of micro-batch 3, B3 its backward (its input gradient, under a zero-bubble schedule), W3 its
weight gradients (zero-bubble schedules), with the chunk shown as F3.1 when v > 1; each send and
receive of a batch appears under its op's name (send_act, recv_act, send_grad, recv_grad: the time the batch
took to post), and a compute's lazy wait for its input, or the step's final wait for its sends, as "wait".
Times are wall-clock microseconds from the earliest event, so ranks on one host line up.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

from hybrid.pipeline.executor import TimelineEvent

_LETTER = {"forward": "F", "backward": "B", "backward_input": "B", "backward_weight": "W"}


def _label(e: TimelineEvent, v: int) -> str:
    letter = _LETTER.get(e.name)
    if letter is None:
        return e.name
    return f"{letter}{e.microbatch}" + (f".{e.chunk}" if v > 1 else "")


def chrome_trace(events: Mapping[int, Sequence[TimelineEvent]], pp_rank_of: Mapping[int, int], v: int = 1) -> dict:
    """Trace dict from {global rank: events}; `pp_rank_of` maps a global rank to its stage."""
    t0 = min((e.start for evs in events.values() for e in evs), default=0.0)
    trace = []
    for rank, evs in sorted(events.items()):
        for e in evs:
            trace.append({"name": _label(e, v), "cat": e.name, "ph": "X", "pid": pp_rank_of[rank], "tid": rank,
                          "ts": round((e.start - t0) * 1e6, 1), "dur": round((e.end - e.start) * 1e6, 1),
                          "args": {"microbatch": e.microbatch, "chunk": e.chunk}})
    for stage in sorted(set(pp_rank_of.values())):
        trace.append({"name": "process_name", "ph": "M", "pid": stage, "args": {"name": f"pipeline stage {stage}"}})
    return {"traceEvents": trace, "displayTimeUnit": "ms"}


# what every trace this module writes starts with: json.dump of chrome_trace's dict, "traceEvents" its first key
TRACE_START = '{"traceEvents"'


def check_replaceable(flag: str, path: str) -> None:
    """A timeline replaces `path` at the end of the run, so an existing non-empty file there must be a trace a
    run wrote (its first bytes `{"traceEvents"`, the rerun of a command overwriting its own timeline). Anything
    else -- the run's --metrics-file, a checkpoint's `latest`, a script, a plot -- would be lost without a word;
    ValueError naming the flag instead."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
    if not head.startswith(TRACE_START.encode()):
        raise ValueError(f"{flag} {path!r} exists and is not a pipeline timeline (it does not start with "
                         f"{TRACE_START}); the run replaces it at its end: give a new file, or the {flag} of an "
                         f"earlier run")


def write_chrome_trace(path: str, trace: dict) -> None:
    """Write atomically (hybrid.cliutil.atomic_output: a unique temporary beside `path`, renamed onto it): a
    failed run leaves no half-written file, and no fixed `path.tmp` that two runs could share."""
    from hybrid.cliutil import atomic_output

    with atomic_output(path) as tmp:
        with open(tmp, "w") as f:
            json.dump(trace, f)
