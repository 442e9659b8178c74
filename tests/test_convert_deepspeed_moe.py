"""`hybrid convert` of DeepSpeed-MoE checkpoints (deepspeed.moe.layer.MoE saved by engine.save_checkpoint: the
experts in their own `layer_<i>_expert_<e>_mp_rank_00_model_states.pt` files) into hybrid's Mixtral.

The slow tests use DeepSpeed's own save path (DeepSpeed 0.19.8 on CPU, 2 gloo ranks, one AdamW step, saved at
expert-parallel size 1 without ZeRO and at 2 under ZeRO-1): every expert of the converted checkpoint equals the DeepSpeed module's tensor bit for
bit, at a pre-sharded tp 2 x pp 2 cut and loaded at EP 2 x TP 2 (ZeRO 1) and EP 4 (ZeRO 3); our logits equal the
DeepSpeed engine's. The fast tests write the files with the key layout DeepSpeed's save code produces (cited at
`write_ds_moe`) to check what is refused, one line each, nothing run and nothing written.

The loading ranks do not import transformers (~1.2 s of CPU a rank): the config is made here, in the test process,
and passed without the transformers config object it was read from (Mixtral's default RoPE is computed without it,
ModelConfig.rope_inv_freq); DeepSpeed's saving ranks run transformers' model, as they must."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys

import pytest
import torch
from safetensors.torch import load_file

from hybrid.checkpoint import core
from hybrid.cli import main as hybrid_main
from hybrid.convert import hybrid_to_hf
from hybrid.convert.verify import load_ours
from hybrid.mesh import ParallelDims
from hybrid.moe.config import MoEConfig
from hybrid.moe.layer import ExpertContext
from hybrid.moe.parallel import build_mesh
from hybrid.testing import launch, python_main, run_distributed
from hybrid.testing_inputs import OneLine
from hybrid.tp import TPContext
from hybrid.train_step import OptimizerConfig
from hybrid.zero import ZeroConfig, ZeroOptimizer
from models import build_pipeline_chunks, from_hf
from models.hf_io import export_hf_state_dict
from moe_reference import hf_config

LAYERS, E, H, F = 2, 4, 32, 48  # moe_reference's tiny Mixtral: 2 layers, 4 experts of width 48, top-2
IDS = (torch.arange(16).view(1, 16) * 3) % 64  # the batch both sides' logits are taken on

# --- DeepSpeed's own save path ----------------------------------------------------------------------------------
DS_MOE_SAVE = """
import os, sys
os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch, deepspeed
from torch import nn
from deepspeed.moe.layer import MoE
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
from deepspeed.utils import groups
from transformers import AutoConfig, AutoModelForCausalLM


class Expert(nn.Module):  # Mixtral's expert block: w2(silu(w1 x) * w3 x)
    def __init__(self, h, f):
        super().__init__()
        self.w1, self.w3 = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
        self.w2 = nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class Block(MoE):  # in place of the decoder layer's mlp, which returns the hidden states alone
    def forward(self, x):
        return super().forward(x)[0]


cfg_dir, out = sys.argv[1], sys.argv[2]
deepspeed.init_distributed(dist_backend="gloo")
rank = torch.distributed.get_rank()
for ep in (1, 2):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cfg_dir), dtype=torch.float32)
    cfg = model.config
    for layer in model.model.layers:
        layer.mlp = Block(cfg.hidden_size, Expert(cfg.hidden_size, cfg.intermediate_size), cfg.num_local_experts,
                          ep_size=ep, k=cfg.num_experts_per_tok, drop_tokens=False, use_rts=False,
                          top2_2nd_expert_sampling=False)
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1}
    params = model.parameters()
    if ep == 2:  # ZeRO-1 with the experts in their own groups, as DeepSpeed's MoE tutorial sets it up
        ds |= {"zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True}
        params = split_params_into_different_moe_groups_for_optimizer({"params": list(params), "name": "all"})
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(params, lr=1e-2), config=ds)
    live = {}
    for L, layer in enumerate(model.model.layers):  # (the expert groups exist once the engine is built)
        ep_rank = groups._get_expert_parallel_rank(layer.mlp.expert_group_name)
        for i, expert in enumerate(layer.mlp.deepspeed_moe.experts.deepspeed_experts):
            g = ep_rank * layer.mlp.num_local_experts + i  # DeepSpeed's global expert number
            gen = torch.Generator().manual_seed(100 * L + g)  # distinct experts (MoE deep-copies one)
            for name, p in expert.named_parameters():
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
                live[(L, g, name)] = p
    ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(2 + rank))
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
    engine.save_checkpoint(os.path.join(out, f"ep{ep}"))
    engine.eval()
    with torch.no_grad():
        logits = engine(input_ids=(torch.arange(16).view(1, 16) * 3) % 64).logits
    torch.save({"logits": logits, "experts": {k: p.detach().clone() for k, p in live.items()},
                "module": {k: t.clone() for k, t in engine.module.state_dict().items()
                           if "deepspeed_experts" not in k}},
               os.path.join(out, f"reference_ep{ep}_rank{rank}.pt"))
"""


@pytest.fixture(scope="module")
def ds_saved(tmp_path_factory):
    """DeepSpeed-MoE checkpoints of one trained tiny Mixtral at EP 1 and EP 2, converted (pre-sharded for tp 2 x
    pp 2) and exported back to transformers; each with DeepSpeed's logits and live expert tensors."""
    root = tmp_path_factory.mktemp("ds-moe")
    hf_config("mixtral", LAYERS).save_pretrained(root / "cfg")
    (root / "save.py").write_text(DS_MOE_SAVE)
    runs = launch([str(root / "save.py"), str(root / "cfg"), str(root)], 2, entry=python_main, timeout=600,
                  env={"OMP_NUM_THREADS": "1"})
    assert all(r.returncode == 0 for r in runs), "".join(r.stderr for r in runs)[-3000:]
    out = {}
    for ep in (1, 2):
        hybrid_main(["convert", str(root / f"ep{ep}"), str(root / f"ckpt{ep}"), "--model", str(root / "cfg"),
                     "--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "2"])
        hybrid_to_hf(str(root / f"ckpt{ep}"), str(root / f"back{ep}"), log=lambda s: None)
        refs = [torch.load(root / f"reference_ep{ep}_rank{r}.pt", weights_only=True) for r in range(2)]
        experts = {f"model.layers.{L}.block_sparse_moe.experts.{g}.{n.removesuffix('.weight')}.weight": t
                   for ref in refs for (L, g, n), t in ref["experts"].items()}
        out[ep] = dict(refs=refs, experts=experts)
    return root, out


@pytest.mark.slow
@pytest.mark.parametrize("ep", [1, 2])
def test_a_deepspeed_moe_checkpoint_converts_every_expert_bit_for_bit_with_deepspeeds_logits(ds_saved, ep):
    """Saved by DeepSpeed at EP `ep` (EP 2, under ZeRO-1: each rank wrote its two experts per layer, numbered
    globally):
    the export of the converted checkpoint holds every expert of every layer equal to the DeepSpeed module's
    tensor, and every other tensor equal to the module's (the gate as Mixtral's router); our model's logits on
    the converted checkpoint (cut for tp 2 x pp 2, read at tp 1) equal the DeepSpeed engine's."""
    root, out = ds_saved
    files = sorted(n for n in os.listdir(root / f"ep{ep}" / "global_step1") if n.startswith("layer_"))
    assert files == sorted(f"layer_{i}_expert_{e}_mp_rank_00_model_states.pt" for i in range(LAYERS) for e in range(E))
    back = load_file(root / f"back{ep}" / "model.safetensors")
    experts = out[ep]["experts"]
    assert len(experts) == LAYERS * E * 3 and {k for k in back if ".experts." in k} == set(experts)
    assert [k for k in experts if not torch.equal(back[k], experts[k])] == []
    assert not torch.equal(experts["model.layers.0.block_sparse_moe.experts.0.w1.weight"],
                           experts["model.layers.0.block_sparse_moe.experts.1.w1.weight"])  # the experts differ
    module = out[ep]["refs"][0]["module"]
    renamed = {k.replace("mlp.deepspeed_moe.gate.wg", "block_sparse_moe.gate"): t for k, t in module.items()}
    assert set(back) == set(renamed) | set(experts)
    assert [k for k in renamed if not torch.equal(back[k], renamed[k])] == []
    cfg = from_hf(hf_config("mixtral", LAYERS))
    with torch.no_grad():
        ours = load_ours(cfg, str(root / f"ckpt{ep}" / "iter_0000000"))(IDS)
    for ref in out[ep]["refs"]:  # fp32 on both sides, the same weights: only the order of operations differs
        assert (ours - ref["logits"]).abs().max() <= 1e-5 * ref["logits"].abs().max()


def _load_at(rank, world, it_dir, cfg, tp, ep, zero):
    mesh = build_mesh(ParallelDims.from_world(world, tp=tp), ep)
    chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp, sequence_parallel=tp > 1), 0, 1, seed=None,
                                   moe=ExpertContext(MoEConfig(expert_parallel=ep), mesh.ep))
    opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=zero), OptimizerConfig())
    core.load(opt, core.param_names(chunks), None, it_dir, optim=False, rng_too=False)
    with opt.gathered():
        return {k: t.clone() for k, t in export_hf_state_dict(chunks[0], mesh.tp).items() if ".experts." in k}


def _loads(rank, world, it_dir, cfg):
    out = {(tp, ep, zero): _load_at(rank, world, it_dir, cfg, tp, ep, zero) for tp, ep, zero in ((2, 2, 1), (1, 4, 3))}
    assert "transformers" not in sys.modules, "a rank imported transformers (the module doc)"
    return out


@pytest.mark.slow
def test_the_converted_deepspeed_moe_checkpoint_loads_at_expert_parallel_layouts_bit_for_bit(ds_saved):
    """The EP-2 save, converted, loaded by 4 gloo ranks at EP 2 x TP 2 (ZeRO 1) and EP 4 (ZeRO 3): each rank's
    experts equal DeepSpeed's tensors, and together the ranks hold every expert."""
    root, out = ds_saved
    cfg = dataclasses.replace(from_hf(hf_config("mixtral", LAYERS)), hf_config=None)
    per_rank = run_distributed(_loads, 4, args=(str(root / "ckpt2" / "iter_0000000"), cfg), timeout=900)
    experts = out[2]["experts"]
    for layout in per_rank[0]:
        seen = set()
        for r in per_rank:
            assert [k for k, t in r[layout].items() if not torch.equal(t, experts[k])] == [], layout
            seen |= set(r[layout])
        assert seen == set(experts), layout


# --- the files as DeepSpeed's save code lays them out -------------------------------------------------------------
class Payload:
    """Unpickling this calls open(marker, "w"): the marker's existence proves the pickle ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _weights(seed: int = 0) -> dict:
    """Random tensors of moe_reference's tiny Mixtral: the non-expert ones under transformers' names, the gates,
    and each (layer, expert, name) of the SwiGLU experts."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    dense = {"model.embed_tokens.weight": r(64, H), "model.norm.weight": r(H), "lm_head.weight": r(64, H)}
    for L in range(LAYERS):
        for n, s in (("self_attn.q_proj", (H, H)), ("self_attn.k_proj", (16, H)), ("self_attn.v_proj", (16, H)),
                     ("self_attn.o_proj", (H, H)), ("input_layernorm", (H,)), ("post_attention_layernorm", (H,))):
            dense[f"model.layers.{L}.{n}.weight"] = r(*s)
    gates = {L: r(E, H) for L in range(LAYERS)}
    experts = {(L, e, n): r(*((H, F) if n == "w2" else (F, H))) for L in range(LAYERS) for e in range(E)
               for n in ("w1", "w3", "w2")}
    return dense, gates, experts


def write_ds_moe(root, dtype=torch.float32, module_extra=None, expert_extra=None, names=("w1", "w3", "w2"),
                 skip=(), main_extra=None, dense_layers=(), prefix="model.layers.{L}.mlp.") -> str:
    """A DeepSpeed-MoE checkpoint folder laid out as DeepSpeed 0.19.8's engine writes it
    (deepspeed/runtime/engine.py): `latest` + global_step1/; `mp_rank_00_model_states.pt` holding "module" = the
    module's state dict without the expert tensors (`_get_non_moe_state_dict`, L4984-5015: every key of an MoE
    module containing 'expert' except `moe.gate.wg.weight` is removed) beside `_common_checkpoint_state`'s fields
    (L5017-5038) and `state['num_experts']` (L5327); and per MoE layer i and global expert e the file
    `layer_{i}_expert_{e}_mp_rank_00_model_states.pt` (`_get_expert_ckpt_name`, L4368-4381) holding that expert's
    tensors under `<P>.deepspeed_moe.experts.deepspeed_experts.<e>.<name>` (`_save_moe_checkpoint` renames the
    local id to ep_rank * num_local_experts + local, L5104-5123). `dense_layers` keep a Llama MLP instead of
    the MoE block (DeepSpeed-MoE models often put experts in every other layer). Returns SRC."""
    dense, gates, experts = _weights()
    src = os.path.join(root, "ds")
    tag = os.path.join(src, "global_step1")
    os.makedirs(tag)
    with open(os.path.join(src, "latest"), "w") as f:
        f.write("global_step1")
    module = dict(dense)
    moe = [L for L in range(LAYERS) if L not in dense_layers]
    for L in range(LAYERS):
        if L in moe:
            module[prefix.format(L=L) + "deepspeed_moe.gate.wg.weight"] = gates[L]
        else:
            module |= {f"model.layers.{L}.mlp.{n}.weight": experts[(L, 0, w)]
                       for n, w in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2"))}
    module.update(module_extra or {})
    module = {k: v.to(dtype) for k, v in module.items()}
    main = {"module": module, "buffer_names": [], "optimizer": None, "param_shapes": None, "lr_scheduler": None,
            "global_steps": 1, "dp_world_size": 2, "mp_world_size": 1, "ds_config": {}, "ds_version": "0.19.8",
            "num_experts": [E] * len(moe), "ds_autoep_layers": None, **(main_extra or {})}
    torch.save(main, os.path.join(tag, "mp_rank_00_model_states.pt"))
    for i, L in enumerate(moe):
        for e in range(E):
            if (L, e) in skip:
                continue
            head = prefix.format(L=L) + f"deepspeed_moe.experts.deepspeed_experts.{e}."
            sd = {head + f"{new}.weight": experts[(L, e, old)].to(dtype)
                  for old, new in zip(("w1", "w3", "w2"), names)}
            sd.update(expert_extra(L, e, head) if expert_extra else {})
            torch.save(sd, os.path.join(tag, f"layer_{i}_expert_{e}_mp_rank_00_model_states.pt"))
    return src


def tree(root) -> dict[str, str]:
    return {os.path.relpath(os.path.join(d, n), root): hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest()
            for d, _, files in os.walk(root) for n in files}


def one_line_error(argv, capsys) -> str:
    """`hybrid ARGV` ends with one line (hybrid.testing_inputs.OneLine), DeepSpeed's own import warnings aside."""
    return OneLine(capsys)(lambda: hybrid_main(argv), ignore=("[WARNING]",))


def test_hand_laid_files_convert_with_llama_expert_names_and_bf16_weights_as_saved(tmp_path, capsys):
    """Experts named as a Llama MLP (gate_proj / up_proj / down_proj), bf16 weights: every expert of the export
    is the written tensor (bf16 -> fp32 is exact), under Mixtral's w1 / w3 / w2; the log line says what was read."""
    src = write_ds_moe(str(tmp_path), dtype=torch.bfloat16, names=("gate_proj", "up_proj", "down_proj"))
    cfg = tmp_path / "cfg"
    hf_config("mixtral", LAYERS).save_pretrained(cfg)
    hybrid_main(["convert", src, str(tmp_path / "ckpt"), "--model", str(cfg)])
    assert "(DeepSpeed-MoE checkpoint of mixtral: 2 MoE layers x 4 experts from 8 expert files, bfloat16 weights as " \
           "saved)" in capsys.readouterr().out
    hybrid_to_hf(str(tmp_path / "ckpt"), str(tmp_path / "back"), log=lambda s: None)
    back = load_file(tmp_path / "back" / "model.safetensors")
    dense, gates, experts = _weights()
    want = {f"model.layers.{L}.block_sparse_moe.experts.{e}.{n}.weight": t.to(torch.bfloat16).float()
            for (L, e, n), t in experts.items()}
    want |= {f"model.layers.{L}.block_sparse_moe.gate.weight": t.to(torch.bfloat16).float() for L, t in gates.items()}
    want |= {k: t.to(torch.bfloat16).float() for k, t in dense.items()}
    assert set(back) == set(want) and [k for k in want if not torch.equal(back[k], want[k])] == []


def _bias(L, e, head):
    return {head + "w1.bias": torch.zeros(F)}


def _gelu_biases(L, e, head):
    return {head + "dense_h_to_4h.bias": torch.zeros(F), head + "dense_4h_to_h.bias": torch.zeros(H)}


REFUSED = {  # case -> (write_ds_moe arguments, the --model config's changes, what the one line must say)
    "residual-moe": (dict(module_extra={f"model.layers.{L}.mlp.{n}": torch.zeros(s) for L in range(LAYERS)
                                        for n, s in (("coefficient.weight", (2, H)), ("coefficient.bias", (2,)))}),
                     {}, "model.layers.0.mlp.coefficient.weight is a residual MoE's (use_residual=True"),
    "expert-with-bias": (dict(expert_extra=_bias), {},
                         "layer_0_expert_0_mp_rank_00_model_states.pt: the expert has parameters w1.bias, w1.weight, "
                         "w2.weight, w3.weight; hybrid's experts are bias-free SwiGLUs"),
    "megatron-gelu-expert": (dict(names=("dense_h_to_4h", "dense_4h_to_h"), expert_extra=_gelu_biases), {},
                             "the expert has parameters dense_4h_to_h.bias, dense_4h_to_h.weight, dense_h_to_4h.bias, "
                             "dense_h_to_4h.weight; hybrid's experts are bias-free SwiGLUs"),
    "missing-expert-file": (dict(skip={(1, 2)}), {},
                            "layer_1_expert_2_mp_rank_00_model_states.pt: missing; DeepSpeed writes one file per "
                            "expert of each MoE layer (expert 2 of layer 1)"),
    "top-1": ({}, dict(num_experts_per_tok=1), "--model has num_experts_per_tok 1: DeepSpeed's top-1 gate"),
    "fewer-experts": ({}, dict(num_local_experts=2), "num_experts [4, 4] per MoE layer, but --model has 2 experts"),
    "dense-layer": (dict(dense_layers=(1,)), {},
                    "layer 1 has no DeepSpeed MoE block, but Mixtral (--model) has experts in every layer"),
    "autoep": (dict(main_extra={"ds_autoep_layers": [{"moe_layer_id": 0}]}), {},
               "holds DeepSpeed AutoEP layers (ds_autoep_layers), which are not imported"),
    "stray-tensor": (dict(module_extra={"model.layers.0.mlp.dense.weight": torch.zeros(2)}), {},
                     "model.layers.0.mlp.dense.weight is inside MoE block model.layers.0.mlp but is neither its gate"),
    "extra-tensor": (dict(module_extra={"model.extra_head.weight": torch.zeros(2)}), {},
                     "holds 'model.extra_head.weight', which the mixtral model --model describes has no place for"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_does_not_map_onto_mixtral_is_refused_by_name_in_one_line(tmp_path, monkeypatch, capsys, case):
    kw, model_changes, want = REFUSED[case]
    src = write_ds_moe(str(tmp_path), **kw)
    cfg = hf_config("mixtral", LAYERS)
    for field, value in model_changes.items():
        setattr(cfg, field, value)
    cfg.save_pretrained(tmp_path / "cfg")
    monkeypatch.chdir(tmp_path)
    before = tree(src)
    line = one_line_error(["convert", src, str(tmp_path / "out"), "--model", str(tmp_path / "cfg")], capsys)
    assert want in line, line
    assert tree(src) == before and not os.path.exists(tmp_path / "out")
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".out.tmp")]


@pytest.mark.parametrize("case", ["mp-rank-1", "zero-3", "old-layout", "qwen2_moe", "extra-expert-file"])
def test_other_layouts_and_models_are_refused_by_name_in_one_line(tmp_path, monkeypatch, capsys, case):
    """Tensor-parallel saves (mp_rank_01), a ZeRO-3 partition file, the pre-0.6 `expert_<e>_mp_rank_XX` layout, a
    Qwen2-MoE --model (its shared expert has no DeepSpeed-MoE counterpart) and an expert file for an expert the
    model does not have."""
    src = write_ds_moe(str(tmp_path))
    tag = os.path.join(src, "global_step1")
    one = os.path.join(tag, "layer_0_expert_0_mp_rank_00_model_states.pt")
    extra = {"mp-rank-1": "layer_0_expert_0_mp_rank_01_model_states.pt",
             "zero-3": "zero_pp_rank_0_mp_rank_00_model_states.pt",
             "old-layout": "expert_0_mp_rank_00_model_states.pt",
             "extra-expert-file": "layer_0_expert_4_mp_rank_00_model_states.pt"}.get(case)
    if extra:
        with open(one, "rb") as f, open(os.path.join(tag, extra), "wb") as g:
            g.write(f.read())
    hf_config("qwen2_moe" if case == "qwen2_moe" else "mixtral", LAYERS).save_pretrained(tmp_path / "cfg")
    monkeypatch.chdir(tmp_path)
    line = one_line_error(["convert", src, str(tmp_path / "out"), "--model", str(tmp_path / "cfg")], capsys)
    want = {"mp-rank-1": "layer_0_expert_0_mp_rank_01_model_states.pt: saved with tensor (model) parallelism > 1",
            "zero-3": "zero_pp_rank_0_mp_rank_00_model_states.pt: a ZeRO-3 save of a DeepSpeed-MoE model",
            "old-layout": "expert_0_mp_rank_00_model_states.pt: the pre-0.6 DeepSpeed-MoE layout",
            "qwen2_moe": "--model is a qwen2_moe model and SRC a DeepSpeed-MoE checkpoint: its experts import into a "
                         "Mixtral config only (its shared expert has no DeepSpeed-MoE counterpart)",
            "extra-expert-file": "layer_0_expert_4_mp_rank_00_model_states.pt: an expert file for an MoE layer or "
                                 "expert the module states do not have"}[case]
    assert want in line, line
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("where", ["expert", "module_states"])
def test_a_pickle_payload_in_a_deepspeed_moe_file_is_refused_and_never_run(tmp_path, monkeypatch, capsys, where):
    """A pickle that would call open() when unpickled, planted in an expert file (or the module states): read
    with torch.load(weights_only=True) under DeepSpeed's allow-list, it is one line naming the file, the marker
    is never created and nothing is written."""
    marker = str(tmp_path / "PAYLOAD_RAN")
    if where == "expert":
        src = write_ds_moe(str(tmp_path), expert_extra=lambda L, e, head: {"note": Payload(marker)} if (L, e) == (1, 3)
                           else {})
        name = "layer_1_expert_3_mp_rank_00_model_states.pt"
    else:
        src = write_ds_moe(str(tmp_path), main_extra={"args": Payload(marker)})
        name = "mp_rank_00_model_states.pt"
    hf_config("mixtral", LAYERS).save_pretrained(tmp_path / "cfg")
    monkeypatch.chdir(tmp_path)
    before = tree(src)
    line = one_line_error(["convert", src, str(tmp_path / "out"), "--model", str(tmp_path / "cfg")], capsys)
    assert f"{name}: holds io.open, which a DeepSpeed-MoE checkpoint's allow-list does not admit" in line, line
    assert "refused, nothing in it was run" in line
    assert not os.path.exists(marker) and tree(src) == before and not os.path.exists(tmp_path / "out")
