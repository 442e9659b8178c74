"""Context-parallel training against single-process training, through the real step (ZeroOptimizer + train_step),
with the ZeRO stages, recomputation modes and precisions users choose.

On 4 gloo ranks as CP 2 x DP 2 (gradients reduced and ZeRO sharded over the 4-rank dp_cp group), tiny-llama
(GQA) at 2 of its 4 layers (MODEL: a block's CP-sharded output feeds the next block's ring, and at PP 2 each stage
holds one; 4 until round 17, layers 3-4 repeating layer 2's arithmetic: 37 % of the ranks' CPU) trains 3 AdamW
steps (the first creates the Adam moments, the next two use them: every path of a step; 5 until round 10, the
last two repeating the second); the logged losses and every final weight equal the
single-process run's within RTOL = 1e-5 of each tensor's largest entry -- the bound tests/test_zero.py derives for
AdamW with eps = 1e-5 (a parallel run sums gradients in another order; eps keeps that noise from becoming a full
step).

    fp32 cases   ZeRO 0, 1, 2, 3 (p2p) | recompute selective, full (ZeRO 1, p2p) | a2a and allgather (ZeRO 3,
                 full recompute) | op-level selective recomputation (selective-op) with each comm type (ZeRO
                 1, 3, 2) | packed documents (--reset-attention-mask --reset-position-ids, ZeRO 2)
    bf16, fp16   ZeRO 1 and 3 (p2p): against the same run at CP 1 on the same 4 ranks (DP 4), losses within
                 one unit roundoff of the compute dtype (2^-8, 2^-11). Not against one process: the fp16 loss
                 scaler sees the gradient summed over 4 ranks in fp16, which overflows at step 1 where one
                 process's does not (measured: DP 4 without CP skips that step too), so the runs part ways
                 for reasons that are not CP's. Here only the attention's rounding differs (the ring
                 accumulates in fp32, SDPA rounds its output to the compute dtype).

CP 2 with TP 2 + SP and with PP 2 (1F1B), ZeRO 1: losses and every weight equal one process's within RTOL.

A checkpoint saved at CP 2 x DP 2 (ZeRO 1 and 3) after the first step loads at CP 1 (DP 4) and CP 4 (DP 1):
parameters, Adam moments and step equal, and the next two steps' losses (the second of which reads the moments
the first updated from the loaded ones) and the final weights equal the uninterrupted run's -- CP changes no
parameter.

The fast tier (`-m "not slow"`) runs, in a launch of its own, the cases in FAST: every ZeRO stage with the p2p
ring, each comm type and recomputation family once (full recomputation with all-gather, op-level selective with
a2a), packed documents, each low precision once (bf16 at ZeRO 1, fp16 at ZeRO 3) and the checkpoint runs. The
other cases -- the same stages, comm types, recomputation modes and precisions in the remaining combinations --
are marked slow and run in a second launch, with the TP + SP and PP compositions (the full suite runs both). The
comm types stay in the fast tier here and through tests/test_cp_attention.py (attention against fp64, every comm
type); selective recomputation's reruns over CP through tests/test_cp_models.py's ledger test.

The single-process references run in the test process at one intra-op thread, as every rank does
(tests/suite_threads.py: at torch's default two threads their OpenMP workers spin on the suite's shared cores);
each is compared within RTOL (or, packed documents against plain, apart by more than 100 x RTOL), never bit for
bit, so the thread count's summation order is inside every bound.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
import torch

from hybrid import testing
from hybrid.checkpoint import core
from hybrid.cp import CommType, CPContext
from hybrid.cp.data import TokenSharding
from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.mesh import Mesh, ParallelDims
from hybrid.pipeline import ScheduleKind, build_schedule
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.testing import run_distributed
from hybrid.tp import ParallelRNG, TPContext, gather_full, spec_of
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import Precision, ZeroConfig, ZeroOptimizer
from models import Recompute, build_pipeline_chunks, load_config
from models.common import set_context_parallel
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)

RTOL = 1e-5
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11}
STEPS, SAVE_AT, GLOBAL, MICRO, SEQ = 3, 1, 8, 2, 32
OPT = OptimizerConfig(lr=5e-4, eps=1e-5, weight_decay=0.01, decay_style="constant")
FP32, BF16, FP16 = Precision.FP32, Precision.BF16, Precision.FP16
EOD = 10  # the newline byte: the corpus' lines become documents
MODEL = dataclasses.replace(load_config("tiny-llama"), num_layers=2)  # the module doc says why 2 layers

CASES = {  # name -> (zero stage, recompute, comm type, precision, packed documents)
    "z0": (0, Recompute.NONE, CommType.P2P, FP32, False),
    "z1": (1, Recompute.NONE, CommType.P2P, FP32, False),
    "z2": (2, Recompute.NONE, CommType.P2P, FP32, False),
    "z3": (3, Recompute.NONE, CommType.P2P, FP32, False),
    "z1-selective": (1, Recompute.SELECTIVE, CommType.P2P, FP32, False),
    "z1-full": (1, Recompute.FULL, CommType.P2P, FP32, False),
    "z1-selective-op": (1, Recompute.SELECTIVE_OP, CommType.P2P, FP32, False),
    "z3-selective-op-a2a": (3, Recompute.SELECTIVE_OP, CommType.A2A, FP32, False),
    "z2-selective-op-allgather": (2, Recompute.SELECTIVE_OP, CommType.ALLGATHER, FP32, False),
    "z3-full-a2a": (3, Recompute.FULL, CommType.A2A, FP32, False),
    "z3-full-allgather": (3, Recompute.FULL, CommType.ALLGATHER, FP32, False),
    "z2-docs": (2, Recompute.NONE, CommType.P2P, FP32, True),
    "z1-bf16": (1, Recompute.NONE, CommType.P2P, BF16, False),
    "z3-bf16": (3, Recompute.NONE, CommType.P2P, BF16, False),
    "z1-fp16": (1, Recompute.NONE, CommType.P2P, FP16, False),
    "z3-fp16": (3, Recompute.NONE, CommType.P2P, FP16, False),
}
FAST = ("z0", "z1", "z2", "z3", "z3-full-allgather", "z3-selective-op-a2a", "z2-docs", "z1-bf16", "z3-fp16")


class Run:
    """tiny-llama + ZeroOptimizer at a layout, trained as train.py trains (hybrid/train/loop.py): the pipeline
    executor (1F1B) when the mesh has pp > 1; `sp`: sequence parallel over TP."""

    def __init__(self, mesh: Mesh, case: str, sp: bool = False):
        stage, recompute, comm, precision, docs = CASES[case]
        self.mesh, self.rng = mesh, ParallelRNG(5, mesh.coords.tp, mesh.coords.pp)
        cfg, pp = MODEL, mesh.dims.pp
        self.model = build_pipeline_chunks(cfg, TPContext(mesh.tp, rng=self.rng, sequence_parallel=sp),
                                           mesh.coords.pp, pp, seed=5, recompute=recompute)
        set_context_parallel(self.model, CPContext(mesh.cp, comm))
        self.spec = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp)
        self.sharding = TokenSharding(mesh.dims.cp, mesh.cp.rank, docs, docs, EOD)
        if pp == 1:
            self.runner = LocalForwardBackward(self.model[0], mesh.device)
        else:
            tokens = SEQ // mesh.dims.cp // (mesh.dims.tp if sp else 1)  # a rank's activations: T/CP (/TP under SP)
            schedule = build_schedule(ScheduleKind.ONE_F_ONE_B, pp, GLOBAL // (MICRO * mesh.dims.dp))[mesh.coords.pp]
            self.runner = PipelineExecutor(self.model, schedule, mesh.pp, StageIO((MICRO, tokens, cfg.hidden_size)),
                                           mesh.device)
        self.opt = ZeroOptimizer(self.model, mesh, ZeroConfig(stage=stage, precision=precision), OPT)

    def train(self, start: int, stop: int, corpus) -> list[float]:
        return [train_step(self.model, self.sharding.batches(micro_batches(corpus, self.spec, 3, it, self.mesh.coords.dp)),
                           self.opt, self.mesh, lr=OPT.lr_at(it), runner=self.runner) for it in range(start, stop)]

    def weights(self) -> dict[str, torch.Tensor]:
        with self.opt.gathered():
            return {n: gather_full(p.detach().float(), spec_of(p), self.mesh.tp).clone()
                    for n, p in self.model.named_parameters()}


def _case(mesh: Mesh, case: str, corpus) -> dict:
    run = Run(mesh, case)
    return {"losses": run.train(0, STEPS, corpus), "weights": run.weights()}


def _resume(meshes: dict, case: str, root: str, corpus) -> dict:
    """Train to SAVE_AT at CP 2 x DP 2 and save; load at CP 1 and CP 4, train on; per target: losses, state."""
    saver = Run(meshes["cp2"], case)
    saver.train(0, SAVE_AT, corpus)
    names = core.param_names(saver.model)
    state = {"model": "tiny-llama", "layout": {"tp": 1, "pp": 1, "dp": 2, "cp": 2, "zero": CASES[case][0]},
             "iteration": SAVE_AT, "consumed_samples": SAVE_AT * GLOBAL}
    core.start_save(saver.opt, names, saver.rng, root, SAVE_AT, state).finish()
    out = {}
    for target in ("cp1", "cp4"):
        run = Run(meshes[target], case)
        core.load(run.opt, core.param_names(run.model), run.rng, core_path(root), rng_too=False)
        out[target] = {"step": core.adam_step(run.opt), "losses": run.train(SAVE_AT, STEPS, corpus),
                       "weights": run.weights()}
    return out


def core_path(root: str) -> str:
    from hybrid.checkpoint import store
    return store.final_path(root, SAVE_AT)


def _world4(rank: int, world: int, root: str, cases: list[str], resume: bool):
    corpus = load_corpus()
    meshes = {"cp2": Mesh.build(ParallelDims.from_world(world, cp=2)),
              "cp1": Mesh.build(ParallelDims.from_world(world, cp=1)),
              "cp4": Mesh.build(ParallelDims.from_world(world, cp=4))}
    out = {case: _case(meshes["cp2"], case, corpus) for case in cases}
    out["cp1"] = {case: _case(meshes["cp1"], case, corpus) for case in cases if CASES[case][3] is not FP32}
    if resume:
        out["resume"] = {case: _resume(meshes, case, f"{root}/{case}", corpus) for case in ("z1", "z3")}
    else:  # CP composed with TP + SP and with PP: slow, as the other cases of this launch
        out["layouts"] = _layouts(corpus, world)
    return out


@functools.lru_cache(maxsize=None)
def reference(case: str) -> dict:
    return _case(Mesh.single(), case, load_corpus())


class Launches:
    """The module's two 4-rank launches, each started at its first use: the fast tier's cases (FAST) with the
    checkpoint runs, and the other cases with the TP + SP and PP compositions ("layouts")."""

    def __init__(self, root: str) -> None:
        self.root, self.done = root, {}

    def ranks(self, case: str) -> list[dict]:
        """Every rank's results of the launch that runs `case` ("resume": the checkpoint runs)."""
        fast = case in FAST or case == "resume"
        if fast not in self.done:
            cases = [c for c in CASES if (c in FAST) == fast]
            self.done[fast] = run_distributed(_world4, 4, args=(self.root, cases, fast), timeout=1800)
        return self.done[fast]


@pytest.fixture(scope="module")
def spawn(tmp_path_factory):
    return Launches(str(tmp_path_factory.mktemp("cp-ckpt")))


def _tier(cases) -> list:
    return [pytest.param(c, marks=() if c in FAST else pytest.mark.slow) for c in cases]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _check(got: dict, ref: dict, rtol: float, weights: bool = True) -> None:
    assert got["losses"] == pytest.approx(ref["losses"], rel=rtol)
    if weights:
        for n, w in ref["weights"].items():
            assert rel(got["weights"][n], w) <= rtol, f"{n}: {rel(got['weights'][n], w):.2e}"


@pytest.mark.parametrize("case", _tier(c for c in CASES if CASES[c][3] is FP32))
def test_cp2_dp2_training_equals_single_process(spawn, case):
    for rank in range(4):
        _check(spawn.ranks(case)[rank][case], reference(case), RTOL)


@pytest.mark.parametrize("case", _tier(c for c in CASES if CASES[c][3] is not FP32))
def test_cp2_dp2_low_precision_training_equals_cp1_on_the_same_ranks(spawn, case):
    rtol = UNIT_ROUNDOFF[CASES[case][3].value]
    for rank in range(4):
        _check(spawn.ranks(case)[rank][case], spawn.ranks(case)[rank]["cp1"][case], rtol, weights=False)


def test_packed_documents_change_the_training():
    """The document mask is in effect (the corpus' lines are documents): after STEPS steps the weights are not the
    plain run's (the first loss is not a test of it: at initialisation every attention pattern gives ~ln 256)."""
    docs, plain = reference("z2-docs")["weights"], reference("z2")["weights"]
    assert max(rel(docs[n], plain[n]) for n in plain) > 100 * RTOL


@pytest.mark.parametrize("case", ["z1", "z3"])
@pytest.mark.parametrize("target", ["cp1", "cp4"])
def test_a_cp2_checkpoint_loads_at_cp1_and_cp4_and_continues_the_same_run(spawn, case, target):
    ref = reference(case)
    for rank in range(4):
        got = spawn.ranks("resume")[rank]["resume"][case][target]
        assert got["step"] == SAVE_AT
        assert got["losses"] == pytest.approx(ref["losses"][SAVE_AT:], rel=RTOL)
        for n, w in ref["weights"].items():
            assert rel(got["weights"][n], w) <= RTOL


# --- CP composed with TP (+ SP) and with PP, through the optimizer --------------------------------------------
LAYOUTS = {"tp2-cp2-sp": (2, 2, 1, True), "cp2-pp2": (1, 2, 2, False)}  # name -> (tp, cp, pp, sequence parallel)


def _layouts(corpus, world: int) -> dict:
    """Run in the slow cases' launch (`_world4`): no launch of their own."""
    out = {}
    for name, (tp, cp, pp, sp) in LAYOUTS.items():
        run = Run(Mesh.build(ParallelDims.from_world(world, tp=tp, cp=cp, pp=pp)), "z1", sp=sp)
        out[name] = {"losses": run.train(0, STEPS, corpus), "weights": run.weights()}
    return out


# slow: the composition end to end. The fast tier keeps its parts: tests/test_cp_models.py's fast case runs every
# model at TP 2 + SP x CP 2 x PP 2 (logits, loss and every gradient against one process), and the fp32 cases above
# the optimizer over the dp_cp group with CP (ZeRO 0-3)
@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cp2_with_tp2_sp_or_pp2_training_equals_single_process(spawn, layout):
    """STEPS AdamW steps (ZeRO 1, p2p) at TP 2 + SP x CP 2 and at CP 2 x PP 2 (1F1B): the logged losses and every
    weight (each stage's, gathered over TP) equal one process's within RTOL."""
    ref, seen = reference("z1"), set()
    for rank, per_rank in enumerate(spawn.ranks("layouts")):
        got = per_rank["layouts"][layout]
        assert got["losses"] == pytest.approx(ref["losses"], rel=RTOL), rank
        for n, w in got["weights"].items():
            assert rel(w, ref["weights"][n]) <= RTOL, f"rank {rank}: {n}: {rel(w, ref['weights'][n]):.2e}"
            seen.add(n)
    assert seen == set(ref["weights"])


# --- through train.py: saved at CP 2, resumed at CP 1 -------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent
COMMON = ["--model", "tiny-llama", "--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
          "--train-iters", "6", "--log-interval", "1", "--eval-iters", "0"]


def _train_py(world: int, argv: list[str], cwd) -> str:
    """`torchrun --nproc-per-node WORLD scripts/train.py ARGV` (`python scripts/train.py` for one rank), its
    processes forked from hybrid.testing's forkserver."""
    env = {"RANK": None, "WORLD_SIZE": None, "LOCAL_RANK": None, "OMP_NUM_THREADS": "1"}
    if world > 1:
        out = testing.torchrun(argv, world, env=env, cwd=str(cwd), timeout=900)
    else:
        out = testing.run([str(ROOT / "scripts" / "train.py"), *argv], env=env, cwd=str(cwd), timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _losses(stdout: str) -> dict[int, float]:
    return {int(ln.split()[1].split("/")[0]): float(ln.split("lm loss ")[1].split()[0])
            for ln in stdout.splitlines() if ln.startswith(" iteration")}


@pytest.mark.slow  # a benchmark / train.py end to end: the full suite runs it
def test_train_py_saved_at_cp2_resumes_at_cp1_at_the_same_data_position(tmp_path, capsys):
    """The real entry point: a CP 2 run saves at iteration 3; one process (CP 1) loads it and logs the losses of
    iterations 4-6 the uninterrupted CP 2 run logged (to the 4 printed decimals, 1e-4)."""
    save = str(tmp_path / "ckpt")
    first = _train_py(2, COMMON + ["--context-parallel-size", "2", "--save", save, "--save-interval", "3"], tmp_path)
    assert "x cp 2 (p2p)" in first
    second = _train_py(1, COMMON + ["--load", save, "--ckpt-step", "3"], tmp_path)
    a, b = _losses(first), _losses(second)
    assert sorted(b) == [4, 5, 6] and all(abs(a[i] - b[i]) <= 1e-4 for i in b), (a, b)
    from hybrid.cli import main as hybrid_cli
    capsys.readouterr()
    hybrid_cli(["checkpoint", "inspect", save])
    assert "saved at tp 1 x cp 2 x pp 1 x dp 1" in capsys.readouterr().out
