"""Round 19's new-user pass over train.py's newer axes (MoE / EP, context parallelism, interleaved and zero-bubble
schedules, PowerSGD and 1-bit Adam, DiLoCo, selective-op recomputation, --compile, --load at another layout) with bad
and edge inputs. Most were one line naming the flag and the fix already; these were not (each checked in-process,
through the checks train.py runs before any process group):

1. `--virtual-pipeline-model-parallel-size 2 --pipeline-schedule 1f1b` named --num-layers-per-virtual-pipeline-stage,
   a flag the user never gave.
2. `--num-layers-per-virtual-pipeline-stage 2 --pipeline-schedule interleaved` at 4 layers / pp 2 (one chunk a
   rank) said "interleaved needs --num-layers-per-virtual-pipeline-stage" -- which was given. Now it says the value
   gives one chunk and names one that gives two; at pp 1 the missing --pipeline-model-parallel-size is named.
3. `--optimizer onebit-adam` at dp 1 (e.g. pp 2 on 2 ranks) ran: no DP momentum to compress, so Adam with a frozen
   variance and nothing saved -- PowerSGD and --simulated-dp-bandwidth refuse dp 1 by name, 1-bit Adam now does too
   (a --load carries its state through a dp 1 stretch, as PowerSGD's).
"""

from __future__ import annotations

import pytest

from hybrid.train.args import parse_args, run_config

LLAMA = ["--model", "tiny-llama", "--seq-length", "32"]


def _error(argv: list[str], world: int) -> str:
    with pytest.raises(ValueError) as e:
        run_config(parse_args(LLAMA + argv), world)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("flag, value", [("--virtual-pipeline-model-parallel-size", "2"),
                                         ("--num-layers-per-virtual-pipeline-stage", "1")])
def test_chunks_with_a_one_chunk_schedule_name_the_flag_given(flag, value):
    line = _error(["--pipeline-model-parallel-size", "2", flag, value, "--pipeline-schedule", "1f1b"], 2)
    assert line.startswith(f"{flag} {value} needs --pipeline-schedule interleaved"), line


@pytest.mark.parametrize("flag, value, fix", [
    ("--num-layers-per-virtual-pipeline-stage", "2", "give --num-layers-per-virtual-pipeline-stage 1"),
    ("--virtual-pipeline-model-parallel-size", "1", "give --virtual-pipeline-model-parallel-size 2")])
def test_interleaved_with_one_chunk_a_rank_names_the_value_and_one_that_interleaves(flag, value, fix):
    line = _error(["--pipeline-model-parallel-size", "2", flag, value, "--pipeline-schedule", "interleaved"], 2)
    assert line.startswith(f"{flag} {value} gives one chunk a rank (4 layers / --pipeline-model-parallel-size 2)") \
        and fix in line, line
    fixed = fix.split("give ")[1].split()
    run = run_config(parse_args(LLAMA + ["--pipeline-model-parallel-size", "2", *fixed, "--pipeline-schedule",
                                         "interleaved", "--micro-batch-size", "1", "--global-batch-size", "2"]), 2)
    assert run.parallel.pipeline.v == 2


def test_interleaved_at_pp_1_names_the_pipeline_size_not_the_flag_given():
    line = _error(["--num-layers-per-virtual-pipeline-stage", "4", "--pipeline-schedule", "interleaved"], 1)
    assert line.startswith("--pipeline-schedule interleaved needs --pipeline-model-parallel-size >= 2"), line


ONEBIT = ["--optimizer", "onebit-adam", "--onebit-freeze-iters", "2", "--train-iters", "4"]


@pytest.mark.parametrize("world, layout", [(1, []), (2, ["--pipeline-model-parallel-size", "2"]),
                                           (2, ["--tensor-model-parallel-size", "2"])])
def test_onebit_adam_at_dp_1_is_refused_like_powersgd(world, layout):
    line = _error(ONEBIT + layout, world)
    assert line.startswith("--optimizer onebit-adam compresses the DP momentum all-reduce, and at dp 1 there is "
                           "none"), line


def test_onebit_adam_runs_where_there_is_dp_traffic():
    assert run_config(parse_args(LLAMA + ONEBIT), 2).compress.onebit_freeze_iters == 2  # dp 2
    cp = run_config(parse_args(LLAMA + ONEBIT + ["--context-parallel-size", "2"]), 2)  # dp 1 x cp 2: compressed
    assert cp.compress.onebit_freeze_iters == 2
