"""Issue 26, round 16: the ZeRO 3 runtimes' copies on the compute stream, priced on every published ZeRO 3 row, with
the constant they move refitted -- a what-if, measured and not landed (docs/planner/rounds.md "Round 16: the ZeRO 3
runtimes' copies").

    python -m hybrid.planner.published16_zero3              # each family's error: today, with the copies, refitted
    python -m hybrid.planner.published16_zero3 --runtimes   # which runtime each published ZeRO 3 row ran, and why

The term (time.zero3_copy_bytes, Workload.zero3_runtime) prices what each runtime's code copies through HBM on the
compute stream: torch's FSDP2 (`_fsdp_collectives.py`, torch 2.13) copies every gathered parameter out of the
all-gather buffer at each unshard and every gradient into the reduce-scatter input; FSDP1 and Megatron-FSDP gather
and reduce in place; this runtime (hybrid/zero) gathers in place and copies each gradient into its unit's buffer.
The one fitted constant whose fit row changes is H100_500W_CLOCK: its row, torchtitan's Table 1, is FSDP2 (eager,
8 GPUs), so with the copies priced the row falls 1.6 % short and the clock refits 0.988 -> 1.010 (0.982 -> 1.003
since round 19's GEMM ceiling; above 1: the 500 W card faster than the 700 W one the PyTorch stack clock was fitted on;
0.978 -> 1.000 since round 20's selective-op early stop, at the bracket's edge). The other three fits are untouched:
H100_EAGER_CLOCK's six MPT rows run FSDP1 (no copies), KERNEL_OVERHEAD_S's H200 run and A100_EFFICIENCY's
Korthikanti row have no ZeRO 3. Landing rule (the round's brief): the check rows improve overall and no family gets
worse beyond noise. They do not (the report's summary lines): the model's default prices no copies
(Workload.zero3_runtime None); `--zero3-runtime` prices them on request.

How each published ZeRO 3 row's runtime was read (RUNTIMES, in order; the first prefix that matches):
* torchtitan (every table): FSDP2 -- torchtitan applies `fully_shard` (torch.distributed.fsdp, per block and the
  root) in its parallelize_llama since its 2024 release; its performance docs and paper name FSDP2.
* KempnerForge: FSDP2 -- kempnerforge/distributed/parallel.py at 01b461a, `fully_shard` per block and the root
  (round 15 read it; published15.py's docstring).
* OLMo-core: FSDP2 -- its README's throughput table is for its FSDP2 scripts (published.OLMO_CORE_SOURCE).
* float8 blog: FSDP2 -- "Supercharging Training using float8 and FSDP2" (torchtitan; published.FLOAT8_BLOG_SOURCE).
* MPT (Composer / llm-foundry): FSDP1 -- Composer wraps the model in torch's FullyShardedDataParallel.
* fms-fsdp: FSDP1 -- IBM's fms-fsdp wraps in FullyShardedDataParallel (HSDP), as its blog says ("PyTorch FSDP").
* NeMo / Megatron-Bridge (the Llama 3 8B FSDP rows): MEGATRON_FSDP -- Megatron-core's FSDP, whose README says
  "Zero copy communication is achieved by reorganizing the storage of parameters and main grad with
  ParamAndGradBuffer" (NVIDIA/Megatron-LM megatron/core/distributed/fsdp/src/README.md).
No published row runs this runtime's ZeRO 3 or DeepSpeed's.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, fields, replace
from functools import lru_cache

from hybrid.planner.layout import Zero3Runtime, ZeroStage
from hybrid.planner.published import PublishedRun, Role, all_runs
from hybrid.planner.published_more import Result, evaluate

# (name prefix, runtime, where it was read): the module docstring says more
RUNTIMES = (("torchtitan", Zero3Runtime.FSDP2, "torchtitan's parallelize: fully_shard (FSDP2)"),
            ("KempnerForge", Zero3Runtime.FSDP2, "kempnerforge/distributed/parallel.py at 01b461a: fully_shard"),
            ("OLMo-core", Zero3Runtime.FSDP2, "OLMo-core's FSDP2 scripts (README throughput table)"),
            ("float8 blog", Zero3Runtime.FSDP2, "pytorch.org 'float8 and FSDP2' (torchtitan)"),
            ("MPT-", Zero3Runtime.FSDP1, "Composer: FullyShardedDataParallel"),
            ("fms-fsdp", Zero3Runtime.FSDP1, "fms-fsdp: FullyShardedDataParallel (HSDP)"),
            ("NeMo", Zero3Runtime.MEGATRON_FSDP, "Megatron-FSDP: ParamAndGradBuffer, zero copy"),
            ("Megatron-Bridge", Zero3Runtime.MEGATRON_FSDP, "Megatron-FSDP: ParamAndGradBuffer, zero copy"))
FIT_500W_CLOCK_HI = 1.05  # the refit's bracket: fit.py's [0.3, 1.0] holds no solution once the copies are priced


def runtime_of(run: PublishedRun) -> tuple[Zero3Runtime, str] | None:
    """The ZeRO 3 runtime `run` ran and where that was read (RUNTIMES), or None when its source names none."""
    for prefix, runtime, why in RUNTIMES:
        if run.name.startswith(prefix):
            return runtime, why
    return None


def with_copies(run: PublishedRun) -> PublishedRun:
    """`run` with its ZeRO 3 runtime's copies priced (Workload.zero3_runtime set; unchanged when none is known)."""
    found = runtime_of(run)
    return run if found is None else replace(run, workload=replace(run.workload, zero3_runtime=found[0]))


def reclocked(run: PublishedRun, clock: float) -> PublishedRun:
    """`run` planned with H100_500W_CLOCK = `clock` where it runs on the 500 W H100 (fit.h100_500w's overrides on the
    row's own hardware), else `run` itself."""
    if run.gpu != "h100-96g-500w":
        return run
    from hybrid.planner.hardware import H100_EAGER_CLOCK, H100_EFFICIENCY, HOPPER_FLASH
    hw = run.hardware().with_overrides(compute_efficiency=H100_EFFICIENCY * clock,
                                       flash_efficiency=HOPPER_FLASH * clock, eager_clock=H100_EAGER_CLOCK)
    cls = type(run)
    on = type(f"Reclocked{cls.__name__}", (cls,), {"hardware": lambda self: hw})
    return on(**{f.name: getattr(run, f.name) for f in fields(run)})


@lru_cache(maxsize=1)
def refit_500w_clock() -> float:
    """H100_500W_CLOCK refitted with the copies priced: the clock at which torchtitan's Table 1 (its FIT row, FSDP2)
    plans at its published 5,762 tokens/s a GPU (fit.fit_h100_500w_clock's fit, bracket [0.3, FIT_500W_CLOCK_HI])."""
    from hybrid.planner.fit import TORCHTITAN_TABLE1_TOKENS_PER_GPU, solve
    from hybrid.planner.published import torchtitan_runs
    row = with_copies(next(r for r in torchtitan_runs() if r.role is Role.FIT))
    return solve(lambda c: reclocked(row, c).value(reclocked(row, c).predict()), TORCHTITAN_TABLE1_TOKENS_PER_GPU,
                 0.3, FIT_500W_CLOCK_HI)


@dataclass(frozen=True)
class WhatIf:
    """One row: its error today, with its runtime's copies priced, and with them and the refitted 500 W clock."""

    today: Result
    copies: Result
    refit: Result
    share: float  # the copies' share of the priced step (0 where none)


def what_if(run: PublishedRun, clock: float) -> WhatIf:
    today = evaluate(run)
    priced = with_copies(run)
    if priced is run or today.plan is None or not _copies_apply(today):
        return WhatIf(today, today, evaluate(reclocked(run, clock)) if run.gpu == "h100-96g-500w" else today, 0.0)
    copies = evaluate(priced)
    refit = evaluate(reclocked(priced, clock)) if run.gpu == "h100-96g-500w" else copies
    return WhatIf(today, copies, refit, _base(copies.plan).time.term("zero3_copies") / _total(copies.plan))


def _base(plan):
    """The step_time plan inside `plan`: itself, or a context-parallel plan's reduced problem (context.ContextPlan.base:
    its layout's dp is dp x cp, FSDP's shard group)."""
    return getattr(plan, "base", plan)


def _total(plan) -> float:
    return plan.total_s if hasattr(plan, "total_s") else plan.time.total


def _copies_apply(result: Result) -> bool:
    """Could a runtime's copies reach this plan (ZeRO 3 over dp > 1; a CP plan's reduced layout likewise)?"""
    lay = getattr(_base(result.plan), "layout", None)
    return lay is not None and lay.zero is ZeroStage.PARAMETERS and lay.dp > 1


def families() -> list[tuple[str, list[PublishedRun]]]:
    """Every table the copies or the refit can move: round 15's PyTorch-native family (published15.FAMILIES), and
    the Megatron-FSDP rows (NeMo, Megatron-Bridge: in place, so unchanged -- listed to show it)."""
    from hybrid.planner.published14 import bridge_runs
    from hybrid.planner.published15 import FAMILIES
    out = [(f.name, f.runs()) for f in FAMILIES]
    out.append(("NeMo / Megatron-Bridge Megatron-FSDP rows", [r for r in all_runs() + bridge_runs()
                                                              if r.name.startswith(("NeMo", "Megatron-Bridge"))
                                                              and "FSDP" in r.name]))
    return out


def _stats(errors: list[float]) -> str:
    if not errors:
        return "no rows"
    return (f"{len(errors)} rows, signed mean {100 * statistics.fmean(errors):+.1f} %, median |error| "
            f"{100 * statistics.median(abs(e) for e in errors):.1f} %, spread {100 * min(errors):+.1f} % to "
            f"{100 * max(errors):+.1f} %, {sum(abs(e) <= 0.15 for e in errors)} within 15 %")


def report(rows: dict[str, list[WhatIf]], clock: float) -> str:
    from hybrid.planner.hardware import H100_500W_CLOCK
    lines = [f"H100_500W_CLOCK: ships {H100_500W_CLOCK:.3f}; refitted with the copies priced {clock:.3f} "
             f"(torchtitan Table 1, FSDP2, 5,762 tokens/s a GPU)"]
    every: dict[str, list[float]] = {"today": [], "copies": [], "refit": []}
    for name, whatifs in rows.items():
        for role in (Role.CHECK, Role.FIT):
            sel = [w for w in whatifs if w.today.run.role is role and w.today.error is not None]
            if not sel:
                continue
            tag = "check" if role is Role.CHECK else "FIT"
            for label, key in (("today", "today"), ("with the copies", "copies"),
                               ("with the copies, H100_500W_CLOCK refitted", "refit")):
                errors = [getattr(w, key).error for w in sel]
                lines.append(f"{name} [{tag}], {label}: {_stats(errors)}")
                if role is Role.CHECK:
                    every[key] += errors
    for label, key in (("today", "today"), ("with the copies", "copies"),
                       ("with the copies, H100_500W_CLOCK refitted", "refit")):
        lines.append(f"all these check rows, {label}: {_stats(every[key])}")
    return "\n".join(lines)


def row_table(rows: dict[str, list[WhatIf]]) -> str:
    """The rows the copies reach (a runtime that copies, ZeRO 3 over dp > 1)."""
    lines = ["| row | runtime | copies % of the step | error today | with the copies | refitted 500 W clock |",
             "|---|---|---|---|---|---|"]
    lines += [row_line(w) for whatifs in rows.values() for w in whatifs if w.share != 0.0]
    return "\n".join(lines)


def row_line(w: WhatIf) -> str:
    runtime = runtime_of(w.today.run)[0].value
    return (f"| {w.today.run.name} | {runtime} | {100 * w.share:.1f} | {100 * w.today.error:+.1f} % | "
            f"{100 * w.copies.error:+.1f} % | {100 * w.refit.error:+.1f} % |")


def runtimes_table() -> str:
    """Each published ZeRO 3 row's runtime (RUNTIMES) by table."""
    lines = ["| table | rows | runtime | read from |", "|---|---|---|---|"]
    for name, runs in families():
        kinds: dict[tuple, int] = {}
        for r in runs:
            found = runtime_of(r)
            key = ("(none named)", "-") if found is None else (found[0].value, found[1])
            kinds[key] = kinds.get(key, 0) + 1
        for (runtime, why), n in kinds.items():
            lines.append(f"| {name} | {n} | {runtime} | {why} |")
    return "\n".join(lines)


def evaluate_all() -> tuple[dict[str, list[WhatIf]], float]:
    clock = refit_500w_clock()
    return {name: [what_if(r, clock) for r in runs] for name, runs in families()}, clock


def main() -> None:
    if sys.argv[1:] == ["--runtimes"]:
        print(runtimes_table())
        return
    rows, clock = evaluate_all()
    print(row_table(rows) + "\n\n" + report(rows, clock))


if __name__ == "__main__":
    main()
