"""Round 18 (issue 26): DTensor SP's copies and torchao's float8 TP all-gathers (Workload.sp_copies,
Workload.float8_tp_gathers; time.tp_copy_bytes, predicted_comm.tp_ledger's gather_bytes).

torch's functional collectives gather and scatter on dim 0, so a sequence-dim (Shard(1)) all-gather is followed by
a torch.cat of its t chunks and a reduce-scatter preceded by one: a read and a write of the whole b s h tensor a
collective on the compute stream. torchtitan's Float8 TP casts a layer's inputs (and its row-parallel outputs'
gradients) to float8 before their all-gathers. Ledger arithmetic, the refusals and two named rows; ~3 s of CPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hybrid.planner.layout import Recompute, Workload
from hybrid.planner.predicted_comm import tp_ledger
from hybrid.planner.published import (LLAMA3_8B, heldout_h100_runs, llama_model, torchtitan_pipeline_runs,
                                      torchtitan_runs)
from hybrid.planner.published14 import async_tp_runs
from hybrid.planner.published15 import runs15
from hybrid.planner.published_more import evaluate
from hybrid.planner.time import tp_copy_bytes

B, S, L, T = 2, 4096, 3, 4
H = 4096


def _work(**kw) -> Workload:
    kw.setdefault("fp32_grads", False)  # bf16 gradients, as these tests were derived (Workload's default to round 23)
    return Workload(llama_model(*LLAMA3_8B, S), global_batch=8, seq_length=S, **kw)


def _book(work: Workload, recompute: Recompute = Recompute.FULL, sp: bool = True, first=False, last=False):
    return tp_ledger(work.shard(T), B, S, L, first, last, sp, recompute, 2, work.tp_plan, work.tp_gather_bytes)


def test_each_sp_collective_copies_its_whole_tensor_once():
    """A Llama layer under SP and full recomputation: 6 all-gathers and 5 reduce-scatters of b s h bf16 (round
    17's BLOCK counts), each read and written once by its torch.cat: 2 x 11 x b s h x 2 bytes, 11 kernels."""
    book = _book(_work(sp_copies=True))
    nbytes = [tp_copy_bytes(_work(sp_copies=True), book[side]) for side in ("forward", "backward")]
    bsh = B * S * H * 2
    assert sum(n for n, _ in nbytes) == 2 * 11 * L * bsh
    assert sum(k for _, k in nbytes) == 11 * L


def test_no_copies_by_default_without_sp_or_under_async_tp():
    """The default (Megatron's and this runtime's sequence-first activations), plain TP (all-reduces in place)
    and async TP (tp_comm_overlap: the fused all-gather-matmul, not priced) copy nothing."""
    assert tp_copy_bytes(_work(), _book(_work())["forward"]) == (0.0, 0)
    plain = _book(_work(sp_copies=True), sp=False)
    assert tp_copy_bytes(_work(sp_copies=True), plain["backward"]) == (0.0, 0)
    fused = _work(sp_copies=True, tp_comm_overlap=True)
    assert tp_copy_bytes(fused, _book(fused)["forward"]) == (0.0, 0)


def test_float8_tp_gathers_move_one_byte_in_the_layers_only():
    """Float8 TP: every layer all-gather (forward, backward, rerun) at 1 byte an element, the reduce-scatters and
    the edges' collectives (embedding, head: not float8 linears) at the activation dtype's 2."""
    bf16, f8 = _work(fp8=True), _work(fp8=True, float8_tp_gathers=True)
    for side in ("forward", "backward"):
        a, b = _book(bf16)[side], _book(f8)[side]
        assert b["all_gather@tp"]["bytes"] * 2 == a["all_gather@tp"]["bytes"]
        assert b["reduce_scatter@tp"] == a["reduce_scatter@tp"]
    edges = {side: tp_ledger(f8.shard(T), B, S, 0, True, True, True, Recompute.NONE, 2, f8.tp_plan,
                             f8.tp_gather_bytes)[side] for side in ("forward", "backward")}
    assert edges["forward"]["all_gather@tp"]["bytes"] == B * S * H * 2  # the head's input gather
    with pytest.raises(ValueError, match="float8_tp_gathers .* needs fp8"):
        _work(float8_tp_gathers=True)


def test_rows_state_what_their_runtime_runs():
    """torchtitan's synchronous TP rows and KempnerForge's rows copy; torchtitan's async TP rows and its Tables 5-6
    (AsyncTP) do not; every torchtitan Float8 row gathers float8."""
    sync = [r for r in async_tp_runs() if not r.workload.tp_comm_overlap]
    asynchronous = torchtitan_pipeline_runs()
    plain = [r for r in torchtitan_runs() if r.name not in {a.name for a in asynchronous}]
    plain += [r for r in heldout_h100_runs() if r.name.startswith("torchtitan")]  # the 405B at TP 8 (2024)
    assert all(r.workload.sp_copies for r in sync + runs15() + plain)
    assert not any(r.workload.sp_copies for r in heldout_h100_runs() if not r.name.startswith("torchtitan"))
    assert not any(r.workload.sp_copies for r in asynchronous)
    fp8 = [r for r in async_tp_runs() + torchtitan_runs() if r.workload.fp8]
    assert fp8 and all(r.workload.float8_tp_gathers for r in fp8)


@pytest.mark.parametrize("prefix,before,now", [
    ("torchtitan Llama 3.1 8B, 64 H100 500W, FSDP 8 x TP 8 + compile, b12", 0.196, 0.070),
    ("KempnerForge 7B (exp 05), 4 H200, TP 4", 0.160, 0.074)])
def test_named_rows_move_into_the_band(prefix, before, now):
    """The bf16 TP rows the copies were missing from (round 17's what-if 1): torchtitan's 8B at TP 8 (2025-06) and
    KempnerForge's 7B at TP 4, each as planned today and with the copies off (fails if the term is reverted)."""
    row = next(r for r in async_tp_runs() + runs15() if r.name.startswith(prefix))
    row = replace(row, workload=replace(row.workload, gathered_logits=False))  # round 20's term apart (its own test)
    off = replace(row, workload=replace(row.workload, sp_copies=False))
    assert evaluate(off).error == pytest.approx(before, abs=0.002)
    assert evaluate(row).error == pytest.approx(now, abs=0.002)
