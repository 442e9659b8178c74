"""scripts/bench_pipeline.py --quick: beyond running (tests/test_bench_smoke.py), its correctness lines hold -- on
the same weights and micro-batches, our executor and torch.distributed.pipelining's runtimes (Schedule1F1B,
ScheduleGPipe, ScheduleInterleavedZeroBubble as ZB-H1, ScheduleZBVZeroBubble) give the same loss and the same
gradients bit for bit, ZB-H1's gradients equal our 1F1B's, and the ZBV model (2 pp stages) has 1F1B's loss.
Timing rows are not asserted: --quick measures nothing."""

from __future__ import annotations

import os
import re

import pytest

from hybrid import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_quick_run_our_schedules_equal_torchs_runtimes_bit_for_bit(tmp_path):
    out = tmp_path / "pp.md"
    # `python scripts/bench_pipeline.py --quick` as a fork of hybrid.testing's forkserver (its ranks forked by the
    # same forkserver): no new interpreter, no second PRELOAD
    run = testing.run([os.path.join(ROOT, "scripts", "bench_pipeline.py"), "--quick", "--out", str(out)],
                      env={"OMP_NUM_THREADS": "1"}, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    text = out.read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("- same weights and micro-batches, pp 2"))
    found = dict((m.group(1), (m.group(2), m.group(3), m.group(4))) for m in re.finditer(
        r"(1F1B|GPipe|ZB-H1|ZBV): loss ours ([\d.]+) / torch ([\d.]+), max \|grad diff\| / max \|grad\| ([\d.e+-]+)",
        line))
    assert set(found) == {"1F1B", "GPipe", "ZB-H1", "ZBV"}, line
    for name, (ours, theirs, diff) in found.items():
        assert ours == theirs == found["1F1B"][0] and float(ours) > 0, (name, line)
        assert float(diff) == 0.0, (name, line)
    assert "ZB-H1's gradients equal our 1F1B's bit for bit, pp 2: yes" in text
    for name in ("1F1B", "GPipe", "ZB-H1", "ZBV"):  # a timing row ours vs torch for each schedule
        assert re.search(rf"^\| 2 \| 2 \| {name} \|", text, re.M), name
