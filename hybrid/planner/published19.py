"""Round 19 (issue 26, planner19a): Megatron-Core's weak-scaling rows at small hidden sizes -- the candidates priced,
and the one that moves them, a what-if landed nowhere (docs/planner/round19-gemm-ceiling.md, part 2).

    python -m hybrid.planner.published19              # the nine rows under each candidate
    python -m hybrid.planner.published19 --families   # the families report under the attention-dropout what-if

The README (NVIDIA/Megatron-LM at f2e5db4, "Performance Benchmarking") states s 4096, V 131072, d 48, the
distributed optimizer, --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap, bf16; not the micro-batch,
recomputation or dropout. Megatron's own defaults (megatron/training/arguments.py: --attention-dropout 0.1,
--hidden-dropout 0.1) are what the rows are planned with (published_more.mcore_model). Transformer Engine runs that
attention core with dropout inside the fused kernel on Hopper (cuDNN's F16_arbitrary_seqlen sub-backend, preferred
over flash-attn on sm90; FlashAttention 3 is disabled for dropout: TE's get_attention_backend), and the planner
prices every flash kernel at its published no-dropout rate (hardware.FLASH_FWD_BWD_TFLOPS, Dao 2023: dropout_p 0).

The what-if (`attention_dropout_slowdown`): a flash attention core whose workload trains with dropout > 0 takes
`factor` x its seconds. DROPOUT_SLOWDOWN is the one published measurement of an in-kernel dropout's cost found this
round, and it is not Hopper's: Dao-AILab/flash-attention PR 2597 (FA4 on SM100 / SM110, bf16, p 0.125) reports the
forward at 75-85 % and the backward at 60-70 % of the no-dropout TFLOP/s; at their midpoints and the benchmark's
forward + 2.5 x backward, (1 / 0.80 + 2.5 / 0.65) / 3.5 = 1.456. PR 2439's SM120 (GB10) runs at head 128 show 2-6 %.
So the factor brackets 1.02-1.46 on other chips; no H100 figure exists in a stored source, and no row fits it.
Round 20 found Hopper's (NVIDIA/TransformerEngine issue 3312, cuDNN fused attention on H200 sm90, sbhd: 1.034) and
landed it (hardware.ATTENTION_DROPOUT_COST); this what-if's factor now stands in place of it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from hybrid.planner.published import PublishedRun

FA4_FORWARD_SHARE, FA4_BACKWARD_SHARE = 0.80, 0.65  # PR 2597: 75-85 % and 60-70 % of the no-dropout TFLOP/s
DROPOUT_SLOWDOWN = (1 / FA4_FORWARD_SHARE + 2.5 / FA4_BACKWARD_SHARE) / 3.5  # 1.456: forward + 2.5 x backward


@contextmanager
def attention_dropout_slowdown(factor: float = DROPOUT_SLOWDOWN) -> Iterator[None]:
    """Inside the block the flash attention core of a workload with dropout > 0 (ModelConfig.dropout: the recipes'
    hidden and attention dropout, equal in every row here) takes `factor` x its seconds; everything else as
    shipped. The config's attention_dropout is not read: replace(gpt_model(...), dropout=0.0) leaves it at 0.1 in
    rows whose runs state no dropout (MosaicML's, NeMo 24.07's GPT-3 175B)."""
    from hybrid.planner import time as time_model
    original = time_model._Context.flash_seconds

    def flash_seconds(self, b: int, s: int) -> float:  # instead of round 20's landed cost (ATTENTION_DROPOUT_COST)
        return original(self, b, s) * (factor / self.attention_dropout_cost() if self.work.model.dropout > 0 else 1.0)
    time_model._Context.flash_seconds = flash_seconds
    try:
        yield
    finally:
        time_model._Context.flash_seconds = original


def _error(run: PublishedRun) -> float:
    return run.throughput_error(run.predict())


def candidates_table() -> str:
    """Each weak-scaling row as shipped and under each candidate: the micro-batch at 1 (unstated; the planner picks
    4), selective recomputation (unstated), the exposed DP term hidden entirely (an upper bound on what the DP
    overlap could still hide), and the attention-dropout what-if."""
    from hybrid.planner.layout import Recompute
    from hybrid.planner.published_more import mcore_weak_runs
    lines = ["| row | as shipped | b 1 | selective recompute | DP term hidden | attention dropout x 1.456 |",
             "|---|---|---|---|---|---|"]
    for run in mcore_weak_runs():
        plan = run.predict()
        err = run.throughput_error(plan)
        b1 = replace(run, space=replace(run.space, micro_batch=(1,)))
        sel = replace(run, space=replace(run.space, recompute=(Recompute.SELECTIVE,)))
        hidden = (1 + err) * plan.time.total / (plan.time.total - plan.time.term("dp_exposed")) - 1
        with attention_dropout_slowdown():
            drop = _error(run)
        cells = [f"{100 * e:+.1f} %" for e in (err, _error(b1), _error(sel), hidden, drop)]
        lines.append(f"| {run.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def families_report() -> str:
    from hybrid.planner.families import all_rows, report
    from hybrid.planner.published_more import evaluate

    def under(run):
        with attention_dropout_slowdown():
            return evaluate(run)
    return report(all_rows(under))


def main() -> None:
    if sys.argv[1:] == ["--families"]:
        print(families_report())
        return
    if sys.argv[1:]:
        raise SystemExit(f"unknown arguments {sys.argv[1:]}: pass nothing or --families")
    print(candidates_table())


if __name__ == "__main__":
    main()
