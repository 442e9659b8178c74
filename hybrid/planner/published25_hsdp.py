"""Issue 26, round 25 (planner25a): the published FSDP rows that ran hybrid-sharded data parallelism (HSDP), planned
as they ran (Layout.dp_replicate: ZeRO 3 inside a shard group, the reduced gradient shards all-reduced over the
replicas).

    python -m hybrid.planner.published25_hsdp   # docs/planner/round25-hsdp.md's tables

Which rows, from their own sources (nothing fitted; no constant changed):

* IBM fms-fsdp README.md at 0d31998 (the A100 rows' source, published16.FMS_FSDP_A100_SOURCE), its throughput
  table's "Sharding Strategy" column: 7b HSDP, 13b HSDP, 34b FSDP, 70b FSDP (128 A100). The README at 5e522b4
  (2024-03-13, the day of IBM's post, published.FMS_FSDP_SOURCE: the H100 rows) states 7b HSDP for both the
  A100 and the 96-H100 column, 13b / 34b / 70b FSDP. So the A100 7B and 13B and the H100 7B ran HSDP.
* What fms-fsdp's HSDP is (its code at both commits): `sharding_strategy == "hsdp"` gives FSDP1's
  `ShardingStrategy.HYBRID_SHARD` (fms_fsdp/utils/train_utils.py get_policies), wrapped with no process group or
  device mesh (main_training.py), so torch builds the groups itself: the shard group is the node's
  `torch.cuda.device_count()` ranks (torch/distributed/fsdp/_init_utils.py `_init_intra_and_inter_node_groups`:
  `dist.new_subgroups(num_devices_per_node)`), the replicas the ranks with the same local rank on every node.
  `scripts/train.sh` runs `--nproc_per_node=8`; its docs/configurations.md: "HSDP will shard your model across 8
  gpus in each node". So a shard group of 8 and gpus / 8 replicas: 16 on 128 A100, 12 on 96 H100. No gradient
  accumulation (one micro-batch a step, main_training's loop), bf16 reductions (its bfSixteen policy).

The other FSDP families, read for HSDP: MosaicML's benchmark tables run `FULL_SHARD` (published16's and
published_more's sources say so); torchtitan's, OLMo-core's and KempnerForge's rows the repository holds state
FSDP over their DP ranks (OLMo-core's on one node, where HSDP is FSDP). None of them moves here.
"""

from __future__ import annotations

import re
from dataclasses import replace

from hybrid.planner.layout import Cluster
from hybrid.planner.published import PublishedRun

FMS_FSDP_NODE_GPUS = 8  # fms-fsdp's train.sh --nproc_per_node=8: FSDP1 HYBRID_SHARD's shard group
# the rows whose source states HSDP (README at 0d31998: A100; at 5e522b4 / IBM's post: H100), by model and card
FMS_FSDP_HSDP = (("Llama 2 7B", "A100"), ("Llama 2 13B", "A100"), ("Llama 2 7B", "H100"))


def states_hsdp(name: str) -> bool:
    """Does the fms-fsdp row `name` ("fms-fsdp <model>, <gpus> <card>, ...") state HSDP (FMS_FSDP_HSDP)?"""
    if not name.startswith("fms-fsdp "):
        return False
    model, where = name[len("fms-fsdp "):].split(", ")[:2]
    return any(model == m and where.split()[1] == card for m, card in FMS_FSDP_HSDP)


def hsdp_name(name: str, gpus: int) -> str:
    """The row's name with its sharding as run: ', FSDP,' -> ', HSDP 8 x 16,' (shard group x replicas)."""
    return name.replace(", FSDP,", f", HSDP {FMS_FSDP_NODE_GPUS} x {gpus // FMS_FSDP_NODE_GPUS},")


def as_run(run: PublishedRun) -> PublishedRun:
    """An fms-fsdp row planned as it ran: HSDP over node-sized shard groups where its source states HSDP
    (states_hsdp), unchanged otherwise."""
    if not states_hsdp(run.name):
        return run
    replicas = run.gpus // FMS_FSDP_NODE_GPUS
    return replace(run, name=hsdp_name(run.name, run.gpus), space=replace(run.space, dp_replicate=(replicas,)))


def as_full_shard(run: PublishedRun) -> PublishedRun:
    """The row as rounds 16-24 planned it: ZeRO 3 over all its GPUs (the 'before' of docs/planner/round25-hsdp.md)."""
    return replace(run, name=re.sub(r", HSDP \d+ x \d+,", ", FSDP,", run.name),
                   space=replace(run.space, dp_replicate=(1,)))


def ibm_runs() -> list[PublishedRun]:
    """IBM's seven fms-fsdp rows as the families report plans them (the README's four on 128 A100, the post's three
    on 96 H100)."""
    from hybrid.planner.published import heldout_h100_runs
    from hybrid.planner.published16 import fms_fsdp_a100_runs
    return fms_fsdp_a100_runs() + [r for r in heldout_h100_runs() if r.name.startswith("fms-fsdp")]


def table() -> str:
    """Each IBM row planned with ZeRO 3 over all its GPUs and as it ran, and the HSDP plan's two groups' traffic;
    the family's summary both ways. Also the 34B / 70B, which stated FSDP, planned as HSDP: they do not fit in a
    node's shard group (the README: "FSDP will be a necessity")."""
    from hybrid.planner.published_more import evaluate, summary_line
    from hybrid.planner.time import hsdp_traffic
    lines = ["| row | as planned before (ZeRO 3 over all) | memory GB | as run | layout | memory GB | step s before "
             "-> after | shard group GB a step (link s) | replicas GB a step (link s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    before, after = [], []
    for run in ibm_runs():
        old, new = evaluate(as_full_shard(run)), evaluate(run)
        before.append(old)
        after.append(new)
        if not states_hsdp(as_full_shard(run).name):
            continue
        plan = new.plan
        groups = hsdp_traffic(run.workload, Cluster(gpus=run.gpus, hw=run.hardware()), plan.layout)
        sh, rep = groups["shard"], groups["replicate"]
        lines.append(f"| {run.name} | {100 * old.error:+.1f} % | {old.plan.memory_gb:.1f} | {100 * new.error:+.1f} % "
                     f"| {plan.layout.short()} | {plan.memory_gb:.1f} | {old.plan.seconds:.3f} -> {plan.seconds:.3f} "
                     f"| {sh['bytes'] / 1e9:.1f} ({sh['seconds']:.3f}) | {rep['bytes'] / 1e9:.2f} "
                     f"({rep['seconds']:.3f}) |")
    lines += ["", summary_line("IBM fms-fsdp, ZeRO 3 over all GPUs (before)", before),
              summary_line("IBM fms-fsdp, HSDP where stated (after)", after), ""]
    for run in ibm_runs():
        if states_hsdp(as_full_shard(run).name):
            continue
        hsdp = replace(run, space=replace(run.space, dp_replicate=(run.gpus // FMS_FSDP_NODE_GPUS,)))
        result = evaluate(hsdp)
        got = result.rejected if result.plan is None else f"{100 * result.error:+.1f} %"
        lines.append(f"{run.name} as HSDP {FMS_FSDP_NODE_GPUS} x {run.gpus // FMS_FSDP_NODE_GPUS} (it stated FSDP): "
                     f"{got}")
    return "\n".join(lines)


def link_what_if() -> str:
    """Round 24's what-if (IBM's post's node links: 6.25 GB/s a GPU on the A100 cluster, 12.5 on the H100 one;
    published24c_fsdp.stated_link), now with the HSDP rows as they ran; not landed (a what-if, as in round 24)."""
    from hybrid.planner.published24c_fsdp import stated_link
    from hybrid.planner.published_more import evaluate, summary_line
    rows = ibm_runs()
    shipped = [evaluate(r) for r in rows]
    stated = [evaluate(replace(r, inter_node_gbps=stated_link(r))) for r in rows]
    lines = ["| row | preset link | at the stated link GB/s a GPU |", "|---|---|---|"]
    lines += [f"| {a.run.name} | {100 * a.error:+.1f} % | {stated_link(a.run):g}: {100 * b.error:+.1f} % |"
              for a, b in zip(shipped, stated, strict=True)]
    return "\n".join(lines + ["", summary_line("IBM fms-fsdp (HSDP where stated), at the post's link", stated)])


def main() -> None:
    print(table())
    print()
    print(link_what_if())


if __name__ == "__main__":
    main()
