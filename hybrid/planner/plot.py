"""Memory breakdown of the top layouts as a stacked bar chart (`hybrid plan ... --plot FILE.png`).

One bar per layout, for its fullest pipeline rank (the one that decides whether it fits): parameters,
gradients, optimizer states, activations, ZeRO-3 gather buffers, the loss's logit gradients (the last rank's
first backward), the optimizer step's fp32 gradient beyond the freed activations, and workspace (fixed +
fragmentation) -- RankMemory.total part by part -- with the
device memory drawn as a line. The numbers are `Plan.fullest_rank`: `Plan.memory.peak`
(hybrid/planner/predicted_memory.py) with an MoE model's experts' states (the expert shards a rank holds, less the
dense MLP they replace: hybrid/planner/moe.py) in its parameters, gradients and optimizer states, as the table's
column (`Plan.memory_gb`).

The unit is the table's (hybrid/planner/cli.py): on a GPU, GB = 1e9 bytes, the 2 GB CUDA/NCCL reserve in the
workspace; on a CPU (the cpu preset, a gloo calibration) MiB = 2^20 bytes of peak RSS, as train.py's log line
measures it -- the rank's tensors plus the process before its model (`host_baseline`), no GPU reserve -- so a bar
reads against the table's "RSS MiB" column and the run's "peak RSS ... MiB" (it was GB there, with the 2 GB reserve:
"2.0 GB" over a table row of 263 MiB).

A context-parallel plan (`hybrid plan --context-parallel-size`, hybrid/planner/context.py's ContextPlan) is drawn
the same way: its reduced plan's fullest rank and, on top of it, the ring's buffers (`ContextPlan.ring_bytes`), as
its table row's memory column (`ContextPlan.memory_gb`) counts them.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybrid.planner.hardware import GB
from hybrid.planner.predicted_memory import RankMemory
from hybrid.planner.context import ContextPlan
from hybrid.planner.search import Plan

MIB = 2**20
PROCESS = "process before the model"

# (label, colour, bytes of a RankMemory)
PARTS = (
    ("parameters", "#4C72B0", lambda r: r.states.params),
    ("gradients", "#55A868", lambda r: r.states.grads),
    ("optimizer states", "#C44E52", lambda r: r.states.optimizer),
    ("activations", "#8172B2", lambda r: r.activations),
    ("ZeRO-3 buffers", "#CCB974", lambda r: r.buffers),
    # the loss's gradients over the logits in the last rank's first backward (RankMemory.backward_transient; round
    # 22: not drawn, a bar fell short of the table's column by it -- 1.0 of 41.3 GB for llama-3-8b at 8k, cp 2)
    ("loss gradient", "#937860", lambda r: r.backward_transient),
    # the optimizer step's fp32 gradient, beyond what the (then freed) activations and buffers took
    ("step fp32 gradient", "#64B5CD",
     lambda r: max(0.0, r.step_transient - r.activations - r.buffers - r.backward_transient)),
    ("workspace", "#8C8C8C", lambda r: r.workspace),
)
RING = "CP ring buffers"
COLOURS = {label: colour for label, colour, _ in PARTS} | {PROCESS: "#8C8C8C", RING: "#DD8452"}


@dataclass(frozen=True)
class Unit:
    """The bars' unit: its name, its bytes, and what the y axis says."""

    name: str
    bytes: float
    axis: str


GPU_UNIT = Unit("GB", GB, "GB per device (1 GB = 1e9 bytes), fullest pipeline stage")
HOST_UNIT = Unit("MiB", MIB, "peak RSS per rank, MiB (2^20 bytes), fullest stage")


def memory_parts(rank: RankMemory, unit: Unit = GPU_UNIT, host_baseline: float | None = None) -> dict[str, float]:
    """Each part of one pipeline rank's memory in `unit`, in PARTS order. On a host (host_baseline: the resident
    bytes of a process before its model) the workspace, the GPU reserve, gives way to that process, as the table's
    RSS column (cli._memory: peak.total - peak.workspace + baseline)."""
    parts = {label: part(rank) for label, _, part in PARTS}
    if host_baseline is not None:
        del parts["workspace"]
        parts[PROCESS] = host_baseline
    return {label: b / unit.bytes for label, b in parts.items()}


def bar_parts(plan: Plan | ContextPlan, unit: Unit = GPU_UNIT, host_baseline: float | None = None) -> dict[str, float]:
    """One bar: memory_parts of the plan's fullest rank, and for a CP plan its ring's buffers before the workspace
    (or the process): the parts add up to the table's memory column."""
    if not isinstance(plan, ContextPlan):
        return memory_parts(plan.fullest_rank, unit, host_baseline)
    parts = memory_parts(plan.base.fullest_rank, unit, host_baseline)
    last = next(reversed(parts))  # workspace, or the process on a host
    return {**{k: v for k, v in parts.items() if k != last}, RING: plan.ring_bytes / unit.bytes, last: parts[last]}


def plot_memory(plans: list[Plan | ContextPlan], path: str, title: str = "", device_bytes: float | None = None,
                host_baseline: float | None = None) -> None:
    """Write the stacked bars of `plans` (fastest first) to `path` (PNG, or any format matplotlib knows)."""
    import matplotlib.pyplot as plt
    fig = draw_memory(plans, title, device_bytes, host_baseline)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_memory(plans: list[Plan | ContextPlan], title: str = "", device_bytes: float | None = None,
                host_baseline: float | None = None):
    """The figure of plot_memory. host_baseline given: a CPU's bars, in MiB of RSS (the module docstring); None: a
    GPU's, in GB."""
    if not plans:
        raise ValueError("--plot: no layout to plot")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unit = GPU_UNIT if host_baseline is None else HOST_UNIT
    parts = [bar_parts(p, unit, host_baseline) for p in plans]  # MoE: experts included; CP: the ring's buffers
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 * len(plans) + 3), 5.5))
    xs = range(len(plans))
    bottoms = [0.0] * len(plans)
    for label in parts[0]:
        heights = [part[label] for part in parts]
        if any(heights):
            ax.bar(xs, heights, bottom=bottoms, color=COLOURS[label], label=label, width=0.6)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
    value = "{:.1f} GB" if unit is GPU_UNIT else "{:,.0f} MiB"
    for x, p, total in zip(xs, plans, bottoms):
        ax.text(x, total, f"{value.format(total)}\n{p.seconds:.3g} s/step", ha="center", va="bottom", fontsize=8)
    top = _device_line(ax, device_bytes, unit, max(bottoms))
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"#{i + 1}\n" + p.short().replace(" z", "\nz", 1) + f"\n(stage {_fullest(p).memory.peak.rank})"
                        for i, p in enumerate(plans)], fontsize=8)
    ax.set_ylabel(unit.axis)
    ax.set_ylim(0, top * 1.35)  # room for the bars' labels under the legend
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=8, ncol=3 if unit is GPU_UNIT else 2)
    fig.tight_layout()
    return fig


def _fullest(plan: Plan | ContextPlan) -> Plan:
    """The Plan whose memory a bar draws: a CP plan's reduced plan (the stage is its fullest)."""
    return plan.base if isinstance(plan, ContextPlan) else plan


def _device_line(ax, device_bytes: float | None, unit: Unit, tallest: float) -> float:
    """The memory a rank may use as a dashed line (in the legend, not beside the line: a label there overlapped the
    bars' own labels near it); the axis' top. A host's share of RAM (64 GB for the cpu preset) over ten times the
    tallest bar would flatten the bars to nothing, so there it is named in the legend only."""
    if not device_bytes:
        return tallest
    cap = device_bytes / unit.bytes
    if unit is GPU_UNIT:
        ax.axhline(cap, color="black", linestyle="--", linewidth=1, label=f"device {cap:.1f} GB")
        return max(tallest, cap)
    label = f"memory per rank {cap:,.0f} MiB"
    if cap > 10 * tallest:
        ax.plot([], [], " ", label=f"{label} (above the axis)")
        return tallest
    ax.axhline(cap, color="black", linestyle="--", linewidth=1, label=label)
    return max(tallest, cap)
