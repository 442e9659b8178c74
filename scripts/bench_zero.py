"""ZeRO-3 side by side: hybrid vs torch FSDP2 vs DeepSpeed ZeRO-3, each peer set up as its docs recommend.

    python scripts/bench_zero.py            # writes docs/results/bench_zero.md; 27 rows of 11 steps (9 x 3
                                            # repeats), each step ~5 s on 2 loaded cores (~45 min; more under load)
    python scripts/bench_zero.py --quick --out /tmp/z.md   # smoke run (a tiny model; measures nothing)
    python scripts/bench_zero.py --overlap-only  # only the ZeRO 1-2 overlap rows -> docs/results/bench_zero_overlap.md

Same model (a ~120M-parameter Llama built from hybrid's layers at tp = 1, so every framework wraps the same
nn.Module), same dp, batch, fp32, same steps, on gloo + CPU, one thread per rank. Rows:

* hybrid ZeRO-3 with its default optimizer (torch's fused AdamW over the flat shards, the division by dp folded
  into the kernel);
* hybrid ZeRO-3 with `torch.optim.AdamW(fused=True)` and torch FSDP2 with the same fused AdamW;
* hybrid ZeRO-3 with DeepSpeedCPUAdam and DeepSpeed ZeRO-3 with the optimizer named in its config (on the CPU
  accelerator DeepSpeed builds its cpu_adam AVX kernel), with its recommended bucket sizes;
* a second table: hybrid ZeRO-1 and ZeRO-2 (torch fused AdamW) with the post-step parameter all-gather overlapped
  with the next forward (the default) and blocking (`overlap_param_gather=False`), ratio on / off.

Each peer is compared with the hybrid row that runs the same optimizer kernel, so the ratio is about sharding.
Every row runs in fresh processes (one per rank); step time = median over steps of the slowest rank; memory =
peak resident-set growth over a post-import baseline. `--repeats` rounds give the ratio's spread.

The ZeRO 1-2 vs DDP rows (`--ddp-only`) also give each rank's step split into phases (PhaseClock: forward,
the forward's waits for the previous step's gathers, backward with the reductions waited in it, the reductions left
after backward, the loss all-reduce, AdamW, write-back),
each with its wall, process CPU (all threads) and main-thread CPU, so the quiet rerun shows where a rank waits.

A second table: each AdamW kernel alone over ~50M fp32 parameters against its memory-bandwidth floor (an
AdamW step reads p, g, m, v and writes p, m, v -- 28 bytes per parameter).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from hybrid.cliutil import (HelpFormatter, OneLineParser, atomic_output, check_output_file, cpu_name,  # noqa: E402
                            int_in, package_version, positive_int)
from hybrid.testing import run_distributed  # noqa: E402

def model_config(args):
    from transformers import LlamaConfig
    from models import from_hf
    return from_hf(LlamaConfig(num_hidden_layers=args.layers, hidden_size=args.hidden, num_attention_heads=8,
                               num_key_value_heads=8, intermediate_size=args.hidden * 3, vocab_size=args.vocab,
                               max_position_embeddings=args.seq, tie_word_embeddings=False))


def build(args):
    from hybrid.comm import Group
    from hybrid.tp import TPContext
    from models import build_model
    return build_model(model_config(args), TPContext(Group.solo("tp")), seed=1)


def batch(args, rank: int, it: int):
    gen = torch.Generator().manual_seed(1000 * it + rank)
    ids = torch.randint(0, args.vocab, (args.micro, args.seq + 1), generator=gen)
    return ids[:, :-1], ids[:, 1:]


# --- memory: growth of the resident set over a post-import baseline ----------------------------

def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def memory_baseline() -> int:
    """Resident kB now (after every import, before the model exists); also resets the peak (VmHWM)
    to it by writing 5 to /proc/self/clear_refs, so the peak read later is this run's alone."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not permitted: VmHWM then still includes import-time peaks, which are smaller
        pass
    return _status_kb("VmRSS")


def memory_growth_mb(baseline_kb: int) -> float:
    """Peak resident set since the baseline, less the baseline: model, gradients, optimizer state,
    gathered parameters, communication buffers and activations -- what the framework adds."""
    return (_status_kb("VmHWM") - baseline_kb) / 1024


# --- the runners: one rank of one framework -----------------------------------------------------

def _time_steps(step, args, cpu: list[float] | None = None) -> list[float]:
    """`warmup` untimed steps (buffers, kernels, DeepSpeed's JIT op), then `steps` timed ones, back to back: one
    barrier before the first step, none inside the timed run, and a step's time is the interval from its start
    to the next step's start (the last one's to its end). Work a step leaves in flight (ZeRO 1-2's parameter
    all-gathers, waited in the next forward) is thereby paid inside the timed run, in the step that waits for it,
    never in an untimed barrier -- the same for every row. `cpu`: filled with each timed step's CPU seconds of
    this process over the same intervals (every thread: compute, the backend's communication threads, the
    kernel's work for them, page faults included), which other load changes far less than the wall time."""
    dist.barrier()  # every rank's clock starts together; the steps' collectives keep them together after it
    walls, cpus = [time.perf_counter()], [time.process_time()]
    for it in range(args.warmup + args.steps):
        step(it)
        walls.append(time.perf_counter())
        cpus.append(time.process_time())
    if cpu is not None:
        cpu.extend(b - a for a, b in zip(cpus[args.warmup:], cpus[args.warmup + 1:]))
    return [b - a for a, b in zip(walls[args.warmup:], walls[args.warmup + 1:])]


class PhaseClock:
    """One rank's step split into phases: `mark(name)` ends the phase `name` here (the step's first mark is "start").
    Each mark reads the wall clock, this process's CPU time (every thread: compute and gloo's communication
    threads) and the main thread's CPU time, so a phase's wall above its process CPU is time the rank sat idle
    (waiting for the other rank or the wire), and process CPU above main-thread CPU is the communication threads'
    work (loopback TCP copies, for gloo on one host)."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float, float, float]] = []
        self.steps: list[dict[str, tuple[float, float, float]]] = []

    def mark(self, name: str) -> None:
        self.marks.append((name, time.perf_counter(), time.process_time(), time.thread_time()))

    def end_step(self) -> None:
        self.steps.append(phase_split(self.marks))
        self.marks = []


def phase_split(marks: list[tuple[str, float, float, float]]) -> dict[str, tuple[float, float, float]]:
    """Marks (name, wall, process CPU, main-thread CPU) in time order -> each phase's (wall, process CPU, main-thread
    CPU) seconds, a phase running from the previous mark to its own; a name marked twice sums its spans. The phases
    add up to the step: first mark to last."""
    out: dict[str, tuple[float, float, float]] = {}
    for (_, w0, c0, t0), (name, w1, c1, t1) in zip(marks, marks[1:]):
        w, c, t = out.get(name, (0.0, 0.0, 0.0))
        out[name] = (w + w1 - w0, c + c1 - c0, t + t1 - t0)
    return out


def median_phases(steps: list[dict[str, tuple[float, float, float]]]) -> dict[str, tuple[float, float, float]]:
    """The median over steps of each phase's (wall, process CPU, main-thread CPU), phases in their first step's
    order."""
    return {name: tuple(statistics.median(st[name][k] for st in steps if name in st) for k in range(3))
            for name in (steps[0] if steps else {})}


def _clock_hybrid(model, zero, clock: PhaseClock) -> None:
    """Marks around hybrid's step through its seams: the model's forward, split by the forward hooks' waits for
    the previous step's parameter all-gathers (`_wait_gathers`: the gathers' exposed part), `finish_backward` (the
    reductions still in flight when backward ends: their exposed wait), `step` (what train_step runs between the two:
    the loss all-reduce), each AdamW call inside `step` and `step`'s end (the write-back: posting the stage 1-2
    all-gathers; stepping unit by unit, `ZeroConfig.step_in_gather_order`, posts one unit's gather between two
    AdamW calls, which the write-back phase sums); the step ends when train_step returns."""
    forward, finish, adamw, step = model[0].forward, zero.finish_backward, zero.optimizer.step, zero.step
    wait_gathers, in_step, calls = zero._wait_gathers, [False], [0]

    def waits(units):  # every forward hook's wait is a span of its own (0 where nothing was in flight), so each
        if in_step[0]:  # step has the phase and the phases add up to the step; step()'s own wait stays in step
            return wait_gathers(units)
        clock.mark("forward")
        wait_gathers(units)
        clock.mark("forward: waits for the gathers")

    def fwd(*a, **k):
        out = forward(*a, **k)
        clock.mark("forward")
        return out

    def fin(*a, **k):
        clock.mark("backward (+ reductions waited in it)")
        finish(*a, **k)
        clock.mark("reductions left after backward")

    def opt(*a, **k):
        clock.mark("write-back (posts the gathers)" if calls[0] else "master gradients")
        calls[0] += 1
        out = adamw(*a, **k)
        clock.mark("AdamW")
        return out

    def stp(*a, **k):
        clock.mark("loss all-reduce")
        in_step[0], calls[0] = True, 0
        try:
            out = step(*a, **k)
        finally:
            in_step[0] = False
        clock.mark("write-back (posts the gathers)")
        return out
    model[0].forward, zero.finish_backward, zero.optimizer.step, zero.step = fwd, fin, opt, stp
    zero._wait_gathers = waits


def _adamw_kw(args) -> dict:
    return dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)


def _swap_optimizer(zero, kernel: str, args) -> str:
    """Rebuild hybrid's AdamW over the same master shards and groups with another kernel, so the
    sharding comparison runs the peer's optimizer kernel on our side too."""
    groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in zero.optimizer.param_groups]
    kw = {k: v for k, v in _adamw_kw(args).items() if k != "weight_decay"}
    if kernel == "fused":
        zero.optimizer = torch.optim.AdamW(groups, fused=True, **kw)
        return "torch AdamW fused"
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    zero.optimizer = DeepSpeedCPUAdam(groups, adamw_mode=True, **kw)
    return "DeepSpeedCPUAdam"


def _time_hybrid(rank, args, mesh, model, zero, base: int, label: str) -> dict:
    """Steps of hybrid's train_step, timed; this rank's times, memory growth and DP bytes per step, and the
    optimizer step alone (ZeroOptimizer.step: master gradients, clip norm, AdamW, write-back) with the elements
    it updates (this rank's shard), for its bandwidth floor."""
    from hybrid.train_step import LocalForwardBackward, train_step
    clock = PhaseClock()
    _clock_hybrid(model, zero, clock)
    opt_times, inner = [], zero.step

    def timed_step():
        t0 = time.perf_counter()
        out = inner()
        opt_times.append(time.perf_counter() - t0)
        return out
    zero.step = timed_step

    def step(it):
        mesh.ledger.reset()
        clock.mark("start")
        train_step(model, [batch(args, rank, it)], zero, mesh, runner=LocalForwardBackward(model[0], mesh.device))
        clock.mark("rest of train_step (the loss all-reduce before round 11)")
        clock.end_step()
    cpu: list[float] = []
    times = _time_steps(step, args, cpu)
    out = {"times": times, "cpu": cpu, "mem_mb": memory_growth_mb(base), "optimizer": label,
           "phases": median_phases(clock.steps[args.warmup:]),
           "bytes": sum(e.bytes for (op, g), e in mesh.ledger.entries.items() if ":" not in g),
           "opt_times": opt_times[args.warmup:], "opt_numel": sum(u.shard_numel for u in zero.units)}
    out.update(_kernel_alone(zero))
    return out


def _kernel_alone(zero, reps: int = 3) -> dict:
    """After the timed steps, on the same shards, threads and ranks (every rank at once, after a barrier; the
    fastest of `reps`): the AdamW kernel alone (`zero.optimizer.step()` over the master views with the reduced
    gradient shards, nothing else of ZeroOptimizer.step), and in-place x += y over the same views and gradients
    (read 8, write 4 bytes a parameter): the bandwidth this run's layout reaches, for a floor the run's threads can
    reach. Both overwrite the trained weights, which nothing reads after this."""
    zero.before_param_writes()  # the last step's gathers (not under the kernel's clock), and the peer's takes
    views = [v for u in zero.units for v in u.views]
    grads = [u.grad_shard[s.lo:s.hi] for u in zero.units for s in u.segments]
    for v, g in zip(views, grads):
        v.grad = g
    zero.optimizer.grad_scale = None

    def fastest(fn) -> float:
        best = float("inf")
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return best
    kernel_s = fastest(zero.optimizer.step)
    add_s = fastest(lambda: torch._foreach_add_(views, grads))
    numel = sum(v.numel() for v in views)
    return {"kernel_s": kernel_s, "run_bw": 12 * numel / add_s}


def run_hybrid(rank, world, args, kernel):
    from hybrid.mesh import Mesh, ParallelDims
    from hybrid.train_step import OptimizerConfig
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    if kernel == "deepspeed":
        import deepspeed.ops.adam  # noqa: F401  (its import is part of the baseline, as on DeepSpeed's side)
    base = memory_baseline()
    mesh = Mesh.build(ParallelDims(dp=world))
    model = torch.nn.ModuleList([build(args)])
    zero = ZeroOptimizer(model, mesh, ZeroConfig(stage=3), OptimizerConfig(lr=1e-3, weight_decay=0.01))
    label = (f"hybrid default ({zero.optimizer_kind})" if kernel == "default" else _swap_optimizer(zero, kernel, args))

    return _time_hybrid(rank, args, mesh, model, zero, base, label)


def run_hybrid_stage(rank, world, args, stage):
    """hybrid ZeRO `stage` (1 or 2) exactly as train.py runs it by default (its fused AdamW, gather overlap on, the
    reduce-scatter from autograd's gradients, the step unit by unit in gather order). `stage` "1+flat" / "2+flat":
    the path before docs/zero.md round 8, each gradient copied into a flat buffer before its reduce-scatter
    (`ZeroConfig(reduce_from_grads=False)`); "1+onecall" / "2+onecall": round 11's step, one AdamW call over every
    shard and then every gather (`ZeroConfig(step_in_gather_order=False)`); "1+gloo" / "2+gloo": the post-step gather
    through gloo's loopback TCP (`ZeroConfig(shm_gather=False)`, `--no-shm-gather`: the default until round 13),
    where the default (round 14) gathers through shared memory (hybrid/zero/shm.py)."""
    from hybrid.mesh import Mesh, ParallelDims
    from hybrid.train_step import OptimizerConfig
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    base = memory_baseline()
    mesh = Mesh.build(ParallelDims(dp=world))
    stage, _, lever = stage.partition("+")
    model = torch.nn.ModuleList([build(args)])
    zero = ZeroOptimizer(model, mesh, ZeroConfig(stage=int(stage), reduce_from_grads=lever != "flat",
                                                 step_in_gather_order=lever != "onecall", shm_gather=lever != "gloo"),
                         OptimizerConfig(lr=1e-3, weight_decay=0.01))
    gather = ", shm gather" if zero.shm_gather_active else ""  # which gather the row ran (the default's, or gloo's)
    return _time_hybrid(rank, args, mesh, model, zero, base, f"hybrid default ({zero.optimizer_kind}{gather})")


def _torch_fused_adamw_row(model, args, rank: int, base) -> dict:
    """A torch-native peer's timed steps (DDP, FSDP2): forward + backward, torch's fused AdamW, zero_grad."""
    opt = torch.optim.AdamW(model.parameters(), fused=True, **_adamw_kw(args))
    clock = PhaseClock()

    def step(it):
        x, y = batch(args, rank, it)
        clock.mark("start")
        loss = model(x, y)
        clock.mark("forward")
        loss.backward()
        clock.mark("backward (+ reductions waited in it)")
        opt.step()
        clock.mark("AdamW")
        opt.zero_grad()
        clock.mark("zero_grad")
        clock.end_step()
    cpu: list[float] = []
    times = _time_steps(step, args, cpu)
    return {"times": times, "cpu": cpu, "mem_mb": memory_growth_mb(base), "bytes": None,
            "phases": median_phases(clock.steps[args.warmup:]),
            "optimizer": "torch AdamW fused"}


def run_ddp(rank, world, args, kernel):
    """torch DDP as its docs recommend: gradients as bucket views (no copy into the buckets), the default 25 MB
    buckets overlapped with backward, static graph; torch's fused AdamW. `kernel` "fused+alloc": with glibc's
    thresholds set as hybrid's ZeroOptimizer sets them on CPU (hybrid/zero/host_alloc.py; what PyTorch's CPU
    tuning guide gets from jemalloc / tcmalloc), after DDP has built its buckets as hybrid after its flat buffers,
    so the ratio to hybrid is about data parallelism, not the allocator."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    base = memory_baseline()
    model = DDP(build(args), gradient_as_bucket_view=True, static_graph=True)
    _peer_host_alloc(kernel)
    return _torch_fused_adamw_row(model, args, rank, base)


def _peer_host_alloc(kernel: str) -> None:
    """A peer row whose kernel ends in "+alloc": glibc's thresholds set as hybrid's ZeroOptimizer sets them on CPU
    (hybrid/zero/host_alloc.py), once the peer has built its persistent buffers (hybrid sets them after its own)."""
    if kernel.endswith("+alloc"):
        from hybrid.zero.host_alloc import retain_freed_host_memory
        if not retain_freed_host_memory():
            raise RuntimeError("glibc's malloc thresholds could not be set (not glibc, or set by the user)")


def run_hybrid_overlap(rank, world, args, spec):
    """hybrid ZeRO 1 or 2 (`spec` "1:on", "2:off", ...) with the post-step parameter all-gather overlapped with
    the next forward or blocking after the step; torch's fused AdamW, so the optimizer kernel is not what the
    rows differ in."""
    from hybrid.mesh import Mesh, ParallelDims
    from hybrid.train_step import OptimizerConfig
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    stage, overlap = spec.split(":")
    base = memory_baseline()
    mesh = Mesh.build(ParallelDims(dp=world))
    model = torch.nn.ModuleList([build(args)])
    z = ZeroConfig(stage=int(stage), overlap_param_gather=overlap == "on")
    zero = ZeroOptimizer(model, mesh, z, OptimizerConfig(lr=1e-3, weight_decay=0.01))
    label = _swap_optimizer(zero, "fused", args)

    return _time_hybrid(rank, args, mesh, model, zero, base, label)


def deepspeed_config(args) -> dict:
    """ZeRO-3 as DeepSpeed's docs and transformers' DeepSpeed integration recommend ("auto" values):
    reduce_bucket_size = h^2, stage3_prefetch_bucket_size = 0.9 h^2, stage3_param_persistence_threshold
    = 10 h, overlap_comm and contiguous_gradients on; the optimizer named in the config, so DeepSpeed
    picks its own kernel (FusedAdam, on the CPU accelerator the cpu_adam AVX kernel)."""
    h = args.hidden
    return {"train_micro_batch_size_per_gpu": args.micro, "gradient_accumulation_steps": 1,
            "steps_per_print": 10**9, "wall_clock_breakdown": False,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                      "weight_decay": 0.01}},
            "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                                  "reduce_bucket_size": h * h, "stage3_prefetch_bucket_size": int(0.9 * h * h),
                                  "stage3_param_persistence_threshold": 10 * h}}


def run_deepspeed(rank, world, args, kernel):
    import deepspeed
    base = memory_baseline()
    model = build(args)
    from hybrid.zero.cpu_adam_build import load_op
    load_op("deepspeed_shm_comm")  # its CPU collectives op, loaded here first: a stale build lock is named
    load_op("fused_adam")  # the config's AdamW, built by initialize otherwise: the same
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                             config=deepspeed_config(args))
    _peer_host_alloc(kernel)
    inner = getattr(opt, "optimizer", opt)

    def step(it):
        x, y = batch(args, rank, it)
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
    cpu: list[float] = []
    times = _time_steps(step, args, cpu)
    return {"times": times, "cpu": cpu, "mem_mb": memory_growth_mb(base), "bytes": None,
            "optimizer": f"{type(inner).__module__.split('.')[-1]}.{type(inner).__name__} (config type AdamW)"}


def run_fsdp2(rank, world, args, kernel):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    base = memory_baseline()
    model = build(args)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.layers.values():  # one FSDP unit per block, then the root (embedding, norm, head)
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _peer_host_alloc(kernel)
    return _torch_fused_adamw_row(model, args, rank, base)


# (label, runner, optimizer kernel, the hybrid row it is compared with)
ROWS = [("hybrid ZeRO-3", run_hybrid, "default", None),
        ("hybrid ZeRO-3", run_hybrid, "fused", None),
        ("torch FSDP2", run_fsdp2, "fused", 1),
        ("hybrid ZeRO-3", run_hybrid, "deepspeed", None),
        ("DeepSpeed ZeRO-3", run_deepspeed, "deepspeed", 3)]
OVERLAP_FROM = len(ROWS)  # the rows after this one: hybrid ZeRO 1-2, post-step gather overlap on vs off
ROWS += [("hybrid ZeRO-1, gather overlap off", run_hybrid_overlap, "1:off", None),
         ("hybrid ZeRO-1, gather overlap on", run_hybrid_overlap, "1:on", OVERLAP_FROM),
         ("hybrid ZeRO-2, gather overlap off", run_hybrid_overlap, "2:off", None),
         ("hybrid ZeRO-2, gather overlap on", run_hybrid_overlap, "2:on", OVERLAP_FROM + 2)]
DDP_FROM = len(ROWS)  # hybrid ZeRO 1-2 as train.py runs them against torch DDP (ratio DDP / hybrid)
ROWS += [("hybrid ZeRO-1", run_hybrid_stage, "1", None),
         ("torch DDP", run_ddp, "fused", DDP_FROM),
         ("torch DDP, hybrid's host allocator setting", run_ddp, "fused+alloc", DDP_FROM),
         ("hybrid ZeRO-2", run_hybrid_stage, "2", None),
         ("torch DDP", run_ddp, "fused", DDP_FROM + 3),
         ("torch DDP, hybrid's host allocator setting", run_ddp, "fused+alloc", DDP_FROM + 3)]
LEVER_FROM = len(ROWS)  # ZeRO 1-2 with the default's newest lever off, against the default row (ratio off / default)
ROWS += [("hybrid ZeRO-1, one AdamW call then the gathers", run_hybrid_stage, "1+onecall", DDP_FROM),
         ("hybrid ZeRO-2, one AdamW call then the gathers", run_hybrid_stage, "2+onecall", DDP_FROM + 3)]
SHM_FROM = len(ROWS)  # ZeRO 1-2 with the post-step gather through gloo (the default until round 13; the default's
#                       is through shared memory since round 14), against the default
ROWS += [("hybrid ZeRO-1, gloo gather (--no-shm-gather)", run_hybrid_stage, "1+gloo", DDP_FROM),
         ("hybrid ZeRO-2, gloo gather (--no-shm-gather)", run_hybrid_stage, "2+gloo", DDP_FROM + 3)]
SHM_PEERS = {SHM_FROM: (DDP_FROM + 1, DDP_FROM + 2), SHM_FROM + 1: (DDP_FROM + 4, DDP_FROM + 5)}  # its DDP rows


def _spawned(rank, world, index, args):
    torch.set_num_threads(1)
    _, fn, kernel, _ = ROWS[index]
    return fn(rank, world, args, kernel)


def _spawned_all(rank, world, args):
    """--quick: every row in the same processes, one after another (start-up paid once; measures nothing)."""
    return [_spawned(rank, world, i, args) for i in range(len(ROWS))]


def _summary(res: list[dict]) -> dict:
    """Per-rank results of one row -> median over steps of the slowest rank's step time, the larger rank's memory."""
    per_step = [max(ts) for ts in zip(*(r["times"] for r in res))]  # a step lasts as long as its slowest rank
    out = {"step_s": statistics.median(per_step), "mem_mb": max(r["mem_mb"] for r in res),
           "optimizer": res[0]["optimizer"], "bytes": res[0]["bytes"]}
    if res[0].get("cpu"):  # CPU seconds a step, every rank's summed
        out["cpu_s"] = statistics.median(sum(cs) for cs in zip(*(r["cpu"] for r in res)))
    if res[0].get("phases"):  # each rank's phase split (median over steps)
        out["phases"] = [r["phases"] for r in res]
    if res[0].get("opt_times"):  # the optimizer step alone: the slowest rank's, and the largest shard
        out["opt_s"] = statistics.median(max(ts) for ts in zip(*(r["opt_times"] for r in res)))
        out["opt_numel"] = max(r["opt_numel"] for r in res)
        out["ranks"] = len(res)  # every rank steps its shard at the same time
        if "kernel_s" in res[0]:  # the slowest rank's kernel; the run's bandwidth: every rank's share, summed
            out["kernel_s"] = max(r["kernel_s"] for r in res)
            out["run_bw"] = min(r["run_bw"] for r in res)
    return out


def run_row(index: int, args) -> dict:
    """One framework in fresh processes."""
    try:
        return _summary(run_distributed(_spawned, args.dp, args=(index, args), timeout=600))
    except Exception as e:  # a framework that does not run here is reported, not hidden
        return {"error": str(e).strip().splitlines()[-1][:160]}


def bench_frameworks(args) -> list[list[dict]]:
    """`repeats` rounds, each running every row once in turn (a burst of outside load hits one
    round's rows alike); returns results[round][row]."""
    if args.quick:
        per_rank = run_distributed(_spawned_all, args.dp, args=(args,), timeout=600)
        return [[_summary([r[i] for r in per_rank]) for i in range(len(ROWS))]]
    results = []
    for rep in range(args.repeats):
        round_ = []
        for i, (name, _, kernel, _) in enumerate(ROWS):
            if (args.overlap_only and not OVERLAP_FROM <= i < DDP_FROM) or (args.ddp_only and i < DDP_FROM) or \
                    (args.zero3_only and i >= OVERLAP_FROM):
                round_.append({"error": "not run (--overlap-only / --ddp-only / --zero3-only)"})
                continue
            t0 = time.time()
            round_.append(run_row(i, args))
            brief = {k: v for k, v in round_[-1].items() if k != "phases"}
            print(f"repeat {rep + 1}/{args.repeats} {name} ({kernel}): {brief} ({time.time() - t0:.0f}s)", flush=True)
        results.append(round_)
    return results


def best_time(fn, reps: int = 5) -> float:
    """Fastest of `reps` runs after a warm-up: on a shared machine the minimum is the least disturbed."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def memory_bandwidth(sizes: list[int]) -> float:
    """Bytes per second of in-place x += y (read x, y; write x -- AdamW's access pattern) over tensors
    of `sizes` (the optimizer's layout), or over one 256 MB pair, or a 256 MB copy: the best of the
    three, so the floor is not set too low by one kernel's quirks."""
    xs, ys = [torch.ones(n) for n in sizes], [torch.ones(n) for n in sizes]
    total = sum(sizes) * 4
    a, b = torch.ones(64 * 2**20), torch.ones(64 * 2**20)
    n = a.numel() * 4
    return max(3 * total / best_time(lambda: [x.add_(y) for x, y in zip(xs, ys)]),
               3 * n / best_time(lambda: a.add_(b)), 2 * n / best_time(lambda: b.copy_(a)))


def bench_optimizer_step(numel: int, rounds: int = 3) -> list[dict]:
    """Each AdamW kernel over the same layout, in round-robin rounds (so a burst of other load hits
    every kernel alike); per kernel the fastest step over all rounds, against the best bandwidth."""
    from hybrid.zero.config import CpuAdam
    from hybrid.zero.engine import cpu_adamw
    torch.set_num_threads(os.cpu_count() or 1)
    sizes = [numel // 200] * 200  # ~50M parameters as a few hundred tensors, as a model's shards are
    kernels = {"DeepSpeed CPU Adam": CpuAdam.DEEPSPEED, "torch AdamW fused": CpuAdam.TORCH,
               "torch AdamW foreach": "foreach", "torch AdamW per-tensor": CpuAdam.TORCH_LOOP}
    opts, errors = {}, {}
    for label, which in kernels.items():
        params = [torch.zeros(n) for n in sizes]
        for p in params:
            p.grad = torch.randn(p.numel()) * 1e-3
        try:
            opts[label] = (torch.optim.AdamW(params, lr=1e-3, foreach=True) if which == "foreach" else
                           cpu_adamw([{"params": params, "weight_decay": 0.01}], which, lr=1e-3,
                                     betas=(0.9, 0.95), eps=1e-8)[0])
        except Exception as e:
            errors[label] = str(e).splitlines()[-1][:160]
    best = {label: float("inf") for label in opts}
    bw = 0.0
    for _ in range(rounds):
        bw = max(bw, memory_bandwidth(sizes))
        for label, opt in opts.items():
            best[label] = min(best[label], best_time(opt.step, reps=2))
    floor = 28 * numel / bw
    rows = [{"name": label, "step_s": best[label], "floor_s": floor, "bw": bw} for label in opts]
    rows += [{"name": label, "error": err} for label, err in errors.items()]
    for r in rows:
        print(r, flush=True)
    return rows


def _spread(ratios: list[float]) -> str:
    return f"{min(ratios):.2f} - {max(ratios):.2f}"


def _verdict(ratios: list[float], above: str = "hybrid faster", below: str = "peer faster") -> str:
    """A lead only where every repeat's ratio is on the same side of 1.0 (the min-max spread excludes it)."""
    if len(ratios) < 2:
        return "no lead claimed (one repeat)"
    if min(ratios) > 1.0:
        return above
    if max(ratios) < 1.0:
        return below
    return "no lead claimed (spread includes 1.0)"


def framework_table(results: list[list[dict]], rows: range | None = None,
                    head: str = "ratio to hybrid, same kernel", above: str = "hybrid faster",
                    below: str = "peer faster") -> list[str]:
    lines = ["| framework | optimizer kernel | step ms (median of repeats; per repeat) | memory growth / rank MB "
             f"(median) | {head}: median (min - max over repeats) | verdict |",
             "|---|---|---|---|---|---|"]
    for i in rows if rows is not None else range(OVERLAP_FROM):
        name, _, kernel, ref = ROWS[i]
        cells = [r[i] for r in results]
        ok = [c for c in cells if "step_s" in c]
        if not ok:
            lines.append(f"| {name} | {kernel} | failed: {cells[0].get('error', '?')} | | | |")
            continue
        steps = [c["step_s"] * 1e3 for c in ok]
        ratio_cell = verdict = "(reference)" if ref is None else ""
        if ref is not None:
            ratios = [r[i]["step_s"] / r[ref]["step_s"] for r in results if "step_s" in r[i] and "step_s" in r[ref]]
            if ratios:
                ratio_cell = f"{statistics.median(ratios):.2f} ({_spread(ratios)})"
                verdict = _verdict(ratios, above, below)
        per = ", ".join(f"{s:.0f}" for s in steps)
        lines.append(f"| {name} | {ok[0]['optimizer']} | {statistics.median(steps):.0f} ({per}) | "
                     f"{statistics.median(c['mem_mb'] for c in ok):.0f} | {ratio_cell} | {verdict} |")
    return lines


def cpu_table(results: list[list[dict]], rows: range) -> list[str]:
    """CPU seconds a step (every rank's process, all threads, summed; the median over steps) and their ratio to the
    reference row's in the same repeat: the work each framework does, which other load changes far less than the
    wall time (it does not see waiting, the overlap's gain)."""
    lines = ["| framework | CPU s a step, all ranks (median of repeats; per repeat) | ratio to hybrid's CPU s: median "
             "(min - max over repeats) |", "|---|---|---|"]
    for i in rows:
        name, _, kernel, ref = ROWS[i]
        ok = [r[i]["cpu_s"] for r in results if "cpu_s" in r[i]]
        if not ok:
            continue
        ratios = [r[i]["cpu_s"] / r[ref]["cpu_s"] for r in results if ref is not None and "cpu_s" in r[i]
                  and "cpu_s" in r[ref]]
        cell = f"{statistics.median(ratios):.2f} ({_spread(ratios)})" if ratios else "(reference)"
        lines.append(f"| {name} | {statistics.median(ok):.2f} ({', '.join(f'{c:.2f}' for c in ok)}) | {cell} |")
    return lines


def peer_ratio_table(results: list[list[dict]], peers: dict[int, tuple[int, ...]]) -> list[str]:
    """Each row of `peers` against its DDP rows of the same repeat: ratio = DDP / row (above 1.0 the row is faster),
    wall step time and CPU seconds a step."""
    lines = ["| row | against | wall ratio: median (min - max over repeats) | verdict | CPU ratio: median (min - max) |",
             "|---|---|---|---|---|"]
    for i, refs in peers.items():
        for j in refs:
            wall = [r[j]["step_s"] / r[i]["step_s"] for r in results if "step_s" in r[i] and "step_s" in r[j]]
            cpu = [r[j]["cpu_s"] / r[i]["cpu_s"] for r in results if "cpu_s" in r[i] and "cpu_s" in r[j]]
            if wall:
                cell = f"{statistics.median(cpu):.2f} ({_spread(cpu)})" if cpu else ""
                lines.append(f"| {ROWS[i][0]} | {ROWS[j][0]} | {statistics.median(wall):.2f} ({_spread(wall)}) | "
                             f"{_verdict(wall)} | {cell} |")
    return lines


def phase_table(results: list[list[dict]], rows: range) -> list[str]:
    """Each row's step split into phases, per rank (PhaseClock): wall ms / CPU ms of the rank's process (all threads)
    / of its main thread, the median over steps and then over repeats; idle = wall - process CPU (a lower bound: a
    rank may run its main and communication threads on two cores at once)."""
    lines = ["| framework | rank | phase | wall ms | CPU ms, process | CPU ms, main thread | idle ms |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for i in rows:
        cells = [r[i]["phases"] for r in results if "phases" in r[i]]
        if not cells:
            continue
        for rank in range(len(cells[0])):
            names = list(cells[0][rank]) + ["step"]
            for name in names:
                vals = [tuple(sum(v[k] for v in c[rank].values()) for k in range(3)) if name == "step" else
                        c[rank][name] for c in cells if name == "step" or name in c[rank]]
                w, c, t = (statistics.median(v[k] for v in vals) * 1e3 for k in range(3))
                lines.append(f"| {ROWS[i][0]} | {rank} | {name} | {w:.1f} | {c:.1f} | {t:.1f} | {max(0.0, w - c):.1f} |")
    return lines


def args_dp(results: list[list[dict]]) -> int:
    """The ranks that stepped at once in the training rows (the DP size)."""
    return max((c.get("ranks", 1) for r in results for c in r), default=1)


def optimizer_step_table(results: list[list[dict]], opt_rows: list[dict]) -> list[str]:
    """hybrid's whole optimizer step (ZeroOptimizer.step, measured inside the training rows) against the bandwidth
    floor of its shard: 28 bytes a parameter (read p, g, m, v; write p, m, v) / the measured bandwidth."""
    bw = next((r["bw"] for r in opt_rows if "bw" in r), None)
    if bw is None:
        return []
    lines = ["", "hybrid's optimizer step inside those runs (ZeroOptimizer.step: master gradients, AdamW, write-back; "
             "no clipping), the median over steps and repeats of the slowest rank's, against its shard's floor "
             f"(28 bytes a parameter at the {bw / 1e9:.1f} GB/s measured below; one thread per rank, as the run). "
             f"Every rank steps at once on the same memory, so a second floor counts all {args_dp(results)} ranks' "
             "bytes against that bandwidth (the shard's floor assumes one rank has the machine's bandwidth alone).",
             "", "The last columns are measured in the same processes after the timed steps, every rank at once: the "
             "AdamW kernel alone on the same shards (what ZeroOptimizer.step adds to it is hybrid's), and the floor "
             "at the bandwidth the run's own layout reaches (in-place x += y over the same shards, one thread per "
             "rank; the slowest rank's), the median over repeats.",
             "", "| run | parameters stepped / rank | step ms (min - max over repeats) | floor ms | step / floor | "
             "floor ms, all ranks at once | step / that floor | kernel alone ms | step / kernel | floor ms at the "
             "run's threads | step / that floor |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, (name, _, kernel, _) in enumerate(ROWS):
        cells = [r[i] for r in results if "opt_s" in r[i]]
        if not cells or kernel not in ("default", "1", "2"):
            continue
        ms = [c["opt_s"] * 1e3 for c in cells]
        floor = 28 * cells[0]["opt_numel"] / bw * 1e3
        every = floor * cells[0].get("ranks", 1)
        step = statistics.median(ms)
        kernel = statistics.median(c["kernel_s"] for c in cells) * 1e3 if "kernel_s" in cells[0] else float("nan")
        own = 28 * cells[0]["opt_numel"] / statistics.median(c["run_bw"] for c in cells) * 1e3 \
            if "run_bw" in cells[0] else float("nan")
        lines.append(f"| {name} | {cells[0]['opt_numel'] / 1e6:.1f}M | {step:.1f} "
                     f"({min(ms):.1f} - {max(ms):.1f}) | {floor:.1f} | {step / floor:.2f} | "
                     f"{every:.1f} | {step / every:.2f} | {kernel:.1f} | {step / kernel:.2f} | {own:.1f} | "
                     f"{step / own:.2f} |")
    return lines


def write_table(path: str, args, results: list[list[dict]], opt_rows: list[dict]) -> None:
    cfg = model_config(args)
    flags = (" --quick" if args.quick else "") + (" --overlap-only" if args.overlap_only else "") + \
        (" --ddp-only" if args.ddp_only else "") + (" --zero3-only" if args.zero3_only else "")
    title = ("ZeRO 1-2 gather overlap benchmark" if args.overlap_only else "ZeRO 1-2 against DDP" if args.ddp_only
             else "ZeRO-3 benchmark")
    lines = [f"# {title} (`python scripts/bench_zero.py{flags}`)", "",
             *(["**--quick smoke run: tiny model, all rows in one pair of processes; these numbers measure "
                "nothing.**", ""] if args.quick else []),
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
             f"machine: {os.cpu_count()}-core "
             f"CPU ({cpu_name()}), shared with other jobs; 1-min load average {args.load[0]:.2f} at the start, "
             f"{args.load[1]:.2f} at the end (above {os.cpu_count()} means other processes competed for the cores)",
             f"- versions: torch {torch.__version__}, deepspeed {package_version('deepspeed')}",
             f"- model: Llama, {args.layers} layers, hidden {args.hidden}, 8 heads, FFN {3 * args.hidden}, vocab "
             f"{args.vocab}, untied head: {cfg.num_parameters / 1e6:.1f}M parameters, fp32 (no mixed precision on "
             f"any side: hybrid's CPU path trains in fp32 here)",
             f"- run: {'ZeRO 1-2' if args.overlap_only or args.ddp_only else 'ZeRO-3 / FULL_SHARD'} over dp {args.dp} gloo ranks on {os.cpu_count()} cores, one thread per rank "
             f"(OMP_NUM_THREADS=1), micro-batch {args.micro} x seq {args.seq}, no gradient clipping, AdamW lr 1e-3, "
             f"betas (0.9, 0.95), weight decay 0.01",
             f"- timing: {args.warmup} warm-up step(s), then the median of {args.steps} steps run back to back, "
             "each step the slowest rank's interval from its start to the next step's start (one barrier before the "
             "first step, none inside the timed run, for every row alike: work a step leaves in flight is paid in "
             f"the step that waits for it; before round 11 a barrier before each step); {args.repeats} repeats, each running every row once in fresh processes, "
             "in the order below. Ratio = peer / hybrid with the same optimizer kernel in the same repeat; above 1.0 "
             "hybrid is faster. A lead is claimed only where the min-max of the per-repeat ratios excludes 1.0.",
             "- memory: growth of the resident set over a baseline taken after every import and before the model is "
             "built (peak VmHWM reset at the baseline via /proc/self/clear_refs), the larger rank",
             *([] if args.overlap_only else [
             "- peers as their docs recommend: torch FSDP2 `fully_shard` per block + root, "
             "`torch.optim.AdamW(fused=True)`; DeepSpeed ZeRO-3 with `overlap_comm`, `contiguous_gradients`, "
             "reduce_bucket_size = h^2, "
             "stage3_prefetch_bucket_size = 0.9 h^2, stage3_param_persistence_threshold = 10 h (the values "
             "transformers' "
             "DeepSpeed integration fills in for \"auto\"), optimizer named in the config (DeepSpeed's own CPU Adam "
             "kernel); hybrid `ZeroOptimizer(stage=3)` with its default optimizer, and again with the peer's kernel "
             "swapped in over the same shards, so each ratio compares sharding, not the optimizer kernel.",
             "- no offload rows: on a CPU-only machine parameters and optimizer state already live in host memory, "
             "so offload moves nothing (it would only switch the optimizer kernel, which the rows below already do).",
             "- host allocator: hybrid's ZeroOptimizer sets glibc's mmap and trim thresholds on CPU at ZeRO 1-2, "
             "not at ZeRO 3 (freed large tensors reused from the heap, not faulted in afresh each step: "
             "hybrid/zero/host_alloc.py; docs/zero.md says why not at 3); each ZeRO 1-2 peer (DDP) "
             "runs once as its docs leave it and once with the same setting ('hybrid's host allocator setting', "
             "applied after its own buffers are built), so the ratio to the latter is about sharding alone.",
             ]),
             "", *([] if args.overlap_only or args.ddp_only else [
                 *framework_table(results), "", "The same runs' CPU time (every rank's process, all threads).", "",
                 *cpu_table(results, range(OVERLAP_FROM))]),
             *([] if args.ddp_only or args.zero3_only else [
             "", "ZeRO 1-2: the post-step parameter all-gather overlapped with the next forward (the default) or "
             "blocking after the step (`overlap_param_gather=False`, `--no-overlap-param-gather`); hybrid alone, the "
             "same model, fp32, threads and torch fused AdamW as above, each row in fresh processes in the same "
             "repeats. Ratio = overlap on / off in the same repeat; below 1.0 the overlap is faster.", "",
             *framework_table(results, range(OVERLAP_FROM, DDP_FROM), "ratio on / off",
                              above="overlap slower", below="overlap faster")])]
    if not (args.overlap_only or args.zero3_only):
        lines += ["", "ZeRO 1-2 as train.py runs them by default (torch fused AdamW over the flat shards, gather overlap "
                  "on) against torch DDP (gradient_as_bucket_view, static_graph, default buckets, fused AdamW), the "
                  "same model, fp32 and threads. Ratio = DDP / hybrid in the same repeat; above 1.0 hybrid is "
                  "faster.", "",
                  *framework_table(results, range(DDP_FROM, LEVER_FROM), "ratio DDP / hybrid"),
                  "", "The same runs' CPU time. hybrid's ZeroOptimizer sets glibc's mmap and trim thresholds on CPU "
                  "(hybrid/zero/host_alloc.py: freed large tensors -- autograd's weight gradients -- reused from the "
                  "heap instead of faulted in afresh each step); the rows 'hybrid's host allocator setting' give DDP "
                  "the same, so the ratio to them is the one about data parallelism.", "",
                  *cpu_table(results, range(DDP_FROM, LEVER_FROM)),
                  "", "The default's newest lever off (docs/zero.md, round 12): one AdamW call over every shard, "
                  "then every unit's gather (`ZeroConfig(step_in_gather_order=False)`, round 11's step), where the "
                  "default steps unit by unit in the next forward's order and posts each unit's gather right after "
                  "its own step. Ratio = one call / default in the same repeat; above 1.0 the default is faster. "
                  "(Until round 11 these rows were round 8's lever, gradients copied into a flat buffer: "
                  "`run_hybrid_stage` still takes \"1+flat\".)", "",
                  *framework_table(results, range(LEVER_FROM, SHM_FROM), "ratio one call / default",
                                   above="default faster", below="one call faster"), "",
                  *cpu_table(results, range(LEVER_FROM, SHM_FROM)),
                  "", "Round 13's lever, the default since round 14: the post-step all-gather through shared memory "
                  "(`ZeroConfig.shm_gather`, hybrid/zero/shm.py: each rank's flat parameters in a /dev/shm file both "
                  "ranks map, the peer's half copied once, no socket). These rows turn it off (`--no-shm-gather`: "
                  "gloo's loopback TCP, the default until round 13). Ratio = gloo / default in the same repeat; "
                  "above 1.0 the default (shared memory) is faster. Memory: the default maps the peer's half of the "
                  "parameters into each rank, which the resident set counts twice over the pair (shared pages).", "",
                  *framework_table(results, range(SHM_FROM, len(ROWS)), "ratio gloo / default",
                                   above="default faster", below="gloo faster"), "",
                  *cpu_table(results, range(SHM_FROM, len(ROWS))), "",
                  *peer_ratio_table(results, SHM_PEERS),
                  "", "Where each rank's step goes (scripts/bench_zero.py PhaseClock: marks at the model's forward "
                  "and around its waits for the previous step's gathers, the end of backward, the optimizer step, "
                  "the AdamW call and the step's end; a phase's wall above its process CPU is time "
                  "the rank sat idle, process CPU above main-thread CPU is gloo's communication threads).", "",
                  *phase_table(results, range(DDP_FROM, len(ROWS)))]
    if not args.overlap_only:
        lines += optimizer_step_table(results, opt_rows)
    if opt_rows:
        lines += ["", f"AdamW kernels alone, {args.opt_numel / 1e6:.0f}M fp32 parameters in 200 tensors, "
                  f"{os.cpu_count()} threads, fastest step over 3 interleaved rounds. Floor = 28 bytes/param "
                  "(read p, g, m, v; write p, m, v) / memory bandwidth.", "",
                  "| optimizer | step (ms) | floor (ms) | step / floor |", "|---|---:|---:|---:|"]
        for r in opt_rows:
            if "error" in r:
                lines.append(f"| {r['name']} | failed: {r['error']} | | |")
            else:
                lines.append(f"| {r['name']} | {r['step_s'] * 1e3:.0f} | {r['floor_s'] * 1e3:.0f} | "
                             f"{r['step_s'] / r['floor_s']:.1f} |")
        if "bw" in opt_rows[0]:
            lines += ["", "Measured memory bandwidth (best of in-place x += y on the same 200 tensors, on 256 MB, "
                      f"and a 256 MB copy): {opt_rows[0]['bw'] / 1e9:.1f} GB/s."]
    with atomic_output(path) as tmp, open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, each checked before any process is spawned (one error line naming it)."""
    p = OneLineParser(prog="bench_zero.py", description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--dp", type=int_in(2, 64), default=2, help="data-parallel ranks (ZeRO shards over them); "
                   "keep it <= the cores")
    p.add_argument("--layers", type=positive_int, default=2, help="Llama blocks")
    p.add_argument("--hidden", type=positive_int, default=1024, help="model width, a multiple of 16 (8 heads of "
                                                                     "even width, for RoPE)")
    p.add_argument("--vocab", type=positive_int, default=36000,
                   help="vocabulary (with the defaults: 101M parameters, most in the embedding and untied head)")
    p.add_argument("--seq", type=positive_int, default=64, help="tokens per sequence")
    p.add_argument("--micro", type=positive_int, default=1, help="sequences per micro-batch per rank")
    p.add_argument("--steps", type=positive_int, default=10, help="timed steps (the median is reported)")
    p.add_argument("--warmup", type=positive_int, default=1, help="untimed steps first")
    p.add_argument("--repeats", type=positive_int, default=3, help="rounds over all rows (the ratio's spread)")
    p.add_argument("--opt-numel", type=int_in(200), default=50_000_000,
                   help="parameters of the optimizer-kernel table (in 200 tensors)")
    p.add_argument("--quick", action="store_true", help="smoke run: a tiny model, 2 steps, 1 repeat, small "
                   "optimizer table (checks the script, measures nothing)")
    p.add_argument("--ddp-only", action="store_true", help="only the ZeRO 1-2 vs torch DDP rows")
    p.add_argument("--zero3-only", action="store_true", help="only the ZeRO-3 rows against FSDP2 and DeepSpeed and "
                   "the optimizer tables (the ZeRO 1-2 tables: --overlap-only, --ddp-only)")
    p.add_argument("--overlap-only", action="store_true", help="only the ZeRO 1-2 gather overlap on/off rows (no "
                   "ZeRO-3 peers, no optimizer table); default --out docs/results/bench_zero_overlap.md")
    p.add_argument("--out", default=None, help="the Markdown report (default docs/results/bench_zero.md)")
    args = p.parse_args(argv)
    only = [f"--{k.replace('_', '-')}" for k in ("zero3_only", "overlap_only", "ddp_only") if getattr(args, k)]
    if len(only) > 1:  # each leaves out the others' rows: together they ran no row and wrote a table of "not run"
        p.error(f"{' and '.join(only)} each pick one table's rows (together: none); give one of them")
    name = "bench_zero_overlap.md" if args.overlap_only else "bench_zero_ddp.md" if args.ddp_only else \
        "bench_zero.md"
    args.out = p.results_out(args.out, args.quick, os.path.join(os.path.dirname(__file__), "..", "docs", "results",
                                                                name))
    if args.quick:
        args.layers, args.hidden, args.vocab, args.seq, args.steps, args.warmup, args.repeats = 1, 64, 256, 16, 2, 1, 1
        args.opt_numel = 200_000
    if args.hidden % 16:
        p.error(f"--hidden {args.hidden} must be a multiple of 16 (8 heads of even width, for RoPE)")
    if args.dp > (os.cpu_count() or 1):
        p.error(f"--dp {args.dp}: more ranks than the {os.cpu_count()} cores would time the OS scheduler; "
                f"use --dp <= {os.cpu_count()}")
    try:
        check_output_file("--out", args.out)
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"  # the spawned ranks (and DeepSpeed's OpenMP kernels) inherit it
    load = os.getloadavg()[0]
    results = bench_frameworks(args)
    opt_rows = [] if args.quick or args.overlap_only else bench_optimizer_step(args.opt_numel)
    if args.quick:  # the smoke run still exercises the optimizer-step table (with a nominal bandwidth)
        opt_rows = [{"name": "nominal", "step_s": 1.0, "floor_s": 1.0, "bw": 1e10}]
    args.load = (load, os.getloadavg()[0])
    write_table(os.path.abspath(args.out), args, results, opt_rows)


if __name__ == "__main__":
    main()
