"""Each benchmark script's --quick mode runs end to end and writes its table.

Speed itself is never asserted here (it lives in scripts/bench_*.py and docs/results/); this only proves
the scripts still run against the current library, so the published tables can be regenerated.
"""

import os

import pytest

from hybrid import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ("bench_zero.py", "bench_tp.py", "bench_pipeline.py", "bench_checkpoint.py", "bench_startup.py",
           "bench_moe.py")


@pytest.mark.slow
def test_bench_scripts_quick_mode_writes_a_table(tmp_path):
    env = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    outs = {s: tmp_path / (s[:-3] + ".md") for s in SCRIPTS}
    # they start together (`python scripts/bench_*.py --quick`, each a fork of hybrid.testing's forkserver): most
    # of a quick run is process start-up and imports, not compute
    procs = {s: testing.start([os.path.join(ROOT, "scripts", s), "--quick", "--out", str(outs[s])], env=env,
                              cwd=str(tmp_path))
             for s in SCRIPTS}
    try:
        for p in procs.values():
            p.wait(timeout=600)
    finally:
        for p in procs.values():
            p.kill()
    for s, p in procs.items():
        log = p.stdout() + p.stderr()
        assert p.returncode == 0, f"{s} --quick failed:\n{log[-3000:]}"
        text = outs[s].read_text()
        assert "load average" in text, f"{s}: the table must record the load average"
        rows = [line for line in text.splitlines() if line.startswith("| ")]
        assert len(rows) >= 3, f"{s}: no table in {outs[s]}:\n{text}"
        assert "failed" not in text and "skipped" not in text, f"{s}: a row did not run:\n{text}"
