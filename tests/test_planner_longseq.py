"""The long-sequence lean of the planner on MosaicML's MPT tables (issue 26, seventh round; docs/planner.md "Long
sequences"): on the rest of the README's A100 80GB table (published_more.MPT_A100_MORE) and H100 FP8 table
(published.MPT_FP8_TABLE_ROWS), all CHECK rows, the planner's error grows with the sequence length at every model
size -- within 15 % up to s 4096, optimistic beyond. This pins what the rows say today, so a change that removes the
lean must update the docs and the known misses with it. Fast: the plans are memoised per row."""

from __future__ import annotations

from functools import lru_cache

from hybrid.planner.published import MPT_FP8_TABLE_ROWS, Role, check, mpt_runs
from hybrid.planner.published_more import mpt_a100_runs


@lru_cache(maxsize=None)
def _a100() -> tuple:
    return tuple((r, r.workload.seq_length, check(r)[2]) for r in mpt_a100_runs() + mpt_runs()
                 if r.gpu == "a100-80g" and r.name.startswith(("MPT-1b,", "MPT-3b,", "MPT-7b,")))


def test_the_fp8_table_rows_are_check_rows_planned_with_delayed_scaling():
    rows = mpt_runs()[-len(MPT_FP8_TABLE_ROWS):]
    assert len(rows) == 4 and all(r.role is Role.CHECK and r.workload.fp8 for r in rows)
    errors = {r.workload.seq_length: [] for r in rows}
    for r in rows:
        errors[r.workload.seq_length].append(check(r)[2])
    assert max(abs(e) for e in errors[512]) <= 0.15 < min(errors[32768])  # s 512 within, s 32768 optimistic


def test_error_grows_with_sequence_length_at_each_model_size_on_a100():
    """For 1B, 3B and 7B on A100 the error rises with s through every length the table ran up to 32768 (s 65536
    with checkpointing aside); no row up to s 4096 misses, every one from s 16384 does, optimistic."""
    rows = _a100()
    for size in ("1b", "3b", "7b"):
        by_seq = sorted((s, e) for r, s, e in rows if r.name.startswith(f"MPT-{size},") and s <= 32768)
        assert len(by_seq) >= 6
        errors = [e for _, e in by_seq]
        assert errors == sorted(errors), (size, by_seq)
    assert all(abs(e) <= 0.15 for _, s, e in rows if s <= 4096)
    assert min(e for r, s, e in rows if s >= 16384 and not r.name.startswith("MPT-7b, s 16384")) > 0.15
