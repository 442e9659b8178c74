"""Round 21's review of the resume's global-batch line (hybrid.train.explain.resume_lines; in-process, state.json-
shaped dicts). With --global-batch-size unset (micro-batch x dp), a resume with another micro-batch:
  * at the same dp 1, micro-batch 2 -> 3, printed "micro-batch 2 -> 3: the same samples per step" above "global
    batch 2 -> 3 samples a step (... dp 1 -> 1)": the two lines contradicted each other, and the cause named was dp;
  * at dp 1 -> 2 with micro-batch 2 -> 3 (a save at 1 rank, a resume at 2: checked by hand with torchrun, consumed
    samples 8 -> 14 -> 20 -> 26 as read) it said "dp 1 -> 2" for 2 -> 6, and offered "pass --global-batch-size 2",
    which the data loader refuses at micro-batch 3 x dp 2 (hybrid/data/text.py: a multiple of micro x dp).
"""

from __future__ import annotations

from hybrid.train import explain

FLAGS = {"lr": 1e-3, "min_lr": 1e-4, "lr_warmup_iters": 2, "lr_decay_style": "cosine", "train_iters": 20,
         "lr_decay_iters": None, "seed": 1234, "data_path": None, "split": "969, 30, 1", "seq_length": 32,
         "global_batch_size": None, "micro_batch_size": 2, "pipeline_schedule": None}
DP1 = {"tp": 1, "pp": 1, "dp": 1, "zero": 0, "v": 1, "stages": [[0, 1, 2, 3]]}
SAVED = {"model": "tiny-gpt2", "layout": DP1, "args": FLAGS, "iteration": 4, "consumed_samples": 8, "contents": "full"}


def _lines(dp: int, micro: int) -> list[str]:
    now = {"model": "tiny-gpt2", "layout": {**DP1, "dp": dp}, "args": {**FLAGS, "micro_batch_size": micro}}
    return explain.resume_lines(SAVED, now, 4, 8, None, micro * dp)


def test_a_micro_batch_that_moves_the_global_batch_is_not_called_the_same_samples():
    lines = _lines(1, 3)
    assert not [ln for ln in lines if "the same samples per step" in ln], lines
    assert ("resume: global batch 2 -> 3 samples a step (--global-batch-size unset: micro-batch x dp, micro-batch "
            "2 -> 3): each step averages another number of samples; pass --global-batch-size 2 --micro-batch-size 2 "
            "to keep the saved run's") in lines, lines


def test_the_fix_offered_is_one_the_loader_takes():
    line = next(ln for ln in _lines(2, 3) if ln.startswith("resume: global batch"))
    assert "(--global-batch-size unset: micro-batch x dp, micro-batch 2 -> 3, dp 1 -> 2)" in line
    assert line.endswith("pass --global-batch-size 2 --micro-batch-size 1 to keep the saved run's")
    odd = {**SAVED, "args": {**FLAGS, "micro_batch_size": 3}}  # 3 samples a step cannot split over dp 2
    now = {"model": "tiny-gpt2", "layout": {**DP1, "dp": 2}, "args": {**FLAGS, "micro_batch_size": 3}}
    assert explain.resume_lines(odd, now, 4, 12, None, 6)[-1].endswith(
        "no global batch of 3 runs at dp 2 (micro-batch x dp must divide it)")


def test_a_micro_batch_alone_under_a_fixed_global_batch_keeps_its_line():
    given = {**FLAGS, "global_batch_size": 6}
    now = {"model": "tiny-gpt2", "layout": DP1, "args": {**given, "micro_batch_size": 3}}
    assert explain.resume_lines({**SAVED, "args": given}, now, 4, 24, None, 6) == [
        "resume: micro-batch 2 -> 3: the same samples per step, accumulated in other slices"]
