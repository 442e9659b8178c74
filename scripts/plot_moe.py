"""hybrid's MoE layer against megatron-core's, as one PNG of bars drawn from docs/results/bench_moe.md.

    python scripts/plot_moe.py --out docs/img/moe.png [--bench docs/results/bench_moe.md]

Measured (nothing is rerun): the table scripts/bench_moe.py wrote. Left: one MoE layer forward + backward at EP 2,
seconds per step, ours against megatron-core (median of the runs, whiskers their min-max). Middle: bytes per rank the
forward saves for backward, and parameter bytes per rank. Right: our local experts at EP 1, the loop of matmuls
against torch's grouped GEMM (what --moe-experts-impl auto chooses between on CPU).
"""

from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hybrid.cliutil import OneLineParser, atomic_output  # noqa: E402

SPREAD = re.compile(r"([\d.]+) \(([\d.]+)-([\d.]+)\)")  # "0.058 (0.047-0.087)": median (min-max)
MEMORY = re.compile(r"saved for backward per rank: ours ([\d.]+) MiB, megatron ([\d.]+) MiB; parameters per rank: "
                    r"ours ([\d.]+) MiB, megatron ([\d.]+) MiB")


def _spread(cell: str) -> tuple[float, float, float]:
    m = SPREAD.search(cell)
    if not m:
        raise ValueError(f"the cell {cell.strip()!r} is not 'median (min-max)'")
    return float(m.group(1)), float(m.group(2)), float(m.group(3))


def _table(lines: list[str], first: str) -> list[list[str]]:
    """The rows of the markdown table whose header starts with `first`, as cells."""
    start = next((i for i, line in enumerate(lines) if line.startswith(first)), None)
    if start is None:
        raise ValueError(f"no table starting {first!r}; give scripts/bench_moe.py's --out file")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def parse_bench(text: str) -> dict:
    """bench_moe.md's numbers: {"shape": its shape line, "layer": {side: (median, min, max)}, "memory": {...},
    "experts": {impl: (median, min, max)}}. ValueError naming what is missing."""
    lines = text.splitlines()
    layer = _table(lines, "| row |")
    if not layer:
        raise ValueError("its '| row |' table has no row")
    memory = MEMORY.search(text)
    if not memory:
        raise ValueError("no 'saved for backward per rank: ours X MiB, megatron Y MiB; parameters per rank: ...' line")
    shape = next((line[len("- shape: "):] for line in lines if line.startswith("- shape: ")), "")
    return {"shape": shape, "row": layer[0][0],
            "layer": {"hybrid": _spread(layer[0][1]), "megatron-core": _spread(layer[0][2])},
            "ratio": layer[0][3],
            "memory": {"saved for backward": (float(memory.group(1)), float(memory.group(2))),
                       "parameters": (float(memory.group(3)), float(memory.group(4)))},
            "experts": {r[0]: _spread(r[1]) for r in _table(lines, "| local experts")}}


def _style() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcdefaults()
    plt.rcParams.update({"font.size": 9, "axes.grid": True, "grid.alpha": 0.3, "savefig.dpi": 110})


def _spread_bars(ax, values: dict[str, tuple[float, float, float]], colors: list[str]) -> None:
    """Median bars with min-max whiskers, the median written above each."""
    names = list(values)
    med = [values[n][0] for n in names]
    err = [[values[n][0] - values[n][1] for n in names], [values[n][2] - values[n][0] for n in names]]
    ax.bar(names, med, 0.6, color=colors[:len(names)], yerr=err, capsize=5, ecolor="black")
    for i, n in enumerate(names):
        ax.text(i + 0.08, values[n][0], f"{values[n][0]:.3f}", ha="left", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.15 * max(v[2] for v in values.values()))


def draw(data: dict, out: str) -> None:
    """Three panels into `out` (written whole or not at all)."""
    _style()
    import matplotlib.pyplot as plt
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(12, 4.6), gridspec_kw={"width_ratios": [1, 1.25, 1]})
    _spread_bars(a, data["layer"], ["tab:blue", "tab:gray"])
    a.set(ylabel="s per step (median; whiskers min-max)")
    a.set_title(f"{data['row']}\nratio ours / megatron {data['ratio']}", fontsize=8.5)
    kinds = list(data["memory"])
    for j, (side, color) in enumerate((("hybrid", "tab:blue"), ("megatron-core", "tab:gray"))):
        xs = [i + (j - 0.5) * 0.38 for i in range(len(kinds))]
        vals = [data["memory"][k][j] for k in kinds]
        b.bar(xs, vals, 0.36, color=color, label=side)
        for x, v in zip(xs, vals):
            b.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    b.set_xticks(range(len(kinds)), [f"{k} per rank" for k in kinds])
    b.set(ylabel="MiB per rank")
    b.set_title("memory per rank, EP 2 (same weights, same tokens)", fontsize=8.5)
    b.legend(fontsize=8)
    _spread_bars(c, data["experts"], ["tab:green", "tab:purple", "tab:olive"])
    c.set(ylabel="s per step fwd + bwd (median; whiskers min-max)")
    c.set_title("our local experts, EP 1, one thread", fontsize=8.5)
    fig.suptitle(f"MoE layer, measured on CPU (docs/results/bench_moe.md): {data['shape']}", fontsize=9)
    fig.tight_layout()
    with atomic_output(out) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    p = OneLineParser(prog="plot_moe.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", default="docs/results/bench_moe.md", help="scripts/bench_moe.py's --out table")
    p.add_argument("--out", required=True, help="the PNG to write, e.g. docs/img/moe.png")
    args = p.parse_args(argv)
    p.check_out("--out", args.out)
    _, data = p.read_table("--bench", args.bench, parse_bench, "scripts/bench_moe.py's --out table")
    draw(data, args.out)
    print(f"wrote {args.out}")
    return data


if __name__ == "__main__":
    main()
