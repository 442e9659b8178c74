"""Round 22: a run resumed at a smaller global batch than its checkpoint's re-read samples the saved run had read.
Its train split was built for --train-iters x the new batch G (Megatron's sizing) while the checkpoint had consumed
iteration x the old, larger batch: the run read past the split's end and hybrid/data/gpt.py's Blend wrapped around
to its first samples. The split of a resumed run is now built to the end of what it reads,
max(train_iters G, consumed + (train_iters - iteration) G) (hybrid/data/source.py's train_samples): in the saved
epoch plan the run reads on, [consumed, consumed + remaining G) of the saved order, none read before.

1. in-process, DataSource as loop.run resizes it: a save at G1 = 8 after 10 of 20 steps resumed at G2 = 4, 8, 16
   (one dataset and a blend of two) reads the saved order's next samples, disjoint from the first `consumed`.
2. a larger split that changes the epoch plan: the "data order changed" line says so, and its rows are not the
   saved order's; the --train-iters it names as keeping the saved order do.
3. through train.py (one rank, three runs in one launch): 2 of 4 steps of 8 saved, resumed at 4 and at 16 -- the
   rows each resumed run trains on are the ones the uninterrupted run at 8 trained on from sample 16 on.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybrid.data.indexed import InMemoryDocuments
from hybrid.data.source import DataSource, Split, SplitSizes, train_samples
from hybrid.data.text import BatchSpec
from hybrid.train import explain

SEQ = 16
SPLIT = (0.8, 0.15, 0.05)


def _docs(count: int, length: int, seed: int = 0) -> InMemoryDocuments:
    tokens = np.random.default_rng(seed).integers(0, 256, count * length).astype(np.uint8)
    return InMemoryDocuments(tokens, np.full(count, length), f"corpus{seed}.txt")


BIG = [_docs(100, 500)]  # 80 train documents, 40,000 tokens: 2,499 samples of 16 + 1 an epoch, every size here is 1
BLEND = [_docs(100, 500), _docs(60, 700, seed=1)]


def _source(datasets, train: int) -> DataSource:
    weights = [1.0] if len(datasets) == 1 else [0.3, 0.7]
    return DataSource(datasets, weights, SPLIT, SEQ, 1234, SplitSizes(train, 0, 0))


def _resumed(datasets, iters: int, gb: int, start: int, consumed: int) -> DataSource:
    """The source loop.run trains on: built by train.py's checks for iters x gb, resized after the resume."""
    return _source(datasets, iters * gb).covering(train_samples(iters, gb, start, consumed))


def _rows(source: DataSource, consumed: int, steps: int, spec: BatchSpec) -> torch.Tensor:
    """The inputs of `steps` global batches from sample `consumed`, every dp rank's, in sample order."""
    return torch.cat([torch.cat([x for x, _ in source.batches(consumed + k * spec.global_batch, spec, r)])
                      for k in range(steps) for r in range(spec.dp)])


def _positions(source: DataSource, lo: int, hi: int) -> set[tuple[int, int]]:
    """(dataset, shuffled sample) of the train split's samples [lo, hi): which window of which token stream."""
    blend = source.splits[Split.TRAIN]
    return {(int(blend.which[i]), int(blend.parts[blend.which[i]].shuffle_index[blend.within[i]]))
            for i in range(lo, hi)}


@pytest.mark.parametrize("datasets", [BIG, BLEND], ids=["one-dataset", "blend"])
@pytest.mark.parametrize("gb", [4, 8, 16])
def test_a_resume_at_another_global_batch_reads_on_in_the_saved_order(datasets, gb):
    consumed = 10 * 8  # saved at iteration 10 of 20 at G1 = 8
    end = consumed + 10 * gb
    now = _resumed(datasets, 20, gb, 10, consumed)
    assert len(now.splits[Split.TRAIN]) == max(20 * gb, end)  # at 4: 120, past Megatron's 80 (it wrapped at 80)
    saved = _source(datasets, 20 * 8)
    reference = _source(datasets, max(end, 20 * 8))  # the saved order, long enough (the same 1-epoch plans)
    assert torch.equal(reference.samples(Split.TRAIN, 0, 160), saved.samples(Split.TRAIN, 0, 160))
    read = _rows(now, consumed, 10, BatchSpec(global_batch=gb, micro_batch=2, seq_length=SEQ, dp=2))
    assert torch.equal(read, reference.samples(Split.TRAIN, consumed, end - consumed)[:, :-1])
    before = _positions(saved, 0, consumed)
    assert len(_positions(now, consumed, end)) == end - consumed and not before & _positions(now, consumed, end)


def test_the_resume_line_says_the_run_reads_on_and_no_longer_warns_of_a_wrap():
    """--global-batch-size 8 saved at iteration 10 (80 samples read), resumed at 4: 120 samples built."""
    lines = _lines(BIG, saved_gb=8, gb=4, saved_iters=20, iters=20)
    assert lines[-1] == (
        "resume: data order unchanged: the train split is now built for 120 samples, the end of what this run "
        "reads (--train-iters 20 x the global batch 4 = 80, Megatron's sizing, would end 40 samples before it and "
        "wrap around to samples the saved run read; was 160) and its shuffle still spans 1 epoch, as the saved "
        "run's did; this run reads its samples 80-119 (the checkpoint's 80 + 10 iterations x 4), the saved order's "
        "next samples: none read before"), lines


def _lines(datasets, saved_gb: int, gb: int, saved_iters: int, iters: int, start: int = 10) -> list[str]:
    flags = {"lr": 1e-3, "min_lr": 1e-4, "lr_warmup_iters": 2, "lr_decay_style": "cosine", "lr_decay_iters": 20,
             "seed": 1234, "data_path": None, "split": "80,15,5", "seq_length": SEQ, "micro_batch_size": 2}
    layout = {"tp": 1, "pp": 1, "dp": 2, "zero": 0, "v": 1, "stages": [[0, 1, 2, 3]]}
    saved = {"model": "tiny-gpt2", "layout": layout, "iteration": start, "consumed_samples": start * saved_gb,
             "contents": "full", "args": {**flags, "global_batch_size": saved_gb, "train_iters": saved_iters}}
    now = {"model": "tiny-gpt2", "layout": layout, "args": {**flags, "global_batch_size": gb, "train_iters": iters}}
    source = _resumed(datasets, iters, gb, start, start * saved_gb)
    facts = explain.data_facts(source, source.sizes, SPLIT, "80,15,5", 1)
    return explain.resume_lines(saved, now, start, start * saved_gb, facts, gb)


def test_a_larger_split_that_changes_the_epoch_plan_says_so_and_names_the_iterations_that_keep_it():
    """80 train documents of 50 tokens: 4,000 tokens, 249 samples of 16 + 1 an epoch; the saved run's 20 x 8 = 160
    samples are 1 epoch, a plan kept up to 249 samples. Resumed at iteration 10 (80 read) at 32 a step: 640 samples,
    3 epochs, the last shuffled alone -- another order, and no --train-iters with a step left keeps the saved one
    (32 k <= 249: k <= 7). At 4 a step for 60 iterations: 80 + 50 x 4 = 280 samples, 2 epochs; k iterations build
    80 + (k - 10) x 4, within 249 up to k = 52."""
    small = [_docs(100, 50)]
    lines = _lines(small, saved_gb=8, gb=32, saved_iters=20, iters=20)
    assert lines[-1] == (
        "resume: data order changed: the train split is now built for 640 samples (--train-iters 20 x the global "
        "batch 32, Megatron's sizing; was 160), so its shuffle spans 3 epochs, the last shuffled alone (was 1) and "
        "is drawn anew: the samples from 80 on differ from the saved run's plan; this run reads its samples 80-399 "
        "(the checkpoint's 80 + 10 iterations x 32)"), lines
    saved, now = _source(small, 160), _resumed(small, 20, 32, 10, 80)
    assert not torch.equal(now.samples(Split.TRAIN, 80, 80), saved.samples(Split.TRAIN, 80, 80))  # what it says
    # at 4 a step, 60 iterations: 80 + 50 x 4 = 280 samples, 2 epochs -- changed; 52 keeps the saved plan
    line = _lines(small, saved_gb=8, gb=4, saved_iters=20, iters=60)[-1]
    assert line.startswith("resume: data order changed: the train split is now built for 280 samples, the end of "
                           "what this run reads") and "; --train-iters up to 52 keeps the saved order;" in line, line
    for iters, same in ((52, True), (53, False)):
        resumed = _resumed(small, iters, 4, 10, 80)
        assert torch.equal(resumed.samples(Split.TRAIN, 80, 40), saved.samples(Split.TRAIN, 80, 40)) is same, iters


# --- through train.py ------------------------------------------------------------------------------------------

TINY = ["--seq-length", "32", "--micro-batch-size", "4", "--eval-iters", "0", "--log-interval", "1",
        "--lr-warmup-iters", "1", "--train-iters", "4"]


def _train_rank(rank: int, world: int, argvs: list[list[str]]) -> list[tuple[str, list[torch.Tensor]]]:
    """Each run's stdout and the input rows of each step it trained (loop.train_step recorded, then run)."""
    from train_in_process import train_runs

    from hybrid.train import loop
    step, rows = loop.train_step, []

    def recorded(model, batches, *a, **k):
        rows.append(torch.cat([mb[0] for mb in batches]).clone())
        return step(model, batches, *a, **k)

    loop.train_step = recorded
    outs, per_run = [], []
    for argv in argvs:
        rows.clear()
        outs += train_runs([argv])
        per_run.append(list(rows))
    return list(zip(outs, per_run))


# A launch of one rank costs ~6 s of CPU (the three runs' 8 steps well under one): slow. The fast tier keeps the
# subject in test_a_resume_at_another_global_batch_reads_on_in_the_saved_order (the DataSource loop.run resizes)
# and test_the_resume_line_says_the_run_reads_on_and_no_longer_warns_of_a_wrap; these two add loop.run's call.
@pytest.fixture(scope="module")
def resumed_runs(tmp_path_factory):
    """One rank: 4 steps of 8 saved every 2; the checkpoint at 2 (16 samples read) resumed at 4 and at 16."""
    from hybrid.testing import run_distributed
    ck = str(tmp_path_factory.mktemp("ck") / "ck")
    argvs = [TINY + ["--global-batch-size", "8", "--save", ck, "--save-interval", "2"],
             TINY + ["--global-batch-size", "4", "--load", ck, "--ckpt-step", "2"],
             TINY + ["--global-batch-size", "16", "--load", ck, "--ckpt-step", "2"]]
    return run_distributed(_train_rank, 1, args=(argvs,), timeout=300)[0]


@pytest.mark.slow
def test_train_py_resumed_at_a_smaller_batch_trains_on_the_next_samples(resumed_runs):
    (_, whole), (out, small), _ = resumed_runs
    assert len(whole) == 4 and len(small) == 2
    read_before, next_ones = torch.cat(whole[:2]), whole[2]  # samples 0-15; 16-23
    assert torch.equal(torch.cat(small), next_ones)  # 16-23 at 4 a step: the wrap read 0-7 again
    assert not {tuple(r.tolist()) for r in read_before} & {tuple(r.tolist()) for r in torch.cat(small)}
    data = [ln for ln in out.splitlines() if ln.startswith("resume: data order")]
    assert len(data) == 1 and "this run reads its samples 16-23" in data[0] and "none read before" in data[0], out


@pytest.mark.slow
def test_train_py_resumed_at_a_larger_batch_trains_on_the_next_samples(resumed_runs):
    (_, whole), _, (_, large) = resumed_runs
    assert len(large) == 2 and torch.equal(large[0], torch.cat(whole[2:4]))  # 16-31; then 32-47
