"""Round 21 (planner21b): the published rows from sources the repository had not read
(hybrid/planner/published21_newsources.py, docs/planner/round21-new-sources.md)."""

from pathlib import Path

import pytest

from hybrid.planner import families
from hybrid.planner import published21_newsources as new
from hybrid.planner.published import Role
from hybrid.planner.published_more import evaluate

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "planner" / "round21-new-sources.md"
N_ROWS = 29  # Megatron-LM's GPT-3 example, GPT-NeoX-20B, NeMo 22.06 / 22.08's 21, flash-attention's five, TinyLlama
# the published layouts the planner rejects (docs/planner/round21-nemo-memory-neox-flops.md: at d 8 the runtime's own
# tensors fill the card, the layout cannot have run as stated; at d 16 the planner's 2 GB + 5 % reserve rejects it)
REJECTED = {"NeMo 22.08 GPT-3 5B, 8 A100, t1 p1 d8, b2, GBS 2048, no AC",
            "NeMo 22.08 GPT-3 5B, 16 A100, t1 p1 d16, b2, GBS 2048, no AC"}


@pytest.fixture(scope="module")
def results():
    return [evaluate(r) for r in new.runs21_newsources()]


def test_rows_are_check_rows_of_new_sources():
    runs = new.runs21_newsources()
    assert len(runs) == N_ROWS and len({r.name for r in runs}) == N_ROWS
    assert all(r.role is Role.CHECK and not r.fits for r in runs)
    # each source maps to its round-21 family, and no source an earlier module cites is reused
    new_families = dict(new.NEW_FAMILIES)
    assert set(new_families.items()) <= set(families.FAMILY_OF_SOURCE)
    for run in runs:
        prefix = next(p for p in new_families if run.source.startswith(p))
        assert families.family_of(run.source) == new_families[prefix], run.name
    older = [r for r in families.all_published_runs() if r.name not in {x.name for x in runs}]
    assert not any(r.source.startswith(tuple(new_families)) for r in older)


def test_rows_are_in_the_families_report():
    names = {r.name for r in families.all_published_runs()}
    assert {r.name for r in new.runs21_newsources()} <= names


def test_every_published_layout_is_planned(results):
    # each published layout fits its card in the planner but the two named OOM rows (fails if another stops fitting,
    # or if those start to fit: then REJECTED and the doc are stale)
    rejected = {r.run.name: r.rejected for r in results if r.error is None}
    assert set(rejected) == REJECTED and all("OOM" in why for why in rejected.values())
    for r in results:
        if r.error is None:
            continue
        # the plan is the published layout: t, p, micro-batch pinned
        space = r.run.space
        assert (r.plan.layout.tp, r.plan.layout.pp, r.plan.layout.micro_batch) == (
            space.tp[0], space.pp[0], space.micro_batch[0]), r.run.name


def test_doc_table_is_the_report(results):
    """docs/planner/round21-new-sources.md's row table is `python -m hybrid.planner.published21_newsources`'s."""
    from hybrid.planner.published_more import table
    assert table(results) in DOC.read_text()
