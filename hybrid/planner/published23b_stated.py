"""Round 23b (planner23b, issue 26): the DGXC rows planned with every setting their files state.

    python -m hybrid.planner.published23b_stated     # the tables of docs/planner/round23-fp8-dp.md section 5

Round 23 read two settings off the DGXC rows' code and left them unset because setting them moves rows optimistic.
A published row is planned as it ran, so the row modules now plan both (no planner term or constant changed):

* FP8 weights (Workload.fp8_param_gather: ZeRO 1's all-gather moves 1 byte a parameter) on the GPT-3 175B FP8 rows
  of v24.11.1 and v25.04.01, whose hydra YAML states `fp8_params: true` (published_recipes.GPT3_FP8_PARAMS);
* the gradient reduce-scatter overlapped with the last backward (Workload.overlap_grad_reduce) on every NeMo 2.0 row,
  v25.04.01's and v25.05.05's Llama 3.1 8B / 70B / 405B and Nemotron4 15B / 340B, BF16 and FP8, whose recipes build
  Megatron-core's DDP with `overlap_grad_reduce=True, overlap_param_gather=True` and whose comm-overlap callback sets
  both again at dp > 1 (published_recipes.NEMO2_DDP_OVERLAP, published14.NEMO2505_DDP_OVERLAP). The NeMo 1.0 rows
  (v24.11.1, v25.02.02, GPT-3 at both releases) already planned it (`overlap_grad_sync: true`); the all-gather's
  overlap (Workload.overlap_param_gather) is the planner's default on every row, as every recipe states it.

`without` undoes the two settings on a row (round 23's plan), `moved_table` prints every row they move both ways and
`report` adds the families and held-out-kind tables of round 23's plan (the "before" of round23-fp8-dp.md section 5;
`python -m hybrid.planner.families` prints the "after").
"""

from __future__ import annotations

from dataclasses import replace

from hybrid.planner.families import all_published_runs, family_table, narayanan_reference_rows, plan_row, slice_table
from hybrid.planner.published import PublishedRun
from hybrid.planner.published_more import Result, evaluate

BAND = 0.15  # issue 26's band


def nemo2_row(name: str) -> bool:
    """A DGXC row launched through NeMo 2.0's performance scripts (v25.04.01 / v25.05.05, GPT-3's hydra YAML aside)."""
    return name.startswith(("DGXC 25.04.01", "DGXC 25.05.05")) and "GPT3" not in name


def gpt3_fp8_row(name: str) -> bool:
    """A DGXC GPT-3 175B FP8 row (NeMo 1.0 hydra YAML with `fp8_params: true`)."""
    return name.startswith("DGXC") and "GPT3-175B FP8" in name


def stated_settings(run: PublishedRun) -> dict:
    """The Workload fields round 23b sets on this row (empty: the row is planned as before)."""
    if nemo2_row(run.name):
        return {"overlap_grad_reduce": True}
    if gpt3_fp8_row(run.name):
        return {"fp8_param_gather": True}
    return {}


def without(run: PublishedRun) -> PublishedRun:
    """The row as round 23 planned it: the stated settings left unset."""
    change = {field: not value for field, value in stated_settings(run).items()}
    return replace(run, workload=replace(run.workload, **change)) if change else run


def _moved(runs: list[PublishedRun]) -> list[tuple[PublishedRun, Result, Result]]:
    return [(run, evaluate(run), evaluate(without(run))) for run in runs if stated_settings(run)]


def moved_table(moved: list[tuple[PublishedRun, Result, Result]]) -> str:
    """Each row both ways: its error without the stated settings (round 23) and as stated (round 23b)."""
    lines = ["| row | stated setting | error without it (round 23) | as stated | moved |", "|---|---|---|---|---|"]
    for run, now, before in moved:
        what = ", ".join(stated_settings(run))
        toward = "toward 0" if abs(now.error) < abs(before.error) else "away from 0"
        band = " **(leaves ±15 %)**" if abs(now.error) > BAND >= abs(before.error) else ""
        lines.append(f"| {run.name} | {what} | {100 * before.error:+.1f} % | {100 * now.error:+.1f} % | "
                     f"{toward}{band} |")
    return "\n".join(lines)


def summary(moved: list[tuple[PublishedRun, Result, Result]]) -> str:
    """How many rows each setting moves, toward 0 and away, and which leave or enter the band."""
    out = []
    for field in ("overlap_grad_reduce", "fp8_param_gather"):
        rows = [(now.error, before.error) for run, now, before in moved if field in stated_settings(run)]
        toward = sum(abs(n) < abs(b) for n, b in rows)
        shift = sorted(100 * (n - b) for n, b in rows)
        out.append(f"{field}: {len(rows)} rows, {toward} toward 0, {len(rows) - toward} away; error moved "
                   f"{shift[0]:+.1f} to {shift[-1]:+.1f} points")
    left = [run.name for run, now, before in moved if abs(now.error) > BAND >= abs(before.error)]
    entered = [run.name for run, now, before in moved if abs(before.error) > BAND >= abs(now.error)]
    out.append(f"leave the ±15 % band: {left or 'none'}; enter it: {entered or 'none'}")
    return "\n".join(out)


def report() -> str:
    runs = all_published_runs()
    moved = _moved(runs)
    before = {run.name: res for run, _, res in moved}
    rows = [plan_row(run, (lambda _run, r=before[run.name]: r) if run.name in before else None) for run in runs]
    rows += narayanan_reference_rows()
    return "\n\n".join([moved_table(moved), summary(moved), "Round 23's plan (the settings unset):",
                        family_table(rows), slice_table(rows)])


def main() -> None:
    from hybrid.cliutil import HelpFormatter, OneLineParser
    parser = OneLineParser(prog="python -m hybrid.planner.published23b_stated", description=__doc__.split("\n\n")[0],
                           formatter_class=HelpFormatter)
    parser.parse_args()
    print(report())


if __name__ == "__main__":
    main()
