"""Activation memory of the pipeline schedules, measured with the saved-tensor ledger.

Per stage r, with A_r the bytes one micro-batch's forward saves on that stage (measured with m = 1):
  1F1B:  peak = min(pp - r, m) * A_r      GPipe: peak = m * A_r
exactly -- no constant: every saved tensor (RoPE tables included) belongs to one micro-batch, and a
chunk's output, which backward does not need, is freed once sent (at most one micro-batch's output
is held at a time on a sending stage).
"""

from __future__ import annotations

import pytest
import torch

from hybrid.measured_memory import SavedActivationLedger
from hybrid.mesh import Mesh, ParallelDims
from hybrid.pipeline import ScheduleKind, build_schedule
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.testing import run_distributed
from hybrid.tp import TPContext
from models import build_pipeline_chunks, load_config, shift_labels

PP, MB, SEQ = 4, 2, 16
MS = (1, 2, 4, 7)


def _peak(mesh, cfg, chunks, kind, m):
    ledger = SavedActivationLedger(params=chunks.parameters())
    schedule = build_schedule(kind, PP, m)[mesh.coords.pp]
    ex = PipelineExecutor(chunks, schedule, mesh.pp, StageIO((MB, SEQ, cfg.hidden_size)), mesh.device,
                          on_forward=lambda mb, c: ledger.tagged(mb))
    gen = torch.Generator().manual_seed(0)
    batches = [(x, shift_labels(x)) for x in (torch.randint(0, 256, (MB, SEQ), generator=gen) for _ in range(m))]
    with ledger:
        ex.forward_backward(batches)
    assert ledger.current_bytes == 0, "everything saved was released by backward"
    return ledger.peak_bytes, ex.peak_held_output_bytes


def _measure(rank, world):
    mesh = Mesh.build(ParallelDims(pp=PP))
    out = {}
    for name in ("tiny-gpt2", "tiny-llama"):
        cfg = load_config(name)
        chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp), mesh.coords.pp, PP, seed=0)
        for kind in (ScheduleKind.ONE_F_ONE_B, ScheduleKind.GPIPE):
            for m in MS:
                out[(name, kind, m)] = _peak(mesh, cfg, chunks, kind, m)
    return out


@pytest.fixture(scope="module")
def measured():
    return run_distributed(_measure, PP)


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
@pytest.mark.parametrize("kind", [ScheduleKind.ONE_F_ONE_B, ScheduleKind.GPIPE], ids=lambda k: k.value)
def test_peak_saved_activations_are_the_schedules_in_flight_count(measured, name, kind):
    for r, per_rank in enumerate(measured):
        one = per_rank[(name, kind, 1)][0]
        assert one > 0
        for m in MS:
            in_flight = min(PP - r, m) if kind is ScheduleKind.ONE_F_ONE_B else m
            assert per_rank[(name, kind, m)][0] == in_flight * one, f"rank {r}, m {m}"


def test_sent_outputs_are_freed_so_a_stage_holds_at_most_one(measured):
    out_bytes = MB * SEQ * load_config("tiny-gpt2").hidden_size * 4
    for r, per_rank in enumerate(measured[:-1]):  # the last stage sends nothing
        for m in MS:
            held = per_rank[("tiny-gpt2", ScheduleKind.GPIPE, m)][1]
            assert held == out_bytes, f"rank {r} held {held} bytes of outputs with m={m} (GPipe would keep m)"
