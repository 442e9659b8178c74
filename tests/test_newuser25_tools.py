"""Round 25's new user on docs/comm-efficient.md's and docs/context-parallel.md's tools. `python -m
hybrid.compress.diagnose` answered a bad flag with argparse's usage block (five lines) and took values that broke or
did nothing: --freeze-variance 0 (the frozen bias correction 1 - b2^0 = 0: a division by zero), a --freeze-variance
past --steps, a global batch the two ranks' micro-batches of 2 cannot split, PowerSGD's levers beside --adamw (which
runs no PowerSGD). scripts/bench_cp.py's size errors lacked "error:". In-process, before any rank starts."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from hybrid.compress import diagnose


@pytest.mark.parametrize("argv, line", [
    (["--start", "0"], "--start must be >= 2 and below --steps (300)"),
    (["--only", "ffn"], "--only: groups are embed, attn, mlp, head"),
    (["--freeze-variance", "0"], "argument --freeze-variance: expected an integer >= 1, got 0"),
    (["--freeze-variance", "300"], "--freeze-variance 300 is not below --steps 300: v would never freeze"),
    (["--error-reset", "-8"], "argument --error-reset: expected an integer >= 0, got -8"),
    (["--rank", "0"], "argument --rank: expected an integer >= 1, got 0"),
    (["--global-batch", "6"], "--global-batch 6 must be a multiple of 4 (micro-batches of 2 on each of the 2 ranks)"),
    (["--adamw", "--ef21"], "--ef21 diagnoses PowerSGD and --adamw runs none; drop one of them"),
    (["--adamw", "--only", "mlp"], "--only diagnoses PowerSGD and --adamw runs none"),
    (["--stpes", "60"], "did you mean --steps?"),
])
def test_diagnose_refuses_a_bad_flag_in_one_line_before_its_ranks(argv, line, monkeypatch, one_line):
    monkeypatch.setattr("hybrid.testing.run_distributed", lambda *a, **k: pytest.fail("ranks started"))
    got = one_line(lambda: diagnose.main(argv))
    assert got.startswith("python -m hybrid.compress.diagnose: error: ") and line in got, got


@pytest.mark.parametrize("argv", [["--start", "240", "--stats", "--adam", "--json", "d240.json"],
                                  ["--adamw", "--adam", "--json", "adamw.json"], ["--adamw", "--freeze-variance", "60"],
                                  ["--start", "60", "--only", "mlp", "--stats"], ["--start", "60", "--ef21"],
                                  ["--start", "60", "--error-reset", "8"]])
def test_the_pages_diagnose_commands_are_taken(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert diagnose.parse_args(argv).steps == 300


def test_bench_cp_size_errors_say_error_as_its_flag_errors(monkeypatch, one_line):
    path = os.path.join(os.path.dirname(__file__), "..", "scripts", "bench_cp.py")
    spec = importlib.util.spec_from_file_location("_bench_cp_nu25", path)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "table", lambda args: pytest.fail("started work on bad input"))
    line = one_line(lambda: bench.main(["--seq", "8191", "--cp", "2"]))
    assert line == ("bench_cp.py: error: --seq 8191 is not divisible by 2 x --cp (4): the load-balanced split cuts "
                    "it into 2 x --cp chunks"), line
