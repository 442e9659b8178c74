"""--compile composed with context parallelism and with an MoE model's recomputation, as train.py builds the run:
the flags go through hybrid/train/args.py run_config (which refused both until round 20) and the model through
hybrid/train/loop.py build_runner (compile_blocks, inductor), trained by the real step (train_step + ZeroOptimizer).

One 2-rank launch trains each case STEPS AdamW steps twice, eager and with --compile:

    cp2-p2p, cp2-a2a              tiny-llama at --context-parallel-size 2 (load-balanced chunks): ring and Ulysses
    cp2-p2p-full, -selective      the same with recomputation (the checkpoint eager around the compiled body)
    ep2-full, ep2-selective       tiny-mixtral at --expert-model-parallel-size 2 with recomputation (full replays
                                  the router's choices inside the eager MoE layer, in the compiled body's rerun)
    cp2-ep2-full                  tiny-mixtral at CP 2 x EP 2 (the EP group the CP pair) with full recomputation

and one 4-rank launch the same way (round 20; round 21 added the last two and the check against one process):

    tp2-sp-cp2                    tiny-llama (4 blocks under PP, else 2) at TP 2 + SP x CP 2
    tp2-cp2-docs                  TP 2 without SP x CP 2, packed documents (--reset-attention-mask, -position-ids)
    cp2-pp2-1f1b                  CP 2 x PP 2 under 1F1B (2 blocks a stage)
    tp2-sp-cp2-allgather          TP 2 + SP x CP 2, the all-gather exchange
    cp2-pp2-a2a-interleaved       CP 2 (Ulysses) x PP 2 interleaved: 2 virtual stages a rank, 1 block each

asserting losses, gradients and final weights against the eager run and losses and weights against one process
(4 blocks under PP, the same documents) as below, no recompilation, every break at the CP attention or a TP
collective (hybrid/comm.py Group's, or hybrid/tp/mappings.py apply_eagerly), and that the documents changed the
gradients. Measured: gradients <= 3.6e-7, weights <= 1.5e-6 of the eager run's, weights <= 1.5e-6 of one process's.
Removing the CP attention's _disable_dynamo fails all five (breaks at the op trail's lock, at a skipped call inside
Ulysses, and the all-gather path's own gathers: 18 Group.all_gather breaks, SP's 9 allowed); a compiled block that
skips TP's sum (SP's reduce-scatter as a split, g's all-reduce) or drops the documents fails its case's losses; the
all-gathered keys left in rank order, Ulysses attending in gathered order or the second virtual stage without its
CP group fail their cases' losses against one process (round 21). Ulysses at TP 2 is refused for tiny-llama (1 kv
head a TP rank); allgather with PP is not run (docs/context-parallel.md).

and asserts, per rank:
* the compiled run's losses and every gradient the optimizer stepped on (each unit's reduced shard) equal the eager
  run's within TOL_COMPILE of the tensor's largest entry;
* its losses and every final weight (transformers' names, each expert whole) equal the single-process run's
  (no CP, no EP, no recomputation, eager; computed here, in the test process) within TOL_PARALLEL + TOL_COMPILE;
* the compiled frames after step 1 are those after the last step (no recompilation), at least one graph was
  compiled, and every graph break is at the eager CP attention (hybrid/cp/attention.py CPContext.attention) or
  the eager MoE layer (hybrid/moe/layer.py MoELayer.forward), at most BREAKS of each.

Bounds.
* TOL_COMPILE = 1e-5. Inductor keeps fp32 and calls aten's matmul; the CP attention and the MoE layer run eagerly.
  What it changes is the order of the sums it generates itself: the RMSNorms' sums over the hidden size (64)
  forward and backward, and the norm weights' gradient sums over a micro-batch's tokens (<= 64 here). Two orders
  of an n-term fp32 sum differ by at most 2 (n - 1) u sum|x_i| (Higham's recursive-summation bound, u = 2^-24):
  7.5e-6 of sum|x_i| for n = 64; a random-walk estimate is sqrt(n) u = 4.8e-7, and the measured largest difference
  of any gradient was 5.6e-7 of its tensor's largest entry (a 2-block tiny Llama at CP 2, a tiny Mixtral at EP 1).
  Recomputation replays exactly (the same compiled kernels on the same inputs): it adds nothing.
* TOL_PARALLEL = 1e-5: the eager parallel run against one process, tests/test_cp_training.py's and
  tests/test_moe_parallel.py's bound (AdamW with eps 1e-5 keeps the parallel run's summation-order noise from
  becoming a step). The compiled run against one process: by the triangle inequality, within the sum.
* BREAKS: dynamo counts a break once per frame between the compiled body and the eager call: the CP attention is
  reached through block -> ParallelAttention.forward -> maybe_checkpoint -> core -> context_attention (5; 3 under
  selective recomputation), the MoE layer directly from the block (1); the blocks share one code object, so the
  second block adds none. Measured: exactly those counts, and 3-6 graphs. Traced instead of eager, the CP exchange
  broke the graph 16-17 times (at the op trail's lock and each host read of the load-balanced positions) and the MoE
  layer 28-40 times (round 19): this assertion fails.
  Measured (this launch): gradients against the eager run <= 3.6e-7, weights against one process <= 1.4e-6.

What stays refused: --recompute-granularity selective-op with --compile at CP > 1 or on an MoE model (its traced
checkpoint cannot hold the eager call's graph break: measured, dynamo then compiles nothing of the block) --
below, and tests/test_inputs.py compile-selective-op-moe (one error line before any process group).

Slow: one 2-rank and one 4-rank launch compiling with inductor (the file: 86-106 s of CPU, median 92, with
inductor's caches warm; 73-82 s, median 75, before round 21's two 4-rank cases; on this 2-core machine under load). The
fast tier keeps train.py's checks (every accepted composition, the refusals) and, in-process, each CP path's
attention kept out of compiled code (one graph break, at CPContext.attention); the MoE layer's is
tests/test_moe19_compile.py's."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from hybrid.testing import run_distributed
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)

STEPS = 2  # the first compiles; a recompilation would come at the second
TOL_COMPILE = 1e-5
TOL_PARALLEL = 1e-5
BREAKS = {"CPContext.attention": 5, "MoELayer.forward": 1}  # the functions kept out of the compiled graphs
# and at TP 2, its collectives (one break per frame on the path to each; measured: SP's gather 9, reduce-scatter 8;
# without SP f, g and the fused q, k, v / gate, up entry through hybrid/tp/mappings.py apply_eagerly, 12)
BREAKS4 = {**BREAKS, "Group.all_gather": 9, "Group.reduce_scatter": 8, "apply_eagerly": 12}
COMMON = ["--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "5e-4",
          "--train-iters", str(STEPS), "--lr-decay-style", "constant", "--eval-iters", "0"]
EPS = 1e-5  # Adam's eps (no flag sets it): TOL_PARALLEL's derivation takes eps 1e-5, as the CP and MoE tests
LLAMA, MIXTRAL = ["--model", "tiny-llama"], ["--model", "tiny-mixtral"]
CP2, EP2 = ["--context-parallel-size", "2"], ["--expert-model-parallel-size", "2"]
CASES = {
    "cp2-p2p": LLAMA + CP2,
    "cp2-a2a": LLAMA + CP2 + ["--cp-comm-type", "a2a"],
    "cp2-p2p-full": LLAMA + CP2 + ["--recompute-granularity", "full"],
    "cp2-p2p-selective": LLAMA + CP2 + ["--recompute-granularity", "selective"],
    "ep2-full": MIXTRAL + EP2 + ["--recompute-granularity", "full"],
    "ep2-selective": MIXTRAL + EP2 + ["--recompute-granularity", "selective"],
    "cp2-ep2-full": MIXTRAL + CP2 + EP2 + ["--recompute-granularity", "full"],
}
TP2, PP2 = ["--tensor-model-parallel-size", "2"], ["--pipeline-model-parallel-size", "2"]
DOCS = ["--reset-attention-mask", "--reset-position-ids", "--tokenizer-type", "ByteLevel"]
EOD = 10  # the default corpus has no ByteLevel end-of-document (0): its lines are the documents (test_cp_training.py)
CASES4 = {  # the 4-rank launch: CP with TP (with and without SP), with PP, and with packed documents
    "tp2-sp-cp2": LLAMA + TP2 + ["--sequence-parallel"] + CP2,
    "tp2-cp2-docs": LLAMA + TP2 + CP2 + DOCS,
    "cp2-pp2-1f1b": LLAMA + CP2 + PP2 + ["--pipeline-schedule", "1f1b"],
    # round 21: the all-gather exchange with TP + SP, and Ulysses under interleaved PP (2 virtual stages a rank, one
    # block each). Ulysses at TP 2 would need 2 kv heads a TP rank: tiny-llama has 1 and run_config refuses it.
    "tp2-sp-cp2-allgather": LLAMA + TP2 + ["--sequence-parallel"] + CP2 + ["--cp-comm-type", "allgather"],
    "cp2-pp2-a2a-interleaved": LLAMA + CP2 + PP2 + ["--cp-comm-type", "a2a", "--virtual-pipeline-model-parallel-size",
                                                    "2"],
}


def _run_config(argv: list[str], world: int, whole: bool = False):
    """The RunConfig train.py builds from `argv` (every check of hybrid/train/args.py), at 2 blocks (one compiled
    code object, reused by the second block; under PP, and `whole`, the preset's 4, split over the stages and
    chunks as run_config split them), Adam's eps EPS, and packed documents ending at EOD."""
    from hybrid.train.args import parse_args, run_config
    run = run_config(parse_args(COMMON + argv), world)
    if run.cp.eod is not None:
        run = dataclasses.replace(run, cp=dataclasses.replace(run.cp, eod=EOD))
    if run.parallel.dims.pp > 1 or whole:
        return dataclasses.replace(run, optimizer=dataclasses.replace(run.optimizer, eps=EPS))
    arch = dataclasses.replace(run.model.arch, num_layers=2,
                               moe_layers=tuple(i for i in run.model.arch.moe_layers if i < 2))
    return dataclasses.replace(run, model=dataclasses.replace(run.model, arch=arch),
                               optimizer=dataclasses.replace(run.optimizer, eps=EPS))


def _train(argv: list[str], world: int, whole: bool = False) -> dict:
    """STEPS steps of the run `argv` describes: losses, the reduced gradient shards each step stepped on, the final
    weights under transformers' names, and dynamo's counters after each step."""
    from torch._dynamo.utils import counters

    from hybrid.data import load_corpus, micro_batches
    from hybrid.mesh import Mesh
    from hybrid.tp import ParallelRNG, TPContext
    from hybrid.train.loop import build_runner, expert_layout
    from hybrid.train_step import train_step
    from hybrid.zero import ZeroOptimizer
    from models.hf_io import export_hf_state_dict
    torch._dynamo.reset()  # each run compiles afresh
    counters.clear()
    run = _run_config(argv, world, whole)
    experts = expert_layout(run)
    mesh = Mesh.single() if world == 1 else Mesh.build(run.parallel.dims,
                                                       expert_groups=experts.groups() if experts is not None else None)
    tp = TPContext(mesh.tp, sequence_parallel=run.parallel.sequence_parallel,
                   rng=ParallelRNG(run.training.seed, mesh.coords.tp, mesh.coords.pp, mesh.device))
    model, runner = build_runner(run, mesh, tp)
    opt = ZeroOptimizer(model, mesh, run.zero, run.optimizer)
    out = {"losses": [], "grads": [], "frames": [], "breaks": {}, "graphs": 0}
    step = opt.step

    def recording_step():
        out["grads"].append([u.grad_shard.clone() for u in opt.units])
        return step()
    opt.step = recording_step
    corpus, batch, sharding = load_corpus(), run.training.batch, run.cp.sharding(mesh.cp.rank)
    for it in range(STEPS):
        mbs = sharding.batches(micro_batches(corpus, batch, run.training.seed, it, mesh.coords.dp))
        out["losses"].append(train_step(model, mbs, opt, mesh, runner=runner))
        out["frames"].append(counters["frames"]["total"])
    out["breaks"] = dict(counters["graph_break"])
    out["graphs"] = counters["stats"]["unique_graphs"]
    with opt.gathered():
        out["weights"] = {k: t.clone() for chunk in model for k, t in export_hf_state_dict(chunk, mesh.tp).items()}
    return out


def _cases(rank: int, world: int, cases: dict = CASES) -> dict:
    return {(case, compiled): _train(argv + (["--compile"] if compiled else []), world)
            for case, argv in cases.items() for compiled in (False, True)}


@functools.lru_cache(maxsize=1)
def results() -> list[dict]:
    return run_distributed(_cases, 2, timeout=1500)


@functools.lru_cache(maxsize=1)
def results4() -> list[dict]:
    return run_distributed(_cases, 4, args=(CASES4,), timeout=1500)


@functools.lru_cache(maxsize=None)
def reference(model: str, docs: bool = False, whole: bool = False) -> dict:
    """One process, eager, no CP / EP / TP / PP / recomputation: the same global batches, the same initial weights
    (`docs`: the same packed documents; `whole`: the preset's 4 blocks, as the PP runs)."""
    return _train(["--model", model] + (DOCS if docs else []), 1, whole)


def reference_of(argv: list[str]) -> dict:
    """The single-process run the parallel run `argv` must equal."""
    return reference(argv[argv.index("--model") + 1], "--reset-attention-mask" in argv,
                     "--pipeline-model-parallel-size" in argv)


def _check_equals_one_process(runs: list[dict], argv: list[str], case: str) -> None:
    """Every rank's losses and final weights (the stages' together: every tensor) equal one process's within
    TOL_PARALLEL + TOL_COMPILE."""
    ref, tol = reference_of(argv), TOL_PARALLEL + TOL_COMPILE
    for rank, got in enumerate(runs):
        assert got["losses"] == pytest.approx(ref["losses"], rel=tol), (rank, case, got["losses"], ref["losses"])
        for name, w in got["weights"].items():
            assert rel(w, ref["weights"][name]) <= tol, (rank, case, name, rel(w, ref["weights"][name]))
    assert {n for got in runs for n in got["weights"]} == set(ref["weights"]), case  # every tensor compared


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _check_compiled(got: dict, case: str, breaks: dict = BREAKS) -> None:
    assert got["graphs"] >= 1, case  # the blocks ran compiled code
    assert got["frames"][-1] == got["frames"][0], f"{case}: recompiled after step 1: {got['frames']}"
    per_call = {name: 0 for name in breaks}
    for reason, n in got["breaks"].items():
        name = [name for name in breaks if f"`{name}`" in reason]
        assert name, (case, reason)  # a break elsewhere: something else left the graph
        per_call[name[0]] += n
    assert all(per_call[name] <= bound for name, bound in breaks.items()), (case, per_call)


def _check_equals_eager(got: dict, eager: dict, rank: int, case: str, breaks: dict = BREAKS) -> None:
    """The compiled run compiled as bounded (_check_compiled), and its losses and every gradient it stepped on equal
    the eager run's within TOL_COMPILE."""
    _check_compiled(got, case, breaks)
    assert len(got["losses"]) == len(got["grads"]) == STEPS, case
    assert got["losses"] == pytest.approx(eager["losses"], rel=TOL_COMPILE), (rank, case)
    for step, (gs, ws) in enumerate(zip(got["grads"], eager["grads"])):
        assert len(gs) == len(ws) > 0, case
        for unit, (g, w) in enumerate(zip(gs, ws)):
            assert rel(g, w) <= TOL_COMPILE, (rank, case, step, unit, rel(g, w))


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_run_equals_the_eager_run_and_one_process(case):
    for rank, per_rank in enumerate(results()):
        _check_equals_eager(per_rank[case, True], per_rank[case, False], rank, case)
    _check_equals_one_process([per_rank[case, True] for per_rank in results()], CASES[case], case)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES4))
def test_compiled_run_with_tp_pp_or_documents_equals_the_eager_run_and_one_process(case):
    """4 ranks: CP 2 (ring) with TP 2 + SP, with TP 2 (no SP) and packed documents, with PP 2 (1F1B); the
    all-gather exchange with TP 2 + SP; Ulysses with interleaved PP 2. The compiled run's losses, every gradient it
    stepped on and its final weights equal the eager run's; its losses and weights equal one process's (4 blocks
    under PP; the same packed documents); no recompilation; every graph break at the eager CP attention or a TP
    collective."""
    for rank, per_rank in enumerate(results4()):
        eager, got = per_rank[case, False], per_rank[case, True]
        _check_equals_eager(got, eager, rank, case, BREAKS4)
        assert set(got["weights"]) == set(eager["weights"]) != set(), case
        for name, w in got["weights"].items():  # as against one process: Adam's eps keeps the noise from a step
            assert rel(w, eager["weights"][name]) <= TOL_PARALLEL + TOL_COMPILE, (rank, case, name)
    _check_equals_one_process([per_rank[case, True] for per_rank in results4()], CASES4[case], case)
    if case.endswith("-docs"):  # the documents changed the gradients (a mask never applied would not; SP does not)
        plain, docs = results4()[0]["tp2-sp-cp2", False]["grads"][0], results4()[0][case, False]["grads"][0]
        assert max(rel(d, p) for d, p in zip(docs, plain)) > 100 * TOL_COMPILE


@pytest.mark.parametrize("argv,accepted", [
    (LLAMA + CP2, True), (LLAMA + CP2 + ["--cp-comm-type", "a2a"], True),
    (LLAMA + CP2 + ["--cp-comm-type", "allgather"], True),
    (LLAMA + CP2 + ["--recompute-granularity", "full"], True), (MIXTRAL + ["--recompute-granularity", "full"], True),
    (MIXTRAL + ["--recompute-granularity", "selective"], True),
    (LLAMA + CP2 + ["--recompute-granularity", "selective-op"], False),
    (MIXTRAL + ["--recompute-granularity", "selective-op"], False)])
def test_train_py_accepts_compile_with_cp_and_moe_recomputation_and_refuses_selective_op(argv, accepted):
    """train.py's checks (run_config, before any process group) at 2 ranks: --compile with CP (every comm type) and
    with full / selective recomputation of an MoE model runs; with selective-op at CP 2 or on an MoE model it is
    refused by name, with the fix."""
    from hybrid.train.args import parse_args, run_config
    args = parse_args(COMMON + argv + ["--compile"])
    if accepted:
        assert run_config(args, 2).model.compile
        return
    what = "runs at --context-parallel-size 1" if "--context-parallel-size" in argv else "does not run on an MoE model"
    with pytest.raises(ValueError, match=f"--compile with --recompute-granularity selective-op {what} .*; use "
                                         f"--recompute-granularity full or selective"):
        run_config(args, 2)


@pytest.mark.parametrize("argv", [LLAMA + CP2, MIXTRAL])
def test_auto_parallel_refuses_compiled_selective_op_at_cp_or_moe_before_the_search(argv, monkeypatch):
    """--auto-parallel --compile --recompute-granularity selective-op at CP 2 or on an MoE model: refused whatever
    the plan, so before the planner searches (its search would be wasted)."""
    from hybrid import planner
    from hybrid.train.args import apply_auto_parallel, parse_args

    def searched(*a, **kw):
        raise AssertionError("the planner searched")
    monkeypatch.setattr(planner, "search", searched)
    args = parse_args(["--auto-parallel", "--compile", "--recompute-granularity", "selective-op",
                       "--global-batch-size", "16", "--seq-length", "32"] + argv)
    with pytest.raises(ValueError, match="--compile with --recompute-granularity selective-op"):
        apply_auto_parallel(args, 4)


@pytest.mark.parametrize("comm", ["p2p", "a2a", "allgather"])
def test_cp_attention_is_one_graph_break_in_compiled_code(comm):
    """In-process, a 1-rank CP group (each path's exchange is then the identity, its code the same): compiled code
    that calls CPContext.attention breaks its graph once, there, and runs the attention eagerly -- its result
    exactly the eager call's. Traced (the decorator removed), dynamo entered the path's autograd Function and broke
    at each host read of the load-balanced positions: 13 / 7 / 4 graphs (p2p / a2a / allgather), and this fails.
    Dynamo's `eager` backend: capture only, < 1 s."""
    from torch._dynamo.utils import counters

    from hybrid.comm import Group
    from hybrid.cp import CommType, CPContext
    cp = CPContext(Group.solo("cp"), CommType(comm))
    q, k, v = (torch.randn(1, h, 8, 4, generator=torch.Generator().manual_seed(h)) for h in (2, 2, 2))

    def f(q, k, v):
        return cp.attention(q * 2, k, v) + 1
    torch._dynamo.reset()
    counters.clear()
    got = torch.compile(f, backend="eager")(q, k, v)
    assert torch.equal(got, f(q, k, v))
    assert counters["stats"]["unique_graphs"] == 2  # before the call and after it
    assert list(counters["graph_break"].values()) == [1], dict(counters["graph_break"])
    assert "`CPContext.attention`" in next(iter(counters["graph_break"]))


# --- docs/context-parallel.md's and docs/moe.md's timing ("With --compile"): python tests/test_compose20_compile.py
def _timed(rank: int, world: int, cases: tuple, blocks: int, per: int) -> dict:
    """Per case: each run's first step (the compiled one's is the compilation; CPU of this process and wall), then
    eager and compiled steps in alternating blocks of `per` (E C E C ...: a change of the machine's load falls on both):
    the median per-step CPU and wall time of each, and eager / compiled CPU per block pair (> 1: compiled faster)."""
    import statistics
    import time

    from torch._dynamo.utils import counters
    out = {}
    for case in cases:
        torch._dynamo.reset()  # each case compiles afresh (inductor's on-disk cache may still serve its kernels)
        runs = {c: _Stepper(CASES[case] + (["--compile"] if c else []), world) for c in (False, True)}
        first = {}
        for compiled, run in runs.items():
            cpu, wall = time.process_time(), time.perf_counter()
            run.step()
            first[compiled] = (time.process_time() - cpu, time.perf_counter() - wall)
        frames = counters["frames"]["total"]
        times = {False: [], True: []}
        for _ in range(blocks):
            for compiled, run in runs.items():
                cpu, wall = time.process_time(), time.perf_counter()
                for _ in range(per):
                    run.step()
                times[compiled].append(((time.process_time() - cpu) / per, (time.perf_counter() - wall) / per))
        ratios = [e[0] / c[0] for e, c in zip(times[False], times[True])]
        out[case] = {"first": first, "recompiled": counters["frames"]["total"] - frames,
                     "cpu_ms": {c: 1e3 * statistics.median(x[0] for x in v) for c, v in times.items()},
                     "wall_ms": {c: 1e3 * statistics.median(x[1] for x in v) for c, v in times.items()},
                     "ratio": (statistics.median(ratios), min(ratios), max(ratios))}
    return out


class _Stepper:
    """A run of `argv` (as `_train` builds it) stepped one train_step at a time on new micro-batches."""

    def __init__(self, argv: list[str], world: int) -> None:
        from hybrid.data import load_corpus
        from hybrid.mesh import Mesh
        from hybrid.tp import ParallelRNG, TPContext
        from hybrid.train.loop import build_runner, expert_layout
        from hybrid.zero import ZeroOptimizer
        self.run = run = _run_config(argv, world)
        experts = expert_layout(run)
        self.mesh = mesh = Mesh.build(run.parallel.dims, expert_groups=experts.groups() if experts else None)
        tp = TPContext(mesh.tp, sequence_parallel=run.parallel.sequence_parallel,
                       rng=ParallelRNG(run.training.seed, mesh.coords.tp, mesh.coords.pp, mesh.device))
        self.model, self.runner = build_runner(run, mesh, tp)
        self.opt = ZeroOptimizer(self.model, mesh, run.zero, run.optimizer)
        self.corpus, self.sharding, self.it = load_corpus(), run.cp.sharding(mesh.cp.rank), 0

    def step(self) -> float:
        from hybrid.data import micro_batches
        from hybrid.train_step import train_step
        mbs = micro_batches(self.corpus, self.run.training.batch, self.run.training.seed, self.it, self.mesh.coords.dp)
        self.it += 1
        return train_step(self.model, self.sharding.batches(mbs), self.opt, self.mesh, runner=self.runner)


if __name__ == "__main__":
    import os

    for rank, per_rank in enumerate(run_distributed(_timed, 2, args=(("cp2-p2p", "cp2-a2a", "ep2-full"), 5, 10),
                                                    timeout=3000)):
        for case, r in per_rank.items():
            med, lo, hi = r["ratio"]
            print(f"rank {rank} {case}: first step eager {r['first'][False][0]:.2f} s CPU, "
                  f"{r['first'][False][1]:.2f} s wall, compiled {r['first'][True][0]:.1f} s CPU, "
                  f"{r['first'][True][1]:.1f} s wall; "
                  f"CPU ms/step eager {r['cpu_ms'][False]:.1f}, compiled {r['cpu_ms'][True]:.1f}; wall ms/step "
                  f"eager {r['wall_ms'][False]:.1f}, compiled {r['wall_ms'][True]:.1f}; eager / compiled per block "
                  f"pair {med:.3f} ({lo:.3f}-{hi:.3f}); frames compiled after step 1: {r['recompiled']}; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
