"""Round 23: the final evaluation of a resumed run with nothing to train, and the valid split's size.

Evaluation e reads valid samples [e K G, (e + 1) K G) (K = --eval-iters, G = the global batch; evaluate.py), and the
one at the end of a run that stopped at iteration N is e = ceil(N / interval) - 1. The valid split holds Megatron's
(train_iters // interval + 1) K G samples, built for --train-iters before the checkpoint is read; Blend
(hybrid/data/gpt.py) wraps an index past its end onto the split's first samples.

1. A resume at --train-iters equal to the checkpoint's iteration N (Megatron's --skip-train here) cannot wrap:
   ceil(N / I) <= N // I + 1 for every N, I >= 1 -- checked over a grid, not assumed.
2. A resume at --train-iters below the checkpoint's iteration did: saved at 6 (interval 2), resumed with
   --train-iters 2, the split held 2 blocks and the final evaluation (block 2) read block 0's samples -- the
   validation loss "at iteration 6" on iteration 2's samples. The valid split is now sized for the iteration the
   run ends at, max(train_iters, the checkpoint's) (source.valid_samples, resized after the resume as data22 resized
   the train split): in-process on the DataSource loop.run builds, and through train.py (slow): the resumed run's
   validation loss at iteration 6 equals the saved run's, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hybrid.data.indexed import InMemoryDocuments
from hybrid.data.source import DataSource, Split, SplitSizes, train_samples, valid_samples

SEQ, SPLIT = 16, (0.6, 0.3, 0.1)


def _block(iteration: int, interval: int) -> int:
    """The final evaluation's number after `iteration` (evaluate.run_evaluations, written out independently)."""
    return math.ceil(iteration / interval) - 1


def test_a_resume_at_its_own_iteration_reads_inside_the_valid_split():
    for iters in range(1, 61):
        for interval in range(1, iters + 4):
            sizes = SplitSizes.for_run(iters, 4, interval, 3)
            assert (_block(iters, interval) + 1) * 3 * 4 <= sizes.valid, (iters, interval)


def _source(iters: int, start: int, gb: int = 4, interval: int = 2, eval_iters: int = 1) -> DataSource:
    """The DataSource loop.run evaluates on: built by train.py's checks for --train-iters `iters`, resized after a
    resume at iteration `start` (start x gb samples read)."""
    tokens = np.random.default_rng(0).integers(0, 256, 100 * 300).astype(np.uint8)
    docs = InMemoryDocuments(tokens, np.full(100, 300), "corpus.txt")
    built = DataSource([docs], [1.0], SPLIT, SEQ, 1234, SplitSizes.for_run(iters, gb, interval, eval_iters))
    return built.covering(train_samples(iters, gb, start, start * gb),
                          valid_samples(iters, gb, interval, eval_iters, start))


def test_a_resume_past_train_iters_evaluates_the_checkpoints_block_not_a_wrapped_one():
    saved, resumed = _source(6, 0), _source(2, 6)  # saved at 6 of 6; resumed with --train-iters 2
    block = _block(6, 2)  # 2: samples [8, 12)
    assert len(resumed.splits[Split.VALID]) >= (block + 1) * 4  # was 2 x 4 = 8: the read wrapped to [0, 4)
    assert np.array_equal(resumed.samples(Split.VALID, block * 4, 4), saved.samples(Split.VALID, block * 4, 4))
    assert resumed.sizes.valid == saved.sizes.valid == 16 and resumed.sizes.train == 8  # train: Megatron's 2 x 4
    assert _source(6, 3).sizes == saved.sizes  # a resume with steps left: Megatron's sizes, unchanged


# --- through train.py ------------------------------------------------------------------------------------------

TINY = ["--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "2", "--eval-iters", "1",
        "--eval-interval", "2", "--log-interval", "1", "--lr-warmup-iters", "1"]


def _train_rank(rank: int, world: int, argvs: list[list[str]]) -> list[str]:
    from train_in_process import train_runs
    return train_runs(argvs)


def _final_validation(out: str) -> str:
    lines = [ln for ln in out.splitlines() if "on validation set" in ln]
    assert len(lines) == 1, out
    return lines[0]


# One launch of one rank, two runs (6 steps, then none): ~6 s of CPU -- slow. The fast tier keeps the subject in
# test_a_resume_past_train_iters_evaluates_the_checkpoints_block_not_a_wrapped_one; this adds loop.run's call.
@pytest.mark.slow
def test_train_py_resumed_past_train_iters_prints_the_saved_runs_validation_loss(tmp_path):
    from hybrid.testing import run_distributed
    ck = str(tmp_path / "ck")
    saved, resumed = run_distributed(_train_rank, 1, args=([TINY + ["--train-iters", "6", "--save", ck],
                                                            TINY + ["--train-iters", "2", "--load", ck]],),
                                     timeout=300)[0]
    assert "done: no iteration to train (the checkpoint is at iteration 6, --train-iters 2)" in resumed, resumed
    assert _final_validation(resumed) == _final_validation(saved)  # the wrap read iteration 2's samples
