"""Round 17's new-user pass over the newest features -- DiLoCo at ZeRO 3 / with CP / with MoE (docs/diloco.md), MoE
with context parallelism (docs/moe.md) and `python -m hybrid.planner.families` -- with bad and edge inputs. Most
were already one line naming the flag and the fix; these were not:

1. A size that must divide another named no size that does: "--diloco-replicas 3 must divide the data-parallel size
   4", "--expert-model-parallel-size 3 x ... must divide the 4 ranks of a pipeline stage" -- now the sizes that fit.
2. DiLoCo with MoE: "must divide the 1 ranks of a DiLoCo replica's pipeline stage ...; use a smaller
   --expert-model-parallel-size or fewer --diloco-replicas" -- "1 rank", and the replica counts that fit.
3. `python -m hybrid.planner.families --help` (or any stray word) planned every published row (43 s here) and printed the
   report -- --help says what it prints; a stray word is one line, before any planning.
4. A DiLoCo resume at another --diloco-replicas (or tau > 0 vs 0) was refused only after every rank had started its
   process group and built the model -- now by train.py's checks, from the checkpoint's state.json.

In this process: the checks run before any process group (train.py's run_config at the world given)."""

from __future__ import annotations

import pytest

from hybrid.train.args import parse_args, run_config

pytestmark = pytest.mark.usefixtures("one_process")


def _check(argv: list[str], world: int):
    return run_config(parse_args(["--seq-length", "32", "--train-iters", "8", *argv]), world)


@pytest.mark.parametrize("argv, world, said", [
    (["--model", "tiny-gpt2", "--diloco-inner-steps", "4", "--diloco-replicas", "3"], 4,
     "--diloco-replicas 3 must divide the data-parallel size 4: give 1, 2 or 4, or drop it (each DP rank its own "
     "replica)"),
    (["--model", "tiny-mixtral", "--expert-model-parallel-size", "3"], 4,
     "--expert-model-parallel-size 3 x --expert-tensor-parallel-size 1 must divide the 4 ranks of a pipeline stage "
     "(tp x cp x dp); give --expert-model-parallel-size 1, 2 or 4"),
    (["--model", "tiny-mixtral", "--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "3"], 4,
     "must divide the 4 ranks of a pipeline stage (tp x cp x dp); give a smaller --expert-tensor-parallel-size"),
    (["--model", "tiny-mixtral", "--context-parallel-size", "2", "--expert-model-parallel-size", "4"], 2,
     "must divide the 2 ranks of a pipeline stage (tp x cp x dp); give --expert-model-parallel-size 1 or 2"),
    (["--model", "tiny-mixtral", "--diloco-inner-steps", "4", "--expert-model-parallel-size", "2"], 4,
     "--expert-model-parallel-size 2 x --expert-tensor-parallel-size 1 must divide the 1 rank of a DiLoCo replica's "
     "pipeline stage (tp x cp x dp / R, R = 4 replicas): the token all-to-all stays inside a replica; give "
     "--diloco-replicas 1 or 2"),
    (["--model", "tiny-mixtral", "--diloco-inner-steps", "4", "--context-parallel-size", "2",
      "--expert-model-parallel-size", "4", "--diloco-replicas", "2"], 4,
     "must divide the 2 ranks of a DiLoCo replica's pipeline stage (tp x cp x dp / R, R = 2 replicas): the token "
     "all-to-all stays inside a replica; give --diloco-replicas 1"),
])
def test_a_size_that_does_not_divide_names_the_sizes_that_do(argv, world, said):
    with pytest.raises(ValueError) as e:
        _check(argv, world)
    assert str(e.value).endswith(said), str(e.value)


def test_each_size_offered_is_taken():
    """The sizes the lines offer are accepted (the hand-derived ones: dp 4 = 1, 2, 4 replicas; a stage of 4 ranks
    holds ep 1, 2, 4; DiLoCo's one-rank replicas hold no ep 2, two-rank ones do)."""
    run = _check(["--model", "tiny-gpt2", "--diloco-inner-steps", "4", "--diloco-replicas", "2"], 4)
    assert run.diloco.replicas == 2
    assert _check(["--model", "tiny-mixtral", "--expert-model-parallel-size", "4"], 4).moe.expert_parallel == 4
    run = _check(["--model", "tiny-mixtral", "--diloco-inner-steps", "4", "--expert-model-parallel-size", "2",
                  "--diloco-replicas", "2"], 4)
    assert run.diloco.replicas == 2 and run.moe.expert_parallel == 2


def test_families_report_takes_help_and_refuses_a_stray_word_before_planning(one_line, capsys, monkeypatch):
    from hybrid.planner import families
    monkeypatch.setattr(families, "all_rows", lambda: pytest.fail("planned before parsing"))
    with pytest.raises(SystemExit) as e:
        families.main(["--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: python -m hybrid.planner.families [-h]")
    line = one_line(lambda: families.main(["--card", "h100"]))
    assert line == "python -m hybrid.planner.families: error: unrecognized arguments: --card; see --help"


# --- 4. a DiLoCo resume at another number of replicas, refused before any process group --------------------------
@pytest.mark.parametrize("argv, saved, said", [
    (["--diloco-replicas", "1"], {"diloco_inner_steps": 2, "diloco_replicas": 2},
     "--load ck holds DiLoCo state of 2 replicas, this run has 1; resume with --diloco-replicas 2 (and a DP size it "
     "divides)"),
    ([], {"diloco_inner_steps": 2, "diloco_replicas": 2, "diloco_fragment_sync_delay": 1},
     "--load ck was saved with --diloco-fragment-sync-delay 1, this run has 0; resume with one > 0 both times or 0 "
     "both times"),
])
def test_a_diloco_resume_that_cannot_continue_is_refused_by_train_pys_checks(argv, saved, said, monkeypatch):
    """Before: accepted by the checks; every rank started its group and built the model, then rank 0 printed the
    line from the optimizer's set-up (tests/test_diloco_checkpoint.py runs that end to end). The checkpoint's
    state.json is what decides: given here, as a resume reads it."""
    from hybrid.checkpoint.args import CheckpointConfig
    from hybrid.diloco import run as diloco_run
    from hybrid.diloco.args import check_run
    from hybrid.mesh import ParallelDims
    monkeypatch.setattr(diloco_run, "_saved_state", lambda ckpt: {"args": saved, "layout": {"dp": 2}})
    args = parse_args(["--model", "tiny-gpt2", "--diloco-inner-steps", "2", "--train-iters", "8", *argv])
    zero = type("Zero", (), {"stage": 1})()
    with pytest.raises(ValueError) as e:
        check_run(args, ParallelDims.from_world(2), CheckpointConfig(load="ck"), zero)
    assert str(e.value) == said
    monkeypatch.setattr(diloco_run, "_saved_state", lambda ckpt: {"args": {}, "layout": {"dp": 2}})  # synchronous
    assert check_run(args, ParallelDims.from_world(2), CheckpointConfig(load="ck"), zero).inner_steps == 2
