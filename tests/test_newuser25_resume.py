"""Round 25's new user on docs/checkpoint.md: a resume whose --train-iters is not past the checkpoint's iteration
trains nothing ("resume: ... nothing left to train"), but its data line still named the samples it would read:
"this run reads its samples 16-15 (the checkpoint's 16 + -1 iterations x 8)". In-process: resume_lines on
state.json-shaped dicts, as tests/test_polish21_resume_reads.py."""

from __future__ import annotations

import numpy as np

from hybrid.data.indexed import InMemoryDocuments
from hybrid.data.source import DataSource, SplitSizes, train_samples
from hybrid.train import explain

FLAGS = {"lr": 1e-3, "min_lr": 1e-4, "lr_warmup_iters": 2, "lr_decay_style": "cosine", "train_iters": 20,
         "lr_decay_iters": 20, "seed": 1234, "data_path": None, "split": "80,15,5", "seq_length": 16,
         "global_batch_size": 8, "micro_batch_size": 4}
SPLIT = (0.8, 0.15, 0.05)
LAYOUT = {"tp": 1, "pp": 1, "dp": 2, "zero": 0, "v": 1, "stages": [[0, 1, 2, 3]]}


def _lines(iters: int, start: int = 10) -> list[str]:
    """A checkpoint of a 20-iteration run at iteration `start` (8 samples a step), resumed with --train-iters
    `iters`; the facts of the train split loop.run builds then."""
    tokens = np.random.default_rng(0).integers(0, 256, 100 * 500).astype(np.uint8)
    docs = InMemoryDocuments(tokens, np.full(100, 500), "corpus.txt")
    source = DataSource([docs], [1.0], SPLIT, 16, 1234, SplitSizes.for_run(iters, 8, 10, 1))
    source = source.covering(train_samples(iters, 8, start, start * 8))
    facts = explain.data_facts(source, source.sizes, SPLIT, "80,15,5", 1)
    saved = {"model": "tiny-gpt2", "layout": LAYOUT, "args": FLAGS, "iteration": start,
             "consumed_samples": start * 8, "contents": "full"}
    now = {"model": "tiny-gpt2", "layout": LAYOUT, "args": {**FLAGS, "train_iters": iters}}
    return explain.resume_lines(saved, now, start, start * 8, facts, 8)


def test_a_resume_with_nothing_left_to_train_names_no_samples_read():
    for iters in (5, 10):  # below and at the checkpoint's iteration 10
        lines = _lines(iters)
        assert any("nothing left to train" in ln for ln in lines), lines
        assert not [ln for ln in lines if "reads its samples" in ln or "data order" in ln], lines


def test_a_resume_that_trains_on_still_names_its_reads():
    # the reverse: 30 iterations read 80-239, a split of 240 where the saved run's was 160 -- the line stays
    lines = _lines(30)
    assert any(ln.startswith("resume: data order unchanged: the train split is now read for 240 samples") for ln in
               lines), lines
