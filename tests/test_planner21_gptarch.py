"""Round 21 (planner21a): the bias gradients Megatron-core leaves to autograd (ops._bias_grad_ops), and the
GPT-architecture what-if tables (hybrid/planner/published21_gptarch.py; docs/planner/round21-gpt-arch.md)."""

from __future__ import annotations

import pytest

from hybrid.planner import published21_gptarch as gptarch
from hybrid.planner.layout import Workload
from hybrid.planner.model import ActivationProfile
from hybrid.planner.ops import KernelProfile, layer_ops
from hybrid.planner.published import LLAMA3_70B, llama_model
from hybrid.planner.published_more import evaluate, nemotron_model
from hybrid.planner.reference import gpt_model


def _ops(cfg, t: int, kernels: KernelProfile = KernelProfile.FUSED) -> dict:
    work = Workload(cfg, global_batch=8, seq_length=2048, activations=ActivationProfile.BF16_FLASH, kernels=kernels,
                    fp32_grads=False)
    return {o.name: o for o in layer_ops(work.shard(t), 2048, t > 1, 2, kernels)}


def test_gpt3_fc1_bias_gradient_reads_fc1s_output_gradient_once():
    """GPT-3 175B at t 4: fc1's bias sums the f / t = 49152 / 4 = 12288 gradients of a token, bf16, one read:
    24576 bytes a token, one backward kernel, nothing forward; at t 1 the whole f = 49152."""
    op = _ops(gpt_model(96, 12288, 96, 50257, 2048), 4)["fc1 bias grad"]
    assert (op.fwd_bytes, op.bwd_bytes, op.fwd_kernels, op.bwd_kernels) == (0.0, 24576.0, 0, 1)
    assert _ops(gpt_model(96, 12288, 96, 50257, 2048), 1)["fc1 bias grad"].bwd_bytes == 2 * 49152


def test_no_bias_no_reduction_and_eager_not_priced():
    """Llama and Nemotron-4 (no linear biases) pay nothing; EAGER's autograd bias sums are not priced here."""
    assert "fc1 bias grad" not in _ops(llama_model(*LLAMA3_70B, 4096), 4)
    assert "fc1 bias grad" not in _ops(nemotron_model(32, 6144, 48, 8, 24576, 4096), 4)
    assert "fc1 bias grad" not in _ops(gpt_model(24, 2048, 16, 50257, 2048), 2, KernelProfile.EAGER)


@pytest.mark.parametrize("name, before, after", [
    # since round 25 with the loss Megatron-core ran (Workload.megatron_unfused_loss; before it 0.270 / 0.262 and
    # 0.161 / 0.156)
    ("Megatron-Core 1.7B, 48 H100, t1 p1 d48", 0.239, 0.231),
    ("Megatron-Core 7.1B, 96 H100, t2 p1 d48", 0.153, 0.148),
])
def test_named_rows_move_by_the_bias_gradients(name, before, after):
    """The two rows the term moves most: round 20's error without it, round 21's with it (0.2-point tolerance:
    the term moves them 0.5-0.9 point, so a revert fails)."""
    (run,) = gptarch.runs_named((name,))
    with gptarch.no_bias_grads():
        assert evaluate(run).error == pytest.approx(before, abs=0.002)
    assert evaluate(run).error == pytest.approx(after, abs=0.002)


def test_te_full_layer_reduces_fc1s_bias_gradient_inside_te():
    """TE's whole TransformerLayer (Workload.te_full_layer: NeMo 2.0's GPT configs from 2024-11 on) reduces fc1's
    bias gradient inside TE: no separate pass."""
    cfg = gpt_model(24, 4096, 32, 50257, 2048)
    work = Workload(cfg, global_batch=8, seq_length=2048, activations=ActivationProfile.BF16_FLASH,
                    kernels=KernelProfile.FUSED, fp32_grads=False)
    assert "fc1 bias grad" not in {o.name for o in layer_ops(work.shard(1), 2048, False, 2, KernelProfile.FUSED,
                                                              te_full_layer=True)}


def test_nemo_2407_gpt3_rows_run_megatrons_layer_and_pay_the_term():
    """Round 21's review: NeMo 24.07's container (NeMo r2.0.0rc1, 2024-08) predates NeMo's
    `use_transformer_engine_full_layer_spec` (5b7daa00, 2024-11-01): its GPT-3 rows run Megatron-core's TE spec,
    Megatron's MLP, and pay fc1's bias gradient -- GPT3-5B +15.3 % without the term, +14.4 % with it (tolerance
    0.2 point; the term moves it 0.9)."""
    (run,) = gptarch.runs_named(("NeMo 24.07 GPT3-5B FP8, 64 H100, t1 p1, b4, GBS 2048",))
    assert not run.workload.te_full_layer
    with gptarch.no_bias_grads():
        assert evaluate(run).error == pytest.approx(0.153, abs=0.002)
    assert evaluate(run).error == pytest.approx(0.144, abs=0.002)


def test_no_bias_grads_restores_the_term():
    cfg = gpt_model(24, 2048, 16, 50257, 2048)
    with gptarch.no_bias_grads():
        assert "fc1 bias grad" not in _ops(cfg, 1)
    assert "fc1 bias grad" in _ops(cfg, 1)


def test_candidates_tables_name_every_priced_row():
    """The doc's candidate table has a line per candidate and prices both rows (the SM margin is 0 at t 1)."""
    table = gptarch.candidates_table()
    assert all(what in table for _, what, _ in gptarch.CANDIDATES)
    sm_line = next(line for line in table.splitlines() if line.startswith("| userbuffers"))
    assert sm_line.rstrip(" |").endswith("0.000 (0.0 %)")
