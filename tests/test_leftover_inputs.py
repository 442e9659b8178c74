"""Bad inputs left over from earlier rounds (issue 25): each is one line naming the flag or key and the fix, before
any process group; what the user meant runs. Parse and check in this process only: no launch, no process group."""

from __future__ import annotations

import pytest
import torch

from hybrid.train.args import parse_args, run_config
from hybrid.train.main import validate

LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def two_ranks(monkeypatch):
    """A world of 2 as train.py sees it (dp 2: the compression flags have DP traffic to act on)."""
    for name in LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")


def _line(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        validate(argv)
    text = str(e.value.code)
    assert "\n" not in text, text
    assert not torch.distributed.is_initialized()
    return text


# --- 1. --powersgd-start-iter with PowerSGD off ----------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["--powersgd-start-iter", "5"],  # rank left at its default 0
    ["--powersgd-rank", "0", "--powersgd-start-iter", "5"],  # rank given as 0
    ["--powersgd-rank", "2", "--powersgd-start-iter", "5", "--powersgd-rank", "0"],  # a list switched off after
])
def test_powersgd_start_iter_with_powersgd_off_is_one_line_naming_it(argv):
    line = _line(argv + ["--train-iters", "20"])
    assert line.startswith("train.py: error: --powersgd-start-iter 5 does nothing without --powersgd-rank"), line
    assert "drop --powersgd-start-iter" in line and "--powersgd-rank R > 0" in line


def test_powersgd_rank_zero_alone_and_a_rank_with_its_start_are_accepted():
    for argv in (["--powersgd-rank", "0"], ["--powersgd-rank", "2", "--powersgd-start-iter", "5"]):
        run = run_config(parse_args(argv + ["--train-iters", "20"]), world=2)
        assert run.compress.powersgd.rank == int(argv[1])
