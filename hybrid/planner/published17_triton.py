"""Round 17 (issue 26): the H100 eager clock fitted on rows whose attention kernel has a published H100 rate, and
llm-foundry's Triton kernel's H100 rate fitted on the rows that ran it -- a what-if, landed nowhere.

    python -m hybrid.planner.published17_triton            # the two fits, the rows by group, the cross-card ratio
    python -m hybrid.planner.published17_triton --families # the families report (families.py) under the what-if
    python -m hybrid.planner.published17_triton --six-rows-clock  # the pair fitted with the clock on its six rows
    python -m hybrid.planner.published17_triton --joint    # the clock on its six rows + the 12 FlashAttention-2 rows
    python -m hybrid.planner.published17_triton --joint-families  # the families report under --joint

The conflict round 16 left (docs/planner.md "Round 16", `published16 --h100-triton-refit-what-if`): H100_EAGER_CLOCK
is fitted on MosaicML's six single-node H100 rows, which ran llm-foundry's `attn_impl: triton` (a FlashAttention-1
class Triton kernel, no published H100 rate), priced at FlashAttention-2's published rate x the clock. So the clock
carries that kernel's unknown rate; a Triton rate fitted on top (0.783) moved the clock's own rows, and refitting
the clock over them (0.708 -> 0.743) pushed the FlashAttention-2 rows out (+1.9 -> +6.1 %). The fit sets were the
cause: a constant fitted on rows that ran an unpriced kernel absorbs that kernel. Here each constant is fitted on
rows whose other unknowns are fixed:

* H100_EAGER_CLOCK on CLOCK_FIT: MosaicML's ">= 128 GPUs" table's FlashAttention-2 rows (1B, 3B, 7B, 70B at 128 /
  256 / 512 H100; its sweep.py at 5e85bd6 passes `--attn_impl flash` with `.[gpu-flash2]`, flash-attn 2.4.2) --
  the same stack and sweep scripts as the Triton rows, a kernel whose H100 rate is published (Figure 7). Mean log
  error 0.
* TRITON_H100 (a factor on the H100 flash share for the Triton kernel) on TRITON_FIT: the bf16 Triton rows at
  s >= 8192 (attention a large share of the step), with the clock above. Mean log error 0.
* Everything else checks: the six former clock rows, the Triton rows at s < 8192, the FP8 Triton rows (TE v0.10
  linears, the attention still Triton bf16), OLMo-core / fms-fsdp / the float8 blog (FlashAttention-2, other
  stacks), every other row of the families report. torchtitan's 500 W rows do not move (H100_500W_CLOCK is refitted
  against the eager clock on torchtitan's Table 1, keeping their product).
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import replace

from hybrid.planner.families import FamilyRow, all_published_runs, all_rows, family_of, report
from hybrid.planner.fit import solve
from hybrid.planner.hardware import (FLASH1_A100, FLASH_FWD_BWD_TFLOPS, FLASH_SEQS, H100_EAGER_CLOCK, AttentionKernel,
                                     GpuKind)
from hybrid.planner.published import PublishedRun, Role, _plan_on, summary
from hybrid.planner.published16 import LONG, _ran_triton
from hybrid.planner.published_more import Result, evaluate

# what fits() gives (docs/planner.md "Round 17: one Triton rate on both cards"; tests/test_planner17_triton.py holds it)
CLOCK_FITTED, TRITON_SHARE_FITTED = 0.6886, 0.5481
JOINT_CLOCK_FITTED, JOINT_SHARE_FITTED = 0.7075, 0.5414  # joint_fits(): the clock keeps its shipped value
CARD = "h100-80g"  # the preset H100_EAGER_CLOCK is fitted for; the 500 W part and the H200 are left as they are


def is_mpt(run: PublishedRun) -> bool:
    return run.name.startswith("MPT-")


def ran_triton(run: PublishedRun) -> bool:
    """Did this MosaicML row run llm-foundry's `attn_impl: triton`? Every A100 row (80 GB: the Oct 2023 sweep, b2a43a1;
    40 GB: the July 2023 README's table, c6cfb42, submit_benchmarks.py's default `--attn_impl triton` in both) and
    every H100 row but the ">= 128 GPUs" table's 1B / 3B / 7B / 70B (published16._ran_triton)."""
    return is_mpt(run) and (not run.gpu == CARD or _ran_triton(run))


def clock_fit_rows(runs: list[PublishedRun]) -> list[PublishedRun]:
    """CLOCK_FIT: MosaicML's H100 rows that ran FlashAttention-2 (the ">= 128 GPUs" table's 1B, 3B, 7B, 70B)."""
    return [r for r in runs if is_mpt(r) and r.gpu == CARD and not ran_triton(r)]


def triton_fit_rows(runs: list[PublishedRun]) -> list[PublishedRun]:
    """TRITON_FIT: MosaicML's bf16 H100 rows that ran Triton at s >= 8192 (the six single-node clock rows of
    published.py excepted: they check here). No A100 row: the A100 tables only check."""
    return [r for r in runs if ran_triton(r) and r.gpu == CARD and not r.workload.fp8
            and r.workload.seq_length >= LONG and r.role is Role.CHECK]


def device(run: PublishedRun, clock: float, t: float) -> tuple[PublishedRun, object]:
    """The row and the device it is planned on under the what-if: a Triton row's attention at t x FlashAttention-2's
    published bars (AttentionKernel.FLASH2's table, not scaled by the eager clock: on h100-80g its flash share x
    t / clock, which for_stack multiplies back by the clock); other h100-80g rows with the eager clock `clock`;
    every other row as shipped."""
    hw = run.hardware()
    if ran_triton(run):
        run = replace(run, workload=replace(run.workload, attention_kernel=AttentionKernel.FLASH2))
        clocked = clock if run.gpu == CARD else 1.0
        return run, hw.with_overrides(flash_efficiency=hw.flash_efficiency * t / clocked,
                                      eager_clock=clock if run.gpu == CARD else None)
    if run.gpu == CARD:
        return run, hw.with_overrides(eager_clock=clock)
    return run, hw


def error_on(run: PublishedRun, clock: float, t: float) -> float:
    """The row's throughput error under the what-if (`device`)."""
    planned, hw = device(run, clock, t)
    return planned.throughput_error(_plan_on(planned, hw))


def fit_clock(rows: list[PublishedRun]) -> float:
    """The eager clock at which `rows` (FlashAttention-2 rows: `t` plays no part) have mean log error 0."""
    return solve(lambda c: statistics.fmean(math.log1p(error_on(r, c, 1.0)) for r in rows), 0.0, 0.4, 1.0, iters=24)


def fit_triton(rows: list[PublishedRun], clock: float) -> float:
    """The Triton kernel's share t of FlashAttention-2's published rate at which `rows` have mean log error 0."""
    return solve(lambda t: statistics.fmean(math.log1p(error_on(r, clock, t)) for r in rows), 0.0, 0.3, 0.9,
                 iters=24)


def fits() -> tuple[float, float]:
    runs = all_published_runs()
    clock = fit_clock(clock_fit_rows(runs))
    return clock, fit_triton(triton_fit_rows(runs), clock)


def fa2_tflops(card: GpuKind, seq: int) -> float:
    """FlashAttention-2's published forward + backward TFLOP/s on `card` at `seq` (causal, head 128)."""
    return FLASH_FWD_BWD_TFLOPS[(card, AttentionKernel.FLASH2, 128, True)][FLASH_SEQS.index(seq)]


def groups(runs: list[PublishedRun]) -> list[tuple[str, list[PublishedRun]]]:
    h100 = [r for r in runs if ran_triton(r) and r.gpu == CARD and r not in triton_fit_rows(runs)]
    a100 = [r for r in runs if ran_triton(r) and r.gpu != CARD and r.role is Role.CHECK]
    fa2_other = [r for r in runs if r.gpu == CARD and not is_mpt(r)
                 and family_of(r.source).split()[0] in ("OLMo-core", "IBM", "torchtitan")]
    return [("clock fit: MosaicML H100 FlashAttention-2 rows (>= 128 GPUs)", clock_fit_rows(runs)),
            ("Triton fit: MosaicML H100 bf16 Triton rows at s >= 8192", triton_fit_rows(runs)),
            ("check: the six former clock rows (8 H100)", [r for r in h100 if r.role is Role.FIT]),
            ("check: MosaicML H100 bf16 Triton rows at s < 8192",
             [r for r in h100 if not r.workload.fp8 and r.role is Role.CHECK]),
            ("check: MosaicML H100 FP8 rows (Triton attention, TE linears)", [r for r in h100 if r.workload.fp8]),
            ("check: MosaicML A100 80 GB, s >= 8192",
             [r for r in a100 if r.hardware().name == "a100-80g" and r.workload.seq_length >= LONG]),
            ("check: MosaicML A100 80 GB, s < 8192",
             [r for r in a100 if r.hardware().name == "a100-80g" and r.workload.seq_length < LONG]),
            ("check: MosaicML A100 40 GB, s >= 8192",
             [r for r in a100 if r.hardware().name != "a100-80g" and r.workload.seq_length >= LONG]),
            ("check: MosaicML A100 40 GB, s < 8192",
             [r for r in a100 if r.hardware().name != "a100-80g" and r.workload.seq_length < LONG]),
            ("check: OLMo-core, fms-fsdp, float8 blog on h100-80g (FlashAttention-2)", fa2_other)]


def what_if_report() -> str:
    runs = all_published_runs()
    clock, t = fits()
    rates = " / ".join(f"{t * fa2_tflops(card, 16384):.0f} on {card.value}" for card in (GpuKind.A100_80G,
                                                                                      GpuKind.H100_80G))
    out = [f"H100_EAGER_CLOCK fitted on {len(clock_fit_rows(runs))} FlashAttention-2 rows: {H100_EAGER_CLOCK:.4f} -> "
           f"{clock:.4f}; the Triton kernel's share of FlashAttention-2's published rate, fitted on "
           f"{len(triton_fit_rows(runs))} H100 rows: {t:.4f} (at s 16384, head 128, causal: {rates} TFLOP/s; the A100 "
           f"rows planned it at FlashAttention-1's bars, {FLASH1_A100 * 312:.0f}, the H100 "
           f"rows at FlashAttention-2's x the clock, {H100_EAGER_CLOCK * fa2_tflops(GpuKind.H100_80G, 16384):.0f})"]
    for what, rows in groups(runs):
        out.append(summary([r.throughput_error(r.predict()) for r in rows]).line(f"{what}, as shipped"))
        out.append(summary([error_on(r, clock, t) for r in rows]).line(f"{what}, what-if"))
    return "\n".join(out)


def six_rows_clock_report(rounds: int = 3) -> str:
    """The other way to fit the pair: the clock on its six single-node rows (published.py's FIT rows, as shipped) and
    the Triton share on TRITON_FIT, alternately (`rounds` times; the share stays unclocked)."""
    runs = all_published_runs()
    six = [r for r in runs if is_mpt(r) and r.gpu == CARD and r.role is Role.FIT]
    clock, t = H100_EAGER_CLOCK, TRITON_SHARE_FITTED
    for _ in range(rounds):
        clock = solve(lambda c: statistics.fmean(math.log1p(error_on(r, c, t)) for r in six), 0.0, 0.4, 1.0, iters=20)
        t = fit_triton(triton_fit_rows(runs), clock)
    out = [f"the clock on its six rows, the Triton share on {len(triton_fit_rows(runs))} rows: clock {clock:.4f}, "
           f"share {t:.4f}"]
    out += [summary([error_on(r, clock, t) for r in rows]).line(what) for what, rows in groups(runs)]
    return "\n".join(out)


def joint_fits(rounds: int = 3) -> tuple[float, float]:
    """The pair with the clock fitted on the six single-node rows and CLOCK_FIT together (18 rows, mean log error 0)
    and the Triton share on TRITON_FIT, alternately: the clock's six rows keep their role and gain the 12 rows whose
    kernel has a published rate."""
    runs = all_published_runs()
    rows = [r for r in runs if is_mpt(r) and r.gpu == CARD and r.role is Role.FIT] + clock_fit_rows(runs)
    clock, t = H100_EAGER_CLOCK, TRITON_SHARE_FITTED
    for _ in range(rounds):
        clock = solve(lambda c: statistics.fmean(math.log1p(error_on(r, c, t)) for r in rows), 0.0, 0.4, 1.0, iters=20)
        t = fit_triton(triton_fit_rows(runs), clock)
    return clock, t


def joint_report() -> str:
    runs = all_published_runs()
    clock, t = joint_fits()
    out = [f"the clock on its six rows and the 12 FlashAttention-2 rows, the Triton share on "
           f"{len(triton_fit_rows(runs))} rows: clock {clock:.4f}, share {t:.4f}"]
    out += [summary([error_on(r, clock, t) for r in rows]).line(what) for what, rows in groups(runs)]
    return "\n".join(out)


def what_if_evaluate(clock: float, t: float):
    """families.plan_row's evaluate under the what-if (`device`); rows `device` leaves alone as shipped."""
    def ev(run: PublishedRun) -> Result:
        planned, hw = device(run, clock, t)
        if not (ran_triton(run) or run.gpu == CARD) or type(run).predict is not PublishedRun.predict:
            return evaluate(run)
        plan = _plan_on(planned, hw)
        return Result(run, plan.layout.short(), plan.memory_gb, planned.value(plan), planned.throughput_error(plan),
                      plan=plan)
    return ev


def with_roles(rows: list[FamilyRow], runs: list[PublishedRun]) -> list[FamilyRow]:
    """The what-if's roles: its two fit sets FIT, the six former clock rows CHECK, every other row as it was."""
    fit = {r.name for r in clock_fit_rows(runs) + triton_fit_rows(runs)}
    was_clock = {r.name for r in runs if is_mpt(r) and r.gpu == CARD and r.role is Role.FIT}
    return [replace(r, role=Role.FIT if r.name in fit else Role.CHECK if r.name in was_clock else r.role)
            for r in rows]


def families_report(joint: bool = False) -> str:
    """The families report under the what-if (`joint`: the pair of joint_fits, the six rows staying FIT)."""
    runs = all_published_runs()
    clock, t = joint_fits() if joint else fits()
    rows = all_rows(what_if_evaluate(clock, t))
    if not joint:
        return report(with_roles(rows, runs))
    fit = {r.name for r in clock_fit_rows(runs) + triton_fit_rows(runs)}
    return report([replace(r, role=Role.FIT) if r.name in fit else r for r in rows])


def main() -> None:
    if sys.argv[1:] == ["--families"]:
        print(families_report())
        return
    if sys.argv[1:] == ["--joint"]:
        print(joint_report())
        return
    if sys.argv[1:] == ["--joint-families"]:
        print(families_report(joint=True))
        return
    if sys.argv[1:] == ["--six-rows-clock"]:
        print(six_rows_clock_report())
        return
    if sys.argv[1:]:
        raise SystemExit(f"unknown arguments {sys.argv[1:]}: pass nothing, --families, --joint, --joint-families "
                         "or --six-rows-clock")
    print(what_if_report())


if __name__ == "__main__":
    main()
