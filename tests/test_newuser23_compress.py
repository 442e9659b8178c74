"""Round 23's new-user pass over docs/comm-efficient.md. In-process: train.py's checks.

1. The page's DeepSpeed spelling of 1-bit Adam (`"optimizer": {"type": "OneBitAdam", "params": {"freeze_step":
   N}}`): a misspelt `freez_step` was refused with "remove it" -- the fix that drops the warm-up the file meant --
   where a misspelt top-level or section key names the key it is close to. Now "did you mean freeze_step?".
2. The page's reruns pass --powersgd-min-compression-rate, --powersgd-variant and --powersgd-no-error-feedback to
   scripts/bench_comm_efficient.py; given to train.py they said "see --help". Each now says what train.py runs.
"""

from __future__ import annotations

import json

import pytest

from hybrid.train.main import validate

pytestmark = pytest.mark.usefixtures("one_process")  # tests/conftest.py: python, not torchrun: world 1


def _line(tmp_path, monkeypatch, one_line, params: dict) -> str:
    monkeypatch.setenv("WORLD_SIZE", "2")
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"optimizer": {"type": "OneBitAdam", "params": params}}))
    return one_line(lambda: validate(["--deepspeed-config", str(path), "--train-iters", "20"]))


def test_a_misspelt_freeze_step_is_named_with_its_spelling(tmp_path, monkeypatch, one_line):
    line = _line(tmp_path, monkeypatch, one_line, {"freez_step": 10})
    assert line == ("train.py: error: --deepspeed-config: optimizer.params.freez_step is not one train.py reads for "
                    "OneBitAdam (lr, betas, eps, weight_decay, freeze_step); did you mean freeze_step?")


def test_a_key_near_none_is_still_to_be_removed(tmp_path, monkeypatch, one_line):
    line = _line(tmp_path, monkeypatch, one_line, {"freeze_step": 10, "momentum": 0.9})
    assert line.endswith("optimizer.params.momentum is not one train.py reads for OneBitAdam (lr, betas, eps, "
                         "weight_decay, freeze_step); remove it"), line


@pytest.mark.parametrize("flag, runs", [
    ("--powersgd-min-compression-rate", "train.py runs torch's rate 2"),
    ("--powersgd-variant", "train.py runs torch's powerSGD_hook"),
    ("--powersgd-no-error-feedback", "train.py runs PowerSGD with error feedback"),
])
def test_the_benchs_powersgd_diagnostics_are_named_as_the_benchs(monkeypatch, one_line, flag, runs):
    """docs/comm-efficient.md's reruns pass these to scripts/bench_comm_efficient.py; given to train.py they said
    "see --help". PowerSGDConfig's defaults are what the line says train.py runs."""
    from hybrid.compress.volume import PowerSGDConfig
    monkeypatch.setenv("WORLD_SIZE", "2")
    line = one_line(lambda: validate(["--powersgd-rank", "4", "--powersgd-start-iter", "5", "--train-iters", "20",
                                      flag]))
    assert f"{flag}: a diagnostic of scripts/bench_comm_efficient.py (docs/comm-efficient.md); {runs}" in line, line
    assert line.endswith("drop the flag") and "see --help" not in line
    assert PowerSGDConfig() == PowerSGDConfig(min_compression_rate=2.0, variant="torch", error_feedback=True)
