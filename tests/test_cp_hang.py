"""A hang inside a context-parallel ring step is named like any other op: a rank that stalls before a ring send
(iteration 5, micro-batch 1) makes its CP peer print one verdict naming the CP group, the ring step and the
missing rank, and exit 75 within the watchdog timeout + 10 s (hybrid/fault/watchdog.py reads the op trail, where
hybrid/cp/ring.py labels each transfer "cp ring forward step S: recv kv")."""

from __future__ import annotations

import re

import pytest

from hybrid.fault.watchdog import EXIT_HANG
from hybrid.testing import launch

TIMEOUT = 5
CP2 = ["--context-parallel-size", "2", "--micro-batch-size", "2", "--global-batch-size", "4", "--seq-length", "32",
       "--train-iters", "6", "--log-interval", "100", "--watchdog-timeout", str(TIMEOUT), "--eval-iters", "0"]


# exit within the watchdog timeout + 10 s, with no machine to itself: the path from the fault to the exit is
# wall-clock waits (5 s timeout + 0.5 s check + 0.5 s publish + <= 3 s for the peers' verdicts = 9 s, see
# tests/test_fault_hang.py), which load does not lengthen, and milliseconds of CPU
@pytest.mark.slow
def test_a_rank_stalled_before_a_cp_ring_send_is_named_by_its_peer():
    runs = launch(CP2, 2, {"HYBRID_FAULT": "hang:rank=1,op=cp.send,iteration=5,microbatch=1"})
    injected = [r.injected for r in runs if r.injected is not None]
    assert len(injected) == 1, [r.stdout[-500:] for r in runs]
    verdicts = {r.rank: [ln for ln in r.stderr.splitlines() if ln.startswith("hang verdict:")] for r in runs}
    for r in runs:
        assert r.returncode == EXIT_HANG, (r.rank, r.returncode, r.stderr[-2000:])
        assert r.exited - injected[0] <= TIMEOUT + 10
    (line,) = verdicts[0]
    assert "iteration 5 micro-batch 1" in line, line
    assert re.search(r"rank 0 waited [\d.]+s in cp p2p .*\(group cp ranks \[0, 1\]\)", line), line
    # gloo's send completes only when the receiver takes it: rank 0 is blocked on its own send to rank 1
    assert re.search(r"blocked on cp ring forward step 0: (send kv ->|recv kv <-) rank 1", line), line
    assert "not arrived: rank 1 (" in line, line
