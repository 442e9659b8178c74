"""The loss curves of the communication-efficient methods against synchronous AdamW, as one PNG.

    python scripts/plot_comm_efficient.py --ce ce.json [--diloco diloco.json] --out docs/comm_efficient_curves.png

--ce: `scripts/bench_comm_efficient.py --json` (AdamW, PowerSGD, 1-bit Adam: tiny-llama, TP 2 x PP 2 x DP 2);
--diloco: `python -m hybrid.diloco.bench --json` (synchronous AdamW and DiLoCo H = 8: tiny-gpt2, the same mesh).
The two runs train different models, so each gets its own panel; a dashed line marks where a compressor starts.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hybrid.cliutil import OneLineParser, atomic_output, check_output_file  # noqa: E402


def _smooth(xs: list[float], k: int = 5) -> list[float]:
    """Trailing mean over k steps (per-step losses of a small batch are noisy)."""
    return [sum(xs[max(0, i - k + 1):i + 1]) / len(xs[max(0, i - k + 1):i + 1]) for i in range(len(xs))]


def _panel(ax, title: str, curves: list[tuple[str, list[float], int]]) -> None:
    for name, losses, start in curves:
        line, = ax.plot(range(1, len(losses) + 1), _smooth(losses), label=name, linewidth=1.3)
        if start:
            ax.axvline(start, color=line.get_color(), linestyle="--", linewidth=0.8)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (5-step mean)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ce", required=True, help="bench_comm_efficient.py --json output")
    p.add_argument("--diloco", default=None, help="python -m hybrid.diloco.bench --json output")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    check_output_file("--out", args.out)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(args.ce) as f:
        ce = json.load(f)
    rank = ce["args"].get("powersgd_rank")  # the main PowerSGD row's rank (extra rows name theirs)
    panels = [("tiny-llama, TP 2 x PP 2 x DP 2: gradient compression",
               [(f"PowerSGD r {rank}" if name == "PowerSGD" and rank else name, r["curve"], r["start"])
                for name, r in ce["rows"].items()])]
    if args.diloco:
        with open(args.diloco) as f:
            rows = json.load(f)
        panels.append(("tiny-gpt2, TP 2 x PP 2 x DP 2: local updates", [(r["method"], r["losses"], 0) for r in rows]))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), squeeze=False)
    for ax, (title, curves) in zip(axes[0], panels):
        _panel(ax, title, curves)
    fig.tight_layout()
    with atomic_output(args.out) as tmp:
        fig.savefig(tmp, dpi=110, format="png")


if __name__ == "__main__":
    main()
