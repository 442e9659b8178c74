"""`hybrid convert`: transformers -> hybrid -> transformers is bit-exact for GPT-2 (tied), Llama (GQA), Mistral
(sliding window, tied) and Qwen2 (qkv bias) with a vocabulary no tp divides; a checkpoint a tp2 x pp2 x dp2
ZeRO-3 train.py run saved exports to a folder transformers loads with our loss; train.py at tp 2 starts from a
converted checkpoint exactly as from the transformers folder; bad input is one line and leaves nothing."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest
import torch
from safetensors.torch import load_file
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

from hybrid import testing
from hybrid.checkpoint import store
from hybrid.cli import main as hybrid_main
from hybrid.convert import hf_to_hybrid, hybrid_to_hf
from hybrid.convert.verify import load_ours
from command_flags import foreign
from convert_ranks import RESAVE, both_checks
from models import shift_labels
from models.config import load_config
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 259  # divisible by neither tp 2 nor tp 4: padded rows inside training, none in any file
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, vocab_size=VOCAB,
             max_position_embeddings=64, bos_token_id=0, eos_token_id=0)
MODELS = {
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=64,
                                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                               eos_token_id=0)),
    "llama-gqa": lambda: LlamaForCausalLM(LlamaConfig(**SMALL, num_key_value_heads=2, tie_word_embeddings=False)),
    "mistral-window-tied": lambda: MistralForCausalLM(MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=8,
                                                                    tie_word_embeddings=True)),
    "qwen2-bias": lambda: Qwen2ForCausalLM(Qwen2Config(**SMALL, num_key_value_heads=1, tie_word_embeddings=False)),
}


def hf_folder(name: str, path: str) -> str:
    """A tiny transformers model with every tensor random (biases and norms too: a dropped or swapped tensor
    cannot pass as its neighbour), saved by save_pretrained."""
    torch.manual_seed(len(name))
    model = MODELS[name]()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    model.save_pretrained(path)
    return path


def tensors(path: str) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, f)))
    return out


def no_litter(parent: str) -> list[str]:
    return [n for n in os.listdir(parent) if ".tmp." in n]


@pytest.mark.parametrize("name", list(MODELS))
def test_round_trip_is_bit_exact_with_the_same_keys(tmp_path, name):
    src = hf_folder(name, str(tmp_path / "hf"))
    (tmp_path / "hf" / "tokenizer_config.json").write_text('{"model_max_length": 64}')  # carried through
    line = hf_to_hybrid(src, str(tmp_path / "ckpt"))
    assert line.startswith("verify: OK")
    # a store of the ckpt layout: latest -> iter_0000000, manifest checks, model-only state
    assert store.read_latest(str(tmp_path / "ckpt")) == 0
    assert store.verify_all(store.final_path(str(tmp_path / "ckpt"), 0)).error is None
    state = store.read_state(store.final_path(str(tmp_path / "ckpt"), 0))
    assert (state["contents"], state["iteration"], state["model"]) == ("model", 0, src)
    shard = 40_000 if name == "llama-gqa" else 5 * 10**9  # llama: several files + index
    assert hybrid_to_hf(str(tmp_path / "ckpt"), str(tmp_path / "out"), max_shard_bytes=shard).startswith("verify: OK")
    a, b = tensors(src), tensors(str(tmp_path / "out"))
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    if name == "llama-gqa":
        with open(tmp_path / "out" / "model.safetensors.index.json") as f:
            index = json.load(f)
        assert sorted(index["weight_map"]) == sorted(a) and len(set(index["weight_map"].values())) > 1
        assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in a.values())
    for carried in ("tokenizer_config.json", "generation_config.json"):
        assert (tmp_path / "out" / carried).read_bytes() == (tmp_path / "hf" / carried).read_bytes()
    assert no_litter(str(tmp_path)) == []


def test_bf16_export_is_the_rounded_weights(tmp_path):
    src = hf_folder("qwen2-bias", str(tmp_path / "hf"))
    hf_to_hybrid(src, str(tmp_path / "ckpt"), verify=False)
    line = hybrid_to_hf(str(tmp_path / "ckpt"), str(tmp_path / "out"), dtype=torch.bfloat16)
    assert line.startswith("verify: OK") and "KL" in line
    a, b = tensors(src), tensors(str(tmp_path / "out"))
    assert all(torch.equal(a[k].to(torch.bfloat16), b[k]) for k in a)
    assert AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).dtype == torch.bfloat16


# --- a real training run -----------------------------------------------------------------------------------
def torchrun(n: int, *flags: str, timeout: int = 240) -> str:
    """`torchrun --standalone --nproc-per-node N scripts/train.py ...`, its ranks forked from hybrid.testing's
    forkserver; the end's validation and test passes on one global batch each (--eval-iters 1, not 10: no check
    here reads them)."""
    p = testing.torchrun(["--micro-batch-size", "1", "--seq-length", "16", "--log-interval", "1", "--eval-iters", "1",
                          *flags], n, env={"OMP_NUM_THREADS": "1"}, cwd=ROOT, timeout=timeout)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    return p.stdout


def losses(out: str) -> list[str]:
    return re.findall(r"iteration +\d+/\d+ \| lm loss (\S+)", out)


@pytest.mark.slow
def test_zero3_tp2_pp2_dp2_checkpoint_exports_with_our_loss(tmp_path):
    """train.py saves after 2 steps at tp 2 x pp 2 x dp 2, ZeRO 3 (the tied embedding on both pipeline ends, 259
    vocabulary rows padded to 260); the export loads in transformers, whose loss on a fixed batch equals the
    loss of our model on the checkpoint's weights (DCP-loaded, tp 1)."""
    src = hf_folder("mistral-window-tied", str(tmp_path / "hf"))
    torchrun(8, "--model", src, "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
             "--zero-stage", "3", "--global-batch-size", "4", "--train-iters", "2", "--lr", "1e-2",
             "--save", str(tmp_path / "run"))
    assert store.read_latest(str(tmp_path / "run")) == 2
    assert hybrid_to_hf(str(tmp_path / "run"), str(tmp_path / "out")).startswith("verify: OK")
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    cfg = load_config(src)
    with torch.no_grad():
        ours = load_ours(cfg, store.final_path(str(tmp_path / "run"), 2))(ids, shift_labels(ids)).item()
        theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))(input_ids=ids, labels=ids).loss.item()
        start = MistralForCausalLM.from_pretrained(src)(input_ids=ids, labels=ids).loss.item()
    assert abs(ours - theirs) <= 1e-5
    assert abs(ours - start) > 1e-3  # the two steps at lr 1e-2 changed the weights: this is the trained model


@pytest.mark.slow
def test_train_py_at_tp2_starts_from_a_converted_checkpoint_as_from_the_folder(tmp_path):
    """The same first losses from --load CONVERTED (the ckpt resume path, DCP resharding 1 -> tp 2) as from
    --load FOLDER (models/hf_io's sliced safetensors reads)."""
    src = hf_folder("llama-gqa", str(tmp_path / "hf"))
    hf_to_hybrid(src, str(tmp_path / "ckpt"), verify=False)
    common = ["--tensor-model-parallel-size", "2", "--global-batch-size", "2", "--train-iters", "2"]
    # no extra flags: a converted checkpoint is weights only, and --model may name the converted folder itself
    resumed = torchrun(2, "--model", str(tmp_path / "ckpt"), *common, "--load", str(tmp_path / "ckpt"))
    assert "checkpoint: resumed from" in resumed and "weights only (a converted checkpoint)" in resumed
    fresh = torchrun(2, "--model", src, *common, "--load", src)
    assert len(losses(resumed)) == 2 and losses(resumed) == losses(fresh)


# --- bad input: one line, nothing written ------------------------------------------------------------------
def _break(kind: str, tmp) -> tuple[list[str], str]:
    """(argv, expected words) of one bad conversion."""
    src = hf_folder("gpt2", str(tmp / "hf"))
    if kind == "wrong-format":
        os.makedirs(tmp / "junk")
        (tmp / "junk" / "weights.bin").write_bytes(b"x")
        return [str(tmp / "junk")], "is not a transformers model folder"
    if kind == "missing-config":
        os.remove(tmp / "hf" / "config.json")
        return [src], "no config.json"
    if kind == "missing-shard":
        hf_to_hybrid(src, str(tmp / "ckpt"), verify=False)
        it = store.final_path(str(tmp / "ckpt"), 0)
        os.remove(os.path.join(it, "__0_0.distcp"))
        return [str(tmp / "ckpt")], "__0_0.distcp: missing"
    if kind == "missing-hf-shard":
        GPT2LMHeadModel.from_pretrained(src).save_pretrained(tmp / "sharded", max_shard_size="50KB")
        shards = sorted(n for n in os.listdir(tmp / "sharded") if n.endswith(".safetensors"))
        os.remove(tmp / "sharded" / shards[-1])
        return [str(tmp / "sharded")], f"the index names missing shard files: {shards[-1]}"
    if kind == "shape-mismatch":
        with open(tmp / "hf" / "config.json") as f:
            cfg = json.load(f)
        cfg["n_inner"] = 64  # the weights have 4 x 32 = 128
        with open(tmp / "hf" / "config.json", "w") as f:
            json.dump(cfg, f)
        return [src], "has shape [32, 128], but config.json implies [32, 64]"
    if kind == "wrong-model":
        hf_to_hybrid(src, str(tmp / "ckpt"), verify=False)
        return [str(tmp / "ckpt"), "--model", "tiny-llama"], "no tensor model/embed_tokens.weight"
    if kind == "unsupported-arch":
        with open(tmp / "hf" / "config.json") as f:
            cfg = json.load(f)
        with open(tmp / "hf" / "config.json", "w") as f:
            json.dump(dict(cfg, model_type="bert"), f)
        return [src], "unsupported model_type 'bert'"
    if kind == "target-tp-heads":
        return [src, "--target-tensor-parallel-size", "3"], "--target-tensor-parallel-size 3 does not divide the 4 " \
                                                            "attention heads"
    if kind == "target-pp-layers":
        return [src, "--target-pipeline-parallel-size", "3"], "--target-pipeline-parallel-size 3 exceeds the 2 layers"
    if kind == "target-ffn":  # the 4 heads split 4 ways, an MLP 42 wide does not
        cfg = GPT2Config.from_pretrained(src)
        cfg.n_inner = 42
        GPT2LMHeadModel(cfg).save_pretrained(src)
        return [src, "--target-tensor-parallel-size", "4"], "(42) not divisible by --target-tensor-parallel-size 4"
    if kind == "target-of-hybrid":
        hf_to_hybrid(src, str(tmp / "ckpt"), verify=False)
        return [str(tmp / "ckpt"), "--target-tensor-parallel-size", "2"], "pre-shards a conversion to hybrid"
    if kind == "dst-not-empty":
        os.makedirs(tmp / "out")
        (tmp / "out" / "keep.txt").write_text("mine")
        return [src], "exists and is not empty"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["wrong-format", "missing-config", "missing-shard", "missing-hf-shard",
                                  "shape-mismatch", "wrong-model", "unsupported-arch", "target-tp-heads",
                                  "target-pp-layers", "target-ffn", "target-of-hybrid", "dst-not-empty"])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, kind):
    argv, words = _break(kind, tmp_path)
    before = (tmp_path / "out" / "keep.txt").read_text() if kind == "dst-not-empty" else None
    with pytest.raises(SystemExit) as e:
        hybrid_main(["convert", argv[0], str(tmp_path / "out"), *argv[1:]])
    msg = str(e.value.code)
    assert msg.startswith("hybrid convert: error: ") and "\n" not in msg and words in msg, msg
    assert foreign(msg, "hybrid convert", argv) == [], msg  # it suggests only flags `hybrid convert` accepts
    if kind == "dst-not-empty":
        assert os.listdir(tmp_path / "out") == ["keep.txt"] and (tmp_path / "out" / "keep.txt").read_text() == before
    else:
        assert not os.path.exists(tmp_path / "out")
    assert no_litter(str(tmp_path)) == []


# --- DeepSpeed -> hybrid -------------------------------------------------------------------------------------
DS_RUN = """
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
ids = torch.randint(0, 259, (1, 16), generator=torch.Generator().manual_seed(2))
engine.backward(engine(input_ids=ids, labels=ids).loss)
engine.step()
engine.save_checkpoint(sys.argv[2])
engine.eval()
with torch.no_grad():
    torch.save(engine(input_ids=ids).logits, os.path.join(sys.argv[2], "logits.pt"))
"""


@pytest.mark.slow
def test_deepspeed_zero3_checkpoint_converts_with_the_deepspeed_models_logits(tmp_path):
    """A ZeRO-3 DeepSpeed checkpoint (DeepSpeed on CPU, one gloo rank, one AdamW step) of a tiny Llama, read by
    DeepSpeed's get_fp32_state_dict_from_zero_checkpoint: our model on the converted checkpoint gives the logits
    the DeepSpeed engine computed."""
    from hybrid.testing import free_port
    cfg_dir = str(tmp_path / "cfg")
    LlamaConfig(**SMALL, num_key_value_heads=2, tie_word_embeddings=False).save_pretrained(cfg_dir)
    (tmp_path / "make.py").write_text(DS_RUN)
    p = testing.run([str(tmp_path / "make.py"), cfg_dir, str(tmp_path / "ds"), str(free_port())],
                    env={"OMP_NUM_THREADS": "1"}, timeout=180)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    with pytest.raises(SystemExit, match="holds no model config; give --model"):
        hybrid_main(["convert", str(tmp_path / "ds"), str(tmp_path / "ckpt")])
    hybrid_main(["convert", str(tmp_path / "ds"), str(tmp_path / "ckpt"), "--model", cfg_dir])
    ids = torch.randint(0, 259, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours = load_ours(load_config(cfg_dir), store.final_path(str(tmp_path / "ckpt"), 0))(ids)
    theirs = torch.load(tmp_path / "ds" / "logits.pt")
    assert (ours - theirs).abs().max().item() <= 1e-5


def test_a_wrong_mapping_fails_the_self_check_and_writes_nothing(tmp_path, monkeypatch):
    """The verification compares against transformers, not against the converter: swapping GPT-2's k and v rows
    (what a wrong c_attn offset would do) is caught, and DST is never created. (A q <-> k swap moves these
    random models' logits by only 7e-7: their attention is nearly uniform. The bit-exact round trip guards it.)"""
    from hybrid.convert import mapping
    src = hf_folder("gpt2", str(tmp_path / "hf"))
    right = mapping.ours_from_hf

    def swapped(p, stored):  # k reads v's rows [64, 96) of c_attn and v reads k's [32, 64)
        swap = {".k_proj.": 64, ".v_proj.": 32}
        for part, offset in swap.items():
            if part in p.name:
                p = mapping.Param(p.name, p.shape, mapping.Source(p.source.key, p.source.transpose, offset))
        return right(p, stored)
    monkeypatch.setattr(mapping, "ours_from_hf", swapped)
    with pytest.raises(SystemExit, match=r"verify: FAILED: logits max-abs \S+, KL"):
        hybrid_main(["convert", src, str(tmp_path / "out")])
    assert not os.path.exists(tmp_path / "out") and no_litter(str(tmp_path)) == []


# --- through other layouts: load the converted checkpoint on a mesh, save it there, export ------------------
def rank_configs(root: str, names) -> dict:
    """name -> the config of the transformers folder root/name, for the ranks (convert_ranks): read here, passed
    without the transformers config object it was read from (unpickling one imports transformers)."""
    return {name: dataclasses.replace(load_config(os.path.join(root, name)), hf_config=None) for name in names}


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory) -> dict:
    """The two 4-rank checks below, their inputs made here and run in one launch (convert_ranks.both_checks:
    one launch's forks, process group and imports, not two): kind -> (its folder, per-rank results). "resave":
    each RESAVE model converted (transformers -> hybrid) and loaded and re-saved at its layout; "target": all four
    models converted pre-sharded for tp 2 x pp 2 (`hybrid convert --target-...`), loaded by a tp2 x pp2 run."""
    from hybrid.testing import case_result, run_distributed
    resave, target = str(tmp_path_factory.mktemp("resave")), str(tmp_path_factory.mktemp("target"))
    for name, _ in RESAVE:
        hf_to_hybrid(hf_folder(name, os.path.join(resave, name)), os.path.join(resave, name + ".ckpt"), verify=False)
    for name in MODELS:
        hybrid_main(["convert", hf_folder(name, os.path.join(target, name)), os.path.join(target, name + ".ckpt"),
                     "--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "2"])
    args = {"resave": (resave, rank_configs(resave, [name for name, _ in RESAVE])),
            "target": (target, TARGET_IDS, rank_configs(target, MODELS))}
    per_rank = run_distributed(both_checks, 4, (args,), timeout=240)
    return {kind: (args[kind][0], lambda kind=kind: case_result(per_rank, (kind,))) for kind in args}


@pytest.mark.slow
def test_round_trip_through_tp_pp_dp_zero_layouts_is_bit_exact(four_ranks):
    """transformers -> hybrid -> (loaded and re-saved at tp1 x pp2 x dp2 ZeRO 3 / tp4, 2 kv-heads replicated /
    tp2 x pp2 ZeRO 1, tied embedding on both stages; vocabulary 259 padded to 260) -> transformers: every
    tensor torch.equal to the original."""
    root, results = four_ranks["resave"]
    results()  # every rank's load and save ran
    for name, _ in RESAVE:
        hybrid_to_hf(os.path.join(root, name + ".resaved"), os.path.join(root, name + ".out"), verify=False)
        a, b = tensors(os.path.join(root, name)), tensors(os.path.join(root, name + ".out"))
        assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a), name


# --- pre-sharded for a layout: --target-tensor-parallel-size 2 --target-pipeline-parallel-size 2 ------------
def _chunk_table(it_dir: str) -> dict:
    """model/NAME -> sorted (offsets, sizes, file) of its stored chunks (DCP's .metadata)."""
    import torch.distributed.checkpoint as dcp
    md = dcp.FileSystemReader(it_dir).read_metadata()
    out = {}
    for key, meta in md.state_dict_metadata.items():
        if key.startswith("model/"):
            files = {i.offset: md.storage_data[i].relative_path for i in md.storage_data if i.fqn == key}
            out[key] = sorted((tuple(c.offsets), tuple(c.sizes), files[c.offsets]) for c in meta.chunks)
    return out


TARGET_IDS = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(4))  # the run's fixed batch


@pytest.mark.slow
def test_presharded_tp2_pp2_is_what_a_run_saves_and_loads_with_transformers_logits(four_ranks):
    """`hybrid convert --target-tensor-parallel-size 2 --target-pipeline-parallel-size 2`, for all four models:
    the chunks in .metadata (box and file, per parameter) are those a tp2 x pp2 run saves; the run loads the
    checkpoint, and its logits on a fixed batch equal transformers' within 1e-5 (fp32; the loss too). Loaded
    elsewhere -- tp 1 by the export -- it reshards: the export is bit-exact."""
    root, results = four_ranks["target"]
    ids = TARGET_IDS
    for name in MODELS:
        saved = store.read_state(store.final_path(os.path.join(root, name + ".ckpt"), 0))["layout"]
        assert saved == {"tp": 2, "pp": 2, "dp": 1, "zero": 0, "v": 1, "stages": [[0], [1]]}
    results = results()
    for name in MODELS:
        ours = _chunk_table(store.final_path(os.path.join(root, name + ".ckpt"), 0))
        run = _chunk_table(store.final_path(os.path.join(root, name + ".run"), 1))
        assert ours == run, name
        assert any(len(c) == 2 for c in ours.values())  # TP-split: one chunk per TP rank, in its own file
        hf = AutoModelForCausalLM.from_pretrained(os.path.join(root, name)).eval()
        with torch.no_grad():
            want = hf(input_ids=ids, labels=ids)
        for rank in (2, 3):  # the last stage's two TP ranks
            logits, loss = results[rank][name]
            assert (logits - want.logits).abs().max().item() <= 1e-5, name
            assert abs(loss - want.loss.item()) <= 1e-5, name
        hybrid_to_hf(os.path.join(root, name + ".ckpt"), os.path.join(root, name + ".out"), verify=False)
        a, b = tensors(os.path.join(root, name)), tensors(os.path.join(root, name + ".out"))
        assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a), name


# --- checked against transformers' own model: a mistake made the same way in and out cannot pass -------------
# Multi-head (no GQA, so q, k and v have one shape and can be confused), weights at std 0.3 and unit norms: the
# attention is far from uniform, so confusing q with k moves the logits by ~10 (the random models above, std 0.05,
# move by 1e-6, inside the fp32 tolerance -- a q <-> k swap passed their self-check).
SENSITIVE = {
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=64,
                                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**SMALL, num_key_value_heads=4, tie_word_embeddings=False)),
    "mistral": lambda: MistralForCausalLM(MistralConfig(**SMALL, num_key_value_heads=4, sliding_window=8,
                                                        tie_word_embeddings=True)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**SMALL, num_key_value_heads=4, tie_word_embeddings=False)),
}
# our parameter names confused with one another -- in both directions, as one wrong table would
MISTAKES = {"q<->k": ("q_proj", "k_proj"), "k<->v": ("k_proj", "v_proj"), "gate<->up": ("gate_proj", "up_proj")}


def sensitive_folder(arch: str, path: str) -> str:
    torch.manual_seed(7)
    model = SENSITIVE[arch]()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
            elif "norm" in n or ".ln_" in n:
                p.fill_(1.0)
            else:
                p.normal_(0, 0.05)
    model.save_pretrained(path)
    return path


def _confuse(monkeypatch, a: str, b: str) -> None:
    from hybrid.convert import mapping
    right = mapping.hf_source
    monkeypatch.setattr(mapping, "hf_source",
                        lambda cfg, name: right(cfg, name.replace(a, "\0").replace(b, a).replace("\0", b)))


@pytest.mark.parametrize("arch", list(SENSITIVE))
def test_every_architecture_converts_to_transformers_logits_both_ways(tmp_path, arch):
    """hf -> hybrid: our model on the converted checkpoint against transformers' model on the source folder;
    hybrid -> hf: transformers' model on the exported folder against ours on the checkpoint; fp32 tolerance."""
    src = sensitive_folder(arch, str(tmp_path / "hf"))
    assert hf_to_hybrid(src, str(tmp_path / "ckpt")).startswith("verify: OK")
    assert hybrid_to_hf(str(tmp_path / "ckpt"), str(tmp_path / "out")).startswith("verify: OK")
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = load_ours(load_config(src), store.final_path(str(tmp_path / "ckpt"), 0))(ids)
        theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()(input_ids=ids).logits
        source = AutoModelForCausalLM.from_pretrained(src).eval()(input_ids=ids).logits
    scale = source.abs().max().item()
    assert scale > 1 and (ours - source).abs().max().item() <= 1e-4 * scale
    assert torch.equal(theirs, source)  # the exported folder is the source, bit for bit


MISTAKE_CASES = [(arch, m) for arch in SENSITIVE for m in MISTAKES if not (arch == "gpt2" and m == "gate<->up")]
# Mistral and Qwen2 go through Llama's branch of models/hf_io.hf_source (the same names, `model.` prefixed): their
# cases are marked slow (the full suite runs them); the fast tier keeps GPT-2's (its own branch) and Llama's.
MISTAKE_FAST = ("gpt2", "llama")


@pytest.mark.parametrize("arch, mistake", [pytest.param(a, m, id=f"{a}-{m}", marks=() if a in MISTAKE_FAST else
                                                        pytest.mark.slow) for a, m in MISTAKE_CASES])
def test_a_mapping_mistake_made_the_same_way_in_and_out_fails_the_transformers_check(tmp_path, monkeypatch, arch,
                                                                                     mistake):
    """The round trip cannot see a mistake made the same way in both directions (it is bit-exact under it); the
    comparison with transformers' own model catches it in each direction, and nothing is written."""
    src = sensitive_folder(arch, str(tmp_path / "hf"))
    _confuse(monkeypatch, *MISTAKES[mistake])
    hf_to_hybrid(src, str(tmp_path / "ckpt"), verify=False)
    hybrid_to_hf(str(tmp_path / "ckpt"), str(tmp_path / "back"), verify=False)
    a, b = tensors(src), tensors(str(tmp_path / "back"))
    assert all(torch.equal(a[k], b[k]) for k in a), "the round trip hides the mistake"
    with pytest.raises(ValueError, match="verify: FAILED"):
        hf_to_hybrid(src, str(tmp_path / "ckpt2"))
    with pytest.raises(ValueError, match="verify: FAILED"):
        hybrid_to_hf(str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "ckpt2") and not os.path.exists(tmp_path / "out")
