"""Memory breakdown of the top layouts as a stacked bar chart (`hybrid plan ... --plot FILE.png`).

One bar per layout, for its fullest pipeline rank (the one that decides whether it fits): parameters,
gradients, optimizer states, activations, ZeRO-3 gather buffers and workspace (fixed + fragmentation), in GB,
with the device memory drawn as a line. The numbers are `Plan.memory.peak` (hybrid/planner/predicted_memory.py).
"""

from __future__ import annotations

from hybrid.planner.hardware import GB
from hybrid.planner.predicted_memory import RankMemory
from hybrid.planner.search import Plan

# (label, colour, bytes of a RankMemory)
PARTS = (
    ("parameters", "#4C72B0", lambda r: r.states.params),
    ("gradients", "#55A868", lambda r: r.states.grads),
    ("optimizer states", "#C44E52", lambda r: r.states.optimizer),
    ("activations", "#8172B2", lambda r: r.activations),
    ("ZeRO-3 buffers", "#CCB974", lambda r: r.buffers),
    # the optimizer step's fp32 gradient, beyond what the (then freed) activations and buffers took
    ("step fp32 gradient", "#64B5CD", lambda r: max(0.0, r.step_transient - r.activations - r.buffers)),
    ("workspace", "#8C8C8C", lambda r: r.workspace),
)


def memory_parts(rank: RankMemory) -> dict[str, float]:
    """GB of each part of one pipeline rank's device memory, in PARTS order."""
    return {label: part(rank) / GB for label, _, part in PARTS}


def plot_memory(plans: list[Plan], path: str, title: str = "", device_gb: float | None = None) -> None:
    """Write the stacked bars of `plans` (fastest first) to `path` (PNG, or any format matplotlib knows)."""
    if not plans:
        raise ValueError("--plot: no layout to plot")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 * len(plans) + 3), 5.5))
    xs = range(len(plans))
    bottoms = [0.0] * len(plans)
    for label, colour, _ in PARTS:
        heights = [memory_parts(p.memory.peak)[label] for p in plans]
        if any(heights):
            ax.bar(xs, heights, bottom=bottoms, color=colour, label=label, width=0.6)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
    for x, p, total in zip(xs, plans, bottoms):
        ax.text(x, total, f"{total:.1f} GB\n{p.time.total:.3g} s/step", ha="center", va="bottom", fontsize=8)
    if device_gb:
        # in the legend, not beside the line: a label there overlapped the bars' own labels near the line
        ax.axhline(device_gb, color="black", linestyle="--", linewidth=1, label=f"device {device_gb:.1f} GB")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"#{i + 1}\n" + p.layout.short().replace(" z", "\nz", 1) + f"\n(stage {p.memory.peak.rank})"
                        for i, p in enumerate(plans)], fontsize=8)
    ax.set_ylabel("GB per device (fullest pipeline stage)")
    ax.set_ylim(0, max(max(bottoms), device_gb or 0) * 1.35)  # room for the bars' labels under the legend
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
