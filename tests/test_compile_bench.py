"""scripts/bench_compile.py --quick runs end to end and writes its table (one eager / compiled pair of train.py runs
on one rank). Speed is never asserted here: the ratios are measured on a quiet machine (docs/zero.md)."""

from __future__ import annotations

import os

import pytest

from hybrid import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_bench_compile_quick_mode_writes_a_table(tmp_path):
    out = tmp_path / "bench_compile.md"
    proc = testing.start([os.path.join(ROOT, "scripts", "bench_compile.py"), "--quick", "--out", str(out)],
                         env={"OMP_NUM_THREADS": "1"}, cwd=str(tmp_path))
    try:
        proc.wait(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, (proc.stdout() + proc.stderr())[-3000:]
    text = out.read_text()
    assert "load average" in text and "eager / compiled: median" in text, text
    assert len([line for line in text.splitlines() if line.startswith("| 0 |")]) == 1, text
