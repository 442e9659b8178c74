"""Round 23b (planner23b): the DGXC rows planned with every setting their files state -- FP8 weights on the GPT-3
175B FP8 hydra rows (`fp8_params: true`) and the overlapped gradient reduce-scatter on every NeMo 2.0 row
(DistributedDataParallelConfig(overlap_grad_reduce=True)) -- hybrid/planner/published23b_stated.py,
docs/planner/round23-fp8-dp.md section 5."""

from pathlib import Path

import pytest

from hybrid.planner import published14, published_recipes
from hybrid.planner import published23b_stated as stated_study
from hybrid.planner.families import all_published_runs
from hybrid.planner.published_more import evaluate

DOC = Path(__file__).resolve().parents[1] / "docs" / "planner" / "round23-fp8-dp.md"
# (as stated, round 23's plan without the setting): published / predicted step - 1, to 0.3 point
PINNED = {"DGXC 25.04.01 Nemotron4-15B FP8, 16 H100, t2 p1, b2, GBS 64": (0.063, 0.033),
          "DGXC 25.04.01 Nemotron4-340B BF16, 256 H100, t8 p8 v12, b1, GBS 64": (0.001, -0.017),
          "DGXC 24.11.1 GPT3-175B FP8, 2048 H100, t4 p8 v12, b1, GBS 4096": (0.151, 0.137)}


@pytest.fixture(scope="module")
def runs():
    return {r.name: r for r in all_published_runs()}


def test_every_dgxc_row_overlaps_its_gradient_reduction(runs):
    """NeMo 1.0's YAMLs (`overlap_grad_sync: true`) and NeMo 2.0's recipes (overlap_grad_reduce=True) alike: 64
    NeMo 2.0 rows (v25.04.01's and v25.05.05's Llama 3.1 and Nemotron4, BF16 and FP8), every DGXC row in all."""
    dgxc = {name: r.workload for name, r in runs.items() if name.startswith("DGXC")}
    nemo2 = [name for name in dgxc if stated_study.nemo2_row(name)]
    assert len(nemo2) == 64 and all(dgxc[name].overlap_grad_reduce for name in nemo2)
    assert all(w.overlap_grad_reduce and w.overlap_param_gather for w in dgxc.values())


def test_the_gpt3_fp8_rows_gather_fp8_weights_and_their_bf16_rows_do_not(runs):
    gpt3 = {name: r.workload for name, r in runs.items() if name.startswith("DGXC") and "GPT3-175B" in name}
    assert len(gpt3) == 20
    assert {name for name, w in gpt3.items() if w.fp8_param_gather} == {name for name in gpt3 if " FP8" in name}


def test_the_row_modules_cite_the_code_read():
    ddp = published_recipes.NEMO2_DDP_OVERLAP
    for where in ("llama3_8b.py:115-122", "llama3_70b.py:115-122", "llama31_405b.py:123-130", "nemotron.py:128-135",
                  "d2b21556", "megatron_comm_overlap.py:185-192"):
        assert where in ddp, where
    assert "6f2c6fd" in published14.NEMO2505_DDP_OVERLAP and "b4148d2" in published14.NEMO2505_DDP_OVERLAP
    assert "gpt3_175b_hydra.yaml:221" in published_recipes.GPT3_FP8_PARAMS


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_errors_as_stated_and_without(runs, name):
    """Fails if the row loses its stated setting (the first number becomes the second) or the term stops pricing it."""
    now, before = PINNED[name]
    run = runs[name]
    assert evaluate(run).error == pytest.approx(now, abs=0.003)
    assert evaluate(stated_study.without(run)).error == pytest.approx(before, abs=0.003)


def test_the_doc_holds_the_moved_rows(runs):
    """Every row the settings move, both ways, as section 5 prints it (74 rows: 64 + 10)."""
    moved = stated_study._moved(list(runs.values()))
    assert len(moved) == 74
    doc = DOC.read_text()
    for line in stated_study.moved_table(moved).splitlines()[2:] + stated_study.summary(moved).splitlines():
        assert line in doc, line
