"""Issue 26, round 19 (planner19b): the FSDP-side misses -- MosaicML's A100 40GB rows, and what the runs' own
repeats say about them. Evidence and what-ifs; nothing here changes the model, and nothing reads these functions.

    python -m hybrid.planner.published19_fsdp          # the reruns, the repeats' spread, the 70B per micro-batch
    python -m hybrid.planner.published19_fsdp --nic    # what-if: a ZeRO 3 ring across nodes on one NIC (~30 s)
    python -m hybrid.planner.published19_fsdp --headroom   # the FSDP rows by planned free memory (~10 s)

docs/planner/round19-fsdp-misses.md reads the output.

Sources, read at the commits named (mosaicml/llm-foundry, scripts/train/benchmarking/):

* README.md at 061f2c7 -- the A100 40GB table published16.py plans, the file's oldest (precision `bf16` where the
  other tables read `amp_bf16`); the file carries "[comment]: # (TODO: Update tables with torch 2.0 after next
  Composer release)" above its results.
* torch2.md at 985460c -- a sweep log of the same scripts (`collect_results.py`'s columns, the README's header less
  "Model TFLOP"), a100_40gb and a100_80gb, `amp_bf16` PURE FULL_SHARD. Read here: its a100_40gb rows that repeat a
  README 40GB row's configuration exactly (model, s, GPUs, micro-batch, accumulation, activation checkpointing) --
  the selection is by configuration, never by error (TORCH2_REPEATS). Left out: its rows at s > 2048, whose MFU
  column reads 100-195 % and whose T/s/GPU is the README's times ~s / 2048 (13b s 8192: 6246 against 1407): the
  sweep's token count is wrong there, not the run.
* torches.md at beb8dee -- the same configurations on a100_80gb under two images,
  mosaicml/pytorch:1.13.1_cu117 and mosaicml/pytorch:2.0.1_cu118 (TORCHES_PAIRS): the torch version alone.
"""

from __future__ import annotations

import statistics
import sys
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator

from hybrid.planner.published import PublishedRun
from hybrid.planner.published16 import mpt_a100_40g_runs
from hybrid.planner.published_more import evaluate

TORCH2_SOURCE = ("mosaicml/llm-foundry scripts/train/benchmarking/torch2.md at 985460c (a100_40gb, amp_bf16 PURE, "
                 "FULL_SHARD; Throughput (T/s/GPU))")
# torch2.md's a100_40gb rows that repeat a README 40GB row's configuration exactly, in the file's order:
# (model, s, GPUs, micro-batch, accumulation, activation checkpointing, T/s/GPU); a configuration run twice has
# two rows
TORCH2_REPEATS = (("13b", 2048, 8, 4, 16, True, 1948),
                  ("13b", 1024, 8, 8, 16, True, 2019),
                  ("13b", 512, 8, 16, 16, True, 2074),
                  ("7b", 2048, 8, 12, 4, True, 3643),
                  ("3b", 2048, 8, 5, 8, False, 9958),
                  ("1b", 2048, 8, 8, 8, False, 19264),
                  ("1b", 2048, 8, 8, 8, False, 19143),
                  ("760m", 2048, 8, 12, 4, False, 29381),
                  ("760m", 2048, 8, 12, 4, False, 29642),
                  ("350m", 2048, 8, 16, 4, False, 41294),
                  ("350m", 2048, 8, 16, 4, False, 44925))
# torch2.md's a100_40gb configurations run more than once (every column but the throughputs and MFU equal):
# (model, s, GPUs, micro-batch, accumulation, activation checkpointing) -> T/s/GPU of each run
TORCH2_RUN_TWICE_OR_MORE = {("1b", 2048, 8, 8, 8, False): (19264, 19143),
                            ("760m", 2048, 8, 12, 4, False): (29381, 29642),
                            ("350m", 2048, 8, 16, 4, False): (41294, 44925),
                            ("125m", 2048, 8, 24, 3, False): (134314, 134605, 130103, 104410, 134226, 133579),
                            ("125m", 2048, 8, 12, 3, False): (38110, 34252)}
# torches.md (a100_80gb, amp_bf16 PURE, FULL_SHARD, checkpointing on): (model, s, micro-batch, accumulation,
# T/s/GPU under torch 1.13.1, T/s/GPU under torch 2.0.1), 8 GPUs each
TORCHES_PAIRS = (("30b", 2048, 3, 21, 858, 863), ("30b", 1024, 6, 21, 881, 888), ("30b", 512, 12, 21, 892, 901),
                 ("13b", 32768, 1, 3, 970, 988), ("13b", 8192, 5, 3, 1679, 1689), ("13b", 2048, 20, 3, 2036, 2101),
                 ("13b", 512, 80, 3, 2193, 2227), ("7b", 32768, 2, 2, 1627, 1648), ("7b", 8192, 8, 2, 2954, 3030),
                 ("7b", 2048, 32, 2, 3790, 3918), ("7b", 512, 128, 2, 4055, 4234))


def _config(name: str) -> tuple:
    """(model, s, GPUs, micro-batch, accumulation, checkpointing) of a MosaicML row's name:
    'MPT-13b, s 2048, 8 A100 40GB, FSDP z3, b4 x 16, AC' -> ('13b', 2048, 8, 4, 16, True)."""
    parts = name.split(", ")
    mb, accum = parts[4].removeprefix("b").split(" x ")
    return (parts[0].removeprefix("MPT-"), int(parts[1].removeprefix("s ")), int(parts[2].split()[0]), int(mb),
            int(accum), parts[-1] == "AC")


def readme_row(model: str, seq: int, gpus: int, mb: int, accum: int, ac: bool) -> PublishedRun:
    """The README 40GB row of that configuration (ValueError if the table has none)."""
    for run in mpt_a100_40g_runs():
        if _config(run.name) == (model, seq, gpus, mb, accum, ac):
            return run
    raise ValueError(f"no README A100 40GB row runs MPT-{model} at s {seq} on {gpus} GPUs, b{mb} x {accum}")


def rerun_runs() -> list[tuple[PublishedRun, PublishedRun]]:
    """(README row, the same configuration as torch2.md measured it), one pair a torch2.md row."""
    pairs = []
    for model, seq, gpus, mb, accum, ac, tokens in TORCH2_REPEATS:
        readme = readme_row(model, seq, gpus, mb, accum, ac)
        pairs.append((readme, replace(readme, name=readme.name + " (torch2.md)", source=TORCH2_SOURCE,
                                      published=float(tokens))))
    return pairs


def rerun_table() -> str:
    """Each README 40GB row beside torch2.md's run of the same configuration: one plan, two measurements."""
    lines = ["| configuration | planned T/s/GPU | README | error | torch2.md | error | torch2.md / README |",
             "|---|---|---|---|---|---|---|"]
    readme_errors, rerun_errors = [], []
    for readme, rerun in rerun_runs():
        plan = readme.predict()
        got = readme.value(plan)
        e1, e2 = readme.throughput_error(plan), rerun.throughput_error(plan)
        readme_errors.append(e1)
        rerun_errors.append(e2)
        lines.append(f"| {readme.name} | {got:.0f} | {readme.published:.0f} | {100 * e1:+.1f} % | "
                     f"{rerun.published:.0f} | {100 * e2:+.1f} % | {rerun.published / readme.published:.3f} |")
    lines += ["", _line("the README rows (one a torch2.md row)", readme_errors),
              _line("the torch2.md repeats", rerun_errors)]
    return "\n".join(lines)


def repeat_spread() -> str:
    """torch2.md's configurations run twice or more: the slowest and fastest runs of one configuration."""
    lines = ["| configuration (a100_40gb) | runs | T/s/GPU | fastest / slowest |", "|---|---|---|---|"]
    for (model, seq, gpus, mb, accum, ac), runs in TORCH2_RUN_TWICE_OR_MORE.items():
        lines.append(f"| MPT-{model}, s {seq}, {gpus} GPUs, b{mb} x {accum}{', AC' if ac else ''} | {len(runs)} | "
                     + ", ".join(str(r) for r in runs) + f" | {max(runs) / min(runs):.3f} |")
    return "\n".join(lines)


def torch_version_ratios() -> str:
    """torches.md: the same a100_80gb configuration under torch 1.13.1 and 2.0.1."""
    ratios = [new / old for *_, old, new in TORCHES_PAIRS]
    lines = ["| configuration (a100_80gb, 8 GPUs, AC) | torch 1.13.1 | torch 2.0.1 | 2.0.1 / 1.13.1 |",
             "|---|---|---|---|"]
    for (model, seq, mb, accum, old, new), ratio in zip(TORCHES_PAIRS, ratios):
        lines.append(f"| MPT-{model}, s {seq}, b{mb} x {accum} | {old} | {new} | {ratio:.3f} |")
    lines.append(f"\n{len(ratios)} pairs: 2.0.1 / 1.13.1 from {min(ratios):.3f} to {max(ratios):.3f}, median "
                 f"{statistics.median(ratios):.3f}")
    return "\n".join(lines)


# The 70B rows at micro-batch 2 and the 40 GB table's 70B rows: the 40 GB row at 64 GPUs and the 80 GB row at 32
# run the same micro-batch (b2, s 2048, the same ZeRO 3 bytes a GPU within (n - 1)/n), so the same seconds a
# micro-batch but for the optimizer step (once per 16 micro-batches at 80 GB, once per micro-batch at 40 GB)
SEVENTY_B = ("MPT-70b, s 2048, 64 A100 40GB, FSDP z3, b2 x 1, AC", "MPT-70b, s 2048, 32 A100, FSDP z3, b2 x 16, AC",
             "MPT-70b, s 2048, 128 A100 40GB, FSDP z3, b4 x 1, AC", "MPT-70b, s 2048, 64 A100, FSDP z3, b8 x 4, AC")


def seventy_b_table() -> str:
    """Published and planned seconds a micro-batch of MosaicML's 70B rows (step x GPUs / (T/s x accumulation))."""
    from hybrid.planner.families import all_published_runs
    runs = {r.name: r for r in all_published_runs()}
    lines = ["| row | published s a micro-batch | planned s a micro-batch | ZeRO 3 collectives hidden, s a "
             "micro-batch | error |", "|---|---|---|---|---|"]
    for name in SEVENTY_B:
        run = runs[name]
        _, seq, _, mb, accum, _ = _config(name)
        plan = run.predict()
        published = mb * seq / run.published
        lines.append(f"| {name} | {published:.2f} | {plan.seconds / accum:.2f} | "
                     f"{plan.time.overlapped_dp / accum:.2f} | {100 * run.throughput_error(plan):+.1f} % |")
    return "\n".join(lines)


@contextmanager
def zero3_ring_on_one_nic() -> Iterator[None]:
    """What-if: inside the block a ZeRO 3 group that spans nodes moves its bytes at ONE NIC's rate (busbw =
    Hardware.inter_node_gbps) where hardware.group_bandwidth gives it per_node NICs (one ring a NIC, NCCL's
    layout). The rate the MPT-70b row at 64 A100 40GB implies (~26 GB/s a GPU for 3 x 130 GB a step in 14.8 s)."""
    from hybrid.planner import time as step_time
    from hybrid.planner.hardware import GroupPlacement
    from hybrid.planner.layout import ZeroStage
    shipped = step_time._Context.dp_seconds

    def one_nic(self, ledger):
        group = self.dp_group
        if self.layout.zero is ZeroStage.PARAMETERS and group.spans_nodes:
            return step_time.ledger_seconds(ledger, self.cluster.hw, GroupPlacement(group.size, 1))
        return shipped(self, ledger)
    step_time._Context.dp_seconds = one_nic
    try:
        yield
    finally:
        step_time._Context.dp_seconds = shipped


def nic_what_if() -> str:
    """The families report's family and slice tables as shipped and under zero3_ring_on_one_nic."""
    from hybrid.planner.families import all_rows, family_table, slice_table
    shipped = all_rows()
    with zero3_ring_on_one_nic():
        one_nic = all_rows()
    return "\n\n".join(["as shipped:", family_table(shipped), slice_table(shipped),
                        "ZeRO 3 across nodes on one NIC:", family_table(one_nic), slice_table(one_nic)])


def headroom_table(limit: int = 30) -> str:
    """The FSDP-only rows at 8-160 GPUs (ZeRO 3, no TP / PP / CP) by the card's memory left over the plan, counted
    in one layer's bf16 parameters (the unit FSDP gathers): would allocator pressure -- a retry when the next unit
    does not fit the cache -- separate the misses? The `limit` rows with the least."""
    from hybrid.planner.families import all_published_runs
    from hybrid.planner.layout import ZeroStage
    rows = []
    for run in all_published_runs():
        space = run.space
        if space.zero != (ZeroStage.PARAMETERS,) or space.tp != (1,) or space.pp != (1,) or not 8 <= run.gpus <= 160:
            continue
        result = evaluate(run)
        if result.plan is None or getattr(result.plan, "cp", 1) > 1:
            continue
        unit = run.workload.shard(1).layer_params() * 2 / 1e9  # one layer's bf16 parameters, GB
        free = run.hardware().memory_bytes / 1e9 - result.memory_gb
        rows.append((free / unit, free, unit, result.memory_gb, result.error, run.name))
    lines = ["| row | planned GB | free GB | one layer GB | free in layers | error |", "|---|---|---|---|---|---|"]
    for units, free, unit, planned, error, name in sorted(rows)[:limit]:
        lines.append(f"| {name} | {planned:.1f} | {free:.1f} | {unit:.2f} | {units:.1f} | {100 * error:+.1f} % |")
    return "\n".join(lines)


def _line(what: str, errors: list[float]) -> str:
    from hybrid.planner.published import summary
    return summary(errors).line(what)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--nic"]:
        print(nic_what_if())
        return
    if args == ["--headroom"]:
        print(headroom_table())
        return
    if args:
        raise SystemExit(f"unknown arguments {args}: pass nothing, --nic or --headroom")
    print(rerun_table() + "\n")
    print(repeat_spread() + "\n")
    print(torch_version_ratios() + "\n")
    print(seventy_b_table())


if __name__ == "__main__":
    main()
