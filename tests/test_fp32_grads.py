"""fp32 gradient accumulation (`--accumulate-allreduce-grads-in-fp32`, ZeroConfig.accumulate_fp32_grads): with --bf16
each backward's bf16 .grad is added into an fp32 buffer and the DP reductions move fp32 (Megatron's main grads).

Two spawns, shared by the module: dp 2 (tiny-llama) and tp2 x pp2 x dp2 (tiny-gpt2 with sequence parallelism: TP
partial gradients summed inside the hooks, the tied embedding summed over the embedding group across pipeline
stages -- both now on the fp32 buffer). Each test says what it proves; the numbers in the docstrings were measured
on this machine (2 cores, torch CPU kernels, gloo).

References are independent of the code under test: an fp32 run of the same layout (the flag cannot be on in fp32),
Psi counted on the model before any optimizer exists, the flag-off run of the same stage, and for the checkpoint the
uninterrupted run with tensors gathered by tests/test_checkpoint.py's own path.

The fast tier (`-m "not slow"`) runs the dp 2 launch; the tp2 x pp2 x dp2 one (8 ranks) is the slow `world8`
param of the three per-layout tests (the full suite runs it). Its subjects stay in the fast tier at dp 2 here and,
for the fp32 buffer under TP and PP, through tests/test_planner_runtime.py's fast fp32-gradient cases (tp 2 with
SP, and pp 2 with the tied embedding across the stages: every DP, embedding-group and TP partial-gradient entry
of the step's ledger in fp32, 2 + 4 + 12 bytes a parameter).
"""

from __future__ import annotations

import contextlib
import io
import os
from typing import NamedTuple

import pytest
import torch

from hybrid.checkpoint import store
from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.fault.nan_guard import GuardedOptimizer, GuardedRunner, NanGuard
from hybrid.mesh import Mesh, ParallelDims
from hybrid.pipeline import ScheduleKind, build_schedule
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.testing import run_distributed
from hybrid.tp import TPContext, gather_full, spec_of
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import CpuAdam, Precision, ZeroConfig, ZeroOptimizer
from models import build_pipeline_chunks, load_config
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)
from test_checkpoint import Run, full_state
from test_zero import GRAD_ROUNDINGS, model_psi, padding_bound

BF16, FP16, FP32 = Precision.BF16, Precision.FP16, Precision.FP32
SEQ, MICRO, GLOBAL, STEPS = 32, 2, 16, 3  # dp 2: 4 micro-batches a rank; tp2 x pp2 x dp2: 4 through the pipeline
# the accuracy run: 32 micro-batches of one sequence per rank at dp 2, so that accumulation error matters; one
# step (3 until round 17: 2/3 of the dp 2 launch's forward-backwards for no more power -- the test's docstring)
ACC_GLOBAL, ACC_MICRO, ACC_STEPS = 64, 1, 1
OPT = OptimizerConfig(lr=5e-4, eps=1e-5, weight_decay=0.01, decay_style="constant")  # test_zero's: see there
CLIP = OptimizerConfig(lr=5e-4, eps=1e-5, weight_decay=0.01, decay_style="constant", clip_grad=0.5)
FP16_SCALE = 2.0**12  # test_zero's: no step overflows at this scale (asserted)
U = {BF16: 2.0**-8, FP16: 2.0**-11}  # unit roundoff of the compute dtype


def zcfg(stage: int, fp32_grads: bool = True, precision: Precision = BF16, **kw) -> ZeroConfig:
    """The offloaded cases run torch's fused AdamW on the host: the kernel the device path runs (on CPU too), so
    offloading changes no rounding and may be compared bit for bit."""
    if kw.get("offload_optimizer"):
        kw.setdefault("cpu_adam", CpuAdam.TORCH)
    return ZeroConfig(stage=stage, precision=precision, accumulate_fp32_grads=fp32_grads, **kw)


class Case(NamedTuple):
    zero: ZeroConfig
    opt: OptimizerConfig = OPT
    global_batch: int = GLOBAL
    micro: int = MICRO
    steps: int = STEPS


# Cases that must agree bit for bit: the same sums in the same order. Stages 0-1 (and stage 3 keeping the layers
# gathered) accumulate the micro-batches in the full fp32 buffer and reduce once; stages 2-3 reduce-scatter each
# micro-batch and accumulate the reduced shards. The two orders differ, so the classes are compared only inside.
ONCE = ("z0", "z1", "z3-keep", "z1-offload")
PER_MICRO_BATCH = ("z2", "z3", "z3-offload")


def dp2_cases() -> dict[str, Case]:
    out = {"z0": Case(zcfg(0)), "z1": Case(zcfg(1)), "z2": Case(zcfg(2)), "z3": Case(zcfg(3)),
           "z3-keep": Case(zcfg(3, keep_gathered=True)), "z1-offload": Case(zcfg(1, offload_optimizer=True)),
           "z3-offload": Case(zcfg(3, offload_optimizer=True, offload_params=True))}
    out.update({f"off-z{s}": Case(zcfg(s, fp32_grads=False)) for s in (0, 2)})  # one of each reduction kind
    out["fp32"] = Case(ZeroConfig(stage=0))  # the reference of the bf16 / fp16 cases below
    out["fp32-clip"] = Case(ZeroConfig(stage=0), CLIP)
    out["clip-z2"] = Case(zcfg(2), CLIP)
    out["fp16-z1"] = Case(zcfg(1, precision=FP16, initial_loss_scale=FP16_SCALE))
    out["fp16-overflow-z2"] = Case(zcfg(2, precision=FP16, initial_loss_scale=2.0**20), steps=4)
    for name, z in (("acc-fp32", ZeroConfig(stage=0)), ("acc-off", zcfg(0, fp32_grads=False)), ("acc-on", zcfg(0))):
        out[name] = Case(z, global_batch=ACC_GLOBAL, micro=ACC_MICRO, steps=ACC_STEPS)
    return out


def world8_cases() -> dict[str, Case]:
    return {"z0": Case(zcfg(0)), "z2": Case(zcfg(2)), "z3": Case(zcfg(3)), "z3-keep": Case(zcfg(3, keep_gathered=True))}


def _runner(mesh: Mesh, chunks, cfg, spec: BatchSpec, dtype: torch.dtype):
    if mesh.dims.pp == 1:
        return LocalForwardBackward(chunks[0], mesh.device)
    schedule = build_schedule(ScheduleKind.ONE_F_ONE_B, mesh.dims.pp, spec.num_micro_batches)[mesh.coords.pp]
    seq = SEQ // mesh.dims.tp if chunks[0].tp.sequence_parallel else SEQ
    return PipelineExecutor(chunks, schedule, mesh.pp, StageIO((spec.micro_batch, seq, cfg.hidden_size), dtype),
                            mesh.device)


def full_masters(opt: ZeroOptimizer, chunks, mesh: Mesh) -> dict[str, torch.Tensor]:
    """name -> this rank's pipeline stage's full fp32 master weight: each unit's master shard all-gathered over DP
    (sharded stages), cut at the unit's parameter offsets, gathered over TP."""
    names = {id(p): f"{c}.{n}" for c, chunk in enumerate(chunks) for n, p in chunk.named_parameters()}
    out = {}
    for u in opt.units:
        shard = u.master.detach().float().cpu()
        flat = mesh.dp.all_gather(shard, dim=0) if opt.cfg.sharded else shard
        for p, off in zip(u.params, u.offsets):
            out[names[id(p)]] = gather_full(flat[off:off + p.numel()].view(p.shape), spec_of(p), mesh.tp).clone()
    return out


def gradient_buffers(opt: ZeroOptimizer) -> dict:
    """What holds gradients between steps, read off the tensors: the bytes and dtypes of the flat buffers (stages
    0-1) or the reduced shards (stages 2-3), and any .grad or per-micro-batch buffer left over."""
    held = [u.flat_grad if u.flat_grad is not None else u.grad_shard for u in opt.units]
    return {"bytes": sum(t.untyped_storage().nbytes() for t in held), "dtypes": {t.dtype for t in held},
            "leftover": sum(p.grad is not None for u in opt.units for p in u.params)
            + sum(u.full_grad is not None for u in opt.units)}


def train(mesh: Mesh, model_name: str, case: Case, sp: bool = False) -> dict:
    """`case.steps` steps on the same global batches; losses, the ledgers of the last step, the fp32 masters, the
    compute-dtype weights and (stage 0) the first step's master gradients."""
    cfg = load_config(model_name)
    chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp, sequence_parallel=sp), mesh.coords.pp, mesh.dims.pp, 1,
                                   seed=7)
    spec = BatchSpec(case.global_batch, case.micro, SEQ, mesh.dims.dp)
    runner = _runner(mesh, chunks, cfg, spec, case.zero.precision.dtype)
    model = model_psi(chunks)  # before the optimizer re-binds the parameters
    opt = ZeroOptimizer(chunks, mesh, case.zero, case.opt)
    w0 = full_masters(opt, chunks, mesh) if case.zero.stage == 0 else None
    first_grads = _capture_first_grads(opt) if case.zero.stage == 0 else None
    corpus, losses, reports = load_corpus(), [], []
    for it in range(case.steps):
        mesh.ledger.reset()
        losses.append(train_step(chunks, micro_batches(corpus, spec, 3, it, mesh.coords.dp), opt, mesh,
                                 runner=runner))
        reports.append(opt.last_report)
    ledger = mesh.ledger.summary()
    out = {"losses": losses, "ledger": {k: v for k, v in ledger.items() if ":" not in k}, "model": model,
           "m": spec.num_micro_batches, "grads": gradient_buffers(opt), "reports": reports,
           "masters": full_masters(opt, chunks, mesh), "w0": w0, "first_grads": first_grads}
    with opt.gathered():
        out["weights"] = {n: gather_full(p.detach().float(), spec_of(p), mesh.tp).clone()
                          for c in chunks for n, p in c.named_parameters()}
    return out


def _capture_first_grads(opt: ZeroOptimizer) -> list:
    """Stage 0 (every rank holds every gradient): the master gradients AdamW receives on the first step."""
    got: list = []
    inner = opt.optimizer.step

    def step(*args, **kw):
        if not got:
            got.extend(v.grad.detach().flatten().clone() for u in opt.units for v in u.views)
        return inner(*args, **kw)

    opt.optimizer.step = step
    return got


def nan_probe(mesh: Mesh) -> dict:
    """Stage 2 with fp32 gradients under the NaN guard: step 1 (of 0-2) gets a NaN gradient on rank 1 -- written
    into the bf16 .grad by a tensor hook, before the fp32 accumulation -- and must be skipped on both ranks with the
    state bit-identical; steps 0 and 2 update."""
    cfg = load_config("tiny-llama")
    chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp), 0, 1, 1, seed=7)
    opt = ZeroOptimizer(chunks, mesh, zcfg(2), OPT)
    runner = GuardedRunner(LocalForwardBackward(chunks[0], mesh.device))
    guard = NanGuard(mesh, chunks, max_skipped=3)
    guarded = GuardedOptimizer(opt, guard, runner)
    spec, corpus, log = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp), load_corpus(), io.StringIO()
    first = next(iter(chunks.parameters()))
    states = [_state(opt)]
    for it in range(3):
        guarded.iteration = it
        handle = first.register_hook(lambda g: torch.full_like(g, float("nan"))) if it == 1 and mesh.rank == 1 \
            else None
        with contextlib.redirect_stdout(log):
            train_step(chunks, micro_batches(corpus, spec, 3, it, mesh.coords.dp), guarded, mesh, runner=runner)
        if handle is not None:
            handle.remove()
        states.append(_state(opt))
    changed = [not all(torch.equal(a, b) for a, b in zip(x, y)) for x, y in zip(states, states[1:])]
    return {"changed": changed, "skipped": guard.skipped, "log": log.getvalue(),
            "first": next(n for n, p in chunks.named_parameters() if p is first)}


def _state(opt: ZeroOptimizer) -> list[torch.Tensor]:
    opt.wait_params()
    out = [u.master.clone() for u in opt.units] + [u.shard.clone() for u in opt.units]
    for st in opt.optimizer.state.values():
        out += [v.clone() for v in st.values() if torch.is_tensor(v)]
    return out


def resume_probe(mesh: Mesh, root: str, stage: int, precision: Precision) -> dict:
    """test_checkpoint's harness with fp32 gradients: 2 steps, save, 2 steps; then a fresh model and optimizer
    load the checkpoint and take the same 2 steps."""
    corpus, key = load_corpus(), os.path.join(root, f"z{stage}-{precision.value}")
    z = zcfg(stage, precision=precision)
    straight = Run(mesh, ("tiny-llama", None), z)
    losses = straight.train(0, 2, corpus)
    straight.save(key, 2).finish()
    losses += straight.train(2, 4, corpus)
    resumed = Run(mesh, ("tiny-llama", None), z)
    assert resumed.load(store.final_path(key, 2))["iteration"] == 2
    return {"straight": (losses[2:], full_state(straight)),
            "resumed": (resumed.train(2, 4, corpus), full_state(resumed))}


def _run_dp2(rank, world, root):
    mesh = Mesh.build(ParallelDims.from_world(world))
    out = {name: train(mesh, "tiny-llama", case) for name, case in dp2_cases().items()}
    out["nan"] = nan_probe(mesh)
    out["resume"] = resume_probe(mesh, root, 2, BF16)
    return out


def _run_world8(rank, world, root):
    mesh = Mesh.build(ParallelDims.from_world(world, tp=2, pp=2))
    out = {name: train(mesh, "tiny-gpt2", case, sp=True) for name, case in world8_cases().items()}
    out["resume"] = resume_probe(mesh, root, 3, FP16)
    return out


_RUNS: dict[str, list] = {}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("fp32grads"))


@pytest.fixture(scope="module")
def dp2(root):
    return run_distributed(_run_dp2, 2, args=(root,), timeout=600)


@pytest.fixture(scope="module")
def world8(root):
    return run_distributed(_run_world8, 8, args=(root,), timeout=900)


LAYOUTS = ["dp2", pytest.param("world8", marks=pytest.mark.slow)]  # the launch a per-layout test reads: its fixture


def _rel(a: dict, b: dict) -> float:
    """||a - b|| / ||b|| over every tensor together."""
    num = sum((a[n] - b[n]).square().sum().item() for n in b)
    return (num / sum(t.square().sum().item() for t in b.values())) ** 0.5


# --- (a) accuracy ---------------------------------------------------------------------------------------------
def test_fp32_accumulation_keeps_bf16_training_closer_to_fp32(dp2):
    """dp 2, 32 micro-batches of one sequence per rank, one AdamW step (ACC_STEPS), ZeRO 0: the fp32 master weights
    of bf16 training with fp32 gradients are closer to the fp32 run's than bf16 accumulation's are.

    Weights, ||w - w_fp32|| / ||w_fp32 - w_0|| (relative to how far training moved them): measured 3.12e-2 with
    fp32 gradients, 3.37e-2 without, after the one step (after 2 and 3 steps, which the test ran until round 17:
    2.09e-2 against 2.24e-2, 1.66e-2 against 1.77e-2 -- the order and its margin, 7 % then 6 %, the same: more
    steps added cost, not power). The gain is small because most of the error is the bf16 forward and backward
    (every activation rounded at u = 2^-8), which both runs share, and AdamW's first steps are nearly sign(g)
    steps, blind to a gradient's relative error. The gradient AdamW receives on the first step (the same weights
    in all three runs) isolates the accumulation: ||g - g_fp32|| / ||g_fp32|| measured 4.55e-3 with fp32
    gradients against 6.75e-3 with 31 bf16 additions per rank and a bf16 DP sum (largest error per tensor,
    relative to its largest entry: 8.8e-3 against 1.7e-2). What fp32 accumulation leaves is the compute
    rounding, which test_zero bounds by GRAD_ROUNDINGS u = 0.36 of each tensor's largest entry."""
    for per_rank in dp2:
        ref, off, on = per_rank["acc-fp32"], per_rank["acc-off"], per_rank["acc-on"]
        moved = {n: ref["masters"][n] - ref["w0"][n] for n in ref["w0"]}
        err = {k: _rel({n: r["masters"][n] - ref["w0"][n] for n in moved}, moved) for k, r in (("on", on),
                                                                                              ("off", off))}
        assert err["on"] < err["off"], err
        g_ref = torch.cat(ref["first_grads"])
        g = {k: (torch.linalg.vector_norm(torch.cat(r["first_grads"]) - g_ref) / torch.linalg.vector_norm(g_ref)).item()
             for k, r in (("on", on), ("off", off))}
        assert g["on"] < g["off"], g
        for a, b in zip(on["first_grads"], ref["first_grads"]):
            assert (a - b).abs().max() <= GRAD_ROUNDINGS * U[BF16] * b.abs().max()


# --- (b) bit for bit across stages ----------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_stages_with_the_same_sums_are_bit_identical(layout, request):
    """Within each class (ONCE: stages 0, 1, 3 keeping layers gathered, 1 with the optimizer offloaded;
    PER_MICRO_BATCH: stages 2, 3, 3 with optimizer and parameters offloaded) every loss and every fp32 master
    weight is identical, at dp 2 and at tp2 x pp2 x dp2 (tied embedding and SP partial gradients on the fp32
    buffer). test_zero asserts the same of fp32 stages 0-1 against plain data parallelism."""
    results = request.getfixturevalue(layout)
    for cls in (ONCE, PER_MICRO_BATCH):
        present = [c for c in cls if c in results[0]]
        assert len(present) >= 2
        for rank, per_rank in enumerate(results):
            base = per_rank[present[0]]
            for case in present[1:]:
                got = per_rank[case]
                assert got["losses"] == base["losses"], f"{layout} {case} vs {present[0]} rank {rank}"
                for n, w in base["masters"].items():
                    assert torch.equal(got["masters"][n], w), f"{layout} {case} vs {present[0]} rank {rank}: {n}"


# --- (c) gradient memory --------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradients_take_4_bytes_a_parameter_of_the_shard(layout, request):
    """Between steps the gradient buffers (stages 0-1 the flat buffer, stages 2-3 the reduced shard) are fp32 and
    hold 4 Psi bytes (4 Psi / dp at stages 2-3), Psi counted on the model, up to the engine's padding; no .grad and
    no per-micro-batch buffer is left. Measured: dp 2, tiny-llama (Psi = 217,664, its config's count) 870,656
    bytes at stages 0-1 and 435,328 at stages 2-3, exactly twice the bf16 run's buffers (435,328 and 217,664);
    tp2 x pp2 x dp2, tiny-gpt2, first pipeline stage (Psi = 74,944 a rank) 299,776 and 149,888 bytes."""
    results = request.getfixturevalue(layout)
    dp = 2
    for case in [c for c in ("z0", "z1", "z2", "z3") if c in results[0]]:
        stage = int(case[1])
        for rank, per_rank in enumerate(results):
            got, model = per_rank[case], per_rank[case]["model"]
            n = dp if stage >= 2 else 1
            pad = padding_bound(zcfg(stage), model, dp)
            assert got["grads"]["dtypes"] == {torch.float32} and got["grads"]["leftover"] == 0
            assert 4 * model["psi"] // n <= got["grads"]["bytes"] <= 4 * (model["psi"] + pad) // n, (case, rank)
            if f"off-{case}" in per_rank:
                off = per_rank[f"off-{case}"]["grads"]
                assert off["dtypes"] == {torch.bfloat16} and got["grads"]["bytes"] == 2 * off["bytes"]
    assert request.getfixturevalue("dp2")[0]["z0"]["model"]["psi"] == load_config("tiny-llama").num_parameters


# --- (d) DP traffic ------------------------------------------------------------------------------------------
def test_dp_gradient_collectives_move_fp32(dp2):
    """The last step's DP ledger, dp 2: against Psi counted on the model, every gradient collective carries 4
    bytes an element -- 4 Psi per reduction (stage 0 all-reduce, stage 1 reduce-scatter, padded Psi' <= Psi +
    padding), m = 4 of them at stages 2-3; and exactly twice the bf16 run's bytes in as many calls (stages 0 and
    2), the parameter all-gathers unchanged (bf16 parameters). Measured: stage 0 all-reduce 870,656 bytes (bf16:
    435,328), stage 2 reduce-scatter 4 x 870,656 = 3,482,624 (bf16: 1,741,312), all-gather 435,328 both."""
    for per_rank in dp2:
        for stage in range(4):
            on = per_rank[f"z{stage}"]
            grads = "all_reduce@dp" if stage == 0 else "reduce_scatter@dp"
            if f"off-z{stage}" in per_rank:
                off = per_rank[f"off-z{stage}"]
                assert on["ledger"][grads]["bytes"] == 2 * off["ledger"][grads]["bytes"]
                assert on["ledger"][grads]["calls"] == off["ledger"][grads]["calls"]
                assert on["ledger"].get("all_gather@dp") == off["ledger"].get("all_gather@dp")
            psi, m = on["model"]["psi"], on["m"]
            reductions = m if stage >= 2 else 1
            pad = padding_bound(zcfg(stage), on["model"], 2)
            assert 4 * reductions * psi <= on["ledger"][grads]["bytes"] <= 4 * reductions * (psi + pad)


# --- fp16, clipping, NaN guard -------------------------------------------------------------------------------
def _tracks(got: dict, ref: dict, u: float, steps: int, lr: float) -> None:
    """test_zero's bound of low-precision training against fp32: loss within u relative per step; weights within
    the compute dtype's rounding u |w| plus half of the 2 lr per step that AdamW's sign noise can add."""
    for a, b in zip(got["losses"], ref["losses"]):
        assert abs(a - b) <= u * abs(b)
    for n, w in got["weights"].items():
        assert ((w - ref["weights"][n]).abs() - u * ref["weights"][n].abs()).max().item() <= steps * lr / 2, n


def test_fp16_with_fp32_gradients_tracks_fp32_and_skips_overflowing_steps(dp2):
    """fp16 + fp32 gradients, stage 1: no step overflows at scale 2^12, and the run tracks fp32 within fp16's
    bound (u = 2^-11). Stage 2 starting at 2^20 overflows (inf in the fp16 .grad stays inf in fp32): steps are
    skipped, the scale falls, the losses stay finite and fall."""
    for per_rank in dp2:
        got = per_rank["fp16-z1"]
        assert not any(r.skipped for r in got["reports"]) and got["reports"][-1].loss_scale == FP16_SCALE
        _tracks(got, per_rank["fp32"], U[FP16], STEPS, OPT.lr)
        over = per_rank["fp16-overflow-z2"]
        assert any(r.skipped for r in over["reports"]) and over["reports"][-1].loss_scale < 2.0**20
        assert all(torch.isfinite(torch.tensor(over["losses"]))) and over["losses"][-1] < over["losses"][0]


def test_clipping_sees_the_fp32_gradient_norm(dp2):
    """bf16 + fp32 gradients, stage 2, clip 0.5: the norm the step reports is the fp32 run's within the bf16
    compute bound (GRAD_ROUNDINGS u, relative), clipping is active (norm > 0.5) and the run tracks fp32 (clipped
    the same way) within bf16's bound."""
    for per_rank in dp2:
        got, ref = per_rank["clip-z2"], per_rank["fp32-clip"]
        for a, b in zip(got["reports"], ref["reports"]):
            assert b.grad_norm > CLIP.clip_grad
            assert abs(a.grad_norm - b.grad_norm) <= GRAD_ROUNDINGS * U[BF16] * b.grad_norm
        _tracks(got, ref, U[BF16], STEPS, CLIP.lr)


def test_nan_guard_skips_a_non_finite_fp32_gradient_on_every_rank(dp2):
    """The guard reads the reduced fp32 shards: the NaN step changes nothing on either rank (bit for bit), the
    others update, and the poisoned parameter is named."""
    for rank, per_rank in enumerate(dp2):
        probe = per_rank["nan"]
        assert probe["changed"] == [True, False, True] and probe["skipped"] == [1], (rank, probe["changed"])
    # the DP sum carries the NaN to the rank(s) owning the poisoned parameter's shard
    assert any(f"non-finite gradient of {r['nan']['first']}" in r["nan"]["log"] for r in dp2)
    assert "iteration 1: skipped the step on every rank" in dp2[0]["nan"]["log"]


# --- (e) checkpoints -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_checkpoint_saved_with_fp32_gradients_resumes_bit_exactly(layout, request):
    """dp 2 stage 2 bf16, and tp2 x pp2 x dp2 stage 3 fp16 (the loss scaler too): losses, parameters, fp32
    master weights and Adam moments after resuming equal the uninterrupted run's (torch.equal)."""
    for rank, per_rank in enumerate(request.getfixturevalue(layout)):
        (l1, s1), (l2, s2) = per_rank["resume"]["straight"], per_rank["resume"]["resumed"]
        assert l1 == l2, (layout, rank)
        assert s1.keys() == s2.keys()
        for name, kinds in s1.items():
            for kind, t in kinds.items():
                assert torch.equal(t, s2[name][kind]), (layout, rank, name, kind)
