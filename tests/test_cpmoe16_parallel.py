"""Context parallelism composed with expert parallelism (CP x EP in one mesh) against the unsharded transformers
model -- one launch per world size computes every case, each test checks one thing of one case.

The layouts (hybrid/moe/parallel.py: the expert layers fold each stage's tp x cp x dp ranks, as Megatron's
parallel_state carves expert-DP out of DP x CP):

    mixtral-cp2-dp2-ep2-zero1          4 ranks; each EP group is a CP pair (one sequence's two halves exchange
                                       tokens), expert-DP across DP
    qwen2moe-cp2-dp2-ep4-zero3-seqaux-recompute
                                       4 ranks; one EP group spans CP and DP (expert-DP 1), the allgather
                                       dispatcher, Megatron's per-sequence seq_aux_loss over 2-sequence micro-
                                       batches, a gated shared expert and a dense layer (qwen2_moe), full
                                       recomputation (the ring and the routing replayed in backward)
    mixtral-tp2sp-cp2-pp2-ep2-zero1    8 ranks; TP 2 + SP x CP 2 x PP 2 (1F1B): a micro-batch's tokens lie on
                                       4 ranks (the counts are summed over the tp_cp group), EP groups are the
                                       TP pairs

For every case, with the load-balancing loss (coefficient COEFF) and the router z-loss (ZCOEFF) on:

* logits of each rank's first micro-batch = transformers' logits of the same sequences at the rank's
  load-balanced positions (hybrid/cp/balance.py);
* the loss: the LM loss train.py logs (averaged over DP x CP), and the balancing and z-losses the runtime's
  statistics report (hybrid/moe/runtime.step_statistics: each rank's share summed over TP x CP x DP), each =
  the reference's mean over the global batch's micro-batches; the reference's balancing loss is transformers'
  load_balancing_loss_func of each layer's router logits / k (= Megatron's switch loss; per sequence and
  averaged for seq_aux_loss), its z-loss ST-MoE's coeff x mean_t logsumexp(logits_t)^2 of each layer;
* gradients of one step (ZeRO 0: the summed gradients stay in p.grad, divided here by dp x cp as the engine
  divides them) = transformers' gradients of that mean total loss, every parameter and every expert (each rank
  compares the experts it holds; together they hold all of them);
* the LM losses of STEPS AdamW steps and the weights after them, at the case's ZeRO stage through train_step,
  = transformers' model trained with torch's AdamW on the same micro-batches and total loss;
* the ledger: one all-reduce of the routing counts per MoE layer forward, on the CP group, or on tp_cp with TP.

Bound. fp32; RTOL = 1e-5 relative to each tensor's largest entry, as tests/test_moe_parallel.py and
tests/test_cp_models.py: the parallel run sums gradients in another order and ring attention merges partial
softmaxes by log-sum-exp (~1e-7 relative each), and AdamW with eps = 1e-5 (lr 5e-4) moves a weight by at most
lr x 1e-9 / 1e-5 per step for that noise. The losses are scalars compared within RTOL of their value.

What breaking it does (run on this file's cases, then restored): the counts not summed over CP
(hybrid/moe/layer._group_counts) fail 12 of the 15 tests -- every case's losses, gradients, training and ledger;
only the logits, which no balancing term touches, pass; the shares' gradients not scaled by cp (layer._balance)
fail the 6 gradient and training tests, the loss values staying right. tests/test_cpmoe16_units.py pins each term
alone."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F

from hybrid.cp import CommType, CPContext
from hybrid.cp.balance import local_indices
from hybrid.cp.data import TokenSharding
from hybrid.mesh import ParallelDims
from hybrid.moe.config import Dispatcher, LoadBalancing, MoEConfig
from hybrid.moe.layer import ExpertContext
from hybrid.moe.parallel import build_mesh
from hybrid.moe.runtime import moe_layers, set_aux_grad_scale, step_statistics
from hybrid.pipeline import ScheduleKind, build_schedule
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.testing import case_result, each_case, run_distributed
from hybrid.tp import TPContext
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from models import Recompute, build_pipeline_chunks, from_hf
from models.common import set_context_parallel
from models.hf_io import export_hf_state_dict, load_hf_checkpoint
from moe_reference import hf_config, hf_layer_aux, hf_model, per_expert, rel, save
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)

GLOBAL, SEQ, STEPS, LAYERS = 8, 16, 2, 4
RTOL = 1e-5
COEFF, ZCOEFF = 0.1, 0.01
OPT = OptimizerConfig(lr=5e-4, eps=1e-5, weight_decay=0.01, decay_style="constant", clip_grad=0.0)


class Case(NamedTuple):
    model: str
    world: int
    tp: int
    cp: int
    pp: int
    ep: int
    zero: int
    dispatcher: str
    mb: int  # sequences per micro-batch
    balancing: str  # --moe-router-load-balancing-type
    recompute: str = "none"  # --recompute-granularity


CASES = {
    "mixtral-cp2-dp2-ep2-zero1": Case("mixtral", 4, 1, 2, 1, 2, 1, "alltoall", 1, "aux_loss"),
    "qwen2moe-cp2-dp2-ep4-zero3-seqaux-recompute": Case("qwen2_moe", 4, 1, 2, 1, 4, 3, "allgather", 2, "seq_aux_loss",
                                                        "full"),
    "mixtral-tp2sp-cp2-pp2-ep2-zero1": Case("mixtral", 8, 2, 2, 2, 2, 1, "alltoall", 1, "aux_loss"),
}


def global_batch():
    ids = torch.randint(0, 64, (GLOBAL, SEQ + 1), generator=torch.Generator().manual_seed(3))
    return ids[:, :-1], ids[:, 1:]


def micro_batches(dp_rank, dp, mb):
    """This DP rank's rows of the global batch, in micro-batches of `mb` whole sequences."""
    x, y = global_batch()
    rows = GLOBAL // dp
    x, y = x[dp_rank * rows:(dp_rank + 1) * rows], y[dp_rank * rows:(dp_rank + 1) * rows]
    return [(x[i:i + mb], y[i:i + mb]) for i in range(0, rows, mb)]


# --- the ranks --------------------------------------------------------------------------------------------
class Run:
    """One case's model on this rank, as train.py builds it (hybrid/train/loop.py): the expert context with the CP
    and tp_cp groups, CP set on the model, the micro-batches cut to this rank's load-balanced tokens."""

    def __init__(self, c: Case, cfg, path, zero: int):
        self.c = c
        dims = ParallelDims.from_world(c.world, tp=c.tp, pp=c.pp, cp=c.cp)
        self.mesh = mesh = build_mesh(dims, c.ep)
        mc = MoEConfig(expert_parallel=c.ep, aux_loss_coeff=COEFF, z_loss_coeff=ZCOEFF,
                       load_balancing=LoadBalancing(c.balancing), dispatcher=Dispatcher(c.dispatcher))
        moe = ExpertContext(mc, mesh.ep, mesh.etp, mesh.cp, mesh.tp_cp)
        self.chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp, sequence_parallel=c.tp > 1), mesh.coords.pp,
                                            c.pp, seed=None, recompute=Recompute(c.recompute), moe=moe)
        for chunk in self.chunks:
            load_hf_checkpoint(chunk, path, mesh.tp.rank)
        set_context_parallel(self.chunks, CPContext(mesh.cp, CommType.P2P))
        self.batches = TokenSharding(c.cp, mesh.cp.rank).batches(micro_batches(mesh.coords.dp, dims.dp, c.mb))
        if c.pp == 1:
            self.runner = LocalForwardBackward(self.chunks[0], mesh.device)
        else:
            schedule = build_schedule(ScheduleKind.ONE_F_ONE_B, c.pp, len(self.batches))[mesh.coords.pp]
            self.seq = SEQ // c.cp // c.tp  # a rank's activations between stages: T / cp, / tp under SP
            self.runner = PipelineExecutor(self.chunks, schedule, mesh.pp,
                                           StageIO((c.mb, self.seq, cfg.hidden_size)), mesh.device)
        self.opt = ZeroOptimizer(self.chunks, mesh, ZeroConfig(stage=zero), OPT)

    def export(self, grads: bool) -> dict[str, torch.Tensor]:
        out = {}
        for chunk in self.chunks:
            out.update(export_hf_state_dict(chunk, self.mesh.tp, grads=grads))
        return out

    @torch.no_grad()
    def logits(self) -> torch.Tensor | None:
        """The first micro-batch's logits (mb, T/cp, V) on the last stage, gathered over TP's vocabulary; None
        elsewhere. In eval mode: the MoE layers record no statistics for it."""
        x, mesh = self.batches[0][0], self.mesh
        self.chunks.eval()
        try:
            if self.c.pp == 1:
                y = self.chunks[0](x)
            elif mesh.is_first_stage:
                mesh.pp.batch_p2p([(self.chunks[0](x).contiguous(), 1)], [])
                return None
            else:
                h = torch.empty(self.c.mb, self.seq, self.chunks[0].cfg.hidden_size)
                mesh.pp.batch_p2p([], [(h, 0)])
                y = self.chunks[0](h)
        finally:
            self.chunks.train()
        return mesh.tp.all_gather(y, dim=-1)


def _case(world, cfgs, paths, name):
    c = CASES[name]
    cfg, path = cfgs[c.model], paths[c.model]
    # one step's gradients and losses, ZeRO 0: p.grad holds the gradients summed over DP x CP (experts: expert-DP)
    run = Run(c, cfg, path, zero=0)
    mesh = run.mesh
    logits = run.logits()
    run.opt.zero_grad()
    run.opt.begin_step(len(run.batches))
    set_aux_grad_scale(run.chunks, 1.0 / len(run.batches))
    lm = run.runner.forward_backward(run.batches)
    run.opt.finish_backward(run.chunks, mesh)
    # the counts' all-reduces so far (step_statistics files its own under the same tag after this)
    counts_calls = {g: mesh.ledger.calls("all_reduce", f"{g}:moe") for g in ("tp_cp", "cp", "tp")}
    routed = len(moe_layers(run.chunks)) * len(run.batches)  # MoE layer forwards on this rank
    stats = step_statistics(run.chunks, mesh, len(run.batches))  # collective: the aux and z shares summed
    mesh.pp.all_reduce(lm)
    lm = mesh.dp_cp.all_reduce(lm).item() / mesh.dp_cp.size
    divisor = mesh.dims.dp * mesh.dims.cp  # the ZeRO engine's: the dp_cp sum / (dp x cp)
    grads = {k: g / divisor for k, g in run.export(grads=True).items()}
    # STEPS training steps at the case's ZeRO stage, through train_step
    run = Run(c, cfg, path, c.zero)
    losses = [train_step(run.chunks, run.batches, run.opt, run.mesh, runner=run.runner) for _ in range(STEPS)]
    with run.opt.gathered():  # stage 3 frees the gathered buffers at the exit: copy inside
        weights = {k: t.clone() for k, t in run.export(grads=False).items()}
    return {"grads": grads, "weights": weights, "losses": losses, "lm": lm, "aux": stats.aux_loss,
            "z": stats.z_loss, "logits": logits, "counts_calls": counts_calls, "routed": routed,
            "rows": mesh.coords.dp * (GLOBAL // mesh.dims.dp), "positions": local_indices(mesh.cp.rank, c.cp, SEQ)}


def _all(rank, world, names, cfgs, paths):
    return each_case(_case, [(name,) for name in names], world, cfgs, paths)


# --- the reference: transformers, one process ---------------------------------------------------------------
def reference_terms(hf, c: Case):
    """Mean over the global batch's micro-batches of (LM loss, balancing loss, z-loss), each a tensor."""
    k = hf.config.num_experts_per_tok
    E = getattr(hf.config, "num_local_experts", None) or hf.config.num_experts
    batches = micro_batches(0, 1, c.mb)
    lm = aux = z = 0.0
    for x, y in batches:
        out = hf(x, output_router_logits=True)
        routers = [lg for lg in out.router_logits if lg is not None]
        lm = lm + F.cross_entropy(out.logits.flatten(0, 1), y.flatten())
        if c.balancing == "aux_loss":
            aux = aux + COEFF / k * hf_layer_aux(routers, E, k)
        else:  # Megatron's seq_aux_loss: the switch loss of each sequence alone, averaged over the sequences
            B, T = x.shape
            aux = aux + sum(COEFF / k * hf_layer_aux([lg.view(B, T, E)[b] for lg in routers], E, k)
                            for b in range(B)) / B
        z = z + ZCOEFF * sum(torch.logsumexp(lg.float(), dim=-1).square().mean() for lg in routers)
    n = len(batches)
    return lm / n, aux / n, z / n


def reference(c: Case):
    hf = hf_model(c.model, LAYERS)
    with torch.no_grad():
        logits = hf(global_batch()[0]).logits
    lm, aux, z = reference_terms(hf, c)
    (lm + aux + z).backward()
    grads = {k: g.clone() for k, g in per_expert(hf, c.model).items()}
    hf = hf_model(c.model, LAYERS)
    decay = [p for p in hf.parameters() if p.dim() >= 2]
    other = [p for p in hf.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPT.weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=OPT.lr, betas=(OPT.beta1, OPT.beta2), eps=OPT.eps)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        step_lm, step_aux, step_z = reference_terms(hf, c)
        (step_lm + step_aux + step_z).backward()
        losses.append(step_lm.item())
        opt.step()
    return {"grads": grads, "weights": {k: w.clone() for k, w in per_expert(hf, c.model, grads=False).items()},
            "lm": lm.item(), "aux": aux.item(), "z": z.item(), "losses": losses, "logits": logits}


@pytest.fixture(scope="module")
def results():
    kinds = sorted({c.model for c in CASES.values()})
    paths = {kind: save(hf_model(kind, LAYERS)) for kind in kinds}
    # without the transformers config object it was read from: unpickling one imports transformers in every rank
    cfgs = {kind: dataclasses.replace(from_hf(hf_config(kind, LAYERS)), hf_config=None) for kind in kinds}
    launches = {}
    for world in sorted({c.world for c in CASES.values()}):
        names = [name for name, c in CASES.items() if c.world == world]
        launches[world] = run_distributed(_all, world, args=(names, cfgs, paths), timeout=1500)
    refs = {}
    out = {}
    for name, c in CASES.items():
        key = (c.model, c.mb, c.balancing)
        if key not in refs:
            refs[key] = reference(c)
        out[name] = (refs[key], case_result(launches[c.world], (name,)))
    return out


def _check(ref: dict, ranks: list[dict], what: str) -> tuple[float, set]:
    worst, seen = 0.0, set()
    for r in ranks:
        for key, t in r[what].items():
            worst = max(worst, rel(t, ref[key]))
            seen.add(key)
    return worst, seen


@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_transformers_at_each_cp_ranks_positions(results, case):
    ref, ranks = results[case]
    c = CASES[case]
    compared = 0
    for r in ranks:
        if r["logits"] is None:
            continue
        want = ref["logits"][r["rows"]:r["rows"] + c.mb][:, r["positions"]]
        assert rel(r["logits"], want) < RTOL, rel(r["logits"], want)
        compared += 1
    assert compared == c.world // c.pp  # every rank of the last stage


@pytest.mark.parametrize("case", list(CASES))
def test_lm_balancing_and_z_losses_equal_transformers(results, case):
    ref, ranks = results[case]
    assert ref["aux"] > 0 and ref["z"] > 0
    for r in ranks:
        for what in ("lm", "aux", "z"):
            assert abs(r[what] - ref[what]) <= RTOL * ref[what], (what, r[what], ref[what])


@pytest.mark.parametrize("case", list(CASES))
def test_routing_counts_are_summed_in_one_all_reduce_over_the_tokens_ranks(results, case):
    """One all-reduce of the counts per MoE layer forward, over the ranks a micro-batch's tokens lie on: the CP
    group, or with TP + SP the tp_cp group (Megatron's tp_cp_group), never TP and CP one after the other (full
    recomputation reruns each forward, its balancing loss's counts with it, as at CP 1)."""
    _, ranks = results[case]
    c = CASES[case]
    group, runs = "tp_cp" if c.tp > 1 else "cp", 2 if c.recompute == "full" else 1
    for r in ranks:
        assert r["routed"] > 0 and r["counts_calls"] == {g: runs * r["routed"] if g == group else 0
                                                           for g in ("tp_cp", "cp", "tp")}, r["counts_calls"]


@pytest.mark.parametrize("case", list(CASES))
def test_gradients_equal_transformers(results, case):
    ref, ranks = results[case]
    worst, seen = _check(ref["grads"], ranks, "grads")
    assert seen == set(ref["grads"]), f"not every tensor was compared: missing {sorted(set(ref['grads']) - seen)[:4]}"
    assert worst < RTOL, worst


@pytest.mark.parametrize("case", list(CASES))
def test_training_losses_and_weights_equal_transformers(results, case):
    ref, ranks = results[case]
    for r in ranks:
        for got, want in zip(r["losses"], ref["losses"], strict=True):
            assert abs(got - want) <= RTOL * want, (r["losses"], ref["losses"])
    worst, seen = _check(ref["weights"], ranks, "weights")
    assert seen == set(ref["weights"])
    assert worst < RTOL, worst
