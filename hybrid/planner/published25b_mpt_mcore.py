"""Issue 26, round 25 (planner25b): the small-model and A100 40GB misses -- MosaicML's MPT rows and Megatron-Core's
1.7B / 7.1B -- read against the code and scripts the runs executed.

    python -m hybrid.planner.published25b_mpt_mcore              # every table of docs/planner/round25-mpt-mcore.md
    python -m hybrid.planner.published25b_mpt_mcore --families   # + the families report under the BACKWARD_POST what-if

Sources, each read at the commit named (mirrors fetched with the `fetch` tool):

* mosaicml/examples 9fa3ceb9 (2023-04-04, "updt throughput tables", "add 40gb tput"): the commit that added the
  A100 40GB table llm-foundry's README still carries (061f2c7, c90b9b3), with its examples/llm/throughput/
  submit_benchmarks.py and sweep.sh (`GIT_COMMIT="release/v0.0.4"`, image
  `mosaicml/pytorch:1.13.1_cu117-python3.10-ubuntu20.04`) and examples/llm/requirements.txt (`mosaicml==0.13.3`,
  `torch==1.13.1`, `triton==2.0.0.dev20221202`, `flash-attn==0.2.8`).
* mosaicml/composer v0.13.3 / v0.13.4 (composer/trainer/dist_strategy.py, trainer.py): what the fsdp_config keys the
  script sets become.
* NVIDIA/Megatron-LM f2e5db4 (2024-07-15, the weak-scaling table's commit): README.md, megatron/training/
  training.py `num_floating_point_operations`, megatron/training/arguments.py, megatron/core/tensor_parallel/
  cross_entropy.py, megatron/core/models/common/language_module/language_module.py.

Landed: Workload.megatron_unfused_loss on the nine Megatron-Core rows (the loss their code ran). What-if, not landed:
Composer's BACKWARD_POST prefetch priced as an exposed backward all-gather on every MosaicML row.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator

MPT_40GB_SOURCE = ("mosaicml/examples 9fa3ceb9 examples/llm/throughput/{README.md, submit_benchmarks.py, sweep.sh} "
                   "+ examples/llm/requirements.txt; mosaicml/composer v0.13.3 composer/trainer/dist_strategy.py")
MCORE_CODE_SOURCE = ("NVIDIA/Megatron-LM f2e5db4: megatron/training/{training.py, arguments.py}, "
                     "megatron/core/tensor_parallel/cross_entropy.py")

# What the A100 40GB table's runs executed, key by key, and where each is read (the table's columns say only
# "bf16 | PURE | FULL_SHARD | activation checkpointing | cpu offload False").
MPT_40GB_STACK = (
    ("Composer", "0.13.3", "examples/llm/requirements.txt at 9fa3ceb9 (`mosaicml==0.13.3`); the table's precision "
     "`bf16` is mapped to amp_bf16 up to 0.13.5 (trainer.py: \"'bf16' is deprecated ... Use 'amp_bf16'\") and "
     "refused from 0.14.0 (`Precision('bf16')`); llm-foundry's first setup.py as llm-foundry (300cc5c5) pins "
     "0.13.4, which still maps it"),
    ("torch", "1.13.1", "requirements.txt and sweep.sh's image mosaicml/pytorch:1.13.1_cu117"),
    ("precision", "bf16 = amp_bf16 (autocast)", "submit_benchmarks.py `parameters['precision'] = precision` ('bf16'); "
     "Composer 0.13.3 maps it to AMP_BF16"),
    ("fsdp mixed_precision", "PURE: param, reduce and buffer dtype bf16", "--fsdp_config_mixed_precision default "
     "'PURE'; Composer get_mixed_precision"),
    ("limit_all_gathers", "True", "submit_benchmarks.py mod_parameters: `parameters['fsdp_config']"
     "['limit_all_gathers'] = True`; Composer 0.12+ passes it to torch 1.13.1's FSDP"),
    ("activation_checkpointing_reentrant", "False (CheckpointImpl.NO_REENTRANT)", "submit_benchmarks.py sets it"),
    ("backward_prefetch", "BACKWARD_POST", "not set by the script or the yamls: Composer's default "
     "(`fsdp_config.get('backward_prefetch', 'BACKWARD_POST')`, every Composer from 0.11 to 0.19)"),
    ("forward_prefetch", "False", "Composer's default"),
    ("attention", "attn_impl triton (triton 2.0.0.dev20221202)", "submit_benchmarks.py `--attn_impl` default "
     "'triton'"),
    ("measured", "speed_monitor window 10 of max_duration 30ba, eval off", "the yamls' callbacks and mod_parameters"),
)

# sweep.sh at 9fa3ceb9: the 40GB rows the brief names and the command line that produced each (one command, several
# GPU counts: the rows it yields differ in nothing but the GPU count)
MPT_40GB_COMMANDS = (
    ("1b", "-g 32 64 128 --microbatch_size 10 --accum 1", (32, 64, 128)),
    ("70b", "-g 64 --microbatch_size 2 --accum 1", (64,)),
    ("70b", "-g 128 --microbatch_size 4 --accum 1", (128,)),
    ("13b", "-g 8 --microbatch_size 4 --accum 16", (8,)),
)


def _runs() -> dict:
    from hybrid.planner.families import all_published_runs
    return {r.name: r for r in all_published_runs()}


# ---- landed: Megatron-Core's unfused loss --------------------------------------------------------------------------
def mcore_loss_table() -> str:
    """Each Megatron-Core weak-scaling row planned with the FUSED profile's five-pass loss (before this round) and
    with the loss its code ran (Workload.megatron_unfused_loss, as shipped now)."""
    from hybrid.planner.published_more import mcore_weak_runs
    lines = ["| row | loss (logits a GPU a step) | five-pass loss | six-pass loss (shipped) | step s: before -> after |",
             "|---|---|---|---|---|"]
    for run in mcore_weak_runs():
        before_run = replace(run, workload=replace(run.workload, megatron_unfused_loss=False))
        before, after = before_run.predict(), run.predict()
        tokens = run.workload.global_batch * run.workload.seq_length / (run.gpus // _tp_pp(after))
        logits = tokens * run.workload.model.vocab_size / after.layout.tp
        lines.append(f"| {run.name} | {logits / 1e9:.2f}e9 | {100 * before_run.throughput_error(before):+.1f} % | "
                     f"{100 * run.throughput_error(after):+.1f} % | {before.seconds:.4f} -> {after.seconds:.4f} |")
    return "\n".join(lines)


def _tp_pp(plan) -> int:
    return plan.layout.tp * plan.layout.pp


def mcore_flops_check() -> str:
    """Megatron's `num_floating_point_operations` at f2e5db4 (training.py:73), per token, for the 1.7B, against the
    planner's count: the table's TFLOP/s and the plan's use one formula (logits 6 V h in, the embedding out)."""
    from hybrid.planner.published_more import MCORE_SEQ, MCORE_VOCAB, mcore_weak_runs
    run = mcore_weak_runs()[0]
    layers, h, s, v = 24, 2048, MCORE_SEQ, MCORE_VOCAB
    per_token = 12 * layers * h * h * ((1 + 1 + s / h) + 4 + v / (2 * layers * h))
    logits = 6 * v * h
    plan = run.predict()
    tokens_a_gpu = run.workload.global_batch * s / run.gpus
    planner = plan.tflops_per_gpu * 1e12 * plan.seconds / tokens_a_gpu
    return (f"Megatron-Core 1.7B, FLOPs a token: Megatron's formula {per_token:.4e} (logits {logits:.3e}, "
            f"{100 * logits / per_token:.1f} %), the planner's {planner:.4e}")


# ---- what-if: Composer's BACKWARD_POST ------------------------------------------------------------------------------
def _is_mosaic(work, mosaic: list) -> bool:
    return any(work == w for w in mosaic)


@contextmanager
def backward_post_prefetch() -> Iterator[None]:
    """What-if: inside the block every MosaicML row runs FSDP1's BACKWARD_POST, as Composer's default does: the
    next unit's all-gather is issued after the current unit's gradient computation (torch's BackwardPrefetch
    docstring: "the next all-gather is reordered to be before the current reduce-scatter"), so the unit's backward
    waits for it -- each backward all-gather serial with the compute -- while the reduce-scatter still runs under
    the next unit's backward. Priced in time._stage_cost's backward: the all-gather's seconds (the forward's
    gather of the same bytes) move from the overlapped ZeRO 3 traffic to the serial term."""
    from hybrid.planner import time as T
    from hybrid.planner.families import all_published_runs, family_of
    mosaic = [r.workload for r in all_published_runs() if family_of(r.source).startswith("MosaicML")]
    shipped = T._stage_cost

    def post(ctx, cost, n, first, last):
        from hybrid.planner.layout import ZeroStage
        if ctx.layout.zero is not ZeroStage.PARAMETERS or ctx.layout.dp == 1 or not _is_mosaic(ctx.work, mosaic):
            return shipped(ctx, cost, n, first, last)
        return _stage_cost_post(T, ctx, cost, n, first, last)
    T._stage_cost = post
    try:
        yield
    finally:
        T._stage_cost = shipped


def _stage_cost_post(T, ctx, cost, n: int, first: bool, last: bool):
    """time._stage_cost with the backward all-gather serial (BACKWARD_POST); the rest as shipped."""
    edge = T._edge_cost(ctx, first, last)
    params = n * ctx.shard.layer_params() + (ctx.shard.embedding_params() if first else 0) + (
        ctx.shard.head_params(shares_embedding=first) if last else 0)
    glue_f, glue_b = T._executor_glue(ctx)
    copy_f, copy_b = T._zero3_copies(ctx, n * ctx.shard.layer_params(), params - n * ctx.shard.layer_params())
    edge = T._Cost(edge.forward + glue_f + copy_f, edge.backward + T._grad_accumulation(ctx, params) + glue_b + copy_b,
                   edge.forward_comm, edge.backward_comm, edge.wait)
    f_comp = n * cost.forward_compute + edge.forward_compute
    b_comp = n * cost.backward_compute + edge.backward_compute
    f_tp = n * cost.forward_comm + edge.forward_comm
    b_tp = n * cost.backward_comm + edge.backward_comm
    dp_f, dp_b, share, replica = T._chunk_dp_overlap(ctx, n * ctx.shard.layer_params())
    gather = dp_f  # the backward's all-gather moves the forward's bytes (dp_microbatch_ledger)
    contended = ctx.layout.tp > 1 and not ctx.dp_group.spans_nodes
    send = T._pp_send_on_dp_link(ctx)
    loss = ctx.cluster.hw.overlap_cost * share
    f, f_hidden = T._overlapped(f_comp, f_tp, dp_f, n, contended, 0.0 if last else send, loss)
    b, b_hidden = T._overlapped(b_comp, b_tp + gather, dp_b - gather, n, contended, 0.0 if first else send, loss,
                                replica)
    lost = (f - T._overlapped(f_comp, f_tp, dp_f, n, contended, 0.0 if last else send)[0]
            + b - T._overlapped(b_comp, b_tp + gather, dp_b - gather, n, contended, 0.0 if first else send, 0.0,
                                replica)[0])
    parts = (cost.forward + cost.backward).scaled(n) + edge.forward + edge.backward
    return T._StageCost(forward=f, backward=b, compute=f_comp + b_comp, comm=f_tp + b_tp, hidden=f_hidden + b_hidden,
                        parts=parts, lost=lost, wait=n * cost.wait + edge.wait, forward_compute=f_comp)


# The rows the brief names, and their siblings that fit (same model on the other card / GPU count)
NAMED = ("MPT-70b, s 2048, 64 A100 40GB, FSDP z3, b2 x 1, AC", "MPT-70b, s 2048, 128 A100 40GB, FSDP z3, b4 x 1, AC",
         "MPT-70b, s 2048, 32 A100, FSDP z3, b2 x 16, AC", "MPT-30b, s 8192, 8 A100, FSDP z3, b1 x 21, AC",
         "MPT-13b, s 2048, 8 A100 40GB, FSDP z3, b4 x 16, AC", "MPT-13b, s 1024, 8 A100 40GB, FSDP z3, b8 x 16, AC",
         "MPT-1b, s 2048, 32 A100 40GB, FSDP z3, b10 x 1", "MPT-1b, s 2048, 64 A100 40GB, FSDP z3, b10 x 1",
         "MPT-1b, s 2048, 128 A100 40GB, FSDP z3, b10 x 1")


def backward_post_rows() -> str:
    """The named MosaicML rows as shipped and under backward_post_prefetch."""
    runs = _runs()
    shipped = {name: runs[name].throughput_error(runs[name].predict()) for name in NAMED}
    with backward_post_prefetch():
        post = {name: runs[name].throughput_error(runs[name].predict()) for name in NAMED}
    lines = ["| row | as shipped | BACKWARD_POST (what-if) |", "|---|---|---|"]
    lines += [f"| {n} | {100 * shipped[n]:+.1f} % | {100 * post[n]:+.1f} % |" for n in NAMED]
    return "\n".join(lines)


def same_command_table() -> str:
    """The 1B rows sweep.sh ran from one command line: the same configuration at 32, 64 and 128 GPUs."""
    runs = _runs()
    lines = ["| row | published T/s/GPU | planned | error |", "|---|---|---|---|"]
    for gpus in (32, 64, 128):
        run = runs[f"MPT-1b, s 2048, {gpus} A100 40GB, FSDP z3, b10 x 1"]
        plan = run.predict()
        lines.append(f"| {run.name} | {run.published:.0f} | {plan.tokens_per_s / run.gpus:.0f} | "
                     f"{100 * run.throughput_error(plan):+.1f} % |")
    return "\n".join(lines)


def stack_table() -> str:
    lines = ["| key | what ran | read in |", "|---|---|---|"]
    lines += [f"| {k} | {v} | {where} |" for k, v, where in MPT_40GB_STACK]
    return "\n".join(lines)


def families_what_if() -> str:
    from hybrid.planner.families import all_rows, family_table, slice_table
    with backward_post_prefetch():
        rows = all_rows()
    return "\n\n".join(["under backward_post_prefetch:", family_table(rows), slice_table(rows)])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    print(stack_table(), "", same_command_table(), "", backward_post_rows(), "", mcore_flops_check(), "",
          mcore_loss_table(), sep="\n")
    if "--families" in argv:
        print("", families_what_if(), sep="\n")


if __name__ == "__main__":
    main()
