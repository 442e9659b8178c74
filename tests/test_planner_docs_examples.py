"""docs/planner.md's example outputs are what `hybrid plan` prints now: the 405B-on-8-GPUs error and the 39.1B
worked example's throughput, which had drifted (the 405B line's rejection count and the worked example's TFLOP/s
were from before selective-op and the whole-layer model). The Llama-3-70B table on 64 H100 and the Llama-3-8B scan
are documented commands: tests/test_docs_commands.py runs them as written and checks their printed rows against
the page (PRINTED_ON_THE_PAGE) on that one run, not a second search here. A search takes ~3 s of CPU: slow tier."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hybrid.planner.cli import main

pytestmark = pytest.mark.slow

DOCS = (Path(__file__).resolve().parents[1] / "docs" / "planner.md").read_text()


def _plan(capsys, command: str) -> tuple[int, str, str]:
    code = main(command.split()[2:])
    out = capsys.readouterr()
    return code, out.out, out.err


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_llama3_405b_on_8_gpus_error_is_the_documented_line(capsys):
    code, _, err = _plan(capsys, "hybrid plan --model llama-3-405b --gpus 8 --global-batch-size 64 --seq-length 4096")
    assert code == 2 and err.count("\n") == 1
    assert _squash(err.strip()) in _squash(DOCS)


def test_worked_example_throughput_is_what_its_command_predicts(capsys):
    section = DOCS[DOCS.index("## Worked example: the 39.1B row by hand"):]
    command = _squash(re.search(r"\(`(hybrid plan --num-layers 48 .*?)`", section, re.S).group(1))
    code, out, _ = _plan(capsys, command)
    assert code == 0
    row = next(line for line in out.splitlines() if re.match(r"^ +1  tp8 pp2 dp32 v1 b1 z0 full", line))
    memory, tflops = row.split()[8], row.split()[11]  # "1 tp8 pp2 dp32 v1 b1 z0 full" then mem, step, tokens, TFLOP/s
    assert f"the command above now predicts {tflops} TFLOP/s" in _squash(section)
    assert f"Total **{memory} GB**" in section
