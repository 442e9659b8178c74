"""Round 18 (issue 26, planner18b): two what-ifs (docs/planner/rounds.md "Round 18: DTensor SP's copies"); the
first landed in round 19 (hardware.LARGE_GEMM_FLOPS / H100_LARGE_GEMM_RATIO, the clocks refitted with it:
docs/planner/round19-gemm-ceiling.md), and this module keeps its data.

    python -m hybrid.planner.published18             # the GEMM shapes and their sources
    python -m hybrid.planner.published18 --float8-sac  # torchtitan's Float8 + per-op SAC rows, all linears rerun

1. The GEMM ceiling (landed). The H100 curve (hardware.py: e 0.789, t0 6.4 us) is least squares over XLA's 72
measured bf16 shapes (data/gemm_h100_xla.csv), none with m, n or k above 4096 and none above 2 x 4096^3 = 1.37e11 FLOPs.
GPT-3 175B's per-rank matmuls at t 4 (b 1, s 2048, h 12288; SP gathers the 2048 tokens) are 1.5e11-6.2e11 FLOPs
with n or k of 3072-12288: the curve prices them by extrapolation, near its asymptote. The GH100 timings this
repository holds beyond XLA's largest are four of our H200's (data/gemm_h200_measured.csv; the same GH100 chip,
clocks and 700 W as the H100 SXM): 8192^3 and the three 128256-wide vocabulary products, LARGE_FIT. Measured over
the curve they give 0.999, 0.986, 0.907, 0.949 (geometric mean 0.959 on the H100 curve, 0.957 on the H200's).
Round 18's what-if took 1 / that ratio of the curve's seconds for every Hopper GEMM beyond XLA's largest, the clocks
left as fitted; round 19 landed it on the H100 presets (Hardware.large_gemm_flops / large_gemm_ratio; the h200's
own curve was fitted on those shapes) with H100_EAGER_CLOCK, TRITON_FLASH2_SHARE and H100_500W_CLOCK refitted on
their rows. The ratio is fitted to no training row.

2. Float8 under torchtitan's per-op SAC (June 2025). The H200 rows' published memory (47.96 / 46.97 GiB) is 21 GiB
below the plan (69.6 / 67.6), where torchtitan's Dec 2024 Float8 rows planned the same way are within 5 GiB. The
what-if (`float8_sac_recomputes_linears`): no linear's output is kept and every linear reruns in backward -- as if
the policy's `aten.mm` entry missed torchao's float8 matmul. Its mechanism is not found in a source (torchao
0afa4c1's float8 linear still calls torch.mm on Float8 tensors): a candidate for a device check, not a term.
"""

from __future__ import annotations

import csv
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from hybrid.planner.hardware import Gemm, Hardware, hardware
from hybrid.planner.published import PublishedRun
from hybrid.planner.published_more import evaluate

HOPPER_PEAK_TFLOPS = 989.0  # H100 / H200 SXM dense bf16: the presets this what-if touches


def _table(name: str) -> list[dict]:
    with open(Path(__file__).parent / "data" / name, newline="") as f:
        return list(csv.DictReader(f))


def _gemm(row: dict) -> Gemm:
    return Gemm(int(row["m"]), int(row["n"]), int(row["k"]), int(row["b"]))


def xla_largest() -> tuple[float, int]:
    """(largest FLOPs, largest of m, n, k) among XLA's measured H100 shapes: where the H100 curve stops being a
    fit and starts being an extrapolation."""
    gemms = [_gemm(r) for r in _table("gemm_h100_xla.csv")]
    return max(g.flops for g in gemms), max(max(g.m, g.n, g.k) for g in gemms)


def h200_beyond() -> list[tuple[Gemm, float]]:
    """Our H200's measured products of more FLOPs than XLA's largest (8192^3 and the three 128256-wide vocabulary
    products of a 1.2B Llama), each with its measured FLOP/s (the runs' geometric mean): LARGE_FIT, the named
    measurements the what-if's ratio is fitted on."""
    limit = xla_largest()[0]
    rows = [(_gemm(r), float(r["bf16_flops_per_s"])) for r in _table("gemm_h200_measured.csv")]
    return [(g, rate) for g, rate in rows if g.flops > limit]


def curve(card: str) -> Hardware:
    """`card`'s preset on its GEMM curve alone, without the large-GEMM ceiling (Hardware.large_gemm_flops None)."""
    return replace(hardware(card), large_gemm_flops=None, large_gemm_ratio=1.0)


def large_ratio(card: str = "h100-80g") -> float:
    """Geometric mean of measured / curve FLOP/s over h200_beyond() on `card`'s curve (the H100's for every H100
    preset -- the 500 W part shares it -- the H200's own for h200): hardware.H100_LARGE_GEMM_RATIO for the H100."""
    hw = curve(card)
    logs = [math.log(rate / hw.gemm_flops(g, 2)) for g, rate in h200_beyond()]
    return math.exp(sum(logs) / len(logs))


def gpt3_shapes() -> list[tuple[str, Gemm]]:
    """One GPT-3 175B layer's per-rank matmuls at t 4, b 1, s 2048 (forward, then each one's two backward
    products), as the planner prices them (Shard.linear_gemms_in_order, Gemm.backward)."""
    from hybrid.planner.published_recipes import TABLES, table_runs
    run = next(table_runs(t)[0] for t in TABLES if t.model == "GPT3-175B")
    shard = run.workload.shard(4)
    names = ("q", "k", "v", "o", "fc1", "fc2")
    forward = shard.linear_gemms_in_order(1, run.workload.seq_length)
    out = [(f"{n} forward", g) for n, g in zip(names, forward)]
    for n, g in zip(names, forward):
        dgrad, wgrad = g.backward()
        out += [(f"{n} input gradient", dgrad), (f"{n} weight gradient", wgrad)]
    return out


def shape_table() -> str:
    flops_max, dim_max = xla_largest()
    h100 = curve("h100-80g")
    lines = [f"XLA's H100 table: largest product {flops_max:.3g} FLOPs, largest dimension {dim_max}.", "",
             "| our H200's products beyond it (LARGE_FIT) | GFLOPs | measured TFLOP/s | / H100 curve | / H200 curve |",
             "|---|---|---|---|---|"]
    for g, rate in h200_beyond():
        lines.append(f"| {g.m} x {g.n} x {g.k} | {g.flops / 1e9:.0f} | {rate / 1e12:.0f} | "
                     f"{rate / h100.gemm_flops(g, 2):.3f} | {rate / curve('h200').gemm_flops(g, 2):.3f} |")
    lines += [f"| geometric mean | | | {large_ratio('h100-80g'):.3f} | {large_ratio('h200'):.3f} |", "",
              "| GPT-3 175B, t 4, b 1, s 2048: matmul | m x n x k | GFLOPs | beyond XLA's table | H100 curve "
              "TFLOP/s | share of peak |", "|---|---|---|---|---|---|"]
    for name, g in gpt3_shapes():
        rate = h100.gemm_flops(g, 2)
        beyond = "yes" if g.flops > flops_max or max(g.m, g.n, g.k) > dim_max else "no"
        lines.append(f"| {name} | {g.m} x {g.n} x {g.k} | {g.flops / 1e9:.0f} | {beyond} | {rate / 1e12:.0f} | "
                     f"{rate / 1e12 / HOPPER_PEAK_TFLOPS:.3f} |")
    return "\n".join(lines)


@contextmanager
def float8_sac_recomputes_linears() -> Iterator[None]:
    """Inside the block a Float8 (fp8) shard under SELECTIVE_OP keeps none of its linears' outputs and reruns every
    linear in backward (Shard.selective_op_rerun_gemms / selective_op_kept_bytes); bf16 shards as shipped."""
    from hybrid.planner.model import Shard
    rerun, kept = Shard.selective_op_rerun_gemms, Shard.selective_op_kept_bytes

    def all_linears(self, b, s, stops_early):
        return self.linear_gemms_in_order(b, s) if self.fp8 else rerun(self, b, s, stops_early)

    def input_and_attention(self, b, s, sp):
        if not self.fp8:
            return kept(self, b, s, sp)
        widths = sum(g.n for g in self.linear_gemms_in_order(b, s)[0::2])
        return kept(self, b, s, sp) - b * s * 2 * widths  # the kept matmul outputs (bf16) gone
    from hybrid.planner import predicted_memory
    Shard.selective_op_rerun_gemms, Shard.selective_op_kept_bytes = all_linears, input_and_attention
    predicted_memory._activations.cache_clear()  # cached per workload: priced again inside and after the block
    try:
        yield
    finally:
        Shard.selective_op_rerun_gemms, Shard.selective_op_kept_bytes = rerun, kept
        predicted_memory._activations.cache_clear()


def float8_sac_rows() -> list[PublishedRun]:
    """torchtitan's Float8 rows under per-op SAC: June 2025 (the H200 rows, the TP 8 8B rows) and Dec 2024."""
    from hybrid.planner.families import all_published_runs
    from hybrid.planner.layout import Recompute
    return [r for r in all_published_runs() if r.name.startswith("torchtitan") and r.workload.fp8
            and r.space.recompute == (Recompute.SELECTIVE_OP,)]


def float8_sac_table() -> str:
    lines = ["| row | error | what-if | planned memory GiB | what-if | published GiB |", "|---|---|---|---|---|---|"]
    for run in float8_sac_rows():
        today = evaluate(run)
        with float8_sac_recomputes_linears():
            after = evaluate(run)
        published = f"{run.memory_gib:.1f}" if run.memory_gib else "-"
        lines.append(f"| {run.name} | {100 * today.error:+.1f} % | {100 * after.error:+.1f} % | "
                     f"{today.memory_gb / 1.073741824:.1f} | {after.memory_gb / 1.073741824:.1f} | {published} |")
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:] == ["--float8-sac"]:
        print(float8_sac_table())
        return
    if sys.argv[1:]:
        raise SystemExit(f"unknown arguments {sys.argv[1:]}: pass nothing or --float8-sac")
    print(shape_table())


if __name__ == "__main__":
    main()
