"""Issue 26, round 17: what is left a what-if of hybrid/planner/published17_triton.py once round 18 landed the Triton
kernel (AttentionKernel.TRITON, hybrid/planner/fit.py's joint fit): the H100 eager clock fitted on the 12
FlashAttention-2 rows alone (docs/planner/rounds.md "Round 17: one Triton rate on both cards", "Round 18"). What is
asserted: which rows each fit reads, that the what-if's device is the shipped one at the shipped pair, and that its
documented fits hold."""

from __future__ import annotations

import pytest

from hybrid.planner.families import all_published_runs
from hybrid.planner.fit import triton_share_fit_runs
from hybrid.planner.hardware import H100_EAGER_CLOCK, TRITON_FLASH2_SHARE
from hybrid.planner.published17_triton import (CARD, CLOCK_FITTED, TRITON_SHARE_FITTED, clock_fit_rows, error_on,
                                               fits, ran_triton, six_rows)


@pytest.fixture(scope="module")
def runs():
    return all_published_runs()


def _one(runs, name):
    return next(r for r in runs if r.name == name)


def test_the_fit_sets_are_the_rows_that_ran_each_kernel(runs):
    """The what-if's clock rows ran FlashAttention-2 (the >= 128-GPU H100 table's 1B / 3B / 7B / 70B, 12 rows); the
    Triton share's rows ran Triton, bf16, s >= 8192, on H100 (16 rows, none of the six single-node clock rows, which
    ran Triton too); every A100 MosaicML row ran Triton; the sets are disjoint."""
    clock, triton, six = clock_fit_rows(runs), triton_share_fit_runs(), six_rows(runs)
    assert len(clock) == 12 and len(triton) == 16 and len(six) == 6
    assert all(r.gpu == CARD and r.gpus >= 128 and r.name.split(",")[0] in ("MPT-1b", "MPT-3b", "MPT-7b", "MPT-70b")
               and not ran_triton(r) for r in clock)
    assert all(r.gpu == CARD and ran_triton(r) and not r.workload.fp8 and r.workload.seq_length >= 8192
               for r in triton)
    assert all(r.gpu == CARD and r.gpus == 8 and ran_triton(r) for r in six)
    names = [{r.name for r in rows} for rows in (clock, triton, six)]
    assert not names[0] & names[1] and not names[2] & names[1]
    a100 = [r for r in runs if r.name.startswith("MPT-") and r.gpu.startswith("a100")]
    assert len(a100) > 100 and all(ran_triton(r) for r in a100)
    assert ran_triton(_one(runs, "MPT-13b, s 2048, 512 H100, FSDP z3, b16 x 1, AC"))  # the same table, sweep.py: triton


@pytest.mark.parametrize("name", ["MPT-1b, s 65536, 8 A100, FSDP z3, b1 x 2, AC",
                                  "MPT-1b, s 65536, 8 H100, FSDP z3, b1 x 2, AC",
                                  "MPT-7b, s 2048, 512 H100, FSDP z3, b6 x 1"])
def test_at_the_shipped_pair_the_what_if_is_the_shipped_model(runs, name):
    """fit.mosaicml_device at the shipped clock and share plans each row as the shipped model does (a Triton row on
    either card, a FlashAttention-2 row), and at the 12-row clock the FlashAttention-2 row moves."""
    run = _one(runs, name)
    assert error_on(run, H100_EAGER_CLOCK, TRITON_FLASH2_SHARE) == pytest.approx(run.throughput_error(run.predict()))
    if not ran_triton(run):
        assert error_on(run, CLOCK_FITTED, TRITON_SHARE_FITTED) < run.throughput_error(run.predict()) - 0.02


@pytest.mark.slow
def test_the_documented_fits_are_what_the_named_rows_give():
    """fits() re-derives the clock (12 FlashAttention-2 rows, mean log error 0) and the Triton share (16 rows) the
    docs and the module state (~450 plans: ~5 s of CPU)."""
    clock, share = fits()
    assert clock == pytest.approx(CLOCK_FITTED, abs=2e-4) and share == pytest.approx(TRITON_SHARE_FITTED, abs=2e-4)
