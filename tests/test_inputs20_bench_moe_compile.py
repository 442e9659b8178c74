"""scripts/bench_moe_compile.py (docs/moe.md's "With --compile" row) runs end to end at its tiniest sizes -- one
block of one step each, 8 tokens -- and prints its table: one line per rank (2 gloo ranks, tiny-mixtral at ep 2)
with every field filled. Speed is never asserted here (the ratios are measured on a quiet machine, docs/moe.md);
this only proves the script still runs against the current library, so the published row can be regenerated."""

from __future__ import annotations

import os
import re

import pytest

from hybrid import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM = r"\d+(?:\.\d+)?"
LINE = re.compile(rf"rank (\d): CPU ms/step eager ({NUM}), compiled ({NUM}); wall ms/step eager ({NUM}), compiled "
                  rf"({NUM}); eager / compiled per block pair median ({NUM}) \(({NUM})-({NUM})\); first compiled step "
                  rf"({NUM}) s CPU; frames (\d+) -> (\d+), graph breaks (\d+); load average ({NUM})")


@pytest.mark.slow
def test_bench_moe_compile_runs_at_its_tiniest_sizes_and_prints_a_line_per_rank(tmp_path):
    proc = testing.start([os.path.join(ROOT, "scripts", "bench_moe_compile.py"), "--blocks", "1", "--per", "1",
                          "--seq", "8"], env={"OMP_NUM_THREADS": "1"}, cwd=str(tmp_path))
    try:
        proc.wait(timeout=600)
    finally:
        proc.kill()
    out = proc.stdout()
    assert proc.returncode == 0, (out + proc.stderr())[-3000:]
    lines = [ln for ln in out.splitlines() if ln.strip()]
    found = [LINE.fullmatch(ln) for ln in lines]
    assert len(lines) == 2 and all(found), out
    assert [m.group(1) for m in found] == ["0", "1"], out
    for m in found:
        eager, compiled, median, lo, hi = (float(m.group(i)) for i in (2, 3, 6, 7, 8))
        assert eager > 0 and compiled > 0 and lo == median == hi, out  # one block pair: one ratio
        # the ratio of the two CPU times, which are printed to within 0.05 ms (.1f), the ratio to within 5e-4 (.3f)
        assert (eager - 0.05) / (compiled + 0.05) - 5e-4 <= median <= (eager + 0.05) / (compiled - 0.05) + 5e-4, out
        assert int(m.group(11)) >= int(m.group(10)) > 0, out  # dynamo compiled frames, counted before and after
