"""`hybrid generate`: the KV-cached forward gives the full recompute's logits; greedy tokens equal transformers'
generate(do_sample=False) at tp 1 (checkpoint and folder), tp 2, pp 2 and tp 2 x pp 2 (torchrun, 2 or 4 gloo
ranks); sampling's
temperature / top-k / top-p filters equal transformers' own logits warpers; sampling is seeded; the tokenizer is
found where the run left it; bad flags are one line."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from command_flags import foreign
from hybrid import testing
from hybrid.cli import main as hybrid_main
from hybrid.comm import Group
from hybrid.convert import hf_to_hybrid
from hybrid.generate.decode import SamplingConfig, filter_logits, find_codec
from hybrid.convert.presharded import TargetLayout
from hybrid.tp import TPContext
from models import build_model
from models.common import KVCache
from models.config import load_config
from models.hf_io import load_hf_checkpoint
from test_convert import MODELS, ROOT

PROMPT = [5, 17, 200, 3]
NEW = 32


# --- the KV cache -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(MODELS))
def test_kv_cached_logits_equal_the_full_recompute(tmp_path, name):
    """Teacher-forced over 40 tokens (batch 2): a 5-token prefill, a 3-token step (queries after a cache: the
    decode mask with T_q > 1), then 31 one-token steps; every position's logits equal one forward over the whole
    sequence. Mistral's window is 8 < 40, so the window mask of the cached path is exercised.

    Tolerance: both paths compute the same sums in another order (one row's k, v against the whole sequence's;
    SDPA with an explicit mask against its causal kernel), so they differ by fp32 rounding: bound 32 ulp of the
    largest logit (32 x 2^-23 x max|z|); measured <= 8 ulp. Weights N(0, 0.5) make attention peaked: a position
    off by one (RoPE or GPT-2's learned positions) then moves logits by O(1), not by rounding."""
    torch.manual_seed(1)
    hf = MODELS[name]()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.5)
    hf.save_pretrained(tmp_path)
    net = build_model(load_config(str(tmp_path)), TPContext(Group.solo("tp")), seed=None).eval()
    load_hf_checkpoint(net, str(tmp_path), 0)
    ids = torch.randint(0, 259, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = net(ids)
        cache, t, parts = KVCache(), 0, []
        for n in [5, 3] + [1] * 32:
            parts.append(net(ids[:, t:t + n], cache=cache))
            t += n
    assert t == 40 and cache.length == 40
    err = (torch.cat(parts, 1) - full).abs().max().item()
    assert err <= 32 * 2**-23 * full.abs().max().item(), err


# --- greedy against transformers at tp 1, tp 2, pp 2, tp 2 x pp 2 -----------------------------------------------
def _random_llama(root, seed: int, layers: int, distinct: int):
    """A Llama (GQA) with N(0, 1) weights, saved, converted (pre-sharded for tp 2), and transformers' 32 greedy
    tokens from it, at least `distinct` of them distinct (at N(0, 0.3) a random Llama repeats one token)."""
    torch.manual_seed(seed)
    hf = MODELS["llama-gqa"]()
    if layers != hf.config.num_hidden_layers:
        from transformers import LlamaConfig, LlamaForCausalLM
        hf = LlamaForCausalLM(LlamaConfig(**{**hf.config.to_dict(), "num_hidden_layers": layers}))
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 1.0)
    hf.save_pretrained(root / "hf")
    hf_to_hybrid(str(root / "hf"), str(root / "ckpt"), verify=False, target=TargetLayout(tp=2))
    hf.generation_config.eos_token_id = None
    want = hf.eval().generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False,
                              pad_token_id=0)[0, len(PROMPT):].tolist()
    assert len(want) == NEW and len(set(want)) >= distinct  # not one token repeated
    return root, want


@pytest.fixture(scope="module")
def random_llama(tmp_path_factory):
    """2 layers: 18 distinct tokens, and the top-2 logit gap is >= 0.099 at every step, so no argmax is decided
    by rounding."""
    return _random_llama(tmp_path_factory.mktemp("gen"), 3, 2, 18)


@pytest.fixture(scope="module")
def random_llama3(tmp_path_factory):
    """3 layers (not divisible by pp 2): 16 distinct tokens, top-2 logit gap >= 0.077 at every step."""
    return _random_llama(tmp_path_factory.mktemp("gen3"), 6, 3, 16)


def _first_line(out: str) -> str:
    return out.splitlines()[0]


def test_greedy_tokens_equal_transformers_at_tp1(random_llama, capsys):
    """From the converted checkpoint (read across layouts: saved for tp 2) and from the transformers folder."""
    root, want = random_llama
    for src in (root / "ckpt", root / "hf"):
        capsys.readouterr()
        hybrid_main(["generate", str(src), "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", str(NEW)])
        assert _first_line(capsys.readouterr().out) == f"generate: {NEW} new tokens (greedy): " \
                                                       f"{','.join(map(str, want))}", src


@pytest.mark.slow
def test_greedy_tokens_equal_transformers_at_tp2_under_torchrun(random_llama):
    """torchrun, 2 gloo ranks, tp 2 (the default: every launched process): each rank holds 2 of the 4 heads, 1 of
    the 2 kv-heads in its cache, and half the vocabulary (259 padded to 260)."""
    root, want = random_llama
    out = _torchrun(2, root / "ckpt")
    assert _first_line(out) == f"generate: {NEW} new tokens (greedy): {','.join(map(str, want))}"
    assert "tp 2 on cpu, KV cache" in out


def _torchrun(nproc: int, src, *flags: str) -> str:
    """`torchrun --standalone --nproc-per-node N -m hybrid.cli generate SRC ...`, its ranks forked from
    hybrid.testing's forkserver with torchrun's environment."""
    p = testing.torchrun(["-m", "hybrid.cli", "generate", str(src), "--prompt-ids", ",".join(map(str, PROMPT)),
                          "--max-new-tokens", str(NEW), *flags], nproc, env={"OMP_NUM_THREADS": "1"}, cwd=ROOT,
                         timeout=180, entry=testing.python_main)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return p.stdout


@pytest.mark.slow
def test_greedy_tokens_equal_transformers_at_pp2_under_torchrun(random_llama):
    """2 gloo ranks, pp 2 (tp 1), from the transformers folder: stage 0 holds the embedding and layer 0, stage 1
    layer 1, the norm and the head; each its layer's KV cache, the hidden states sent 0 -> 1 every step."""
    root, want = random_llama
    out = _torchrun(2, root / "hf", "--pipeline-model-parallel-size", "2")
    assert _first_line(out) == f"generate: {NEW} new tokens (greedy): {','.join(map(str, want))}"
    assert "tp 1 x pp 2 (layers [1, 1]) on cpu, KV cache" in out


@pytest.mark.slow
def test_greedy_tokens_equal_transformers_at_tp2_pp2_under_torchrun(random_llama3):
    """4 gloo ranks, tp 2 x pp 2 (tp innermost: ranks 0, 1 are stage 0), from the converted checkpoint (read by
    DCP, each rank its stage's layers at its tp shard); 3 layers split 1, 2 (--pipeline-layers-per-stage: the
    uniform split does not divide)."""
    root, want = random_llama3
    out = _torchrun(4, root / "ckpt", "--pipeline-model-parallel-size", "2", "--pipeline-layers-per-stage", "1,2")
    assert _first_line(out) == f"generate: {NEW} new tokens (greedy): {','.join(map(str, want))}"
    assert "tp 2 x pp 2 (layers [1, 2]) on cpu, KV cache" in out


def test_pp_that_does_not_divide_the_layers_names_the_counts_flag(random_llama3):
    with pytest.raises(SystemExit) as e:
        hybrid_main(["generate", str(random_llama3[0] / "hf"), "--prompt", "hi", "--pipeline-model-parallel-size", "2"])
    assert str(e.value.code) == ("hybrid generate: error: --pipeline-model-parallel-size 2 does not divide the 3 "
                                 "layers; give the layers per stage, e.g. --pipeline-layers-per-stage 1,2")


# --- sampling -------------------------------------------------------------------------------------------------
SAMPLING = [(0.7, 0, 1.0), (1.3, 10, 1.0), (1.0, 0, 0.9), (0.8, 20, 0.75), (2.0, 1, 1.0), (1.0, 5, 0.3)]


@pytest.mark.parametrize("temperature,top_k,top_p", SAMPLING)
def test_sampling_filters_equal_transformers_logits_warpers(temperature, top_k, top_p):
    """On the same logits, our temperature -> top-k -> top-p filter is bit for bit transformers' warpers in
    generate's order (the kept tokens' logits / T, -inf elsewhere), so the sampling distributions are equal.
    Without top-p the logits are rounded to 1/4, so top-k meets ties at its k-th value (both keep them all). With
    top-p they are not: a tie straddling the nucleus boundary makes the smallest set non-unique, and which of the
    tied tokens stay is then the sort's choice in either implementation."""
    z = torch.randn(4, 259, generator=torch.Generator().manual_seed(top_k)) * 2
    if top_p == 1:
        z = (z * 4).round() / 4
    ours = filter_logits(z, SamplingConfig(temperature, top_k, top_p))
    theirs = TemperatureLogitsWarper(temperature)(None, z.clone())
    if top_k:
        theirs = TopKLogitsWarper(top_k)(None, theirs)
    if top_p < 1:
        theirs = TopPLogitsWarper(top_p)(None, theirs)
    assert torch.equal(ours, theirs)
    kept = torch.isfinite(ours).sum(-1)
    assert kept.min() >= 1 and (top_k == 0 and top_p == 1.0 or kept.max() < 259)


def _ids(capsys, *flags: str) -> str:
    capsys.readouterr()
    hybrid_main(["generate", *flags])
    return _first_line(capsys.readouterr().out).split(": ")[-1]


def test_sampling_is_seeded_and_top_k_1_is_greedy(random_llama, capsys):
    root, want = random_llama
    src = [str(root / "hf"), "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "16"]
    a = _ids(capsys, *src, "--temperature", "1.5", "--seed", "5")
    assert a == _ids(capsys, *src, "--temperature", "1.5", "--seed", "5")
    assert a != _ids(capsys, *src, "--temperature", "1.5", "--seed", "6")
    assert _ids(capsys, *src, "--temperature", "1.5", "--top-k", "1") == ",".join(map(str, want[:16]))


# --- tokenizer and bad flags ------------------------------------------------------------------------------------
def _word_tokenizer(path) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 7, "world": 9}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return str(path)


def test_tokenizer_is_the_one_carried_or_recorded_else_bytes(tmp_path):
    """Files carried with SRC win; for a train.py checkpoint, its recorded --tokenizer-type / --tokenizer-model;
    bytes when the run used bytes or recorded nothing; --tokenizer overrides."""
    tok = _word_tokenizer(tmp_path / "tok.json")
    os.makedirs(tmp_path / "it")
    bare = str(tmp_path / "it")
    run = {"args": {"tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": tok}}
    assert find_codec(None, bare, run).encode("hello world") == [7, 9]
    assert find_codec(None, bare, {"args": {"tokenizer_type": "ByteLevel"}}).encode("hi") == [104, 105]
    assert find_codec(None, bare, {"args": {}}).encode("hi") == [104, 105]
    assert find_codec(None, bare, None).source.startswith("UTF-8 bytes")
    assert find_codec(tok, bare, None).encode("world") == [9]
    _word_tokenizer(tmp_path / "it" / "tokenizer.json")  # carried with SRC
    codec = find_codec(None, bare, {"args": {"tokenizer_type": "ByteLevel"}})
    assert codec.encode("world hello") == [9, 7] and "carried with SRC" in codec.source
    assert codec.decode([7, 9]) == "hello world"


@pytest.mark.parametrize("flags,words", [
    (["--pipeline-model-parallel-size", "2"], "--tensor-model-parallel-size 1 x --pipeline-model-parallel-size 2 "
                                              "needs 2 processes, but 1 was launched; use torchrun --nproc-per-node 2"),
    (["--pipeline-model-parallel-size", "3"], "--pipeline-model-parallel-size 3 exceeds the 2 layers"),
    (["--pipeline-layers-per-stage", "1,2"], "--pipeline-layers-per-stage splits the layers over the pipeline's "
                                             "stages, and there is one (--pipeline-model-parallel-size 1"),
    (["--top-k", "5"], "--top-k filters sampling, but --temperature is 0"),
    (["--tensor-model-parallel-size", "2"], "--tensor-model-parallel-size 2 needs 2 processes, but 1 was launched"),
    (["--tokenizer", "/nonexistent"], "--tokenizer '/nonexistent' does not exist"),
])
def test_bad_generate_flags_are_one_line(random_llama, flags, words):
    root, _ = random_llama
    with pytest.raises(SystemExit) as e:
        hybrid_main(["generate", str(root / "hf"), "--prompt", "hi", *flags])
    msg = str(e.value.code)
    assert msg.startswith("hybrid generate: error: ") and "\n" not in msg and words in msg, msg
    assert foreign(msg, "hybrid generate", flags) == [], msg  # it suggests only flags `hybrid generate` accepts
