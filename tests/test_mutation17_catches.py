"""Round 17's outside mutation review of round 16's new code: ~50 one-line bugs planted on purpose in MoE with
context parallelism, DiLoCo with ZeRO-3 / CP / MoE, the trust fixes, the planner's ZeRO 3 copies term and the
families report, the area's fast tier run on each; each test here kills a mutant that tier let live (or killed only
in a multi-rank launch), shown failing on the mutant and passing on HEAD. In-process, no process group.

The mutant ids (PF1-ways-no-cp, ...) are those of branch mutation17's report and of docs/architecture.md's tally."""

from __future__ import annotations

import pytest


# --- planner16b's families report (hybrid/planner/families.py) -------------------------------------------------------
def _family_row(error, role=None, gpus=8, tp=1, pp=1, cp=1, zero=3, card="A100", seq=2048, fp8=False,
                family="MosaicML llm-foundry (Composer, FSDP1)"):
    from hybrid.planner.families import FamilyRow
    from hybrid.planner.published import Role
    return FamilyRow("r", family, card, gpus, tp, pp, cp, gpus // (tp * pp * cp), zero, role or Role.CHECK, error,
                     "" if error is not None else "does not fit", seq, fp8)


def test_families_a_cp_row_counts_cp_as_a_way_and_divides_its_dp_by_cp():
    """A CP row (DGXC's cp 2 rows) is a 4-way layout at tp, pp, cp, dp > 1 and a 3-way one at dp 1, and plan_row
    gives it dp = gpus / (tp pp cp). PF1-ways-no-cp (cp left out of `ways`: the CP rows counted one way short, in
    the 2/3/4-way slices) and PF4-dp-no-cp (dp = gpus / (tp pp): cp x too large in the misses' lines) lived through
    test_planner16_families' fast tier."""
    from hybrid.planner.families import all_published_runs, plan_row
    from hybrid.planner.published_more import Result
    assert _family_row(0.0, gpus=128, tp=8, pp=4, cp=2).ways == 4
    assert _family_row(0.0, gpus=64, tp=8, pp=4, cp=2).ways == 3
    run = next(r for r in all_published_runs() if getattr(r, "cp", 1) > 1)
    row = plan_row(run, evaluate=lambda r: Result(r, rejected="over memory"))  # the layout the row states
    assert row.cp == run.cp > 1 and row.dp * row.tp * row.pp * row.cp == run.gpus


def test_families_slices_hold_their_bounds_inclusive():
    """Issue 26's kinds at their edges: pipelines at exactly 2,000 and 3,400 GPUs are in the first slice (1,999
    and 3,401 not); an FSDP slice takes pp 1 only; H100 bf16 at s = 4096 is in "s <= 4096", not in "FP8 or
    s > 4096". PF2-pipe-low-strict (2,000 left out), PF3-fsdp-any-pp (pipelined ZeRO 3 rows counted as FSDP) and
    PF7-seq-strict (s = 4096 moved to the long-sequence slice: every 4k torchtitan row) lived through
    test_planner16_families' fast tier."""
    from hybrid.planner.families import SLICES
    by = dict(SLICES)
    first = by["Megatron / DeepSpeed / NeMo pipelines at 2,000-3,400 GPUs"]
    meg = "Megatron-LM (Narayanan 2021, Korthikanti 2022)"
    assert [first(_family_row(0.0, gpus=g, tp=1, pp=2, zero=1, family=meg)) for g in (1998, 2000, 3400, 3402)] == \
        [False, True, True, False]
    fsdp_a100 = by["FSDP (ZeRO 3) at 8-64 GPUs, no TP, A100 (80 and 40 GB)"]
    assert fsdp_a100(_family_row(0.0, gpus=8)) and not fsdp_a100(_family_row(0.0, gpus=8, pp=2))
    short, long_ = by["... of which bf16 at s <= 4096"], by["... of which FP8 or s > 4096"]
    h100 = dict(gpus=16, card="H100", family="torchtitan (FSDP2, DTensor TP / PP)")
    assert short(_family_row(0.0, seq=4096, **h100)) and not long_(_family_row(0.0, seq=4096, **h100))
    assert long_(_family_row(0.0, seq=8192, **h100)) and long_(_family_row(0.0, seq=4096, fp8=True, **h100))


def test_families_stats_count_rejected_check_rows_only_and_misses_both_signs():
    """A FIT row the planner rejects is not a rejected check row (stats' last cell counts the check rows'
    "published layouts predicted not to fit"); the misses list a pessimistic row (-30 %) as well as an optimistic
    one. PF5-rejected-all (FIT rows counted) and PF6-miss-signed (only + errors beyond the band listed) lived
    through test_planner16_families' fast tier."""
    from hybrid.planner.families import misses, stats
    from hybrid.planner.published import Role
    assert stats([_family_row(0.10), _family_row(None, role=Role.FIT)]).endswith("| 1 of 1 | 0")
    rows = [_family_row(-0.30), _family_row(0.30), _family_row(0.05)]
    assert len(misses(rows, lambda r: True).splitlines()) == 2 and "-30.0 %" in misses(rows, lambda r: True)


def test_families_reference_rows_error_is_predicted_over_published(monkeypatch):
    """shared/reference's Narayanan rows take the same sign as every other row: predicted / published - 1,
    positive when the planner is optimistic. PF8-naray-flip (published / predicted - 1) lived through
    test_planner16_families' fast tier. The reference's planning is replaced by a stub plan (in-process, no search)."""
    from types import SimpleNamespace
    from hybrid.planner import families, reference
    row = reference.megatron_rows()[0]
    plan = SimpleNamespace(tflops_per_gpu=1.25 * row.tflops_per_gpu, layout=SimpleNamespace(zero=1))
    monkeypatch.setattr(reference, "megatron_rows", lambda: [row])
    monkeypatch.setattr(reference, "predict_published", lambda r: plan)
    (got,) = families.narayanan_reference_rows()
    assert got.error == pytest.approx(0.25)


# --- trust16's state.json owner values (hybrid/checkpoint/store.py) ---------------------------------------------------
def _state_dir(tmp_path, **extra) -> str:
    """A checkpoint folder iter_0000002 holding only a state.json with the fields read_state requires (a model-only
    save: no scaler), plus `extra`."""
    import json
    import os
    d = tmp_path / "iter_0000002"
    d.mkdir(exist_ok=True)
    state = {"iteration": 2, "consumed_samples": 8, "model": "tiny-gpt2", "contents": "model",
             "layout": {"tp": 1, "pp": 1, "dp": 1, "zero": 0}, **extra}
    (d / "state.json").write_text(json.dumps(state))
    return os.fspath(d)


@pytest.mark.parametrize("value, ok", [(-1, True), (0, True), (3, True), (-2, False), (True, False), (1.0, False)])
def test_diloco_inflight_in_state_json_is_minus_one_or_a_fragment(tmp_path, value, ok):
    """DiLoCo's fragment in flight is -1 (none) or a fragment index; -2 (or a bool, a float) is refused by name.
    TR11-inflight-lt (the bound moved to -2: a forged -2 read as a fragment index, Python's second-from-last
    fragment) lived through test_trust16_readers, whose case is the string "x" only."""
    from hybrid.checkpoint import store
    d = _state_dir(tmp_path, **{"diloco.inflight": value})
    if ok:
        assert store.read_state(d)["diloco.inflight"] == value
    else:
        with pytest.raises(store.CorruptCheckpoint, match="diloco.inflight is .*expected an integer >= -1"):
            store.read_state(d)
