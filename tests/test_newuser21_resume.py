"""Round 21's new-user pass over docs/pipeline.md: resuming a 1F1B run's checkpoint with `--pipeline-schedule zbh1`
(the page's zero-bubble schedule, the same stages) printed "resume: flags changed since the checkpoint:
--train-iters 4 -> 6" and nothing about the schedule: --pipeline-schedule is a layout flag, left out of the flags
line, and the layout line compares tp, cp, pp, dp, ZeRO, v and stages, which a schedule alone leaves as they were --
with the same --train-iters the resume said "the checkpoint's run had the same flags and layout". Now the schedule
run (--pipeline-schedule, or train.py's default: interleaved with virtual stages, else 1f1b) is compared and named.
In-process: hybrid.train.explain.resume_lines on state.json-shaped dicts.
"""

from __future__ import annotations

from hybrid.train import explain

FLAGS = {"lr": 1e-3, "min_lr": 1e-4, "lr_warmup_iters": 2, "lr_decay_style": "cosine", "train_iters": 20,
         "lr_decay_iters": None, "seed": 1234, "data_path": None, "split": "969, 30, 1", "seq_length": 32,
         "global_batch_size": 8, "micro_batch_size": 2, "pipeline_schedule": None}
PP2 = {"tp": 1, "pp": 2, "dp": 1, "zero": 0, "v": 1, "stages": [[0, 1], [2, 3]]}
ZBV = {"tp": 1, "pp": 2, "dp": 1, "zero": 0, "v": 2, "stages": [[0], [1], [2], [3]]}


def _lines(saved_layout: dict, saved_schedule, layout: dict, schedule) -> list[str]:
    saved = {"model": "tiny-llama", "layout": saved_layout, "args": {**FLAGS, "pipeline_schedule": saved_schedule},
             "iteration": 10, "consumed_samples": 80, "contents": "full"}
    now = {"model": "tiny-llama", "layout": layout, "args": {**FLAGS, "pipeline_schedule": schedule}}
    return explain.resume_lines(saved, now, 10, 80, None, 8)


def test_a_schedule_changed_alone_is_named_not_called_the_same_layout():
    lines = _lines(PP2, None, PP2, "zbh1")
    assert lines == ["resume: pipeline schedule 1f1b -> zbh1: the order of each step's passes, its memory and its "
                     "time are the new schedule's"]
    assert _lines(PP2, "gpipe", PP2, "1f1b")[0].startswith("resume: pipeline schedule gpipe -> 1f1b:")


def test_a_schedule_with_new_stages_is_named_beside_the_layout_line():
    lines = _lines(PP2, "zbh1", ZBV, "zbv")
    assert lines[0].startswith("resume: layout changed: saved at tp 1 x pp 2 x dp 1")
    assert lines[1].startswith("resume: pipeline schedule zbh1 -> zbv:")


def test_the_default_schedule_given_by_name_and_pp1_say_nothing_of_a_schedule():
    """1f1b given is the default's 1f1b; interleaved is the default with virtual stages; at pp 1 none runs."""
    same = ("resume: the checkpoint's run had the same flags and layout",)
    assert _lines(PP2, None, PP2, "1f1b")[0].startswith(same)
    virtual = {**ZBV, "v": 2}
    assert _lines(virtual, None, virtual, "interleaved")[0].startswith(same)
    pp1 = {"tp": 1, "pp": 1, "dp": 2, "zero": 0, "v": 1, "stages": [[0, 1, 2, 3]]}
    assert _lines(pp1, None, pp1, "gpipe")[0].startswith(same)


def test_a_resume_at_another_dp_without_global_batch_names_the_batch_that_changed():
    """docs/checkpoint.md's command pair: tp 2 x pp 2 (dp 1, 4 samples a step; --global-batch-size unset) resumed
    at tp 1 x pp 2 on the same 4 ranks (dp 2): 8 samples a step, and no line said so."""
    tp2 = {"tp": 2, "pp": 2, "dp": 1, "zero": 1, "v": 1, "stages": [[0, 1], [2, 3]]}
    dp2 = {"tp": 1, "pp": 2, "dp": 2, "zero": 3, "v": 1, "stages": [[0, 1], [2, 3]]}
    flags = {**FLAGS, "global_batch_size": None, "micro_batch_size": 4}
    saved = {"model": "tiny-gpt2", "layout": tp2, "args": flags, "iteration": 6, "consumed_samples": 24,
             "contents": "full"}
    lines = explain.resume_lines(saved, {"model": "tiny-gpt2", "layout": dp2, "args": flags}, 6, 24, None, 8)
    assert ("resume: global batch 4 -> 8 samples a step (--global-batch-size unset: micro-batch x dp, dp 1 -> 2): "
            "each step averages another number of samples; pass --global-batch-size 4 --micro-batch-size 2 to keep "
            "the saved run's") in lines  # (round 21's review: --global-batch-size 4 alone is refused at 4 x dp 2)
    given = {**flags, "global_batch_size": 4}  # kept by the flag: the layout line alone
    again = explain.resume_lines({**saved, "args": given}, {"model": "tiny-gpt2", "layout": dp2, "args": given},
                                 6, 24, None, 4)
    assert not [ln for ln in again if "global batch" in ln]
