"""Round 23 (planner23): the DGXC rows that hold FP8 weights through NeMo 2.0's bf16_with_fp8_mixed() plan them
(Workload.fp8_param_gather, published_recipes.Stated.fp8_params), and the error-vs-DP-size study
(hybrid/planner/published23_dp.py; docs/planner/round23-fp8-dp.md)."""

from dataclasses import replace

import pytest

from hybrid.planner import published14, published_recipes
from hybrid.planner.families import all_published_runs
from hybrid.planner.published22_mlperf import nemo2_fp8_rows
from hybrid.planner.published_more import evaluate

# as planned (published / predicted step - 1), to 0.3 point, and with 2-byte parameter all-gathers (round 22's plan):
# the 340B's DP tail is the largest share of its step, the 15B's the smallest (it moves away from 0)
PINNED = {"DGXC 25.04.01 Nemotron4-340B FP8, 256 H100, t8 p8 v12, b1, GBS 64": (-0.080, -0.108),
          "DGXC 25.04.01 Llama3.1-405B FP8, 2048 H100, t8 p8 cp2 v8, b1, GBS 1024": (-0.045, -0.055),
          "DGXC 25.04.01 Nemotron4-15B FP8, 2048 H100, t2 p1, b2, GBS 8192": (0.095, 0.083)}


@pytest.fixture(scope="module")
def runs():
    return {r.name: r for r in all_published_runs()}


def test_exactly_the_rows_whose_recipe_states_fp8_weights_gather_them(runs):
    """v25.04.01's Llama 3.1 / Nemotron4 FP8 rows (NeMo d2b21556) and v25.05.05's (NeMo 6f2c6fd / b4148d2) -- 32
    rows -- and round 22's MLPerf v4.x rows; no BF16 row, no v24.11.1 / v25.02.02 row (NeMo 1.0 YAMLs without
    fp8_params), and not the GPT-3 hydra rows (GPT3_FP8_PARAMS: a what-if)."""
    gathering = {name for name, r in runs.items() if r.workload.fp8_param_gather}
    nemo2 = {name for name in runs if nemo2_fp8_rows(name)}
    assert len(nemo2) == 32 and nemo2 <= gathering
    assert {name for name in gathering - nemo2 if not name.startswith("MLPerf v4.")} == set()
    assert all(runs[name].workload.fp8 for name in gathering)
    assert not any(runs[name].workload.fp8_param_gather for name in runs
                   if name.startswith(("DGXC 24.11.1", "DGXC 25.02.02")) or "GPT3" in name)


def test_the_row_modules_cite_the_code():
    for t in published_recipes.TABLES:
        s = published_recipes.stated(t)
        assert s.fp8_params == (t.release == "25.04.01" and t.model != "GPT3-175B")
        if s.fp8_params:
            assert "d2b21556" in s.where and "3e251a04" in s.where
    assert "9d4e41e5" in published14.NEMO2505_FP8_PARAMS and "6f2c6fd" in published14.NEMO2505_FP8_PARAMS


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_errors(runs, name):
    """Fails if the rows lose Workload.fp8_param_gather (the second number) or the term stops pricing it."""
    stated, two_byte = PINNED[name]
    run = runs[name]
    assert evaluate(run).error == pytest.approx(stated, abs=0.003)
    assert evaluate(replace(run, workload=replace(run.workload, fp8_param_gather=False))).error == pytest.approx(
        two_byte, abs=0.003)
