"""Round 24 (planner24d, issue 26): KempnerForge's published peak memory against the plan's, term by term.

    python -m hybrid.planner.published24d_kempner_memory   # the tables of docs/planner/round24-kempner-memory.md

KempnerForge's `mem=` (every row's "Mem/GPU") is `torch.cuda.max_memory_allocated() / 2**30` (kempnerforge/metrics/
memory.py), GiB; the plan's memory is GB (1e9 bytes): `published_gb` converts. Through round 24 the plan under-
predicted the TP 4 x FSDP rows by 21-75 GB (the 70B weak-scaling rows: 36.1 -> 13.8 GB planned from 32 to 160 GPUs
where the logs say 100.1 -> 89.0). Four things the runs' own source holds (KempnerForge at 3ad9d9a, the weak-scaling
runs' commit; torch's FSDP2), each now a Workload setting the KempnerForge rows state (published15._kempner_run):

1. `unsharded_grad_accumulation` (a general FSDP2 mechanism): scripts/train.py wraps every micro-batch but the last
   in `maybe_no_sync` (kempnerforge/training/grad.py: `model.set_requires_gradient_sync(False)`), so FSDP2 skips the
   reduce-scatter and keeps each parameter's unsharded gradient; with `MixedPrecisionPolicy(param_dtype=bf16,
   reduce_dtype=float32)` it upcasts it to accumulate (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
   `to_accumulated_grad_if_needed`, `_fsdp_param_group.post_backward`): 4 bytes x the rank's whole Psi (70.6 GB on
   a 70B TP 4 rank), whatever FSDP's size, where the plan held 4 Psi / Nd. The sharded gradients do not exist then
   (`optimizer.zero_grad()` set them to None). torchtitan reduce-scatters every micro-batch instead (by choice:
   pytorch/torchtitan#292, #1710), so its rows keep the default (False); TorchTNT's AutoUnit does the same as
   KempnerForge (meta-pytorch/tnt#1057 measured "26B model on 16 GPUs: sharded gradients = 3.25 GB/rank, unsharded
   = ~52 GB/rank").
2. `adam_master_copy=False`: the model is cast to bf16 before the optimizer is built (kempnerforge/distributed/
   parallel.py `build_parallel_model`: `model.to(dtype=param_dtype)`), so torch's fused AdamW keeps two bf16 moments
   and no master: K = 4, not the 6 round 15 planned. The logs show it: the first step's peak has no optimizer state
   (made in step 1's `optimizer.step()`), the second's has, and their difference is the moments (`LOG_PEAKS`).
3. `bf16_cross_entropy`: the loss is `F.cross_entropy` on the bf16 logits (kempnerforge/training/loss.py, `loss_fn=
   'cross_entropy'`, `ce_chunk_size=0` in every log's JobConfig): 2 + 2 bytes a logit kept (the logits, which the
   trainer's `logits` keeps referenced through the backward, and the bf16 log-softmax), 2 + 2 made by its backward,
   where the planner's t = 1 loss upcasts to fp32 (6 and 8).
4. `gathered_logits` in memory: the TP head's `output_layouts=Replicate()` gives every TP rank all b s V logits and
   the loss over them (round 20 priced its time only; the memory stayed V / t).

No constant is fitted: every term is bytes the source names. The families report (`python -m
hybrid.planner.families`) does not move: the settings are memory-only and no row is rejected.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from hybrid.planner.layout import Cluster, Workload
from hybrid.planner.predicted_memory import plan_memory
from hybrid.planner.published import PublishedRun
from hybrid.planner.published15 import (KEMPNER_ROWS, KEMPNER_VALIDATION_ROWS, KEMPNER_WEAK_ROWS, kempner_runs,
                                        kempner_validation_runs, kempner_weak_runs)
from hybrid.planner.published_more import evaluate

GIB = 2**30
GB = 1e9
# The settings in the order the tables add them: (column, the Workload fields before the change)
STEPS = (("+ unsharded fp32 grads", {"unsharded_grad_accumulation": False}),
         ("+ AdamW, no master", {"adam_master_copy": True}),
         ("+ bf16 loss", {"bf16_cross_entropy": False}),
         ("+ gathered logits", {"gathered_logits": False}))
# (row, log at its commit, dp, peak GiB of step 1, of step 2): step 1's peak comes before its optimizer.step()
# makes the AdamW states, step 2's after, so their difference is the states (benchmarks/weak_scaling_160gpu/results/)
LOG_PEAKS = (("70B, 8 H200, TP 4 x FSDP 2", "preflight_70b_008gpu_tp4_fsdp2.log at 17248f8", "70B", 8, 94.2, 128.5),
             ("70B, 32 H200, TP 4 x FSDP 8", "70b_032gpu_tp4_fsdp8.log at e9f9189", "70B", 32, 84.6, 93.2),
             ("13B, 32 H200, TP 4 x FSDP 8", "13b_032gpu_tp4_fsdp8.log at e9f9189", "13B", 32, 34.3, 36.2))


def published_gb(gib: float) -> float:
    """KempnerForge's `mem=` GiB as the plan's GB."""
    return gib * GIB / GB


def rows() -> list[tuple[PublishedRun, float]]:
    """Every KempnerForge row and its published peak, GB: the 1-32 GPU sweep, the weak scaling, the validation."""
    published = ([r[-2] for r in KEMPNER_ROWS] + [r[-2] for r in KEMPNER_WEAK_ROWS]
                 + [r[-2] for r in KEMPNER_VALIDATION_ROWS])
    runs = kempner_runs() + kempner_weak_runs() + kempner_validation_runs()
    return [(run, published_gb(gib)) for run, gib in zip(runs, published)]


def _memory_gb(run: PublishedRun, layout, work: Workload) -> float:
    return plan_memory(work, Cluster(run.gpus, run.hardware()), layout).peak.total / GB


def ladder(run: PublishedRun) -> list[float]:
    """The row's planned peak, GB: with none of the four settings (the plan before round 24), then adding each in
    STEPS' order; the last is the plan as shipped. The layout is the row's plan (its search space is pinned)."""
    layout = evaluate(run).plan.layout
    undone = {k: v for _, fields in STEPS for k, v in fields.items()}
    out = [_memory_gb(run, layout, replace(run.workload, **undone))]
    for i in range(len(STEPS)):
        still = {k: v for _, fields in STEPS[i + 1:] for k, v in fields.items()}
        out.append(_memory_gb(run, layout, replace(run.workload, **still)))
    return out


def table() -> str:
    lines = ["| row | published GB | plan before | " + " | ".join(c for c, _ in STEPS)
             + " | error before | error after |", "|---" * (5 + len(STEPS)) + "|"]
    for run, pub in rows():
        steps = ladder(run)
        lines.append(f"| {run.name} | {pub:.1f} | " + " | ".join(f"{m:.1f}" for m in steps)
                     + f" | {100 * (steps[0] / pub - 1):+.1f} % | {100 * (steps[-1] / pub - 1):+.1f} % |")
    return "\n".join(lines)


def memory_errors(after: bool) -> list[float]:
    """planned / published - 1 on every KempnerForge row, the shipped plan (after) or the plan before round 24."""
    return [ladder(run)[-1 if after else 0] / pub - 1 for run, pub in rows()]


def summary(what: str, errors: list[float]) -> str:
    under = sum(e < -0.15 for e in errors)
    return (f"{what}: {len(errors)} rows, signed mean {100 * statistics.fmean(errors):+.1f} %, median |error| "
            f"{100 * statistics.median(abs(e) for e in errors):.1f} %, spread {100 * min(errors):+.1f} % to "
            f"{100 * max(errors):+.1f} %, {sum(abs(e) <= 0.15 for e in errors)} within 15 %, {under} under by more "
            f"than 15 %")


def optimizer_states_gb(size: str, gpus: int, k: int) -> float:
    """A weak-scaling row's AdamW states a rank at K bytes a parameter, GB: K x Psi / Nd (TP 4 x FSDP gpus / 4)."""
    run = next(r for r in kempner_weak_runs() if r.name.startswith(f"KempnerForge {size} weak scaling, {gpus} H200"))
    psi = evaluate(run).plan.memory.peak.parameters
    return k * psi / (gpus // 4) / GB


def log_table() -> str:
    lines = ["| row | log | step 1 peak GiB | step 2 peak GiB | difference GB | AdamW states at K = 4 GB "
             "| at K = 6 GB |", "|---|---|---|---|---|---|---|"]
    for name, log, size, gpus, first, second in LOG_PEAKS:
        lines.append(f"| {name} | {log} | {first} | {second} | {published_gb(second - first):.1f} | "
                     f"{optimizer_states_gb(size, gpus, 4):.1f} | {optimizer_states_gb(size, gpus, 6):.1f} |")
    return "\n".join(lines)


def main() -> None:
    print(table())
    print()
    print(summary("KempnerForge peak memory, plan before round 24", memory_errors(after=False)))
    print(summary("KempnerForge peak memory, plan after", memory_errors(after=True)))
    print()
    print(log_table())


if __name__ == "__main__":
    main()
