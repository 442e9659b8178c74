"""A resume refused after the process groups start leaves no output behind.

Repro: `python -m hybrid.train --model tiny-gpt2 ... --load ck --ckpt-step 2 --metrics-file new.jsonl
--tensorboard-dir tb` with a byte of ck/iter_0000002/__0_0.distcp flipped: "train.py: error: --ckpt-step 2:
...: sha256 differs from the manifest (corrupted)" -- and an empty new.jsonl and tb/events.out.tfevents.* (88 bytes,
no scalar) were left: train.py builds the metrics writer before the resume (the same for a NaN outer state or a
model mismatch, found after the groups start). The writer now opens both at its first record."""

from __future__ import annotations

import json
import os

from hybrid.metrics.writer import MetricsWriter


def test_the_writer_creates_nothing_until_its_first_record(tmp_path):
    tb, jsonl = tmp_path / "tb", tmp_path / "m.jsonl"
    w = MetricsWriter(str(tb), str(jsonl), True)
    assert not os.path.lexists(tb) and not os.path.lexists(jsonl)  # a refused resume ends here
    w.close()
    assert os.listdir(tmp_path) == []
    w = MetricsWriter(str(tb), str(jsonl), True)
    w.write(1, {"lm_loss": 5.0})
    w.write(2, {"lm_loss": 4.0})
    w.close()
    assert [json.loads(x)["lm_loss"] for x in jsonl.read_text().splitlines()] == [5.0, 4.0]
    assert any(n.startswith("events.out.tfevents.") for n in os.listdir(tb))


def test_a_resumed_file_is_still_cut_to_whole_records_and_appended(tmp_path):
    """The torn-record cut (trust17) moves with the open: done before the first record is appended."""
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_text('{"iteration": 1, "lm_loss": 5.0}\n{"iteration": 2, "lm_lo')
    w = MetricsWriter(None, str(jsonl), True)
    w.write(2, {"lm_loss": 4.0})
    w.close()
    assert [json.loads(x)["iteration"] for x in jsonl.read_text().splitlines()] == [1, 2]


def test_a_rank_that_does_not_log_writes_nothing(tmp_path):
    w = MetricsWriter(str(tmp_path / "tb"), str(tmp_path / "m.jsonl"), False)
    w.write(1, {"lm_loss": 5.0})
    w.close()
    assert os.listdir(tmp_path) == []
