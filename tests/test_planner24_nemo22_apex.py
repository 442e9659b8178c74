"""Round 24 (planner24a): NeMo 22.08's DP traffic as apex's DistributedFusedAdam and NeMo 1.11 ran it
(published21_newsources.nemo22_dp_overlap; docs/planner/round24-nemo22-neox-mcore.md)."""

from dataclasses import replace

import pytest

from hybrid.planner import published21_newsources as new
from hybrid.planner.published_more import evaluate

# (row, error with round 24's reading, error with round 21's: the all-gather under the next forward and the
# reduce-scatter under the last backward on every 22.08 row)
MOVED = (("NeMo 22.08 GPT-3 5B, 256 A100, t1 p1 d256, b2, GBS 2048, no AC", 0.1889, 0.2038),
         ("NeMo 22.08 GPT-3 175B, 1024 A100, t8 p8 d16, b2, GBS 2048, selective + SP", 0.3307, 0.3411))


def _run(name: str):
    return next(r for r in new.nemo22_runs() if r.name == name)


def test_overlap_flags_are_the_runtimes():
    """22.08 (apex step() all-gathers, exposed): overlap_param_gather off on every row; the reduce-scatter under the
    last backward only where NeMo 1.11 leaves overlap_grad_sync on (p 1, no SP: the 5B); 22.06 (fused_adam, ZeRO 0,
    all-reduce after the backward): no reduction overlapped."""
    for run in new.nemo22_runs():
        work, sp, pp = run.workload, run.space.sequence_parallel[0], run.space.pp[0]
        if run.name.startswith("NeMo 22.08"):
            assert not work.overlap_param_gather, run.name
            assert work.overlap_grad_reduce == (pp == 1 and not sp), run.name
        else:
            assert not work.overlap_grad_reduce, run.name


@pytest.mark.parametrize("name, now, before", MOVED)
def test_rows_pay_the_exposed_collectives(name, now, before):
    """Fails if either flag goes back: the rows return to round 21's errors (DP exposed 0.70 s of the 175B's step
    at d 16, was 0.47)."""
    run = _run(name)
    assert evaluate(run).error == pytest.approx(now, abs=5e-4)
    old = replace(run.workload, overlap_param_gather=True, overlap_grad_reduce=True)
    assert evaluate(replace(run, workload=old)).error == pytest.approx(before, abs=5e-4)


def test_one_rank_pays_nothing():
    """At d 1 (ZeRO 0: nothing to reduce or gather) the flags change nothing: the 64-GPU 175B row stays +37.1 %."""
    run = _run("NeMo 22.08 GPT-3 175B, 64 A100, t8 p8 d1, b2, GBS 2048, selective + SP")
    old = replace(run.workload, overlap_param_gather=True, overlap_grad_reduce=True)
    assert evaluate(run).error == pytest.approx(0.3711, abs=5e-4)
    assert evaluate(replace(run, workload=old)).error == evaluate(run).error
