"""calibrate's optimizer probe on the main job's mesh (round 24, issue 26): --account read the main job's optimizer
(finish_backward + step) at 29-30 ms of CPU a step, all ranks, against 18-19 planned from a probe on a one-rank mesh,
where every gradient sync is a no-op. The probe now runs at the job's tp / pp / dp as far as the world factors
(job_mesh_dims) and, as the account does, counts its CPU outside the collectives' waits (outside_comm_waits: the
planner prices those per call from the pair probe). That calibrate runs it so is test_calibrate.py's (its 2 ranks at
tp 2: each size a TP shard, fewer parameters than the one-rank stage's)."""

from __future__ import annotations

import time

from hybrid.planner import calibrate as C
from hybrid.trail import TRAIL, OpRecord, Trail


def busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_job_mesh_is_the_main_jobs_where_the_world_factors():
    """8 ranks: the README main job's tp 2 x pp 2 x dp 2; fewer: as much of it as divides."""
    sizes = {w: (d.tp, d.pp, d.dp) for w in (1, 2, 3, 4, 8) for d in [C.job_mesh_dims(w)]}
    assert sizes == {1: (1, 1, 1), 2: (2, 1, 1), 3: (1, 1, 3), 4: (2, 2, 1), 8: (2, 2, 2)}


def test_the_clock_leaves_out_the_collectives_waits_as_the_account_does():
    """20 ms of CPU outside any op, 30 ms inside a blocking wait (the trail's "comm" phase), 10 ms inside a pipeline
    message's ("p2p"): the clock reads the 20; the trail's own switch is back after."""
    rec = OpRecord("dp", (0, 1), "all_reduce", 1, 0, 0, "optimizer")
    msg = OpRecord("pp", (0, 1), "p2p", 0, 0, 0, "optimizer")
    with C.outside_comm_waits() as clock:
        t0 = clock()
        busy(0.02)
        with TRAIL.waiting(rec):
            busy(0.03)
        with TRAIL.waiting(msg):
            busy(0.01)
        took = clock() - t0
    assert 0.018 <= took < 0.028
    assert "_switch" not in vars(TRAIL) and type(TRAIL)._switch is Trail._switch
