"""scripts/plot_schedule.py draws the schedules the executor runs: each picture's boxes are `build_schedule`'s
compute actions in list order (the order `PipelineExecutor` walks them), timed by `simulate`, and the makespan and
bubble the picture shows are the closed forms of docs/pipeline.md, computed here independently of the simulator.
`--all` writes one PNG per schedule, and checks every schedule's parameters before it draws the first."""

from __future__ import annotations

import importlib.util
import os
import re
import sys

import pytest

from hybrid.pipeline import ScheduleKind, build_schedule

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("plot_schedule", os.path.join(ROOT, "scripts", "plot_schedule.py"))
plot = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = plot  # its dataclasses look their module up there
_spec.loader.exec_module(plot)

PP, M, TB = 4, 8, 2.0  # the docs' pictures: per chunk F = 1, backward 2 (B = W = 1 under zero bubble)
V = {ScheduleKind.INTERLEAVED: 2, ScheduleKind.ZBV: 2}


def closed_form_makespan(kind: ScheduleKind, p: int, m: int) -> float:
    """docs/pipeline.md's tables, with tF = 1 and a backward of 2 per chunk (tB = tW = 1 when split)."""
    f, b, w = 1.0, TB / 2, TB / 2
    if kind in (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B):
        return (m + p - 1) * (f + TB)
    if kind is ScheduleKind.INTERLEAVED:
        return (f + TB) * (V[kind] * m + p - 1)
    if kind is ScheduleKind.ZB_H1:
        return m * (f + b + w) + (p - 1) * (f + b) - min(m - 1, p - 1) * w
    return 6 * m + max(2 * (2 * p - 1 - m), p - 1)  # ZBV, tF = tB = tW = 1


@pytest.mark.parametrize("kind", plot.ALL, ids=[k.value for k in plot.ALL])
def test_picture_boxes_are_the_executors_list_in_order_at_the_closed_form(kind):
    v = V.get(kind, 1)
    pic = plot.from_schedule(kind, PP, M, v, TB)
    lists = build_schedule(kind, PP, M, v)
    for rank, actions in enumerate(lists):
        want = [(a.op.value, a.microbatch, a.chunk) for a in actions if a.op.is_compute]
        boxes = sorted((b for b in pic.boxes if b.row == rank), key=lambda b: b.start)
        assert [(b.kind, b.microbatch, b.chunk) for b in boxes] == want, rank
    makespan = max(b.end for b in pic.boxes)
    assert makespan == closed_form_makespan(kind, PP, M)
    busy = sum(b.end - b.start for b in pic.boxes)
    assert busy == PP * M * v * (1 + TB)  # every micro-batch's F, B (and W) on every chunk, nothing else
    bubble = round(100 * (1 - busy / (PP * makespan)))
    assert re.search(rf"makespan {makespan:g}, bubble {bubble}%", pic.title), pic.title


def test_all_draws_one_png_per_schedule(tmp_path, capsys):
    plot.main(["--all", "--pp", "2", "--microbatches", "4", "--tb-ratio", "2", "--out-dir", str(tmp_path)])
    names = sorted(os.listdir(tmp_path))
    assert names == sorted(f"pipeline_{k.value}_pp2_m4{'_v2' if k is ScheduleKind.INTERLEAVED else ''}_tb2.png"
                           for k in plot.ALL)
    for n in names:
        assert (tmp_path / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", n


@pytest.mark.parametrize("argv, message", [
    (["--all", "--microbatches", "6"], "--all: m (micro-batches) must be a multiple of pp=4 for interleaved"),
    (["--all", "--schedule", "zbv"], "--schedule does not go with --all"),
    (["--all", "--out", "x.png"], "--out does not go with --all"),
])
def test_all_rejects_what_it_cannot_draw_before_drawing_anything(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit):
        plot.main([*argv, "--out-dir", str(tmp_path)])
    assert message in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_every_picture_docs_pipeline_shows_exists():
    with open(os.path.join(ROOT, "docs", "pipeline.md")) as f:
        images = re.findall(r"!\[[^\]]*\]\((img/[^)]+\.png)\)", f.read())
    assert {f"img/pipeline_{k.value}_pp4_m8{'_v2' if k is ScheduleKind.INTERLEAVED else ''}_tb2.png"
            for k in plot.ALL} <= set(images)
    for img in images:
        assert os.path.isfile(os.path.join(ROOT, "docs", img)), img
