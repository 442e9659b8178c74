"""A run that explains itself (hybrid/train/explain.py): each start-up and resume line from its facts, without
processes; the learning-rate schedule against megatron-core's own scheduler; and one small end-to-end chain on 2
ranks (save, resume with a larger --train-iters and the same --lr-decay-iters, an uninterrupted reference) that
checks each line is printed once, by rank 0 only, that the resumed run steps at the uninterrupted run's learning
rates and losses, and that every log interval -- the resumed first one and a partial last one -- is timed over
its own steps."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)

from hybrid.data.indexed import InMemoryDocuments
from hybrid.data.source import DataSource, Split, SplitSizes
from hybrid.train import explain
from hybrid.train.explain import DataFacts, Prediction, Weights, WeightsKind
from hybrid.train_step import OptimizerConfig
from models import load_config

TINY = load_config("tiny-gpt2")
FLAGS = {"lr": 1e-3, "min_lr": 1e-4, "lr_warmup_iters": 2, "lr_decay_style": "cosine", "train_iters": 20,
         "lr_decay_iters": None, "seed": 1234, "data_path": None, "split": "969, 30, 1", "seq_length": 32,
         "global_batch_size": 8, "micro_batch_size": 4, "log_interval": 5, "save": "ck", "load": None}
LAYOUT = {"tp": 1, "pp": 1, "dp": 2, "zero": 0, "v": 1, "stages": [[0, 1, 2, 3]]}


def info(layout=LAYOUT, **flags) -> dict:
    return {"model": "tiny-gpt2", "layout": dict(layout), "args": {**FLAGS, **flags}}


def saved(layout=LAYOUT, iteration=10, **flags) -> dict:
    return dict(info(layout, **flags), iteration=iteration, consumed_samples=iteration * 8, contents="full")


# --- the learning-rate schedule ---------------------------------------------------------------------------------

def _megatron_lr(warmup: int, decay: int, style: str, lr: float, min_lr: float, step: int) -> float:
    """megatron-core's OptimizerParamScheduler at num_steps = step (iterations as its steps: Megatron multiplies
    warm-up, decay and the increment by the global batch alike)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    class Groups:
        param_groups = [{}]

    s = OptimizerParamScheduler(Groups(), init_lr=0.0, max_lr=lr, min_lr=min_lr, lr_warmup_steps=warmup,
                                lr_decay_steps=decay, lr_decay_style=style, start_wd=0.01, end_wd=0.01,
                                wd_incr_steps=decay, wd_incr_style="constant")
    s.num_steps = step
    return s.get_lr({})


@pytest.mark.parametrize("style", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("warmup,decay_iters,train_iters", [(0, None, 12), (3, None, 12), (3, 8, 12), (2, 16, 12)])
def test_lr_schedule_is_megatron_cores_at_every_step(style, warmup, decay_iters, train_iters):
    """lr_at(k) is megatron-core's get_lr at num_steps = k for every step, warm-up (k / W: step 0 at 0), decay to
    --lr-decay-iters (default --train-iters) and min_lr past it; past train_iters too (an extended run)."""
    pytest.importorskip("megatron.core.optimizer_param_scheduler")
    opt = OptimizerConfig(lr=1e-3, min_lr=1e-4, warmup_iters=warmup, decay_style=style, train_iters=train_iters,
                          decay_iters=decay_iters)
    for k in range(2 * train_iters):
        assert opt.lr_at(k) == pytest.approx(
            _megatron_lr(warmup, decay_iters or train_iters, style, 1e-3, 1e-4, k), rel=1e-12, abs=1e-18), k


def test_an_extended_run_with_the_same_decay_iters_keeps_every_rate():
    first = OptimizerConfig(lr=1e-3, min_lr=1e-4, warmup_iters=2, train_iters=20, decay_iters=20)
    extended = replace(first, train_iters=30)
    assert [first.lr_at(k) for k in range(20)] == [extended.lr_at(k) for k in range(20)]
    assert [extended.lr_at(k) for k in range(21, 30)] == [1e-4] * 9  # past the decay: --min-lr
    moved = replace(first, train_iters=30, decay_iters=None)  # the default follows --train-iters
    assert moved.lr_at(10) != first.lr_at(10)


# --- model and weights -----------------------------------------------------------------------------------------

def test_model_line_names_the_model_and_where_each_kind_of_weights_came_from(tmp_path):
    import torch
    from safetensors.torch import save_file
    save_file({"a": torch.zeros(2), "b": torch.ones(3)}, str(tmp_path / "model.safetensors"))
    head = "model: tiny-gpt2 (a preset): gpt2, 4 layers, hidden 64, 4 heads (4 kv), vocab 256, 0.23M parameters"
    init = explain.model_line("tiny-gpt2", TINY, explain.weights_of(None, None, 0, None), seed=7)
    assert init == f"{head} | weights: initialised at random (--seed 7)"
    hf = explain.model_line("tiny-gpt2", TINY, explain.weights_of(str(tmp_path), None, 0, None), seed=7)
    assert hf.endswith(f"weights: loaded from the transformers folder {tmp_path} (2 tensors)")
    ck = explain.model_line("tiny-gpt2", TINY, explain.weights_of(None, "ck/iter_0000010", 10, saved()), 7)
    assert ck.endswith("weights: loaded from the checkpoint ck/iter_0000010 (iteration 10)")
    conv = explain.model_line("my_dir", TINY, Weights(WeightsKind.CHECKPOINT, "c/iter_0000000", 0, converted=True), 7)
    assert conv.startswith("model: my_dir (config.json in my_dir)") and "converted checkpoint c/iter_0000000 " \
        "(weights only: the optimizer starts fresh at iteration 0)" in conv


# --- data ------------------------------------------------------------------------------------------------------

def _docs(lengths: list[int], name: str = "corpus.txt") -> InMemoryDocuments:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, sum(lengths)).astype(np.uint8)
    return InMemoryDocuments(tokens, np.asarray(lengths), name)


def _facts(docs, split=(0.8, 0.15, 0.05), split_flag="80,15,5", iters=10, gb=4, seq=16, eval_iters=1,
           eval_interval=5) -> DataFacts:
    sizes = SplitSizes.for_run(iters, gb, eval_interval, eval_iters)
    source = DataSource([docs], [1.0], split, seq, 1234, sizes)
    return explain.data_facts(source, sizes, split, split_flag, eval_iters)


def test_data_lines_give_documents_tokens_and_each_splits_samples():
    facts = _facts(_docs([50] * 100))
    dataset, splits = explain.data_lines(facts)
    assert dataset == "data: corpus.txt (byte-level text, a token per byte): 100 documents, 5,000 tokens"
    # split_ranges: 80 / 15 / 5 documents; train reads 10 x 4 samples of 16 tokens (+1 label) = 640 of 4,000 tokens
    assert splits == ("data: --split 80,15,5: train 80 documents, 4,000 tokens -> 40 samples of 16 + 1 tokens, "
                      "0.16 of an epoch | valid 15 documents, 750 tokens -> 12 samples of 16 + 1 tokens, 0.26 of "
                      "an epoch | test 5 documents, 250 tokens -> 4 samples of 16 + 1 tokens, 0.26 of an epoch")


def test_an_empty_split_is_named_with_why_and_what_the_run_then_skips():
    no_docs = explain.data_lines(_facts(_docs([50] * 100), split=(0.9, 0.1, 0.0), split_flag="90,10,0"))[1]
    assert ("test 0 documents, 0 tokens: empty -- corpus.txt has 100 documents and --split 90,10,0 gives this split "
            "none: no test loss at the end (give it a larger share)") in no_docs
    short = explain.data_lines(_facts(_docs([50] * 98 + [5, 5]), split=(0.98, 0.0, 0.02), split_flag="98,0,2"))[1]
    assert "valid 0 documents, 0 tokens: empty -- corpus.txt has 100 documents and --split 98,0,2 gives this " \
           "split none: no validation loss" in short
    assert ("test 2 documents, 10 tokens: empty -- corpus.txt's 2 documents here hold 10 tokens, fewer than one "
            "sample of --seq-length 16 + 1: no test loss at the end") in short
    off = explain.data_lines(_facts(_docs([50] * 100), eval_iters=0))[1]
    assert "valid 15 documents, 750 tokens: empty -- not evaluated (--eval-iters 0)" in off


def test_a_blend_names_each_dataset_with_its_weight():
    a, b = _docs([40] * 50, "a"), _docs([60] * 50, "b")
    sizes = SplitSizes.for_run(10, 4, 5, 1)
    source = DataSource([a, b], [0.25, 0.75], (0.8, 0.15, 0.05), 16, 1234, sizes)
    lines = explain.data_lines(explain.data_facts(source, sizes, (0.8, 0.15, 0.05), "80,15,5", 1))
    assert lines[:2] == ["data: a (byte-level text, a token per byte, blend weight 0.25): 50 documents, 2,000 tokens",
                         "data: b (byte-level text, a token per byte, blend weight 0.75): 50 documents, 3,000 tokens"]
    assert lines[2].startswith("data: --split 80,15,5: train 80 documents, 4,000 tokens -> 40 samples")


# --- schedule and prediction -----------------------------------------------------------------------------------

def test_schedule_line_says_where_the_decay_ends_and_why():
    assert explain.schedule_line(FLAGS, 8, 32) == (
        "schedule: 20 iterations x 8 samples x 32 tokens | lr: warm-up to 0.001 over 2 iterations, cosine decay to "
        "0.0001 at iteration 20 (--lr-decay-iters unset: --train-iters), then constant")
    assert "at iteration 15 (--lr-decay-iters 15)" in explain.schedule_line({**FLAGS, "lr_decay_iters": 15}, 8, 32)
    short = explain.schedule_line({**FLAGS, "lr_warmup_iters": 10, "train_iters": 5}, 8, 32)
    assert short.endswith("(the warm-up outlasts the decay: the rate never reaches --lr's plateau)")


def test_prediction_line_is_in_the_log_lines_units():
    cpu = Prediction("cpu.json", 0.1125, 36400.0, 330 * 2**20, "peak RSS", 14 * 2**20, 316 * 2**20)
    assert explain.prediction_line(cpu) == (
        "planner: this layout on cpu.json: 112.5 ms/iter, 36,400 tokens/s, peak RSS 330 MiB on the fullest rank "
        "(its tensors 14.0 MiB + this process before the model 316 MiB) -- compare with the iteration lines")
    preset = explain.prediction_line(replace(cpu, hardware="the cpu preset", step_s=None, tokens_per_s=None))
    assert "no time (the cpu preset's rates are placeholders: `hybrid calibrate --out cpu.json`" in preset
    gpu = explain.prediction_line(Prediction("the h200 preset", 0.7, 45000.0, 31e9, "max allocated", 31e9, 0.0))
    assert "max allocated 29,564 MiB on the fullest rank (its tensors; the planner's 2 GB CUDA reserve left out" in gpu
    assert explain.prediction_line(Prediction("cpu.json", error="tp 3 does not divide 4 heads")) == \
        "planner: no prediction for this layout on cpu.json: tp 3 does not divide 4 heads"


# --- resume ----------------------------------------------------------------------------------------------------

def test_resume_with_the_same_flags_says_it_continues_as_the_uninterrupted_run():
    lines = explain.resume_lines(saved(), info(save="elsewhere", load="ck"), 10, 80, None, 8)
    assert lines == ["resume: the checkpoint's run had the same flags and layout: iterations 11-20 run as the "
                     "uninterrupted run would (same learning rates, same samples)"]


def test_a_larger_train_iters_without_decay_iters_names_the_moved_schedule_and_the_fix():
    facts = _facts(_docs([50] * 100), seq=32)
    lines = explain.resume_lines(saved(), info(train_iters=30), 10, 80, facts, 8)
    assert lines[0] == "resume: flags changed since the checkpoint: --train-iters 20 -> 30"
    assert lines[1].startswith("resume: lr schedule changed: iteration 11 runs at ") and lines[1].endswith(
        "; to keep the saved run's schedule pass --lr-decay-iters 20 (the decay then ends where it did and "
        "iterations past it run at --min-lr)")
    dropped = explain.resume_lines(saved(lr_decay_iters=20), info(train_iters=30), 10, 80, None, 8)[1]
    assert dropped.endswith("pass --lr-decay-iters 20 (the decay then ends where it did and iterations past it "
                            "run at --min-lr)")
    # 20 x 8 samples of 32 tokens read 5,121 of the 4,000 train tokens: 2 epochs, the second (36 samples of an
    # epoch's 124) under Megatron's 80 % and shuffled alone; 30 x 8 read 7,681: 2 epochs, the second (116) shuffled
    # with the first -- another order
    # -- the same plan up to 222 samples (98 of the second epoch's 124, under 80 %): 27 iterations of 8, and from
    # 125 (the second epoch's first sample): 16 iterations (15 x 8 = 120 samples are 1 epoch, another order)
    assert lines[2] == ("resume: data order changed: the train split is now read for 240 samples (was 160), so its "
                        "shuffle spans 2 epochs (was 2, the last alone) and is drawn anew: the samples from 80 on "
                        "differ from the saved run's plan; --train-iters 16 to 27 keeps the saved order")
    assert explain.same_order_up_to(facts, 160) == 222 and explain.train_epochs(facts, 223) == [(2, False)]
    assert explain.same_order_from(facts, 160) == 125 and explain.train_epochs(facts, 124) == [(1, False)]


def test_the_same_decay_iters_keeps_the_schedule_and_a_small_extension_the_data_order():
    facts = _facts(_docs([500] * 100), seq=32)  # 40,000 train tokens: 160 or 240 samples are one epoch
    lines = explain.resume_lines(saved(lr_decay_iters=20), info(train_iters=30, lr_decay_iters=20), 10, 80, facts, 8)
    assert lines[1] == ("resume: lr schedule unchanged for iterations 11-30: warm-up to 0.001 over 2 iterations, "
                        "cosine decay to 0.0001 at iteration 20 (--lr-decay-iters 20), then constant")
    assert lines[2] == ("resume: data order unchanged: the train split is now read for 240 samples (was 160) and its "
                        "shuffle still spans 1 epoch, as the saved run's did")


def test_resume_names_a_new_layout_a_new_seed_and_a_converted_checkpoint():
    moved = dict(LAYOUT, tp=2, dp=1)
    lines = explain.resume_lines(saved(), info(layout=moved, seed=1), 10, 80, _facts(_docs([50] * 100)), 8)
    assert lines[0] == "resume: flags changed since the checkpoint: --seed 1234 -> 1"
    assert lines[1].startswith("resume: layout changed: saved at tp 1 x pp 1 x dp 2, ZeRO 0, stages [4], now tp 2 x "
                               "pp 1 x dp 1, ZeRO 0, stages [4]: the checkpoint is resharded on load")
    assert lines[2] == ("resume: data order changed: --seed differs from the saved run's, so the samples from 80 on "
                        "are not the ones it would have read")
    converted = {"contents": "model", "iteration": 0, "layout": LAYOUT}
    assert explain.resume_lines(converted, info(), 0, 0, None, 8)[0].startswith("resume: a converted checkpoint")


# --- end to end: 2 ranks, once, rank 0 only -----------------------------------------------------------------------

RUN = ["--seq-length", "32", "--global-batch-size", "8", "--micro-batch-size", "2", "--eval-interval", "2",
       "--eval-iters", "1", "--lr-warmup-iters", "1", "--lr-decay-iters", "3", "--timing-log-interval", "1"]


def _train_rank(rank: int, world: int, argvs: list[list[str]]) -> list[str]:
    """train.py's runs of `argvs` on this rank, one after another in this process (one launch's forks, process
    group and imports for all of them), each one's stdout captured, with a clock that moves 1 s per training step
    and stands still otherwise: every interval's ms/iter must then be 1000 exactly."""
    from types import SimpleNamespace

    from train_in_process import train_runs

    from hybrid.train import loop
    clock = [0.0]
    step = loop.train_step

    def timed_step(*a, **k):
        clock[0] += 1.0
        return step(*a, **k)

    loop.train_step, loop.time = timed_step, SimpleNamespace(perf_counter=lambda: clock[0])
    return train_runs(argvs)


def _records(path) -> dict[int, dict]:
    return {r["iteration"]: r for r in map(json.loads, open(path)) if "lm_loss" in r}


STARTUP = ("model: ", "data: ", "schedule: ", "planner: this layout", "resume: ")


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """Run 1: 3 iterations, saved, a record per step. Run 2: resumed to 5 (the same --lr-decay-iters 3), logging
    every 2: its intervals are [4] (cut short by the resume) and [5] (by the end). Reference: 5 at once, a record
    per step."""
    from hybrid.testing import run_distributed
    d = tmp_path_factory.mktemp("chain")
    ck, a, b = str(d / "ck"), ["--metrics-file", str(d / "a.jsonl")], ["--metrics-file", str(d / "b.jsonl")]
    argvs = [RUN + ["--train-iters", "3", "--log-interval", "1", "--save", ck] + a,
             RUN + ["--train-iters", "5", "--log-interval", "2", "--save", ck, "--load", ck] + a,
             RUN + ["--train-iters", "5", "--log-interval", "1"] + b]
    runs = run_distributed(_train_rank, 2, args=(argvs,), timeout=300)  # the three in turn, in one launch
    first, second, whole = ([per_rank[i] for per_rank in runs] for i in range(3))  # each: [rank 0's, rank 1's]
    return first, second, whole, d


def test_start_up_and_resume_lines_are_printed_once_by_rank_zero_only(chain):
    first, second, _, _ = chain
    for out in (first, second):
        assert not [ln for ln in out[1].splitlines() if ln.startswith(STARTUP)], out[1]  # rank 1: none
        for prefix in ("model: ", "schedule: ", "planner: this layout"):
            assert sum(ln.startswith(prefix) for ln in out[0].splitlines()) == 1, (prefix, out[0])
        assert sum(ln.startswith("data: ") for ln in out[0].splitlines()) == 2, out[0]  # the corpus, its splits
    r0 = first[0]
    assert "weights: initialised at random (--seed 1234)" in r0 and "resume: " not in r0
    assert "data: the default corpus (Python's pydoc topics as byte-level text, a token per byte): " in r0
    assert re.search(r"^planner: this layout on the cpu preset: no time .* peak RSS \d+ MiB on the fullest rank", r0,
                     re.M), r0
    r0 = second[0]
    assert re.search(r"^model: .* \| weights: loaded from the checkpoint \S+iter_0000003 \(iteration 3\)$", r0,
                     re.M), r0
    resume = [ln for ln in r0.splitlines() if ln.startswith("resume: ")]
    assert resume == [
        "resume: flags changed since the checkpoint: --train-iters 3 -> 5",
        "resume: lr schedule unchanged for iterations 4-5: warm-up to 0.001 over 1 iteration, cosine decay to "
        "0.0001 at iteration 3 (--lr-decay-iters 3), then constant",
        "resume: data order unchanged: the train split is now read for 40 samples (was 24) and its shuffle still "
        "spans 1 epoch, as the saved run's did"], r0
    assert "nodes: 1 x 2 ranks (LOCAL_WORLD_SIZE unset: not started by torchrun)" in r0


def test_the_resumed_run_steps_at_the_uninterrupted_runs_rates_and_losses(chain):
    _, _, _, d = chain
    resumed, whole = _records(d / "a.jsonl"), _records(d / "b.jsonl")
    assert sorted(resumed) == sorted(whole) == [1, 2, 3, 4, 5]
    for it in whole:
        assert resumed[it]["lr"] == whole[it]["lr"] and resumed[it]["lm_loss"] == whole[it]["lm_loss"], it
    assert whole[4]["lr"] == whole[5]["lr"] == 1e-4  # past --lr-decay-iters 3: --min-lr


def test_every_interval_is_timed_over_its_own_steps_and_labelled_from_its_first(chain):
    """Run 2's intervals with --log-interval 2: [4] (the resume cuts it short) and [5] (the end does). With one
    second a step each is 1000 ms/iter (dividing by --log-interval gave 500), and the resumed one is labelled 4-4,
    not 1-4."""
    first, second, _, d = chain
    times = {r["iteration"]: r["iteration_time_s"] for r in _records(d / "a.jsonl").values()}
    assert times == {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0}
    assert re.findall(r" (\S+) ms/iter \| +(\S+) tokens/s", second[0]) == [("1000.0", "256")] * 2, second[0]
    assert re.findall(r"step time ms p50/p90/max, iterations (\d+-\d+)", first[0]) == ["1-1", "2-2", "3-3"]
    assert re.findall(r"step time ms p50/p90/max, iterations (\d+-\d+)", second[0]) == ["4-4"]


def test_validation_at_the_last_iteration_is_printed_once(chain):
    first, second, whole, _ = chain
    for out, last in ((first[0], 3), (second[0], 5), (whole[0], 5)):
        assert len(re.findall(rf"validation loss at iteration {last}( on validation set)? \|", out)) == 1, out
    assert re.findall(r"validation loss at iteration 4 \| lm loss value: (\S+)", second[0]) == \
        re.findall(r"validation loss at iteration 4 \| lm loss value: (\S+)", whole[0])


# --- the export carries a tokenizer transformers loads -------------------------------------------------------------

TEXT = "Hello, wörld!\n\n  naïve 日本語 -- \t x"


def test_an_export_of_a_byte_level_run_encodes_and_decodes_through_auto_tokenizer(chain, tmp_path):
    """The chain's checkpoint (tiny-gpt2 on the default corpus: byte tokens) exported: AutoTokenizer on the folder
    gives the UTF-8 bytes as ids (what train.py read) and decodes them back; its end-of-document token is id 0."""
    from transformers import AutoTokenizer

    from hybrid.convert import hybrid_to_hf
    *_, d = chain
    lines = []
    hybrid_to_hf(str(d / "ck"), str(tmp_path / "out"), log=lines.append)
    assert "tokenizer: byte-level (the run read UTF-8 bytes; id = byte, <|endoftext|> = id 0)" in lines
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    ids = tok(TEXT)["input_ids"]
    assert ids == list(TEXT.encode("utf-8")) and tok.decode(ids) == TEXT
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 0
    assert tok.decode(ids + [0], skip_special_tokens=True) == TEXT


def test_an_export_of_a_run_with_its_own_tokenizer_carries_it(tmp_path):
    """--tokenizer-type HuggingFaceTokenizer --tokenizer-model: its tokenizer.json, with a tokenizer_config.json
    naming the end-of-document token; AutoTokenizer encodes as the tokenizers library (train.py's preprocessing)
    did."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer

    from hybrid.convert.tokenizer_out import export_tokenizer
    own = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2, "</s>": 3}, unk_token="[UNK]"))
    own.pre_tokenizer = pre_tokenizers.Whitespace()
    own.add_special_tokens(["</s>"])
    own.save(str(tmp_path / "tok.json"))
    (tmp_path / "out").mkdir()
    state = {"args": {"tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": str(tmp_path / "tok.json")}}
    line = export_tokenizer(str(tmp_path / "out"), [], state, 64)
    assert line == f"tokenizer: the run's --tokenizer-model {tmp_path / 'tok.json'} (end of document: </s>)"
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert tok("hello world there")["input_ids"] == own.encode("hello world there").ids == [1, 2, 0]
    assert tok.eos_token_id == 3
    indexed = {"args": {"tokenizer_type": None, "data_path": [str(tmp_path / "prefix")]}}  # no such text file
    assert export_tokenizer(str(tmp_path), [], indexed, 64).startswith("tokenizer: none written")


def test_resume_at_the_end_says_nothing_is_left_and_names_unset_flags_so():
    lines = explain.resume_lines(saved(iteration=20, lr_decay_iters=20), info(), 20, 160, None, 8)
    assert lines == ["resume: flags changed since the checkpoint: --lr-decay-iters 20 -> unset",
                     "resume: the checkpoint is at iteration 20 and --train-iters is 20: nothing left to train "
                     "(raise --train-iters to continue)"]


def test_a_model_the_planner_does_not_describe_is_a_line_not_a_crash(tmp_path):
    """A transformers GPT-2 with dropout 0.1 on CPU: the planner's fp32 profile models no dropout and refuses
    it; the start-up line says so and the run goes on (README's `--load path/to/hf_model` command)."""
    import torch
    from transformers import GPT2Config

    from hybrid.train.args import parse_args, run_config
    GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=300).save_pretrained(tmp_path)
    run = run_config(parse_args(["--model", str(tmp_path), "--seq-length", "16"]), 1)
    p = explain.predict(run, torch.device("cpu"), 0.0)
    assert explain.prediction_line(p).startswith("planner: no prediction for this layout on this cpu: activation "
                                                 "profile fp32-flash models our runtime without dropout")


# --- docs/operations.md's log is what its commands print ----------------------------------------------------------
def _documented_logs() -> list[tuple[list[str], list[str]]]:
    """(train.py's argv, the lines shown) of each `$ torchrun ... scripts/train.py` block in 'What a run says'."""
    import os
    import shlex
    doc = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                            "operations.md")).read()
    section = doc.split("## What a run says")[1].split("\n## ")[0]
    logs = []
    for block in re.findall(r"```text\n(.*?)```", section, re.S):
        command, *lines = block.rstrip("\n").split("\n")
        argv = shlex.split(command.split("scripts/train.py", 1)[1])
        logs.append((argv, lines))
    return logs


def _log_facts(line: str, ck: str) -> str | None:
    """What of a log line does not depend on the clock, the host or the launcher: the iteration lines' loss, rate,
    norm and samples; the planner's figures but its measured process size; None for the nodes line (torchrun's
    LOCAL_WORLD_SIZE) and the timing lines."""
    line = line.replace(ck, "ck")
    if line.startswith(" iteration "):
        keep = ("iteration", "lm loss", "lr ", "grad norm", "consumed samples")
        return " | ".join(f.strip() for f in line.split(" | ") if f.strip().startswith(keep))
    if line.startswith(("nodes: ", "step time ms", "time split", "straggler: ")):
        return None
    if line.startswith("planner: "):
        return re.sub(r"[\d.]+ MiB", "N MiB", line)
    return line


_E_NUMBER = re.compile(r"\d\.\d{6}E[+-]\d\d")


def _same_fact(want: str, got: str) -> bool:
    """Equal lines; but a validation line's loss and PPL (7 significant digits of an fp32 mean over the eval tokens,
    and its exp) may differ by what another CPU's fp32 reduction order does to the loss: a loss 2 fp32 ulps off
    (d = 2 ulp(L), 9.5e-7 at L = 4.35) moves PPL = e^L by the relative d, and each print rounds by half a unit
    of its last digit. Measured on two machines: PPL 7.766518E+01 / 7.766521E+01 (relative 3.9e-7), the loss
    printed equal. The line's text must match exactly."""
    if want == got:
        return True
    if "lm loss value:" not in want or _E_NUMBER.sub("#", want) != _E_NUMBER.sub("#", got):
        return False
    (lw, pw), (lg, pg) = ([float(x) for x in _E_NUMBER.findall(line)[:2]] for line in (want, got))
    d = 2 * float(np.spacing(np.float32(lw)))
    unit = lambda x: 10.0 ** (np.floor(np.log10(abs(x))) - 6)  # noqa: E731 -- the last printed digit's unit
    return abs(lw - lg) <= d + unit(lw) and abs(pw - pg) <= pw * d + unit(pw)


@pytest.mark.slow
def test_the_log_in_docs_operations_is_what_its_commands_print(tmp_path):
    """The three documented commands (a run, its extension with the same --lr-decay-iters, a resume without it)
    rerun on 2 ranks: every documented line -- start-up, resume, loss / lr / grad norm, validation, checkpoint --
    is printed, in that order (the clock's, the host's and the launcher's fields left out)."""
    from hybrid.testing import run_distributed
    logs = _documented_logs()
    assert len(logs) == 3 and all(argv[argv.index("--load") + 1] == "ck" for argv, _ in logs[1:])
    ck = str(tmp_path / "ck")
    argvs = [[ck if a == "ck" else a for a in argv] for argv, _ in logs]
    outs = run_distributed(_train_rank, 2, args=(argvs,), timeout=600)[0]  # the three in turn, in one launch
    for (_, documented), printed in zip(logs, outs):
        want = [f for f in (_log_facts(ln, ck) for ln in documented) if f is not None]
        got = iter([f for f in (_log_facts(ln, ck) for ln in printed.splitlines()) if f is not None])
        missing = [w for w in want if not any(_same_fact(w, g) for g in got)]  # on the iterator: in order
        assert not missing, (missing[0], printed)
        assert len(want) >= 3
