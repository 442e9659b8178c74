"""Round 23's new-user pass over train.py's capability flags (docs/moe.md, docs/pipeline.md, docs/diloco.md), with
a new user's mistakes. In-process: train.py's checks, no process group.

1. `--auto-parallel --expert-model-parallel-size 3` (or 16, or --expert-tensor-parallel-size 3) on 8 ranks said
   "no layout of tiny-mixtral fits 8 x 3.2 GB; run `hybrid plan` to see why": the planner found no layout with
   an EP that cannot fold, and the line blamed memory. Now the line train.py gives the same flag without
   --auto-parallel, before the search.
2. Two lines that named the rule but not the fix: --num-layers-per-virtual-pipeline-stage 3 at pp 2 of 4 layers,
   --diloco-fragments 3 of --diloco-inner-steps 8. Each now names the values that fit.
"""

from __future__ import annotations

import pytest

from hybrid.train.main import validate

pytestmark = pytest.mark.usefixtures("one_process")  # tests/conftest.py: python, not torchrun: world 1


def _world(monkeypatch, n: int) -> None:
    """torchrun's environment for rank 0 of `n` on one node."""
    for name, value in (("WORLD_SIZE", str(n)), ("RANK", "0"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", str(n)),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)


AUTO = ["--model", "tiny-mixtral", "--auto-parallel", "--global-batch-size", "16"]


@pytest.mark.parametrize("flags, line", [
    (["--expert-model-parallel-size", "3"], "--expert-model-parallel-size 3 x --expert-tensor-parallel-size 1 must "
     "divide the 8 ranks of a pipeline stage (tp x cp x dp); give --expert-model-parallel-size 1, 2, 4 or 8"),
    (["--expert-model-parallel-size", "16"], "--expert-model-parallel-size 16 x --expert-tensor-parallel-size 1 must "
     "divide the 8 ranks"),
    (["--expert-tensor-parallel-size", "3"], "--expert-model-parallel-size 1 x --expert-tensor-parallel-size 3 must "
     "divide the 8 ranks"),
])
def test_auto_parallel_with_an_ep_that_cannot_fold_names_the_flag_not_memory(monkeypatch, one_line, flags, line):
    _world(monkeypatch, 8)
    got = one_line(lambda: validate(AUTO + flags))
    assert got.startswith(f"train.py: error: {line}") and "fits" not in got, got
    assert "auto-parallel:" not in one_line.out  # refused before the search, which prints its choice


def test_auto_parallel_with_an_ep_that_folds_runs_it(monkeypatch, capsys):
    _world(monkeypatch, 8)
    run = validate(AUTO + ["--expert-model-parallel-size", "4"])[0]
    assert run.moe.expert_parallel == 4


@pytest.mark.parametrize("flags, line", [
    (["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "3"],
     "--num-layers-per-virtual-pipeline-stage 3 must divide the 4 layers / --pipeline-model-parallel-size 2; give 1 "
     "or 2"),
    (["--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "16", "--diloco-inner-steps", "8",
      "--diloco-fragments", "3"],
     "--diloco-fragments 3 must be a positive divisor of --diloco-inner-steps 8; give 1, 2, 4 or 8"),
])
def test_a_size_that_does_not_divide_names_the_sizes_that_do(monkeypatch, one_line, flags, line):
    _world(monkeypatch, 2)
    assert one_line(lambda: validate(["--model", "tiny-llama"] + flags)) == f"train.py: error: {line}"
