"""Round 22 review: Megatron's --use-cpu-initialization exists to make the initial weights the same at every
tensor-parallel size ("This eliminates init differences based on tensor parallelism", megatron/training/arguments.py).
hybrid already initialises that way (hybrid/tp/sharding.init_parameters: each shard is cut from its full tensor,
drawn from a per-parameter seed), so the hint says so instead of "there is no such switch"; the claim it now makes is
held here in-process: a column- and a row-split weight at tp 2 are the slices of the tp 1 weight, bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from hybrid.tp.sharding import REPLICATED, init_parameters, set_spec, split_spec
from hybrid.train.other_flags import hints

OUT, IN, SEED = 6, 4, 1234


def _linear(spec, rows: int, cols: int) -> nn.Module:
    layer = nn.Module()
    layer.weight = set_spec(nn.Parameter(torch.empty(rows, cols)), spec, lambda t, g: t.normal_(0, 0.02, generator=g))
    return layer


def test_the_cpu_initialization_hint_says_init_is_already_the_same_at_every_tp():
    hint = hints()["--use-cpu-initialization"]
    assert "the same initial weights at every --tensor-model-parallel-size" in hint, hint
    assert "init_parameters" in hint and hint.endswith("drop the flag"), hint


def test_a_split_weight_at_tp_2_is_the_slice_of_the_tp_1_weight():
    """What the hint claims: init_parameters draws the full tensor and keeps this rank's rows (dim 0, a column-
    parallel weight) or columns (dim 1, row-parallel)."""
    whole = _linear(REPLICATED, OUT, IN)
    init_parameters(whole, SEED, tp_rank=0)
    for dim, (rows, cols) in ((0, (OUT // 2, IN)), (1, (OUT, IN // 2))):
        full = OUT if dim == 0 else IN
        shards = [_linear(split_spec(full, 2, dim), rows, cols) for _ in range(2)]
        for rank, shard in enumerate(shards):
            init_parameters(shard, SEED, tp_rank=rank)
        assert torch.equal(torch.cat([s.weight for s in shards], dim=dim), whole.weight), dim


# --- --skip-train: the hint said "not implemented: a run trains"; a resume with no step left is Megatron's skip ----
def test_the_skip_train_hint_names_the_resume_that_only_evaluates():
    hint = hints()["--skip-train"]
    assert hint.startswith("--skip-train: --load CKPT --train-iters N with N the checkpoint's iteration trains "
                           "nothing"), hint


@pytest.mark.slow  # train.py twice (forked ranks): save at 1, then load with --train-iters 1
def test_a_resume_with_no_step_left_prints_the_validation_and_test_losses(tmp_path):
    """What the --skip-train hint promises: no iteration line, the validation and test losses of the saved
    weights (the test loss equal to the saving run's final one), and the 'no iteration to train' end."""
    from hybrid import testing
    tiny = ["--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "1", "--eval-iters", "1",
            "--eval-interval", "1", "--log-interval", "1", "--train-iters", "1"]
    ck = str(tmp_path / "ck")
    (saved,) = testing.launch(tiny + ["--save", ck], 1, cwd=str(tmp_path))
    assert saved.returncode == 0, saved.stderr
    (again,) = testing.launch(tiny + ["--load", ck], 1, cwd=str(tmp_path))
    assert again.returncode == 0, again.stderr
    out = again.stdout.splitlines()
    assert not any(line.lstrip().startswith("iteration ") for line in out), again.stdout
    test_lines = [[line for line in run.stdout.splitlines() if "on test set" in line] for run in (saved, again)]
    assert len(test_lines[1]) == 1 and test_lines[0] == test_lines[1], test_lines
    assert any("on validation set" in line for line in out), again.stdout
    assert out[-1] == "done: no iteration to train (the checkpoint is at iteration 1, --train-iters 1)", out[-1]
