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

from hybrid.cliutil import OneLineParser, atomic_output  # noqa: E402


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


def _read(p: OneLineParser, flag: str, path: str, shape: str, ok) -> object:
    """The JSON a bench wrote (`flag`), or this parser's one line naming it: a missing file, not JSON, or not the
    bench's shape (`ok`) were tracebacks."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError) as e:
        p.error(f"{flag} {path!r}: cannot read it ({e.strerror if isinstance(e, OSError) else 'not UTF-8'})")
    except (ValueError, RecursionError):
        p.error(f"{flag} {path!r} is not JSON; give {shape}")
    try:
        if ok(data):
            return data
    except (AttributeError, KeyError, TypeError):
        pass
    p.error(f"{flag} {path!r} is not {shape}")


def _ce_ok(ce) -> bool:
    return isinstance(ce["args"], dict) and bool(ce["rows"]) and all(
        isinstance(r["curve"], list) and isinstance(r["start"], int) for r in ce["rows"].values())


def _diloco_ok(rows) -> bool:
    return isinstance(rows, list) and bool(rows) and all(
        isinstance(r["method"], str) and isinstance(r["losses"], list) for r in rows)


def _ce_title(args: dict) -> str:
    """The run the --ce file records (its model and mesh), not the bench's defaults: a --tp 1 --pp 1 --dp 2 proxy
    was titled "TP 2 x PP 2 x DP 2"."""
    return (f"{args.get('model', 'tiny-llama')}, TP {args.get('tp', 2)} x PP {args.get('pp', 2)} x DP "
            f"{args.get('dp', 2)}: gradient compression")


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(prog="plot_comm_efficient.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--ce", required=True, help="bench_comm_efficient.py --json output")
    p.add_argument("--diloco", default=None, help="python -m hybrid.diloco.bench --json output")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    p.check_out("--out", args.out)
    ce = _read(p, "--ce", args.ce, "scripts/bench_comm_efficient.py --json's output", _ce_ok)
    diloco = args.diloco and _read(p, "--diloco", args.diloco, "python -m hybrid.diloco.bench --json's output",
                                   _diloco_ok)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rank = ce["args"].get("powersgd_rank")  # the main PowerSGD row's rank (extra rows name theirs)
    panels = [(_ce_title(ce["args"]),
               [(f"PowerSGD r {rank}" if name == "PowerSGD" and rank else name, r["curve"], r["start"])
                for name, r in ce["rows"].items()])]
    if diloco:
        panels.append(("tiny-gpt2, TP 2 x PP 2 x DP 2: local updates",  # hybrid.diloco.bench's one mesh
                       [(r["method"], r["losses"], 0) for r in diloco]))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), squeeze=False)
    for ax, (title, curves) in zip(axes[0], panels):
        _panel(ax, title, curves)
    fig.tight_layout()
    with atomic_output(args.out) as tmp:
        fig.savefig(tmp, dpi=110, format="png")


if __name__ == "__main__":
    main()
