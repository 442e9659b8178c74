"""DiLoCo composed with ZeRO-3 and with context parallelism (round 16; hybrid/diloco/replicas.py, outer.py).

ZeRO-3 inside a replica: the outer state (theta, the outer momentum) lives as the master shards do -- one copy of
this rank's 1/z of the replica's parameters -- and the outer all-reduce runs over the ranks holding the same
shard in each replica. On 4 ranks, dp 4 with 2 replicas of ZeRO-3 over 2 ranks each:

* H = 1, outer lr 1, no momentum, SGD inside = synchronous DP SGD: the weights equal one process's SGD on the whole
  global batch within test_diloco's derived fp32 bound (STEPS (lr NOISE max|g| + 4 eps max|w|)).
* H = 4, Nesterov (0.9, lr 0.7), AdamW inside (train.py's defaults): bit for bit the same DiLoCo at ZeRO 0 on the
  same ranks, and bit for bit the hand-written single-process simulation (R models, the outer step written out).
  Derived tolerance 0: each replica's two ranks hold one micro-batch each and a sum of two terms is the same
  rounded number in either order (a + b = b + a), whether all-reduced (stage 0) or reduce-scattered (stage 3);
  the fused AdamW and the outer step are elementwise. Measured: equal.
* Streaming DiLoCo at ZeRO-3 (K = 2 fragments; and K = 2 with tau 1, alpha 0.5): bit for bit the simulation whose
  fragment f is what the run reports it synced (each element of each parameter in exactly one fragment, the same on
  every rank that holds it -- checked), and the ledger moves each fragment's bytes every H steps.

Context parallelism: a replica is TP x PP x CP x dp / R ranks; ZeRO reduces and shards over the replica's DP x CP
ranks. On 8 ranks, cp 2 x dp 4 with 2 replicas (ZeRO-3 over 4 ranks each) and with 4 (a replica = a CP pair):

* H = 1, SGD inside = synchronous SGD of one process, within the same derived bound.
* H = 4, Nesterov, AdamW inside (eps 1e-5, as tests/test_zero.py conditions AdamW; tiny-llama, which has no biases,
  so that no tensor is ~0 in exact arithmetic and a bound relative to each tensor's largest entry holds) = the same
  DiLoCo at CP 1 (dp 4, 2 replicas, ZeRO 0) within WC_RTOL, derived below.

WC_RTOL (fp32, relative to each tensor's largest entry). tests/test_zero.py derives RTOL = 1e-5 for AdamW with eps
1e-5 at lr 5e-4 over 5 steps against a run that sums gradients in another order (tests/test_cp_training.py takes it for
CP against one process): noise of ~1e-7 of the largest gradients moves a weight by at most lr x noise / eps a
step. Here the CP run's gradients differ from the CP 1 run's the same way (the ring attention's online softmax,
the CP all-reduce); the inner steps run at up to lr 1e-3 (2x) for 8 steps (8/5 x), and each outer step adds
eta (1 + mu) times a round's drift to theta (delta and the Nesterov term), theta's drift carrying into the next
round: (1 + eta (1 + mu))^2 over the 2 rounds. WC_RTOL = 1e-5 x 2 x 8/5 x 5.4 = 1.7e-4; measured 8.0e-7 (the worst
tensor). ZeRO's group left without the CP ranks (a replica's CP ranks then train apart) puts the embedding 6e-3
off, ~400x over its bound.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hybrid.comm import CommLedger
from hybrid.cp import CommType, CPContext
from hybrid.cp.data import TokenSharding
from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.diloco import DiLoCoConfig
from hybrid.diloco.run import LocalUpdates
from hybrid.diloco.state import _index
from hybrid.mesh import Mesh, ParallelDims
from hybrid.testing import run_distributed
from hybrid.tp import TPContext
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, build_optimizer, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from hybrid.zero.state import optimizer_chunks, param_names
from models import build_pipeline_chunks, load_config
from models.common import set_context_parallel
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)
from test_diloco import (ADAMW, DATA_SEED, DILOCO, EPS32, EXACT, GLOBAL, MICRO, MODEL, NOISE, SEED, SEQ, SGD, SGD_LR,
                         SGD_STEPS, SIM_STEPS, STREAMING, _clip, _model, _one_thread, _sgd_reference, _weights)

R2 = dict(replicas=2)
OVERLAP = dataclasses.replace(STREAMING, fragment_sync_delay=1, fragment_update_alpha=0.5, **R2)
ADAMW_WC = dataclasses.replace(ADAMW, eps=1e-5)  # well conditioned against summation noise (tests/test_zero.py)
LLAMA = "tiny-llama"  # no biases: no tensor ~0 in exact arithmetic (GPT-2's key biases are), as tests/test_zero.py
ROUNDS = SIM_STEPS // DILOCO.inner_steps
RTOL_ZERO, RTOL_LR, RTOL_STEPS = 1e-5, 5e-4, 5  # tests/test_zero.py's derived bound and where it holds
WC_RTOL = RTOL_ZERO * ADAMW_WC.lr / RTOL_LR * SIM_STEPS / RTOL_STEPS \
    * (1 + DILOCO.outer_lr * (1 + DILOCO.outer_momentum)) ** ROUNDS


def _train(mesh: Mesh, cfg: DiLoCoConfig, opt_cfg: OptimizerConfig, steps: int, stage: int, model: str = MODEL
           ) -> dict:
    """`steps` steps of DiLoCo as train.py runs them (hybrid/diloco/run.py's hooks, CP's token sharding); the
    weights, the bytes of each outer all-reduce, the outer state's bytes and the fragments' rectangles."""
    chunks = build_pipeline_chunks(load_config(model), TPContext(mesh.tp), 0, 1, 1, seed=SEED)
    set_context_parallel(chunks, CPContext(mesh.cp, CommType.P2P))
    sharding = TokenSharding(mesh.dims.cp, mesh.cp.rank)
    spec = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp)
    runner = LocalForwardBackward(chunks[0], mesh.device)
    local = LocalUpdates.build(cfg, mesh)
    opt = ZeroOptimizer(chunks, local.mesh, ZeroConfig(stage=stage), opt_cfg)
    local.checkpointed(opt)
    corpus = load_corpus()
    mesh.ledger.reset()
    per_step = []
    for it in range(steps):
        before = mesh.ledger.bytes("all_reduce", "diloco")
        batches = micro_batches(corpus, spec, DATA_SEED, it, mesh.coords.dp)
        train_step(chunks, sharding.batches(batches) if sharding.active else batches, opt, mesh,
                   lr=opt_cfg.lr_at(it), runner=runner)
        local.after_step(it)
        per_step.append(mesh.ledger.bytes("all_reduce", "diloco") - before)
    local.finish()
    out, index = local.outer, _index(opt)
    frag_of = {i: f for f, idx in enumerate(out.fragments) for i in idx}
    rects = [(c.name, c.global_shape, c.offsets, c.sizes, frag_of[index[(c.unit, c.seg)]])
             for c in optimizer_chunks(opt, param_names(chunks))]
    with opt.gathered():
        weights = _weights(chunks, mesh)
    return {"weights": weights, "per_step": per_step, "rects": rects,
            "fragment_bytes": [4 * sum(out.views[i].numel() for i in idx) for idx in out.fragments],
            "shard_numel": sum(v.numel() for v in out.views), "units": len(opt.units),
            "model_numel": sum(p.numel() for p in chunks.parameters()), "inner": local.mesh.dp_cp.size,
            "cross": local.layout.cross.ranks, "outer_bytes": out.state_ledger().bytes()}


def _world4(rank: int, world: int) -> dict:
    mesh = Mesh.build(ParallelDims.from_world(world), ledger=CommLedger())  # dp 4: 2 replicas of 2 ranks
    return {"z3-sgd": _train(mesh, dataclasses.replace(EXACT, **R2), SGD, SGD_STEPS, stage=3),
            "z0-adamw": _train(mesh, dataclasses.replace(DILOCO, **R2), ADAMW, SIM_STEPS, stage=0),
            "z3-adamw": _train(mesh, dataclasses.replace(DILOCO, **R2), ADAMW, SIM_STEPS, stage=3),
            "z3-k2": _train(mesh, dataclasses.replace(STREAMING, **R2), ADAMW, SIM_STEPS, stage=3),
            "z3-overlap": _train(mesh, OVERLAP, ADAMW, SIM_STEPS, stage=3),
            "z0-adamw-wc": _train(mesh, dataclasses.replace(DILOCO, **R2), ADAMW_WC, SIM_STEPS, stage=0, model=LLAMA)}


def _world8(rank: int, world: int) -> dict:
    mesh = Mesh.build(ParallelDims.from_world(world, cp=2), ledger=CommLedger())  # cp 2 x dp 4
    return {"cp-z3-sgd": _train(mesh, dataclasses.replace(EXACT, **R2), SGD, SGD_STEPS, stage=3),
            "cp-r4-z1-sgd": _train(mesh, EXACT, SGD, SGD_STEPS, stage=1),  # 4 replicas: each one CP pair
            "cp-z3-adamw-wc": _train(mesh, dataclasses.replace(DILOCO, **R2), ADAMW_WC, SIM_STEPS, stage=3,
                                     model=LLAMA)}


@pytest.fixture(scope="module")
def world4():
    return run_distributed(_world4, 4, timeout=600)


@pytest.fixture(scope="module")
def world8():
    return run_distributed(_world8, 8, timeout=600)


# --- the references ----------------------------------------------------------------------------------------
def _masks(ranks: list[dict], k: int) -> list[dict[str, torch.Tensor]]:
    """Fragment f's elements of each parameter, from the rectangles every rank reports it synced in fragment f;
    each element must be in exactly one fragment and every rank holding it must agree."""
    frag: dict[str, torch.Tensor] = {}
    for r in ranks:
        for name, shape, offsets, sizes, f in r["rects"]:
            t = frag.setdefault(name, torch.full(shape, -1, dtype=torch.long))
            box = t[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]
            assert ((box == -1) | (box == f)).all(), f"{name}: two fragments for one element"
            box.fill_(f)
    assert all((t >= 0).all() for t in frag.values()), "an element in no fragment"
    return [{n: t == f for n, t in frag.items()} for f in range(k)]


def _simulation(cfg: DiLoCoConfig, opt_cfg: OptimizerConfig, masks: list[dict[str, torch.Tensor]],
                replicas: int = 2) -> list[dict[str, torch.Tensor]]:
    """DiLoCo written out (tests/test_diloco.py's simulation, the fragments given as element masks): R models,
    each AdamW on its replica's rows; fragment f's delta is taken after step t when (t + 1) mod H = ((f + 1) H / K)
    mod H, its outer Nesterov step runs tau steps later and each replica takes lerp(theta, its weights, alpha)."""
    models = [_model()[0] for _ in range(replicas)]
    opts = [build_optimizer(m, opt_cfg) for m in models]
    names = [n for n, _ in models[0][0].named_parameters()]
    theta = {n: p.detach().clone() for n, p in models[0][0].named_parameters()}
    b = {n: torch.zeros_like(t) for n, t in theta.items()}
    k, h, tau, alpha = cfg.fragments, cfg.inner_steps, cfg.fragment_sync_delay, cfg.fragment_update_alpha
    sent: dict[int, dict[str, torch.Tensor]] = {}
    spec, corpus = BatchSpec(GLOBAL, MICRO, SEQ, replicas), load_corpus()
    for it in range(SIM_STEPS):
        for r, (m, opt) in enumerate(zip(models, opts)):
            opt.zero_grad(set_to_none=True)
            LocalForwardBackward(m[0], torch.device("cpu")).forward_backward(
                micro_batches(corpus, spec, DATA_SEED, it, r))
            _clip(m, names, opt_cfg.clip_grad)
            for group in opt.param_groups:
                group["lr"] = opt_cfg.lr_at(it)
            opt.step()
        live = {n: [dict(m[0].named_parameters())[n] for m in models] for n in names}
        for f in range(k):
            if (it + 1) % h == ((f + 1) * h // k) % h:
                sent[f] = {n: sum(theta[n] - p for p in live[n]) / replicas for n in names}
            if (it + 1 - tau) % h != ((f + 1) * h // k) % h or f not in sent:
                continue
            with torch.no_grad():
                for n, delta in sent.pop(f).items():
                    mask = masks[f][n]
                    new_b = b[n].mul(cfg.outer_momentum).add(delta)
                    new_theta = theta[n].add(delta.add(new_b, alpha=cfg.outer_momentum), alpha=-cfg.outer_lr)
                    b[n] = torch.where(mask, new_b, b[n])
                    theta[n] = torch.where(mask, new_theta, theta[n])
                    for p in live[n]:
                        p.copy_(torch.where(mask, torch.lerp(theta[n], p, alpha) if alpha else theta[n], p))
    return [{n: p.detach().clone() for n, p in m[0].named_parameters()} for m in models]


def _check_sgd(ranks: list[dict], case: str) -> None:
    ref = _one_thread(_sgd_reference)
    gmax = max(ref["gmax"].values())
    for r in ranks:
        for n, w in r[case]["weights"].items():
            want = ref["weights"][n]
            bound = SGD_STEPS * (SGD_LR * NOISE * gmax + 4 * EPS32 * want.abs().max().item())
            dev = (w - want).abs().max().item()
            assert dev <= bound, f"{case} {n}: off by {dev:.3g} > {bound:.3g}"


# --- ZeRO-3 -------------------------------------------------------------------------------------------------
def test_zero3_h1_sgd_equals_synchronous_dp(world4):
    _check_sgd(world4, "z3-sgd")


def test_zero3_diloco_h4_adamw_equals_zero0_and_the_simulation_bit_for_bit(world4):
    ref = _one_thread(_simulation, DILOCO, ADAMW, _masks([r["z3-adamw"] for r in world4], 1))
    for rank, r in enumerate(world4):
        for n, w in r["z3-adamw"]["weights"].items():
            assert torch.equal(w, r["z0-adamw"]["weights"][n]), f"rank {rank} {n}: ZeRO-3 is not ZeRO 0"
            assert torch.equal(w, ref[rank // 2][n]), f"rank {rank} {n}: off the simulation"


@pytest.mark.parametrize("case, cfg", [("z3-k2", dataclasses.replace(STREAMING, **R2)), ("z3-overlap", OVERLAP)])
def test_zero3_streaming_fragments_equal_the_simulation_bit_for_bit(world4, case, cfg):
    ref = _one_thread(_simulation, cfg, ADAMW, _masks([r[case] for r in world4], cfg.fragments))
    for rank, r in enumerate(world4):
        for n, w in r[case]["weights"].items():
            assert torch.equal(w, ref[rank // 2][n]), f"{case} rank {rank} {n}: off by " \
                                                      f"{(w - ref[rank // 2][n]).abs().max().item():.3g}"


def test_zero3_outer_state_is_sharded_and_the_sync_crosses_replicas_by_shard(world4):
    """Each rank holds 1/z of the replica's parameters (ZeRO-3 over z = 2 ranks): its theta and outer momentum are
    two fp32 copies of that share, not of the model; the outer all-reduce pairs DP ranks d and d + 2 (the same
    shard index in replicas 0 and 1) and moves each fragment's bytes once every H steps."""
    for rank, r in enumerate(world4):
        got = r["z3-k2"]
        assert got["inner"] == 2 and got["cross"] == ((rank % 2, rank % 2 + 2))
        per_rank = got["model_numel"] / 2
        assert abs(got["shard_numel"] - per_rank) < got["units"]  # a unit's shards differ by its < z padding
        assert got["outer_bytes"] == 2 * 4 * got["shard_numel"]  # theta + b, fp32, as the ledger counts them
        frag = got["fragment_bytes"]
        assert sum(frag) == 4 * got["shard_numel"] and min(frag) > 0
        assert got["per_step"] == [0, frag[0], 0, frag[1]] * ROUNDS


# --- context parallelism ------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["cp-z3-sgd", "cp-r4-z1-sgd"])
def test_cp_h1_sgd_equals_synchronous_dp(world8, case):
    _check_sgd(world8, case)


def test_cp_replica_groups(world8):
    """cp 2 x dp 4 (rank = cp + 2 dp): 2 replicas -> ZeRO over the replica's 2 DP x 2 CP ranks, the outer
    all-reduce over the same CP rank and inner DP index of the other replica; 4 replicas -> ZeRO over the CP pair,
    the outer all-reduce over DP."""
    for rank, r in enumerate(world8):
        cp, dp = rank % 2, rank // 2
        assert r["cp-z3-sgd"]["inner"] == 4
        assert r["cp-z3-sgd"]["cross"] == (cp + 2 * (dp % 2), cp + 2 * (dp % 2 + 2))
        assert r["cp-r4-z1-sgd"]["inner"] == 2 and r["cp-r4-z1-sgd"]["cross"] == tuple(cp + 2 * d for d in range(4))


def test_cp_diloco_h4_adamw_equals_cp1_within_the_derived_bound(world4, world8):
    worst = 0.0
    for rank, r in enumerate(world8):
        want = world4[rank // 2]["z0-adamw-wc"]["weights"]  # cp 2 x dp 4 rank (cp, d) ~ dp 4 rank d
        for n, w in r["cp-z3-adamw-wc"]["weights"].items():
            dev, bound = (w - want[n]).abs().max().item(), WC_RTOL * want[n].abs().max().item()
            assert dev <= bound, f"rank {rank} {n}: off by {dev:.3g} > {bound:.3g}"
            worst = max(worst, dev / want[n].abs().max().item())
    print(f"cp 2 vs cp 1: worst {worst:.3g} of a tensor's largest entry (bound {WC_RTOL:.3g})")


# --- flags (no processes) -----------------------------------------------------------------------------------
def _run_config(argv: list[str], world: int):
    from hybrid.train.args import parse_args, run_config
    return run_config(parse_args(["--seq-length", "32", "--train-iters", "8", "--diloco-inner-steps", "4", *argv]),
                      world)


@pytest.mark.parametrize("argv, world", [
    (["--zero-stage", "3"], 2), (["--zero-stage", "3", "--diloco-replicas", "2"], 4),
    (["--context-parallel-size", "2"], 4),
    (["--context-parallel-size", "2", "--zero-stage", "3", "--diloco-replicas", "2"], 8)])
def test_zero3_and_cp_are_taken(argv, world):
    assert _run_config(argv, world).diloco.inner_steps == 4


@pytest.mark.parametrize("argv, world, message", [
    (["--fp16"], 2, r"--diloco-inner-steps does not run with --fp16 \(each replica's loss scale would differ\) yet; "
                    "use --bf16, or drop one of them"),
])
def test_what_stays_refused_is_one_line_naming_the_flag(argv, world, message):
    with pytest.raises(ValueError, match=message):
        _run_config(argv, world)


# --- the groups' rank arithmetic at layouts not launched (no processes) -------------------------------------
@pytest.mark.parametrize("tp, cp, dp, pp, replicas, ep, etp", [
    (1, 2, 4, 1, 2, 1, 1), (2, 2, 4, 1, 2, 2, 1), (2, 2, 4, 2, 4, 4, 1), (2, 1, 8, 1, 2, 4, 2),
    (1, 4, 4, 2, 2, 8, 1), (2, 2, 2, 1, 1, 8, 1)])
def test_cross_peers_hold_the_same_shard_of_the_same_parameters(tp, cp, dp, pp, replicas, ep, etp):
    """For every rank: its cross group (the outer all-reduce) holds one rank per replica, each at the same tp, cp
    and pp coordinates, at the same position in its replica's ZeRO group (DP x CP: the same dense shard) and in its
    replica's expert-DP group, with the same experts (ep and expert-TP coordinates) -- the like-with-like the
    average needs; the replica's ZeRO and expert-DP groups lie inside the replica, and its EP groups too."""
    from hybrid.diloco.replicas import inner_cross_ranks, inner_dp_cp_ranks, inner_expert_dp_ranks
    from hybrid.moe.parallel import ExpertAxis, ExpertLayout
    dims = ParallelDims(tp=tp, cp=cp, dp=dp, pp=pp)
    z = dp // replicas
    _, cross = inner_cross_ranks(dims, replicas)
    zero, edp = inner_dp_cp_ranks(dims, replicas), inner_expert_dp_ranks(dims, replicas, ep, etp)
    experts = ExpertLayout(dims, ep, etp)
    group_of = {name: {r: g for g in groups for r in g} for name, groups in (("cross", cross), ("zero", zero),
                                                                             ("edp", edp))}
    replica = {r: dims.coords(r).dp // z for r in range(dims.world)}
    for g in [*zero, *edp, *experts.group_ranks(ExpertAxis.EP)]:
        assert len({replica[r] for r in g}) == 1, g
    for r in range(dims.world):
        peers = group_of["cross"][r]
        assert sorted(replica[p] for p in peers) == list(range(replicas))
        c, e = dims.coords(r), experts.coords(r)
        for p in peers:
            cp_, ep_ = dims.coords(p), experts.coords(p)
            assert (cp_.tp, cp_.cp, cp_.pp) == (c.tp, c.cp, c.pp) and (ep_.ep, ep_.etp) == (e.ep, e.etp)
            for name in ("zero", "edp"):
                assert group_of[name][p].index(p) == group_of[name][r].index(r), (name, r, p)
