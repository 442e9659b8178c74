"""Expert-tensor parallelism (--expert-tensor-parallel-size 2, Megatron's parallel folding EP x expert-TP x
expert-DP) against the unsharded transformers model; one launch per layout, several checks each.

4 ranks (tp 1: each stage's 4 ranks = expert-tp 2 x ep 2 x expert-dp 1), tiny Mixtral and Qwen2-MoE:

* logits of each rank's micro-batch and the LM loss of the first step = transformers';
* every gradient of one step (ZeRO 0; every expert's slices, gathered over expert-TP) = transformers' gradients of
  the mean over the global batch of (LM loss + coeff / k x each layer's load_balancing_loss_func);
* weights after STEPS AdamW steps (Mixtral at ZeRO 1, Qwen2-MoE at ZeRO 3, expert parameters sharded over their
  expert-DP group) = transformers trained with torch's AdamW;
* the ledger, on one MoE layer with a routing that sends every EP rank N k / EP slots: the expert-TP all-gather-v
  and reduce-scatter-v move (ETP - 1) N k h b bytes each, forward, and the same backward (module docstring of
  hybrid/moe/comm.py), the EP all-to-all 2 N k h b (EP - 1) / EP each way as without expert-TP;
* checkpoints: trained at A = ep 2 x etp 2 (ZeRO 1), saved, loaded at B = ep 4 x etp 1 (ZeRO 3), saved, loaded at
  C = ep 1 x etp 4 (ZeRO 2), saved, loaded at D = ep 1 x etp 2 x expert-dp 2 (ZeRO 1: expert shards sharded over
  expert-DP), saved: every tensor of B, C and D (master weights, both Adam moments) equals A's bit for bit, and
  every expert is stored exactly once at each.

8 ranks (tp 2 with sequence parallelism, ep 2 x etp 2 x expert-dp 2): gradients, and weights after STEPS at ZeRO 1
and at ZeRO 3 (expert slices sharded over expert-DP 2), against transformers, Qwen2-MoE (shared expert +
fine-grained experts).

Bound. fp32; RTOL = 1e-5 relative to each tensor's largest entry, as tests/test_moe_parallel.py (the derivation
is there: the parallel run sums in another order, ~1e-7 relative; AdamW's eps keeps that noise below 1e-5).
Expert-TP adds one more reordering of sums (the partial down-projections, summed over 2 ranks)."""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F

from hybrid.checkpoint import core
from hybrid.mesh import ParallelDims
from hybrid.moe.config import MoEConfig
from hybrid.moe.layer import ExpertContext
from hybrid.moe.parallel import build_mesh
from hybrid.moe.router import Routing
from hybrid.moe.runtime import set_aux_grad_scale
from hybrid.testing import run_distributed
from hybrid.tp import TPContext
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from models import build_pipeline_chunks, from_hf
from models.hf_io import export_hf_state_dict, load_hf_checkpoint
from moe_reference import hf_config, hf_layer_aux, hf_model, per_expert, rel, save
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)

pytestmark = pytest.mark.slow

GLOBAL, SEQ, STEPS, LAYERS = 8, 16, 2, 2
RTOL = 1e-5
COEFF = 0.1
OPT = OptimizerConfig(lr=5e-4, eps=1e-5, weight_decay=0.01, decay_style="constant", clip_grad=0.0)
# 4 ranks: (model, tp, ep, etp, ZeRO stage of the training run)
CASES4 = {"mixtral-ep2-etp2-zero1": ("mixtral", 1, 2, 2, 1), "qwen2moe-ep2-etp2-zero3": ("qwen2_moe", 1, 2, 2, 3)}
CASES8 = {"qwen2moe-tp2sp-ep2-etp2-edp2-zero1": ("qwen2_moe", 2, 2, 2, 1),
          "qwen2moe-tp2sp-ep2-etp2-edp2-zero3": ("qwen2_moe", 2, 2, 2, 3)}
# checkpoint chain (4 ranks, Mixtral): (ep, etp, ZeRO stage); A is the training run of CASES4's Mixtral case
CHAIN = {"A-ep2-etp2-zero1": (2, 2, 1), "B-ep4-etp1-zero3": (4, 1, 3), "C-ep1-etp4-zero2": (1, 4, 2),
         "D-ep1-etp2-edp2-zero1": (1, 2, 1)}


def global_batch():
    ids = torch.randint(0, 64, (GLOBAL, SEQ + 1), generator=torch.Generator().manual_seed(3))
    return ids[:, :-1], ids[:, 1:]


def micro_batches(dp_rank, dp):
    """This DP rank's rows of the global batch, one sequence per micro-batch."""
    x, y = global_batch()
    rows = GLOBAL // dp
    return [(x[i:i + 1], y[i:i + 1]) for i in range(dp_rank * rows, (dp_rank + 1) * rows)]


# --- the ranks --------------------------------------------------------------------------------------------
def model_config(kind):
    """Made in the test process and passed to the ranks without the transformers config it was read from
    (unpickling one would import transformers in every rank, ~2 s of CPU each)."""
    return dataclasses.replace(from_hf(hf_config(kind, LAYERS)), hf_config=None)


def _build(cfg, path, world, tp, ep, etp, zero):
    mesh = build_mesh(ParallelDims.from_world(world, tp=tp), ep, etp)
    moe = ExpertContext(MoEConfig(expert_parallel=ep, expert_tensor_parallel=etp, aux_loss_coeff=COEFF),
                        mesh.ep, mesh.etp)
    chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp, sequence_parallel=tp > 1), 0, 1, seed=None, moe=moe)
    load_hf_checkpoint(chunks[0], path, mesh.tp.rank)
    opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=zero), OPT)
    return mesh, chunks, LocalForwardBackward(chunks[0], mesh.device), opt, micro_batches(mesh.coords.dp, mesh.dims.dp)


def _export(chunks, mesh, grads: bool) -> dict[str, torch.Tensor]:
    return export_hf_state_dict(chunks[0], mesh.tp, grads=grads, expert_tp=mesh.etp)


def _case(cfg, path, world, tp, ep, etp, zero, logits=False, grads=None):
    """One step's gradients (ZeRO 0; `grads` when already computed), then STEPS steps at `zero`: (results, the
    trained run)."""
    if grads is not None:
        return _train(cfg, path, world, tp, ep, etp, zero, {"grads": grads})
    mesh, chunks, runner, opt, batches = _build(cfg, path, world, tp, ep, etp, 0)
    out = {}
    if logits:
        with torch.no_grad():
            chunks[0].eval()
            out["logits"] = [chunks[0](x) for x, _ in batches]
    opt.zero_grad()
    opt.begin_step(len(batches))
    set_aux_grad_scale(chunks, 1.0 / len(batches))
    chunks[0].train()
    runner.forward_backward(batches)
    opt.finish_backward(chunks, mesh)
    out["grads"] = {k: g / mesh.dims.dp for k, g in _export(chunks, mesh, grads=True).items()}
    return _train(cfg, path, world, tp, ep, etp, zero, out)


def _train(cfg, path, world, tp, ep, etp, zero, out):
    mesh, chunks, runner, opt, batches = _build(cfg, path, world, tp, ep, etp, zero)
    out["losses"] = [train_step(chunks, batches, opt, mesh, runner=runner) for _ in range(STEPS)]
    with opt.gathered():  # stage 3 frees the gathered buffers at the exit: copy inside
        out["weights"] = {k: t.clone() for k, t in _export(chunks, mesh, grads=False).items()}
    out["dp_rank"] = mesh.coords.dp
    return out, (mesh, chunks, opt)


def _state(mesh, opt):
    d = mesh.dims
    return {"iteration": STEPS, "consumed_samples": STEPS * GLOBAL, "model": "tiny-mixtral",
            "layout": {"tp": d.tp, "pp": d.pp, "dp": d.dp, "zero": opt.cfg.stage}}


def _owners(mesh, chunks, opt):
    return core.statefuls(opt, core.param_names(chunks), None, rng_too=False)


def _chain(first, root, world, path, cfg):
    """Save A (the trained Mixtral run), load it at B, save, load B's at C, save: the three directories."""
    dirs = {}
    name = list(CHAIN)[0]
    dirs[name] = os.path.join(root, name)
    core.save_state(_owners(*first), dirs[name], STEPS, _state(first[0], first[2])).finish()
    prev = name
    for name, (ep, etp, zero) in list(CHAIN.items())[1:]:
        run = _build(cfg, path, world, 1, ep, etp, zero)
        owners = _owners(run[0], run[1], run[3])
        core.load_state(owners, os.path.join(dirs[prev], f"iter_{STEPS:07d}"))
        dirs[name] = os.path.join(root, name)
        core.save_state(owners, dirs[name], STEPS, _state(run[0], run[3])).finish()
        prev = name
    return {k: os.path.join(d, f"iter_{STEPS:07d}") for k, d in dirs.items()}


N, H, K = 16, 8, 2


def _ledger(world, ep, etp):
    """Bytes of one MoE layer's forward + backward on a routing sending N k / EP slots to every EP rank."""
    from hybrid.moe.layer import MoELayer
    from models.activations import activation
    from models.config import ModelConfig
    cfg = ModelConfig(arch="llama", vocab_size=16, hidden_size=H, num_layers=1, num_heads=2, num_kv_heads=2,
                      head_dim=4, ffn_hidden_size=8, max_position_embeddings=16, norm_eps=1e-5, tie_embeddings=False,
                      qkv_bias=False, mlp_bias=False, out_bias=False, activation="silu", num_experts=ep,
                      moe_top_k=K, moe_ffn_hidden_size=4, moe_layers=(0,), model_type="mixtral")
    mesh = build_mesh(ParallelDims.from_world(world), ep, etp)
    layer = MoELayer(cfg, TPContext(mesh.tp), ExpertContext(MoEConfig(expert_parallel=ep, expert_tensor_parallel=etp),
                                                            mesh.ep, mesh.etp), activation("silu"))
    x = torch.randn(N, H, requires_grad=True)
    r = mesh.ep.rank
    experts = torch.stack([(torch.arange(N) + r) % ep, (torch.arange(N) + r + 1) % ep], 1)
    probs = torch.full((N, K), 0.5, requires_grad=True)
    mesh.ledger.reset()
    layer._alltoall(x, Routing(logits=torch.zeros(N, ep), scores=torch.zeros(N, ep), experts=experts, probs=probs),
                    None, None).sum().backward()
    return {"etp": mesh.ledger.bytes("all_to_all_v", "etp"), "etp_calls": mesh.ledger.calls("all_to_all_v", "etp"),
            "ep": mesh.ledger.bytes("all_to_all_v", "ep"), "etp_counts": mesh.ledger.bytes("all_gather", "etp")}


def _four(rank, world, paths, cfgs, root):
    out = {}
    for case, (kind, tp, ep, etp, zero) in CASES4.items():
        out[case], run = _case(cfgs[kind], paths[kind], world, tp, ep, etp, zero, logits=True)
        if kind == "mixtral":
            out["chain"] = _chain(run, root, world, paths[kind], cfgs[kind])
    out["ledger"] = _ledger(world, 2, 2)
    return out


def _eight(rank, world, paths, cfgs):
    """The cases differ only in the ZeRO stage of training: one step's gradients (ZeRO 0) serve both."""
    out, grads = {}, None
    for case, (kind, tp, ep, etp, zero) in CASES8.items():
        out[case] = _case(cfgs[kind], paths[kind], world, tp, ep, etp, zero, grads=grads)[0]
        grads = out[case]["grads"]
    return out


# --- the reference: transformers, one process ---------------------------------------------------------------
def reference_loss(hf, parts=False):
    """Mean over every micro-batch of the global batch of LM loss + coeff / k x per-layer balancing loss."""
    k = hf.config.num_experts_per_tok
    E = getattr(hf.config, "num_local_experts", None) or hf.config.num_experts
    batches = micro_batches(0, 1)
    total, lm_total = 0.0, 0.0
    for x, y in batches:
        out = hf(x, output_router_logits=True)
        lm = F.cross_entropy(out.logits.flatten(0, 1), y.flatten())
        lm_total = lm_total + lm.detach()
        total = total + lm + COEFF / k * hf_layer_aux(out.router_logits, E, k)
    return (total / len(batches), lm_total / len(batches)) if parts else total / len(batches)


def reference(kind):
    hf = hf_model(kind, LAYERS)
    with torch.no_grad():
        logits = [hf(x).logits for x, _ in micro_batches(0, 1)]
    loss, lm = reference_loss(hf, parts=True)
    loss.backward()
    grads = {k: g.clone() for k, g in per_expert(hf, kind).items()}
    hf = hf_model(kind, LAYERS)
    decay = [p for p in hf.parameters() if p.dim() >= 2]
    other = [p for p in hf.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPT.weight_decay}, {"params": other, "weight_decay": 0.0}],
                            lr=OPT.lr, betas=(OPT.beta1, OPT.beta2), eps=OPT.eps)
    for _ in range(STEPS):
        opt.zero_grad()
        reference_loss(hf).backward()
        opt.step()
    weights = {k: w.clone() for k, w in per_expert(hf, kind, grads=False).items()}
    return {"grads": grads, "weights": weights, "logits": logits, "lm": float(lm)}


KINDS = ("mixtral", "qwen2_moe")


@pytest.fixture(scope="module")
def paths():
    return {kind: save(hf_model(kind, LAYERS)) for kind in KINDS}


@pytest.fixture(scope="module")
def cfgs():
    return {kind: model_config(kind) for kind in KINDS}


@pytest.fixture(scope="module")
def refs():
    return {kind: reference(kind) for kind in KINDS}


@pytest.fixture(scope="module")
def four(paths, cfgs):
    return run_distributed(_four, 4, args=(paths, cfgs, tempfile.mkdtemp(prefix="moe-etp-")), timeout=1500)


@pytest.fixture(scope="module")
def eight(paths, cfgs):
    return run_distributed(_eight, 8, args=(paths, cfgs), timeout=1500)


def _check(ref: dict, ranks: list[dict], what: str) -> None:
    worst, seen = 0.0, set()
    for r in ranks:
        for key, t in r[what].items():
            worst = max(worst, rel(t, ref[key]))
            seen.add(key)
    assert seen == set(ref), f"not every tensor was compared: missing {sorted(set(ref) - seen)[:4]}"
    assert worst < RTOL, worst


@pytest.mark.parametrize("case", list(CASES4))
def test_etp2_ep2_logits_and_loss_equal_transformers(four, refs, case):
    ref = refs[CASES4[case][0]]
    for r in four:
        mine = r[case]
        for i, lg in enumerate(mine["logits"]):
            assert rel(lg, ref["logits"][mine["dp_rank"] * len(mine["logits"]) + i]) < RTOL
        assert abs(mine["losses"][0] - ref["lm"]) < RTOL * ref["lm"]


@pytest.mark.parametrize("case", list(CASES4))
def test_etp2_ep2_gradients_equal_transformers(four, refs, case):
    _check(refs[CASES4[case][0]]["grads"], [r[case] for r in four], "grads")


@pytest.mark.parametrize("case", list(CASES4))
def test_etp2_ep2_weights_after_training_equal_transformers(four, refs, case):
    _check(refs[CASES4[case][0]]["weights"], [r[case] for r in four], "weights")


def test_etp_gather_and_reduce_scatter_bytes_equal_the_formula(four):
    """ETP 2 x EP 2: every rank receives N k rows from its EP group (N k / EP from each); the expert-TP all-gather-v
    sends them to the other ETP - 1 ranks and the reduce-scatter-v returns the partials of the other ranks' rows:
    (ETP - 1) N k h b each, forward, and again backward; 4 calls. The counts: one all-gather of EP x E_l int64.
    The EP all-to-all is unchanged by expert-TP: 2 N k h b (EP - 1) / EP forward, the same backward."""
    ep, etp, b = 2, 2, 4
    for r in four:
        led = r["ledger"]
        assert led["etp"] == 4 * (etp - 1) * N * K * H * b
        assert led["etp_calls"] == 4
        assert led["ep"] == 2 * 2 * N * K * H * b * (ep - 1) // ep
        assert led["etp_counts"] == etp * ep * 1 * 8  # E = ep experts: one per EP rank


def _read_all(directory):
    """Every tensor of a checkpoint, whole (one DCP load of every key, no process group), and each key's stored
    chunk volume."""
    meta = dcp.FileSystemReader(directory).read_metadata().state_dict_metadata
    out, volume = {}, {}
    for key, m in meta.items():
        out[key] = torch.empty(tuple(m.size), dtype=m.properties.dtype)
        volume[key] = sum(math.prod(c.sizes) for c in m.chunks)
    dcp.load(out, storage_reader=dcp.FileSystemReader(directory), no_dist=True)
    return out, volume


def test_checkpoint_saved_at_one_etp_loads_at_another_bit_for_bit(four, cfgs):
    """A (ep 2 x etp 2) -> B (ep 4 x etp 1) -> C (ep 1 x etp 4) -> D (ep 1 x etp 2 x edp 2): master weights and both
    Adam moments equal A's bit for bit; every expert tensor of each is stored exactly once (its chunks tile it)."""
    states = {name: _read_all(d) for name, d in four[0]["chain"].items()}
    cfg = cfgs["mixtral"]
    experts = {f"{kind}/layers.{layer}.mlp.experts.{e}.{proj}.weight"
               for kind in ("model", "optim.exp_avg", "optim.exp_avg_sq")
               for layer in range(cfg.num_layers) for e in range(cfg.num_experts)
               for proj in ("gate_proj", "up_proj", "down_proj")}
    ref, _ = states[list(CHAIN)[0]]
    for name, (tensors, volume) in states.items():
        assert experts <= set(tensors), f"{name}: missing {sorted(experts - set(tensors))[:3]}"
        for key, t in tensors.items():
            assert volume[key] == t.numel(), f"{name}: {key} stored {volume[key]} elements for {t.numel()}"
        assert set(tensors) == set(ref)
        differing = [k for k in ref if not torch.equal(tensors[k], ref[k])]
        assert not differing, f"{name}: {len(differing)} tensors differ, e.g. {differing[:3]}"


@pytest.mark.parametrize("case", list(CASES8))
def test_tp2_etp2_ep2_gradients_and_weights_equal_transformers(eight, refs, case):
    ref = refs[CASES8[case][0]]
    _check(ref["grads"], [r[case] for r in eight], "grads")
    _check(ref["weights"], [r[case] for r in eight], "weights")


def test_train_py_runs_expert_tp_as_users_launch_it():
    """train.py on 2 ranks with --expert-tensor-parallel-size 2 (EP 1: both ranks hold every expert, half its width
    each), ZeRO 1, as users launch it: it trains (the loss falls over 4 steps at lr 3e-3) and logs the routing."""
    import re

    from hybrid.testing import launch

    runs = launch(["--model", "tiny-mixtral", "--expert-tensor-parallel-size", "2", "--zero-stage", "1",
                   "--micro-batch-size", "2", "--global-batch-size", "8", "--seq-length", "32", "--eval-iters", "0",
                   "--train-iters", "4", "--log-interval", "1", "--lr", "3e-3", "--moe-aux-loss-coeff", "0.01"],
                  2, timeout=600)
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    lines = [ln for ln in runs[0].stdout.splitlines() if ln.startswith(" iteration")]
    losses = [float(re.search(r"lm loss ([\d.]+)", ln).group(1)) for ln in lines]
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    assert all("moe tokens/expert" in ln for ln in lines), lines[-1]
