"""Context parallelism in one PNG: the measured attention time per rank (docs/results/bench_cp.md) and the computed
attention activations per rank against sequence length at CP 1-16.

    python scripts/plot_cp.py --out docs/img/cp.png [--bench docs/results/bench_cp.md]

Left, measured: the table scripts/bench_cp.py wrote (--bench; nothing is rerun) -- per-rank wall and CPU ms of one
causal attention forward + backward for each row, with the ideal unsharded / CP line; a row the bench could not run
is named under the axis. Right, computed: hybrid.planner.context.attention_memory_per_rank (what flash attention
keeps for backward: q, k, v, out and the fp32 log-sum-exp of the rank's s / C tokens) x layers, for Llama 3 405B at
TP 8, micro-batch 1 (the planner's long-context check row, llama3_405b_131k) -- the 1/C law tests/test_cp_memory.py
measures on a small Llama (1/8 within 10 % at CP 8, 16k tokens).
"""

from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hybrid.cliutil import OneLineParser, atomic_output  # noqa: E402

SEQS = (8192, 16384, 32768, 65536, 131072)
CPS = (1, 2, 4, 8, 16)


def parse_bench(text: str) -> tuple[str, list[tuple[str, float, float]], list[str]]:
    """bench_cp.md: (its first line, [(row, wall ms, CPU ms)], [rows not run]). ValueError naming what is missing."""
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if line.startswith("| attention |")), None)
    if header is None:
        raise ValueError("no '| attention | per-rank wall ms | per-rank CPU ms |' table; give scripts/bench_cp.py's "
                         "--out file")
    rows, skipped = [], []
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        try:
            rows.append((cells[0], float(cells[1]), float(cells[2])))
        except (IndexError, ValueError):
            skipped.append(cells[0])
    if not rows:
        raise ValueError("its table has no timed row")
    return lines[0], rows, skipped


def _cp_of(name: str) -> int:
    m = re.search(r"\(CP (\d+)\)", name)
    return int(m.group(1)) if m else 1


def memory_curves() -> tuple[dict[int, list[float]], int]:
    """({cp: [GiB per rank for each of SEQS]}, layers): attention's saved bytes per micro-batch over every layer."""
    from dataclasses import replace
    from hybrid.planner.context import attention_memory_per_rank, llama3_405b_131k
    from hybrid.planner.layout import Layout
    work, _, _, _ = llama3_405b_131k()
    layers = work.model.num_layers
    return {cp: [attention_memory_per_rank(replace(work, seq_length=s), Layout(tp=8), cp) * layers / 2**30
                 for s in SEQS] for cp in CPS}, layers


def _style() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcdefaults()
    plt.rcParams.update({"font.size": 9, "axes.grid": True, "grid.alpha": 0.3, "savefig.dpi": 110})


def _time_panel(ax, title: str, rows: list[tuple[str, float, float]], skipped: list[str]) -> None:
    unsharded = next((w for name, w, _ in rows if _cp_of(name) == 1), None)
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [w for _, w, _ in rows], 0.4, color="tab:blue", label="wall ms (slowest rank)")
    ax.bar([x + 0.2 for x in xs], [c for _, _, c in rows], 0.4, color="tab:orange", label="CPU ms (busiest rank)")
    if unsharded:
        for x, (name, w, _) in zip(xs, rows):
            cp = _cp_of(name)
            ax.hlines(unsharded / cp, x - 0.45, x + 0.45, colors="black", linestyles="--", linewidth=1,
                      label="ideal: unsharded / CP" if x == 0 else None)
            ax.text(x - 0.2, w + 0.015 * unsharded, f"{w / unsharded:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [name.replace(" (", "\n(") for name, _, _ in rows], fontsize=8)
    ax.set_ylabel("attention fwd + bwd per rank (ms)")
    ax.set_title("measured (docs/results/bench_cp.md), number = wall / unsharded\n" + title, fontsize=8.5)
    if skipped:
        ax.set_xlabel("not run: " + "; ".join(skipped), fontsize=7.5)
    ax.legend(fontsize=8, loc="upper right")


def _memory_panel(ax, curves: dict[int, list[float]], layers: int) -> None:
    for cp, gib in curves.items():
        ax.plot(SEQS, gib, marker="o", markersize=4, label=f"CP {cp}")
    ax.axhline(80e9 / 2**30, color="black", linestyle=":", linewidth=1, label="an H100's 80 GB (74.5 GiB)")
    ax.set(xscale="log", yscale="log", xlabel="sequence length (tokens)",
           ylabel=f"attention activations per rank (GiB, all {layers} layers)")
    ax.set_xticks(SEQS, [f"{s // 1024}k" for s in SEQS])
    ax.minorticks_off()
    ax.set_title("computed: planner's attention_memory_per_rank, falls as 1/CP\n"
                 "Llama 3 405B, TP 8, micro-batch 1, bf16 flash attention", fontsize=8.5)
    ax.legend(fontsize=8, loc="upper left")


def draw(bench_text: str, out: str) -> dict:
    """Both panels into `out` (written whole or not at all); returns what was drawn."""
    title, rows, skipped = parse_bench(bench_text)
    _style()
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.4))
    short = title.split(", every process")[0]
    _time_panel(left, short, rows, skipped)
    curves, layers = memory_curves()
    _memory_panel(right, curves, layers)
    fig.tight_layout()
    with atomic_output(out) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)
    return {"rows": rows, "skipped": skipped, "memory": curves}


def main(argv: list[str] | None = None) -> dict:
    p = OneLineParser(prog="plot_cp.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", default="docs/results/bench_cp.md", help="scripts/bench_cp.py's --out table")
    p.add_argument("--out", required=True, help="the PNG to write, e.g. docs/img/cp.png")
    args = p.parse_args(argv)
    p.check_out("--out", args.out)
    text, _ = p.read_table("--bench", args.bench, parse_bench, "scripts/bench_cp.py's --out table")
    drawn = draw(text, args.out)
    print(f"wrote {args.out}: {len(drawn['rows'])} timed rows")
    return drawn


if __name__ == "__main__":
    main()
