"""Several checks in one launch (hybrid.testing.each_case / case_result): a failing case fails only its own test,
with its rank's traceback, and the others still report. And the forkserver's preload (hybrid/testing_preload.py):
a forked rank that builds DeepSpeed's CPU Adam starts no process (no compiler check, no py-cpuinfo interpreter)."""

from __future__ import annotations

import glob
import os
import sys

import pytest

from hybrid import testing
from hybrid.testing import CaseError, DistributedFailure, case_result, each_case, run_distributed


def _square_unless_three(x: int, offset: int = 0) -> int:
    if x == 3:
        raise ValueError("three is refused")
    return x * x + offset


def test_each_case_runs_every_case_and_keeps_a_failures_traceback():
    out = each_case(_square_unless_three, [(1,), (3,), (4,)])
    assert out[(1,)] == 1 and out[(4,)] == 16
    assert isinstance(out[(3,)], CaseError) and "ValueError: three is refused" in out[(3,)].traceback


def test_each_case_passes_the_shared_arguments_first():
    assert each_case(lambda offset, x: x + offset, [(1,), (2,)], 10) == {(1,): 11, (2,): 12}


def test_case_result_fails_only_the_case_that_failed_naming_its_rank():
    per_rank = [each_case(_square_unless_three, [(2,), (3,)]), {(2,): 4, (3,): 9}]
    assert case_result(per_rank, (2,)) == [4, 4]
    with pytest.raises(DistributedFailure, match=r"case \(3,\): rank 0 of 2 failed:(.|\n)*three is refused"):
        case_result(per_rank, (3,))


def _cpu_adam_built() -> bool:
    return bool(glob.glob(os.path.expanduser("~/.cache/torch_extensions/*/cpu_adam/*.so")))


def _construct_cpu_adam_counting_processes(rank, world):
    """Two DeepSpeed CPU Adams in a forked rank; the processes started meanwhile (audit events)."""
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    from hybrid.zero.cpu_adam_build import cpu_adam_build
    started = []
    sys.addaudithook(lambda event, args: started.append(args[1]) if event == "subprocess.Popen" else None)
    with cpu_adam_build(print):
        for _ in range(2):
            DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(8))])
    return started


@pytest.mark.skipif(not _cpu_adam_built(), reason="DeepSpeed CPU Adam not built yet (train.py builds it on first use)")
def test_a_forked_rank_builds_deepspeeds_cpu_adam_without_starting_a_process():
    """Without the preload each construction starts py-cpuinfo's interpreter, the first also a compiler check
    (~1.2 s of CPU a rank)."""
    assert "hybrid.testing_preload" in testing.PRELOAD
    assert run_distributed(_construct_cpu_adam_counting_processes, 1) == [[]]
