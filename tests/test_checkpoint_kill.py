"""A rank SIGKILLed in the middle of a save, then a fresh launch: the previous checkpoint loads, `latest` never
names the partial directory, and the resumed run continues exactly. The resumed run also makes 20 back-to-back
asynchronous saves (--save-interval 1 --async-save) while training's TP and DP collectives run between them.

Two launches of `python -m hybrid.train` as 4 ranks forked from hybrid.testing's forkserver (launch; tp 2 x dp 2,
ZeRO 1), no torchrun restart -- the second is a new job, as an operator (or a scheduler) would start after a crash:

  A  --save-interval 2; rank 1 sends itself SIGKILL inside the save of iteration 4, after writing its own .distcp
     file and before DCP's .metadata (HYBRID_FAULT crash:point=after_rank_files,...,signal=SIGKILL): a kill
     between the files of a save.
  B  --load the same directory: resumes from iteration 2; its losses at iterations 3 and 4 are those A logged
     (A logged them before the kill: the loss line is printed before the save), bit for bit; 20 asynchronous
     saves (iterations 3-22), --save-keep 3.
"""

from __future__ import annotations

import os
import re
import signal

import pytest

from hybrid.checkpoint import store
from hybrid import testing
from hybrid.testing import launch

ITERS = 22  # both launches: the LR schedule (cosine over --train-iters) must be the same
COMMON = ["--tensor-model-parallel-size", "2", "--zero-stage", "1", "--micro-batch-size", "2", "--global-batch-size",
          "8", "--seq-length", "32", "--train-iters", str(ITERS), "--log-interval", "1",
          "--distributed-timeout-minutes", "1", "--eval-iters", "1"]  # end-of-run passes: one batch each
KILL = "crash:point=after_rank_files,rank=1,iteration=4,signal=SIGKILL"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _losses(stdout: str) -> dict[int, str]:
    return {int(i): loss for i, loss in re.findall(r" iteration +(\d+)/\d+ \| lm loss (\S+)", stdout)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    save = str(tmp_path_factory.mktemp("kill") / "ckpt")
    a = launch(COMMON + ["--save", save, "--save-interval", "2"], world=4, env={"HYBRID_FAULT": KILL}, timeout=240,
               teardown_after=2.0)  # torchrun would stop the job; rank 0 hosted the store, so no one finishes
    on_disk = {"latest": store.read_latest(save), "complete": store.complete_iterations(save),
               "listing": sorted(os.listdir(save)),
               "partial": sorted(os.listdir(store.tmp_path(save, 4))) if os.path.isdir(store.tmp_path(save, 4)) else None}
    b = launch(COMMON + ["--load", save, "--save", save, "--save-interval", "1", "--async-save", "--save-keep", "3"],
               world=4, timeout=400)
    return {"save": save, "a": a, "disk": on_disk, "b": b}


@pytest.mark.slow
def test_a_rank_killed_between_the_files_of_a_save_leaves_latest_on_the_previous_checkpoint(runs):
    a, disk = runs["a"], runs["disk"]
    assert a[1].returncode == -signal.SIGKILL, (a[1].returncode, a[1].stdout[-1500:], a[1].stderr[-1500:])
    assert "inject: SIGKILL to rank 1 at crash point after_rank_files of the save of iteration 4" in a[1].stdout
    assert all(a[r].returncode != 0 for r in (0, 2, 3))  # no survivor completed the run
    assert disk["latest"] == 2 and disk["complete"] == [2]
    assert "iter_0000004" not in disk["listing"] and "iter_0000004.tmp" in disk["listing"]
    # the partial directory: rank 1's data file is there, DCP's .metadata and our manifest are not
    assert "__1_0.distcp" in disk["partial"] and ".metadata" not in disk["partial"]
    assert store.MANIFEST not in disk["partial"]


@pytest.mark.slow
def test_a_fresh_launch_resumes_from_the_previous_checkpoint_and_continues_exactly(runs):
    save, a, b = runs["save"], runs["a"], runs["b"]
    assert all(r.returncode == 0 for r in b), [(r.rank, r.returncode, r.stderr[-1500:]) for r in b]
    out = b[0].stdout
    assert f"checkpoint: resumed from {store.final_path(save, 2)} " in out
    assert "checkpoint: removed the unfinished iter_0000004.tmp of an earlier save" in out
    before, after = _losses(a[0].stdout), _losses(out)
    assert sorted(after) == list(range(3, ITERS + 1)) and {3, 4} <= set(before)
    assert after[3] == before[3] and after[4] == before[4], (before, after)


@pytest.mark.slow
def test_twenty_back_to_back_async_saves_with_training_between_them_all_complete(runs):
    save, out = runs["save"], runs["b"][0].stdout
    saved = [int(i) for i in re.findall(r"checkpoint: saved iteration (\d+) to ", out)]
    assert saved == list(range(3, ITERS + 1)) and len(saved) == 20
    assert store.complete_iterations(save) == [ITERS - 2, ITERS - 1, ITERS] and store.read_latest(save) == ITERS
    assert not [n for n in os.listdir(save) if n.endswith(".tmp")]


@pytest.mark.slow
def test_a_crash_fault_with_signal_kills_the_process_and_a_bad_signal_is_refused():
    code = ("from hybrid.checkpoint.faults import crash_point\n"
            "crash_point('after_data', 3)\n"  # another iteration: no-op
            "crash_point('before_rename', 4)\n"  # another point: no-op
            "print('alive', flush=True)\n"
            "crash_point('after_data', 4)\n"
            "print('survived', flush=True)\n")
    env = {"HYBRID_FAULT": "crash:point=after_data,iteration=4,signal=SIGKILL", "RANK": "0"}
    p = testing.run(["-c", code], env=env, timeout=120)  # `python -c CODE` as a fork of the forkserver
    assert p.returncode == -signal.SIGKILL and "alive" in p.stdout and "survived" not in p.stdout, p
    from hybrid.fault.inject import parse
    with pytest.raises(ValueError, match="crash fault's signal= must name a signal"):
        parse("crash:point=after_data,signal=SIGNOPE")
