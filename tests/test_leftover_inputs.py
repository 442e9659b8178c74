"""Bad inputs left over from earlier rounds (issue 25): each is one line naming the flag or key and the fix, before
any process group; what the user meant runs. Parse and check in this process only: no launch, no process group."""

from __future__ import annotations

import json
import re
import time

import pytest
import torch

from hybrid.train.args import parse_args, run_config
from hybrid.testing_inputs import python_environment
from hybrid.train.main import validate

@pytest.fixture(autouse=True)
def two_ranks(monkeypatch):
    """A world of 2 as train.py sees it (dp 2: the compression flags have DP traffic to act on), no other launcher
    variable (hybrid.testing_inputs)."""
    python_environment(monkeypatch, world=2)


# --- 1. --powersgd-start-iter with PowerSGD off ----------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["--powersgd-start-iter", "5"],  # rank left at its default 0
    ["--powersgd-rank", "0", "--powersgd-start-iter", "5"],  # rank given as 0
    ["--powersgd-rank", "2", "--powersgd-start-iter", "5", "--powersgd-rank", "0"],  # a list switched off after
])
def test_powersgd_start_iter_with_powersgd_off_is_one_line_naming_it(argv, one_line):
    line = one_line(lambda: validate(argv + ["--train-iters", "20"]))
    assert line.startswith("train.py: error: --powersgd-start-iter 5 does nothing without --powersgd-rank"), line
    assert "drop --powersgd-start-iter" in line and "--powersgd-rank R > 0" in line


def test_powersgd_rank_zero_alone_and_a_rank_with_its_start_are_accepted():
    for argv in (["--powersgd-rank", "0"], ["--powersgd-rank", "2", "--powersgd-start-iter", "5"]):
        run = run_config(parse_args(argv + ["--train-iters", "20"]), world=2)
        assert run.compress.powersgd.rank == int(argv[1])


# --- 2. an lr below --min-lr's default ---------------------------------------------------------------------------
def _ds(tmp_path, lr: float) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {"lr": lr}}}))
    return str(path)


def _megatron_default_lr(opt, step: int) -> float:
    """megatron-core's OptimizerParamScheduler at Megatron's --min-lr default (0.0) for the run's lr and schedule."""
    from tests.test_explain import _megatron_lr
    return _megatron_lr(opt.warmup_iters, opt.decay_iters or opt.train_iters, opt.decay_style, opt.lr, 0.0, step)


@pytest.mark.parametrize("how", ["--lr", "deepspeed"])
def test_an_lr_below_the_default_floor_decays_to_megatrons_zero(how, tmp_path):
    """--lr 5e-5 (or optimizer.params.lr 5e-5) without --min-lr: the run's schedule is megatron-core's at its
    default --min-lr 0.0, at every step (it failed with '--min-lr 0.0001 exceeds --lr' until --min-lr was given)."""
    argv = ["--lr", "5e-5"] if how == "--lr" else ["--deepspeed-config", _ds(tmp_path, 5e-5)]
    run = run_config(parse_args(argv + ["--train-iters", "12", "--lr-warmup-iters", "3"]), world=2)
    opt = run.optimizer
    assert (opt.lr, opt.min_lr, run.flag_values["min_lr"]) == (5e-5, 0.0, 0.0)
    for step in range(1, 15):
        assert opt.lr_at(step) == pytest.approx(_megatron_default_lr(opt, step), rel=1e-12, abs=1e-18), step


@pytest.mark.parametrize("argv,min_lr", [
    ([], 1e-4),  # the default --lr 1e-3: train.py's floor, as before (earlier runs resume on their schedule)
    (["--lr", "1e-4"], 1e-4),  # at the floor: accepted before, unchanged
    (["--lr", "5e-5", "--min-lr", "1e-5"], 1e-5),  # given: the user's
    (["--lr", "5e-5", "--min-lr", "5e-5"], 5e-5),
])
def test_min_lr_default_keeps_earlier_runs_and_a_given_one_is_the_users(argv, min_lr):
    run = run_config(parse_args(argv + ["--train-iters", "20"]), world=2)
    assert run.optimizer.min_lr == run.flag_values["min_lr"] == min_lr


@pytest.mark.parametrize("how,named", [("--lr", "--lr 5e-05"),
                                       ("deepspeed", "--deepspeed-config optimizer.params.lr 5e-05")])
def test_a_given_min_lr_above_the_lr_is_one_line_naming_both(how, named, tmp_path, one_line):
    argv = ["--lr", "5e-5"] if how == "--lr" else ["--deepspeed-config", _ds(tmp_path, 5e-5)]
    line = one_line(lambda: validate(argv + ["--min-lr", "1e-4", "--train-iters", "20"]))
    assert f"--min-lr 0.0001 exceeds {named}; the decay would raise the rate: lower --min-lr" in line, line


# --- 3. the DeepSpeed JSON is read once -----------------------------------------------------------------------
ONEBIT = {"optimizer": {"type": "OneBitAdam", "params": {"lr": 2e-4, "freeze_step": 7}}, "gradient_clipping": 0.0}


def _counting_reads(monkeypatch, rewrite: dict | None = None) -> list[str]:
    """Every parse of a DeepSpeed JSON (ds_config._load_json) recorded; with `rewrite`, the file is replaced by it
    right after the first parse -- a file edited while the checks run."""
    from hybrid.zero import ds_config
    reads: list[str] = []
    load = ds_config._load_json

    def counted(path: str) -> dict:
        out = load(path)
        reads.append(path)
        if rewrite is not None and len(reads) == 1:
            with open(path, "w") as f:
                json.dump(rewrite, f)
        return out
    monkeypatch.setattr(ds_config, "_load_json", counted)
    return reads


def test_deepspeed_json_is_parsed_once_and_a_rewrite_during_the_checks_gives_one_config(tmp_path, monkeypatch):
    """OneBitAdam's freeze_step and lr, and the clipping, all from the one parse, though the file turns into a plain
    AdamW config after it (1-bit Adam's check read the file a second time and saw the other optimizer)."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ONEBIT))
    reads = _counting_reads(monkeypatch, rewrite={"optimizer": {"type": "AdamW", "params": {"lr": 5e-4}}})
    run = run_config(parse_args(["--deepspeed-config", str(path), "--train-iters", "20"]), world=2)
    assert reads == [str(path)]
    assert (run.compress.onebit_freeze_iters, run.optimizer.optimizer, run.optimizer.lr) == (7, "onebit-adam", 2e-4)
    assert run.optimizer.clip_grad == 0.0 and run.flag_values["optimizer"] == "onebit-adam"


@pytest.mark.parametrize("argv,named", [
    (["--onebit-freeze-iters", "5"], "--deepspeed-config freeze_step 7 != --onebit-freeze-iters 5"),
    (["--min-lr", "3e-4"], "--min-lr 0.0003 exceeds --deepspeed-config optimizer.params.lr 0.0002"),
    (["--auto-parallel", "--global-batch-size", "8"], "--auto-parallel chooses the ZeRO stage, but --deepspeed-config "
                                                      "sets zero_optimization.stage"),
])
def test_train_py_reads_the_json_once_on_the_error_paths_too(argv, named, tmp_path, monkeypatch, one_line):
    """train.py's own path (validate -> configure): a check's error naming a key the JSON set, with one parse."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({**ONEBIT, "zero_optimization": {"stage": 1}}))
    reads = _counting_reads(monkeypatch)
    line = one_line(lambda: validate(["--deepspeed-config", str(path), "--train-iters", "20"] + argv))
    assert named in line and reads == [str(path)], (line, reads)


def test_onebitadam_without_freeze_step_or_with_a_bad_one_names_the_key(tmp_path):
    for params, message in (({}, "optimizer OneBitAdam needs params.freeze_step"),
                            ({"freeze_step": "7"}, "optimizer.params.freeze_step must be an integer"),
                            ({"freeze_step": 0}, "optimizer.params.freeze_step must be in [1, ")):
        path = tmp_path / "ds.json"
        path.write_text(json.dumps({"optimizer": {"type": "OneBitAdam", "params": params}}))
        with pytest.raises(ValueError, match=re.escape(message)):
            run_config(parse_args(["--deepspeed-config", str(path)]), world=2)


# --- 4. hybrid calibrate times the all-reduces without patching a Group ------------------------------------------
def test_calibrate_patches_no_attribute_at_run_time():
    """No assignment to or deletion of an attribute named like a Group method anywhere in calibrate.py (it swapped
    `group.all_reduce` for a timed wrapper and deleted it after)."""
    import ast
    import inspect

    from hybrid.comm import Group
    from hybrid.planner import calibrate
    methods = {name for name, v in vars(Group).items() if callable(v) or isinstance(v, (classmethod, property))}
    tree = ast.parse(inspect.getsource(calibrate))
    targets = [t for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete))
               for t in (node.targets if not isinstance(node, ast.AugAssign) else [node.target])]
    patched = [ast.unparse(t) for t in targets if isinstance(t, ast.Attribute) and t.attr in methods]
    assert not patched, patched
    assert "all_reduce" in methods and "setattr(" not in inspect.getsource(calibrate)


def test_thread_timed_group_counts_on_the_ledger_and_sums_the_thread_seconds_inside(monkeypatch):
    """The pair probe's group: Group.all_reduce's ledger record (bytes) and the calling thread's CPU inside the call
    (here a stand-in collective that burns ~20 ms of CPU), and nothing outside it."""
    from hybrid import comm
    from hybrid.planner.calibrate import ThreadTimedGroup

    def busy_all_reduce(t, op=None, group=None):
        end = time.thread_time() + 0.02
        while time.thread_time() < end:
            pass
    monkeypatch.setattr(comm.dist, "all_reduce", busy_all_reduce)  # no process group: the collective stood in
    ledger = comm.CommLedger()
    group = ThreadTimedGroup.of(comm.Group(name="tp", ranks=(0, 1), pg=None, ledger=ledger))
    t = torch.ones(8)
    for _ in range(2):
        assert group.all_reduce(t) is t
    end = time.thread_time() + 0.02
    while time.thread_time() < end:  # outside the calls: not counted
        pass
    assert ledger.calls("all_reduce", "tp") == 2 and ledger.bytes("all_reduce", "tp") == 2 * 32
    assert 0.04 <= group.all_reduce_thread_s < 0.06, group.all_reduce_thread_s
