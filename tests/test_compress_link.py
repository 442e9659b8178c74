"""The simulated slow DP link (hybrid/compress/link.py): it sleeps the DP gradient bytes of the step divided by the
bandwidth, counting the engine's and the compressors' collectives on the DP group and nothing else."""

import pytest

from hybrid.comm import CommLedger
from hybrid.compress.link import SimulatedLink, dp_gradient_bytes


def test_dp_gradient_bytes_count_the_gradient_collectives_of_the_dp_group_only():
    ledger = CommLedger()
    ledger.record("all_reduce", "dp", 1000)
    ledger.record("all_reduce", "dp:powersgd.p", 40)
    ledger.record("all_gather", "dp", 500)
    ledger.record("all_reduce", "dp:metrics", 4)  # logged losses: not gradient traffic
    ledger.record("all_reduce", "dp:clip", 8)
    ledger.record("all_reduce", "tp", 10_000)
    ledger.record("all_reduce", "dp_cp", 7)
    assert dp_gradient_bytes(ledger, "dp") == 1540


def test_simulated_link_sleeps_bytes_over_bandwidth_per_step(monkeypatch):
    slept = []
    monkeypatch.setattr("hybrid.compress.link.time.sleep", slept.append)
    ledger = CommLedger()
    link = SimulatedLink(2.0, ledger, "dp")  # 2 GB/s
    ledger.record("all_reduce", "dp", 4_000_000_000)
    assert link.delay() == pytest.approx(2.0)
    ledger.record("all_reduce", "dp:powersgd.q", 1_000_000_000)
    assert link.delay() == pytest.approx(0.5)
    assert link.delay() == 0.0
    assert slept == [pytest.approx(2.0), pytest.approx(0.5)]
    # the run's end line (train.py): steps, the seconds asked for and those the sleeps took on the clock
    assert link.steps == 3 and link.slept == pytest.approx(2.5) and 0 <= link.waited < 0.5
    assert link.line().startswith("simulated DP link: 3 steps waited ") and \
        link.line().endswith(" s on the clock for 2.500000 s asked (the DP gradient bytes / 2 GB/s)")


def test_simulated_link_is_off_by_default():
    from hybrid.compress.args import CompressConfig
    assert CompressConfig().simulated_dp_bandwidth == 0.0 and not CompressConfig().enabled
