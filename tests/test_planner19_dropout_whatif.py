"""Round 19 (issue 26, planner19a): the attention-dropout what-if of hybrid/planner/published19.py, which the shipped
model does not read (docs/planner/round19-gemm-ceiling.md, part 2). Two plans; ~1 s."""

from __future__ import annotations

import pytest

from hybrid.planner.published19 import DROPOUT_SLOWDOWN, attention_dropout_slowdown


def _run(name: str):
    from hybrid.planner.families import all_published_runs
    return next(r for r in all_published_runs() if r.name == name)


def test_the_factor_is_pr_2597s_forward_and_backward_shares_at_the_benchmarks_weights():
    assert DROPOUT_SLOWDOWN == pytest.approx((1 / 0.80 + 2.5 / 0.65) / 3.5) and 1.45 < DROPOUT_SLOWDOWN < 1.46


def test_it_slows_the_attention_of_a_dropout_workload_only_and_is_undone():
    """Megatron-Core's 1.7B (dropout 0.1, Megatron's default): attention x the factor, nothing else, and the
    shipped model back after the block; a DGXC Llama row (dropout 0) does not move."""
    from hybrid.planner import time as time_model
    mcore = _run("Megatron-Core 1.7B, 48 H100, t1 p1 d48")
    llama = _run("DGXC 25.04.01 Llama3.1-8B BF16, 8 H100, t1 p1 cp2, b1, GBS 128")
    shipped = [r.predict() for r in (mcore, llama)]
    with attention_dropout_slowdown():
        inside = [r.predict() for r in (mcore, llama)]
    # the factor replaces round 20's landed Hopper cost (hardware.HOPPER_ATTENTION_DROPOUT, 1.034) in the shipped plan
    from hybrid.planner.hardware import HOPPER_ATTENTION_DROPOUT
    assert inside[0].time.term("attention") == pytest.approx(DROPOUT_SLOWDOWN / HOPPER_ATTENTION_DROPOUT
                                                             * shipped[0].time.term("attention"))
    assert inside[0].time.term("gemm") == pytest.approx(shipped[0].time.term("gemm"))
    assert mcore.throughput_error(inside[0]) == pytest.approx(0.129, abs=0.003)  # +23.1 % as shipped (0.155 at
    # +26.2 % before round 25's unfused Megatron loss; +27.0 % and 0.162 before round 21's fc1 bias gradient)
    assert llama.throughput_error(inside[1]) == pytest.approx(llama.throughput_error(shipped[1]), rel=1e-12)
    assert time_model._Context.flash_seconds.__qualname__ == "_Context.flash_seconds"
    assert mcore.predict().time.total == pytest.approx(shipped[0].time.total, rel=1e-12)
