"""A DiLoCo resume at another outer schedule (--diloco-inner-steps H, --diloco-fragments K,
--diloco-fragment-sync-delay tau) is taken only from a checkpoint saved at an outer sync of the whole model;
mid-round it is one line from train.py's checks, before any process group (hybrid/diloco/run.schedule_change).

Repro (round 17): a checkpoint saved at iteration 6 with H 4, K 2, tau 1 -- fragment 0's all-reduce in flight --
resumed with --diloco-inner-steps 8 was accepted by every check. The schedule is a function of the iteration
(outer.due), so at H 8 fragment 0 would land only after step 13 while fragment 1 is posted after step 8, over the
one in-flight slot: fragment 0's averaged delta lost without a word (shown below with due() itself). Without
fragments, mid-round, the round in progress would end after neither H nor the new H steps.

Defined and accepted: at a sync (K 1, nothing in flight, iteration = tau + a multiple of H) every replica holds
theta, and the new schedule counts from iteration 0 as always: the first outer step after the resume is at the
first iteration the new H names (so that round may be shorter than H). In this process, as train.py's checks read
the checkpoint's state.json (tests/test_newuser17_newuser.py's pattern)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hybrid.checkpoint.args import CheckpointConfig
from hybrid.diloco import run as diloco_run
from hybrid.diloco.args import DiLoCoConfig, check_run
from hybrid.diloco.outer import DiLoCo
from hybrid.mesh import ParallelDims
from hybrid.train.args import parse_args

pytestmark = pytest.mark.usefixtures("one_process")

ZERO = SimpleNamespace(stage=1)


def _check(monkeypatch, saved: dict, iteration: int, inflight: int | None, argv: list[str]):
    state = {"iteration": iteration, "args": saved, "layout": {"tp": 1, "pp": 1, "dp": 2, "zero": 1}}
    if inflight is not None:
        state["diloco.inflight"] = inflight
    monkeypatch.setattr(diloco_run, "_saved_state", lambda ckpt: state)
    args = parse_args(["--model", "tiny-gpt2", "--seq-length", "32", "--train-iters", "24", *argv])
    return check_run(args, ParallelDims.from_world(2), CheckpointConfig(load="ck"), ZERO)


H4 = {"diloco_inner_steps": 4}
H4_TAU1 = {"diloco_inner_steps": 4, "diloco_fragment_sync_delay": 1}
H4_K2_TAU1 = {"diloco_inner_steps": 4, "diloco_fragments": 2, "diloco_fragment_sync_delay": 1}


@pytest.mark.parametrize("saved, iteration, inflight, argv, said", [
    (H4, 6, None, ["--diloco-inner-steps", "8"],
     "--load ck was saved at iteration 6, 2 inner steps into a round of --diloco-inner-steps 4 (the replicas apart "
     "since their sync at iteration 4); resume with --diloco-inner-steps 4, or change the schedule from a "
     "checkpoint saved at an outer sync (an iteration that is a multiple of 4)"),
    (H4, 7, None, ["--diloco-inner-steps", "4", "--diloco-fragments", "2"],
     "--load ck was saved at iteration 7, 3 inner steps into a round of --diloco-inner-steps 4 (the replicas apart "
     "since their sync at iteration 4); resume with --diloco-fragments 1, or change the schedule from a checkpoint "
     "saved at an outer sync (an iteration that is a multiple of 4)"),
    (H4_TAU1, 8, 0, ["--diloco-inner-steps", "2", "--diloco-fragment-sync-delay", "1"],
     "--load ck was saved at iteration 8, with the outer all-reduce in flight (--diloco-fragment-sync-delay 1); "
     "resume with --diloco-inner-steps 4, or change the schedule from a checkpoint saved at an outer sync (an "
     "iteration that is 1 more than a multiple of 4)"),
    (H4_TAU1, 10, -1, ["--diloco-inner-steps", "4", "--diloco-fragment-sync-delay", "2"],
     "--load ck was saved at iteration 10, 1 inner step into a round of --diloco-inner-steps 4 (the replicas apart "
     "since their sync at iteration 9); resume with --diloco-fragment-sync-delay 1, or change the schedule from a "
     "checkpoint saved at an outer sync (an iteration that is 1 more than a multiple of 4)"),
    (H4_K2_TAU1, 6, 0, ["--diloco-inner-steps", "8", "--diloco-fragments", "2", "--diloco-fragment-sync-delay", "1"],
     "--load ck was saved with --diloco-fragments 2, whose fragments sync at different steps (one is always "
     "mid-round); resume with --diloco-inner-steps 4, as saved"),
])
def test_a_mid_round_change_of_schedule_is_refused_before_any_process_group(monkeypatch, saved, iteration, inflight,
                                                                             argv, said):
    with pytest.raises(ValueError) as e:
        _check(monkeypatch, saved, iteration, inflight, argv)
    assert str(e.value) == said


def test_the_refused_fragment_case_would_lose_the_delta_in_flight():
    """Why the H 4, K 2, tau 1 checkpoint of iteration 6 cannot go on at H 8: fragment 0, posted after step 6 (it
    5), is due to land after step 7 at H 4; at H 8 no landing of fragment 0 is due before fragment 1's post after
    step 8 (it 7), which takes the one in-flight slot (DiLoCo.post overwrites `inflight`)."""
    old = SimpleNamespace(cfg=DiLoCoConfig(inner_steps=4, fragments=2, fragment_sync_delay=1))
    new = SimpleNamespace(cfg=DiLoCoConfig(inner_steps=8, fragments=2, fragment_sync_delay=1))
    assert DiLoCo.due(old, 5) == [0] and DiLoCo.due(old, 6, 1) == [0]  # as saved: posted, then landed
    assert DiLoCo.due(new, 6, 1) == [] and DiLoCo.due(new, 7) == [1]  # resumed at H 8: not landed, 1 posted over it


@pytest.mark.parametrize("saved, iteration, inflight, argv, h", [
    (H4, 8, None, ["--diloco-inner-steps", "8"], 8),
    (H4, 8, None, ["--diloco-inner-steps", "3"], 3),
    (H4, 8, None, ["--diloco-inner-steps", "4", "--diloco-fragments", "2"], 4),
    (H4_TAU1, 9, -1, ["--diloco-inner-steps", "6", "--diloco-fragment-sync-delay", "1"], 6),
    (H4, 6, None, ["--diloco-inner-steps", "4"], 4),  # the same schedule resumes mid-round (test_diloco_checkpoint)
    (H4_K2_TAU1, 6, 0, ["--diloco-inner-steps", "4", "--diloco-fragments", "2", "--diloco-fragment-sync-delay",
                        "1"], 4),
])
def test_a_change_at_an_outer_sync_is_taken(monkeypatch, saved, iteration, inflight, argv, h):
    assert _check(monkeypatch, saved, iteration, inflight, argv).inner_steps == h


def test_after_a_change_at_a_sync_the_rounds_count_from_iteration_zero():
    """Resumed at iteration 8 (a sync of H 4) with H 3: the first outer step is after step 9 (it 8, 9 = 3 x 3) --
    one inner step after the resume -- then every 3 steps, as a run at H 3 from the start would have them."""
    new = SimpleNamespace(cfg=DiLoCoConfig(inner_steps=3))
    assert [it + 1 for it in range(8, 16) if DiLoCo.due(new, it)] == [9, 12, 15]
