"""Model-state bytes per rank at ZeRO stages 0-3 and with CPU offload, as one PNG of stacked bars.

    python scripts/plot_zero_memory.py --out docs/img/zero_memory.png [--model llama-3-8b] [--dp 8]

Computed, not measured: hybrid.zero.accounting.paper_state_bytes (ZeRO, Rajbhandari et al. 2020, Sec. 5; bf16
with fp32 master weights and fp32 Adam moments: stage 0 16 Psi, stage 1 4 Psi + 12 Psi/n, stage 2 2 Psi + 14 Psi/n,
stage 3 16 Psi/n), for Psi = the model config's parameter count and n = --dp. It is the formula
tests/test_zero.py::test_model_state_ledger_equals_the_zero_paper_accounting pins the engine's measured ledger
(hybrid.zero.accounting.state_ledger) to, each entry within the flat units' padding (< n elements per unit).
Each configuration gets two bars: what stays on the accelerator (solid) and what --offload-* moves to host memory
(hatched). Activations, buffers and temporaries are not model states and are not drawn.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hybrid.cliutil import OneLineParser, atomic_output, int_in  # noqa: E402

GIB = 2**30
KIND_COLORS = (("parameters", "bf16 parameters", "tab:blue"), ("gradients", "bf16 gradients", "tab:orange"),
               ("master_weights", "fp32 master weights", "tab:green"),
               ("optimizer_states", "fp32 Adam moments (exp_avg, exp_avg_sq)", "tab:red"))


def configurations():
    """(label, ZeroConfig) per bar group: the four stages, then the offloads train.py offers."""
    from hybrid.precision import Precision
    from hybrid.zero.config import ZeroConfig
    bf16 = Precision.BF16
    return [(f"stage {s}", ZeroConfig(stage=s, precision=bf16)) for s in range(4)] + [
        ("stage 2 +\n--offload-optimizer", ZeroConfig(stage=2, precision=bf16, offload_optimizer=True)),
        ("stage 3 +\n--offload-optimizer\n--offload-params",
         ZeroConfig(stage=3, precision=bf16, offload_optimizer=True, offload_params=True))]


def bytes_by_config(psi: int, dp: int) -> list[tuple[str, dict]]:
    """(label, {(kind name, placement): bytes}) for every configuration."""
    from hybrid.zero.accounting import paper_state_bytes
    return [(label, {(k.value, p): v for (k, p), v in paper_state_bytes(cfg, psi, dp).items()})
            for label, cfg in configurations()]


def _style() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcdefaults()
    plt.rcParams.update({"font.size": 9, "axes.grid": True, "grid.alpha": 0.3, "savefig.dpi": 110})


def draw(model: str, psi: int, dp: int, out: str) -> list[tuple[str, dict]]:
    """The bars into `out` (written whole or not at all); returns what was drawn, in bytes."""
    _style()
    import matplotlib.pyplot as plt
    from hybrid.zero.accounting import DEVICE, OFFLOAD
    data = bytes_by_config(psi, dp)
    fig, ax = plt.subplots(figsize=(10, 5.2))
    width = 0.38
    for i, (_, entries) in enumerate(data):
        for j, (placement, hatch) in enumerate(((DEVICE, None), (OFFLOAD, "//"))):
            x, bottom = i + (j - 0.5) * width, 0.0
            for kind, name, color in KIND_COLORS:
                v = entries.get((kind, placement), 0) / GIB
                if v:
                    ax.bar(x, v, width * 0.95, bottom=bottom, color=color, hatch=hatch, edgecolor="white",
                           linewidth=0.5)
                    bottom += v
            if bottom:
                ax.text(x, bottom, f"{bottom:.1f}", ha="center", va="bottom", fontsize=7.5)
    from matplotlib.patches import Patch
    handles = [Patch(color=color, label=name) for _, name, color in KIND_COLORS]
    handles.append(Patch(facecolor="white", edgecolor="0.3", hatch="//", label="host memory (--offload-*), right bar"))
    ax.set_xticks(range(len(data)), [label for label, _ in data])
    ax.set_ylabel("model-state memory per rank (GiB)")
    ax.set_title(f"{model} ({psi / 1e9:.2f} B parameters), bf16, data parallel n = {dp}: ZeRO's formula, "
                 "left bar accelerator, right bar host", fontsize=9.5)
    ax.legend(handles=handles, fontsize=8, loc="upper right")
    fig.tight_layout()
    with atomic_output(out) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)
    return data


def main(argv: list[str] | None = None) -> list[tuple[str, dict]]:
    p = OneLineParser(prog="plot_zero_memory.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the PNG to write, e.g. docs/img/zero_memory.png")
    p.add_argument("--model", default="llama-3-8b", help="a preset or config.json (its parameter count is Psi)")
    p.add_argument("--dp", type=int_in(1), default=8, help="data-parallel ranks n the stages partition over")
    args = p.parse_args(argv)
    p.check_out("--out", args.out)
    from models.config import load_config
    try:
        psi = load_config(args.model).num_parameters
    except ValueError as e:
        p.error(f"--model {args.model!r}: {e}")
    data = draw(args.model, psi, args.dp, args.out)
    print(f"wrote {args.out}: Psi {psi}, dp {args.dp}")
    return data


if __name__ == "__main__":
    main()
