"""The long-sequence lean of the planner on MosaicML's MPT tables (issue 26, seventh round; docs/planner.md "Long
sequences"): the rest of the README's A100 80GB table and H100 FP8 table, added as CHECK rows before their errors
were seen, show the planner's error growing with the sequence length at every model size -- within 15 % up to
s 4096, optimistic beyond (every miss is at s >= 8192). This pins what the rows say today, so a change that
removes the lean must update the docs and KNOWN_MISSES with it. Fast: the published plans are memoised per row."""

from __future__ import annotations

from functools import lru_cache

from hybrid.planner.published import MPT_A100_TABLE_ROWS, MPT_FP8_TABLE_ROWS, Role, check, mpt_runs


@lru_cache(maxsize=None)
def _seventh() -> tuple:
    runs = mpt_runs()[-(len(MPT_A100_TABLE_ROWS) + len(MPT_FP8_TABLE_ROWS)):]
    return tuple((r, r.workload.seq_length, check(r)[2]) for r in runs)


def test_the_seventh_round_rows_are_check_rows_of_the_two_tables():
    rows = _seventh()
    assert len(rows) == 32 and all(r.role is Role.CHECK for r, _, _ in rows)
    assert [r.gpu for r, _, _ in rows] == ["a100-80g"] * 28 + ["h100-80g"] * 4
    assert [r.workload.fp8 for r, _, _ in rows] == [False] * 28 + [True] * 4


def test_error_grows_with_sequence_length_at_each_model_size_on_a100():
    """For 1B, 3B and 7B on A100 the error rises with s through every length the table ran (1B from 512 to
    32768, s 65536 with checkpointing aside); no row up to s 4096 misses, every miss is at s >= 8192."""
    rows = _seventh()
    for size in ("1b", "3b", "7b"):
        by_seq = sorted((s, e) for r, s, e in rows if r.name.startswith(f"MPT-{size},") and r.gpu == "a100-80g"
                        and s <= 32768)
        errors = [e for _, e in by_seq]
        assert errors == sorted(errors), (size, by_seq)
    assert all(abs(e) <= 0.15 for _, s, e in rows if s <= 4096)
    assert {s for _, s, e in rows if abs(e) > 0.15} <= {8192, 16384, 32768, 65536}
    assert min(e for _, s, e in rows if s >= 32768) > 0.15  # every row at s >= 32k: optimistic, outside
