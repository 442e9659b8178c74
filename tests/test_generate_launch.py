"""`hybrid generate` starts its processes as train.py does (hybrid/launch.py): the same launcher checks before any
process group, with the same one-line errors, and --distributed-timeout-minutes on the process group."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import pytest
import torch

import hybrid.cli
from hybrid.generate import cli as generate_cli
from hybrid.testing_inputs import OneLine


def _exit_line(argv, capsys) -> str:
    return OneLine(capsys)(lambda: hybrid.cli.main(argv))


def test_several_processes_without_torchrun_is_the_training_error_before_any_process_group(monkeypatch, capsys,
                                                                                            tmp_path):
    from hybrid.launch import check_launch
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError) as want:
        check_launch(2)  # what train.py says
    line = _exit_line(["generate", str(tmp_path), "--prompt", "hi"], capsys)
    assert line == f"hybrid generate: error: {want.value}"
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("value", ["0", "-1", "nan", "20000"])
def test_a_bad_timeout_is_one_line_naming_the_flag(value, capsys, tmp_path):
    line = _exit_line(["generate", str(tmp_path), "--prompt", "hi", "--distributed-timeout-minutes", value], capsys)
    assert "--distributed-timeout-minutes" in line
    assert not torch.distributed.is_initialized()


def test_the_timeout_reaches_the_process_group(monkeypatch, tmp_path):
    """The job is started by hybrid.launch.distributed with the flag's timeout (as train.py's main)."""
    seen = []

    @contextlib.contextmanager
    def fake(world, timeout):
        seen.append((world, timeout))
        raise RuntimeError("stop here")
        yield  # pragma: no cover

    monkeypatch.setattr(generate_cli, "distributed", fake)
    monkeypatch.setattr(generate_cli, "_validate", lambda args: (1, None, None, None, None, (None, None, None)))
    args = hybrid.cli.build_parser().parse_args(["generate", str(tmp_path), "--prompt", "hi",
                                                 "--distributed-timeout-minutes", "2.5"])
    with pytest.raises(RuntimeError, match="stop here"):
        args.func(args)
    assert seen == [(1, timedelta(minutes=2.5))]
