"""`hybrid convert` and `hybrid generate` with Mixtral and Qwen2-MoE: transformers -> hybrid (pre-sharded for tp 2 x
pp 2) -> transformers gives back every tensor bit for bit, every expert's included; the converted checkpoint loads
at an expert-parallel layout (EP 2 folded over TP 2 x DP 2, and EP 4) bit for bit; greedy decoding equals
transformers' generate.

The ranks do not import transformers (~1.2 s of CPU a rank): the configs are made here, in the test process, and
passed without the transformers config object they were read from (these models' default RoPE is computed without
it, ModelConfig.rope_inv_freq)."""

from __future__ import annotations

import dataclasses
import os
import sys

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


def _load_at(rank, world, root, cfg, kind, tp, ep, zero):
    mesh = build_mesh(ParallelDims.from_world(world, tp=tp), ep)
    chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp, sequence_parallel=tp > 1), 0, 1, seed=None,
                                   moe=ExpertContext(MoEConfig(expert_parallel=ep), mesh.ep))
    opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=zero), OptimizerConfig())
    it_dir = os.path.join(root, f"{kind}-hybrid", "iter_0000000")
    core.load(opt, core.param_names(chunks), None, it_dir, optim=False, rng_too=False)
    with opt.gathered():
        return {k: t.clone() for k, t in export_hf_state_dict(chunks[0], mesh.tp).items()}


def _loads(rank, world, root, cfgs):
    out = {(kind, tp, ep, zero): _load_at(rank, world, root, cfgs[kind], kind, tp, ep, zero)
           for kind in KINDS for tp, ep, zero in ((2, 2, 1), (1, 4, 3))}
    assert "transformers" not in sys.modules, "a rank imported transformers (the module doc)"
    return out


def test_converted_checkpoint_loads_at_expert_parallel_layouts_bit_for_bit(converted):
    """Each rank holds its experts (EP 2 over TP 2 x DP 2 at ZeRO 1; EP 4 over DP 4 at ZeRO 3): each equals the
    transformers tensor, and together the ranks hold every expert."""
    root = converted["mixtral"][0]
    cfgs = {kind: dataclasses.replace(from_hf(hf_config(kind, 4)), hf_config=None) for kind in KINDS}
    per_rank = run_distributed(_loads, 4, args=(str(root), cfgs), timeout=900)
    for key in per_rank[0]:
        kind = key[0]
        original = load_file(os.path.join(root, kind, "model.safetensors"))
        seen = set()
        for r in per_rank:
            for name, t in r[key].items():
                assert torch.equal(t, original[name]), (key, name)
                seen.add(name)
        assert seen == set(original), key


# --- DeepSpeed ZeRO checkpoints of transformers' MoE models ------------------------------------------------------
DS_MOE_RUN = """
import os, sys
os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3], RANK="0", WORLD_SIZE="1",
                  LOCAL_RANK="0")
import torch, deepspeed
from transformers import AutoConfig, AutoModelForCausalLM
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[1]), dtype=torch.float32)
deepspeed.init_distributed(dist_backend="gloo")
ds = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}, "zero_allow_untested_optimizer": True}
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2), config=ds)
ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(2))
engine.backward(engine(input_ids=ids, labels=ids).loss)
engine.step()
engine.save_checkpoint(sys.argv[2])
with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None):
    engine.module.save_pretrained(os.path.join(sys.argv[2], "reference"))  # transformers' own per-expert keys
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_deepspeed_zero3_checkpoint_of_an_moe_model_converts_every_expert(tmp_path, kind):
    """A ZeRO-3 DeepSpeed checkpoint (DeepSpeed on CPU, one gloo rank, one AdamW step) of a tiny transformers
    Mixtral / Qwen2-MoE, whose live modules hold each layer's experts fused ((E, 2f, h) gate_up_proj): `hybrid
    convert --model` splits them per expert (models/hf_io.per_expert_state_dict), and converting back out gives
    every tensor of what transformers' save_pretrained writes for the trained model bit for bit -- every expert
    of every layer compared, none dropped."""
    from hybrid.testing import free_port, run
    cfg_dir = str(tmp_path / "cfg")
    hf_config(kind, 4).save_pretrained(cfg_dir)
    (tmp_path / "make.py").write_text(DS_MOE_RUN)
    p = run([str(tmp_path / "make.py"), cfg_dir, str(tmp_path / "ds"), str(free_port())],
            env={"OMP_NUM_THREADS": "1"}, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    hybrid_main(["convert", str(tmp_path / "ds"), str(tmp_path / "ckpt"), "--model", cfg_dir])
    hybrid_to_hf(str(tmp_path / "ckpt"), str(tmp_path / "back"), log=lambda s: None)
    reference = load_file(os.path.join(tmp_path, "ds", "reference", "model.safetensors"))
    back = load_file(os.path.join(tmp_path, "back", "model.safetensors"))
    assert set(back) == set(reference)
    assert sum(".experts." in k for k in reference) == (4 * 4 if kind == "mixtral" else 3 * 8) * 3
    assert [k for k in reference if not torch.equal(back[k], reference[k])] == []
