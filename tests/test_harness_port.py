"""hybrid.testing.run_distributed launches a job again when rank 0's store finds the job's port taken
(EADDRINUSE inside init_process_group, before the test's function ran), and only then: the port race between
free_port() and the store's bind once failed a whole-suite run (test_convert, 2026-12-05)."""

import socket

import pytest

from hybrid import testing


def _rank_and_world(rank, world):
    return rank, world


def _fails(rank, world):
    raise ValueError("the test's own failure")


def _taken_then_free(monkeypatch):
    """free_port() answers a port a listening socket holds, then free ones; returns the listener and the calls."""
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    held.listen()
    calls = []
    real = testing.free_port

    def port():
        calls.append(1)
        return held.getsockname()[1] if len(calls) == 1 else real()
    monkeypatch.setattr(testing, "free_port", port)
    return held, calls


def test_a_taken_port_is_retried_on_a_new_one_and_a_test_failure_is_not(monkeypatch):
    held, calls = _taken_then_free(monkeypatch)
    with held:
        assert testing.run_distributed(_rank_and_world, 2, timeout=60) == [(0, 2), (1, 2)]
        assert len(calls) == 2  # the taken port, then one more launch
        calls.clear()
        monkeypatch.setattr(testing, "PORT_TRIES", 1)  # no retry left: the port error is raised as it was
        with pytest.raises(testing.DistributedFailure, match="EADDRINUSE"):
            testing.run_distributed(_rank_and_world, 2, timeout=60)
    before = len(calls)  # >= 1: from here on free_port() answers free ports only
    with pytest.raises(testing.DistributedFailure, match="the test's own failure"):
        testing.run_distributed(_fails, 2, timeout=60)
    assert len(calls) == before + 1  # a failure of the function is never launched again
