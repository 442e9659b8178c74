"""The training run on one rank, after every check has passed: build the mesh, the model chunks, the
pipeline runner and the ZeRO optimizer, then step. Everything it is asked to do is one `RunConfig`
(hybrid/train/config.py)."""

from __future__ import annotations

import time
from datetime import timedelta

import torch

from hybrid.checkpoint.run import RunCheckpoints
from hybrid.compress.args import describe as compress_line
from hybrid.compress.reduction import build as compress_reduction
from hybrid.compress.reduction import link_line
from hybrid.compress.reduction import owners as compress_owners
from hybrid.data import DataSource
from hybrid.data.source import train_samples, valid_samples
from hybrid.diloco.run import LocalUpdates
from hybrid.diloco.run import startup_line as diloco_line
from hybrid.fault.session import FaultTolerance
from hybrid.mesh import Mesh
from hybrid.metrics.loop import RunMetrics
from hybrid.metrics.peak_memory import current_rss_bytes
from hybrid.metrics.split import predicted_split_line
from hybrid.moe.runtime import log_fields as moe_log_fields
from hybrid.moe.runtime import owners as moe_owners
from hybrid.pipeline import build_schedule
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.pipeline.timeline import chrome_trace, write_chrome_trace
from hybrid.tp import ParallelRNG, TPContext
from hybrid.tp.random import PP_SEED_STRIDE
from hybrid.train.config import PipelinePlan, RunConfig
from hybrid.train import explain
from hybrid.train.evaluate import run_evaluations
from hybrid.train_step import LocalForwardBackward, train_step
from hybrid.zero import Precision, ZeroOptimizer
from models import Recompute, build_pipeline_chunks
from models.common import set_context_parallel


def log0(mesh: Mesh, msg: str) -> None:
    if mesh.rank == 0:
        print(msg, flush=True)


def build_runner(run: RunConfig, mesh: Mesh, tp: TPContext):
    """The model chunks on this rank and what runs forward/backward over them."""
    dims, plan, batch, setup = mesh.dims, run.parallel.pipeline, run.training.batch, run.model
    cfg = setup.arch
    model = build_pipeline_chunks(cfg, tp, mesh.coords.pp, dims.pp, plan.v, stages=plan.stages,
                                  seed=run.training.seed, recompute=setup.recompute,
                                  stage_ids=[plan.kind.placement.stage(mesh.coords.pp, c, dims.pp)
                                             for c in range(plan.v)],
                                  moe=expert_context(run, mesh))  # hybrid/moe; None for a dense model
    model = set_context_parallel(model.to(mesh.device), run.cp.context(mesh))  # hybrid/cp; None without CP
    if setup.compile:
        compile_blocks(model)
    if setup.init_weights:
        from models.hf_io import load_hf_checkpoint
        for chunk in model:
            load_hf_checkpoint(chunk, setup.init_weights, mesh.tp.rank)
    if dims.pp == 1 and plan.v == 1:
        return model, LocalForwardBackward(model[0], mesh.device, record_timeline=bool(run.training.timeline))
    seq = batch.seq_length // dims.cp // (dims.tp if run.parallel.sequence_parallel else 1)  # CP: T/cp tokens a rank
    schedule = build_schedule(plan.kind, dims.pp, batch.num_micro_batches, plan.v)[mesh.coords.pp]
    io = StageIO((batch.micro_batch, seq, cfg.hidden_size), run.zero.precision.dtype)  # activations in compute dtype
    return model, PipelineExecutor(model, schedule, mesh.pp, io, mesh.device,
                                   record_timeline=bool(run.training.timeline), placement=plan.kind.placement)


def expert_context(run: RunConfig, mesh: Mesh):
    """The MoE layers' flags and expert-parallel group (hybrid/moe); None for a dense model."""
    if run.moe is None:
        return None
    from hybrid.moe.layer import ExpertContext
    return ExpertContext(run.moe, mesh.ep, mesh.etp, mesh.cp, mesh.tp_cp)


def expert_layout(run: RunConfig):
    """How the expert layers fold the ranks (hybrid/moe/parallel.py); None for a dense model."""
    if run.moe is None:
        return None
    from hybrid.moe.parallel import ExpertLayout
    return ExpertLayout(run.parallel.dims, run.moe.expert_parallel, run.moe.expert_tensor_parallel)


def compile_blocks(chunks, backend: str = "inductor") -> None:
    """torch.compile each Transformer block (torchtitan compiles per block too: one graph, reused by every layer of
    the same shape). The method, not the module call: hooks (ZeRO's parameter waits, the fault trail) stay eager
    around it. Measured on an H200 (docs/results/gpu_h200.md): a 1.2B Llama's forward + backward 19 % faster.

    With recomputation (models/common.py maybe_checkpoint): `--recompute-granularity selective-op` has the block's
    forward compiled, its checkpoint traced inside it (torchtitan's order: SAC per block, then compile per block; the
    op-level policy then picks from the traced graph's ops); full and selective have the block's body (`block.block`)
    compiled and the checkpoint eager around it (full: it runs the compiled body in forward and again in the
    recomputation, replaying the dropout streams; selective: the attention core's checkpoint inside the body is a
    graph break) -- an eager checkpoint holds what a traced one cannot: the streams' replay and the TP collectives.
    """
    from hybrid.zero.engine import block_modules
    for chunk in chunks:
        for block in block_modules(chunk):
            name = "forward" if block.recompute is Recompute.SELECTIVE_OP else "block"
            setattr(block, name, torch.compile(getattr(block, name), backend=backend))


def run(run: RunConfig, data: DataSource, device: torch.device) -> None:
    """Train on this rank: the mesh, the model, the optimizer, the features around the step, then the steps."""
    dims, plan, batch = run.parallel.dims, run.parallel.pipeline, run.training.batch
    cfg, seed = run.model.arch, run.training.seed
    baseline = current_rss_bytes()  # before the model: the planner's memory line adds it on CPU (explain.py)
    experts = expert_layout(run)  # MoE: the expert layers' ep and edp groups (hybrid/moe/parallel.py)
    mesh = Mesh.build(dims, device=device, timeout=timedelta(minutes=run.parallel.timeout_minutes),
                      expert_groups=experts.groups() if experts is not None else None)
    # The default generators (CPU and every CUDA device), as Megatron's _set_random_seed: seed + 100 * pp_rank.
    # Training draws only from explicit generators (data, init, the dropout streams), but the default one is
    # checkpointed for whatever else draws from it -- unseeded it starts at a per-process value, and a resumed
    # run's saved state would differ from an uninterrupted run's.
    torch.manual_seed(seed + PP_SEED_STRIDE * mesh.coords.pp)
    tp = TPContext(mesh.tp, sequence_parallel=run.parallel.sequence_parallel,
                   rng=ParallelRNG(seed, mesh.coords.tp, mesh.coords.pp, mesh.device))  # dropout streams
    model, runner = build_runner(run, mesh, tp)
    opt_cfg = run.optimizer
    local = LocalUpdates.build(run.diloco, mesh, run.compress.simulated_dp_bandwidth)  # hybrid/diloco: no-op if off
    reduction = compress_reduction(run.compress, local.mesh, run.zero)  # hybrid/compress: None unless compressing
    optimizer = ZeroOptimizer(model, local.mesh, run.zero, opt_cfg, reduction)  # stage 0 = plain DP; also syncs
    if isinstance(runner, PipelineExecutor):
        runner.before_weight = optimizer.gather_chunk  # zero-bubble W under ZeRO-3: the chunk's weights gathered
    log0(mesh, _header(run, model, optimizer, device))
    if optimizer.shm_gather_declined:  # the pair's set-up fell back (/dev/shm full, two hosts): said, not silent
        log0(mesh, f"zero: the shared-memory gather (--shm-gather) is not used, gloo's gather runs: "
                   f"{optimizer.shm_gather_declined}")
    ft = FaultTolerance.start(run.fault, mesh, model, runner, optimizer, run.training.log_interval,
                              run.metrics.timing_log_interval)  # hybrid/fault
    tokens_per_step = batch.global_batch * batch.seq_length
    metrics = RunMetrics.start(run, cfg, batch, mesh)  # hybrid/metrics: FLOPs, MFU, TensorBoard, JSON lines
    log0(mesh, metrics.header())
    for line in feature_lines(run, local):  # hybrid/diloco's and hybrid/compress's start-up lines
        log0(mesh, line)
    if mesh.rank == 0 and (line := predicted_split_line(run, cfg, dims, batch, plan)):  # with --hardware
        log0(mesh, line)
    saved = local.checkpointed(optimizer, run.checkpoint)  # hybrid/diloco: starts the outer loop; replica r > 0's keys
    ckpt = RunCheckpoints(run.checkpoint, mesh, model, saved, tp.rng, run_info(run),
                          owners={"fault.": ft, **moe_owners(model), **local.owners(),
                                  **compress_owners(reduction)})  # every owner of state
    start, consumed = ckpt.resume()
    data = resumed_data(run, data, start, consumed)  # a resume at a smaller global batch reads on
    if mesh.rank == 0:  # model, weights, data, schedule, the planner's figures; on resume what changed
        for line in explain.startup_lines(run, run_info(run), data, start, consumed, device, baseline):
            print(line, flush=True)
    ft.check_weights()  # the NaN guard: NaN/inf in loaded weights is one line now, not skipped steps later
    train_iters, log_interval, z = run.training.train_iters, run.training.log_interval, run.zero
    it, loss = start - 1, float("nan")
    sharding = run.cp.sharding(mesh.cp.rank)
    t0, since = time.perf_counter(), start  # the interval's clock and its first step (a resumed run's is not 0)
    for it in range(start, train_iters):
        ft.begin_iteration(it)
        batches = data.batches(consumed, batch, mesh.coords.dp)  # a pure function of the samples consumed so far
        if it == start and mesh.rank == 0 and (line := sharding.no_documents_line(batches)):
            print(line, flush=True)  # a reset flag that finds no document would change nothing, silently
        batches = sharding.batches(batches)  # this CP rank's tokens (+ packed documents' positions): hybrid/cp/data.py
        loss = train_step(model, batches, ft.optimizer, mesh, lr=opt_cfg.lr_at(it), runner=ft.runner)
        local.after_step(it)  # DiLoCo's outer step every H steps (hybrid/diloco)
        ft.end_iteration(it)
        if (it + 1) % log_interval == 0 or it + 1 == train_iters:
            dt = (time.perf_counter() - t0) / (it + 1 - since)  # the steps it timed: fewer after a resume or at the end
            rep = optimizer.last_report
            extra = f" | grad norm {rep.grad_norm:.3f}" if rep.grad_norm is not None else ""
            if z.precision is Precision.FP16:
                extra += f" | loss scale {rep.loss_scale:g} | skipped {optimizer.skipped_steps}"
            moe_line, moe_values = moe_log_fields(model, mesh, batch.num_micro_batches * log_interval,
                                                  expert_layout(run))  # collective; '' for a dense model
            fields = moe_line + metrics.log_interval(it + 1, dt, loss, opt_cfg.lr_at(it), rep, optimizer.skipped_steps,
                                                     extra=moe_values,
                                                     consumed=consumed + batch.global_batch)  # collective; this step's
            log0(mesh, f" iteration {it + 1:>6}/{train_iters} | lm loss {loss:.4f} | "
                       f"lr {opt_cfg.lr_at(it):.3e}{extra} | {dt * 1e3:8.1f} ms/iter | {tokens_per_step / dt:9.0f} tokens/s"
                       f"{fields}")
            t0, since = time.perf_counter(), it + 1
        t_eval = time.perf_counter()
        metrics.write_eval(it + 1, run_evaluations(run.data, model, runner, mesh, data, batch, optimizer, it + 1,
                                                   sharding=sharding, train_iters=train_iters))
        t0 += time.perf_counter() - t_eval  # ms/iter counts training only
        consumed += batch.global_batch
        if ckpt.after_step(it + 1, consumed):  # --exit-signal-handler: SIGTERM, saved
            break
    if line := local.finish():  # hybrid/diloco: an outer all-reduce still in flight waited for; the link's line
        log0(mesh, line)
    elif local.cfg is None and (line := link_line(reduction)):  # --simulated-dp-bandwidth: asked for and slept
        log0(mesh, line)
    ckpt.finish(it + 1, consumed)
    ft.stop()
    last = it + 1  # the last completed step: --train-iters, or earlier after --exit-interval / SIGTERM
    metrics.write_eval(last, run_evaluations(run.data, model, runner, mesh, data, batch, optimizer, last, final=True,
                                            sharding=sharding, train_iters=train_iters))
    metrics.close()
    if run.training.timeline and last > start:
        save_timeline(run.training.timeline, runner, mesh, plan)
    elif run.training.timeline:  # a finished run started again: its trace would be empty, and replace the last one
        log0(mesh, f"timeline: {run.training.timeline} not written (no step ran; a file there is left as it was)")
    log0(mesh, f"done: final lm loss {loss:.4f}" if last > start else  # no step ran: no loss to report, not NaN
         f"done: no iteration to train (the checkpoint is at iteration {start}, --train-iters {train_iters})")


def _header(run: RunConfig, model, optimizer: ZeroOptimizer, device: torch.device) -> str:
    """The two start-up lines: the model and the layout; ZeRO and precision."""
    dims, plan, batch, cfg = run.parallel.dims, run.parallel.pipeline, run.training.batch, run.model.arch
    local = sum(p.numel() for p in model.parameters())
    pipe = (f" x pp {dims.pp} ({plan.kind.value}{f', v {plan.v}' if plan.v > 1 else ''}, layers "
            f"{[len(s) for s in plan.stages]})" if dims.pp > 1 or plan.v > 1 else "")
    sp = " +sp" if run.parallel.sequence_parallel else ""
    z = run.zero
    return (f"hybrid: {run.model.name} ({cfg.num_parameters / 1e6:.2f}M parameters, {local / 1e6:.2f}M on rank 0) | "
            f"tp {dims.tp}{sp}{_cp_part(run)}{pipe} x dp {dims.dp} on {dims.world} "
            f"{device.type} ranks | global batch {batch.global_batch} = micro {batch.micro_batch} x dp "
            f"{dims.dp} x {batch.num_micro_batches} micro-batches | seq {batch.seq_length}"
            f"{' | blocks compiled (torch.compile)' if run.model.compile else ''}\n"
            f"zero: stage {z.stage} | {z.precision.value}"
            f"{' | offload optimizer (' + optimizer.optimizer_kind + ')' if z.offload_optimizer else ''}"
            f"{' | offload params' if z.offload_params else ''}{' | keep gathered' if z.keep_gathered else ''}"
            f"{_grads_part(z)} | clip-grad {run.optimizer.clip_grad}")


def resumed_data(run: RunConfig, data: DataSource, start: int, consumed: int) -> DataSource:
    """The data a run resumed at iteration `start` with `consumed` samples read trains on: a resume at a smaller
    global batch reads past --train-iters x G, so the train split is built to the end of its reads (hybrid/data/
    source.py's train_samples) and the run reads on from the checkpoint's samples rather than wrapping around to
    ones the saved run read. A function of the run, so the call is tested in-process (round 22's tests of it
    launched train.py: slow tier only; tests/test_mutation23_catches.py)."""
    t, g = run.training, run.training.batch.global_batch
    # one past --train-iters evaluates at its own iteration: the valid split is built to that evaluation's block
    return data.covering(train_samples(t.train_iters, g, start, consumed),
                         valid_samples(t.train_iters, g, run.data.eval_interval, run.data.eval_iters, start))


def feature_lines(run: RunConfig, local: LocalUpdates) -> list[str]:
    """The start-up lines of DiLoCo (replicas, H, the outer optimizer; a replica of several DP ranks names the run's
    ZeRO stage, hybrid/diloco/run.py) and of gradient compression (the scheme, from when; under DiLoCo its simulated
    link is the cross-replica one, named on the DiLoCo line). A function of the run and its LocalUpdates, so the
    wiring is tested without the 4 ranks a DiLoCo replica of 2 DP ranks needs (round 22 left `describe(0)` here
    alive: tests/test_mutation23_catches.py)."""
    lines = [diloco_line(run)] if local.cfg else []
    if line := compress_line(run.compress, diloco=local.cfg is not None):
        lines.append(line)
    return lines


def _grads_part(z) -> str:
    """Under --bf16 / --fp16, which dtype the gradients accumulate and reduce in, and the flag that changes it:
    ' | fp32 grads' (--bf16's default, as Megatron-LM's; --fp16 with --accumulate-allreduce-grads-in-fp32),
    ' | bf16 grads (--grad-reduce-in-bf16)', ' | fp16 grads (fp32: --accumulate-allreduce-grads-in-fp32)'. A
    Megatron user reads the gradient dtype of the run off this line (round 22)."""
    if z.accumulate_fp32_grads:
        return " | fp32 grads"
    if not z.precision.mixed:
        return ""
    if z.precision.value == "bf16":
        return " | bf16 grads (--grad-reduce-in-bf16)"
    return f" | {z.precision.value} grads (fp32: --accumulate-allreduce-grads-in-fp32)"


def _cp_part(run: RunConfig) -> str:
    """' x cp 2 (p2p)' for the start-up line; empty without context parallelism."""
    return f" x cp {run.cp.size} ({run.cp.comm_type.value})" if run.cp.size > 1 else ""


def run_info(run: RunConfig) -> dict:
    """What a checkpoint records of the run (state.json): the model, the layout, the flags."""
    dims, plan = run.parallel.dims, run.parallel.pipeline
    layout = {"tp": dims.tp, "pp": dims.pp, "dp": dims.dp, "cp": dims.cp, "zero": run.zero.stage, "v": plan.v,
              "stages": [list(s) for s in plan.stages]}
    return {"model": run.model.name, "layout": layout, "args": run.flag_values}


def save_timeline(path: str, runner, mesh: Mesh, plan: PipelinePlan) -> None:
    """Gather every rank's events of the last step; rank 0 writes the Chrome trace."""
    events = getattr(runner, "events", [])
    gathered = mesh.world.all_gather_object((mesh.rank, mesh.coords.pp, events))
    if mesh.rank == 0:
        trace = chrome_trace({r: evs for r, _, evs in gathered}, {r: pp for r, pp, _ in gathered}, plan.v)
        write_chrome_trace(path, trace)
        print(f"timeline: {path} ({len(trace['traceEvents'])} events; open in Perfetto)", flush=True)


