"""Round 21's new-user pass over docs/comm-efficient.md. The page's commands (PowerSGD rank 4 from step 11, 1-bit
Adam frozen after 10 steps, a simulated 0.5 GB/s link) trained and printed nothing of the scheme -- the start-up
lines said "zero: stage 1 | fp32 | clip-grad 1.0" as a plain run's, so a user could not see that the flags took
(DiLoCo prints a `diloco:` line). Now rank 0 prints one `compress:` line naming the scheme and the optimizer step
it starts at; a plain run prints none.

1. hybrid.compress.args.describe on the RunConfig train.py's own checks build from the page's flags (in-process).
2. the line as loop.run prints it: 2 gloo ranks, the page's 1-bit Adam and PowerSGD + link commands shortened
   (two and three steps), and a plain run, in one launch -- which also runs docs/checkpoint.md's finding: a run
   resumed at another global batch logged "consumed samples" as iteration x the new batch (24 where 16 were read).
3. the page's PowerSGD command shortened to --train-iters 2 (the mistake: too short a run) was refused with "give
   --powersgd-start-iter N with 2 <= N < 2", a range with no N; now it asks for a longer --train-iters.
"""

from __future__ import annotations

import importlib

import pytest

from hybrid.compress.args import describe

TINY = ["--seq-length", "32", "--global-batch-size", "4", "--micro-batch-size", "2", "--eval-iters", "0",
        "--log-interval", "1", "--lr-warmup-iters", "1"]
POWERSGD = "compress: PowerSGD rank 4 on the DP gradients from optimizer step 11 (steps 1-10 plain all-reduce"
ONEBIT = ("compress: 1-bit Adam: Adam for steps 1-10, then the variance frozen and the momentum sent as signs with "
          "error feedback")


def _validate(monkeypatch, argv: list[str], world: int = 4):
    for k, v in {"WORLD_SIZE": world, "RANK": 0, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": world,
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": 29500}.items():
        monkeypatch.setenv(k, str(v))
    return importlib.import_module("hybrid.train.main").validate(argv)[0]


def test_the_pages_commands_describe_their_scheme(monkeypatch):
    page = "--tensor-model-parallel-size 2 --zero-stage 1 --powersgd-rank 4 --powersgd-start-iter 10 --train-iters 20"
    assert describe(_validate(monkeypatch, page.split()).compress).startswith(POWERSGD)
    onebit = "--optimizer onebit-adam --onebit-freeze-iters 10 --train-iters 20".split()
    assert describe(_validate(monkeypatch, onebit, 2).compress) == ONEBIT
    link = "--powersgd-rank 2 --powersgd-start-iter 2 --simulated-dp-bandwidth 0.5".split()
    assert describe(_validate(monkeypatch, link, 2).compress).endswith("| simulated DP link 0.5 GB/s (each step "
                                                                       "sleeps its DP bytes / that)")
    assert describe(_validate(monkeypatch, ["--train-iters", "20"], 2).compress) == ""


def _train_rank(rank: int, world: int, argvs: list[list[str]]) -> list[str]:
    from train_in_process import train_runs
    return train_runs(argvs)


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    """One 2-rank launch for the runs below, in turn: the page's two compressing commands shortened, a plain run,
    and (docs/checkpoint.md's pass) a run of 2 steps at global batch 4 saved, resumed for a third at 8."""
    from hybrid.testing import run_distributed
    ck = str(tmp_path_factory.mktemp("ck") / "ck")
    resume = [a for a in TINY if a not in ("--global-batch-size", "4")]
    argvs = [TINY + ["--optimizer", "onebit-adam", "--onebit-freeze-iters", "1", "--train-iters", "2"],
             TINY + ["--powersgd-rank", "2", "--powersgd-start-iter", "2", "--simulated-dp-bandwidth", "0.5",
                     "--train-iters", "3"],
             TINY + ["--train-iters", "2", "--save", ck],
             resume + ["--global-batch-size", "8", "--train-iters", "3", "--load", ck]]
    return run_distributed(_train_rank, 2, args=(argvs,), timeout=300)


def test_rank_zero_prints_the_compress_line_once(launch):
    rank0, rank1 = launch
    lines = [[ln for ln in out.splitlines() if ln.startswith("compress: ")] for out in rank0]
    assert lines[0] == ["compress: 1-bit Adam: Adam for steps 1-1, then the variance frozen and the momentum sent "
                        "as signs with error feedback"], rank0[0]
    assert lines[1] == ["compress: PowerSGD rank 2 on the DP gradients from optimizer step 3 (steps 1-2 plain "
                        "all-reduce; 1-D tensors and small matrices sent whole) | simulated DP link 0.5 GB/s (each "
                        "step sleeps its DP bytes / that)"], rank0[1]
    assert lines[2] == [] and not any("compress: " in out for out in rank1)


def test_consumed_samples_after_a_resume_at_another_global_batch_are_those_read(launch):
    """2 steps of 4 samples, then 1 of 8: 16 samples read by iteration 3 (the log line said 3 x 8 = 24)."""
    rank0, _ = launch
    assert "| consumed samples 8 |" in rank0[2]
    line = [ln for ln in rank0[3].splitlines() if ln.startswith(" iteration      3/3")]
    assert len(line) == 1 and "| consumed samples 16 |" in line[0], rank0[3]


def test_too_short_a_run_for_powersgd_asks_for_more_iterations_not_an_empty_range(monkeypatch, capsys):
    argv = "--powersgd-rank 2 --powersgd-start-iter 2 --train-iters 2".split()
    with pytest.raises(SystemExit) as e:
        _validate(monkeypatch, argv, 2)
    assert "2 <= N < 2" not in str(e.value) and str(e.value).endswith(
        "--train-iters 2 ends first, so nothing would be compressed; give --train-iters above 2 "
        "(--powersgd-start-iter is at least 2), or drop --powersgd-rank")
    with pytest.raises(SystemExit) as e:  # where a start fits, the range as before
        _validate(monkeypatch, "--powersgd-rank 2 --powersgd-start-iter 5 --train-iters 4".split(), 2)
    assert "give --powersgd-start-iter N with 2 <= N < 4 (or a longer --train-iters)" in str(e.value)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
