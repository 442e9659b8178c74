"""The planner on published runs outside shared/reference (hybrid/planner/published.py): the numbers
docs/planner.md reports ("Published runs") are the ones the code computes, each layout is the published one,
and the Llama 3 405B layout's 126 layers go on 16 ranks with the edge stages one layer short, as the paper ran."""

from __future__ import annotations

import pytest

from hybrid.planner.layout import stage_layers
from hybrid.planner.model import ActivationProfile
from hybrid.planner.published import Metric, check, published_runs

RUNS = published_runs()
# name -> (layout the planner reports, prediction in the source's unit, error in %), as in docs/planner.md
DOCUMENTED = {RUNS[0].name: ("tp4 pp12 dp8 v1 b2 z1 full", 91.9, -12.2),
              RUNS[1].name: ("tp8 pp16 dp64 v4 b1 z1 sp full", 395.1, -8.1),
              RUNS[2].name: ("tp8 pp16 dp128 v4 b1 z1 sp full", 355.0, -11.3)}


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name.split(",")[0] + f"-{r.gpus}")
def test_each_published_run_predicts_what_the_docs_report(run):
    plan, got, err = check(run)
    layout, value, error = DOCUMENTED[run.name]
    assert plan.layout.short() == layout
    assert round(got, 1) == value and round(100 * err, 1) == error
    assert (plan.layout.tp, plan.layout.pp, plan.layout.dp) == (run.space.tp[0], run.space.pp[0],
                                                                run.gpus // (run.space.tp[0] * run.space.pp[0]))


def test_bloom_is_compared_on_step_time_and_llama_on_model_flops():
    assert [r.metric for r in RUNS] == [Metric.STEP_S, Metric.MODEL_TFLOPS, Metric.MODEL_TFLOPS]
    assert RUNS[0].workload.global_batch * RUNS[0].workload.seq_length == 2048 * 2048


def test_llama_is_planned_with_flash_attention_and_bloom_with_the_materialised_softmax():
    """BLOOM's Megatron-DeepSpeed (2022) materialised the s x s softmax; at s 8192 the Llama rows assume flash
    attention (docs/planner.md says so): without it the planner counts 2.1 GB of scores per layer."""
    assert RUNS[0].workload.activations is ActivationProfile.KORTHIKANTI
    assert {r.workload.activations for r in RUNS[1:]} == {ActivationProfile.BF16_FLASH}


def test_llama_405b_stages_have_fewer_layers_at_both_ends():
    cfg = RUNS[1].workload.model
    assert stage_layers(cfg, 16, 1, 8192) == (7,) + (8,) * 14 + (7,)
