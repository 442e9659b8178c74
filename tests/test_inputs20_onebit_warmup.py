"""1-bit Adam's warm-up (--onebit-freeze-iters, a DeepSpeed JSON's freeze_step) at degenerate values, through the
checks train.py runs before any process group (in this process: validate with torchrun's environment of 2 ranks).

0 and below are refused (the variance would freeze at zero); at or past --train-iters refused unless the run
--save's (then one warning: this run is plain Adam); 1 (the variance one gradient's square) and below 15 % of the
run (DeepSpeed's recommended 15-25 %) warn once, on rank 0, naming the flag and a value in the range."""

from __future__ import annotations

import json

import pytest

from hybrid.train.main import validate

pytestmark = pytest.mark.usefixtures("one_process")  # tests/conftest.py: python, not torchrun

ONEBIT = ["--model", "tiny-llama", "--seq-length", "32", "--optimizer", "onebit-adam"]


def _world(monkeypatch, rank: int = 0) -> None:
    """torchrun's environment for rank `rank` of 2 (dp 2: 1-bit Adam has DP traffic to compress)."""
    for name, value in (("WORLD_SIZE", "2"), ("RANK", str(rank)), ("LOCAL_RANK", str(rank)),
                        ("LOCAL_WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)


def _warnings(argv: list[str], capsys) -> list[str]:
    validate(ONEBIT + argv)
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


@pytest.mark.parametrize("freeze, iters, why, fix", [
    ("1", "4", "the variance frozen after one step is one gradient's square", "--onebit-freeze-iters 2"),
    ("1", "100", "the variance frozen after one step is one gradient's square", "--onebit-freeze-iters 15-25"),
    ("14", "100", "a warm-up of 14 % of --train-iters 100", "--onebit-freeze-iters 15-25"),
    ("30", "1000", "a warm-up of 3 % of --train-iters 1000", "--onebit-freeze-iters 150-250")])
def test_a_short_warm_up_warns_once_on_rank_0_naming_the_flag_and_the_range(freeze, iters, why, fix, capsys,
                                                                            monkeypatch):
    _world(monkeypatch)
    lines = _warnings(["--onebit-freeze-iters", freeze, "--train-iters", iters], capsys)
    assert len(lines) == 1 and lines[0].startswith(f"train.py: warning: --onebit-freeze-iters {freeze}: {why}")
    assert "DeepSpeed recommends a warm-up of 15-25 % of the run" in lines[0] and lines[0].endswith(fix), lines
    _world(monkeypatch, rank=1)
    assert _warnings(["--onebit-freeze-iters", freeze, "--train-iters", iters], capsys) == []  # rank 0's alone


@pytest.mark.parametrize("freeze, iters", [("15", "100"), ("2", "4"), ("10", "20"), ("99", "100")])
def test_a_warm_up_of_15_percent_or_more_warns_nothing(freeze, iters, capsys, monkeypatch):
    _world(monkeypatch)
    assert _warnings(["--onebit-freeze-iters", freeze, "--train-iters", iters], capsys) == []


@pytest.mark.parametrize("freeze", ["0", "-1"])
def test_zero_or_negative_warm_up_is_refused_by_name(freeze, one_line, monkeypatch):
    _world(monkeypatch)
    line = one_line(lambda: validate(ONEBIT + ["--onebit-freeze-iters", freeze, "--train-iters", "10"]))
    assert line == (f"train.py: error: --onebit-freeze-iters must be a positive integer (Adam warm-up steps before "
                    f"the variance freezes; at 0 it would freeze at zero), got {freeze}"), line


def test_a_warm_up_past_the_run_is_refused_and_with_save_warns_the_run_is_plain_adam(one_line, capsys, monkeypatch,
                                                                                      tmp_path):
    _world(monkeypatch)
    line = one_line(lambda: validate(ONEBIT + ["--onebit-freeze-iters", "30", "--train-iters", "20"]))
    assert line.startswith("train.py: error: --optimizer onebit-adam: 1-bit Adam compresses from step "
                           "--onebit-freeze-iters 30 on and --train-iters 20 ends first"), line
    save = str(tmp_path / "ckpt")
    lines = _warnings(["--onebit-freeze-iters", "30", "--train-iters", "20", "--save", save], capsys)
    assert lines == [f"train.py: warning: --onebit-freeze-iters 30 >= --train-iters 20: this run is plain Adam "
                     f"(1-bit Adam compresses from step 30 on); a run resumed from --save {save} with a larger "
                     f"--train-iters compresses"], lines


def test_a_deepspeed_json_freeze_step_of_1_warns_by_its_key(capsys, monkeypatch, tmp_path):
    _world(monkeypatch)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 1, "lr": 2e-4}},
                                "gradient_clipping": 0.0}))
    validate(["--model", "tiny-llama", "--seq-length", "32", "--deepspeed-config", str(path), "--train-iters", "40"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip() and "no scheduler" not in ln]
    # (the JSON's optimizer section without a scheduler also warns that train.py's schedule runs: round 22,
    # tests/test_newuser22_megatron.py)
    assert lines == ["train.py: warning: --deepspeed-config's freeze_step 1: the variance frozen after one step is "
                     "one gradient's square, (1 - beta2) g^2; DeepSpeed recommends a warm-up of 15-25 % of the run "
                     "(docs/comm-efficient.md): give freeze_step 6-10"], lines
