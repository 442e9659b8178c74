"""The multi-rank harness reports what went wrong: a failing rank's traceback, or a hang; the suite's per-file CPU
(tests/conftest.py) counts the ranks it forks."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from hybrid.testing import DistributedFailure, run_distributed


def _sum_of_ranks(rank, world):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item()


def _rank1_raises(rank, world):
    if rank == 1:
        raise ValueError("boom on rank one")
    return rank


def _rank0_hangs(rank, world):
    if rank == 0:
        time.sleep(300)
    return rank


def test_results_come_back_per_rank():
    assert run_distributed(_sum_of_ranks, 3) == [3.0, 3.0, 3.0]


def test_a_failing_rank_traceback_is_in_the_report():
    with pytest.raises(DistributedFailure, match=r"rank 1 of 2 failed:(.|\n)*ValueError: boom on rank one"):
        run_distributed(_rank1_raises, 2)


def test_a_hang_fails_after_the_timeout_naming_the_rank():
    t0 = time.monotonic()
    # 5 s, not 10: the wait is all this test costs. Rank 1 (a fork: ~0.1 s to start, then a 2-rank rendezvous)
    # returns well within it: the same 2-rank launch in the test above, to a rank's failure reported, took 0.6 s at
    # a load average of ~10 on the 2 cores
    with pytest.raises(DistributedFailure, match=r"ranks \[0\] of 2 did not finish within 5s"):
        run_distributed(_rank0_hangs, 2, timeout=5)
    assert time.monotonic() - t0 < 25


def _burn(rank, world, seconds):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass
    return time.process_time() - start


def test_the_per_file_cpu_counts_the_forked_ranks():
    """conftest's _tree_cpu reads the forkserver's reaped children from /proc: the ranks' CPU lands in the file
    that ran them, not at the session's end."""
    from conftest import _tree_cpu
    before = _tree_cpu()
    burned = sum(run_distributed(_burn, 2, args=(0.5,), timeout=120))
    assert burned >= 1.0 and _tree_cpu() - before >= burned
