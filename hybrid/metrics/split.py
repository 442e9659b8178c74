"""The planner's prediction of where a run's step time goes, in the categories the runtime measures.

The runtime measures, per rank and step, the op trail's phases (hybrid/trail.py; printed every log
interval as "time split ..." by hybrid/fault/straggler.py): compute (forward + backward, time blocked in a
collective excluded), collectives (blocked in TP / DP / embedding collectives), pipeline waits (blocked on
pipeline messages: bubble and transfers), optimizer, other. With `--hardware PROFILE`, train.py prints the
planner's prediction of the same shares for the run's own layout once at the start (`predicted_split_line`).

The prediction for the average rank (the measured line is a mean over ranks), from `StepTime`:

    busy     = mean over pipeline ranks of the simulated compute of a rank (its stage costs, TP collectives
               included: they run in the compute stream), m micro-batches
    compute  = busy x compute / (compute + tp_comm)          (the busiest rank's ratio of matmul to TP time)
               + pipeline - makespan                          (ranks sharing a CPU's cores: the shared-compute
                                                              bound's excess, time a rank computes slower)
    collectives = busy x tp_comm / (compute + tp_comm) + dp_comm + other   (TP in the stages, DP, embedding / SP)
    pipeline = makespan - busy                                (the simulated bubble and messages)
    optimizer = optimizer;  shares = each / total
"""

from __future__ import annotations

from hybrid.planner import ActivationProfile, Cluster, Layout, Offload, Precision, Recompute, StepTime, Workload
from hybrid.planner import ZeroStage, evaluate
from hybrid.planner.layout import stage_layers
from hybrid.planner.ops import KernelProfile


def predicted_split(t: StepTime) -> dict[str, float]:
    """Shares of the predicted step (see the module docstring); they sum to 1."""
    busy = sum(t.run.busy) / len(t.run.busy)
    ratio = t.compute / (t.compute + t.tp_comm) if t.compute + t.tp_comm > 0 else 1.0
    contention = t.pipeline - t.run.makespan  # >= 0: pipeline = max(makespan, shared-compute bound)
    parts = {"compute": busy * ratio + contention, "collectives": busy * (1 - ratio) + t.dp_comm + t.other,
             "pipeline": max(0.0, t.run.makespan - busy), "optimizer": t.optimizer}
    total = sum(parts.values())
    return {k: v / total for k, v in parts.items()}


def run_layout(z, recompute: Recompute, sequence_parallel: bool, cfg, dims, batch,
               v: int, zero_bubble: bool = False) -> tuple[Workload, Layout]:
    """The planner's Workload and Layout for this train.py run (its ZeroConfig `z`; `zero_bubble`: the run's
    schedule splits each backward into B and W, ZB-H1 at v 1, ZBV at v 2)."""
    mixed = z.precision.value != "fp32"
    work = Workload(cfg, global_batch=batch.global_batch, seq_length=batch.seq_length,
                    precision=Precision.MIXED if mixed else Precision.FP32,
                    activations=ActivationProfile.KORTHIKANTI if mixed else ActivationProfile.FP32_FLASH,
                    fp32_grads=z.accumulate_fp32_grads, kernels=KernelProfile.EAGER)  # train.py's eager layers
    offload = (Offload.OPTIMIZER_AND_PARAMS if z.offload_params else
               Offload.OPTIMIZER if z.offload_optimizer else Offload.NONE)
    layout = Layout(tp=dims.tp, pp=dims.pp, dp=dims.dp, v=v, micro_batch=batch.micro_batch, zero=ZeroStage(z.stage),
                    offload=offload, recompute=recompute, sequence_parallel=sequence_parallel,
                    zero_bubble=zero_bubble)
    return work, layout


def zero_at_dp1(layout: Layout) -> tuple[Layout, str]:
    """(layout, note): ZeRO 1-3 at dp 1 runs -- each shard is the whole -- with ZeRO 0's bytes and passes, but the
    planner's Layout refuses it ("partitions nothing"), and the start-up lines said the running layout "cannot
    run". Priced as ZeRO 0, said so. Offload needs its stage: left to the planner's own words."""
    import dataclasses
    if layout.dp > 1 or layout.zero is ZeroStage.NONE or layout.offload is not Offload.NONE:
        return layout, ""
    return (dataclasses.replace(layout, zero=ZeroStage.NONE),
            f"ZeRO {int(layout.zero)} at dp 1 partitions nothing: priced as ZeRO 0")


def predicted_split_line(run, cfg, dims, batch, plan) -> str | None:
    """'planner: predicted ... s/step: compute a%, ...' for this run with its --hardware profile; None without
    one. Names the planner's stage split when it differs from the run's (the planner balances by FLOPs)."""
    if not run.training.hardware:
        return None
    from hybrid.planner.calibrate import load_hardware

    try:
        # ValueError: a model it does not describe
        work, layout = run_layout(run.zero, run.model.recompute, run.parallel.sequence_parallel, cfg, dims, batch,
                                  plan.v, plan.kind.splits_backward)
        layout, zero_note = zero_at_dp1(layout)
        hw = load_hardware(run.training.hardware, work.precision)
        t = evaluate(work, Cluster(gpus=dims.world, hw=hw), layout).time
    except ValueError as e:  # a model or layout the planner does not model (its message names why)
        return f"planner: no prediction for this run: {e}"
    s = predicted_split(t)
    ours, theirs = [len(st) for st in plan.stages], list(stage_layers(cfg, dims.pp, plan.v, batch.seq_length))
    note = f"; the planner's stages {theirs}, the run's {ours}" if ours != theirs else ""
    note += f"; {zero_note}" if zero_note else ""
    return (f"planner: predicted {t.total:.3g} s/step on {hw.name}: compute {s['compute']:.1%}, collectives "
            f"{s['collectives']:.1%}, pipeline waits {s['pipeline']:.1%} (bubble {t.bubble_fraction:.1%}), "
            f"optimizer {s['optimizer']:.1%}{note}")
