"""Held-out validation: every row the planner's time model is compared with, each a FIT or a CHECK row, in one
table, and the error on the check rows reported apart from the fit rows'.

    python -m hybrid.planner.heldout        # prints docs/planner/validation.md "Held-out error" (tests/test_planner_published.py checks)

Issue 26's rule is "fit on some rows, check on others". A FIT row set one constant of the model and names it
(`Row.fits`; hybrid/planner/fit.py re-derives each constant from its row -- or rows: the H100's eager clock is
fitted on six rows of one table); a CHECK row set nothing. Five sources:

* published runs outside shared/reference (published.py: BLOOM, Llama 3 405B, Korthikanti 2022, MT-NLG, torchtitan,
  NeMo, MosaicML's MPT): FIT rows for A100_EFFICIENCY, H100_500W_CLOCK and (six) H100_EAGER_CLOCK, the rest
  CHECK;
* shared/reference: Narayanan et al. 2021 Table 1 (reference.py), each published layout, all CHECK;
* our H200 (tests/data/gpu_h200, scripts/gpu_check.py, 2026-12-04): run 3's forward + backward FITs
  KERNEL_OVERHEAD_S; train.py's steps of run 2 CHECK -- but the no-recomputation step has the fit row's forward +
  backward inside it, so it checks the optimizer only, and the selective one adds only the attention rerun;
* this CPU (docs/results/bench_planner_ranking.md, 2 gloo ranks, 2026-12-03): 17 layouts, each predicted with a
  `hybrid calibrate` profile measured seconds before (its layer rate and per-pass cost fitted on calibrate's own
  probe layers, LAYER_SHAPES, no layout of the benchmark); the predictions are the ones that run recorded (the
  profile was not kept), read from the results file, not recomputed;
* this CPU's main job (docs/results/step_split.md, 2026-12-03, commit 60afcad): the README's tp 2 x pp 2 x dp 2 on 8
  gloo ranks sharing 2 cores, the prediction train.py printed at its start (with an 8-rank profile measured
  seconds before) against the median of its logged intervals; recorded, as the ranking run's.

Whole-step rows make the summary. Parts of a step (one layer, the optimizer step) are listed with their errors
but kept out of it: a layer the host cannot launch fast enough to keep the GPU busy is a real miss, not a step.

Error is throughput: predicted / measured throughput - 1 (for seconds, measured / predicted - 1), positive when the
planner is optimistic.
"""

from __future__ import annotations

import enum
import json
import re
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from hybrid.planner.published import Role

ROOT = Path(__file__).resolve().parents[2]
H200_RUNS = ROOT / "tests" / "data" / "gpu_h200"
CPU_RANKING = ROOT / "docs" / "results" / "bench_planner_ranking.md"
CPU_MAIN_JOB = ROOT / "docs" / "results" / "step_split.md"

PUBLISHED = "published runs (published.py)"
NARAYANAN = "shared/reference: Narayanan 2021 Table 1"
H200 = "our H200 (tests/data/gpu_h200)"
CPU = "this CPU, 2 gloo ranks (bench_planner_ranking.md)"
MAIN_JOB = "this CPU, the main job: 8 gloo ranks on 2 cores (step_split.md)"
SOURCES = (PUBLISHED, NARAYANAN, H200, CPU, MAIN_JOB)


class Kind(enum.Enum):
    """A whole training step (what a user plans), or a part of one (a layer, the optimizer step)."""

    STEP = "step"
    PART = "part"


@dataclass(frozen=True)
class Row:
    """One comparison of a prediction with a measurement.

    Attributes:
        source: one of SOURCES.
        name: the run, as its source names it.
        role: FIT (it set the constant `fits`) or CHECK (it set nothing).
        fits: the constant a FIT row set, "" for a CHECK row.
        unit: what `predicted` and `measured` are.
        predicted, measured: in `unit`.
        error: predicted / measured throughput - 1 (+: the planner is optimistic).
        kind: a whole step, or a part of one (kept out of the summary).
    """

    source: str
    name: str
    role: Role
    fits: str
    unit: str
    predicted: float
    measured: float
    error: float
    kind: Kind = Kind.STEP


def seconds_error(predicted: float, measured: float) -> float:
    """Throughput error of a time: measured / predicted - 1."""
    return measured / predicted - 1


def published_rows(check: Callable | None = None) -> list[Row]:
    """published.py's runs; `check(run) -> (plan, value, error)` (published.check by default, a cache in tests)."""
    from hybrid.planner import published
    check = check or published.check
    rows = []
    for run in published.all_runs():
        _, value, error = check(run)
        rows.append(Row(PUBLISHED, run.name, run.role, run.fits, run.metric.value, value, run.published, error))
    return rows


def narayanan_rows() -> list[Row]:
    """Each Table 1 row's published layout (b and v picked by the planner), TFLOP/s per GPU by eq. (3)."""
    from hybrid.planner.reference import megatron_rows, predict_published
    rows = []
    for r in megatron_rows():
        got = predict_published(r).tflops_per_gpu
        rows.append(Row(NARAYANAN, f"{r.params_billion:g}B, {r.gpus} A100, t{r.tp} p{r.pp} d{r.dp}", Role.CHECK, "",
                        "TFLOP/s per GPU", got, r.tflops_per_gpu, got / r.tflops_per_gpu - 1))
    return rows


def _h200(name: str) -> dict:
    with open(H200_RUNS / name) as f:
        return json.load(f)["sections"]


def h200_rows() -> list[Row]:
    """Our H200: the fit row (run 3's forward + backward), train.py's steps (run 2: no recomputation, selective,
    torch.compile'd blocks as the FUSED kernel profile), and parts: run 3's optimizer step, calibrate's probe
    layers (run 2)."""
    from hybrid.planner import fit
    from hybrid.planner.calibrate import GPU_PROBE, planned_layer_seconds
    from hybrid.planner.hardware import hardware
    from hybrid.planner.layout import Cluster, Layout, Recompute
    from hybrid.planner.ops import KernelProfile
    from hybrid.planner.search import evaluate
    hw, work = hardware("h200"), fit.h200_llama_workload()
    llama = "1.2B Llama, s 4096, 8 micro-batches"
    run3 = _h200("run3_8d2f7a7.json")["breakdown"]["result"]["measured"]["seconds_by_phase"]
    speed = _h200("run2_dcd63a0.json")["speed"]["result"]
    fb = fit.h200_forward_backward(hw)
    rows = [Row(H200, f"{llama}: forward + backward (run 3)", Role.FIT, "KERNEL_OVERHEAD_S (fit.fit_kernel_overhead)",
                "s", fb, run3["forward_backward"]["median"], seconds_error(fb, run3["forward_backward"]["median"]))]
    steps = (("no recomputation", "train_py_recompute_none", Recompute.NONE, work),
             ("selective recomputation", "train_py_recompute_selective", Recompute.SELECTIVE, work),
             ("torch.compile'd blocks (fused profile)", "train_py_compile", Recompute.NONE,
              replace(work, kernels=KernelProfile.FUSED)))
    for what, key, recompute, w in steps:
        got = evaluate(w, Cluster(gpus=1, hw=hw), Layout(micro_batch=1, recompute=recompute)).time.total
        measured = speed[key]["step_s"]["median"]
        rows.append(Row(H200, f"{llama}: train.py step, {what} (run 2)", Role.CHECK, "", "s", got, measured,
                        seconds_error(got, measured)))
    optimizer = evaluate(work, Cluster(gpus=1, hw=hw), Layout(micro_batch=1)).time.optimizer
    measured = run3["optimizer_step"]["median"]
    rows.append(Row(H200, f"{llama}: optimizer step (run 3)", Role.CHECK, "", "s", optimizer, measured,
                    seconds_error(optimizer, measured), Kind.PART))
    probe = _h200("run2_dcd63a0.json")["calibrate"]["result"]["profile"]["measured"]
    if [tuple(x) for x in probe["layer_shapes_b_s_h_heads"]] != list(GPU_PROBE.shapes):
        raise ValueError("calibrate.GPU_PROBE's shapes are not the ones run 2 measured: plan those shapes here")
    for shape, (f_s, b_s), (got_f, got_b) in zip(GPU_PROBE.shapes, probe["layer_forward_backward_seconds"],
                                                 planned_layer_seconds(hw, GPU_PROBE)):
        b, s, h, a = shape
        for what, got, measured in (("forward", got_f, f_s), ("backward", got_b, b_s)):
            rows.append(Row(H200, f"GPT-2 layer b {b} s {s} h {h} a {a}, bf16: {what} (calibrate probe, run 2)",
                            Role.CHECK, "", "s", got, measured, seconds_error(got, measured), Kind.PART))
    return rows


CPU_ROW = re.compile(r"^\| (tp\d+ pp\d+ dp\d+ b\d+[^|]*?) \| ([0-9.]+) \| ([0-9.]+) \|")


def cpu_rows(path: Path = CPU_RANKING) -> list[Row]:
    """The 17 layouts of the latest bench_planner_ranking run: its recorded prediction and measured median."""
    rows = []
    for line in path.read_text().splitlines():
        m = CPU_ROW.match(line)
        if m:
            got, measured = float(m.group(2)), float(m.group(3))
            rows.append(Row(CPU, f"GPT-2 4.2M, {m.group(1)}", Role.CHECK, "", "s (recorded)", got, measured,
                            seconds_error(got, measured)))
    return rows


MAIN_JOB_PLANNED = re.compile(r"^\| planner \(printed at the start\) \| ([0-9.]+) \|", re.M)
MAIN_JOB_MEASURED = re.compile(r"^\| measured, iterations \d+-\d+ \| ([0-9.]+) \|", re.M)


def main_job_rows(path: Path = CPU_MAIN_JOB) -> list[Row]:
    """The main job's recorded prediction against the median of its measured intervals."""
    text = path.read_text()
    got = float(MAIN_JOB_PLANNED.search(text).group(1))
    measured = statistics.median(float(x) for x in MAIN_JOB_MEASURED.findall(text))
    return [Row(MAIN_JOB, "tiny-gpt2, tp2 pp2 dp2 b2, 8 ranks", Role.CHECK, "", "s (recorded)", got, measured,
                seconds_error(got, measured))]


def all_rows(check: Callable | None = None) -> list[Row]:
    return published_rows(check) + narayanan_rows() + h200_rows() + cpu_rows() + main_job_rows()


def _stats(errors: list[float], averaged: bool = True) -> str:
    """signed mean | median |error| | spread | rows low / high | within 15 % (no mean or median of unlike parts)."""
    if not errors:
        return "- | - | - | - | -"
    within = sum(abs(e) <= 0.15 for e in errors)
    lean = f"{sum(e < 0 for e in errors)} / {sum(e > 0 for e in errors)}"
    centre = (f"{100 * statistics.fmean(errors):+.1f} % | {100 * statistics.median(abs(e) for e in errors):.1f} %"
              if averaged else "- | -")
    return (f"{centre} | {100 * min(errors):+.1f} % to {100 * max(errors):+.1f} % | {lean} | "
            f"{within} of {len(errors)}")


def summary_table(rows: list[Row]) -> str:
    """Per source and over all sources: the fit rows, and the check rows' signed mean error, median |error|,
    spread, how many err low (pessimistic) and high (optimistic), and how many are within ±15 % (whole steps;
    parts apart)."""
    lines = ["| source | fit rows (constant) | check rows | signed mean | median abs. error | spread | low / high | "
             "within ±15 % |", "|---|---|---|---|---|---|---|---|"]
    groups = [(s, [r for r in rows if r.source == s and r.kind is Kind.STEP]) for s in SOURCES]
    groups.append(("**all check rows (whole steps)**", [r for r in rows if r.kind is Kind.STEP]))
    groups.append(("parts of a step (not in the line above; rows below)", [r for r in rows if r.kind is Kind.PART]))
    for name, group in groups:
        fits = [r.fits.split(" ")[0] for r in group if r.role is Role.FIT]
        named = [c + (f" x {fits.count(c)}" if fits.count(c) > 1 else "") for c in dict.fromkeys(fits)]
        checks = [r.error for r in group if r.role is Role.CHECK]
        steps = all(r.kind is Kind.STEP for r in group)
        lines.append(f"| {name} | {len(fits)}{' (' + ', '.join(named) + ')' if fits else ''} | {len(checks)} | "
                     f"{_stats(checks, averaged=steps)} |")
    return "\n".join(lines)


def _shown(value: float, unit: str) -> str:
    return f"{value * 1e3:.3f} ms" if unit == "s" and value < 0.01 else f"{value:.3f}"


def detail_table(rows: list[Row], source: str = H200) -> str:
    """The rows of one source, one line each (published.py and reference.py print their own)."""
    lines = ["| row | role | kind | predicted | measured | error |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r.source == source:
            role = f"fit: {r.fits.split(' ')[0]}" if r.role is Role.FIT else "check"
            lines.append(f"| {r.name} | {role} | {r.kind.value} | {_shown(r.predicted, r.unit)} | "
                         f"{_shown(r.measured, r.unit)} | {100 * r.error:+.1f} % |")
    return "\n".join(lines)


def fitted_constants(rows: list[Row]) -> dict[str, str]:
    """constant -> the row(s) that fitted it ("; " between rows)."""
    out: dict[str, list[str]] = {}
    for r in rows:
        if r.role is Role.FIT:
            out.setdefault(r.fits.split(" ")[0], []).append(f"{r.source}: {r.name}")
    return {constant: "; ".join(names) for constant, names in out.items()}


def main() -> None:
    rows = all_rows()
    print(summary_table(rows))
    print()
    print(detail_table(rows))


if __name__ == "__main__":
    main()
