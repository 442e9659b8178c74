"""ZB-H1 in the planner: its pipeline numbers from the simulation, its activation memory against the runtime's
ledger, and the search choosing it where it pays, with the reason.

* in flight (F to W) and between B and W: the planner's saturated simulation equals the full lists for every m;
* the makespan extrapolated in m equals the full simulation (B and W priced apart, the first stage's B empty);
* activations (ActivationProfile.FP32_FLASH, the runtime's own tensors, the output gradients B keeps for W
  included) equal the peak the saved-tensor ledger measures on 8 gloo ranks, byte for byte, except on the last
  stage: an upper bound there (its B frees the loss's tensors early), by at most (pp - 1) head sets;
* the search returns ZB-H1 beside 1F1B, says why, and its train.py flags carry --pipeline-schedule zbh1.
"""

from __future__ import annotations

import re

import pytest
import torch

from hybrid.measured_memory import SavedActivationLedger
from hybrid.mesh import Mesh, ParallelDims
from hybrid.pipeline import Costs, Op, ScheduleKind, build_schedule, compute_order, simulate
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.planner import Cluster, Layout, hardware, plan_memory
from hybrid.planner.cli import main as plan_main
from hybrid.planner.layout import Recompute, Workload, ZeroStage
from hybrid.planner.model import ActivationProfile, Precision
from hybrid.planner.schedule import WEIGHT_SHARE, StageTimes, in_flight, peak_held, run_pipeline
from hybrid.planner.search import SearchSpace, search
from hybrid.planner.train_flags import plan_flags
from hybrid.testing import launch, run_distributed
from hybrid.tp import TPContext
from hybrid.train_step import OptimizerConfig, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from models import build_pipeline_chunks, load_config, shift_labels

ZB_H1, ZBV = ScheduleKind.ZB_H1, ScheduleKind.ZBV


def test_in_flight_and_weight_pending_equal_the_full_simulation():
    for pp in range(1, 7):
        for m in range(1, 3 * pp + 2):
            full = simulate(build_schedule(ZB_H1, pp, m), Costs(1.0, 2.0, 0.1))
            got = in_flight(ZB_H1, pp, m, 1)
            assert got.chunks == full.peak_in_flight == (min(pp, m),) * pp, (pp, m)
            assert got.weight_pending == full.peak_weight_pending, (pp, m)


@pytest.mark.parametrize("pp", [2, 3, 5])
def test_extrapolated_zbh1_makespan_equals_the_full_simulation(pp):
    m = 7 * pp
    fwd = tuple(1.0 + 0.1 * (s % 3) + (0.4 if s == pp - 1 else 0) for s in range(pp))
    bwd = tuple(3.0 - 0.2 * (s % 2) + (0.7 if s == pp - 1 else 0) for s in range(pp))
    times = StageTimes(fwd, bwd, 0.05)
    run = run_pipeline(ZB_H1, pp, m, 1, times)
    costs = Costs(stage_forward=fwd, stage_backward=bwd, comm=0.05,
                  stage_weight_share=(1.0,) + (WEIGHT_SHARE,) * (pp - 1))
    full = simulate(build_schedule(ZB_H1, pp, m), costs)
    assert run.extrapolated and max(run.simulated_m) < m
    assert run.makespan == pytest.approx(full.makespan, rel=1e-9)
    one_f_one_b = run_pipeline(ScheduleKind.ONE_F_ONE_B, pp, m, 1, times)
    assert run.makespan < one_f_one_b.makespan


# --- activations against the runtime ledger ---------------------------------------------------------------------
WORLD, B, S, M = 8, 2, 32, 4
LAYOUTS = [("tiny-gpt2", 1, 4), ("tiny-llama", 2, 2), ("tiny-gpt2", 2, 2)]  # (model, tp, pp); dp = 8 / (tp pp)
ZBV_LAYOUTS = [("tiny-llama", 2, 2), ("tiny-gpt2", 2, 2)]  # ZBV: 2 pp = 4 stages of the tiny models' 4 layers


def _measure(rank: int, world: int) -> dict:
    out = {}
    for (name, tp, pp), kind in [(case, ZB_H1) for case in LAYOUTS] + [(case, ZBV) for case in ZBV_LAYOUTS]:
        cfg = load_config(name)
        mesh = Mesh.build(ParallelDims.from_world(world, tp=tp, pp=pp))
        v = 2 if kind is ZBV else 1
        stage_ids = [kind.placement.stage(mesh.coords.pp, c, pp) for c in range(v)]
        chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp), mesh.coords.pp, pp, v, seed=0, stage_ids=stage_ids)
        runner = PipelineExecutor(chunks, build_schedule(kind, pp, M, v)[mesh.coords.pp], mesh.pp,
                                  StageIO((B, S, cfg.hidden_size)), mesh.device, placement=kind.placement,
                                  on_weight_hold=lambda t, owner, mb, c: saved.track(t, owner, ("kept", mb, c)))
        optimizer = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=1), OptimizerConfig(clip_grad=1.0))
        runner.before_weight = optimizer.gather_chunk
        # after the optimizer: it moves the parameters into its flat buffers, whose storages the ledger must skip
        # (made before, it would skip the old, freed addresses instead -- and any activation reusing one)
        saved = SavedActivationLedger(params=chunks.parameters(), recomputation=True)
        gen = torch.Generator().manual_seed(mesh.coords.dp)
        batches = [(x, shift_labels(x)) for x in (torch.randint(0, cfg.vocab_size, (B, S), generator=gen)
                                                  for _ in range(M))]
        with saved:
            train_step(chunks, batches, optimizer, mesh, runner=runner)
        out[(name, tp, pp, kind)] = (mesh.coords.pp, saved.peak_bytes)
    return out


@pytest.fixture(scope="module")
def measured():
    return run_distributed(_measure, WORLD, timeout=600)


@pytest.mark.parametrize("case", LAYOUTS, ids=[f"{n}-tp{t}-pp{p}" for n, t, p in LAYOUTS])
def test_zbh1_activations_equal_the_ledgers_peak(measured, case):
    name, tp, pp = case
    dp = WORLD // (tp * pp)
    work = Workload(load_config(name), global_batch=dp * B * M, seq_length=S, precision=Precision.FP32,
                    activations=ActivationProfile.FP32_FLASH)
    layout = Layout(tp=tp, pp=pp, dp=dp, micro_batch=B, zero=ZeroStage(1), zero_bubble=True)
    memory = plan_memory(work, Cluster(gpus=WORLD, hw=hardware("cpu")), layout)
    head = work.shard(tp).head_activation_bytes(B, S, False)
    for per_rank in measured:
        pp_rank, peak = per_rank[(*case, ZB_H1)]
        predicted = memory.ranks[pp_rank].activations
        # the last stage: an upper bound by up to (pp - 1) head sets: its B frees the loss's tensors (the graph
        # above the LM head's weight node) before the next F, which the planner does not subtract
        over = (pp - 1) * head if pp_rank == pp - 1 else 0
        assert peak <= predicted <= peak + over, f"pp rank {pp_rank}: measured {peak}, predicted {predicted}"


@pytest.mark.parametrize("case", ZBV_LAYOUTS, ids=[f"{n}-tp{t}-pp{p}" for n, t, p in ZBV_LAYOUTS])
def test_zbv_activations_equal_the_ledgers_peak(measured, case):
    name, tp, pp = case
    dp = WORLD // (tp * pp)
    work = Workload(load_config(name), global_batch=dp * B * M, seq_length=S, precision=Precision.FP32,
                    activations=ActivationProfile.FP32_FLASH)
    layout = Layout(tp=tp, pp=pp, dp=dp, v=2, micro_batch=B, zero=ZeroStage(1), zero_bubble=True)
    assert layout.schedule is ZBV
    memory = plan_memory(work, Cluster(gpus=WORLD, hw=hardware("cpu")), layout)
    head = work.shard(tp).head_activation_bytes(B, S, False)
    for per_rank in measured:
        pp_rank, peak = per_rank[(*case, ZBV)]
        predicted = memory.ranks[pp_rank].activations
        # rank 0 holds the last stage (the LM head): its B frees the loss's tensors before W, which the planner
        # does not subtract; rank 0 runs each last-stage W right after its B (warm-up triples F B W, steady B W),
        # so at most one head set is over-counted there
        over = head if pp_rank == 0 else 0
        assert peak <= predicted <= peak + over, f"pp rank {pp_rank}: measured {peak}, predicted {predicted}"


# --- the search --------------------------------------------------------------------------------------------------


def _llama_8b_pp4():
    work = Workload(load_config("llama-3-8b"), global_batch=64, seq_length=2048, fp32_grads=False)
    hw = hardware("h100-80g")
    space = SearchSpace(pp=(4,), v=(1,), tp=(1,), micro_batch=(1,), zero=(ZeroStage(1),))
    return work, Cluster(gpus=16, hw=hw), space


def test_search_chooses_zbh1_where_it_pays_and_says_why():
    work, cluster, space = _llama_8b_pp4()
    result = search(work, cluster, space, top=3)
    best = result.plans[0]
    assert best.layout.zero_bubble and best.layout.schedule is ZB_H1
    twin = next(p for p in result.plans if not p.layout.zero_bubble and p.layout.recompute is best.layout.recompute)
    assert best.time.total < twin.time.total and best.bubble_fraction < twin.bubble_fraction
    note = result.notes[best.layout.short()]
    assert note.startswith("zbh1 over 1f1b on this layout: bubble ") and "GB" in note
    assert plan_flags(work, best.layout)["pipeline_schedule"] == "zbh1"
    assert plan_flags(work, twin.layout)["pipeline_schedule"] is None


def test_search_keeps_1f1b_when_zero_bubble_is_pinned_off_or_does_not_fit():
    work, cluster, space = _llama_8b_pp4()
    from dataclasses import replace
    off = search(work, cluster, replace(space, zero_bubble=(False,)), top=3)
    assert not any(p.layout.zero_bubble for p in off.plans) and not off.notes
    on = search(work, cluster, space, top=3)
    zb = next(p for p in on.plans if p.layout.zero_bubble)
    one = next(p for p in on.plans if not p.layout.zero_bubble and p.layout.recompute is zb.layout.recompute)
    # a device just big enough for the 1F1B layout but not for its ZB-H1 twin (which holds more activations)
    capacity = (one.memory.peak.total + zb.memory.peak.total) / 2
    small = replace(cluster, hw=replace(cluster.hw, memory_bytes=capacity))
    tight = search(work, small, replace(space, recompute=(one.layout.recompute,)), top=3)
    assert tight.plans and not any(p.layout.zero_bubble for p in tight.plans)


# --- ZBV ---------------------------------------------------------------------------------------------------------


def _zbv_closed_form(pp: int, m: int, t: float) -> float:
    """ZBV's makespan at tF = tB = tW = t per chunk, messages free (tests/test_pipeline_zero_bubble.py derives it
    on the full lists): 6 m t + max(2 (2 pp - 1 - m), pp - 1) t."""
    return 6 * m * t + max(2 * (2 * pp - 1 - m), pp - 1) * t


def test_zbv_predicted_bubble_is_the_closed_form_at_equal_costs():
    """The planner's path (run_pipeline: saturated at 2 pp - 1, extrapolated beyond, the first stage's B empty and
    its W the whole backward) gives the closed form's makespan and bubble 1 - 6 m t / T, for every m."""
    for pp in (2, 3, 4, 7):
        for m in [*range(1, 4 * pp + 1), 10 * pp, 37 * pp + 3]:
            t = 0.5
            run = run_pipeline(ZBV, pp, m, 2, StageTimes((t,) * (2 * pp), (2 * t,) * (2 * pp), 0.0))
            makespan = _zbv_closed_form(pp, m, t)
            assert run.makespan == pytest.approx(makespan, rel=1e-12), (pp, m)
            assert run.bubble_fraction == pytest.approx(1 - 6 * m * t / makespan, abs=1e-12), (pp, m)
            assert run.extrapolated == (m > 2 * pp - 1 + 2)


def test_zbv_peak_bytes_saturate_and_rank_0_runs_each_head_w_right_after_its_b():
    """peak_held (the planner's ZBV activations) simulates min(m, 2 pp - 1) micro-batches: the same peak as the
    full compute order for every larger m; and on rank 0 each last-stage B is followed by its W (why the head
    set is over-counted at most once, test_zbv_activations_equal_the_ledgers_peak)."""
    def full(pp, m, r, held, kept):
        total = peak = 0.0
        for a in compute_order(ZBV, pp, r, m, 2):
            total += {Op.FORWARD: held[a.chunk], Op.BACKWARD_INPUT: kept[a.chunk],
                      Op.BACKWARD_WEIGHT: -held[a.chunk] - kept[a.chunk]}[a.op]
            peak = max(peak, total)
        return peak

    for pp in range(2, 7):
        for m in range(1, 4 * pp + 1):
            for r in range(pp):
                held, kept = (3.0 + r, 5.0 - r / 2), (0.0 if r == 0 else 1.5, 2.25 + r)
                assert peak_held(ZBV, pp, m, 2, r, held, kept) == full(pp, m, r, held, kept), (pp, m, r)
            order = compute_order(ZBV, pp, 0, m, 2)
            for i, a in enumerate(order):
                if a.op is Op.BACKWARD_INPUT and a.chunk == 1:
                    assert order[i + 1] == a.__class__(Op.BACKWARD_WEIGHT, a.microbatch, 1), (pp, m, i)


def _tiny_llama_on_two_h100(**pins):
    work = Workload(load_config("tiny-llama"), global_batch=8, seq_length=32, precision=Precision.FP32,
                    activations=ActivationProfile.FP32_FLASH)
    space = SearchSpace(pp=(2,), micro_batch=(2,), **pins)
    return work, Cluster(gpus=2, hw=hardware("h100-80g")), space


def test_search_chooses_zbv_where_it_pays_and_says_why():
    """tiny-llama, pp 2, m 4 micro-batches: ZBV's V leaves 7 % of the step idle against 1F1B's 23 % and ZB-H1's
    13 %, at the same memory: chosen, the reason in the notes, --pipeline-schedule zbv (and no virtual-stage
    flag: the schedule fixes two chunks) in the flags."""
    work, cluster, space = _tiny_llama_on_two_h100()
    result = search(work, cluster, space, top=4)
    best = result.plans[0]
    assert best.layout.schedule is ZBV and best.layout.v == 2 and best.layout.short().endswith(" zbv")
    others = {p.layout.schedule: p for p in result.plans[1:] if p.layout.micro_batch == best.layout.micro_batch}
    for kind in (ScheduleKind.ONE_F_ONE_B, ZB_H1, ScheduleKind.INTERLEAVED):
        assert best.time.total < others[kind].time.total and best.bubble_fraction < others[kind].bubble_fraction
    note = result.notes[best.layout.short()]
    assert note.startswith(f"zbv over 1f1b on this layout: bubble {100 * best.bubble_fraction:.1f}% vs "
                           f"{100 * others[ScheduleKind.ONE_F_ONE_B].bubble_fraction:.1f}%"), note
    assert "embedding and LM head both on rank 0" in note
    flags = plan_flags(work, best.layout)
    assert flags["pipeline_schedule"] == "zbv" and flags["num_layers_per_virtual_pipeline_stage"] is None
    assert flags["virtual_pipeline_model_parallel_size"] is None


def test_search_keeps_1f1b_over_zbv_when_zbv_does_not_fit_and_says_why():
    """Llama 3 8B, pp 4 on 16 H100: a device just big enough for the 1F1B layout but not for its zero-bubble
    twins (ZBV holds 2 pp half-size chunk sets on every rank, and rank 0 the embedding and the head too):
    1F1B is kept, and the note under its layout names ZBV's memory. Pinned to v = 1, ZBV is not tried."""
    from dataclasses import replace
    work = Workload(load_config("llama-3-8b"), global_batch=64, seq_length=2048, fp32_grads=False)
    cluster = Cluster(gpus=16, hw=hardware("h100-80g"))
    space = SearchSpace(pp=(4,), v=(1, 2), tp=(1,), micro_batch=(1,), zero=(ZeroStage(1),),
                        recompute=(Recompute.NONE,))
    free = search(work, cluster, space, top=4)
    one = next(p for p in free.plans if p.layout.schedule is ScheduleKind.ONE_F_ONE_B)
    zbv = next(p for p in free.plans if p.layout.schedule is ZBV)
    assert zbv.time.total < one.time.total and zbv.memory_gb > one.memory_gb
    small = replace(cluster, hw=replace(cluster.hw, memory_bytes=(one.memory.peak.total + zbv.memory.peak.total) / 2))
    tight = search(work, small, space, top=4)
    assert tight.plans and not any(p.layout.zero_bubble for p in tight.plans)
    note = tight.notes[one.layout.short()]
    assert note.startswith("1f1b on this layout: ") and "zbv does not fit (OOM on stage 0: needs " in note, note
    pinned = search(work, cluster, replace(space, v=(1,)), top=4)
    assert not any(p.layout.schedule is ZBV for p in pinned.plans)


@pytest.mark.slow
def test_hybrid_plan_prints_zbv_and_its_emitted_flags_train(capsys):
    """`hybrid plan` for tiny-llama on 2 H100s (pp 2, micro-batch 2) reports ZBV and why; --emit-args prints
    --pipeline-schedule zbv, and those flags train two iterations through train.py on 2 CPU ranks."""
    argv = ["--model", "tiny-llama", "--gpus", "2", "--gpu", "h100-80g", "--precision", "fp32",
            "--activation-profile", "fp32-flash", "--global-batch-size", "8", "--seq-length", "32",
            "--pipeline-model-parallel-size", "2", "--micro-batch-size", "2"]
    assert plan_main(argv) == 0
    report = capsys.readouterr().out
    assert re.search(r"^ 1  tp1 pp2 dp1 v2 b2 z0 none zbv ", report, re.M), report
    assert "schedule: zbv over 1f1b on this layout: bubble " in report, report
    assert plan_main([*argv, "--emit-args"]) == 0
    flags = capsys.readouterr().out.split()
    assert flags[flags.index("--pipeline-schedule") + 1] == "zbv", flags
    runs = launch([*flags, "--train-iters", "2", "--log-interval", "1", "--eval-iters", "0"], 2, timeout=600)
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    lines = [ln for ln in runs[-1].stdout.splitlines() + runs[0].stdout.splitlines() if ln.startswith(" iteration")]
    assert len(lines) == 2, runs[0].stdout[-2000:]


# --- DualPipeV: why it is not a schedule here (docs/pipeline.md) ------------------------------------------------


def _dualpipev_orders(pp: int, m: int) -> list[list]:
    """torch's ScheduleDualPipeV compute lists (its private generator, called without stages), each OVERLAP_F_B
    pair flattened to its F then its full backward -- what torch's runtime runs when no overlap function is
    registered -- as our actions on the V."""
    from types import SimpleNamespace

    from torch.distributed.pipelining.schedules import ScheduleDualPipeV, _ComputationType as T

    from hybrid.pipeline import Placement
    from hybrid.pipeline.schedules import Action
    ops = {T.FORWARD: Op.FORWARD, T.FULL_BACKWARD: Op.BACKWARD, T.BACKWARD_INPUT: Op.BACKWARD_INPUT,
           T.BACKWARD_WEIGHT: Op.BACKWARD_WEIGHT}
    out = []
    for r in range(pp):
        torch_list = ScheduleDualPipeV._calculate_single_rank_operations(
            SimpleNamespace(pp_group_size=pp, _n_microbatches=m), r)
        flat = [s for a in torch_list for s in (a.sub_actions if a.computation_type is T.OVERLAP_F_B else (a,))]
        assert all(Placement.V.rank_chunk(s.stage_index, pp)[0] == r for s in flat)
        out.append([Action(ops[s.computation_type], s.microbatch_index, Placement.V.rank_chunk(s.stage_index, pp)[1])
                    for s in flat])
    return out


def test_dualpipev_without_its_overlap_is_zbv_with_one_more_chunk_in_flight():
    """DualPipeV's lists, pairs run one after the other, fit the schedules-as-data machinery as they are (our
    message placement pairs them, the simulation runs them without deadlock), and at tF = tB = tW give exactly
    ZBV's makespan with one more (micro-batch, chunk) set in flight on every rank: without overlapping a pair's
    F and B (two streams; DeepSeek hides one micro-batch's all-to-all and p2p behind the other's compute) it
    brings nothing ZBV does not."""
    from hybrid.pipeline import Placement
    from hybrid.pipeline.schedules import _with_communication
    costs = Costs(forward=1, backward=2, weight_share=0.5)
    for pp in (2, 4):
        for m in (2 * pp, 3 * pp):
            lists = _with_communication(_dualpipev_orders(pp, m), pp, 2, Placement.V)
            dual = simulate(lists, costs, placement=Placement.V)
            zbv = simulate(build_schedule(ZBV, pp, m, 2), costs, placement=Placement.V)
            assert dual.makespan == zbv.makespan == _zbv_closed_form(pp, m, 1.0), (pp, m)
            assert dual.peak_in_flight == tuple(c + 1 for c in zbv.peak_in_flight) == (2 * pp + 1,) * pp
