"""Pipelines at scale (issue 26): what DeepSpeed's pipeline engine does per micro-batch and per step, priced as
it runs (hybrid/planner/time.py, the Workload fields `grad_accumulation_fusion` and `overlap_param_gather`), and
the evidence docs/planner/validation.md "Published runs" gives for MT-NLG: DeepSpeed's TrainSchedule, every transfer a
rendezvous, loses nothing beyond the 1F1B makespan the planner simulates; and the published step ratios pick the
micro-batch (a 1F1B step scales as m + p - 1)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from hybrid.planner import Cluster, Layout, Workload, ZeroStage, evaluate, hardware
from hybrid.planner.cli import add_arguments, main, workload_from_args
from hybrid.planner.published import (DEEPSPEED_PIPELINE_ENGINE, MTNLG_MICRO_BATCH, MTNLG_STEPS, mtnlg_pipeline_ticks,
                                      mtnlg_runs, published_runs)
from hybrid.planner.reference import gpt_model
from hybrid.planner.schedule import StageTimes, run_pipeline
from hybrid.planner.time import _context, _dp_step_seconds
from hybrid.pipeline import ScheduleKind

# --- DeepSpeed's TrainSchedule (deepspeed/runtime/pipe/schedule.py), written out from its code -----------------


def deepspeed_program(stage: int, stages: int, m: int) -> list[tuple[str, int]]:
    """One stage's instructions in order: 2 (m + p - 1) steps; at an even step even stages run a forward and odd
    stages a backward (and the other way at odd steps). A forward step first sends the previous micro-batch's
    input gradient back and receives this one's activation; a backward step receives this one's output gradient
    and sends the previous micro-batch's activation on. ('send_grad' | 'recv_act' | 'recv_grad' | 'send_act' |
    'F' | 'B', micro-batch)."""
    def micro_batch(step: int) -> tuple[int, bool]:
        even_step, even_stage = step % 2 == 0, stage % 2 == 0
        if even_step and even_stage:
            return step // 2 - stage // 2, True
        if not even_step and not even_stage:
            return (step - 1) // 2 - stage // 2, True
        if even_step:
            return step // 2 - stages + (stage + 1) // 2, False
        return (step - 1) // 2 - stages + 1 + stage // 2, False

    program, prev = [], -1
    valid = range(m).__contains__
    for step in range(2 * (m + stages - 1)):
        mb, forward = micro_batch(step)
        if forward and stage > 0:
            program += [("send_grad", prev)] * valid(prev) + [("recv_act", mb)] * valid(mb)
        if not forward and stage < stages - 1:
            program += [("recv_grad", mb)] * valid(mb) + [("send_act", prev)] * valid(prev)
        if valid(mb):
            program.append(("F" if forward else "B", mb))
        prev = mb
    return program


def deepspeed_makespan(stages: int, m: int, fwd: float, bwd: float, comm: float) -> float:
    """The step of that schedule when each transfer is a rendezvous (both ends wait for each other, then both are
    busy `comm`), as DeepSpeed's blocking sends and receives are; compute takes fwd / bwd."""
    peer_of = {"send_grad": (-1, "recv_grad"), "recv_act": (-1, "send_act"), "recv_grad": (1, "send_grad"),
               "send_act": (1, "recv_act")}
    programs = [deepspeed_program(s, stages, m) for s in range(stages)]
    pc, clock = [0] * stages, [0.0] * stages
    left = sum(map(len, programs))
    while left:
        moved = False
        for s in range(stages):
            while pc[s] < len(programs[s]):
                kind, mb = programs[s][pc[s]]
                if kind in ("F", "B"):
                    clock[s] += fwd if kind == "F" else bwd
                    pc[s], left, moved = pc[s] + 1, left - 1, True
                    continue
                offset, wants = peer_of[kind]
                p = s + offset
                if pc[p] == len(programs[p]) or programs[p][pc[p]] != (wants, mb):
                    break  # the peer has not reached the matching transfer yet
                clock[s] = clock[p] = max(clock[s], clock[p]) + comm
                pc[s], pc[p], left, moved = pc[s] + 1, pc[p] + 1, left - 2, True
        assert moved, "the schedule deadlocked"
    return max(clock)


def test_deepspeed_schedule_pairs_every_send_with_a_receive_and_runs_each_micro_batch_once():
    programs = [deepspeed_program(s, 5, 7) for s in range(5)]
    for prog in programs:
        assert sorted(mb for k, mb in prog if k == "F") == list(range(7))
        assert sorted(mb for k, mb in prog if k == "B") == list(range(7))
    for s in range(4):
        assert [mb for k, mb in programs[s] if k == "send_act"] == [mb for k, mb in programs[s + 1] if k == "recv_act"]
        assert [mb for k, mb in programs[s + 1] if k == "send_grad"] == [mb for k, mb in programs[s] if k == "recv_grad"]


@pytest.mark.parametrize("stages,m", [(4, 8), (35, 80)])
def test_deepspeed_schedule_takes_the_1f1b_makespan_the_planner_simulates(stages, m):
    """MT-NLG's shape (35 stages; full recomputation: backward = 3 forwards; one blocking 84 MB message 9 % of a
    forward): DeepSpeed's instruction order with rendezvous transfers takes what the planner's 1F1B simulation
    takes with the blocking transfers folded into the passes (2 per pass on an inner stage, 1 on an edge stage),
    or up to 1.5 % less (0.7-1.2 % at these sizes: the fold charges a transfer to both ends' passes where the
    rendezvous lets them overlap in the warm-up): the schedule has no gap the bubble does not already count."""
    fwd, bwd, comm = 1.0, 3.0, 0.09
    edges = [(s > 0) + (s < stages - 1) for s in range(stages)]
    times = StageTimes(tuple(fwd + comm * k for k in edges), tuple(bwd + comm * k for k in edges), 0.0)
    planner = run_pipeline(ScheduleKind.ONE_F_ONE_B, stages, m, 1, times, budget=stages * m * m).makespan
    assert 0.985 * planner <= deepspeed_makespan(stages, m, fwd, bwd, comm) <= planner


# --- MT-NLG's micro-batch, from the published step ratios ---------------------------------------------------


def test_mtnlg_step_ratios_pick_micro_batch_2():
    """With per-micro-batch costs fixed, a step scales as m + p - 1 (m = 1920 / (dp b)). Of b = 1, 2, 4, the
    published ratios t(d8) / t(d12) and t(d8) / t(d10) are both closest to b 2's; the rows are planned at it."""
    (d8, t8), (d10, t10), (d12, t12) = MTNLG_STEPS
    for (da, ta), (db, tb) in (((d8, t8), (d12, t12)), ((d8, t8), (d10, t10))):
        miss = {b: abs(mtnlg_pipeline_ticks(da, b) / mtnlg_pipeline_ticks(db, b) - ta / tb) for b in (1, 2, 4)}
        assert min(miss, key=miss.get) == 2
    assert MTNLG_MICRO_BATCH == 2 and all(r.space.micro_batch == (2,) for r in mtnlg_runs())
    assert mtnlg_pipeline_ticks(8, 2) == 154 and mtnlg_pipeline_ticks(12, 1) == 194


def test_deepspeed_rows_are_planned_as_its_pipeline_engine_runs():
    bloom = published_runs()[0]
    for run in [bloom] + mtnlg_runs():
        w = run.workload
        assert (w.p2p, w.grad_accumulation_fusion, w.overlap_param_gather) == tuple(DEEPSPEED_PIPELINE_ENGINE.values())
        assert not w.fused_grad_accumulation


# --- the two terms ---------------------------------------------------------------------------------------------

GPT = gpt_model(4, 1024, 16, 51200, 1024)
A100 = Cluster(gpus=1, hw=hardware("a100-80g"))


def _gpt_params(layers: int, h: int, vocab: int, seq: int) -> int:
    """Narayanan et al. eq. (2) + the final LayerNorm: 12lh^2 + 13lh + (V + s)h + 2h (tied head)."""
    return 12 * layers * h * h + 13 * layers * h + (vocab + seq) * h + 2 * h


@pytest.mark.parametrize("fp32_grads,per_param", [(False, 6), (True, 10)])
def test_unfused_gradient_accumulation_adds_one_pass_per_micro_batch_after_the_first(fp32_grads, per_param):
    """m = 4 micro-batches on one GPU: the step grows by 3 passes of (new bf16 gradient read + accumulated one
    read and written) over every parameter -- 6 bytes with bf16 gradients, 2 + 4 + 4 with fp32 ones -- at the
    memory-bound rate, in the memory_bound term; the fused default adds nothing."""
    work = Workload(GPT, global_batch=4, seq_length=1024, fp32_grads=fp32_grads)
    assert work.fused_grad_accumulation  # the korthikanti profile's default: Megatron's fused kernels
    layout = Layout(micro_batch=1)
    fused = evaluate(work, A100, layout).time
    unfused = evaluate(dataclasses.replace(work, grad_accumulation_fusion=False), A100, layout).time
    expected = 3 * per_param * _gpt_params(4, 1024, 51200, 1024) / A100.hw.elementwise_bytes_per_s
    assert unfused.total - fused.total == pytest.approx(expected, rel=1e-6)
    assert unfused.term("memory_bound") - fused.term("memory_bound") == pytest.approx(expected, rel=1e-6)


def test_param_gather_without_overlap_is_exposed_in_full():
    """ZeRO 1 at dp 8: with the overlap (the default) the next forward hides part of the parameter all-gather;
    without it (DeepSpeed's ZeRO 1) dp_exposed is the whole reduce-scatter + all-gather, which is what the
    overlapped pricing gives when no forward runs under it."""
    cluster = Cluster(gpus=8, hw=hardware("a100-80g"))
    layout = Layout(dp=8, micro_batch=1, zero=ZeroStage.OPTIMIZER)
    work = Workload(GPT, global_batch=8, seq_length=1024, fp32_grads=False)
    hidden = evaluate(work, cluster, layout).time
    exposed = evaluate(dataclasses.replace(work, overlap_param_gather=False), cluster, layout).time
    psi = _gpt_params(4, 1024, 51200, 1024)
    assert exposed.term("dp_exposed") == pytest.approx(_dp_step_seconds(_context(work, cluster, layout), psi, 0.0))
    assert exposed.term("dp_exposed") > hidden.term("dp_exposed")
    assert exposed.total - hidden.total == pytest.approx(exposed.term("dp_exposed") - hidden.term("dp_exposed"))


def test_flags_reach_the_workload_and_explain_says_which_runtime_it_priced(capsys):
    base = ["--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "16", "--vocab-size", "51200",
            "--gpus", "8", "--global-batch-size", "8", "--seq-length", "1024"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parse = parser.parse_args
    default = workload_from_args(parse(base), GPT)
    assert (default.grad_accumulation_fusion, default.overlap_param_gather) == (None, True)
    flags = ["--no-gradient-accumulation-fusion", "--no-overlap-param-gather"]
    work = workload_from_args(parse(base + flags), GPT)
    assert (work.grad_accumulation_fusion, work.overlap_param_gather) == (False, False)
    assert main(base + flags + ["--zero-stage", "1", "--top", "1", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "gradient accumulation a pass a micro-batch, parameter all-gather exposed" in out


def _explained_terms(out: str) -> dict[str, float]:
    from hybrid.planner.time import TERMS
    rows = [line.split() for line in out.splitlines() if line.startswith("  ") and line.split()[0] in dict(TERMS)]
    return {r[0]: float(r[1]) for r in rows}


def test_explain_shows_the_engine_terms_where_they_land_and_still_adds_up(capsys):
    """`hybrid plan --explain` on a pipelined ZeRO 1 layout with many micro-batches, DeepSpeed's way (blocking
    messages, no gradient-accumulation fusion, the parameter all-gather exposed) against the default: every term
    is printed, the terms add up to the step, and the two engine costs land in memory_bound and dp_exposed
    (nothing else moves but the bubble, which scales with the passes) by what the Workload prices."""
    flags = ["--num-layers", "8", "--hidden-size", "2048", "--num-attention-heads", "16", "--vocab-size", "51200",
             "--gpus", "32", "--gpu", "a100-80g", "--global-batch-size", "64", "--seq-length", "2048",
             "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "2", "--micro-batch-size", "1",
             "--zero-stage", "1", "--virtual-pipeline-model-parallel-size", "1", "--recompute-granularity", "full",
             "--no-sequence-parallel", "--pipeline-p2p", "blocking", "--top", "1", "--explain"]
    steps, terms = [], []
    for extra in ([], ["--no-gradient-accumulation-fusion", "--no-overlap-param-gather"]):
        assert main(flags + extra) == 0
        out = capsys.readouterr().out
        steps.append(float(out.split(" takes ")[1].split(" s a step")[0]))
        terms.append(_explained_terms(out))
        assert sum(terms[-1].values()) == pytest.approx(steps[-1], rel=1e-3)
    fused, deepspeed = terms
    assert deepspeed["memory_bound"] > fused["memory_bound"] and deepspeed["dp_exposed"] > fused["dp_exposed"]
    for name in ("gemm", "tp", "pp_p2p", "optimizer", "other"):
        assert deepspeed[name] == pytest.approx(fused[name], rel=1e-3)
    assert steps[1] > steps[0]


def test_emit_args_runs_what_was_planned(capsys):
    """--emit-args passes --no-overlap-param-gather on to train.py when the plan priced the gather exposed at ZeRO
    1-2 (train.py's checks accept it); a fused gradient accumulation, which the eager runtime does not have, is
    refused with --emit-args in one line naming the flag."""
    base = ["--model", "tiny-gpt2", "--gpus", "4", "--global-batch-size", "8", "--seq-length", "64", "--gpu",
            "a100-80g", "--zero-stage", "1", "--top", "3", "--emit-args"]
    assert main(base + ["--no-overlap-param-gather"]) == 0
    emitted = capsys.readouterr().out
    assert "--zero-stage 1" in emitted and "--no-overlap-param-gather" in emitted
    assert main(base) == 0
    assert "overlap-param-gather" not in capsys.readouterr().out
    assert main(base + ["--gradient-accumulation-fusion"]) == 2
    err = capsys.readouterr().err
    assert "--gradient-accumulation-fusion" in err and len(err.strip().splitlines()) == 1
