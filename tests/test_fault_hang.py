"""Hang verdicts: a rank that stalls before a DP all-reduce, before a pipeline send, or stops
(SIGSTOP) makes every live rank print one verdict line naming the group, the op, iteration 5,
micro-batch 1 and the missing rank, then exit 75 within the watchdog timeout + 10 s.

The three jobs run at once (hybrid.testing.launch_together: their start-up and their 5 s waits overlap), beside
whatever the other xdist worker runs. The bound needs no machine to itself: from the waiter's entry into the op,
a live rank's path to its exit is wall-clock waits of hybrid/fault/watchdog.py, which load does not lengthen --
the stall noticed after `timeout` (5 s) at the next check (interval = timeout / 10 = 0.5 s), the alarm seen by
the others at their next check (0.5 s), one interval for every rank to publish (0.5 s), at most 2 intervals + 2 s
for the peers' verdicts (3 s): 9.5 s -- plus milliseconds of CPU (a store read, the verdict, os._exit). The 5.5 s
left of the 15 s cover the compute between the injection and that entry (part of a micro-batch), the launcher's
poll (0.1 s) and scheduling delays. The watchdog's own thresholds (5 s without progress inside a step, a heartbeat
2.5 s old) are wall-clock too, far above a tiny model's step and a 0.5 s heartbeat on a loaded 2-core machine."""

from __future__ import annotations

import re

import pytest

from hybrid.testing import launch_together
from hybrid.fault.watchdog import EXIT_HANG, not_arrived, verdict

TIMEOUT = 5  # --watchdog-timeout in these runs (seconds)
COMMON = ["--micro-batch-size", "2", "--global-batch-size", "8", "--seq-length", "32", "--train-iters", "6",
          "--log-interval", "100", "--watchdog-timeout", str(TIMEOUT)]
TP2_DP2 = ["--tensor-model-parallel-size", "2", *COMMON]  # 4 ranks: tp [0,1] [2,3], dp [0,2] [1,3]; 2 micro-batches
PP2 = ["--pipeline-model-parallel-size", "2", *COMMON]  # 2 ranks, 4 micro-batches


def _verdicts(run) -> list[str]:
    return [line for line in run.stderr.splitlines() if line.startswith("hang verdict:")]


def _check_every_live_rank_exits_with_one_verdict(runs, stopped: set[int] = frozenset()) -> dict[int, str]:
    injected = [r.injected for r in runs if r.injected is not None]
    assert len(injected) == 1, [r.stdout[-500:] for r in runs]
    lines = {}
    for r in runs:
        if r.rank in stopped:
            assert r.returncode is None and not _verdicts(r), "a stopped rank cannot speak"
            continue
        assert r.returncode == EXIT_HANG, (r.rank, r.returncode, r.stderr[-2000:])
        assert r.exited - injected[0] <= TIMEOUT + 10, f"rank {r.rank} exited {r.exited - injected[0]:.1f}s after the fault"
        (lines[r.rank],) = _verdicts(r)
        assert "iteration 5 micro-batch 1" in lines[r.rank], lines[r.rank]
    return lines


JOBS = {  # name -> (argv, world, HYBRID_FAULT)
    "dp": (TP2_DP2, 4, "hang:rank=2,op=dp.all_reduce,iteration=5,microbatch=1"),
    "pp": (PP2, 2, "hang:rank=1,op=pp.send,iteration=5,microbatch=1"),
    "stop": (TP2_DP2, 4, "stop:rank=2,op=dp.all_reduce,iteration=5,microbatch=1"),
}


@pytest.fixture(scope="module")
def hung() -> dict:
    """The three jobs launched together, each as `launch` alone would run it: name -> its ranks' runs."""
    names = list(JOBS)
    runs = launch_together([dict(argv=JOBS[n][0], world=JOBS[n][1], env={"HYBRID_FAULT": JOBS[n][2]})
                            for n in names])
    return dict(zip(names, runs))


@pytest.mark.slow
def test_a_rank_stalled_before_a_dp_all_reduce_is_named_by_every_live_rank(hung):
    lines = _check_every_live_rank_exits_with_one_verdict(hung["dp"])
    # rank 0 shares the DP group [0, 2]: it waits in the all-reduce rank 2 never started
    assert re.search(r"rank 0 waited [\d.]+s in dp all_reduce #\d+ \(group dp ranks \[0, 2\]\) at iteration 5 "
                     r"micro-batch 1; not arrived: rank 2 \(", lines[0]), lines[0]
    assert "in tp all_reduce" in lines[3] and "not arrived: rank 2 (" in lines[3], lines[3]  # its TP peer
    assert "itself waiting in dp all_reduce" in lines[1] and "for ranks [2]" in lines[1], lines[1]  # the cascade
    assert "rank 2 is in no communication op" in lines[2] and "rank 0 in dp all_reduce" in lines[2], lines[2]


@pytest.mark.slow
def test_a_rank_stalled_before_a_pipeline_send_is_named_by_its_peer(hung):
    lines = _check_every_live_rank_exits_with_one_verdict(hung["pp"])
    # stage 1 never sends the input gradient of micro-batch 1: stage 0's receive of it is blocked
    assert re.search(r"rank 0 waited [\d.]+s in pp p2p \[.*\] \(group pp ranks \[0, 1\]\) at iteration 5", lines[0])
    assert "blocked on" in lines[0] and "recv_grad of micro-batch 1 <- rank 1" in lines[0], lines[0]
    assert "not arrived: rank 1 (" in lines[0], lines[0]


@pytest.mark.slow
def test_a_stopped_rank_is_reported_by_its_peers_as_not_heart_beating(hung):
    lines = _check_every_live_rank_exits_with_one_verdict(hung["stop"], stopped={2})
    assert re.search(r"in dp all_reduce #\d+ .* not arrived: rank 2 \(no heartbeat for [\d.]+s: stopped or dead",
                     lines[0]), lines[0]
    assert "rank 2 (no heartbeat" in lines[3], lines[3]


# --- the verdict as a pure function of the published states (no processes) ---------------------
def _state(rank, seq=None, p2p=None, pending=(), t=100.0, phase="backward"):
    return {"rank": rank, "t": t, "iteration": 5, "microbatch": 1, "phase": phase, "idle": 9.0,
            "seq": seq or {}, "done": {}, "p2p": p2p or {}, "pending": list(pending)}


def _rec(group, ranks, op, seq=0, p2p=()):
    return {"group": group, "ranks": list(ranks), "op": op, "seq": seq, "iteration": 5, "microbatch": 1,
            "phase": "backward", "p2p": [list(x) for x in p2p], "started": 91.0}


def test_not_arrived_compares_sequence_numbers_and_matching_p2p_counters():
    ar = _rec("dp", [0, 2], "all_reduce", seq=4)
    states = {0: _state(0, {"dp": 4}, pending=[ar]), 2: _state(2, {"dp": 3})}
    assert not_arrived(ar, 0, states) == [2]
    states[2]["seq"]["dp"] = 4  # rank 2 started it too: the op is stuck, nobody is missing
    assert not_arrived(ar, 0, states) == []
    send = _rec("pp", [0, 1], "p2p", p2p=[("send", 1, 3, "send_act of micro-batch 2")])
    # our 3rd send to rank 1 meets its 3rd receive from rank 0
    assert not_arrived(send, 0, {1: _state(1, p2p={"recv:0": 2})}) == [1]
    assert not_arrived(send, 0, {1: _state(1, p2p={"recv:0": 3})}) == []


@pytest.mark.parametrize("age,word", [(0.5, "heartbeat 0.5s ago"), (8.0, "no heartbeat for 8.0s: stopped or dead")])
def test_verdict_names_op_iteration_micro_batch_and_the_missing_rank(age, word):
    ar = _rec("dp", [0, 2], "all_reduce", seq=4)
    states = {0: _state(0, {"dp": 4}, pending=[ar]), 2: _state(2, {"dp": 3}, t=100.0 - age)}
    line = verdict(0, states, now=100.0, stale_after=3.0)
    assert line.startswith("hang verdict: rank 0 waited 9.0s in dp all_reduce #4 (group dp ranks [0, 2]) at "
                           "iteration 5 micro-batch 1; not arrived: rank 2 ("), line
    assert word in line


def test_with_lazy_pipeline_waits_the_verdict_names_the_op_waited_for_not_an_early_posted_one():
    """The pipeline posts sends and receives ahead and waits for each only when needed: rank 0 here has a
    posted receive of micro-batch 3 (rank 1 has not sent it yet -- only early, not stuck) and waits for the
    gradient of micro-batch 1, which rank 1 never sent. The verdict names the wait; rank 1, waiting for
    nothing, is reported as outside any op and awaited by rank 0."""
    early = _rec("pp", [0, 1], "p2p", p2p=[("recv", 1, 4, "recv_act of micro-batch 3")])
    waited = _rec("pp", [0, 1], "p2p", p2p=[("recv", 1, 2, "recv_grad of micro-batch 1")])
    unwaited_send = _rec("pp", [0, 1], "p2p", p2p=[("send", 0, 2, "send_grad of micro-batch 0")])
    states = {0: _state(0, p2p={"recv:1": 4}, pending=[early, waited]),
              1: _state(1, p2p={"send:0": 1, "recv:0": 2}, pending=[unwaited_send], phase="forward")}
    states[0]["blocked"], states[1]["blocked"] = 1, None
    line = verdict(0, states, now=100.0, stale_after=3.0)
    assert "blocked on recv_grad of micro-batch 1 <- rank 1" in line and "micro-batch 3" not in line, line
    line = verdict(1, states, now=100.0, stale_after=3.0)
    assert line.startswith("hang verdict: rank 1 is in no communication op (forward"), line
    assert "awaited by: rank 0 in pp p2p [recv_grad of micro-batch 1" in line, line


def test_a_rank_outside_any_op_names_the_collective_a_peer_has_not_started():
    """NCCL returns from a collective at launch and blocks later (loss.item()): no op is pending, the
    sequence numbers alone name who is behind."""
    last = {"dp": {"op": "all_reduce", "seq": 17, "ranks": [0, 2], "iteration": 5, "microbatch": 1}}
    states = {0: _state(0, {"dp": 17}, phase="other"), 2: _state(2, {"dp": 16})}
    states[0]["last"] = last
    line = verdict(0, states, now=100.0, stale_after=3.0)
    assert line.endswith("not arrived: dp all_reduce #17 at iteration 5 micro-batch 1 not started by ranks [2]"), line


@pytest.mark.parametrize("argv,message", [(["--watchdog-timeout", "-1"], "--watchdog-timeout must be a number of seconds in [0, "),
                                          (["--max-skipped-steps", "0"], "--max-skipped-steps must be >= 1"),
                                          (["--straggler-factor", "1"], "--straggler-factor must be a finite number > 1")])
def test_bad_fault_flags_are_rejected_before_any_process_group(argv, message, monkeypatch):
    from hybrid.train.main import main
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(SystemExit, match=f"train.py: error: {re.escape(message)}"):
        main(argv)
