"""Round 20's attention-dropout term (hardware.ATTENTION_DROPOUT_COST: Hopper's measured 1.034, TE issue 3312) and
its what-if (hybrid/planner/published20_dropout.py; docs/planner/round20-selective-op-dropout.md): the term on Megatron-Core's
1.7B and on nothing that states no dropout; torchtitan's SAC policy (its reduce-scatter kept) on a TP 8 + SP row.
Each context is undone on leaving its block."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hybrid.planner.hardware import ATTENTION_DROPOUT_COST, HOPPER_ATTENTION_DROPOUT, hardware
from hybrid.planner.layout import Cluster, Layout
from hybrid.planner.ops import Stack
from hybrid.planner.published20_dropout import attention_dropout_cost, torchtitan_sac_keeps_reduce_scatter, torchtitan_tp_rows
from hybrid.planner.published_more import _nemo_models, mcore_weak_runs
from hybrid.planner.time import _context


def _error(run) -> float:
    return run.throughput_error(run.predict())


def test_hopper_attention_dropout_is_the_published_ratio_on_every_hopper_preset():
    assert HOPPER_ATTENTION_DROPOUT == pytest.approx(1.034, abs=0.0005)  # 0.614 / 0.594 ms
    for name in ("h100-80g", "h100-96g-500w", "h200"):
        assert ATTENTION_DROPOUT_COST[hardware(name).flash_rates] == HOPPER_ATTENTION_DROPOUT
    assert hardware("a100-80g").flash_rates not in ATTENTION_DROPOUT_COST  # no A100 figure


def test_the_17b_pays_it_and_a_row_stating_no_dropout_does_not():
    run = mcore_weak_runs()[0]
    assert run.name.startswith("Megatron-Core 1.7B")
    with attention_dropout_cost({}):
        before = _error(run)
    # +28.0 / +27.0 % before round 21's fc1 bias gradient (ops._bias_grad_ops), which moves both 0.9 point; 0.271 /
    # 0.262 before round 25's unfused Megatron loss (Workload.megatron_unfused_loss), which moves both 3.1 points
    assert before == pytest.approx(0.240, abs=0.002) and _error(run) == pytest.approx(0.231, abs=0.002)
    # the flash core's seconds: x 1.034 on the Megatron stack with attention dropout; not on the PyTorch stack,
    # not without it (NeMo 24.07's GPT-3 175B states none: its attention_dropout is 0 too)
    work, cluster, lay = run.workload, Cluster(gpus=48, hw=hardware("h100-80g")), Layout(dp=48, micro_batch=4)
    assert _context(work, cluster, lay).attention_dropout_cost() == HOPPER_ATTENTION_DROPOUT
    assert _context(replace(work, stack=Stack.PYTORCH), cluster, lay).attention_dropout_cost() == 1.0
    assert _nemo_models()["GPT3-175B"].attention_dropout == 0.0
    assert _context(replace(work, model=_nemo_models()["GPT3-175B"]), cluster, lay).attention_dropout_cost() == 1.0


def test_torchtitans_policy_makes_its_tp_row_more_optimistic():
    run = next(r for r in torchtitan_tp_rows() if "FSDP 8 x TP 8 + compile, b12" in r.name)
    shipped = _error(run)
    with torchtitan_sac_keeps_reduce_scatter():
        theirs = _error(run)
    assert shipped == pytest.approx(0.070, abs=0.002) and theirs == pytest.approx(0.101, abs=0.002)
    assert _error(run) == shipped
