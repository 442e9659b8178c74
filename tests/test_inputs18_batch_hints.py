"""A global batch that does not split names the values that do (round 17's divisor hints for --diloco-replicas and
EP, now for the batch). Repro: `train.py --global-batch-size 8 --micro-batch-size 2` on 3 ranks said
"--global-batch-size 8 must be a multiple of --micro-batch-size 2 x data-parallel size 3 = 6" and no value.
Now "...= 6; give --global-batch-size 6 or 12" (and, when dp divides the batch, the nearest micro-batch sizes that
keep it). Every value offered is checked against a brute-force search over the sizes, not the formula's own code."""

from __future__ import annotations

import re

import pytest

from hybrid.data.text import BatchSpec
from hybrid.train.args import parse_args, run_config


def _splits(g: int, micro: int, dp: int) -> bool:
    try:
        BatchSpec(g, micro, 8, dp)
    except ValueError:
        return False
    return True


def _offered(line: str, flag: str) -> list[int]:
    m = re.search(rf"{flag} ((?:\d+, )*\d+(?: or \d+)?)(?:,|$| \()", line.split("; give ", 1)[1])
    return [int(v) for v in re.split(r", | or ", m.group(1))] if m else []


@pytest.mark.parametrize("dp", [1, 2, 3, 4, 6])
def test_the_values_offered_are_the_nearest_that_split(dp):
    """Over every global batch 1-48 and micro-batch 1-8 that does not split: the global batches offered are the
    nearest that do, below (when there is one) and above; the micro-batch sizes, offered when dp divides the batch,
    the nearest either side that split the same global batch."""
    seen = 0
    for g in range(1, 49):
        for micro in range(1, 9):
            if _splits(g, micro, dp):
                continue
            with pytest.raises(ValueError) as e:
                BatchSpec(g, micro, 8, dp)
            line, seen = str(e.value), seen + 1
            below = [v for v in range(1, g) if _splits(v, micro, dp)][-1:]
            above = next(v for v in range(g + 1, g + 1 + micro * dp) if _splits(v, micro, dp))
            assert _offered(line, "--global-batch-size") == below + [above], line
            micros = [v for v in range(1, g + 1) if _splits(g, v, dp)]
            near = [v for v in micros if v < micro][-1:] + [v for v in micros if v > micro][:1]
            assert _offered(line, "--micro-batch-size") == near, line
    assert seen > 100


def test_train_py_says_it_before_any_process_group(one_process):
    with pytest.raises(ValueError) as e:
        run_config(parse_args(["--model", "tiny-gpt2", "--seq-length", "32", "--train-iters", "8",
                               "--global-batch-size", "8", "--micro-batch-size", "2"]), 3)
    assert str(e.value) == ("--global-batch-size 8 must be a multiple of --micro-batch-size 2 x data-parallel size "
                            "3 = 6; give --global-batch-size 6 or 12")
    with pytest.raises(ValueError) as e:
        run_config(parse_args(["--model", "tiny-gpt2", "--seq-length", "32", "--train-iters", "8",
                               "--global-batch-size", "8", "--micro-batch-size", "3"]), 2)
    assert str(e.value).endswith("= 6; give --global-batch-size 6 or 12, or --micro-batch-size 2 or 4 (the same "
                                 "global batch)"), e.value
