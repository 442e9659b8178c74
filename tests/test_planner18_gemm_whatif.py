"""Round 18 (issue 26): the what-ifs of hybrid/planner/published18.py (docs/planner/rounds.md "Round 18: DTensor SP's
copies", "What was looked at and not landed"): the Float8 one, which the shipped model does not read, and the GEMM
ceiling's premises (landed in round 19: tests/test_planner19_gemm_ceiling.py). No row is planned; ~0.1 s."""

from __future__ import annotations

import pytest

from hybrid.planner.published18 import float8_sac_recomputes_linears, gpt3_shapes, h200_beyond, large_ratio, xla_largest


def test_gpt3_tp4_matmuls_lie_beyond_xlas_table():
    """Every per-rank matmul of GPT-3 175B at t 4 (b 1, s 2048) has more FLOPs than XLA's largest measured shape
    (2 x 4096^3): the H100 curve prices them by extrapolation."""
    flops, dim = xla_largest()
    assert (flops, dim) == (2.0 * 4096 ** 3, 4096)
    shapes = gpt3_shapes()
    assert len(shapes) == 18 and all(g.flops > flops for _, g in shapes)


def test_the_ceiling_is_the_measured_ratio_of_the_four_named_shapes():
    """LARGE_FIT: our H200's four products beyond XLA's table; measured / curve 0.959 (H100) and 0.957 (H200), as
    docs/planner/rounds.md reports."""
    assert sorted(round(g.flops / 1e9) for g, _ in h200_beyond()) == [1100, 2152, 2152, 2152]
    assert large_ratio("h100-80g") == pytest.approx(0.959, abs=0.0005)
    assert large_ratio("h200") == pytest.approx(0.957, abs=0.0005)


def test_float8_sac_what_if_reruns_every_linear_of_an_fp8_shard_only_and_is_undone():
    from hybrid.planner.layout import Workload
    from hybrid.planner.published import LLAMA3_8B, llama_model
    bf16 = Workload(llama_model(*LLAMA3_8B, 4096), global_batch=8, seq_length=4096, fp32_grads=False).shard(1)
    fp8 = Workload(llama_model(*LLAMA3_8B, 4096), global_batch=8, seq_length=4096, fp8=True, fp32_grads=False).shard(1)
    shipped = (len(fp8.selective_op_rerun_gemms(1, 4096, False)), fp8.selective_op_kept_bytes(1, 4096, False))
    with float8_sac_recomputes_linears():
        assert len(fp8.selective_op_rerun_gemms(1, 4096, False)) == 7 and len(bf16.selective_op_rerun_gemms(1, 4096, True)) == 3
        kept = fp8.selective_op_kept_bytes(1, 4096, False)
        assert kept == pytest.approx(shipped[1] - 4096 * 2 * (4096 + 1024 + 14336 + 4096))  # q, v, gate, down
    assert (len(fp8.selective_op_rerun_gemms(1, 4096, False)), fp8.selective_op_kept_bytes(1, 4096, False)) == shipped
