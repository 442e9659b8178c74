"""The planner's error on every published row the repository holds, by family (the runtime that ran it) and card,
and on the slices issue 26's held-out set is drawn from (issue 26, round 16).

    python -m hybrid.planner.families           # docs/planner/rounds.md "Round 16: held-out families"

Issue 26's acceptance is judged on published runs the repository has not seen: "Megatron / DeepSpeed pipelines at
2,000-3,400 GPUs and FSDP runs at 8-64 GPUs, A100 and H100, 2-, 3- and 4-way layouts". This module gathers every
published row of every table module (published.py, published_more.py, published_recipes.py, published14.py,
published15.py, published16.py) and shared/reference's Narayanan 2021 Table 1, plans each with the model as it
stands, and reports the CHECK rows' error apart from the FIT rows' per family x card and per slice: signed mean,
median |error|, spread, how many within +-15 %, and how many published layouts the planner rejects as not fitting
(a rejected row has no error; it counts against "the published layouts that ran are predicted to fit").

A row's family is read from its source (FAMILY_OF_SOURCE: the first source prefix that matches), never from its
error; its layout from its plan (or, for a rejected row, the layout the row states). Error is throughput,
predicted / published - 1 (for a step time published / predicted - 1): positive when the planner is optimistic.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Callable, Iterable

from hybrid.planner.published import PublishedRun, Role, summary

# (source prefix, family), first match wins; every source of every table module must match one
# (tests/test_planner16_families.py)
FAMILY_OF_SOURCE = (
    ("Narayanan et al. 2021", "Megatron-LM (Narayanan 2021, Korthikanti 2022)"),
    ("shared/reference", "Megatron-LM (Narayanan 2021, Korthikanti 2022)"),
    ("Korthikanti et al. 2022", "Megatron-LM (Narayanan 2021, Korthikanti 2022)"),
    ("NVIDIA/Megatron-LM README", "Megatron-Core (README weak scaling)"),
    ("bigscience-workshop", "Megatron-DeepSpeed / DeepSpeed pipeline (BLOOM, MT-NLG)"),
    ("Smith et al. 2022", "Megatron-DeepSpeed / DeepSpeed pipeline (BLOOM, MT-NLG)"),
    ("Llama 3 Herd", "Meta's Llama 3 stack"),
    ("Nemotron-4 340B Technical Report", "NeMo / Megatron-Bridge / DGXC recipes (Megatron-Core + TE)"),
    ("NVIDIA/NeMo", "NeMo / Megatron-Bridge / DGXC recipes (Megatron-Core + TE)"),
    ("NVIDIA-NeMo/Megatron-Bridge", "NeMo / Megatron-Bridge / DGXC recipes (Megatron-Core + TE)"),
    ("NVIDIA/dgxc-benchmarking", "NeMo / Megatron-Bridge / DGXC recipes (Megatron-Core + TE)"),
    ("mosaicml/llm-foundry", "MosaicML llm-foundry (Composer, FSDP1)"),
    ("pytorch.org blog 2024-03-13", "IBM fms-fsdp (FSDP1)"),
    ("foundation-model-stack/fms-fsdp", "IBM fms-fsdp (FSDP1)"),
    ("pytorch/torchtitan", "torchtitan (FSDP2, DTensor TP / PP)"),
    ("pytorch.org blog 2024-11-25", "torchtitan (FSDP2, DTensor TP / PP)"),
    ("allenai/OLMo-core", "OLMo-core (FSDP2)"),
    ("KempnerInstitute/KempnerForge", "KempnerForge (FSDP2, DTensor TP)"),
    # round 21 (planner21b): sources no earlier module read (published21_newsources.NEW_FAMILIES, the same prefixes)
    ("Megatron-LM README.md 'GPT-3 Example'", "Megatron-LM (Narayanan 2021, Korthikanti 2022)"),
    ("GPT-NeoX-20B (Black et al. 2022", "Megatron-DeepSpeed fork: GPT-NeoX (EleutherAI, DeepSpeed pipeline)"),
    ("NeMo-Framework-Launcher (NVIDIA", "NeMo Megatron 22.06 / 22.08 (apex, Megatron-LM 2022 code)"),
    ("Dao-AILab/flash-attention", "flash-attn training scripts (Lightning DDP / ZeRO 1, fused kernels)"),
    ("jzhang38/TinyLlama", "TinyLlama / lit-gpt (Lightning Fabric FSDP)"),
    # round 22 (planner22): MLPerf Training's GPT-3 175B submissions (published22_mlperf.MLPERF_SOURCE)
    ("mlcommons/training_results_v", "MLPerf Training GPT-3 (NeMo / Megatron)"),
)

CARDS = {"a100-80g": "A100", "a100-40g": "A100 40GB", "h100-80g": "H100", "h100-96g-500w": "H100", "h200": "H200"}
BAND = 0.15  # issue 26's acceptance band


def family_of(source: str) -> str:
    """The family a row belongs to, read from its source."""
    for prefix, family in FAMILY_OF_SOURCE:
        if source.startswith(prefix):
            return family
    raise ValueError(f"no family for the source {source!r}: add its prefix to families.FAMILY_OF_SOURCE")


@dataclass(frozen=True)
class FamilyRow:
    """One published row, planned.

    Attributes:
        name: the row, as its module names it.
        family: family_of(its source).
        card: A100 (80 GB), A100 40GB, H100 or H200.
        gpus: how many.
        tp, pp, cp: the layout's tensor-, pipeline- and context-parallel sizes (the plan's; the stated ones when
            the planner rejects the layout).
        dp: the data-parallel size, gpus / (tp pp cp).
        zero: the ZeRO stage (3 = FSDP / ZeRO 3).
        role: FIT or CHECK.
        error: predicted / published throughput - 1, None when rejected.
        rejected: why the planner rejects the published layout ("" when it fits).
        seq: the sequence length.
        fp8: does the row train with FP8 GEMMs?
    """

    name: str
    family: str
    card: str
    gpus: int
    tp: int
    pp: int
    cp: int
    dp: int
    zero: int
    role: Role
    error: float | None
    rejected: str = ""
    seq: int = 0
    fp8: bool = False

    @property
    def ways(self) -> int:
        """How many of tp, pp, dp, cp are above 1 (a "2-, 3- or 4-way layout")."""
        return sum(x > 1 for x in (self.tp, self.pp, self.dp, self.cp))


def _only(values: tuple, what: str, name: str) -> int:
    if len(values) != 1:
        raise ValueError(f"{name}: the row states no single {what} ({values}); its layout comes from its plan")
    return int(values[0])


def plan_row(run: PublishedRun, evaluate: Callable | None = None) -> FamilyRow:
    """Plan one published run (published_more.evaluate by default; a cache in tests)."""
    from hybrid.planner.published_more import evaluate as default_evaluate
    result = (evaluate or default_evaluate)(run)
    cp = getattr(run, "cp", 1)
    if result.plan is not None:
        layout = result.plan.layout
        tp, pp, zero = layout.tp, layout.pp, int(layout.zero)
    else:
        tp, pp = _only(run.space.tp, "tp", run.name), _only(run.space.pp, "pp", run.name)
        zero = int(run.space.zero[0]) if run.space.zero and len(run.space.zero) == 1 else -1
    return FamilyRow(run.name, family_of(run.source), CARDS[run.hardware().name], run.gpus, tp, pp, cp,
                     run.gpus // (tp * pp * cp), zero, run.role, result.error, result.rejected,
                     run.workload.seq_length, run.workload.fp8)


def narayanan_reference_rows() -> list[FamilyRow]:
    """shared/reference's Narayanan 2021 Table 1 rows (reference.py), planned as heldout.py plans them."""
    from hybrid.planner.reference import megatron_rows, predict_published
    rows = []
    for r in megatron_rows():
        plan = predict_published(r)
        rows.append(FamilyRow(f"{r.params_billion:g}B, {r.gpus} A100, t{r.tp} p{r.pp} d{r.dp} (shared/reference)",
                              family_of("shared/reference"), CARDS[r.gpu], r.gpus, r.tp, r.pp, 1, r.dp,
                              int(plan.layout.zero), Role.CHECK, plan.tflops_per_gpu / r.tflops_per_gpu - 1, "",
                              r.seq))
    return rows


def all_published_runs() -> list[PublishedRun]:
    """Every published run of every table module (shared/reference's rows apart: narayanan_reference_rows)."""
    from hybrid.planner import published, published14, published15, published16, published_more, published_recipes
    from hybrid.planner import published21_newsources, published22_mlperf
    return (published.all_runs() + published_more.more_runs() + published_recipes.recipe_runs()
            + published14.runs14() + published15.runs15() + published16.runs16()
            + published21_newsources.runs21_newsources() + published22_mlperf.mlperf_runs())


def all_rows(evaluate: Callable | None = None) -> list[FamilyRow]:
    return [plan_row(run, evaluate) for run in all_published_runs()] + narayanan_reference_rows()


# ---- the report ----------------------------------------------------------------------------------------------------

def stats(rows: Iterable[FamilyRow]) -> str:
    """One table line's cells for the CHECK rows among `rows`: check rows | fit rows | signed mean | median |error|
    | spread | within 15 % | rejected."""
    rows = list(rows)
    checks = [r for r in rows if r.role is Role.CHECK]
    errors = [r.error for r in checks if r.error is not None]
    fits = sum(r.role is Role.FIT for r in rows)
    rejected = sum(r.error is None for r in checks)
    if not errors:
        return f"{len(checks)} | {fits} | - | - | - | - | {rejected}"
    s = summary(errors)  # published.py's statistics (its band is BAND)
    return (f"{len(checks)} | {fits} | {100 * s.signed_mean:+.1f} % | {100 * s.median_abs:.1f} % | "
            f"{100 * s.low:+.1f} % to {100 * s.high:+.1f} % | {s.within_15} of {s.rows} | {rejected}")


HEADER = ("| rows | check rows | fit rows | signed mean | median abs. error | spread | within ±15 % | rejected |\n"
          "|---|---|---|---|---|---|---|---|")

# issue 26's held-out kinds, as predicates on a row
PIPELINE_FAMILIES = ("Megatron", "NeMo", "Meta", "MLPerf")  # MLPerf's GPT-3 rows are NeMo pipelines (round 22)


def _pipeline_at_scale(r: FamilyRow, low: int, high: int) -> bool:
    return r.pp > 1 and low <= r.gpus <= high and r.family.startswith(PIPELINE_FAMILIES)


def _fsdp(r: FamilyRow, low: int, high: int) -> bool:
    return r.zero == 3 and r.pp == 1 and low <= r.gpus <= high


SLICES: tuple[tuple[str, Callable[[FamilyRow], bool]], ...] = (
    ("Megatron / DeepSpeed / NeMo pipelines at 2,000-3,400 GPUs", lambda r: _pipeline_at_scale(r, 2000, 3400)),
    ("Megatron / DeepSpeed / NeMo pipelines at 1,000+ GPUs", lambda r: _pipeline_at_scale(r, 1000, 10 ** 6)),
    ("Megatron / DeepSpeed / NeMo pipelines, any size", lambda r: _pipeline_at_scale(r, 1, 10 ** 6)),
    ("FSDP (ZeRO 3) at 8-64 GPUs, no TP, A100 (80 and 40 GB)",
     lambda r: _fsdp(r, 8, 64) and r.tp == 1 and r.card.startswith("A100")),
    ("FSDP (ZeRO 3) at 8-64 GPUs, no TP, H100", lambda r: _fsdp(r, 8, 64) and r.tp == 1 and r.card == "H100"),
    ("... of which bf16 at s <= 4096", lambda r: _fsdp(r, 8, 64) and r.tp == 1 and r.card == "H100" and not r.fp8
     and r.seq <= 4096),
    ("... of which FP8 or s > 4096", lambda r: _fsdp(r, 8, 64) and r.tp == 1 and r.card == "H100" and (r.fp8
     or r.seq > 4096)),
    ("FSDP (ZeRO 3) at 8-64 GPUs, no TP, H200", lambda r: _fsdp(r, 8, 64) and r.tp == 1 and r.card == "H200"),
    ("FSDP (ZeRO 3) at 8-64 GPUs with TP (any card)", lambda r: _fsdp(r, 8, 64) and r.tp > 1),
    ("2-way layouts, A100 / H100", lambda r: r.ways == 2 and r.card != "H200"),
    ("3-way layouts, A100 / H100", lambda r: r.ways == 3 and r.card != "H200"),
    ("4-way layouts, A100 / H100", lambda r: r.ways == 4 and r.card != "H200"),
)


def family_table(rows: list[FamilyRow]) -> str:
    """One line per family x card, then the family over its cards, then all rows."""
    lines = [HEADER.replace("| rows |", "| family | card |").replace("|---|", "|---|---|", 1)]
    for family in dict.fromkeys(f for _, f in FAMILY_OF_SOURCE):
        mine = [r for r in rows if r.family == family]
        cards = [c for c in ("A100", "A100 40GB", "H100", "H200") if any(r.card == c for r in mine)]
        for card in cards:
            lines.append(f"| {family} | {card} | {stats(r for r in mine if r.card == card)} |")
        if len(cards) > 1:
            lines.append(f"| {family} | all | {stats(mine)} |")
    lines.append(f"| **all families** | all | {stats(rows)} |")
    return "\n".join(lines)


def slice_table(rows: list[FamilyRow]) -> str:
    lines = [HEADER.replace("| rows |", "| held-out kind |")]
    lines += [f"| {name} | {stats(r for r in rows if keep(r))} |" for name, keep in SLICES]
    return "\n".join(lines)


def misses(rows: list[FamilyRow], keep: Callable[[FamilyRow], bool]) -> str:
    """The check rows of a slice outside the band or rejected, one line each."""
    lines = []
    for r in rows:
        if keep(r) and r.role is Role.CHECK and (r.error is None or abs(r.error) > BAND):
            got = f"rejected: {r.rejected}" if r.error is None else f"{100 * r.error:+.1f} %"
            lines.append(f"- {r.name} (tp {r.tp} pp {r.pp} dp {r.dp} cp {r.cp}, z{r.zero}): {got}")
    return "\n".join(lines)


def report(rows: list[FamilyRow]) -> str:
    parts = [family_table(rows), "", slice_table(rows)]
    for name, keep in SLICES[:1] + SLICES[3:5]:
        parts += ["", f"Outside ±15 % or rejected, {name}:", misses(rows, keep) or "- none"]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    """The report on stdout. It takes no options: --help says what it prints, and any other word is one error line
    (round 17: `--help` or a stray flag printed the whole report, after ~40 s of planning on a 2-core CPU)."""
    from hybrid.cliutil import HelpFormatter, OneLineParser
    OneLineParser(prog="python -m hybrid.planner.families", description=__doc__.split("\n\n")[0],
                  formatter_class=HelpFormatter).parse_args(argv)
    # Everything imported so far (torch's ~290k objects) lives to the end: freezing it keeps the garbage
    # collector's full passes, which the planning's allocations trigger ~20 times, from walking it each time
    # (a third of the report's CPU before round 18). Changes no number: no object here is ever freed anyway.
    gc.freeze()
    print(report(all_rows()))


if __name__ == "__main__":
    main()
