"""Eleventh-round new-user findings: README.md and each doc page's first command as written, the `hybrid` commands
rounds 8-10 did not walk (layout, models, checkpoint, calibrate, plan --hardware / --explain / --json), the
DeepSpeed JSON and Megatron-LM flags users carry over, the scripts run by hand, and the launcher's environment
(rounds 8-10: tests/test_newuser{8,9,10}_inputs.py, not redone here).

In this process, one rank, no process group (the shared harness: hybrid/testing_inputs.py, conftest's `one_line`)."""

from __future__ import annotations

import pytest

from hybrid.train.main import validate

pytestmark = pytest.mark.usefixtures("one_process")  # tests/conftest.py: python, not torchrun: world 1


def _world(monkeypatch, n: int, rank: int = 0) -> None:
    """torchrun's environment for rank `rank` of `n` on one node: validate then checks the layout of an n-rank job."""
    for name, value in (("WORLD_SIZE", str(n)), ("RANK", str(rank)), ("LOCAL_RANK", str(rank)),
                        ("LOCAL_WORLD_SIZE", str(n)), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)


# --- 1. the default watchdog beside a short --distributed-timeout-minutes: it could never fire -----------------------
def _timeout_warning(minutes: str, seconds: str, half: str) -> str:
    return (f"train.py: warning: --distributed-timeout-minutes {minutes} ({seconds} s) is not above the default "
            f"--watchdog-timeout 300 s: a hung collective times out first and the hang verdict never prints; give a "
            f"--watchdog-timeout below {seconds} (e.g. {half}), or --watchdog-timeout 0 to turn the watchdog off")


@pytest.mark.parametrize("minutes, seconds, half", [("1", "60", "30"), ("5", "300", "150"), ("0.2", "12", "6")])
def test_default_watchdog_beside_a_short_collective_timeout_warns_once_on_rank0(minutes, seconds, half, capsys,
                                                                                  monkeypatch):
    """Round 10 refused a --watchdog-timeout given at or above the collectives' timeout and left the default 300 s
    beside `--distributed-timeout-minutes 1` alone: the collective timed out at 60 s, with gloo's or NCCL's message,
    and the verdict docs/operations.md teaches to read never printed -- without a word. Now one warning naming both
    flags and the fix; the run is not refused (the watchdog was not asked for) and the watchdog is not lowered."""
    _world(monkeypatch, 2)
    run = validate(["--distributed-timeout-minutes", minutes])[0]
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert lines == [_timeout_warning(minutes, seconds, half)], lines
    assert run.fault.watchdog_timeout == 300.0 and run.parallel.timeout_minutes == float(minutes)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    validate(["--distributed-timeout-minutes", minutes])
    assert capsys.readouterr().err == ""  # rank 0's alone


@pytest.mark.parametrize("argv", [["--distributed-timeout-minutes", "5.01"],  # 300.6 s: above the watchdog
                                  ["--distributed-timeout-minutes", "1", "--watchdog-timeout", "30"],  # nested
                                  ["--distributed-timeout-minutes", "1", "--watchdog-timeout", "0"],  # off
                                  []])  # the defaults: 300 s < 10 minutes
def test_nested_or_disabled_watchdog_or_the_defaults_print_no_warning(argv, capsys, monkeypatch):
    _world(monkeypatch, 2)
    assert validate(argv)[0].warnings == ()
    assert capsys.readouterr().err == ""


def test_one_rank_runs_no_watchdog_so_a_short_timeout_warns_nothing(capsys):
    """hybrid/fault/session.py starts the watchdog at world > 1 only."""
    assert validate(["--distributed-timeout-minutes", "1"])[0].warnings == ()
    assert capsys.readouterr().err == ""
