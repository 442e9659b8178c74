"""Expert parallelism composed with TP + SP, PP (1F1B, interleaved), ZeRO 0 / 1 / 2 / 3 and recomputation, on 8 gloo
ranks, against the unsharded transformers model -- one spawn computes every case, each test checks one.

For every case, with the load-balancing loss on (Megatron's per-layer aux_loss):

* gradients of one step (ZeRO 0: the summed gradients stay in p.grad) = transformers' gradients of the mean over
  the global batch's micro-batches of (LM loss + coeff / k x transformers' load_balancing_loss_func of each layer),
  every parameter, every expert (each rank compares the experts it holds; together they hold all of them);
* weights after STEPS AdamW steps at the case's ZeRO stage = transformers' model trained with torch's AdamW on the
  same micro-batches and loss.

Bound. fp32; RTOL = 1e-5 relative to each tensor's largest entry, as tests/test_zero.py, for the same reason: the
parallel run sums gradients in another order (~1e-7 relative), and AdamW with eps = 1e-5 (lr 5e-4) moves a
weight by at most lr x 1e-9 / 1e-5 per step for that noise.

The ledger: the alltoall dispatcher's bytes equal 2 N k h b (EP - 1) / EP forward and the same backward for a
routing that sends N k / EP slots to every EP rank, and in general the rows it actually routes off-rank."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from hybrid.mesh import Mesh, ParallelDims
from hybrid.moe.config import Dispatcher, MoEConfig
from hybrid.moe.layer import ExpertContext
from hybrid.moe.parallel import ExpertLayout, build_mesh
from hybrid.moe.router import Routing
from hybrid.moe.runtime import set_aux_grad_scale
from hybrid.pipeline import ScheduleKind, build_schedule
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.testing import run_distributed
from hybrid.tp import TPContext
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from models import Recompute, build_pipeline_chunks, from_hf
from models.hf_io import export_hf_state_dict, load_hf_checkpoint
from moe_reference import hf_config, hf_layer_aux, hf_model, per_expert, rel, save
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)

WORLD, GLOBAL, SEQ, STEPS = 8, 8, 16, 2
RTOL = 1e-5
COEFF = 0.1
OPT = OptimizerConfig(lr=5e-4, eps=1e-5, weight_decay=0.01, decay_style="constant", clip_grad=0.0)

# name: (model, tp, pp, v, ep, zero stage, dispatcher, micro batch, recompute)
CASES = {
    "mixtral-ep1-dp8-zero1": ("mixtral", 1, 1, 1, 1, 1, "alltoall", 1, "none"),
    "mixtral-ep2-tp2sp-dp4-zero3-recompute": ("mixtral", 2, 1, 1, 2, 3, "alltoall", 1, "full"),
    "mixtral-ep4-tp2sp-pp2-dp2-zero1": ("mixtral", 2, 2, 1, 4, 1, "alltoall", 1, "none"),
    "mixtral-ep4-tp2sp-dp4-zero2": ("mixtral", 2, 1, 1, 4, 2, "alltoall", 1, "none"),
    "mixtral-ep4-pp2-interleaved-dp4-zero3-allgather": ("mixtral", 1, 2, 2, 4, 3, "allgather", 1, "none"),
    "qwen2moe-ep2-tp2sp-pp2-dp2-zero3": ("qwen2_moe", 2, 2, 1, 2, 3, "alltoall", 2, "selective"),
}
LAYERS = 4


def global_batch():
    ids = torch.randint(0, 64, (GLOBAL, SEQ + 1), generator=torch.Generator().manual_seed(3))
    return ids[:, :-1], ids[:, 1:]


def micro_batches(dp_rank, dp, mb):
    """This DP rank's rows of the global batch, in micro-batches of `mb` (the reference walks all of them)."""
    x, y = global_batch()
    rows = GLOBAL // dp
    x, y = x[dp_rank * rows:(dp_rank + 1) * rows], y[dp_rank * rows:(dp_rank + 1) * rows]
    return [(x[i:i + mb], y[i:i + mb]) for i in range(0, rows, mb)]


# --- the ranks --------------------------------------------------------------------------------------------
def _build(case, cfg, path, world, zero):
    """`cfg`: the case's model, made from transformers' config in the test process (`results`): the ranks never
    import transformers (~1.7 s of CPU each, 8 ranks)."""
    kind, tp, pp, v, ep, _, dispatcher, mb, recompute = CASES[case]
    dims = ParallelDims.from_world(world, tp=tp, pp=pp)
    mesh = build_mesh(dims, ep)
    moe = ExpertContext(MoEConfig(expert_parallel=ep, aux_loss_coeff=COEFF, dispatcher=Dispatcher(dispatcher)), mesh.ep)
    chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp, sequence_parallel=tp > 1), mesh.coords.pp, pp, v, seed=None,
                                   recompute=Recompute(recompute), moe=moe)
    for chunk in chunks:
        load_hf_checkpoint(chunk, path, mesh.tp.rank)
    batches = micro_batches(mesh.coords.dp, dims.dp, mb)
    if pp == 1 and v == 1:
        runner = LocalForwardBackward(chunks[0], mesh.device)
    else:
        kind_s = ScheduleKind.INTERLEAVED if v > 1 else ScheduleKind.ONE_F_ONE_B
        schedule = build_schedule(kind_s, pp, len(batches), v)[mesh.coords.pp]
        seq = SEQ // tp
        runner = PipelineExecutor(chunks, schedule, mesh.pp, StageIO((mb, seq, cfg.hidden_size)), mesh.device)
    opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=zero), OPT)
    return mesh, chunks, runner, opt, batches


def _export(chunks, mesh, grads: bool) -> dict[str, torch.Tensor]:
    out = {}
    for chunk in chunks:
        out.update(export_hf_state_dict(chunk, mesh.tp, grads=grads))
    return out


def _case(case, cfg, path, world):
    # one step's gradients, ZeRO 0: p.grad holds the gradients summed over DP (experts: over expert-DP)
    mesh, chunks, runner, opt, batches = _build(case, cfg, path, world, zero=0)
    opt.zero_grad()
    opt.begin_step(len(batches))
    set_aux_grad_scale(chunks, 1.0 / len(batches))
    runner.forward_backward(batches)
    opt.finish_backward(chunks, mesh)
    grads = {k: g / mesh.dims.dp for k, g in _export(chunks, mesh, grads=True).items()}
    # STEPS training steps at the case's ZeRO stage, through train_step
    zero = CASES[case][5]
    mesh, chunks, runner, opt, batches = _build(case, cfg, path, world, zero)
    losses = [train_step(chunks, batches, opt, mesh, runner=runner) for _ in range(STEPS)]
    with opt.gathered():  # stage 3 frees the gathered buffers at the exit: copy inside
        weights = {k: t.clone() for k, t in _export(chunks, mesh, grads=False).items()}
    return {"grads": grads, "weights": weights, "losses": losses}


def _all(rank, world, cfgs, paths):
    return {case: _case(case, cfgs[CASES[case][0]], paths[CASES[case][0]], world) for case in CASES}


# --- the reference: transformers, one process ---------------------------------------------------------------
def reference_loss(hf, kind, mb):
    """Mean over every micro-batch of the global batch of LM loss + coeff / k x per-layer balancing loss."""
    k = hf.config.num_experts_per_tok
    E = getattr(hf.config, "num_local_experts", None) or hf.config.num_experts
    batches = micro_batches(0, 1, mb)
    total = 0.0
    for x, y in batches:
        out = hf(x, output_router_logits=True)
        lm = F.cross_entropy(out.logits.flatten(0, 1), y.flatten())
        total = total + lm + COEFF / k * hf_layer_aux(out.router_logits, E, k)
    return total / len(batches)


def reference(kind, mb):
    hf = hf_model(kind, LAYERS)
    reference_loss(hf, kind, mb).backward()
    grads = {k: g.clone() for k, g in per_expert(hf, kind).items()}
    hf = hf_model(kind, LAYERS)
    decay = [p for p in hf.parameters() if p.dim() >= 2]
    other = [p for p in hf.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPT.weight_decay}, {"params": other, "weight_decay": 0.0}],
                            lr=OPT.lr, betas=(OPT.beta1, OPT.beta2), eps=OPT.eps)
    for _ in range(STEPS):
        opt.zero_grad()
        reference_loss(hf, kind, mb).backward()
        opt.step()
    return grads, {k: w.clone() for k, w in per_expert(hf, kind, grads=False).items()}


@pytest.fixture(scope="module")
def results():
    kinds = ("mixtral", "qwen2_moe")
    paths = {kind: save(hf_model(kind, LAYERS)) for kind in kinds}
    # without the transformers config object it was read from: unpickling one imports transformers in every rank
    cfgs = {kind: dataclasses.replace(from_hf(hf_config(kind, LAYERS)), hf_config=None) for kind in kinds}
    per_rank = run_distributed(_all, WORLD, args=(cfgs, paths), timeout=1500)
    refs = {}
    out = {}
    for case, spec in CASES.items():
        key = (spec[0], spec[7])
        if key not in refs:
            refs[key] = reference(*key)
        out[case] = (refs[key], [r[case] for r in per_rank])
    return out


def _check(ref: dict, ranks: list[dict], what: str) -> tuple[float, set]:
    worst, seen = 0.0, set()
    for r in ranks:
        for key, t in r[what].items():
            worst = max(worst, rel(t, ref[key]))
            seen.add(key)
    return worst, seen


@pytest.mark.parametrize("case", list(CASES))
def test_gradients_equal_transformers(results, case):
    (ref_grads, _), ranks = results[case]
    worst, seen = _check(ref_grads, ranks, "grads")
    assert seen == set(ref_grads), f"not every tensor was compared: missing {sorted(set(ref_grads) - seen)[:4]}"
    assert worst < RTOL, worst


@pytest.mark.parametrize("case", list(CASES))
def test_weights_after_training_equal_transformers(results, case):
    (_, ref_weights), ranks = results[case]
    worst, seen = _check(ref_weights, ranks, "weights")
    assert seen == set(ref_weights)
    assert worst < RTOL, worst


# --- the dispatch's bytes -----------------------------------------------------------------------------------
N, H, K = 16, 8, 2


def _ledger(rank, world):
    from hybrid.moe.layer import MoELayer
    from models.activations import activation
    from models.config import ModelConfig
    cfg = ModelConfig(arch="llama", vocab_size=16, hidden_size=H, num_layers=1, num_heads=2, num_kv_heads=2,
                      head_dim=4, ffn_hidden_size=8, max_position_embeddings=16, norm_eps=1e-5, tie_embeddings=False,
                      qkv_bias=False, mlp_bias=False, out_bias=False, activation="silu", num_experts=world,
                      moe_top_k=K, moe_ffn_hidden_size=4, moe_layers=(0,), model_type="mixtral")
    mesh = build_mesh(ParallelDims.from_world(world), world)
    layer = MoELayer(cfg, TPContext(mesh.tp), ExpertContext(MoEConfig(expert_parallel=world), mesh.ep), activation("silu"))
    x = torch.randn(N, H, requires_grad=True)
    out = {}
    for name, experts in (("uniform", torch.stack([(torch.arange(N) + rank) % world,
                                                   (torch.arange(N) + rank + 1) % world], 1)),
                          ("skewed", torch.stack([torch.zeros(N, dtype=torch.long), torch.arange(N) % (world - 1) + 1], 1)),
                          ("idle", torch.stack([torch.zeros(N, dtype=torch.long), torch.ones(N, dtype=torch.long)], 1))):
        mesh.ledger.reset()
        probs = torch.full((N, K), 0.5, requires_grad=True)
        r = Routing(logits=torch.zeros(N, world), scores=torch.zeros(N, world), experts=experts, probs=probs)
        layer._alltoall(x, r, None, None).sum().backward()
        off_rank = int((experts != rank).sum())  # slots this rank sends away (1 expert per rank)
        received = [None] * world
        torch.distributed.all_gather_object(received, experts.tolist())
        back = sum(1 for s in range(world) if s != rank for row in received[s] for e in row if e == rank)
        out[name] = (mesh.ledger.bytes("all_to_all_v", "ep"), off_rank, back, mesh.ledger.calls("all_to_all_v", "ep"),
                     mesh.ledger.bytes("all_to_all_v", "ep:counts"))
    return out


@pytest.fixture(scope="module")
def ledgers():
    return run_distributed(_ledger, 4, timeout=300)


def test_alltoall_bytes_equal_the_formula(ledgers):
    """2 N k h b (EP - 1) / EP forward (dispatch + combine), the same backward, when every EP rank gets N k / EP
    slots from every rank; counts exchanged first: E_l x 8 bytes to each other rank, once each way."""
    ep, b = 4, 4
    for r in ledgers:
        nbytes, _, _, calls, count_bytes = r["uniform"]
        assert nbytes == 2 * 2 * N * K * H * b * (ep - 1) // ep
        assert calls == 4  # dispatch, combine; their two backwards
        assert count_bytes == (ep - 1) * 8  # one int64 count per local expert to each other rank, forward only


def test_alltoall_bytes_are_the_rows_routed_off_rank(ledgers):
    """Any routing: forward + backward = 2 x (rows sent to other ranks + rows returned to them) x h x b."""
    for r in ledgers:
        for case in ("skewed", "idle"):  # idle: ranks 2 and 3 receive no row at all (empty all-to-alls)
            nbytes, off_rank, back, _, _ = r[case]
            assert nbytes == 2 * (off_rank + back) * H * 4


def test_expert_layout_folds_the_stage_ranks():
    """tp 2 x pp 2 x dp 2 with EP 4: each stage's 4 ranks are one EP group (experts 0, 1 / 2, 3 / ...), expert-DP 1;
    EP 2: the EP groups are the TP pairs, expert-DP pairs across DP."""
    dims = ParallelDims.from_world(8, tp=2, pp=2)
    lay = ExpertLayout(dims, ep=4)
    from hybrid.moe.parallel import ExpertAxis
    assert lay.group_ranks(ExpertAxis.EP) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert lay.edp == 1 and [list(lay.experts_of(lay.coords(r).ep, 8)) for r in (0, 3, 5)] == [[0, 1], [6, 7], [2, 3]]
    lay = ExpertLayout(dims, ep=2)
    assert lay.group_ranks(ExpertAxis.EP) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert lay.group_ranks(ExpertAxis.EDP) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    with pytest.raises(ValueError, match="--expert-model-parallel-size 8 x --expert-tensor-parallel-size 1 must divide"):
        ExpertLayout(dims, ep=8)
    lay = ExpertLayout(dims, ep=2, etp=2)  # expert-TP innermost: the TP pairs split each expert's width
    assert lay.group_ranks(ExpertAxis.ETP) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert lay.group_ranks(ExpertAxis.EP) == [[0, 2], [1, 3], [4, 6], [5, 7]] and lay.edp == 1
    assert [list(lay.expert_columns(lay.coords(r).etp, 48)) for r in (0, 1)] == [list(range(24)), list(range(24, 48))]
    with pytest.raises(ValueError, match="--expert-tensor-parallel-size 2 does not divide the experts' width 5"):
        lay.check_experts(4, 5)
    with pytest.raises(ValueError, match="does not divide the model's 6 experts"):
        ExpertLayout(dims, ep=4).check_experts(6)
