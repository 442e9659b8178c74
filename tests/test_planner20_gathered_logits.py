"""Issue 26, round 20: KempnerForge's TP head gathers the logits and every TP rank runs the loss over the whole
vocabulary (Workload.gathered_logits; docs/planner/round20-fsdp2-tp.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hybrid.planner.layout import TpPlan
from hybrid.planner.model import ActivationProfile, Shard
from hybrid.planner.ops import KernelProfile, Traffic, head_ops
from hybrid.planner.predicted_comm import CE_ALL_REDUCES, tp_ledger
from hybrid.planner.published import LLAMA3_8B, llama_model


def _shard(t: int) -> Shard:
    cfg = llama_model(*LLAMA3_8B, 4096)
    return Shard(cfg, t, cfg.vocab_size, ActivationProfile.BF16_FLASH)


def test_the_last_stage_gathers_the_logits_instead_of_the_loss_statistics():
    """tp_ledger's last stage: the vocab-parallel loss's three fp32 all-reduces a token by default; with
    gathered_logits one all-gather of b s V_p bf16 in their place; no other entry moves, and nothing at t = 1."""
    b, s = 2, 4096
    args = (_shard(4), b, s, 1, False, True, True)
    plain = tp_ledger(*args)
    gathered = tp_ledger(*args, gathered_logits=True)
    assert plain["forward"]["all_reduce@tp"]["calls"] == CE_ALL_REDUCES
    assert "all_reduce@tp" not in gathered["forward"]
    extra = b * s * 128256 * 2
    assert gathered["forward"]["all_gather@tp"]["bytes"] == plain["forward"]["all_gather@tp"]["bytes"] + extra
    assert gathered["forward"]["all_gather@tp"]["calls"] == plain["forward"]["all_gather@tp"]["calls"] + 1
    assert gathered["backward"] == plain["backward"]  # the replicated gradient is sliced, not reduced
    assert tp_ledger(_shard(1), b, s, 1, False, True, True, gathered_logits=True) == {"forward": {}, "backward": {}}


@pytest.mark.parametrize("kernels", [KernelProfile.FUSED, KernelProfile.EAGER])
def test_the_loss_runs_over_the_whole_vocabulary_on_every_rank(kernels):
    """head_ops: the loss's bytes a token are t x the vocab-parallel loss's; the final norm's are the same."""
    vocab_parallel = head_ops(_shard(4), True, 2, kernels)
    gathered = head_ops(_shard(4), True, 2, kernels, gathered=True)
    assert gathered[0] == vocab_parallel[0]
    loss, loss_t = Traffic.of(gathered[1:]), Traffic.of(vocab_parallel[1:])
    assert loss.fwd_bytes == pytest.approx(4 * loss_t.fwd_bytes) and loss.bwd_bytes == pytest.approx(4 * loss_t.bwd_bytes)
    assert head_ops(_shard(1), True, 2, kernels, gathered=True) == head_ops(_shard(1), True, 2, kernels)


def test_only_kempnerforge_tp_rows_gather_their_logits():
    """Every KempnerForge row with TP sets it (its tensor_parallel.py's head plan), none without TP, and no other
    published row does."""
    from hybrid.planner.families import all_published_runs
    runs = all_published_runs()
    kempner = [r for r in runs if r.source.startswith("KempnerInstitute/KempnerForge")]
    assert kempner and all(r.workload.gathered_logits == (r.space.tp[0] > 1) for r in kempner)
    assert not any(r.workload.gathered_logits for r in runs if r not in kempner)
    assert all(r.workload.tp_plan is TpPlan.PROJECTION for r in kempner)


@pytest.mark.parametrize("prefix,before,now", [
    ("KempnerForge 7B (exp 12), 32 H200, TP 4 x FSDP 8", 0.173, 0.135),
    ("KempnerForge 7B (exp 05), 4 H200, TP 4", 0.074, 0.034),
    ("KempnerForge 13B weak scaling, 32 H200", -0.048, -0.066)])
def test_named_rows_with_and_without_the_gathered_logits(prefix, before, now):
    """Two 7B rows it targets (exp 12, out at +17.3 %, comes in) and a 13B row it moves further below zero, each
    planned with and without the term (fails if it is reverted)."""
    from hybrid.planner.published15 import runs15
    from hybrid.planner.published_more import evaluate
    row = next(r for r in runs15() if r.name.startswith(prefix))
    off = replace(row, workload=replace(row.workload, gathered_logits=False))
    assert evaluate(off).error == pytest.approx(before, abs=0.002)
    assert evaluate(row).error == pytest.approx(now, abs=0.002)
