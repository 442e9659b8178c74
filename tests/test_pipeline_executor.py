"""The pipeline executor against the single-process model with gradient accumulation.

* pp in {2, 4}, m in {1, pp, 2pp + 1}, GPipe and 1F1B (interleaved, v = 2: m in {pp, 2pp}, since it
  needs m % pp == 0): the loss and every gradient within 1e-5 relative (fp32), for GPT-2 (tied
  embeddings: the two copies' gradients summed over the embedding group) and Llama (GQA, untied).
* The zero-bubble schedules the same way, against the same single process, not only against 1F1B: ZB-H1 (v = 1)
  and ZBV (two chunks a rank in a V: rank 0 holds the first and the last stage, so GPT-2's two embedding copies
  sit on one rank) for pp in {2, 4}, m in {1, pp, 2pp + 1}.
* tp 2 x pp 2 x dp 2 on 8 ranks: 5 training steps give the same losses and weights as one process, under 1F1B,
  ZB-H1 and ZBV (tests/test_pipeline_zb_training.py adds: ZB equals 1F1B bit for bit under ZeRO 1 and 3).

Launches: one 4-rank launch runs every schedule case, one 8-rank launch every training case (hybrid.testing's
each_case: a case that fails is its own test's failure). The ranks do not import transformers: the configs are
made here, in the test process, and passed in, as are the single-process references, each (model, m) computed once.
"""

from __future__ import annotations

import dataclasses
import functools
import pickle

import pytest
import torch
from hybrid import testing
from hybrid.comm import Group
from hybrid.dp import GradAverager
from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.mesh import Mesh, ParallelDims
from hybrid.pipeline import ScheduleKind, build_schedule
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.testing import run_distributed
from hybrid.tp import TPContext, gather_full, spec_of
from hybrid.train_step import sync_tied_embeddings, train_step
from models import build_model, build_pipeline_chunks, from_hf, load_config, shift_labels
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)

RTOL, ATOL = 1e-5, 1e-7
MB, SEQ, H = 2, 16, 32


def configs():
    """The two models (from transformers' configs: imported here, in the test process, not in the ranks)."""
    from transformers import GPT2Config, LlamaConfig
    cfgs = {
        "gpt2": from_hf(GPT2Config(n_layer=8, n_embd=H, n_head=4, vocab_size=256, n_positions=64, resid_pdrop=0.0,
                                   embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)),
        "llama": from_hf(LlamaConfig(num_hidden_layers=8, hidden_size=H, num_attention_heads=4, num_key_value_heads=2,
                                     intermediate_size=64, vocab_size=256, max_position_embeddings=64)),
    }
    # without the transformers config object they were read from: unpickling one imports transformers in the rank
    return {name: dataclasses.replace(cfg, hf_config=None) for name, cfg in cfgs.items()}


def _cases():
    out = []
    for name in ("gpt2", "llama"):
        for pp in (2, 4):
            out += [(name, kind, pp, m, 1) for kind in (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B)
                    for m in (1, pp, 2 * pp + 1)]
            out += [(name, ScheduleKind.INTERLEAVED, pp, m, 2) for m in (pp, 2 * pp)]
            out += [(name, ScheduleKind.ZB_H1, pp, m, 1) for m in (1, pp, 2 * pp + 1)]
            out += [(name, ScheduleKind.ZBV, pp, m, 2) for m in (1, pp, 2 * pp + 1)]
    return out


CASES = _cases()


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


def _batches(m):
    gen = torch.Generator().manual_seed(m)
    ids = [torch.randint(0, 256, (MB, SEQ), generator=gen) for _ in range(m)]
    return [(x, shift_labels(x)) for x in ids]


def _chunks(cfg, tp: TPContext, mesh: Mesh, kind: ScheduleKind, v: int, seed: int):
    """This rank's chunks, at the global stages the schedule's placement gives them (ZBV: r and 2 pp - 1 - r)."""
    pp, rank = mesh.dims.pp, mesh.coords.pp
    stage_ids = [kind.placement.stage(rank, c, pp) for c in range(v)]
    return build_pipeline_chunks(cfg, tp, rank, pp, v, seed=seed, stage_ids=stage_ids)


def _reference(cfg, batches):
    model = build_model(cfg, TPContext(Group.solo("tp")), seed=5)
    loss = sum(model(x, y) / len(batches) for x, y in batches)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


_MESHES: dict[tuple, Mesh] = {}  # this rank's meshes, one a layout, shared by the launch's cases


def _mesh(world: int, **sizes) -> Mesh:
    """One mesh a layout for all the cases of a launch, as one train.py run keeps one mesh for all its steps: a
    launch builds one or two, not one a case (Mesh.build calls new_group for every group of every axis, each call a
    store barrier of the whole world)."""
    key = (world, *sorted(sizes.items()))
    if key not in _MESHES:
        _MESHES[key] = Mesh.build(ParallelDims.from_world(world, **sizes))
    return _MESHES[key]


def _run_case(world, cfgs, refs, name, kind, pp, m, v):
    """`refs`: the single-process references by (model, m), computed once in the test process (references)."""
    cfg = cfgs[name]
    mesh = _mesh(world, pp=pp)
    chunks = _chunks(cfg, TPContext(mesh.tp), mesh, kind, v, seed=5)
    schedule = build_schedule(kind, pp, m, v)[mesh.coords.pp]
    batches = _batches(m)
    loss = PipelineExecutor(chunks, schedule, mesh.pp, StageIO((MB, SEQ, H)), mesh.device,
                            placement=kind.placement).forward_backward(batches)
    sync_tied_embeddings(chunks, mesh)
    ref_loss, ref_grads = refs[name, m]
    grads = [rel(p.grad, ref_grads[n]) for c in chunks for n, p in c.named_parameters()]
    has_loss = kind.placement.rank_chunk(pp * v - 1, pp)[0] == mesh.coords.pp  # rank 0 under ZBV
    return {"loss": abs(loss.item() - ref_loss) / ref_loss if has_loss else 0.0, "grads": max(grads),
            "n_params": sum(1 for c in chunks for _ in c.parameters())}


def _all_cases(rank, world, cfgs, refs: bytes):
    return testing.each_case(_run_case, CASES, world, cfgs, pickle.loads(refs))


def references(cfgs) -> dict:
    """(model, m) -> the single-process loss and gradients, once for the module (each of the 4 ranks computed every
    one of them before: ~45% of their work). One thread, as each rank runs (one_thread_module)."""
    return {(name, m): _reference(cfgs[name], _batches(m)) for name, m in sorted({(c[0], c[3]) for c in CASES})}


@pytest.fixture(scope="module")
def results():
    cfgs = configs()
    # plain pickle: tensors travel as bytes, not as one shared-memory fd each (the forkserver passes at most 256)
    return run_distributed(_all_cases, 4, args=(cfgs, pickle.dumps(references(cfgs))), timeout=600)


@pytest.mark.parametrize("case", CASES, ids=[f"{n}-{k.value}-pp{p}-m{m}-v{v}" for n, k, p, m, v in CASES])
def test_pipeline_loss_and_gradients_match_single_process(results, case):
    for r, got in enumerate(testing.case_result(results, case)):
        assert got["n_params"] > 0
        assert got["loss"] <= RTOL, f"rank {r}: loss rel err {got['loss']:.2e}"
        assert got["grads"] <= RTOL, f"rank {r}: worst gradient rel err {got['grads']:.2e}"


# --- tp 2 x pp 2 x dp 2: training ------------------------------------------------------------
STEPS, GLOBAL, MICRO, TSEQ = 5, 8, 2, 32


def _train(mesh: Mesh, model_name: str, sp: bool = False, kind: ScheduleKind = ScheduleKind.ONE_F_ONE_B):
    cfg = load_config(model_name)
    tp = TPContext(mesh.tp, sequence_parallel=sp)
    pp, v = mesh.dims.pp, 2 if kind is ScheduleKind.ZBV else 1
    chunks = _chunks(cfg, tp, mesh, kind, v, seed=11)
    spec = BatchSpec(GLOBAL, MICRO, TSEQ, mesh.dims.dp)
    schedule = build_schedule(kind, pp, spec.num_micro_batches, v)[mesh.coords.pp]
    seq = TSEQ // mesh.dims.tp if sp else TSEQ  # under SP a stage boundary carries T/t tokens
    runner = PipelineExecutor(chunks, schedule, mesh.pp, StageIO((MICRO, seq, cfg.hidden_size)), mesh.device,
                              placement=kind.placement)
    # why SGD: see test_training.py. lr 0.05 keeps training smooth (loss 5.56 -> 4.37); at 0.1 rounding
    # differences grow ~10x per step (chaotic regime), at 0.05 they stay ~3e-7 after 5 steps.
    opt = torch.optim.SGD(chunks.parameters(), lr=0.05, momentum=0.9)
    averager = GradAverager(chunks.parameters(), mesh.dp)
    corpus = load_corpus()
    losses = [train_step(chunks, micro_batches(corpus, spec, 3, it, mesh.coords.dp), opt, mesh, averager,
                         runner=runner) for it in range(STEPS)]
    weights = {n: gather_full(p.detach(), spec_of(p), mesh.tp) for c in chunks for n, p in c.named_parameters()}
    return losses, weights


def _composed(world, model_name, sp, kind):
    return _train(_mesh(world, tp=2, pp=2), model_name, sp, kind)


COMPOSED = [("tiny-gpt2", False, ScheduleKind.ONE_F_ONE_B), ("tiny-llama", False, ScheduleKind.ONE_F_ONE_B),
            ("tiny-llama", True, ScheduleKind.ONE_F_ONE_B),
            ("tiny-gpt2", False, ScheduleKind.ZBV), ("tiny-llama", True, ScheduleKind.ZB_H1)]


def _all_composed(rank, world):
    return testing.each_case(_composed, COMPOSED, world)


@pytest.fixture(scope="module")
def composed():
    """Every training case in one 8-rank launch."""
    return run_distributed(_all_composed, 8, timeout=1200)


@functools.lru_cache(maxsize=None)
def _single_process(model_name):
    """The single-process run a model's cases compare with (1F1B, no SP: one process has neither), at one intra-op
    thread (one_thread_module; until round 18 at torch's default, ~3 s of CPU a model against 0.16 s: OpenMP
    workers spinning on the suite's shared cores), within RTOL as before."""
    return _train(Mesh.single(), model_name)


@pytest.mark.parametrize("model_name,sp,kind", COMPOSED, ids=["gpt2", "llama", "llama-sp", "gpt2-zbv", "llama-sp-zbh1"])
@pytest.mark.slow  # 8 ranks end to end; the fast tier keeps tp2 x pp2 x dp2 training against one process in
# tests/test_zero.py (plain and ZeRO, with SP), every schedule's gradients above and ZB training in
# tests/test_pipeline_zb_training.py
def test_tp2_pp2_dp2_training_matches_single_process(composed, model_name, sp, kind):
    """tiny-gpt2 / tiny-llama have 4 layers: ZBV's 2 pp = 4 stages of one layer each."""
    ref_losses, ref_weights = _single_process(model_name)
    results = testing.case_result(composed, (model_name, sp, kind))
    seen = set()
    for losses, weights in results:
        assert losses == pytest.approx(ref_losses, rel=RTOL)
        for name, w in weights.items():
            ref = ref_weights[name]
            err = (w - ref).abs().max().item()
            assert err <= RTOL * ref.abs().max().item() + ATOL, f"{name}: abs err {err:.2e}"
            seen.add(name)
    assert seen == set(ref_weights), "every parameter lives on some rank"
    assert ref_losses[-1] < ref_losses[0]
