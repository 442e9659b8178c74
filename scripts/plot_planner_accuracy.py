"""The planner's accuracy on every published row, as one PNG: predicted against published throughput, and the check
rows' signed errors.

    python scripts/plot_planner_accuracy.py --out docs/img/planner_accuracy.png

The rows are hybrid.planner.families.all_rows() -- the rows `python -m hybrid.planner.families` reports -- each
planned once (~560 rows, ~11 s of CPU). Left: log-log, one marker per family; FIT rows (they set a constant) hollow,
CHECK rows filled; the line y = x and the +-15 % band (families.BAND); rows whose published layout the planner
rejects sit at the bottom edge as x (they have no prediction). Each axis is the source's own unit (TFLOP/s per GPU,
tokens/s per GPU, or 1 / step time for a step-time row), so a row's height over y = x is its throughput error
(predicted / published - 1) whatever the unit. Right: the histogram of the CHECK rows' signed errors, with families'
median |error| and signed mean in the title. Deterministic: no clock, no randomness.
"""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hybrid.cliutil import OneLineParser, atomic_output  # noqa: E402

MARKERS = "osD^v<>pPh*X8d"  # one per family, in families.FAMILY_OF_SOURCE's order


@dataclass(frozen=True)
class Point:
    """One planned row and its published throughput (source's unit; 1 / s for a step time)."""

    row: object  # families.FamilyRow
    published: float

    @property
    def predicted(self) -> float | None:
        """published x (1 + error): error is predicted / published throughput - 1 in every unit."""
        return None if self.row.error is None else self.published * (1 + self.row.error)


def _throughput(run) -> float:
    from hybrid.planner.published import Metric
    return 1 / run.published if run.metric is Metric.STEP_S else run.published


def collect() -> list[Point]:
    """families.all_rows() with each row's published throughput: every run planned once, as all_rows plans it."""
    from hybrid.planner.families import all_published_runs, narayanan_reference_rows, plan_row
    from hybrid.planner.published_more import evaluate
    from hybrid.planner.reference import megatron_rows
    gc.freeze()  # families.main's reason: the planning's GC passes would walk torch's objects each time
    points = []
    for run in all_published_runs():
        result = evaluate(run)
        points.append(Point(plan_row(run, lambda _run, r=result: r), _throughput(run)))
    refs = narayanan_reference_rows()
    points += [Point(row, m.tflops_per_gpu) for row, m in zip(refs, megatron_rows(), strict=True)]
    return points


def _style() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcdefaults()
    plt.rcParams.update({"font.size": 9, "axes.grid": True, "grid.alpha": 0.3, "savefig.dpi": 110,
                         "svg.hashsalt": "hybrid", "path.simplify": True})


def _families(points: list[Point]) -> list[str]:
    from hybrid.planner.families import FAMILY_OF_SOURCE
    present = {p.row.family for p in points}
    return [f for f in dict.fromkeys(f for _, f in FAMILY_OF_SOURCE) if f in present]


def _scatter(ax, points: list[Point]) -> dict:
    """The log-log panel; returns the counts it drew (points, within the band, rejected)."""
    from hybrid.planner.families import BAND
    from hybrid.planner.published import Role
    import matplotlib.pyplot as plt
    planned = [p for p in points if p.predicted is not None]
    lo = min(min(p.published for p in points), min(p.predicted for p in planned)) / 1.6
    hi = max(max(p.published for p in points), max(p.predicted for p in planned)) * 1.6
    colors = plt.get_cmap("tab20").colors
    planned_sets = []  # the PathCollections of planned rows: the counts are read back from what was drawn
    for i, family in enumerate(_families(points)):
        color, marker = colors[(2 * i) % 20 if i < 10 else (2 * i + 1) % 20], MARKERS[i % len(MARKERS)]
        has_check = any(p.row.family == family and p.row.role is Role.CHECK for p in planned)
        for role, face in ((Role.CHECK, color), (Role.FIT, "none")):
            mine = [p for p in planned if p.row.family == family and p.row.role is role]
            if mine:
                planned_sets.append(ax.scatter(
                    [p.published for p in mine], [p.predicted for p in mine], s=22, marker=marker, facecolors=face,
                    edgecolors=color, linewidths=0.9, zorder=3,
                    label=family if role is Role.CHECK or not has_check else None))
    rejected = [p for p in points if p.predicted is None]
    if rejected:
        ax.scatter([p.published for p in rejected], [lo * 1.15] * len(rejected), marker="x", s=22, color="black",
                   linewidths=0.9, zorder=3, clip_on=False, label=f"rejected by the planner ({len(rejected)})")
    drawn = [xy for c in planned_sets for xy in c.get_offsets()]
    within = int(sum(abs(y / x - 1) <= BAND for x, y in drawn))
    xs = [lo, hi]
    ax.plot(xs, xs, color="black", linewidth=0.9, zorder=2, label="y = x")
    ax.fill_between(xs, [x * (1 - BAND) for x in xs], [x * (1 + BAND) for x in xs], color="0.35", alpha=0.3,
                    linewidth=0, zorder=1, label=f"±{100 * BAND:.0f} %")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), aspect="equal",
           xlabel="published throughput (source's unit)", ylabel="predicted throughput (same unit)")
    ax.set_title(f"{len(drawn)} rows planned, {within} within ±{100 * BAND:.0f} % (grey band), "
                 f"{len(rejected)} rejected (x)\nunits: TFLOP/s/GPU, tokens/s/GPU or 1/step s; "
                 "filled = CHECK, hollow = FIT", fontsize=9)
    return {"points": len(drawn), "within_band": within, "rejected": len(rejected)}


def _histogram(ax, points: list[Point]) -> dict:
    from hybrid.planner.families import BAND
    from hybrid.planner.published import Role, summary
    errors = [p.row.error for p in points if p.row.role is Role.CHECK and p.row.error is not None]
    s = summary(errors)
    width = 0.05
    edges = [width * k for k in range(int(min(errors) // width), int(max(errors) // width) + 2)]
    counts, _, _ = ax.hist([100 * e for e in errors], bins=[100 * e for e in edges], color="tab:blue",
                           edgecolor="white")
    for x in (-100 * BAND, 100 * BAND):
        ax.axvline(x, color="0.4", linestyle="--", linewidth=0.9)
    ax.axvline(0, color="black", linewidth=0.9)
    ax.set(xlabel="throughput error, predicted / published - 1 (%)", ylabel="check rows")
    ax.set_title(f"{s.rows} check rows: median |error| {100 * s.median_abs:.1f} %, signed mean "
                 f"{100 * s.signed_mean:+.1f} %\n{s.within_15} within ±{100 * BAND:.0f} % (dashed)", fontsize=9)
    return {"check_points": int(sum(counts)), "check_within_band": s.within_15, "median_abs": s.median_abs,
            "signed_mean": s.signed_mean}


def draw(points: list[Point], out: str) -> dict:
    """Both panels into `out` (written whole or not at all); returns the counts drawn."""
    _style()
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 7.4), gridspec_kw={"width_ratios": [1, 1]})
    counts = _scatter(left, points)
    counts.update(_histogram(right, points))
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7.5, frameon=False)
    fig.suptitle("hybrid's planner against published training throughput (hybrid.planner.families)", fontsize=10)
    fig.tight_layout(rect=(0, 0.19, 1, 1))
    with atomic_output(out) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)
    return counts


def main(argv: list[str] | None = None) -> dict:
    p = OneLineParser(prog="plot_planner_accuracy.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the PNG to write, e.g. docs/img/planner_accuracy.png")
    args = p.parse_args(argv)
    p.check_out("--out", args.out)
    counts = draw(collect(), args.out)
    print(f"wrote {args.out}: {counts['points']} rows planned, {counts['within_band']} within the band, "
          f"{counts['rejected']} rejected; {counts['check_points']} check rows, median |error| "
          f"{100 * counts['median_abs']:.1f} %, signed mean {100 * counts['signed_mean']:+.1f} %")
    return counts


if __name__ == "__main__":
    main()
