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


CP = ["plan", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-80g", "--global-batch-size", "16"]


@pytest.mark.parametrize("argv, line", [
    (["--seq-length", "8192", "--context-parallel-size", "2", "--tensor-model-parallel-size", "8"],
     "--context-parallel-size 2 with --tensor-model-parallel-size 8 and --pipeline-model-parallel-size 1: tp x cp x pp "
     "divides --gpus 8 at none of the sizes; give a smaller --tensor-model-parallel-size or "
     "--pipeline-model-parallel-size"),
    (["--seq-length", "8192", "--context-parallel-size", "4,8", "--tensor-model-parallel-size", "4"],
     "tp x cp x pp divides --gpus 8 at none of the sizes; give CP sizes dividing 2"),
    (["--seq-length", "4090", "--context-parallel-size", "2"],
     "--seq-length 4090 is not divisible by 2 x --context-parallel-size 2 = 4; causal load balancing splits each "
     "sequence into 4 equal chunks: use a multiple of 4 (4088 or 4092)"),
])
def test_cp_sizes_no_layout_can_take_name_the_pin_or_the_sequence(argv, line, one_line):
    """docs/context-parallel.md's `hybrid plan --context-parallel-size` with tp pinned: tp 8 x cp 2 on 8 GPUs said
    "no layout fits at --context-parallel-size 2 (a size must divide --gpus and half the --seq-length ...)" after
    the search -- but 2 divides both; the pinned tp left no room. Now the line names the pin, or, for a sequence
    no size splits, train.py's line with the lengths that do."""
    got = one_line(lambda: hybrid_main(CP + argv))
    assert line in got and "no layout fits" not in got, got


def test_cp_sizes_some_of_which_fit_are_searched(capsys):
    """cp 1 fits beside tp 8 on 8 GPUs, cp 2 does not: the search runs and its row is the cp 1 layout."""
    hybrid_main(CP + ["--seq-length", "8192", "--context-parallel-size", "1,2", "--tensor-model-parallel-size", "8",
                      "--top", "1"])
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.lstrip().startswith("1 ")]
    assert len(rows) == 1 and "tp8 pp1 dp1" in rows[0] and "cp2" not in rows[0], rows



def test_the_cp_pin_checks_import_no_torch(monkeypatch, one_line):
    """`hybrid plan` runs without torch (tests/test_startup18_torch_free.py); its CP refusals do too: the sequence's
    line is written in the planner, not imported from hybrid/cp/balance.py (which imports torch). In-process: both
    made unimportable (None in sys.modules), any import of them on this path would raise."""
    import sys
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "hybrid.cp.balance", None)
    line = one_line(lambda: hybrid_main(CP + ["--seq-length", "4090", "--context-parallel-size", "2,4"]))
    assert line == ("hybrid plan: error: --seq-length 4090 is not divisible by 2 x --context-parallel-size 2 = 4 (nor "
                    "at the other sizes); causal load balancing splits each sequence into 4 equal chunks: use a "
                    "multiple of 4 (4088 or 4092)")
