"""The planner against published numbers (the files in <repo>/tests/data, see its README.md for the sources).

    python -m hybrid.planner.reference            # prints the tables of docs/planner/validation.md

* ZeRO (Rajbhandari et al. 2020) Table 1: model-state GB per device for stages 1-3, reproduced by
  memory.model_state_bytes.
* Narayanan et al. 2021 Table 1 (A100 80GB, interleaved 1F1B, activation recomputation): each row's layout
  (t, p, d, global batch) evaluated on the a100-80g preset with full recomputation, no sequence parallelism
  (it postdates the paper), ZeRO 0 (Megatron then had no distributed optimizer), and the micro-batch size and
  chunks per rank (v) the planner picks for that layout (neither is published per row). TFLOP/s per GPU counts
  FLOPs with the paper's eq. (3), as the paper does. Then the planner searches every layout of that model on
  that many GPUs; its best must not be predicted slower than the published layout.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from hybrid.planner.hardware import GB, hardware
from hybrid.planner.layout import Cluster, Offload, PipelineP2P, Recompute, Workload, ZeroStage
from hybrid.planner.predicted_memory import model_state_bytes
from hybrid.planner.search import Plan, SearchSpace, search
from hybrid.planner.time import FlopsFormula
from models.config import ARCH_GPT2, ModelConfig

MEGATRON_CSV = "megatron_2021_table1_subset.csv"
ZERO_CSV = "zero_2020_table1.csv"


def reference_dir() -> Path:
    """<repo root>/tests/data: the published tables, copied with their sources (tests/data/README.md), so the
    validation runs on a clean clone."""
    return Path(__file__).resolve().parents[2] / "tests" / "data"


def gpt_model(layers: int, hidden: int, heads: int, vocab: int, seq: int) -> ModelConfig:
    """A Megatron GPT: learned positions, LayerNorm, GELU MLP of 4h, biases, tied embeddings, dropout 0.1.
    Its parameter count is Narayanan et al. eq. (2) plus the final LayerNorm: 12lh^2 + 13lh + (V + s)h + 2h."""
    return ModelConfig(arch=ARCH_GPT2, vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads,
                       num_kv_heads=heads, head_dim=hidden // heads, ffn_hidden_size=4 * hidden,
                       max_position_embeddings=seq, norm_eps=1e-5, tie_embeddings=True, qkv_bias=True,
                       mlp_bias=True, out_bias=True, activation="gelu", dropout=0.1)


@dataclass(frozen=True)
class MegatronRow:
    """One row of Narayanan et al. 2021, Table 1."""

    params_billion: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    dp: int
    gpus: int
    global_batch: int
    seq: int
    vocab: int
    gpu: str
    tflops_per_gpu: float
    percent_of_peak: float

    @property
    def workload(self) -> Workload:
        # 2-byte gradients (fp32_grads off): the paper does not say fp16 or bf16, and Megatron-LM turns fp32 main
        # grads on by default only with --bf16 (arguments.py); with --fp16 it keeps fp16 gradients. Blocking p2p:
        # Megatron-LM's 2021 schedules wait on each batch of sends and receives before computing on (overlapped
        # pipeline communication came later), with the paper's scatter-gather (Sec. 4.1); Megatron's fused kernels
        # (KernelProfile.FUSED, the default)
        return Workload(gpt_model(self.layers, self.hidden, self.heads, self.vocab, self.seq),
                        global_batch=self.global_batch, seq_length=self.seq, p2p=PipelineP2P.BLOCKING_SCATTER,
                        fp32_grads=False)


def megatron_rows(directory: Path | None = None) -> list[MegatronRow]:
    with open((directory or reference_dir()) / MEGATRON_CSV) as f:
        return [MegatronRow(float(r["params_billion"]), int(r["attention_heads"]), int(r["hidden_size"]),
                            int(r["num_layers"]), int(r["tensor_parallel"]), int(r["pipeline_parallel"]),
                            int(r["data_parallel"]), int(r["gpus"]), int(r["global_batch_size"]),
                            int(r["seq_length"]), int(r["vocab_size"]), r["gpu"],
                            float(r["achieved_tflops_per_gpu"]), float(r["percent_of_peak"]))
                for r in csv.DictReader(f)]


@dataclass(frozen=True)
class MegatronCheck:
    """A published row, the planner's prediction for its layout, and the planner's own best layout.

    Attributes:
        row: the published row.
        published: the prediction for the row's layout (b and v picked by the planner).
        best: the fastest layout the planner finds for the model on the row's GPU count.
    """

    row: MegatronRow
    published: Plan
    best: Plan

    @property
    def error(self) -> float:
        """Predicted / published TFLOP/s per GPU - 1."""
        return self.published.tflops_per_gpu / self.row.tflops_per_gpu - 1


def published_space(row: MegatronRow) -> SearchSpace:
    """The row's layout pinned (t, p, full recomputation, no SP, ZeRO 0, no offload); b and v searched."""
    return SearchSpace(tp=(row.tp,), pp=(row.pp,), zero=(ZeroStage.NONE,), offload=(Offload.NONE,),
                       recompute=(Recompute.FULL,), sequence_parallel=(False,))


def predict_published(row: MegatronRow, efficiency: float | None = None) -> Plan:
    """The planner's prediction for the row's own layout (b and v picked by the planner)."""
    cluster = Cluster(gpus=row.gpus, hw=hardware(row.gpu).with_overrides(compute_efficiency=efficiency))
    pinned = search(row.workload, cluster, published_space(row), top=1, formula=FlopsFormula.MEGATRON)
    if not pinned.plans:
        raise ValueError(f"the published layout of the {row.params_billion}B row does not fit: "
                         f"{pinned.rejected[:3]}")
    return pinned.plans[0]


def check_megatron(row: MegatronRow) -> MegatronCheck:
    """Predict the row's layout and search the model's best layout on the same GPUs."""
    best = search(row.workload, Cluster(gpus=row.gpus, hw=hardware(row.gpu)), top=1, formula=FlopsFormula.MEGATRON)
    return MegatronCheck(row=row, published=predict_published(row), best=best.plans[0])


def sensitivity_table(rows: list[MegatronRow], efficiencies: tuple[float, ...] = (0.55, 0.6, 0.65)) -> str:
    """Error of the published-layout prediction per row at other values of the A100 curve's asymptote e."""
    lines = ["| model | " + " | ".join(f"efficiency {e:g}" for e in efficiencies) + " |",
             "|---|" + "---|" * len(efficiencies)]
    for row in rows:
        errors = [predict_published(row, e).tflops_per_gpu / row.tflops_per_gpu - 1 for e in efficiencies]
        lines.append(f"| {row.params_billion:g}B | " + " | ".join(f"{100 * x:+.1f} %" for x in errors) + " |")
    return "\n".join(lines)


def megatron_table(checks: list[MegatronCheck]) -> str:
    """Markdown: predicted vs published TFLOP/s per GPU, and the planner's best layout."""
    lines = ["| model | t x p x d | GPUs | B | b, v picked | bubble | memory | predicted TFLOP/s | published | "
             "error | planner's best layout | its tokens/s vs published layout |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in checks:
        r, p, best = c.row, c.published, c.best
        lines.append(
            f"| {r.params_billion:g}B | {r.tp} x {r.pp} x {r.dp} | {r.gpus} | {r.global_batch} | "
            f"{p.layout.micro_batch}, {p.layout.v} | {100 * p.bubble_fraction:.1f} % | {p.memory_gb:.1f} GB | "
            f"{p.tflops_per_gpu:.1f} | {r.tflops_per_gpu:g} | {100 * c.error:+.1f} % | {best.layout.short()} | "
            f"{best.tokens_per_s / p.tokens_per_s:.2f}x |")
    return "\n".join(lines)


@dataclass(frozen=True)
class ZeroRow:
    """One row of the ZeRO paper's Table 1: GB per device at stages 1, 2, 3 (as printed)."""

    params_billion: float
    dp: int
    stage_gb: tuple[str, str, str]


def zero_rows(directory: Path | None = None) -> list[ZeroRow]:
    with open((directory or reference_dir()) / ZERO_CSV) as f:
        return [ZeroRow(float(r["params_billion"]), int(r["data_parallel"]),
                        (r["gb_per_device_stage1"], r["gb_per_device_stage2"], r["gb_per_device_stage3"]))
                for r in csv.DictReader(f)]


def zero_prediction_gb(row: ZeroRow, stage: int) -> float:
    return model_state_bytes(row.params_billion * GB, ZeroStage(stage), row.dp) / GB


def last_digit(printed: str) -> float:
    """The unit of the last printed digit: '41.3' -> 0.1, '2048' -> 1."""
    return 10.0 ** -len(printed.split(".")[1]) if "." in printed else 1.0


def _digits(value: float, printed: str) -> str:
    """`value` with one decimal more than the paper printed."""
    decimals = len(printed.split(".")[1]) + 1 if "." in printed else 1
    return f"{value:.{decimals}f}"


def zero_table(rows: list[ZeroRow]) -> str:
    lines = ["| Psi | Nd | stage 1 predicted / paper | stage 2 | stage 3 |", "|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{_digits(zero_prediction_gb(r, s), r.stage_gb[s - 1])} / {r.stage_gb[s - 1]}" for s in (1, 2, 3)]
        lines.append(f"| {r.params_billion:g}B | {r.dp} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    directory = reference_dir()
    if not directory.exists():
        raise SystemExit(f"no reference data at {directory}")
    rows = megatron_rows(directory)
    print(zero_table(zero_rows(directory)))
    print()
    print(megatron_table([check_megatron(row) for row in rows]))
    print()
    print(sensitivity_table(rows))


if __name__ == "__main__":
    main()
