"""DiLoCo (hybrid/diloco): local updates over DP replicas, each a whole TP x PP (x ZeRO) model.

* Exactness: with H = 1, outer lr 1, outer momentum 0 and SGD inside, DiLoCo is synchronous data parallelism
  (theta - 1/R sum_r lr g_r): on tp2 x pp2 x dp2 (replicas = the DP groups) and on tp2 x dp4 with 2 replicas of
  ZeRO-1 (and of ZeRO-2) over 2 ranks each, the weights after STEPS steps equal one process's SGD on the whole
  global batch.
* A DiLoCo run with H = 4 and AdamW inside (train.py's defaults, outer Nesterov lr 0.7, momentum 0.9) equals a
  hand-written single-process simulation: R models, each on its replica's rows, the outer step written out.
  Streaming DiLoCo (K = 2 fragments) against the same simulation syncing half the parameters at a time.
* The ledger: the outer all-reduce ("diloco") moves 4 bytes x this rank's parameters every H steps (K fragments:
  the fragment's parameters every H / K steps), counted from the model's parameters, not the engine's units; the
  DP group moves no training bytes at all.

Tolerances (fp32, eps = 2^-23 ~ 1.19e-7).
* SGD exactness: the parallel run sums gradients in another order (TP partial sums, micro-batches, the replicas'
  average) -- each gradient off by at most ~NOISE = 1e-6 of the terms it sums, bounded by the model's largest
  gradient (a key bias's gradient is such a sum cancelling to 0: attention ignores it) -- and DiLoCo rebuilds the
  update as theta - (theta - theta_r), two more roundings of |theta|'s size per step. Per element after STEPS
  steps: |w - w_ref| <= STEPS * (lr * NOISE * max|g| + 4 eps max|w|). A replica average taken as a sum (x2), a
  missed sync or a skipped replica moves the weights by lr * |g| per step: ~1e3 times that bound.
* The H = 4 simulation runs the same kernels on the same rows in the same order as each replica (one process, the
  fused AdamW both sides, the clipping norm summed as the ZeRO optimizer sums it), and writes the outer step with
  torch's elementary ops in the order torch's SGD applies them: the weights must agree bit for bit. (A tolerance
  would not do here: a last-bit difference in theta changes the noise-level gradient of, e.g., a key bias --
  attention is invariant to it -- and Adam turns noise into steps of size lr.)
"""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
import torch

from hybrid.comm import CommLedger
from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.diloco import DiLoCoConfig, bench
from hybrid.diloco.replicas import inner_cross_ranks
from hybrid.diloco.run import LocalUpdates
from hybrid.mesh import Mesh, ParallelDims
from hybrid.pipeline import ScheduleKind, build_schedule
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.testing import run_distributed
from hybrid.tp import TPContext, gather_full, spec_of
from hybrid.trail import TRAIL
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, build_optimizer, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from models import build_pipeline_chunks, load_config
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)

MODEL, GLOBAL, MICRO, SEQ, SEED, DATA_SEED = "tiny-gpt2", 8, 2, 32, 7, 3
EPS32 = torch.finfo(torch.float32).eps
# --- exactness: SGD inside, H = 1, eta = 1, mu = 0 ----------------------------------------------------------
SGD_STEPS, SGD_LR, NOISE = 4, 0.5, 1e-6
SGD = OptimizerConfig(lr=SGD_LR, min_lr=SGD_LR, decay_style="constant", train_iters=SGD_STEPS, clip_grad=0.0,
                      optimizer="sgd", sgd_momentum=0.0)  # clipping: each replica would clip its own gradient
EXACT = DiLoCoConfig(inner_steps=1, outer_lr=1.0, outer_momentum=0.0)
# --- the simulation: AdamW with train.py's defaults inside, H = 4 -------------------------------------------
SIM_STEPS = 8
ADAMW = OptimizerConfig(lr=1e-3, min_lr=1e-4, warmup_iters=2, decay_style="cosine", train_iters=SIM_STEPS,
                        clip_grad=1.0)
DILOCO = DiLoCoConfig(inner_steps=4, outer_lr=0.7, outer_momentum=0.9)
STREAMING = dataclasses.replace(DILOCO, fragments=2)
# Streaming DiLoCo's overlap: each fragment's all-reduce posted after its step, applied tau = 1 step later, mixed
# with alpha 0.5 (a value at which torch.lerp takes its second formula: end - (end - start)(1 - w)); and the whole
# model (K = 1) in flight for tau = 3 steps, alpha 0
OVERLAP = dataclasses.replace(STREAMING, fragment_sync_delay=1, fragment_update_alpha=0.5)
OVERLAP_K1 = dataclasses.replace(DILOCO, fragment_sync_delay=3)
LINK_S = 1.0  # the simulated link (--simulated-dp-bandwidth): seconds for one outer all-reduce of the whole model


def _weights(chunks, mesh: Mesh) -> dict[str, torch.Tensor]:
    return {n: gather_full(p.detach().float(), spec_of(p), mesh.tp).clone()
            for c in chunks for n, p in c.named_parameters()}


def _train(mesh: Mesh, cfg: DiLoCoConfig, opt_cfg: OptimizerConfig, steps: int, stage: int = 0,
           link_s: float = 0.0) -> dict:
    """`steps` steps of DiLoCo as train.py runs them (hybrid/diloco/run.py's hooks); weights, ledger bytes.
    link_s: a simulated cross-replica link (--simulated-dp-bandwidth) at which the whole model takes link_s s."""
    model_cfg = load_config(MODEL)
    chunks = build_pipeline_chunks(model_cfg, TPContext(mesh.tp), mesh.coords.pp, mesh.dims.pp, 1, seed=SEED)
    spec = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp)
    if mesh.dims.pp > 1:
        schedule = build_schedule(ScheduleKind.ONE_F_ONE_B, mesh.dims.pp, spec.num_micro_batches, 1)[mesh.coords.pp]
        runner = PipelineExecutor(chunks, schedule, mesh.pp, StageIO((MICRO, SEQ, model_cfg.hidden_size),
                                                                     torch.float32), mesh.device)
    else:
        runner = LocalForwardBackward(chunks[0], mesh.device)
    local_params = sum(p.numel() for c in chunks for p in c.parameters())
    local = LocalUpdates.build(cfg, mesh, 4 * local_params / (link_s * 1e9) if link_s else 0.0)
    opt = ZeroOptimizer(chunks, local.mesh, ZeroConfig(stage=stage), opt_cfg)
    local.checkpointed(opt)
    corpus = load_corpus()
    mesh.ledger.reset()
    per_sync, in_flight, exposed, clock = [], [], [], []
    for it in range(steps):
        before, during = mesh.ledger.bytes("all_reduce", "diloco"), _outer_in_flight()
        train_step(chunks, micro_batches(corpus, spec, DATA_SEED, it, mesh.coords.dp), opt, mesh,
                   lr=opt_cfg.lr_at(it), runner=runner)
        in_flight.append(during and _outer_in_flight())  # posted before this inner step, not waited until after it
        clock.append(time.monotonic())  # the inner step done, before after_step
        local.after_step(it)
        clock.append(time.monotonic())
        exposed.append(local.outer.exposed)  # seconds waited on the simulated link so far
        per_sync.append(mesh.ledger.bytes("all_reduce", "diloco") - before)
    local.finish()
    with opt.gathered():
        weights = _weights(chunks, mesh)
    return {"weights": weights, "per_step": per_sync, "in_flight": in_flight, "dp_bytes": mesh.ledger.bytes(group="dp"),
            "exposed": exposed, "clock": clock, "local_params": local_params,
            "fragment_params": [sum(local.outer.views[i].numel() for i in f) for f in local.outer.fragments]}


def _outer_in_flight() -> bool:
    """An outer all-reduce ("diloco") posted and not yet waited for, as the op trail (hybrid/trail.py) sees it."""
    return any(r.group == "diloco" and r.op == "all_reduce" for r in TRAIL.pending)


def _world8(rank: int, world: int) -> dict:
    out = {}
    mesh = Mesh.build(ParallelDims.from_world(world, tp=2, pp=2))  # dp 2: replicas = the DP groups
    out["tp2-pp2-dp2"] = _train(mesh, EXACT, SGD, SGD_STEPS)
    mesh = Mesh.build(ParallelDims.from_world(world, tp=2), ledger=CommLedger())  # dp 4: 2 replicas x ZeRO-1 over 2
    out["tp2-dp4-r2-zero1"] = _train(mesh, dataclasses.replace(EXACT, replicas=2), SGD, SGD_STEPS, stage=1)
    out["tp2-dp4-r2-zero2"] = _train(mesh, dataclasses.replace(EXACT, replicas=2), SGD, SGD_STEPS, stage=2)
    for name, cfg in (("bench-sync", None), ("bench-diloco", BENCH_DILOCO)):  # hybrid/diloco/bench.py's rows
        out[name] = bench._run(Mesh.build(ParallelDims.from_world(world, tp=2, pp=2)), cfg, BENCH_H, 32)
    return out


# the bench's rows (its code, its DiLoCo but for H) at H = 2: the byte ratio is H at any H, and 2 steps a row instead
# of the bench's 8 (8 ranks, 4 micro-batches a step through 1F1B; the held-out loss's 4 batches stay)
BENCH_H = 2
BENCH_DILOCO = dataclasses.replace(bench.DILOCO, inner_steps=BENCH_H)


def _world2(rank: int, world: int) -> dict:
    mesh = Mesh.build(ParallelDims.from_world(world))
    return {"diloco": _train(mesh, DILOCO, ADAMW, SIM_STEPS),
            "streaming": _train(mesh, STREAMING, ADAMW, SIM_STEPS),
            "overlap": _train(mesh, OVERLAP, ADAMW, SIM_STEPS),
            "overlap-k1": _train(mesh, OVERLAP_K1, ADAMW, SIM_STEPS),
            "link-blocking": _train(mesh, DILOCO, ADAMW, 4, link_s=LINK_S),
            "link-overlap": _train(mesh, OVERLAP_K1, ADAMW, 7, link_s=LINK_S)}


# --- references ---------------------------------------------------------------------------------------------
def _model():
    mesh = Mesh.single()
    return build_pipeline_chunks(load_config(MODEL), TPContext(mesh.tp), 0, 1, 1, seed=SEED), mesh


def _sgd_reference() -> dict:
    """One process, the whole global batch, torch SGD (the groups of training.build_optimizer)."""
    chunks, mesh = _model()
    params = list(chunks.parameters())
    opt = torch.optim.SGD([{"params": [p for p in params if p.dim() >= 2], "weight_decay": SGD.weight_decay},
                           {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=SGD_LR)
    spec, corpus, gmax = BatchSpec(GLOBAL, MICRO, SEQ, 1), load_corpus(), {}
    for it in range(SGD_STEPS):
        opt.zero_grad(set_to_none=True)
        LocalForwardBackward(chunks[0], mesh.device).forward_backward(micro_batches(corpus, spec, DATA_SEED, it, 0))
        for n, p in chunks[0].named_parameters():
            gmax[n] = max(gmax.get(n, 0.0), p.grad.abs().max().item())
        opt.step()
    return {"weights": _weights(chunks, mesh), "gmax": gmax}


def _simulation(cfg: DiLoCoConfig, replicas: int = 2) -> list[dict[str, torch.Tensor]]:
    """DiLoCo written out: `replicas` separate models, each AdamW (train.py's: fused, decay on matrices, clipped
    by its own norm) on its replica's rows; every H steps the averaged delta and the outer Nesterov step by hand.
    Fragments: the parameters in the optimizer's order (hybrid/zero: backward order, the tied embedding first),
    split into K runs; fragment f's delta is taken after step t when (t + 1) mod H = ((f + 1) H / K) mod H, and
    its outer step runs tau steps later (Streaming DiLoCo's overlap), each replica then taking
    lerp(theta, its own weights, alpha) (torchft's merge; alpha = 0: theta)."""
    models = [_model()[0] for _ in range(replicas)]
    opts = [build_optimizer(m, ADAMW) for m in models]
    names = _optimizer_order(models[0])
    theta = {n: p.detach().clone() for n, p in models[0][0].named_parameters()}
    b = {n: torch.zeros_like(t) for n, t in theta.items()}
    k, h, tau, alpha = cfg.fragments, cfg.inner_steps, cfg.fragment_sync_delay, cfg.fragment_update_alpha
    sent: dict[int, dict[str, torch.Tensor]] = {}  # fragment -> its averaged delta, between post and apply
    fragments = [names[f * len(names) // k:(f + 1) * len(names) // k] for f in range(k)]
    spec, corpus = BatchSpec(GLOBAL, MICRO, SEQ, replicas), load_corpus()
    for it in range(SIM_STEPS):
        for r, (m, opt) in enumerate(zip(models, opts)):
            opt.zero_grad(set_to_none=True)
            LocalForwardBackward(m[0], torch.device("cpu")).forward_backward(
                micro_batches(corpus, spec, DATA_SEED, it, r))
            _clip(m, names, ADAMW.clip_grad)
            for group in opt.param_groups:
                group["lr"] = ADAMW.lr_at(it)
            opt.step()
        live = {n: [dict(m[0].named_parameters())[n] for m in models] for n in names}
        for f in range(k):
            if (it + 1) % h == ((f + 1) * h // k) % h:  # delta = 1/R sum_r (theta - theta_r), sent now
                sent[f] = {n: sum(theta[n] - p for p in live[n]) / replicas for n in fragments[f]}
            if (it + 1 - tau) % h != ((f + 1) * h // k) % h or f not in sent:
                continue
            with torch.no_grad():
                for n, delta in sent.pop(f).items():
                    b[n] = b[n].mul(cfg.outer_momentum).add(delta)  # b <- mu b + delta
                    theta[n] = theta[n].add(delta.add(b[n], alpha=cfg.outer_momentum), alpha=-cfg.outer_lr)
                    for p in live[n]:
                        p.copy_(torch.lerp(theta[n], p, alpha) if alpha else theta[n])
    return [{n: p.detach().clone() for n, p in m[0].named_parameters()} for m in models]  # apart since their sync


def _clip(chunks, names: list[str], max_norm: float) -> None:
    """Clip by the global norm as the ZeRO optimizer does (hybrid/zero/engine.py: fp64 sum of squared per-tensor
    norms; torch's clip_grad_norm_ sums in fp32, a last-bit different coefficient): the inner steps then agree bit
    for bit and the comparison isolates the outer step. `names`: the optimizer's order, the order of its sum."""
    params = dict(chunks[0].named_parameters())
    grads = [params[n].grad for n in names]
    norm = math.sqrt(torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float64)).square().sum().item())
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)


def _optimizer_order(chunks) -> list[str]:
    """The parameters in ZeroOptimizer's segment order at stage 0 on one rank: the tied embedding's unit, then the
    rest in backward order -- read from a ZeroOptimizer on one process (its order, not its values)."""
    opt = ZeroOptimizer(chunks, Mesh.single(), ZeroConfig(), ADAMW)
    name = {id(p): n for n, p in chunks[0].named_parameters()}
    return [name[id(s.param)] for u in opt.units for s in u.segments]


def _one_thread(fn, *args):
    """As the ranks run (one thread each): a matmul's reduction order depends on the thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def world8():
    return run_distributed(_world8, 8, timeout=600)


@pytest.fixture(scope="module")
def world2():
    return run_distributed(_world2, 2, timeout=300)


# --- tests --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["tp2-pp2-dp2", "tp2-dp4-r2-zero1", "tp2-dp4-r2-zero2"])
def test_diloco_h1_sgd_equals_synchronous_dp(case, world8):
    ref = _one_thread(_sgd_reference)
    gmax = max(ref["gmax"].values())  # rounding is relative to the terms summed: a key bias's gradient cancels to 0
    for r in world8:
        for n, w in r[case]["weights"].items():
            want = ref["weights"][n]
            bound = SGD_STEPS * (SGD_LR * NOISE * gmax + 4 * EPS32 * want.abs().max().item())
            dev = (w - want).abs().max().item()
            assert dev <= bound, f"{case} {n}: off by {dev:.3g} > {bound:.3g}"


SIM_CASES = {"diloco": DILOCO, "streaming": STREAMING, "overlap": OVERLAP, "overlap-k1": OVERLAP_K1}


@pytest.mark.parametrize("case", list(SIM_CASES))
def test_diloco_h4_adamw_equals_simulation(case, world2):
    ref = _one_thread(_simulation, SIM_CASES[case])
    for rank, r in enumerate(world2):  # replica = DP rank; K = 2 ends with fragment 0 two steps past its sync
        for n, w in r[case]["weights"].items():
            want = ref[rank][n]
            assert torch.equal(w, want), f"{case} replica {rank} {n}: off by {(w - want).abs().max().item():.3g}"


def test_diloco_ledger_full_model_every_h_steps(world2, world8):
    got = world2[0]["diloco"]
    model_bytes = 4 * got["local_params"]  # fp32 deltas of every parameter this rank holds, once
    assert got["per_step"] == [0, 0, 0, model_bytes] * (SIM_STEPS // 4)
    assert got["dp_bytes"] == 0  # no gradient all-reduce across replicas
    for r in world8:  # tp2 x pp2: each rank its TP / PP share, every step (H = 1)
        assert r["tp2-pp2-dp2"]["per_step"] == [4 * r["tp2-pp2-dp2"]["local_params"]] * SGD_STEPS


def test_streaming_diloco_syncs_one_fragment_at_a_time(world2):
    got = world2[0]["streaming"]
    frag = [4 * n for n in got["fragment_params"]]
    assert sum(frag) == 4 * got["local_params"] and min(frag) > 0
    assert got["per_step"] == [0, frag[0], 0, frag[1]] * (SIM_STEPS // 4)


def test_overlapped_sync_is_in_flight_while_the_next_inner_steps_run(world2):
    """tau > 0: the outer all-reduce is posted after its fragment's step (its bytes on the ledger then) and waited
    for only after the next tau inner steps, which run with it pending on the op trail; tau = 0 waits at once.
    (Were the wait moved back to the post, no inner step would see it pending.)"""
    for r in world2:
        frag = [4 * n for n in r["overlap"]["fragment_params"]]
        assert r["overlap"]["per_step"] == r["streaming"]["per_step"] == [0, frag[0], 0, frag[1]] * 2
        # K = 2, tau = 1: f0 posted after step 2 (1-based), in flight during step 3; f1 after 4, during 5; ...
        assert r["overlap"]["in_flight"] == [False, False, True, False, True, False, True, False]
        # K = 1, tau = 3: the whole model posted after step 4, in flight during steps 5-7, applied after 7
        assert r["overlap-k1"]["in_flight"] == [False] * 4 + [True] * 3 + [False]
        assert r["overlap-k1"]["per_step"] == r["diloco"]["per_step"]
        assert not any(r["streaming"]["in_flight"]) and not any(r["diloco"]["in_flight"])


def test_simulated_link_is_hidden_behind_the_inner_steps(world2):
    """--simulated-dp-bandwidth on the outer all-reduce: it completes LINK_S after its post. Blocking (tau = 0) the
    sync waits for (nearly) all of it; overlapped (K = 1, tau = 3: posted after step 4, waited after step 7) the
    three inner steps run meanwhile and at least their time (up to LINK_S) is hidden -- were the wait at the post,
    nothing would be."""
    for r in world2:
        blocking = r["link-blocking"]["exposed"]
        assert blocking[:3] == [0.0] * 3 and LINK_S / 2 < blocking[3] <= LINK_S  # (less only the all-reduce's own wait)
        got, clock = r["link-overlap"], r["link-overlap"]["clock"]
        assert got["exposed"][:6] == [0.0] * 6  # posted after step 4, not waited for during steps 5-7
        inner = clock[12] - clock[7]  # from the post's return (after step 4) to step 7's end: three inner steps
        hidden = LINK_S - got["exposed"][6]
        assert inner > 0 and hidden >= min(LINK_S, inner) - 1e-3, (hidden, inner)


def test_bench_row_counts_one_model_all_reduce_per_h_steps(world8):
    """The bench's DP bytes (hybrid/diloco/bench.py, H steps at tp2 x pp2 x dp2; H = BENCH_H): synchronous AdamW
    all-reduces the gradients every step, DiLoCo the deltas once -- the same bytes a time, H x fewer in all."""
    for r in world8:
        sync, diloco = r["bench-sync"], r["bench-diloco"]
        assert len(sync["losses"]) == len(diloco["losses"]) == BENCH_H
        assert sync["dp_bytes"] == BENCH_H * diloco["dp_bytes"] > 0
        assert all(0 < x < 10 for x in (sync["final_loss"], diloco["final_loss"]))


# --- no processes -------------------------------------------------------------------------------------------
def test_replica_groups_are_consecutive_dp_ranks():
    dims = ParallelDims(tp=2, dp=4)
    inner, cross = inner_cross_ranks(dims, 2)
    assert inner == [[0, 2], [4, 6], [1, 3], [5, 7]]  # tp rank 0's DP ranks 0 2 4 6: replicas {0, 2} and {4, 6}
    assert cross == [[0, 4], [2, 6], [1, 5], [3, 7]]
    with pytest.raises(ValueError, match="--diloco-replicas 3"):
        inner_cross_ranks(dims, 3)


def _run(argv: list[str], world: int = 2):
    from hybrid.train.args import parse_args, run_config
    return run_config(parse_args(["--seq-length", "32", "--train-iters", "8", *argv]), world)


def test_diloco_flags_build_the_config():
    run = _run(["--diloco-inner-steps", "4", "--diloco-outer-lr", "0.5", "--diloco-fragments", "2"], world=4)
    assert run.diloco == DiLoCoConfig(inner_steps=4, outer_lr=0.5, outer_momentum=0.9, replicas=None, fragments=2,
                                      fragment_sync_delay=0, fragment_update_alpha=0.0)  # the defaults: no overlap
    run = _run(["--diloco-inner-steps", "4", "--diloco-fragments", "2", "--diloco-fragment-sync-delay", "1",
                "--diloco-fragment-update-alpha", "0.5"])
    assert (run.diloco.fragment_sync_delay, run.diloco.fragment_update_alpha) == (1, 0.5)
    assert _run([]).diloco is None
    assert _run(["--optimizer", "sgd", "--sgd-momentum", "0"]).optimizer.optimizer == "sgd"


def test_a_mid_flight_checkpoint_of_fragments_resumes_only_at_its_layout():
    from hybrid.diloco.run import midflight_layout_change
    state = {"diloco.inflight": 1, "layout": {"tp": 2, "pp": 1, "dp": 2, "zero": 0}}
    assert midflight_layout_change(state, OVERLAP, ParallelDims(tp=2, dp=2), 0) == ""
    why = midflight_layout_change(state, OVERLAP, ParallelDims(pp=2, dp=2), 0)
    assert "fragment 1's outer all-reduce in flight at tp 2 pp 1 dp 2 zero 0" in why
    assert midflight_layout_change(state, OVERLAP, ParallelDims(tp=2, dp=2), 1) != ""
    assert midflight_layout_change(state, OVERLAP_K1, ParallelDims(pp=2, dp=2), 0) == ""  # K = 1: anywhere
    assert midflight_layout_change({**state, "diloco.inflight": -1}, OVERLAP, ParallelDims(pp=2, dp=2), 0) == ""


def test_diloco_config_is_frozen_and_documents_its_fields():
    assert DiLoCoConfig.__dataclass_params__.frozen
    assert [f.name for f in dataclasses.fields(DiLoCoConfig) if f.name not in DiLoCoConfig.__doc__] == []


@pytest.mark.parametrize("argv, world, message", [
    (["--diloco-outer-lr", "0.5"], 2, "--diloco-outer-lr applies to DiLoCo"),
    (["--diloco-inner-steps", "0"], 2, "--diloco-inner-steps must be a positive"),
    (["--diloco-inner-steps", "4", "--diloco-fragments", "3"], 2, "--diloco-fragments 3 must be a positive divisor"),
    (["--diloco-inner-steps", "4", "--diloco-outer-momentum", "1"], 2, r"--diloco-outer-momentum must be in \[0, 1\)"),
    (["--diloco-inner-steps", "4", "--diloco-replicas", "3"], 4, "--diloco-replicas 3 must divide"),
    (["--diloco-inner-steps", "4", "--diloco-fragments", "2", "--diloco-fragment-sync-delay", "2"], 2,
     r"--diloco-fragment-sync-delay 2 must be in \[0, H / K\) = \[0, 2\)"),
    (["--diloco-inner-steps", "4", "--diloco-fragment-update-alpha", "1.5"], 2,
     r"--diloco-fragment-update-alpha must be in \[0, 1\]"),
    (["--diloco-fragment-sync-delay", "1"], 2, "--diloco-fragment-sync-delay applies to DiLoCo"),
    (["--diloco-inner-steps", "4", "--fp16"], 2, "does not run with --fp16"),
    (["--optimizer", "sgd", "--offload-optimizer"], 2, "--optimizer sgd does not run with --offload-optimizer"),
])
def test_diloco_bad_flags_name_the_flag(argv, world, message):
    with pytest.raises(ValueError, match=message):
        _run(argv, world)
