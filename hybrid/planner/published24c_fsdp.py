"""Round 24 (planner24c, issue 26): the FSDP families' extreme rows read against their runs' own logs and posts.

    python -m hybrid.planner.published24c_fsdp     # the tables of docs/planner/round24-fsdp-extremes.md

Two sources the earlier rounds did not read:

* KempnerForge's weak-scaling results folder holds the log of every row (benchmarks/weak_scaling_160gpu/results/),
  the 8-GPU points' too. The 70B's 8-GPU point is a pre-flight that ran b1 x 8 eager, not the driver's b2 x 4
  compiled (published15.KEMPNER_WEAK_AS_LOGGED, landed: the row module plans it as logged). `kempner_70b_table`
  prints the row both ways and `PREFLIGHT_70B_STEPS` holds the log's step times (the README's 18.09 s is their
  median over steps 16-30).
* IBM's post on fms-fsdp (pytorch.org blog 2024-03-13, the source of the H100 rows: published.FMS_FSDP_SOURCE) states
  the two clusters' links: "an A100 cluster with 128 GPUs and 400Gbps inter-node interconnect, and an H100 cluster
  with 96 GPUs and 800Gbps inter-node interconnect"; IBM's earlier post on the same (Vela) cluster gives its node
  link as "2 x 100Gbps Ethernet links" (pytorch.org blog 2022-12-12), so the rates are a node's: 400 / 8 / 8 = 6.25
  and 800 / 8 / 8 = 12.5 GB/s a GPU, against the presets' 23.5 (a100-80g) and 47 (h100-80g). `ibm_network_what_if`
  plans IBM's seven rows at the stated rates. Not landed: the seven all move negative (the family's median |error|
  4.4 -> 7.9 %), and the A100 7B / 13B rows ran HSDP (the fms-fsdp README), whose parameter gathers stay inside a
  node; the planner has no HSDP layout and plans ZeRO 3 over all 128 GPUs, so at a slow link it over-prices those
  rows' traffic (docs/planner/round24-fsdp-extremes.md section 2).
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from hybrid.planner.published import PublishedRun, heldout_h100_runs
from hybrid.planner.published15 import KEMPNER_WEAK_SOURCE, _kempner_run, kempner_weak_runs
from hybrid.planner.published16 import fms_fsdp_a100_runs
from hybrid.planner.published_more import Result, evaluate, summary_line

# results/preflight_70b_008gpu_tp4_fsdp2.log at 17248f8: step_time of steps 1-30 (s); step 1 holds the warm-up
PREFLIGHT_70B_STEPS = (22.79, 18.74, 18.66, 18.86, 18.93, 19.79, 17.96, 18.12, 18.10, 18.27, 19.40, 17.52, 18.34, 18.06,
                       17.83, 18.02, 17.83, 18.73, 18.09, 17.90, 18.52, 17.57, 18.25, 18.43, 19.68, 17.71, 18.12, 17.66,
                       18.82, 17.68)
# the 13B pre-flight of the same SLURM job (results/preflight_13b_008gpu_tp4_fsdp2.log): steps 16-30
PREFLIGHT_13B_STEPS = (4.45, 4.39, 4.39, 4.39, 4.40, 4.39, 4.39, 4.39, 4.39, 4.39, 4.38, 4.39, 4.39, 4.39, 4.39)
IBM_A100_NODE_GBPS = 400  # "A100 cluster with 128 GPUs and 400Gbps inter-node interconnect"
IBM_H100_NODE_GBPS = 800  # "H100 cluster with 96 GPUs and 800Gbps inter-node interconnect"


def back_half(steps: tuple[float, ...]) -> tuple[float, ...]:
    """The README's steady state: the back half of a 30-step run (steps 16-30)."""
    return steps[len(steps) // 2:]


def kempner_70b_rows() -> tuple[PublishedRun, PublishedRun]:
    """KempnerForge's 70B at 8 H200 as the driver's flags say (b2 x 4, compile: rounds 15-23) and as its log ran
    (b1 x 8, eager: the row module's plan since round 24)."""
    logged = next(r for r in kempner_weak_runs() if r.name.startswith("KempnerForge 70B weak scaling, 8 H200"))
    driver = _kempner_run("KempnerForge 70B weak scaling, 8 H200, TP 4 x FSDP 2 + compile, b2 x 4, full (driver)",
                          KEMPNER_WEAK_SOURCE, 8, "70B", 4, 2, 4, True, logged.published * 8)
    return driver, logged


def _terms(result: Result) -> dict[str, float]:
    return dict(result.plan.time.terms)


def kempner_70b_table() -> str:
    lines = ["| plan | layout | memory GB | step s | GEMM s | FSDP in passes s | TP s | launches s | tokens/s a GPU "
             "| error |", "|---|---|---|---|---|---|---|---|---|---|"]
    for run in kempner_70b_rows():
        r = evaluate(run)
        t = _terms(r)
        lines.append(f"| {run.name} | {r.layout} | {r.memory_gb:.1f} | {r.plan.time.total:.2f} | {t['gemm']:.2f} | "
                     f"{t['dp_in_passes']:.2f} | {t['tp']:.2f} | {t['launches']:.2f} | {r.predicted:.1f} | "
                     f"{100 * r.error:+.1f} % |")
    lines.append("")
    for what, steps in (("70B pre-flight", back_half(PREFLIGHT_70B_STEPS)), ("13B pre-flight", PREFLIGHT_13B_STEPS)):
        lines.append(f"{what}, steps 16-30: median {statistics.median(steps):.2f} s, {min(steps):.2f}-{max(steps):.2f} s "
                     f"(slowest / fastest {max(steps) / min(steps):.3f})")
    return "\n".join(lines)


def ibm_rows() -> list[PublishedRun]:
    """IBM's seven fms-fsdp rows: the README's four on 128 A100, the post's three on 96 H100, as round 24 planned
    them (ZeRO 3 over all the GPUs; round 25 plans the three that ran HSDP as HSDP: published25_hsdp)."""
    from hybrid.planner.published25_hsdp import as_full_shard
    return [as_full_shard(r) for r in fms_fsdp_a100_runs() + heldout_h100_runs() if r.name.startswith("fms-fsdp")]


def stated_link(run: PublishedRun) -> float:
    """The post's node link over the node's 8 GPUs, GB/s a GPU (one direction)."""
    node_gbps = IBM_A100_NODE_GBPS if run.gpu.startswith("a100") else IBM_H100_NODE_GBPS
    return node_gbps / 8 / 8


def ibm_network_what_if() -> tuple[list[Result], list[Result]]:
    """(as shipped, at the post's link) for IBM's rows; nothing reads it."""
    rows = ibm_rows()
    return [evaluate(r) for r in rows], [evaluate(replace(r, inter_node_gbps=stated_link(r))) for r in rows]


def ibm_table(shipped: list[Result], stated: list[Result]) -> str:
    lines = ["| row | preset link GB/s a GPU | as shipped | stated link GB/s a GPU | at the stated link |",
             "|---|---|---|---|---|"]
    for a, b in zip(shipped, stated, strict=True):
        lines.append(f"| {a.run.name} | {a.run.hardware().inter_node_gbps:g} | {100 * a.error:+.1f} % | "
                     f"{stated_link(a.run):g} | {100 * b.error:+.1f} % |")
    lines += ["", summary_line("IBM fms-fsdp, as shipped", shipped),
              summary_line("IBM fms-fsdp, at the post's link", stated)]
    return "\n".join(lines)


def main() -> None:
    print(kempner_70b_table())
    print()
    print(ibm_table(*ibm_network_what_if()))


if __name__ == "__main__":
    main()
