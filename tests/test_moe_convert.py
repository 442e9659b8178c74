"""`hybrid convert` and `hybrid generate` with Mixtral and Qwen2-MoE: transformers -> hybrid (pre-sharded for tp 2 x
pp 2) -> transformers gives back every tensor bit for bit, every expert's included; the converted checkpoint loads
at an expert-parallel layout (EP 2 folded over TP 2 x DP 2, and EP 4) bit for bit; greedy decoding equals
transformers' generate."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from hybrid.checkpoint import core
from hybrid.cli import main as hybrid_main
from hybrid.convert import hf_to_hybrid, hybrid_to_hf
from hybrid.convert.presharded import TargetLayout
from hybrid.mesh import Mesh, ParallelDims
from hybrid.moe.config import MoEConfig
from hybrid.moe.layer import ExpertContext
from hybrid.moe.parallel import build_mesh
from hybrid.testing import run_distributed
from hybrid.tp import TPContext
from hybrid.train_step import OptimizerConfig
from hybrid.zero import ZeroConfig, ZeroOptimizer
from models import build_pipeline_chunks, from_hf
from models.hf_io import export_hf_state_dict
from moe_reference import hf_config, hf_model

KINDS = ("mixtral", "qwen2_moe")
PROMPT, NEW = [1, 2, 3, 4], 6


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe-convert")
    out = {}
    for kind in KINDS:
        hf = hf_model(kind, 4, seed=7)
        hf.save_pretrained(root / kind)
        hf_to_hybrid(str(root / kind), str(root / f"{kind}-hybrid"), target=TargetLayout(tp=2, pp=2), log=lambda s: None)
        hybrid_to_hf(str(root / f"{kind}-hybrid"), str(root / f"{kind}-back"), log=lambda s: None)
        greedy = hf.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False)[0, len(PROMPT):].tolist()
        out[kind] = (root, greedy)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_convert_in_and_out_gives_every_tensor_back_bit_for_bit(converted, kind):
    root, _ = converted[kind]
    original = load_file(os.path.join(root, kind, "model.safetensors"))
    back = load_file(os.path.join(root, f"{kind}-back", "model.safetensors"))
    assert set(back) == set(original)  # every expert, every projection: none dropped, none added
    moe_layers, experts = (4, 4) if kind == "mixtral" else (3, 8)  # qwen2_moe: layer 1 is dense (mlp_only_layers)
    assert sum(".experts." in k for k in original) == moe_layers * experts * 3
    assert all(torch.equal(back[k], original[k]) for k in original)


@pytest.mark.parametrize("kind", KINDS)
def test_generate_equals_transformers(converted, kind, capsys):
    """hybrid generate from the converted checkpoint (cut for tp 2 x pp 2, read at tp 1) and from the folder."""
    root, want = converted[kind]
    for src in (root / f"{kind}-hybrid", root / kind):
        capsys.readouterr()
        hybrid_main(["generate", str(src), "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", str(NEW)])
        assert capsys.readouterr().out.splitlines()[0] == \
            f"generate: {NEW} new tokens (greedy): {','.join(map(str, want))}", src


def _load_at(rank, world, root, kind, tp, ep, zero):
    cfg = from_hf(hf_config(kind, 4))
    mesh = build_mesh(ParallelDims.from_world(world, tp=tp), ep)
    chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp, sequence_parallel=tp > 1), 0, 1, seed=None,
                                   moe=ExpertContext(MoEConfig(expert_parallel=ep), mesh.ep))
    opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=zero), OptimizerConfig())
    it_dir = os.path.join(root, f"{kind}-hybrid", "iter_0000000")
    core.load(opt, core.param_names(chunks), None, it_dir, optim=False, rng_too=False)
    with opt.gathered():
        return {k: t.clone() for k, t in export_hf_state_dict(chunks[0], mesh.tp).items()}


def _loads(rank, world, root):
    return {(kind, tp, ep, zero): _load_at(rank, world, root, kind, tp, ep, zero)
            for kind in KINDS for tp, ep, zero in ((2, 2, 1), (1, 4, 3))}


def test_converted_checkpoint_loads_at_expert_parallel_layouts_bit_for_bit(converted):
    """Each rank holds its experts (EP 2 over TP 2 x DP 2 at ZeRO 1; EP 4 over DP 4 at ZeRO 3): each equals the
    transformers tensor, and together the ranks hold every expert."""
    root = converted["mixtral"][0]
    per_rank = run_distributed(_loads, 4, args=(str(root),), timeout=900)
    for key in per_rank[0]:
        kind = key[0]
        original = load_file(os.path.join(root, kind, "model.safetensors"))
        seen = set()
        for r in per_rank:
            for name, t in r[key].items():
                assert torch.equal(t, original[name]), (key, name)
                seen.add(name)
        assert seen == set(original), key
