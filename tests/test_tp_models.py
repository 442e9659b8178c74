"""Our models against transformers' own, sharded over tp in {1, 2, 4}, with and without sequence
parallelism: logits, loss and every parameter gradient (gathered to full shape) within 1e-5
relative in fp32. One 4-rank job computes every case; each test checks one case's numbers.

Every config has dropout 0 and both models run in eval mode: a dropout mask is a random draw, and
ours come from the tensor-parallel RNG streams (hybrid/tp/random.py), transformers' from torch's
global generator -- equal masks are not expected (tests/test_dropout.py tests ours)."""

from __future__ import annotations

import dataclasses
import os
import tempfile

import pytest
import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

from hybrid.mesh import Mesh, ParallelDims
from hybrid.testing import run_distributed
from hybrid.tp import TPContext, gather_full, sync_partial_grads
from models import build_model, from_hf, shift_labels
from models.hf_io import export_hf_state_dict, load_hf_checkpoint

RTOL = 1e-5
WORLD = 4
BATCH, SEQ = 2, 16


WINDOW = 5  # sliding window, well below SEQ: a query sees 5 of up to 16 keys


def hf_models():
    """Small random configs; the GPT-2 vocabulary (251) is divisible by no tp > 1, and the Llama-family
    configs have 2 kv-heads, fewer than tp = 4 (kv-heads replicated). mistral-sw windows every layer
    and has head_dim 12 != hidden / heads = 8; qwen2-sw windows layers >= max_window_layers = 1 only
    (layer 0 attends fully); llama-bias has attention and MLP biases and llama3 RoPE scaling."""
    llama = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=80, vocab_size=256, max_position_embeddings=64, attention_dropout=0.0)
    return {
        "gpt2": (GPT2LMHeadModel, GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=251, n_positions=64,
                                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                             bos_token_id=0, eos_token_id=0)),
        "llama": (LlamaForCausalLM, LlamaConfig(**llama, tie_word_embeddings=False)),
        "qwen2": (Qwen2ForCausalLM, Qwen2Config(**llama, tie_word_embeddings=True)),
        "mistral-sw": (MistralForCausalLM, MistralConfig(**llama, sliding_window=WINDOW, head_dim=12)),
        "qwen2-sw": (Qwen2ForCausalLM, Qwen2Config(**llama, use_sliding_window=True, sliding_window=WINDOW,
                                                   max_window_layers=1, tie_word_embeddings=True)),
        "llama-bias": (LlamaForCausalLM, LlamaConfig(**llama, attention_bias=True, mlp_bias=True, rope_parameters={
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8})),
    }


CASES = ([(name, tp, sp) for name in ("gpt2", "llama", "qwen2") for tp in (1, 2, 4) for sp in (False, True)
          if not (tp == 1 and sp)]
         + [(name, tp, False) for name in ("mistral-sw", "qwen2-sw") for tp in (1, 2, 4)]
         + [("mistral-sw", 4, True), ("llama-bias", 1, False), ("llama-bias", 2, True)])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


def _reference(name: str, ckpt_dir: str) -> None:
    """transformers' model (seed 0) saved to `ckpt_dir` with its logits, loss and parameter gradients on the
    fixed batch (ref.pt): computed once here, not on every rank for every case -- every rank built the same
    model from the same seed and ran the same batch, so it is the same reference."""
    cls, hf_cfg = hf_models()[name]
    torch.manual_seed(0)
    hf = cls(hf_cfg)
    hf.save_pretrained(ckpt_dir)
    hf.eval()
    ids = _batch(hf_cfg)
    ref = hf(ids, labels=ids)
    ref.loss.backward()
    torch.save({"logits": ref.logits.detach(), "loss": ref.loss.detach(),
                "grads": {k: p.grad for k, p in hf.named_parameters()}}, os.path.join(ckpt_dir, "ref.pt"))


def _batch(hf_cfg) -> torch.Tensor:
    return torch.randint(0, hf_cfg.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))


def _compare_case(name, tp_size, sp, ckpt_dir, mesh) -> dict:
    _, hf_cfg = hf_models()[name]
    ref = torch.load(os.path.join(ckpt_dir, "ref.pt"))
    ids = _batch(hf_cfg)

    tp = TPContext(mesh.tp, sequence_parallel=sp)
    model = build_model(from_hf(hf_cfg), tp, seed=None).eval()
    with torch.no_grad():  # the load must write every element, vocabulary padding included
        for p in model.parameters():
            p.fill_(float("nan"))
    load_hf_checkpoint(model, ckpt_dir, mesh.tp.rank)
    logits = model(ids)
    loss = model(ids, shift_labels(ids))
    loss.backward()
    sync_partial_grads(model.parameters(), mesh.tp)

    full_logits = gather_full(logits, _vocab_spec(model), mesh.tp)
    grads = export_hf_state_dict(model, mesh.tp, grads=True)
    ref_grads = ref["grads"]
    return {"logits": rel(full_logits, ref["logits"]), "loss": rel(loss.detach(), ref["loss"]),
            "grad_keys": sorted(grads) == sorted(ref_grads),
            "grads": max(rel(grads[k], ref_grads[k]) for k in ref_grads)}


def _vocab_spec(model):
    """The LM head's vocabulary split, along the logits' last dim."""
    head = getattr(model, "lm_head", None) or getattr(model, "wte", None) or model.embed_tokens
    return dataclasses.replace(head.weight.shard, dim=-1)


def _all_cases(rank, world, ckpt_dirs):
    """Every case, on one mesh per tp size (its process groups built once, not once per case: the groups are
    not what the cases vary)."""
    meshes = {}
    results = {}
    for case in CASES:
        tp = case[1]
        if tp not in meshes:
            meshes[tp] = Mesh.build(ParallelDims.from_world(world, tp=tp))
        results[case] = _compare_case(*case, ckpt_dirs[case[0]], meshes[tp])
    return results


@pytest.fixture(scope="module")
def results():
    dirs = {}
    for name in hf_models():
        dirs[name] = tempfile.mkdtemp(prefix=f"hf-{name}-")
        _reference(name, dirs[name])
    per_rank = run_distributed(_all_cases, WORLD, args=(dirs,), timeout=600)
    # every rank computed every case; report the worst
    return {case: {k: (max(r[case][k] for r in per_rank) if k != "grad_keys" else all(r[case][k] for r in per_rank))
                   for k in per_rank[0][case]} for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=[f"{n}-tp{t}{'-sp' if s else ''}" for n, t, s in CASES])
def test_matches_transformers_logits_loss_and_every_gradient(results, case):
    r = results[case]
    assert r["grad_keys"], "exported gradients do not cover exactly transformers' parameters"
    assert r["logits"] <= RTOL, f"logits rel err {r['logits']:.2e}"
    assert r["loss"] <= RTOL, f"loss rel err {r['loss']:.2e}"
    assert r["grads"] <= RTOL, f"worst gradient rel err {r['grads']:.2e}"
