"""Activation memory of the pipeline schedules, measured with the saved-tensor ledger.

Per stage r, with A_r the bytes one micro-batch's forward saves on that stage (measured with m = 1):
  1F1B:  peak = min(pp - r, m) * A_r      GPipe: peak = m * A_r
exactly -- no constant: every saved tensor (RoPE tables included) belongs to one micro-batch, and a
chunk's output, which backward does not need, is freed once sent (at most one micro-batch's output
is held at a time on a sending stage).

Zero-bubble schedules (ZB-H1, ZBV), the paper's accounting (Qi et al. 2024, Table 1: F adds M_B, B adds
M_W - M_B, W frees M_W), per chunk c with measured
  A_c = M_B: the bytes F saves (as above),
  H_c = M_W: what is still held between B and W -- the saved tensors W's nodes reach (the graph above them,
        e.g. the logits of the loss, is freed by B) plus the output gradients B keeps for W (`on_weight_hold`:
        not saved by autograd, so counted on the ledger explicitly); on the first stage B defers everything and
        H = A,
the ledger's peak equals exactly the running maximum of sum(+A_c at F, +(H_c - A_c) at B, -H_c at W) over the
rank's compute order, for every m.
"""

from __future__ import annotations

import pytest
import torch

from hybrid.measured_memory import SavedActivationLedger
from hybrid.mesh import Mesh, ParallelDims
import dataclasses

from hybrid.pipeline import Op, ScheduleKind, build_schedule, compute_order
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


def _zb_peak(mesh, cfg, chunks, kind, m):
    """(ledger peak, {chunk: A_c}, {chunk: H_c}) of one zero-bubble step, read on micro-batch 0's tags: A the peak
    of what its forward saved, H what it holds just before its W runs (saved tensors + the kept gradients, these
    filed under their own tag)."""
    ledger = SavedActivationLedger(params=chunks.parameters())
    v = len(chunks)
    schedule = build_schedule(kind, PP, m, v)[mesh.coords.pp]
    ex = PipelineExecutor(chunks, schedule, mesh.pp, StageIO((MB, SEQ, cfg.hidden_size)), mesh.device,
                          on_forward=lambda mb, c: ledger.tagged((mb, c)), placement=kind.placement,
                          on_weight_hold=lambda t, owner, mb, c: ledger.track(t, owner, ("kept", mb, c)))
    held, index = {}, {id(c): i for i, c in enumerate(chunks)}

    def before_weight(chunk):
        c = index[id(chunk)]
        held.setdefault(c, ledger.tag_current((0, c)) + ledger.tag_current(("kept", 0, c)))  # mb 0's W: the first

    ex.before_weight = before_weight
    gen = torch.Generator().manual_seed(0)
    batches = [(x, shift_labels(x)) for x in (torch.randint(0, 256, (MB, SEQ), generator=gen) for _ in range(m))]
    with ledger:
        ex.forward_backward(batches)
    assert ledger.current_bytes == 0, "everything saved or kept was released by W"
    return ledger.peak_bytes, {c: ledger.tag_peak((0, c)) for c in range(v)}, held


def _measure(rank, world):
    mesh = Mesh.build(ParallelDims(pp=PP))
    out = {}
    for name in ("tiny-gpt2", "tiny-llama"):
        cfg = load_config(name)
        chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp), mesh.coords.pp, PP, seed=0)
        for kind in (ScheduleKind.ONE_F_ONE_B, ScheduleKind.GPIPE):
            for m in MS:
                out[(name, kind, m)] = _peak(mesh, cfg, chunks, kind, m)
        for m in MS:
            out[(name, ScheduleKind.ZB_H1, m)] = _zb_peak(mesh, cfg, chunks, ScheduleKind.ZB_H1, m)
        cfg8 = dataclasses.replace(cfg, num_layers=2 * PP)  # ZBV: 2 pp stages
        stage_ids = [ScheduleKind.ZBV.placement.stage(mesh.coords.pp, c, PP) for c in range(2)]
        chunks = build_pipeline_chunks(cfg8, TPContext(mesh.tp), mesh.coords.pp, PP, 2, seed=0, stage_ids=stage_ids)
        for m in MS + (2 * PP,):
            out[(name, ScheduleKind.ZBV, m)] = _zb_peak(mesh, cfg8, chunks, ScheduleKind.ZBV, m)
    return out


def paper_peak(order, a: dict[int, int], h: dict[int, int]) -> int:
    """Running maximum of +A_c at F, +(H_c - A_c) at B, -H_c at W over one rank's compute order."""
    cur = peak = 0
    for act in order:
        c = act.chunk
        cur += {Op.FORWARD: a[c], Op.BACKWARD_INPUT: h[c] - a[c], Op.BACKWARD_WEIGHT: -h[c]}[act.op]
        peak = max(peak, cur)
    return peak


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


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
@pytest.mark.parametrize("kind", [ScheduleKind.ZB_H1, ScheduleKind.ZBV], ids=lambda k: k.value)
def test_zero_bubble_peak_is_the_papers_accounting_with_ws_saved_tensors(measured, name, kind):
    ms = MS + ((2 * PP,) if kind is ScheduleKind.ZBV else ())
    v = 2 if kind is ScheduleKind.ZBV else 1
    for r, per_rank in enumerate(measured):
        _, a, h = per_rank[(name, kind, 1)]
        assert all(a[c] > 0 and h[c] > 0 for c in range(v))
        for m in ms:
            peak, a_m, h_m = per_rank[(name, kind, m)]
            assert (a_m, h_m) == (a, h), "every micro-batch saves and keeps the same bytes"
            assert peak == paper_peak(compute_order(kind, PP, r, m, v), a, h), f"rank {r}, m {m}"
        if kind is ScheduleKind.ZB_H1 and r == 0:
            # the first stage defers its whole backward to W: it holds what 1F1B holds, no more
            assert h[0] == a[0]
            assert per_rank[(name, kind, 7)][0] == per_rank[(name, ScheduleKind.ONE_F_ONE_B, 7)][0]
