"""Round 21 (newuser21's open finding): after a resume at another global batch train.py's data line said "the
train split is now read for N samples" with N = --train-iters x the new batch -- what the split is built for
(Megatron's sizing), not what the run reads: the checkpoint's samples, read at the old batch, + the iterations left
x the new one. The line now says both; where the run read past the split (a smaller batch) those samples wrapped
around to the split's first ones, which the saved run read -- since round 22 (tests/test_data22_resume_batch.py) the
split is built to the end of the run's reads and it reads on in the saved order, as the line says. The global-batch line
of newuser21 (c6bfbba) names a micro-batch change too (it said "dp 2 -> 2"), and a micro-batch change that moves
the global batch is no longer called "the same samples per step". In-process: resume_lines on state.json-shaped
dicts, and the DataSource those runs read, checked for the samples the lines name."""

from __future__ import annotations

import numpy as np
import torch

from hybrid.data.indexed import InMemoryDocuments
from hybrid.data.source import DataSource, Split, SplitSizes, train_samples
from hybrid.data.text import BatchSpec
from hybrid.train import explain

FLAGS = {"lr": 1e-3, "min_lr": 1e-4, "lr_warmup_iters": 2, "lr_decay_style": "cosine", "train_iters": 20,
         "lr_decay_iters": 20, "seed": 1234, "data_path": None, "split": "80,15,5", "seq_length": 16,
         "global_batch_size": None, "micro_batch_size": 4}
SPLIT = (0.8, 0.15, 0.05)


def _layout(dp: int) -> dict:
    return {"tp": 1, "pp": 1, "dp": dp, "zero": 0, "v": 1, "stages": [[0, 1, 2, 3]]}


def _source(iters: int, gb: int) -> DataSource:
    """The train split a run of `iters` x `gb` builds: 100 documents of 500 tokens, 80 for train (one epoch holds
    40,000 / 16 = 2,499 samples, so 80 or 160 are both one epoch: the same order)."""
    tokens = np.random.default_rng(0).integers(0, 256, 100 * 500).astype(np.uint8)
    docs = InMemoryDocuments(tokens, np.full(100, 500), "corpus.txt")
    return DataSource([docs], [1.0], SPLIT, 16, 1234, SplitSizes.for_run(iters, gb, 10, 1))


def _lines(saved_dp: int, saved_micro: int, dp: int, micro: int, start: int = 10) -> list[str]:
    """--global-batch-size unset in both runs (micro x dp), resumed at iteration `start` of 20; the facts of the
    train split loop.run builds after the resume (round 22: to the end of the run's reads, train_samples)."""
    saved_gb, gb = saved_micro * saved_dp, micro * dp
    saved = {"model": "tiny-gpt2", "layout": _layout(saved_dp), "args": {**FLAGS, "micro_batch_size": saved_micro},
             "iteration": start, "consumed_samples": start * saved_gb, "contents": "full"}
    now = {"model": "tiny-gpt2", "layout": _layout(dp), "args": {**FLAGS, "micro_batch_size": micro}}
    source = _source(20, gb).covering(train_samples(20, gb, start, start * saved_gb))
    facts = explain.data_facts(source, source.sizes, SPLIT, "80,15,5", 1)
    return explain.resume_lines(saved, now, start, start * saved_gb, facts, gb)


def test_a_resume_at_another_dp_and_micro_batch_says_what_the_run_reads_and_that_it_reads_on():
    # dp 2 x micro 4 = 8 a step for 10 iterations (80 samples read), resumed at dp 4 x micro 1 = 4 a step: the run
    # reads 80 + 10 x 4: samples 80-119, past Megatron's 20 x 4 = 80 -- round 21 wrapped around to samples 0-39,
    # which the saved run read; round 22 builds the split for 120 and reads on
    lines = _lines(2, 4, 4, 1)
    assert ("resume: global batch 8 -> 4 samples a step (--global-batch-size unset: micro-batch x dp, micro-batch "
            "4 -> 1, dp 2 -> 4): each step averages another number of samples; pass --global-batch-size 8 to keep "
            "the saved run's") in lines
    data = lines[-1]
    assert data.startswith("resume: data order unchanged: the train split is now built for 120 samples, the end of "
                           "what this run reads (--train-iters 20 x the global batch 4 = 80, Megatron's sizing"), data
    assert "read for 80" not in data and data.endswith(
        "; this run reads its samples 80-119 (the checkpoint's 80 + 10 iterations x 4), the saved order's next "
        "samples: none read before"), data
    # what the line says, on the data the run reads: its dp ranks' batches from sample 80 on are samples 80-119 of
    # the saved run's order (its split built for 160), not its first 40
    now = _source(20, 4).covering(train_samples(20, 4, 10, 80))
    then, spec = _source(20, 8), BatchSpec(global_batch=4, micro_batch=1, seq_length=16, dp=4)
    for it in range(10):
        consumed = 80 + 4 * it
        rows = torch.cat([torch.cat([x for x, _ in now.batches(consumed, spec, r)]) for r in range(4)])
        assert torch.equal(rows, then.samples(Split.TRAIN, consumed, 4)[:, :-1]), it  # the saved order's next
    assert not torch.equal(now.samples(Split.TRAIN, 80, 4), then.samples(Split.TRAIN, 0, 4))  # not read again


def test_a_micro_batch_change_alone_names_it_and_is_not_called_the_same_samples_per_step():
    lines = _lines(2, 4, 2, 2)  # dp 2 both: micro 4 -> 2, 8 -> 4 samples a step
    assert not [ln for ln in lines if "the same samples per step" in ln], lines
    assert any("(--global-batch-size unset: micro-batch x dp, micro-batch 4 -> 2): " in ln for ln in lines), lines
    assert "dp 2 -> 2" not in "\n".join(lines)


def test_a_resume_at_a_larger_batch_reads_part_of_the_split_and_wraps_nothing():
    # dp 1 x micro 4: 40 samples read; at dp 2, 8 a step: the split is built for 160, the run reads 40-119
    data = _lines(1, 4, 2, 4)[-1]
    assert data.endswith("was 80) and its shuffle still spans 1 epoch, as the saved run's did; this run reads its "
                         "samples 40-119 (the checkpoint's 40 + 10 iterations x 8), the saved order's next samples: "
                         "none read before"), data
    assert "now built for 160 samples" in data and "wrap" not in data


def test_another_dp_and_micro_batch_count_at_a_set_global_batch_read_on_as_the_saved_run():
    """--global-batch-size 8 both times, dp 2 x micro 2 (2 micro-batches) resumed at dp 4 x micro 2 (1): the same
    8 samples a step, the checkpoint's 80 = 10 x 8, the run reads 80-159 of a split built for 160 -- the
    uninterrupted run's samples, so no global-batch or data line; and the dp ranks' batches are those samples."""
    saved = {"model": "tiny-gpt2", "layout": _layout(2), "iteration": 10, "consumed_samples": 80, "contents": "full",
             "args": {**FLAGS, "global_batch_size": 8, "micro_batch_size": 2}}
    now = {"model": "tiny-gpt2", "layout": _layout(4), "args": {**FLAGS, "global_batch_size": 8, "micro_batch_size": 2}}
    facts = explain.data_facts(_source(20, 8), SplitSizes.for_run(20, 8, 10, 1), SPLIT, "80,15,5", 1)
    lines = explain.resume_lines(saved, now, 10, 80, facts, 8)
    assert len(lines) == 1 and lines[0].startswith("resume: layout changed: "), lines
    source, spec = _source(20, 8), BatchSpec(global_batch=8, micro_batch=2, seq_length=16, dp=4)
    rows = torch.cat([torch.cat([x for x, _ in source.batches(80, spec, r)]) for r in range(4)])
    assert torch.equal(rows, source.samples(Split.TRAIN, 80, 8)[:, :-1])
