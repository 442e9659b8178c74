"""Without torchrun's agent store, rank 0's process is the rendezvous store: when another rank fails first, rank 0
stops (exit 0) only once that rank has released the store -- a connection to a store whose process has exited is
retried until the client's timeout (35 s at the default 10-minute distributed timeout), so rank 0 leaving first held
a 4-rank one-line error for 99 s (hybrid/liveness.py, Heartbeat._outlive_the_claimant). In one process: the store
a TCPStore here, each rank a Heartbeat, os._exit caught."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from hybrid import liveness
from hybrid.testing import free_port


class _Exited(BaseException):
    pass


@pytest.fixture
def heartbeats(monkeypatch):
    """(rank 0's Heartbeat, rank 1's) on a store this process hosts, exits caught: {rank: status}."""
    port = free_port()
    host = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    # 0.05 minutes: beats every 0.5 s; the claimant waits at most max(10 s, 2 beats + 2 s) for the others
    made = [liveness.Heartbeat(rank, 2, 3.0) for rank in (0, 1)]
    exits: dict[int, int] = {}

    def _exit(status: int) -> None:
        exits[threading.current_thread().ident] = status
        raise _Exited

    monkeypatch.setattr(liveness.os, "_exit", _exit)
    yield made, host
    for hb in made:
        _stop(hb)


def _stop(hb: liveness.Heartbeat) -> None:
    """Its beat thread ended before the store goes (it wakes every half beat)."""
    hb.stop()
    hb._thread.join(5.0)


def _stop_in_thread(hb: liveness.Heartbeat, claim: str) -> threading.Thread:
    def body() -> None:
        try:
            hb._stop_for(claim, quiet=True)
        except _Exited:
            pass
    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t


def test_rank_0_hosting_the_store_stays_until_the_claimant_releases_it(heartbeats):
    (hb0, hb1), host = heartbeats
    assert hb0.hosts_store and not hb1.hosts_store
    stopping = _stop_in_thread(hb0, "1:exit")  # rank 1 failed first: rank 0 is told to stop
    stopping.join(0.5)
    assert stopping.is_alive(), "rank 0 left while rank 1 still needs the store"
    assert host.add(f"{hb0._prefix}/stopped", 0) == 1  # it counted itself stopped, for the claimant's wait
    hb1.release()
    stopping.join(5.0)
    assert not stopping.is_alive(), "rank 0 stays past the claimant's release"


def test_a_rank_that_hosts_nothing_stops_at_once(heartbeats, monkeypatch):
    (hb0, _), _ = heartbeats
    monkeypatch.setattr(hb0, "hosts_store", False)  # torchrun's agent store: rank 0 is a client like the others
    t = time.monotonic()
    stopping = _stop_in_thread(hb0, "1:exit")
    stopping.join(5.0)
    assert not stopping.is_alive() and time.monotonic() - t < 2.0


def test_under_torchrun_rank_0_hosts_no_store(heartbeats, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    hb = liveness.Heartbeat(0, 2, 3.0)
    _stop(hb)
    assert not hb.hosts_store


def test_stop_waits_for_the_beat_thread_to_end(heartbeats):
    """The process group is destroyed right after stop() (hybrid.launch.distributed): the beat thread must be gone
    by then, not in a store call or collecting garbage while the interpreter ends."""
    (hb, _), _ = heartbeats
    hb.stop()
    assert not hb._thread.is_alive()
