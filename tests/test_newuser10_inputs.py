"""Tenth-round new-user findings: what a first-time user met following docs/moe.md, context-parallel.md,
pipeline.md, checkpoint.md, convert.md, data.md, operations.md and troubleshooting.md with bad or odd inputs (round
9's walk, tests/test_newuser9_inputs.py, is not redone here).

In this process, one rank, no process group (the shared harness: hybrid/testing_inputs.py, conftest's `one_line`)."""

from __future__ import annotations

import pytest

from hybrid.train.main import validate

pytestmark = pytest.mark.usefixtures("one_process")  # tests/conftest.py: python, not torchrun: world 1


def _world(monkeypatch, n: int) -> None:
    """torchrun's environment for rank 0 of `n` on one node: validate then checks the layout of an n-rank job."""
    for name, value in (("WORLD_SIZE", str(n)), ("RANK", "0"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", str(n)),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)


# --- 1. --sequence-parallel at --tensor-model-parallel-size 1: turned off with one warning, as Megatron-LM ----------
def test_sequence_parallel_at_tp1_is_turned_off_with_one_warning_on_rank0(capsys, monkeypatch):
    """It was accepted silently (RunConfig said sequence parallelism while no TP group existed to split over).
    Megatron-LM's validate_args: "Disabling sequence parallelism because tensor model parallelism is disabled"."""
    _world(monkeypatch, 2)
    run = validate(["--sequence-parallel", "--seq-length", "32"])[0]
    err = capsys.readouterr().err
    assert run.parallel.dims.tp == 1 and run.parallel.sequence_parallel is False
    assert run.flag_values["sequence_parallel"] is False  # a checkpoint records what ran
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == ["train.py: warning: --sequence-parallel is off: it splits norms and dropout over the "
                     "tensor-parallel group and --tensor-model-parallel-size is 1 (Megatron-LM turns it off the "
                     "same way); drop the flag, or raise --tensor-model-parallel-size"], lines


def test_sequence_parallel_warning_is_rank0s_alone_and_tp2_keeps_it(capsys, monkeypatch):
    _world(monkeypatch, 2)
    monkeypatch.setenv("RANK", "1")
    assert validate(["--sequence-parallel", "--seq-length", "32"])[0].parallel.sequence_parallel is False
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    run = validate(["--sequence-parallel", "--seq-length", "32", "--tensor-model-parallel-size", "2"])[0]
    assert run.parallel.sequence_parallel is True and run.warnings == () and capsys.readouterr().err == ""
