"""scripts/bench_comm_efficient.py --quick runs end to end and writes its table (tests/test_bench_smoke.py's
style: speed is never asserted here; this proves the script still runs against the library)."""

import os

import pytest

from hybrid import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_bench_comm_efficient_quick_mode_writes_a_table(tmp_path):
    out = tmp_path / "ce.md"
    p = testing.start([os.path.join(ROOT, "scripts", "bench_comm_efficient.py"), "--quick", "--out", str(out)],
                      env={"OMP_NUM_THREADS": "1"}, cwd=str(tmp_path))
    try:
        p.wait(timeout=600)
    finally:
        p.kill()
    assert p.returncode == 0, (p.stdout() + p.stderr())[-3000:]
    text = out.read_text()
    assert "load average" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split("|")[1].strip().split(" (")[0] for r in rows[1:]] == ["AdamW", "PowerSGD", "1-bit Adam"]
    adamw, powersgd, onebit = (float(r.split("|")[4].replace(",", "")) for r in rows[1:])
    assert powersgd < adamw and onebit < adamw  # the compressed rows send fewer DP bytes after their start
