"""`hybrid generate`: the KV-cached forward gives the full recompute's logits; greedy tokens equal transformers'
generate(do_sample=False) at tp 1 (checkpoint and folder) and tp 2 (torchrun, 2 gloo ranks); sampling's
temperature / top-k / top-p filters equal transformers' own logits warpers; sampling is seeded; the tokenizer is
found where the run left it; bad flags are one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from hybrid.cli import main as hybrid_main
from hybrid.comm import Group
from hybrid.convert import hf_to_hybrid
from hybrid.convert.generate import SamplingConfig, filter_logits, find_codec
from hybrid.convert.presharded import TargetLayout
from hybrid.tp import TPContext
from models import build_model
from models.common import KVCache
from models.config import load_config
from models.hf_io import load_hf_checkpoint
from test_convert import MODELS, ROOT

ENV = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
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


# --- greedy against transformers at tp 1 and tp 2 -------------------------------------------------------------
@pytest.fixture(scope="module")
def random_llama(tmp_path_factory):
    """A Llama (GQA) with N(0, 1) weights, saved, converted (pre-sharded for tp 2), and transformers' 32 greedy
    tokens from it: 18 distinct, and the top-2 logit gap is >= 0.099 at every step, so no argmax is decided by
    rounding (at N(0, 0.3) a random Llama repeats one token)."""
    root = tmp_path_factory.mktemp("gen")
    torch.manual_seed(3)
    hf = MODELS["llama-gqa"]()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 1.0)
    hf.save_pretrained(root / "hf")
    hf_to_hybrid(str(root / "hf"), str(root / "ckpt"), verify=False, target=TargetLayout(tp=2))
    hf.generation_config.eos_token_id = None
    want = hf.eval().generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False,
                              pad_token_id=0)[0, len(PROMPT):].tolist()
    assert len(want) == NEW and len(set(want)) >= 18  # not one token repeated
    return root, want


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


def test_greedy_tokens_equal_transformers_at_tp2_under_torchrun(random_llama):
    """torchrun, 2 gloo ranks, tp 2 (the default: every launched process): each rank holds 2 of the 4 heads, 1 of
    the 2 kv-heads in its cache, and half the vocabulary (259 padded to 260)."""
    root, want = random_llama
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "hybrid.cli",
           "generate", str(root / "ckpt"), "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", str(NEW)]
    p = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert _first_line(p.stdout) == f"generate: {NEW} new tokens (greedy): {','.join(map(str, want))}"
    assert "tp 2 on cpu, KV cache" in p.stdout


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
    (["--pipeline-model-parallel-size", "2"], "--pipeline-model-parallel-size 2: generate runs at pp 1 only"),
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
