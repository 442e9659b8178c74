"""ZeRO stages 0-3 (fp32, bf16, fp16; optimizer/parameter offload) against single-process training,
on dp 2, dp 4 and tp 2 x pp 2 x dp 2 -- with the memory and communication ledgers asserted.

Equivalence bound (fp32). Each case runs 5 AdamW steps on tiny-llama (no biases) and must give
the single-process losses and final weights within RTOL = 1e-5 (relative to each tensor's largest
entry). AdamW is well conditioned for that only with eps = 1e-5 (lr 5e-4): its update is
lr * m / (sqrt(v) + eps), and a parallel run sums gradients in another order (DP ring, TP partial
sums, micro-batch accumulation), so every gradient differs from the reference by ~1e-7 of the
largest ones -- about 1e-9 here. With eps = 1e-8 an element whose true gradient is that small
gets a full +-lr step of random sign; we measured 2.5e-5 (tp2 x pp2 x dp2, lr 3e-3, eps 1e-6) for
plain DP itself, before any ZeRO code ran. With eps = 1e-5 the same noise moves a weight by at most
lr * 1e-9 / 1e-5 per step; measured worst cases (at 10 steps, which the cases ran until round 10):
8.3e-6 at lr 1e-3, 4.2e-6 at lr 5e-4 (embedding rows of rare bytes, tp2 x pp2 x dp2 -- plain DP and
every stage alike). Why 5 steps: the first creates the Adam moments (and the offloaded copies, the
stage 1-2 post-step gather), the others run with them -- every path of a step, steps 6-10 repeating
steps 2-5 (about half the module's CPU); the fp16 overflow case keeps 10 (OVERFLOW_STEPS). No tensor is ~0
in exact arithmetic (Llama has no biases; unseen tokens' embedding rows keep their init), so no
absolute slack is needed.

ZeRO's own correctness is isolated by a second comparison on the same layout: stages 0 and 1
equal the plain bucketed all-reduce path (GradAverager + torch AdamW) bit for bit; stages 2-3
reduce-scatter per micro-batch or per layer (a different summation order), and offloading runs the
host's AdamW (DeepSpeed's CPU Adam or torch's fused kernel: another rounding of the same formula),
so they match it to PLAIN_RTOL = 2e-6 (measured up to 1.8e-6; DeepSpeed's CPU Adam 9e-7).

The offloaded step runs the host kernels users get from `--cpu-adam auto`: dp 2 runs `auto`
itself (DeepSpeed's CPU Adam where it imports: a JIT build of ~2 minutes on the first run on a
machine, cached after), dp 4 and tp2 x pp2 x dp2 torch's fused AdamW, `auto`'s fallback.

Cases (one spawn per layout): stages 0-3 x offload off/on everywhere; dp 2 runs the full matrix
stage 0-3 x offload (none, optimizer, optimizer + parameters at stage 3) x fp32/bf16/fp16, plus
fp16 overflow, clipping and the skipped-step probe; tp2 x pp2 x dp2 adds clipping with stage 3 +
offload, stage 3 keep-gathered, stage 3 with sequence parallelism, GPT-2 (tied embeddings across
pipeline stages) at stages 3 and 1 + offload. Memory and DP-traffic ledgers are asserted for all,
against Psi counted on the model itself (model_psi), with the engine's padding bounded
(padding_bound). No test skips: each one that needs a particular layout takes that layout's fixture.

dp 2 is two launches: fp32 (with the plain path, fp16 overflow, clipping and the skipped-step probe) and
"dp2-lowp", the bf16 and fp16 matrix, which the fast tier (`-m "not slow"`) leaves out: the tests of that launch
(bf16 / fp16 tracking fp32, their first-step gradients, ledgers, traffic and host kernel) are marked slow, each
asserting of those cases what it asserts of fp32's. ZeRO in bf16 and fp16 stays in the fast tier through
tests/test_fp32_grads.py (bf16 at stages 0-3 and fp16 against fp32 on dp 2, its gradient and state bytes, its
traffic), tests/test_cp_training.py (bf16 and fp16 under CP) and the fp16 overflow and skipped-step tests here.

tp2 x pp2 x dp2 is two launches too: "tp2-pp2-dp2" (the plain path, clipping with stage 3 + offload, stage 3
keep-gathered, SP, GPT-2) in the fast tier, and its stage 0-3 x offload matrix (MATRIX: dp 2's and dp 4's matrix
again on this layout: ~19 of the module's ~80 s of CPU) in the full suite only, whose per-layout tests then check
every case of the layout (both launches). The `layout` fixture says which fast test keeps each subject. dp 4 is slow as
well (DP4): the fast tier keeps its one micro-batch a rank at dp 2 (one_micro_batch: global batch 4).
"""

from __future__ import annotations

import importlib.util
from typing import NamedTuple

import pytest
import torch

from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.dp import GradAverager
from hybrid.mesh import Mesh, ParallelDims
from hybrid.pipeline import ScheduleKind, build_schedule
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.testing import run_distributed
from hybrid.tp import TPContext, VocabParallelEmbedding, gather_full, spec_of
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, build_optimizer, train_step
from hybrid.zero import CpuAdam, Precision, ZeroConfig, ZeroOptimizer
from hybrid.zero.engine import tied_weight
from hybrid.zero.accounting import paper_state_bytes, paper_volume, state_ledger
from hybrid.measured_memory import StateKind
from models import build_pipeline_chunks, load_config
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)

STEPS, GLOBAL, MICRO, SEQ = 5, 8, 2, 32
OVERFLOW_STEPS = 10  # fp16 from scale 2^20 skips steps until the scale fits: the real steps after them train
RTOL = 1e-5
PLAIN_RTOL = 2e-6
OPT = OptimizerConfig(lr=5e-4, eps=1e-5, weight_decay=0.01, decay_style="constant")
KINDS = (StateKind.PARAMETERS, StateKind.GRADIENTS, StateKind.MASTER_WEIGHTS, StateKind.OPTIMIZER_STATES)


def zcfg(stage: int, offload: bool = False, params: bool | None = None, **kw) -> ZeroConfig:
    """`offload`: the optimizer offloaded, and at stage 3 the parameters too unless `params` says
    otherwise. The offloaded step runs what users get, `--cpu-adam auto`: DeepSpeed's CPU Adam when
    it imports and builds (JIT, once per machine), torch's fused CPU AdamW otherwise."""
    params = offload and stage == 3 if params is None else params
    return ZeroConfig(stage=stage, offload_optimizer=offload, offload_params=params, **kw)


def _runner(mesh: Mesh, chunks, cfg, spec: BatchSpec, dtype: torch.dtype):
    if mesh.dims.pp == 1:
        return LocalForwardBackward(chunks[0], mesh.device)
    schedule = build_schedule(ScheduleKind.ONE_F_ONE_B, mesh.dims.pp, spec.num_micro_batches)[mesh.coords.pp]
    seq = SEQ // mesh.dims.tp if chunks[0].tp.sequence_parallel else SEQ
    return PipelineExecutor(chunks, schedule, mesh.pp, StageIO((MICRO, seq, cfg.hidden_size), dtype), mesh.device)


def _weights(chunks, mesh: Mesh) -> dict[str, torch.Tensor]:
    return {n: gather_full(p.detach().float(), spec_of(p), mesh.tp).clone()
            for c in chunks for n, p in c.named_parameters()}


def model_psi(chunks) -> dict[str, int]:
    """This rank's share of the model, counted on the model itself before any optimizer exists:
    Psi (numel of every parameter, a tied pair held once per rank), the tensors (a bound on the
    number of flat units: each unit holds at least one) and the tied embedding's numel (reduced
    once per step, not per micro-batch)."""
    params = list(chunks.parameters())
    tied = {id(w): w.numel() for c in chunks if (w := tied_weight(c)) is not None}
    lookups = {id(p): p.numel() for c in chunks for m in c.children()
               if isinstance(m, (torch.nn.Embedding, VocabParallelEmbedding)) for p in m.parameters() if id(p) not in tied}
    return {"psi": sum(p.numel() for p in params), "tensors": len(params), "tied": sum(tied.values()),
            "lookup": sum(lookups.values())}


def capture_first_step_grads(opt: ZeroOptimizer, chunks) -> list:
    """Record, on the first step, the gradient AdamW receives for each master segment, as
    (parameter name, start, stop, grad): grad = d loss / d param.flatten()[start:stop], unscaled."""
    names = {id(p): n for c in chunks for n, p in c.named_parameters()}
    got: list = []
    inner = opt.optimizer.step

    def step(*args, **kw):
        if not got:
            for u in opt.units:
                offset = {id(p): off for p, off in zip(u.params, u.offsets)}
                for s in u.segments:
                    start = u.shard_range[0] + s.lo - offset[id(s.param)]
                    got.append((names[id(s.param)], start, start + s.hi - s.lo, opt.segment_grad(u, s).clone()))
        return inner(*args, **kw)

    opt.optimizer.step = step
    return got


def train(mesh: Mesh, model_name: str, z: ZeroConfig | None, opt_cfg: OptimizerConfig = OPT, sp: bool = False,
          steps: int = STEPS, global_batch: int = GLOBAL):
    """`steps` AdamW steps on the same global batches: ZeRO (z) or the plain path (z None), with
    sequence parallelism when `sp`. Returns losses, full weights, and for ZeRO the last step's ledgers."""
    cfg = load_config(model_name)
    chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp, sequence_parallel=sp), mesh.coords.pp, mesh.dims.pp, 1,
                                   seed=7)
    spec = BatchSpec(global_batch, MICRO, SEQ, mesh.dims.dp)
    runner = _runner(mesh, chunks, cfg, spec, z.precision.dtype if z else torch.float32)
    model = model_psi(chunks)  # before the optimizer: ZeRO re-binds the parameters into its units
    out = {"losses": [], "skipped": 0, "model": model, "m": spec.num_micro_batches}
    if z is None:
        opt, sync = build_optimizer(chunks, opt_cfg), GradAverager(chunks.parameters(), mesh.dp)
    else:
        opt, sync = ZeroOptimizer(chunks, mesh, z, opt_cfg), None
        if mesh.dims.tp == mesh.dims.pp == 1:  # names and shapes are the single-process model's
            out["grads"] = capture_first_step_grads(opt, chunks)
    corpus = load_corpus()
    for it in range(steps):
        mesh.ledger.reset()
        out["losses"].append(train_step(chunks, micro_batches(corpus, spec, 3, it, mesh.coords.dp), opt, mesh, sync,
                                        runner=runner))
    if z is not None:
        out.update(volume=paper_volume(mesh.ledger), memory=state_ledger(opt).entries, skipped=opt.skipped_steps,
                   loss_scale=opt.loss_scale, optimizer_kind=opt.optimizer_kind)
        with opt.gathered():
            out["weights"] = _weights(chunks, mesh)
    else:
        out["weights"] = _weights(chunks, mesh)
    return out


def padding_bound(z: ZeroConfig, model: dict, dp: int) -> int:
    """Most elements the engine may add: each flat unit is padded up to a multiple of its shard
    count n (n = dp for stages 1-3, 1 for stage 0), so by < n elements, and there are at most
    as many units as parameter tensors."""
    return ((dp if z.sharded else 1) - 1) * model["tensors"]


def expected_volume(z: ZeroConfig, psi: int, tied: int, m: int, b: int, lookup: int = 0) -> int:
    """Per-step DP volume (paper unit, bytes) for `psi` parameters of b bytes with m micro-batches.
    m = 1: 2 Psi for stages 0-2, 3 Psi for stage 3. With accumulation, stages 0-1 still reduce once;
    stage 2 reduce-scatters every micro-batch (m + 1) Psi; stage 3 gathers twice and reduce-scatters
    once per micro-batch, 3 m Psi, or 2 Psi when layers stay gathered through the step. The `tied`
    embedding is reduced once per step (engine.py), so stage 2 moves 2 of it, stage 3 2 m + 1. At stage 3 the
    untied embedding lookups (`lookup` elements) are not gathered again for backward (their gradient reads no
    weight): 2 m of them."""
    if z.stage <= 1 or z.keep_gathered:
        return 2 * b * psi
    if z.stage == 2:
        return b * ((m + 1) * (psi - tied) + 2 * tied)
    return b * (3 * m * (psi - tied - lookup) + 2 * m * lookup + (2 * m + 1) * tied)


def reference(model_name: str, opt_cfg: OptimizerConfig = OPT, steps: int = STEPS):
    """One process, the whole global batch, torch AdamW (and torch's clip_grad_norm_)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 threads on 2 cores is ~20x slower here than 1
    try:
        mesh = Mesh.single()
        cfg = load_config(model_name)
        chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp), 0, 1, 1, seed=7)
        opt = build_optimizer(chunks, opt_cfg)
        spec = BatchSpec(GLOBAL, MICRO, SEQ, 1)
        corpus, losses = load_corpus(), []
        for it in range(steps):
            opt.zero_grad(set_to_none=True)
            losses.append(LocalForwardBackward(chunks[0], mesh.device).forward_backward(
                micro_batches(corpus, spec, 3, it, 0)).item())
            if it == 0:
                grads = {n: p.grad.detach().flatten().clone() for n, p in chunks[0].named_parameters()}
            if opt_cfg.clip_grad:
                torch.nn.utils.clip_grad_norm_(chunks.parameters(), opt_cfg.clip_grad)
            opt.step()
        return {"losses": losses, "weights": _weights(chunks, mesh), "grads": grads}
    finally:
        torch.set_num_threads(threads)


def worst_rel(weights: dict, ref: dict) -> tuple[float, str]:
    errs = {n: (w - ref[n]).abs().max().item() / ref[n].abs().max().item() for n, w in weights.items()}
    name = max(errs, key=errs.get)
    return errs[name], name


# --- the cases: one spawn per world size ------------------------------------------------------
CLIP = OptimizerConfig(lr=5e-4, eps=1e-5, weight_decay=0.01, decay_style="constant", clip_grad=0.5)


class Case(NamedTuple):
    model: str
    zero: ZeroConfig | None  # None: the plain path (GradAverager + torch AdamW)
    opt: OptimizerConfig = OPT
    sp: bool = False  # sequence parallelism (tp x dp layout): TP partial gradients, summed inside the hooks
    steps: int = STEPS


PRECISIONS = (Precision.FP32, Precision.BF16, Precision.FP16)
FP16_SCALE = 2.0**12  # no step of the fp16 matrix overflows at this initial scale (asserted)


def offloads(stage: int) -> dict[str, tuple[bool, bool]]:
    """Name suffix -> (offload optimizer, offload parameters), every combination the flags allow."""
    out = {"": (False, False), "-offload": (True, stage == 3)}
    if stage == 3:
        out["-offload-opt"] = (True, False)
    return out


def matrix_name(precision: Precision, stage: int, suffix: str) -> str:
    return f"{'' if precision is Precision.FP32 else precision.value + '-'}stage{stage}{suffix}"


def cases(world: int, lowp: bool = False) -> dict[str, Case]:
    """dp 2 runs the whole matrix -- stage 0-3 x offload (none, optimizer, + parameters at stage 3)
    x fp32/bf16/fp16 -- in two launches (`lowp`: bf16 and fp16); dp 4 and tp2 x pp2 x dp2 the fp32 stages with and without
    full offload, plus their own cases. `auto` takes one of two host kernels: dp 2 runs `auto`
    itself (DeepSpeed's CPU Adam where deepspeed imports), the larger layouts run torch's fused
    AdamW -- the kernel `auto` falls back to -- so both are tested, and 12 ranks do not each pay
    the DeepSpeed import (~50 s of wall time for 8 ranks on 2 cores, measured)."""
    host = {} if world == 2 else {"cpu_adam": CpuAdam.TORCH}
    assert world == 2 or not lowp
    out = {} if lowp else {"plain": Case("tiny-llama", None, OPT)}
    for precision in PRECISIONS[1:] if lowp else PRECISIONS[:1]:
        for stage in range(4):
            for suffix, (opt, params) in offloads(stage).items():
                # fp16 starts at 2^12: the default 2^16 overflows at step 3 here (measured), and a
                # skipped step would shift the run against the fp32 reference
                scale = {"initial_loss_scale": FP16_SCALE} if precision is Precision.FP16 else {}
                if world == 2 or suffix != "-offload-opt":
                    out[matrix_name(precision, stage, suffix)] = Case(
                        "tiny-llama", zcfg(stage, opt, params, precision=precision, **scale, **host))
    if world == 2 and not lowp:
        out["fp16-overflow-stage2"] = Case("tiny-llama", zcfg(2, precision=Precision.FP16, initial_loss_scale=2.0**20),
                                           steps=OVERFLOW_STEPS)
        out["clip-stage2"] = Case("tiny-llama", zcfg(2), CLIP)
    if world == 8:
        out["clip-stage3-offload"] = Case("tiny-llama", zcfg(3, True, **host), CLIP)
        out["stage3-keep"] = Case("tiny-llama", zcfg(3, keep_gathered=True))
        out["sp-plain"] = Case("tiny-llama", None, sp=True)
        out["sp-stage3"] = Case("tiny-llama", zcfg(3), sp=True)
        out["gpt2-plain"] = Case("tiny-gpt2", None)
        out["gpt2-stage3"] = Case("tiny-gpt2", zcfg(3))
        out["gpt2-stage1-offload"] = Case("tiny-gpt2", zcfg(1, True, **host))
    return out


def skipped_step_probe(mesh: Mesh, stage: int) -> dict:
    """fp16: two runs from one init on the same batches. Both take step 1 at a scale that does not
    overflow; then `forced` has its scale raised to 2^40 (as a long window of good steps would grow
    it), so its step 2 overflows and must be skipped, while `normal` takes step 2 at the old scale.
    The forward of step 2 is the same computation in both (same weights, same batch; the scale is a
    power of two applied to the fp32 loss, so exact): the reported losses must be bit-equal. Returns
    both losses, the skip report, and the model/optimizer tensors that changed across the skip."""
    cfg = load_config("tiny-llama")
    spec, corpus = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp), load_corpus()
    out = {}
    for run in ("normal", "forced"):
        chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp), 0, 1, 1, seed=7)
        opt = ZeroOptimizer(chunks, mesh, zcfg(stage, precision=Precision.FP16, initial_loss_scale=FP16_SCALE), OPT)
        runner = LocalForwardBackward(chunks[0], mesh.device)
        step = lambda it: train_step(chunks, micro_batches(corpus, spec, 3, it, mesh.coords.dp), opt, mesh,
                                     runner=runner)
        losses = [step(0)]
        if run == "forced":
            opt.loss_scale = 2.0**40
            before = _state_tensors(opt)
        losses.append(step(1))
        out[run] = {"losses": losses, "skipped": opt.last_report.skipped, "scale": opt.loss_scale}
    after = _state_tensors(opt)
    out["forced"]["changed"] = [k for k in before if not torch.equal(before[k], after[k])]
    out["forced"]["tensors"] = len(before)
    return out


def _state_tensors(opt: ZeroOptimizer) -> dict[str, torch.Tensor]:
    """Every tensor a step may write: parameters (flat buffers; stage 3 its shards), fp32 masters,
    every optimizer state entry (Adam moments and step counts). Stages 1-2 overlap the post-step parameter
    all-gather with the next forward: wait for it, or `flat` is read while the previous step's gather is still
    writing it (stage 2 failed so once, a "changed" flat buffer, in a run of the suite on two workers)."""
    opt.wait_params()
    out = {}
    for u in opt.units:
        out[f"{u.name}.shard"] = u.shard.clone()
        out[f"{u.name}.master"] = u.master.clone()
        if opt.cfg.stage < 3:
            out[f"{u.name}.flat"] = u.flat.clone()
    for i, state in enumerate(opt.optimizer.state.values()):
        for k, v in state.items():
            if torch.is_tensor(v):
                out[f"state{i}.{k}"] = v.clone()
    assert any(k.startswith("state") for k in out), "step 1 must have created the Adam moments"
    return out


def _run_all(rank, world, tp, pp, name):
    mesh = Mesh.build(ParallelDims.from_world(world, tp=tp, pp=pp))
    out = {case_name: train(mesh, *case) for case_name, case in launch_cases(name).items()}
    if name == "dp2":
        out["skip-probe"] = {stage: skipped_step_probe(mesh, stage) for stage in range(4)}
        out["one-micro-batch"] = {stage: one_micro_batch(mesh, stage) for stage in range(4)}
    return out


def one_micro_batch(mesh: Mesh, stage: int) -> dict:
    """One step with one micro-batch a rank (global batch = MICRO x dp): the model's Psi counted, m and the step's
    DP volume, for test_one_micro_batch_moves_2_psi_for_stages_0_to_2_and_3_psi_for_stage_3 at dp 2."""
    got = train(mesh, "tiny-llama", zcfg(stage), steps=1, global_batch=MICRO * mesh.dims.dp)
    return {k: got[k] for k in ("model", "m", "volume")}


LAYOUTS = {"dp2": (2, 1, 1), "dp4": (4, 1, 1), "tp2-pp2-dp2": (8, 2, 2), "dp2-lowp": (2, 1, 1),
           "tp2-pp2-dp2-matrix": (8, 2, 2)}
LOWP = "dp2-lowp"  # dp 2's bf16 / fp16 matrix, a launch of its own (module doc)
MATRIX = "tp2-pp2-dp2-matrix"  # tp2 x pp2 x dp2's stage 0-3 x offload matrix, a launch of its own (module doc)
MATRIX_CASES = [matrix_name(Precision.FP32, stage, suffix) for stage in range(4) for suffix in ("", "-offload")]
_RUNS: dict[str, list] = {}


def launch_cases(name: str) -> dict[str, Case]:
    """The cases the launch `name` computes. tp2 x pp2 x dp2 is two launches: "tp2-pp2-dp2" (the fast tier's: the
    plain path, clipping with stage 3 + offload, stage 3 keep-gathered, sequence parallelism, GPT-2's tied
    embeddings) and MATRIX (the stage 0-3 x offload matrix, slow)."""
    world = LAYOUTS[name][0]
    if world != 8:
        return cases(world, name == LOWP)
    return {n: c for n, c in cases(world).items() if (n in MATRIX_CASES) == (name == MATRIX)}


def _results(name: str) -> list:
    """One spawn per launch for the whole module, shared by the per-layout and single-layout tests. MATRIX's
    results hold both tp2 x pp2 x dp2 launches' cases (every case of that layout, as layout_cases says)."""
    if name not in _RUNS:
        world, tp, pp = LAYOUTS[name]
        _RUNS[name] = run_distributed(_run_all, world, args=(tp, pp, name), timeout=900)
        if name == MATRIX:
            _RUNS[name] = [{**fast, **matrix} for fast, matrix in zip(_results("tp2-pp2-dp2"), _RUNS[name])]
    return _RUNS[name]


def layout_cases(name: str) -> dict[str, Case]:
    """The cases a layout's tests check: its launch's; MATRIX every tp2 x pp2 x dp2 case (both launches)."""
    return cases(8) if name == MATRIX else launch_cases(name)


# dp 4 is slow: its stages, offloads and ledgers run at dp 2 in the fast tier, its one micro-batch a rank (the
# paper's 2 Psi / 3 Psi) in dp 2's one_micro_batch, its named torch-fused fallback on tp2-pp2-dp2
DP4 = pytest.param("dp4", marks=pytest.mark.slow)


# the per-layout tests whose subject every precision has: dp 2's low-precision launch too (slow)
WITH_LOWP = pytest.mark.parametrize("layout", ["dp2", pytest.param(LOWP, marks=pytest.mark.slow), DP4,
                                               "tp2-pp2-dp2", pytest.param(MATRIX, marks=pytest.mark.slow)],
                                    indirect=True)


@pytest.fixture(scope="module")
def refs():
    return {name: reference("tiny-llama", opt) for name, opt in (("adamw", OPT), ("clip", CLIP))}


# MATRIX (tp2 x pp2 x dp2's stage 0-3 x offload) is slow: in the fast tier every stage and offload runs at dp 2
# and dp 4 (against one process, the paper's ledgers and traffic), and on tp2 x pp2 x dp2 the "tp2-pp2-dp2" launch
# keeps the plain path, stage 3 with offloaded optimizer and parameters (clip-stage3-offload), stage 3
# keep-gathered, stage 3 with SP, GPT-2 at stage 3 and stage 1 + offload; stage 2 on tp2 x pp2 x dp2 stays in
# tests/test_pipeline_zb_training.py (ZeRO 2 under 1F1B and zero bubble)
@pytest.fixture(scope="module", params=["dp2", DP4, "tp2-pp2-dp2", pytest.param(MATRIX, marks=pytest.mark.slow)])
def layout(request):
    return request.param, LAYOUTS[request.param][0], _results(request.param)


@pytest.fixture(scope="module")
def dp2():
    return _results("dp2")


@pytest.fixture(scope="module")
def dp4():
    return _results("dp4")


@pytest.fixture(scope="module")
def lowp():
    return _results(LOWP)


@pytest.fixture(scope="module")
def tp2pp2dp2():
    return _results("tp2-pp2-dp2")


def _fp32_cases(name: str) -> list[str]:
    return [n for n, c in layout_cases(name).items()
            if c.model == "tiny-llama" and (c.zero is None or c.zero.precision is Precision.FP32)]


def test_fp32_stages_match_single_process_training(layout, refs):
    """STEPS AdamW steps of every stage, offload on and off, equal one process on the global batch."""
    name, world, results = layout
    for case in _fp32_cases(name):
        ref = refs["clip" if case.startswith("clip") else "adamw"]
        for rank, per_rank in enumerate(results):
            got = per_rank[case]
            for a, b in zip(got["losses"], ref["losses"]):
                assert abs(a - b) <= RTOL * abs(b), f"{name} {case} rank {rank}: loss {a} != {b}"
            err, tensor = worst_rel(got["weights"], ref["weights"])
            assert err <= RTOL, f"{name} {case} rank {rank}: {tensor} rel err {err:.2e}"
    assert refs["adamw"]["losses"][-1] < refs["adamw"]["losses"][0] - 0.3  # 5.56 -> 5.02: it trains


@pytest.mark.parametrize("layout", ["dp2", pytest.param(LOWP, marks=pytest.mark.slow)], indirect=True)
def test_offloaded_step_runs_the_host_kernels_auto_chooses(layout):
    """dp 2 ran `--cpu-adam auto` as users get it: DeepSpeed's CPU Adam where deepspeed imports (it
    JIT-builds on first use), torch's fused CPU AdamW where it does not or its build fails; dp 4
    and tp2 x pp2 x dp2 run that fallback by name (the next test). Never the per-tensor loop the tests once
    forced."""
    auto = _offload_kinds(layout[2], layout[0])
    assert len(auto) == 1 and auto <= {"deepspeed-cpu-adam", "torch-fused"}, auto
    if importlib.util.find_spec("deepspeed") is None:
        assert auto == {"torch-fused"}


@pytest.mark.parametrize("layout", ["tp2-pp2-dp2", DP4], indirect=True)
def test_the_named_fallback_runs_torchs_fused_adamw(layout):
    """`--cpu-adam torch`, the kernel `auto` falls back to, runs torch's fused CPU AdamW (dp 4 and tp2 x pp2 x dp2
    name it)."""
    assert _offload_kinds(layout[2], layout[0]) == {"torch-fused"}


def _offload_kinds(results, name: str) -> set[str]:
    return {r[c]["optimizer_kind"] for r in results for c, case in layout_cases(name).items()
            if case.zero is not None and case.zero.offload_optimizer}


def test_zero_equals_plain_data_parallel_on_the_same_layout(layout):
    """Isolates ZeRO from summation-order noise: stages 0-1 reduce the same buckets in the same order
    as the plain path (bit-for-bit); stages 2-3 reduce-scatter each micro-batch, offload runs the
    host's AdamW (DeepSpeed's AVX kernel or torch's fused one: another rounding of the formula):
    PLAIN_RTOL."""
    name, world, results = layout
    for case in _fp32_cases(name):
        if case.endswith("plain") or case.startswith("clip"):
            continue
        bitwise = case in ("stage0", "stage1")
        plain = "sp-plain" if case.startswith("sp-") else "plain"
        for rank, per_rank in enumerate(results):
            err, tensor = worst_rel(per_rank[case]["weights"], per_rank[plain]["weights"])
            assert err <= (0.0 if bitwise else PLAIN_RTOL), f"{name} {case} rank {rank}: {tensor} {err:.2e}"
            if bitwise:
                assert per_rank[case]["losses"] == per_rank["plain"]["losses"]


@WITH_LOWP
def test_model_state_ledger_equals_the_zero_paper_accounting(layout):
    """Per rank and per placement: params, grads, fp32 master weights and Adam moments as ZeRO
    predicts (bf16: stage 1 4 Psi + 12 Psi/n, stage 2 2 Psi + 14 Psi/n, stage 3 16 Psi/n) for the
    Psi counted on the model before the optimizer existed. The engine pads its flat units: every
    entry lies between the formula at Psi and at Psi + padding_bound (stage 0: exact)."""
    name, world, results = layout
    dp = world // (LAYOUTS[name][1] * LAYOUTS[name][2])
    for case, c in layout_cases(name).items():
        if c.zero is None:
            continue
        for rank, per_rank in enumerate(results):
            got, model = per_rank[case], per_rank[case]["model"]
            if dp == world:  # no TP/PP split: the rank holds the whole model, as its config counts it
                assert model["psi"] == load_config(c.model).num_parameters
            measured = {k: v for k, v in got["memory"].items() if k[0] in KINDS}
            low = paper_state_bytes(c.zero, model["psi"], dp)
            high = paper_state_bytes(c.zero, model["psi"] + padding_bound(c.zero, model, dp), dp)
            assert measured.keys() == low.keys(), f"{name} {case} rank {rank}: {measured} vs {low}"
            for k, v in measured.items():
                assert low[k] <= v <= high[k], f"{name} {case} rank {rank}: {k} {v} not in [{low[k]}, {high[k]}]"


@pytest.mark.parametrize("layout", ["dp2", DP4, pytest.param(MATRIX, marks=pytest.mark.slow)], indirect=True)
def test_offload_moves_master_weights_and_adam_moments_off_the_device(layout):
    name, world, results = layout
    for stage in range(4):
        on, off = results[0][f"stage{stage}-offload"]["memory"], results[0][f"stage{stage}"]["memory"]
        device_on = sum(v for (k, p), v in on.items() if p == "device" and k in KINDS)
        device_off = sum(v for (k, p), v in off.items() if p == "device" and k in KINDS)
        assert on[(StateKind.OPTIMIZER_STATES, "offload")] == off[(StateKind.OPTIMIZER_STATES, "device")]
        assert device_on < device_off
        if stage == 3:  # parameters offloaded too: only the gradient shard stays on the device
            assert (StateKind.PARAMETERS, "device") not in on


@WITH_LOWP
def test_dp_traffic_per_step_is_the_paper_volume(layout):
    """2 Psi (stages 0-2), 3 Psi (stage 3) per step with one micro-batch, the accumulation formula
    of expected_volume otherwise, for the Psi counted on the model: between the formula at Psi
    and at Psi + padding_bound (each padded element travels as often as a real one)."""
    name, world, results = layout
    dp = world // (LAYOUTS[name][1] * LAYOUTS[name][2])
    for case, c in layout_cases(name).items():
        if c.zero is None:
            continue
        b = torch.empty((), dtype=c.zero.precision.dtype).element_size()
        for rank, per_rank in enumerate(results):
            got, model = per_rank[case], per_rank[case]["model"]
            pad = padding_bound(c.zero, model, dp)
            psi, tied, m, lookup = model["psi"], model["tied"], got["m"], model["lookup"]
            low = expected_volume(c.zero, psi, tied, m, b, lookup)
            # the padding sits in the tied unit or elsewhere: the larger of the two
            high = max(expected_volume(c.zero, psi + pad, tied + (pad if tied else 0), m, b, lookup),
                       expected_volume(c.zero, psi + pad, tied, m, b, lookup))
            assert low <= got["volume"] <= high, f"{name} {case} rank {rank}: {got['volume']} not in [{low}, {high}]"


@pytest.mark.parametrize("launch", ["dp2", pytest.param("dp4", marks=pytest.mark.slow)])
def test_one_micro_batch_moves_2_psi_for_stages_0_to_2_and_3_psi_for_stage_3(launch):
    """One micro-batch per rank -- dp 4's cases (8 = 2 x 4 x 1), dp 2's one_micro_batch step (4 = 2 x 2 x 1): the
    paper's 2 Psi and 3 Psi exactly, up to the padding (< dp elements per unit), Psi counted on the model -- less,
    at stage 3, the untied embedding lookups' backward gather (their gradient reads no weight): 3 Psi - lookups.
    The paper's volume per rank has no dp in it (each all-reduce 2 S, each reduce-scatter / all-gather S, of the
    whole flat unit S): dp enters only through m = global / (micro x dp) and the padding, so dp 2 at m = 1 checks
    the same formula as dp 4, with the padding bound at dp 2."""
    dp = LAYOUTS[launch][0]
    for stage in range(4):
        per_rank = _results(launch)[0]
        got = per_rank["one-micro-batch"][stage] if launch == "dp2" else per_rank[f"stage{stage}"]
        psi, pad = got["model"]["psi"], padding_bound(zcfg(stage), got["model"], dp)
        skipped = got["model"]["lookup"] if stage == 3 else 0
        assert stage < 3 or skipped > 0, "the model has an untied lookup (its positions)"
        k = 3 if stage == 3 else 2
        assert got["m"] == 1 and k * 4 * psi - 4 * skipped <= got["volume"] <= k * 4 * (psi + pad) - 4 * skipped, \
            (stage, got["volume"], psi)


def _low_precision_cases(precision: Precision) -> list[str]:
    return [matrix_name(precision, stage, suffix) for stage in range(4) for suffix in offloads(stage)]


@pytest.mark.slow  # the dp2-lowp launch (module doc)
def test_bf16_training_tracks_fp32(lowp, refs):
    """bf16 compute with fp32 master weights, every stage and offload, against the fp32
    single-process run.

    Loss: bf16 keeps 8 significant bits (unit roundoff u = 2^-8 = 3.9e-3); activations are rounded
    at u per op, and the loss -- a mean over B*T tokens, in fp32 from the logits on -- moves far less
    than one rounding of itself: bound u relative per step (measured 2.8e-4).
    Weights: what the model holds is the bf16 rounding of the fp32 master (<= u |w|), plus the
    master's own drift: bf16 gradients carry ~u relative error, and AdamW turns the sign noise of
    small ones into steps of up to lr, so STEPS steps can drift at most STEPS lr; bound half of that
    (measured at 10 steps: 2.0 lr = 1.0e-3 beyond the rounding, over every stage and offload)."""
    _tracks_fp32(lowp, refs["adamw"], Precision.BF16, u=2.0**-8)


@pytest.mark.slow  # the dp2-lowp launch (module doc)
def test_fp16_training_tracks_fp32(lowp, refs):
    """fp16 with dynamic loss scaling (initial scale FP16_SCALE; no step overflows: asserted),
    every stage and offload, against the fp32 single-process run, with bf16's derivation at fp16's
    unit roundoff u = 2^-11 (11 significant bits): measured (at 10 steps) loss 1.9e-5 relative (bound
    u = 4.9e-4), weights 1.45 lr beyond the rounding (bound STEPS lr / 2). Adam is nearly blind to a
    constant factor in the gradient (only eps sees it), so these checks barely notice a forgotten
    unscale (measured at 10 steps: 2.6e-3 = 5.2 lr, just outside); the gradient check of
    test_first_step_master_gradients_equal_the_reference fails it by 4 orders of magnitude."""
    _tracks_fp32(lowp, refs["adamw"], Precision.FP16, u=2.0**-11)
    for case in _low_precision_cases(Precision.FP16):
        assert lowp[0][case]["skipped"] == 0 and lowp[0][case]["loss_scale"] == FP16_SCALE, case


def _tracks_fp32(results, ref: dict, precision: Precision, u: float) -> None:
    for case in _low_precision_cases(precision):
        for rank, per_rank in enumerate(results):
            got = per_rank[case]
            for a, b in zip(got["losses"], ref["losses"]):
                assert abs(a - b) <= u * abs(b), f"{case} rank {rank}: loss {a} vs fp32 {b}"
            for n, w in got["weights"].items():
                excess = ((w - ref["weights"][n]).abs() - u * ref["weights"][n].abs()).max().item()
                assert excess <= STEPS * OPT.lr / 2, f"{case} rank {rank}: {n} drifts {excess:.2e} beyond rounding"


# Gradient tolerances, relative to each tensor's largest reference gradient entry.
# fp32: the reference sums the global batch's 4 micro-batches in one order, dp 2 sums 2 per rank
# and then the two ranks; the regrouping of a sum of k = 4 terms errs by <= (k - 1) eps_32 of the
# sum of |terms| (eps_32 = 2^-24 each addition), and the per-token terms inside each micro-batch
# (B*T = 64) are not reordered; the 1/m, 1/n scalings are powers of two (exact). With sum |terms|
# up to 4 |g|max (a gradient summed from micro-batches of either sign): 3 * 4 eps_32 < 2^-20.
# Measured 1.2e-7 = 2 eps_32 over every stage and offload.
GRAD_RTOL_FP32 = 2.0**-20
# bf16 / fp16: the forward and backward round every activation and activation gradient to the
# compute dtype (u relative each). A weight gradient is a product of the chain of such roundings
# from the loss back to that weight: tiny-llama's 4 layers each round ~11 tensors forward (2 norms,
# q, k, v, attention, o, gate, up, SwiGLU, down) and as many backward, plus embedding, final norm
# and head: D ~ 2 * 11 * 4 + 4 = 92 roundings, which to first order add: |dg| <= D u |g|.
# Bound D u, relative to the tensor's largest gradient (an element near 0 has no relative bound):
# bf16 0.36, fp16 0.045; measured 1.2e-2 (bf16) and 1.9e-3 (fp16), i.e. ~3.5 u -- the roundings
# mostly cancel. A missing unscale (x FP16_SCALE: measured rel err 4e3) or a wrong DP average
# (x 2: rel err 1) is far outside either.
GRAD_ROUNDINGS = 92


@pytest.mark.parametrize("layout", ["dp2", pytest.param(LOWP, marks=pytest.mark.slow)], indirect=True)
def test_first_step_master_gradients_equal_the_reference(layout, refs):
    """The gradients AdamW receives on the first step (before any update: same weights as the
    reference) -- the DP mean over the global batch, unscaled -- equal the single-process
    gradients: fp32 to GRAD_RTOL_FP32, bf16/fp16 to GRAD_ROUNDINGS u, for every stage and offload."""
    ref = refs["adamw"]["grads"]
    tol = {Precision.FP32: GRAD_RTOL_FP32, Precision.BF16: GRAD_ROUNDINGS * 2.0**-8,
           Precision.FP16: GRAD_ROUNDINGS * 2.0**-11}
    precisions = PRECISIONS[1:] if layout[0] == LOWP else PRECISIONS[:1]  # the launch's: fp32, or bf16 and fp16
    for precision, stage, suffix in [(p, st, x) for p in precisions for st in range(4) for x in offloads(st)]:
        case = matrix_name(precision, stage, suffix)
        pieces: dict[str, list] = {}
        for rank, per_rank in enumerate(layout[2]):
            for name, start, stop, g in per_rank[case]["grads"]:
                err = (g - ref[name][start:stop]).abs().max().item() / ref[name].abs().max().item()
                assert err <= tol[precision], f"{case} rank {rank}: {name}[{start}:{stop}] rel err {err:.2e}"
                pieces.setdefault(name, []).append((start, stop))
        # every element compared: stage 0 holds it on both ranks (keep one copy), stages 1-3 on one
        assert pieces.keys() == ref.keys(), case
        for name, spans in pieces.items():
            spans = sorted(spans)[::2] if stage == 0 else sorted(spans)
            assert _tiles(spans, ref[name].numel()), (case, name, spans)


def _tiles(spans: list[tuple[int, int]], numel: int) -> bool:
    """The spans, in order, cover [0, numel) end to end, each element once."""
    return spans[0][0] == 0 and spans[-1][1] == numel and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_fp16_overflow_skips_the_step_and_lowers_the_loss_scale(dp2):
    got = dp2[0]["fp16-overflow-stage2"]
    assert got["skipped"] >= 1 and got["loss_scale"] < 2.0**20
    assert all(torch.isfinite(torch.tensor(got["losses"])))
    assert got["losses"][-1] < got["losses"][0]


@pytest.mark.parametrize("stage", range(4))
def test_fp16_skipped_step_reports_the_true_loss_and_changes_nothing(dp2, stage):
    """A skipped (overflowing) step reports the loss of its forward, unscaled with the scale the
    backward used -- not twice it, with the halved scale -- and leaves every parameter, master
    weight and Adam moment bit-identical (skipped_step_probe)."""
    for per_rank in dp2:
        probe = per_rank["skip-probe"][stage]
        normal, forced = probe["normal"], probe["forced"]
        assert not normal["skipped"] and forced["skipped"] and forced["scale"] == 2.0**39
        assert forced["losses"] == normal["losses"], "the skipped step must report its forward's loss"
        assert forced["changed"] == [] and forced["tensors"] > 0


def test_gpt2_stage3_with_tied_embeddings_across_pipeline_stages_equals_plain_dp(tp2pp2dp2):
    """GPT-2's embedding lives on the first and the last stage; stage 3 keeps it in its own unit,
    summed over the embedding group after backward. Compared with the plain path on the same
    layout (GPT-2's key bias has an exactly-zero gradient, pure rounding noise under Adam, so the
    single-process comparison is Llama's)."""
    for per_rank in tp2pp2dp2:
        for case in ("gpt2-stage3", "gpt2-stage1-offload"):
            got, plain = per_rank[case]["weights"], per_rank["gpt2-plain"]["weights"]
            noise = {n for n in got if n.endswith("attn.k_proj.bias")}
            err, tensor = worst_rel({n: w for n, w in got.items() if n not in noise}, plain)
            assert err <= PLAIN_RTOL, f"{case}: {tensor} {err:.2e}"
            # softmax ignores a per-query shift, so the key bias has gradient exactly 0: what it
            # gets is rounding noise, which AdamW turns into steps of about +-lr. Bound: every step.
            for n in noise:
                assert (got[n] - plain[n]).abs().max().item() <= STEPS * OPT.lr, f"{case}: {n}"
            assert per_rank[case]["losses"] == pytest.approx(per_rank["gpt2-plain"]["losses"], rel=1e-6)
