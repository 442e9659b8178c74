"""Context-parallel models against the unsharded single-process model (the acceptance test of issue 29).

On 8 gloo ranks, for every comm type (p2p ring, a2a Ulysses, allgather) and three layouts --
TP 2 (+ sequence parallel) x CP 2 x PP 2 (1F1B, 2 micro-batches), TP 2 x CP 4 and CP 4 x PP 2 -- the logits, the
loss and every parameter gradient equal the single-process model's within 1e-5 of the largest value (fp32):

  * llama: GQA (16 query, 8 key/value heads: 8 and 4 per TP rank, so Ulysses splits them 2 and 4 ways);
  * mistral-w3: a sliding window of 3 on every layer, shorter than a load-balanced chunk (8 / 4 tokens at CP 2 / 4);
  * mistral-w20: a window of 20, longer than a rank's whole shard (16 / 8 tokens);
  * gpt2: learned positions (looked up at each rank's scattered positions), tied embeddings;
  * llama-docs, gpt2-docs: packed documents with `--reset-attention-mask --reset-position-ids`, against the
    single-process model run on each document alone (an independent reference: no document mask in it).

The gradients are reduced over the mesh's dp_cp group and divided by its size, as the ZeRO engine does; the
loss is averaged over dp_cp, as train_step logs it.

The ranks do not import transformers: the configs are made here, in the test process, and passed to the launches
without the transformers config object they were read from (unpickling one imports transformers in each rank:
~1.2 s of CPU a rank, 22 ranks over the module's four launches -- until round 18 about 1/3 of the module's CPU);
each single-process reference is computed once per (model, documents) and shared by the layouts and comm types,
at one intra-op thread as every rank runs (tests/suite_threads.py; compared within TOL, never bit for bit).

The fast tier (`-m "not slow"`) runs every model at the layout that composes the most (TP 2 + SP x CP 2 x PP 2)
with the p2p ring, in a launch of its own; the other layouts and comm types are marked slow (the full suite runs
them). Every comm type stays in the fast tier through tests/test_cp_attention.py (attention against fp64, every
mask and head layout) and tests/test_cp_training.py (training through the real step), and here through the
CP 2 x PP 2 schedules (slow: a 4-rank launch of its own; CP 2 x PP 2 stays fast at 1F1B in the first launch, each
schedule through tests/test_pipeline_executor.py) and the ledger below."""

from __future__ import annotations

import dataclasses
import functools
import sys

import pytest
import torch
import torch.nn.functional as F
from hybrid.comm import Group
from hybrid.cp import CommType, CPContext
from hybrid.cp.data import TokenSharding, seq_kwargs
from hybrid.mesh import Mesh, ParallelDims
from hybrid.pipeline import ScheduleKind, build_schedule
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.testing import run_distributed
from hybrid.tp import IGNORE_INDEX, TPContext, gather_full, spec_of, sync_partial_grads
from hybrid.train_step import LocalForwardBackward, sync_tied_embeddings
from models import Recompute, build_model, build_pipeline_chunks, from_hf, shift_labels
from models.common import set_context_parallel, set_recompute
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)

TOL = 1e-5
B, T, M, H, V, EOD = 2, 32, 2, 64, 128, 0
LAYOUTS = {"tp2-cp2-pp2-sp": (2, 2, 2, True), "tp2-cp4": (2, 4, 1, False), "cp4-pp2": (1, 4, 2, False)}


@functools.lru_cache(maxsize=1)
def configs():
    """The models (from transformers' configs: imported here, in the test process, not in the ranks)."""
    from transformers import GPT2Config, MistralConfig
    llama = dict(num_hidden_layers=2, hidden_size=H, num_attention_heads=16, num_key_value_heads=8,
                 intermediate_size=96, vocab_size=V, max_position_embeddings=64, attention_dropout=0.0,
                 tie_word_embeddings=False)
    return {
        "llama": _plain(MistralConfig(**llama, sliding_window=None)),
        "mistral-w3": _plain(MistralConfig(**llama, sliding_window=3)),
        "mistral-w20": _plain(MistralConfig(**llama, sliding_window=20)),
        "gpt2": _plain(GPT2Config(n_layer=2, n_embd=H, n_head=8, vocab_size=V, n_positions=64, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)),
    }


def _plain(hf):
    """from_hf(hf) without the transformers config object (the module doc: what the ranks unpickle); these
    models' default RoPE is computed without it (ModelConfig.rope_inv_freq)."""
    return dataclasses.replace(from_hf(hf), hf_config=None)


MODELS = [("llama", False), ("mistral-w3", False), ("mistral-w20", False), ("gpt2", False), ("llama", True),
          ("gpt2", True)]
CASES = [(layout, comm.value, model, docs) for layout in LAYOUTS for comm in CommType for model, docs in MODELS]
FAST = [case for case in CASES if case[:2] == ("tp2-cp2-pp2-sp", CommType.P2P.value)]  # every model, once


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """M micro-batches of (B, T); token 0 is the end of document: row 0 holds four documents, row 1 two."""
    gen = torch.Generator().manual_seed(3)
    out = []
    for _ in range(M):
        ids = torch.randint(1, V, (B, T), generator=gen)
        ids[0, [6, 7, 19, 25]] = EOD
        ids[1, [13]] = EOD
        out.append((ids, shift_labels(ids)))
    return out


def _documents(row: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each document of a row, each ending with its EOD (independent of hybrid/cp/data.py)."""
    cuts = [i + 1 for i, t in enumerate(row.tolist()) if t == EOD and i + 1 < len(row)]
    bounds = [0] + cuts + [len(row)]
    return list(zip(bounds, bounds[1:]))


@functools.lru_cache(maxsize=None)
def _reference(model_name: str, docs: bool):
    """Single process, no CP, no document mask: logits of micro-batch 0, the mean loss over the micro-batches,
    every gradient. With packed documents each document runs alone (positions from 0)."""
    model = build_model(configs()[model_name], TPContext(Group.solo("tp")), seed=5)
    logits0, loss = None, 0.0
    for i, (x, y) in enumerate(_batches()):
        if docs:
            logits = torch.cat([torch.cat([model(x[b:b + 1, s:e]) for s, e in _documents(x[b])], dim=1)
                                for b in range(B)])
        else:
            logits = model(x)
        mb_loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX)
        loss = loss + mb_loss / M
        logits0 = logits.detach() if i == 0 else logits0
    loss.backward()
    return logits0, loss.item(), {n: p.grad for n, p in model.named_parameters()}


def _logits(chunks, mesh: Mesh, mb: tuple) -> torch.Tensor | None:
    """Micro-batch `mb`'s logits (B, T/CP, V) on the last stage, gathered over TP's vocabulary; None elsewhere."""
    x, _, *info = mb
    with torch.no_grad():
        if mesh.dims.pp == 1:
            y = chunks[0](x, **seq_kwargs(info, mesh.device))
        elif mesh.is_first_stage:
            h = chunks[0](x, **seq_kwargs(info, mesh.device))
            mesh.pp.batch_p2p([(h.contiguous(), 1)], [])
            return None
        else:
            h = torch.empty(B, T // mesh.dims.cp // (mesh.dims.tp if chunks[0].tp.sequence_parallel else 1), H)
            mesh.pp.batch_p2p([], [(h, 0)])
            y = chunks[0](h, **seq_kwargs(info, mesh.device))
    return mesh.tp.all_gather(y, dim=-1)


def _run(mesh: Mesh, cfgs: dict, layout: str, comm: str, model_name: str, docs: bool):
    tp, cp, pp, sp = LAYOUTS[layout]
    cfg = cfgs[model_name]
    chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp, sequence_parallel=sp), mesh.coords.pp, pp, seed=5)
    set_context_parallel(chunks, CPContext(mesh.cp, CommType(comm)))
    local = TokenSharding(cp, mesh.cp.rank, docs, docs, EOD).batches(_batches())
    logits = _logits(chunks, mesh, local[0])
    if pp == 1:
        runner = LocalForwardBackward(chunks[0], mesh.device)
    else:
        schedule = build_schedule(ScheduleKind.ONE_F_ONE_B, pp, M)[mesh.coords.pp]
        runner = PipelineExecutor(chunks, schedule, mesh.pp, StageIO((B, T // cp // (tp if sp else 1), H)), mesh.device)
    loss = runner.forward_backward(local)
    sync_partial_grads(chunks.parameters(), mesh.tp)
    sync_tied_embeddings(chunks, mesh)
    grads = {}
    for c in chunks:
        for n, p in c.named_parameters():
            g = mesh.dp_cp.all_reduce(p.grad.clone()) / mesh.dp_cp.size  # the ZeRO engine's average over DP x CP
            grads[n] = gather_full(g, spec_of(p), mesh.tp)
    mesh.pp.all_reduce(loss)
    loss = mesh.dp_cp.all_reduce(loss).item() / mesh.dp_cp.size
    return {"loss": loss, "grads": grads, "logits": logits, "cp_rank": mesh.cp.rank}


def _all(rank: int, world: int, cfgs: dict, cases: list):
    assert "transformers" not in sys.modules, "a rank imported transformers (the module doc)"
    meshes = {name: Mesh.build(ParallelDims.from_world(world, tp=tp, pp=pp, cp=cp))
              for name, (tp, cp, pp, _) in LAYOUTS.items() if any(case[0] == name for case in cases)}
    return {case: _run(meshes[case[0]], cfgs, *case) for case in cases}


@functools.lru_cache(maxsize=2)
def results(fast: bool):
    """One 8-rank launch for the fast tier's cases, one for the rest."""
    cases = [case for case in CASES if (case in FAST) == fast]
    return run_distributed(_all, 8, args=(configs(), cases), timeout=1500)


ATOL = 1e-7  # GPT-2's key bias: its gradient is 0 in exact arithmetic (softmax ignores a shift), ~1e-11 in fp32


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over (ATOL + max |b|): relative to the tensor's largest value (as tests/test_pipeline_executor)."""
    return float((a - b).abs().max() / (b.abs().max() + ATOL / TOL))


@pytest.mark.parametrize("layout,comm,model,docs", [
    pytest.param(*case, marks=() if case in FAST else pytest.mark.slow,
                 id=f"{case[0]}-{case[1]}-{case[2]}{'-docs' if case[3] else ''}") for case in CASES])
def test_cp_model_equals_single_process(layout, comm, model, docs):
    ref_logits, ref_loss, ref_grads = _reference(model, docs)
    case = (layout, comm, model, docs)
    per_rank = [r[case] for r in results(case in FAST)]
    cp = LAYOUTS[layout][1]
    shards = {}
    for r, got in enumerate(per_rank):
        assert abs(got["loss"] - ref_loss) <= TOL * ref_loss, f"rank {r}: loss {got['loss']} vs {ref_loss}"
        for n, g in got["grads"].items():
            assert rel(g, ref_grads[n]) <= TOL, f"rank {r}: {n} rel err {rel(g, ref_grads[n]):.2e}"
        if got["logits"] is not None:
            shards[got["cp_rank"]] = got["logits"]
    from hybrid.cp import unshard
    assert sorted(shards) == list(range(cp))
    logits = unshard([shards[i] for i in range(cp)])
    assert rel(logits, ref_logits) <= TOL
    assert {n for r in per_rank for n in r["grads"]} == set(ref_grads)  # every parameter compared somewhere


# --- CP 2 x PP 2 under the other pipeline schedules ---------------------------------------------------------
SCHEDULES = [ScheduleKind.GPIPE, ScheduleKind.INTERLEAVED, ScheduleKind.ZB_H1, ScheduleKind.ZBV]
SCHEDULE_CASES = [(kind, comm.value) for kind in SCHEDULES for comm in (CommType.P2P, CommType.A2A)]
M4 = 4  # micro-batches (interleaving needs a multiple of pp)


@functools.lru_cache(maxsize=1)
def _llama4():
    from transformers import MistralConfig  # in the test process: the config is passed to the ranks
    return _plain(MistralConfig(num_hidden_layers=4, hidden_size=H, num_attention_heads=16, num_key_value_heads=8,
                                intermediate_size=96, vocab_size=V, max_position_embeddings=64, attention_dropout=0.0,
                                tie_word_embeddings=False, sliding_window=None))


def _batches4():
    gen = torch.Generator().manual_seed(4)
    return [(x, shift_labels(x)) for x in (torch.randint(0, V, (B, T), generator=gen) for _ in range(M4))]


def _schedule_run(mesh: Mesh, cfg, kind: ScheduleKind, comm: str):
    pp, v = mesh.dims.pp, 1 if kind in (ScheduleKind.GPIPE, ScheduleKind.ZB_H1) else 2
    stage_ids = [kind.placement.stage(mesh.coords.pp, c, pp) for c in range(v)]
    chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp), mesh.coords.pp, pp, v, seed=5, stage_ids=stage_ids)
    set_context_parallel(chunks, CPContext(mesh.cp, CommType(comm)))
    local = TokenSharding(mesh.dims.cp, mesh.cp.rank).batches(_batches4())
    runner = PipelineExecutor(chunks, build_schedule(kind, pp, M4, v)[mesh.coords.pp], mesh.pp,
                              StageIO((B, T // mesh.dims.cp, H)), mesh.device, placement=kind.placement)
    loss = runner.forward_backward(local)
    mesh.pp.all_reduce(loss)
    grads = {n: mesh.dp_cp.all_reduce(p.grad.clone()) / mesh.dp_cp.size for c in chunks for n, p in c.named_parameters()}
    return {"loss": mesh.dp_cp.all_reduce(loss).item() / mesh.dp_cp.size, "grads": grads}


def _schedules(rank: int, world: int, cfg):
    mesh = Mesh.build(ParallelDims.from_world(world, pp=2, cp=2))
    return {case: _schedule_run(mesh, cfg, *case) for case in SCHEDULE_CASES}


@functools.lru_cache(maxsize=1)
def schedule_results():
    return run_distributed(_schedules, 4, args=(_llama4(),), timeout=1200)


@functools.lru_cache(maxsize=1)
def schedule_reference():
    model = build_model(_llama4(), TPContext(Group.solo("tp")), seed=5)
    loss = sum(model(x, y) for x, y in _batches4()) / M4
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.slow  # the fast tier keeps CP 2 x PP 2 (1F1B, with TP 2 + SP) above; each schedule: test_pipeline_executor
@pytest.mark.parametrize("kind,comm", SCHEDULE_CASES, ids=[f"{k.value}-{c}" for k, c in SCHEDULE_CASES])
def test_cp2_pp2_every_schedule_equals_single_process(kind, comm):
    ref_loss, ref_grads = schedule_reference()
    seen = set()
    for r, per_rank in enumerate(schedule_results()):
        got = per_rank[(kind, comm)]
        assert abs(got["loss"] - ref_loss) <= TOL * ref_loss, f"rank {r}: loss {got['loss']} vs {ref_loss}"
        for n, g in got["grads"].items():
            assert rel(g, ref_grads[n]) <= TOL, f"rank {r}: {n} rel err {rel(g, ref_grads[n]):.2e}"
            seen.add(n)
    assert seen == set(ref_grads)


# --- the ledger of a whole model -----------------------------------------------------------------------------
def _ledger_run(rank: int, world: int, cfg):
    mesh = Mesh.build(ParallelDims.from_world(world, cp=world))
    out = {}
    for recompute in Recompute:
        for comm in CommType:
            model = set_recompute(build_model(cfg, TPContext(mesh.tp), seed=5), recompute)
            set_context_parallel(model, CPContext(mesh.cp, comm))
            runner = LocalForwardBackward(model, mesh.device)
            mesh.ledger.reset()
            runner.forward_backward(TokenSharding(world, mesh.cp.rank).batches(_batches()))
            out[recompute, comm.value] = mesh.ledger.summary()
    return out


@functools.lru_cache(maxsize=1)
def ledger_results():
    return run_distributed(_ledger_run, 2, args=(configs()["llama"],), timeout=900)


def _formula(cp: int) -> dict:
    """Per comm type, (forward, backward) bytes of one step's attention calls on one rank (docs' ledger table)."""
    from hybrid.cp.ring import ring_bytes
    cfg = configs()["llama"]
    tl, d = T // cp, cfg.head_dim
    kv_el = 2 * B * cfg.num_kv_heads * tl * d  # a rank's K and V, fp32
    q_bytes = B * cfg.num_heads * tl * d * 4
    n = cfg.num_layers * M  # attention calls in one step
    fwd, bwd = ring_bytes(kv_el, cp, 4)
    return {"p2p": (n * fwd, n * bwd), "a2a": (n * (2 * q_bytes + kv_el * 4),) * 2,
            "allgather": (n * cp * kv_el * 4,) * 2, "q_bytes": n * q_bytes}


def test_one_step_of_a_model_moves_exactly_the_formula_bytes_over_cp():
    """CP 2, 2 layers, M micro-batches: per layer and micro-batch the attention's bytes (hybrid/cp/ring.py's
    ring_bytes; a2a's four all-to-alls each way; allgather's gather + reduce-scatter), plus the loss's 4-byte token
    count per micro-batch -- and nothing else on the cp group."""
    f = _formula(2)
    for all_modes in ledger_results():
        per_rank = {comm: all_modes[Recompute.NONE, comm] for comm in ("p2p", "a2a", "allgather")}
        for comm, summary in per_rank.items():
            assert summary["all_reduce@cp"] == {"calls": M, "bytes": 4 * M}, comm
        p2p, a2a, ag = per_rank["p2p"], per_rank["a2a"], per_rank["allgather"]
        assert p2p["send@cp"]["bytes"] == p2p["recv@cp"]["bytes"] == sum(f["p2p"])
        assert a2a["all_to_all@cp"]["bytes"] == sum(f["a2a"])
        assert ag["all_gather@cp"]["bytes"] == ag["reduce_scatter@cp"]["bytes"] == f["allgather"][0]
        for comm, want in (("p2p", {"send@cp", "recv@cp"}), ("a2a", {"all_to_all@cp"}),
                           ("allgather", {"all_gather@cp", "reduce_scatter@cp"})):
            assert {k for k in per_rank[comm] if k.endswith("@cp")} == want | {"all_reduce@cp"}, comm


@pytest.mark.parametrize("recompute", [r for r in Recompute if r is not Recompute.NONE], ids=lambda r: r.value)
def test_recomputation_reruns_exactly_the_forward_transfers_over_cp(recompute):
    """Each recomputation mode reruns the CP attention's forward in backward (the CP paths are autograd Functions
    and collectives, which op-level recomputation cannot keep either), so a step moves the forward's bytes once
    more -- except Ulysses under selective recomputation: torch's checkpoint stops the rerun once the tensors
    backward needs are rebuilt, before the output's all-to-all (3 of the 4 forward all-to-alls rerun)."""
    f = _formula(2)
    rerun = {"p2p": f["p2p"][0], "allgather": f["allgather"][0],
             "a2a": f["a2a"][0] - (f["q_bytes"] if recompute is Recompute.SELECTIVE else 0)}
    for all_modes in ledger_results():
        got = all_modes[recompute, "p2p"]
        assert got["send@cp"]["bytes"] == got["recv@cp"]["bytes"] == sum(f["p2p"]) + rerun["p2p"]
        assert all_modes[recompute, "a2a"]["all_to_all@cp"]["bytes"] == sum(f["a2a"]) + rerun["a2a"]
        got = all_modes[recompute, "allgather"]
        assert got["all_gather@cp"]["bytes"] == f["allgather"][0] + rerun["allgather"]
        assert got["reduce_scatter@cp"]["bytes"] == f["allgather"][1]
        assert got["all_reduce@cp"] == {"calls": M, "bytes": 4 * M}
