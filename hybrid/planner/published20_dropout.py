"""Round 20's dropout table and its what-if (planner20a; docs/planner/round20-selective-op-dropout.md):

1. **Hopper's price of attention dropout** (landed: hardware.ATTENTION_DROPOUT_COST, time._Context.flash_seconds).
   Megatron-Core with Transformer Engine runs the attention core through TE's `DotProductAttention`, whose
   `get_attention_backend` disables FlashAttention 3 under dropout ("Disabling FlashAttention 3 for dropout") and,
   with FusedAttention (cuDNN's F16_arbitrary_seqlen sub-backend, which takes dropout) and flash-attn 2 both
   available, disables flash-attn "to give FusedAttention preference on Hopper+ for performance reasons": the
   same cuDNN kernel runs with and without dropout. Its published cost (NVIDIA/TransformerEngine issue 3312, H200
   sm90, sbhd): 0.614 / 0.594 ms = 1.034 x. The table prices each dropout row without the term (before round 20),
   as shipped, and under round 19's FA4-on-SM100 what-if (published19.DROPOUT_SLOWDOWN, 1.456, instead of it).
2. **torchtitan's op-level SAC policy against ours** (a what-if, not landed). Both store every second `aten.mm`'s
   output and the SDPA kernel's and rerun the rest, and both stop the rerun early (torch's non-reentrant
   checkpoint), so on Llama blocks they rerun the same matmuls (k, o, up). torchtitan's `_save_list`
   (torchtitan/parallelisms/parallelize_llama.py at 004b3148, the December 2024 code its published rows ran; the
   June 2025 rows' is the same list plus `aten.max`) also holds `torch.ops._c10d_functional.reduce_scatter_tensor
   .default`: under TP + SP the reduce-scatter of o's output is stored, so the rerun does not repeat it (ours
   reruns it; predicted_comm.tp_ledger prices ours). The what-if prices theirs on torchtitan's four TP 8 + SP rows.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from hybrid.planner.hardware import HOPPER_ATTENTION_DROPOUT
from hybrid.planner.published import PublishedRun


@contextmanager
def attention_dropout_cost(costs: dict[str, float]) -> Iterator[None]:
    """Inside the block hardware.ATTENTION_DROPOUT_COST is `costs` ({}: no cost, as before round 20)."""
    from hybrid.planner import time as time_model
    original = dict(time_model.ATTENTION_DROPOUT_COST)
    time_model.ATTENTION_DROPOUT_COST.clear()
    time_model.ATTENTION_DROPOUT_COST.update(costs)
    try:
        yield
    finally:
        time_model.ATTENTION_DROPOUT_COST.clear()
        time_model.ATTENTION_DROPOUT_COST.update(original)


@contextmanager
def torchtitan_sac_keeps_reduce_scatter() -> Iterator[None]:
    """Inside the block selective-op's rerun under SP repeats the all-gathers but not o's reduce-scatter (the
    policy stores its output: torchtitan's `_save_list`): the TP ledger's backward loses one reduce-scatter of
    b s h elements a layer (predicted_comm.tp_ledger adds it for the rerun)."""
    from hybrid.planner import predicted_comm, time as time_model
    from hybrid.planner.hardware import Collective
    from hybrid.planner.layout import Recompute
    original = predicted_comm.tp_ledger

    def tp_ledger(shard, b, s, layers, first, last, sp, recompute=Recompute.NONE, elem_bytes=2, *rest):
        book = original(shard, b, s, layers, first, last, sp, recompute, elem_bytes, *rest)
        if recompute is Recompute.SELECTIVE_OP and sp and shard.t > 1:
            key = f"{Collective.REDUCE_SCATTER.value}@tp"
            entry = book["backward"][key]
            book["backward"][key] = {"calls": entry["calls"] - layers,
                                     "bytes": entry["bytes"] - layers * b * s * shard.cfg.hidden_size * elem_bytes}
        return book
    predicted_comm.tp_ledger = time_model.tp_ledger = tp_ledger
    try:
        yield
    finally:
        predicted_comm.tp_ledger = time_model.tp_ledger = original


def dropout_rows() -> list[PublishedRun]:
    """The Megatron-stack H100 rows planned with dropout > 0 (all GPT architecture)."""
    from hybrid.planner.families import all_published_runs
    return [r for r in all_published_runs() if r.hardware().flash_rates == "h100-80g" and r.workload.model.dropout > 0
            and not r.workload.pytorch_native(r.predict().layout)]


def dropout_table() -> str:
    """Each dropout row without the attention-dropout cost (before round 20), as shipped (Hopper's 1.034), and
    under round 19's 1.456 instead."""
    from hybrid.planner.published19 import DROPOUT_SLOWDOWN, attention_dropout_slowdown
    lines = [f"| row | without (round 19) | attention dropout x {HOPPER_ATTENTION_DROPOUT:.3f} (shipped) | "
             f"x {DROPOUT_SLOWDOWN:.3f} instead (round 19's what-if) |", "|---|---|---|---|"]
    for run in dropout_rows():
        shipped = _error(run)
        with attention_dropout_cost({}):
            before = _error(run)
            with attention_dropout_slowdown():
                sm100 = _error(run)
        lines.append(f"| {run.name} | {100 * before:+.1f} % | {100 * shipped:+.1f} % | {100 * sm100:+.1f} % |")
    return "\n".join(lines)


def torchtitan_tp_rows() -> list[PublishedRun]:
    from hybrid.planner.families import all_published_runs
    return [r for r in all_published_runs() if r.name.startswith("torchtitan") and "TP 8" in r.name
            and "selective-op" in r.name]


def torchtitan_policy_table() -> str:
    lines = ["| row | our policy (shipped) | torchtitan's (reduce-scatter kept) |", "|---|---|---|"]
    for run in torchtitan_tp_rows():
        ours = _error(run)
        with torchtitan_sac_keeps_reduce_scatter():
            theirs = _error(run)
        lines.append(f"| {run.name} | {100 * ours:+.1f} % | {100 * theirs:+.1f} % |")
    return "\n".join(lines)


def _error(run: PublishedRun) -> float:
    return run.throughput_error(run.predict())


def main() -> None:
    if sys.argv[1:]:
        raise SystemExit(f"unknown arguments {sys.argv[1:]}: pass nothing")
    print(dropout_table())
    print()
    print(torchtitan_policy_table())


if __name__ == "__main__":
    main()
