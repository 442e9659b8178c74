"""scripts/bench_cp.py --quick runs end to end and writes its table (speed is never asserted here): the unsharded
row and each of hybrid's three comm types with a number; torch's context_parallel row either with a number or
with the reason it does not run on gloo / CPU."""

import os
import re

import pytest

from hybrid import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # a benchmark / train.py end to end: the full suite runs it
def test_bench_cp_quick_writes_the_table(tmp_path):
    out = tmp_path / "cp.md"
    p = testing.run([os.path.join(ROOT, "scripts", "bench_cp.py"), "--quick", "--out", str(out)],  # a fork
                    env={"OMP_NUM_THREADS": "1"}, cwd=str(tmp_path), timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    text = out.read_text()
    assert "load average" in text
    for row in ("unsharded", "hybrid p2p", "hybrid a2a", "hybrid allgather"):
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| {row}"))
        assert re.match(r"\| [^|]+ \| \d+\.\d \|", line), line
    torch_row = next(ln for ln in text.splitlines() if ln.startswith("| torch context_parallel"))
    assert re.match(r"\| [^|]+ \| (\d+\.\d|not run on gloo/CPU: .+) \|", torch_row), torch_row
