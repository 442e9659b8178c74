"""train.py's flags for a plan: the one mapping from the planner's decision (a `Layout` on a `Workload`) to the
flags scripts/train.py takes, in Megatron's names.

`hybrid plan --emit-args` prints them (as command-line words by train.py's own flag table,
hybrid/train/config.py: to_argv); `train.py --auto-parallel` sets them on its parsed flags (hybrid/train/args.py).
Either way train.py's own checks then judge them: the planner decides, the trainer checks what it is given.
"""

from __future__ import annotations

from hybrid.pipeline import ScheduleKind
from hybrid.planner.layout import Layout, Offload, Recompute, Workload, stage_layers

# the search enumerates the micro-batch over the divisors of global batch / dp, a loop as long as that number:
# 2**24 sequences (~8 s) is far beyond any published run (Llama 3: 2048-16384 sequences per step)
MAX_GLOBAL_BATCH = 2**24


def layout_flags(work: Workload, lay: Layout) -> dict[str, object]:
    """The flags a layout decides, as {argparse dest: value}: the sizes, the micro-batch, ZeRO, the pipeline
    split (uneven stages: the planner's exact split, with v chunks per rank; even ones: layers per virtual
    stage; ZBV: the schedule alone, which holds two chunks a rank), sequence parallelism, recomputation and offload. None / False: the flag's default (not given)."""
    flags: dict[str, object] = {
        "tensor_model_parallel_size": lay.tp, "pipeline_model_parallel_size": lay.pp,
        "micro_batch_size": lay.micro_batch, "zero_stage": int(lay.zero),
        "pipeline_layers_per_stage": None, "virtual_pipeline_model_parallel_size": None,
        "num_layers_per_virtual_pipeline_stage": None,
        "pipeline_schedule": lay.schedule.value if lay.zero_bubble else None}
    counts = stage_layers(work.model, lay.pp, lay.v, work.seq_length, work.pipeline_split)
    # Megatron's split (Workload.pipeline_split) may leave a stage only the embedding or the loss
    if work.pipeline_split is not None and 0 in counts:
        named = ", ".join("--" + k.replace("_", "-") for k in work.pipeline_split.flags())
        raise ValueError(f"the plan's pipeline split ({named}) leaves a stage with no transformer layer, which "
                         f"train.py does not run; drop those flags, or pick pp x v with a layer on every stage")
    interleaved = lay.v > 1 and lay.schedule is not ScheduleKind.ZBV  # --pipeline-schedule zbv fixes v = 2
    if len(set(counts)) > 1:  # uneven stages (first / last fewer): the planner's split, exactly
        flags["pipeline_layers_per_stage"] = ",".join(map(str, counts))
        flags["virtual_pipeline_model_parallel_size"] = lay.v if interleaved else None
    elif interleaved:
        flags["num_layers_per_virtual_pipeline_stage"] = work.model.num_layers // (lay.pp * lay.v)
    flags.update(sequence_parallel=lay.sequence_parallel,
                 recompute_granularity=None if lay.recompute is Recompute.NONE else lay.recompute.value,
                 offload_optimizer=lay.offload is not Offload.NONE,
                 offload_params=lay.offload is Offload.OPTIMIZER_AND_PARAMS)
    return flags


def workload_flags(work: Workload) -> dict[str, object]:
    """The flags of the workload a plan was made for: the batch, the sequence, and the number format. A
    mixed-precision plan is --bf16, whose gradients train.py (as Megatron-LM) accumulates and reduces in fp32 by
    default: a plan with fp32 gradients (Workload.fp32_grads, 2 + 4 + 12 bytes a parameter) needs no other flag, one
    with bf16 gradients (2 + 2 + 12, `hybrid plan --grad-reduce-in-bf16`) adds --grad-reduce-in-bf16, so train.py's
    grads_in_fp32 reads back the dtype the plan counted."""
    return {"global_batch_size": work.global_batch, "seq_length": work.seq_length, "bf16": work.precision.mixed,
            "grad_reduce_in_bf16": work.precision.mixed and not work.fp32_grads}


def plan_flags(work: Workload, lay: Layout, model: str | None = None) -> dict[str, object]:
    """Everything train.py needs to run `lay` on `work` (with --model when given), in the order printed."""
    flags = {} if model is None else {"model": model}
    lay_flags = layout_flags(work, lay)
    sizes = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size")
    flags.update({k: lay_flags.pop(k) for k in sizes})
    wl = workload_flags(work)
    flags.update({k: wl.pop(k) for k in ("global_batch_size", "seq_length")})
    return {**flags, **lay_flags, **wl}
