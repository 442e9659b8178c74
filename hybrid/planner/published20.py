"""Issue 26, round 20 (planner20b): the tables of docs/planner/round20-fsdp2-tp.md that are not the families report.

    python -m hybrid.planner.published20   # the async-TP speed-ups, the CP rows' ring steps, the H200 FP8 what-if

Nothing in the shipped model reads this module. The pooled rule and the FP8 rate are what-ifs, each undone on
leaving its block (tests/test_planner20_docs.py).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from hybrid.planner import async_tp
from hybrid.planner import time as ptime

# a torch._scaled_mm 8192^3 figure, bf16 output (gitea.d-robotics.cc han.zhao/test_gpu_scripts,
# reports_cublaslt_fp8_crosscheck_20260524.md: 1170.4 / 1179.5 TFLOP/s on two hosts, cuBLASLt directly 1608.6 /
# 1613.7; the GPU model is not stated): a what-if rate, not a measurement of a named card
SCALED_MM_TFLOPS = 1175.0
CUBLASLT_FP8_TFLOPS = 1610.0


@contextlib.contextmanager
def pooled_async_tp() -> Iterator[None]:
    """Rounds 14-19's rule for async TP on the PyTorch stack: the pass's TP seconds under the pass's GEMMs pooled
    (time._tp_overlapped), in place of async_tp.seconds."""
    fused = async_tp.seconds

    def pooled(ctx) -> tuple[float, float]:
        forward, backward = ptime.layer_passes(ctx)
        f, b, _ = ptime._tp_cost(ctx, 1, False, False, forward, backward)
        return ptime._tp_overlapped(ctx, f, forward.gemm), ptime._tp_overlapped(ctx, b, backward.gemm)
    async_tp.seconds = pooled
    try:
        yield
    finally:
        async_tp.seconds = fused


def async_speedups() -> str:
    """Published async / vanilla throughput of each async-TP row against its synchronous sibling, and the planned
    ratio under the pooled rule and under the fused ops."""
    from hybrid.planner.published import torchtitan_runs
    from hybrid.planner.published14 import async_tp_runs, dec2024_async_tp_run
    runs = async_tp_runs()
    dec = next(r for r in torchtitan_runs() if "TP 8" in r.name and "PP" not in r.name and "Float8" in r.name)
    pairs = list(zip(runs[0::2], runs[1::2])) + [(dec, dec2024_async_tp_run())]

    def ratios() -> list[float]:
        return [on.value(on.predict()) / off.value(off.predict()) for off, on in pairs]
    fused = ratios()
    with pooled_async_tp():
        pooled = ratios()
    lines = ["| async TP row | published async / vanilla | planned, pooled rule (rounds 14-19) | planned, fused ops "
             "(this round) |", "|---|---|---|---|"]
    for (off, on), p, f in zip(pairs, pooled, fused):
        lines.append(f"| {on.name} | {on.published / off.published:.3f} | {p:.3f} | {f:.3f} |")
    return "\n".join(lines)


def cp_steps() -> str:
    """torchtitan's 8B CP rows (s / c = 32768 a GPU at every c): published and planned steps, and the seconds each
    adds over CP 1 per ring step (c - 1 of them)."""
    from hybrid.planner.published_more import evaluate
    from hybrid.planner.families import all_published_runs
    rows = [r for r in all_published_runs() if r.name.startswith("torchtitan Llama 3.1 8B, 8 H100 500W, FSDP")
            and " x CP " in r.name]
    results = [(r, evaluate(r)) for r in rows]
    # published step = planned step x (1 + error): the rows publish tokens a GPU a second, the error is on that
    steps = [(r.cp, res.plan.total_s * (1 + res.error), res.plan.total_s) for r, res in results]
    pub1, plan1 = next((p, q) for c, p, q in steps if c == 1)
    lines = ["| row | published step s | planned step s | published extra a ring step s | planned extra a ring step s |",
             "|---|---|---|---|---|"]
    for (r, _), (c, pub, plan) in zip(results, steps):
        ring = (f"{(pub - pub1) / (c - 1):.2f} | {(plan - plan1) / (c - 1):.2f}" if c > 1 else "- | -")
        lines.append(f"| {r.name} | {pub:.2f} | {plan:.2f} | {ring} |")
    return "\n".join(lines)


def h200_fp8_whatif() -> str:
    """The two Trainy H200 rows (the only FP8 rows on the h200 preset) with FP8 GEMMs at the two rates above: the
    preset's FP8 peak scaled so that its curve's asymptote is the stated rate."""
    from hybrid.planner.published import _plan_on
    from hybrid.planner.published14 import h200_runs
    lines = ["| row | as shipped (FP8 asymptote 1,575 TFLOP/s) | FP8 at 1,175 (_scaled_mm) | FP8 at 1,610 (cuBLASLt) |",
             "|---|---|---|---|"]
    for run in h200_runs():
        hw = run.hardware()

        def err(tflops: float) -> str:
            peak = tflops / hw.compute_efficiency
            return f"{100 * run.throughput_error(_plan_on(run, hw.with_overrides(fp8_tflops=peak))):+.1f} %"
        shipped = f"{100 * run.throughput_error(_plan_on(run, hw)):+.1f} %"
        lines.append(f"| {run.name} | {shipped} | {err(SCALED_MM_TFLOPS)} | {err(CUBLASLT_FP8_TFLOPS)} |")
    return "\n".join(lines)


def report() -> str:
    return "\n\n".join((async_speedups(), cp_steps(), h200_fp8_whatif()))


def main() -> None:
    from hybrid.cliutil import HelpFormatter, OneLineParser
    OneLineParser(prog="python -m hybrid.planner.published20", description=__doc__.split("\n\n")[0],
                  formatter_class=HelpFormatter).parse_args()
    print(report())


if __name__ == "__main__":
    main()
