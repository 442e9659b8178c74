"""Round 23's new-user pass over docs/moe.md ("The planner") and docs/pipeline.md / context-parallel.md's `hybrid
plan` lines, with a new user's mistakes. In-process, no process group.

1. A pinned --expert-model-parallel-size that does not divide the experts (3 of 8, or 16 of 8) or --gpus ended in
   "no layout ... runs ...: 856 rejected for the same reason, e.g. ...: no ep of [3] divides ...; 504 rejected ..."
   -- the search's rejection census for a flag it could refuse at once. Now one line naming the sizes that fit.
2. train.py's flags that plan searches or does not price: --expert-tensor-parallel-size said "did you mean
   --expert-model-parallel-size?" (another thing: docs/moe.md says plan has no flag to pin expert-TP),
   --pipeline-schedule and --moe-token-dispatcher-type "see --help". Each now says what plan does instead.
"""

from __future__ import annotations

import pytest

from hybrid.cli import main as hybrid_main

PLAN = ["plan", "--model", "tiny-mixtral", "--gpu", "h100-80g", "--global-batch-size", "16", "--seq-length", "128"]


@pytest.mark.parametrize("argv, line", [
    (["--gpus", "8", "--expert-model-parallel-size", "3"],
     "--expert-model-parallel-size 3 does not divide the model's 8 experts; give 1, 2, 4 or 8, or drop it"),
    (["--gpus", "8", "--expert-model-parallel-size", "16"],
     "--expert-model-parallel-size 16 does not divide the model's 8 experts; give 1, 2, 4 or 8, or drop it"),
    (["--gpus", "6", "--expert-model-parallel-size", "4"],
     "--expert-model-parallel-size 4 does not divide --gpus 6 (an EP group is ranks of one pipeline stage); give "
     "1 or 2, or drop it"),
])
def test_a_pinned_ep_that_cannot_fold_is_one_line_naming_the_sizes_that_can(argv, line, one_line):
    got = one_line(lambda: hybrid_main(PLAN + argv))
    assert line in got and "rejected" not in got, got


def test_a_pinned_ep_that_folds_is_planned_with_it(capsys):
    hybrid_main(PLAN + ["--gpus", "8", "--expert-model-parallel-size", "4", "--top", "1"])
    assert " ep4 " in capsys.readouterr().out


@pytest.mark.parametrize("flag, value, hint", [
    ("--expert-tensor-parallel-size", "2", "plan searches expert-TP with EP and has no flag to pin it"),
    ("--pipeline-schedule", "zbv", "plan searches the schedule (1f1b, interleaved, zbh1, zbv) with the layout"),
    ("--moe-token-dispatcher-type", "allgather", "plan prices the alltoall dispatcher (train.py's default)"),
])
def test_train_flags_plan_searches_or_does_not_price_say_so(flag, value, hint, one_line):
    got = one_line(lambda: hybrid_main(PLAN + ["--gpus", "8", flag, value]))
    assert f"unrecognized arguments: {flag}; {flag}: {hint}" in got and "did you mean" not in got, got
