"""ZeRO-3 side by side: hybrid (with and without offload) vs DeepSpeed ZeRO-3 vs torch FSDP2.

    python scripts/bench_zero.py                 # ~3 minutes on 2 CPU cores; writes docs/results/bench_zero.md

Same model (a Llama built from hybrid's layers at tp = 1, so every framework wraps the same
nn.Module), same dp, batch, precision (fp32), same steps, on gloo + CPU. Each row runs in fresh
processes (one per rank) and reports: the fastest step time after a warm-up step (slowest rank), peak RSS per rank
(ru_maxrss), and bytes communicated per step per rank in nccl-tests size convention (hybrid: its
CommLedger; DeepSpeed and FSDP2: torch.distributed collectives wrapped to count the same way).

Second table: one offloaded optimizer step over ~50M fp32 parameters (DeepSpeed CPU Adam, torch
fused / foreach / per-tensor AdamW) against its memory-bandwidth floor: an AdamW step reads
p, g, m, v and writes p, m, v -- 28 bytes per parameter -- at the best streaming bandwidth measured here
(see memory_bandwidth).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from hybrid.cliutil import (HelpFormatter, OneLineParser, atomic_output, check_output_file, int_in,  # noqa: E402
                            positive_int)
from hybrid.testing import run_distributed  # noqa: E402

COUNTED = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_gather", "broadcast",
           "_all_gather_base", "_reduce_scatter_base", "reduce_scatter", "all_gather_single", "reduce_scatter_single")


def count_collectives() -> dict[str, int]:
    """Wrap torch.distributed's collectives to add their size S (nccl-tests convention) to a dict."""
    counts: dict[str, int] = {}

    def nbytes(t):
        return t.numel() * t.element_size() if torch.is_tensor(t) else sum(nbytes(x) for x in t)

    def wrap(name, fn):
        def counted(*args, **kw):
            tensors = [a for a in (*args, *kw.values())
                       if torch.is_tensor(a) or (isinstance(a, (list, tuple)) and a and torch.is_tensor(a[0]))]
            # S: the gathered output of an all-gather, the full input of a reduce-scatter, else the tensor
            pick = 1 if "reduce_scatter" in name else 0
            counts[name] = counts.get(name, 0) + (nbytes(tensors[pick]) if len(tensors) > pick else 0)
            return fn(*args, **kw)
        return counted

    for name in COUNTED:
        if hasattr(dist, name):
            setattr(dist, name, wrap(name, getattr(dist, name)))
    return counts


def model_config(args):
    from transformers import LlamaConfig
    from models import from_hf
    return from_hf(LlamaConfig(num_hidden_layers=args.layers, hidden_size=args.hidden, num_attention_heads=8,
                               num_key_value_heads=8, intermediate_size=args.hidden * 3, vocab_size=256,
                               max_position_embeddings=args.seq, tie_word_embeddings=False))


def build(args):
    from hybrid.comm import Group
    from hybrid.tp import TPContext
    from models import build_model
    return build_model(model_config(args), TPContext(Group.solo("tp")), seed=1)


def batch(args, rank: int, it: int):
    gen = torch.Generator().manual_seed(1000 * it + rank)
    ids = torch.randint(0, 256, (args.micro, args.seq + 1), generator=gen)
    return ids[:, :-1], ids[:, 1:]


def _time_steps(step, args) -> list[float]:
    times = []
    for it in range(args.steps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        step(it)
        times.append(time.perf_counter() - t0)
    return times[1:]  # the first step builds buffers and kernels


def run_hybrid(rank, world, args, offload):
    from hybrid.mesh import Mesh, ParallelDims
    from hybrid.training import LocalForwardBackward, OptimizerConfig, train_step
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    mesh = Mesh.build(ParallelDims(dp=world))
    model = torch.nn.ModuleList([build(args)])
    zero = ZeroOptimizer(model, mesh, ZeroConfig(stage=3, offload_optimizer=offload, offload_params=offload),
                         OptimizerConfig(lr=1e-3))

    def step(it):
        mesh.ledger.reset()
        train_step(model, [batch(args, rank, it)], zero, mesh, runner=LocalForwardBackward(model[0], mesh.device))
    times = _time_steps(step, args)
    return {"times": times, "bytes": sum(e.bytes for (op, g), e in mesh.ledger.entries.items() if ":" not in g),
            "optimizer": zero.optimizer_kind}


def run_deepspeed(rank, world, args, offload):
    counts = count_collectives()
    import deepspeed
    model = build(args)
    cfg = {"train_micro_batch_size_per_gpu": args.micro, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": 3}, "steps_per_print": 10**9}
    if offload:
        cfg["zero_optimization"].update(offload_optimizer={"device": "cpu"}, offload_param={"device": "cpu"})
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3}}
        engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    else:
        engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                                 config=cfg)

    def step(it):
        counts.clear()
        x, y = batch(args, rank, it)
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
    times = _time_steps(step, args)
    return {"times": times, "bytes": sum(counts.values()), "optimizer": type(opt).__name__}


def run_fsdp2(rank, world, args, offload):
    counts = count_collectives()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
    model = build(args)
    mesh = init_device_mesh("cpu", (world,))
    policy = CPUOffloadPolicy(pin_memory=False) if offload else OffloadPolicy()
    for block in model.layers.values():
        fully_shard(block, mesh=mesh, offload_policy=policy)
    fully_shard(model, mesh=mesh, offload_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(it):
        counts.clear()
        x, y = batch(args, rank, it)
        model(x, y).backward()
        opt.step()
        opt.zero_grad()
    times = _time_steps(step, args)
    return {"times": times, "bytes": sum(counts.values()), "optimizer": "torch AdamW"}


def _row(fn, args, offload):
    torch.set_num_threads(1)
    out = fn(dist.get_rank(), dist.get_world_size(), args, offload)
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _spawned(rank, world, name, args, offload):
    return _row(RUNNERS[name], args, offload)


RUNNERS = {"hybrid ZeRO-3": run_hybrid, "DeepSpeed ZeRO-3": run_deepspeed, "torch FSDP2": run_fsdp2}


def bench_frameworks(args) -> list[dict]:
    rows = []
    for offload in (False, True):
        for name in RUNNERS:
            t0 = time.time()
            try:
                res = run_distributed(_spawned, args.dp, args=(name, args, offload), timeout=300)
                # fastest step of each rank (the least disturbed on a shared machine), slowest rank
                step = max(min(r["times"]) for r in res)
                rows.append({"name": name, "offload": offload, "step_s": step, "rss_mb": max(r["rss_mb"] for r in res),
                             "bytes": res[0]["bytes"], "optimizer": res[0]["optimizer"]})
            except Exception as e:  # a framework that does not run here is reported, not hidden
                rows.append({"name": name, "offload": offload, "error": str(e).strip().splitlines()[-1][:160]})
            print(f"{name} offload={offload}: {rows[-1]} ({time.time() - t0:.0f}s)", flush=True)
    return rows


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


def write_table(path: str, args, rows: list[dict], opt_rows: list[dict]) -> None:
    base = {r["offload"]: r["step_s"] for r in rows if r["name"] == "hybrid ZeRO-3" and "step_s" in r}
    cfg = model_config(args)
    lines = [f"# ZeRO-3 benchmark (`python scripts/bench_zero.py`)", "",
             f"Llama {args.layers} layers, hidden {args.hidden} ({cfg.num_parameters / 1e6:.1f}M parameters), fp32, "
             f"dp {args.dp} on gloo/CPU ({os.cpu_count()} cores, 1 thread per rank), micro-batch {args.micro} x seq "
             f"{args.seq}; step = fastest of {args.steps} steps after one warm-up, slowest rank. Load average (other "
             f"jobs on this shared machine) {args.load[0]:.1f} at the start, {args.load[1]:.1f} at the end. Ratio = step time / hybrid's with the same "
             "offload setting. Bytes: nccl-tests size S per rank per step, all collectives.", "",
             "| framework | offload | step (ms) | ratio | peak RSS / rank (MB) | bytes / step | optimizer |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        off = "optimizer + params" if r["offload"] else "none"
        if "error" in r:
            lines.append(f"| {r['name']} | {off} | failed: {r['error']} | | | | |")
            continue
        lines.append(f"| {r['name']} | {off} | {r['step_s'] * 1e3:.0f} | {r['step_s'] / base[r['offload']]:.2f} | "
                     f"{r['rss_mb']:.0f} | {r['bytes'] / 1e6:.2f} MB | {r['optimizer']} |")
    lines += ["", f"Offloaded AdamW step, {args.opt_numel / 1e6:.0f}M fp32 parameters in 200 tensors, "
              f"{os.cpu_count()} threads, fastest step over 3 interleaved rounds. Floor = 28 bytes/param (read p, g, m, v; write p, m, v) / memory bandwidth.", "",
              "| optimizer | step (ms) | floor (ms) | step / floor |", "|---|---:|---:|---:|"]
    for r in opt_rows:
        if "error" in r:
            lines.append(f"| {r['name']} | failed: {r['error']} | | |")
        else:
            lines.append(f"| {r['name']} | {r['step_s'] * 1e3:.0f} | {r['floor_s'] * 1e3:.0f} | {r['step_s'] / r['floor_s']:.1f} |")
    if opt_rows and "bw" in opt_rows[0]:
        lines += ["", f"Measured memory bandwidth (best of in-place x += y on the same 200 tensors, on 256 MB, and a 256 MB copy): {opt_rows[0]['bw'] / 1e9:.1f} GB/s."]
    with atomic_output(path) as tmp, open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, each checked before any process is spawned (one error line naming it)."""
    p = OneLineParser(prog="bench_zero.py", description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--dp", type=int_in(2, 64), default=2, help="data-parallel ranks (ZeRO shards over them)")
    p.add_argument("--layers", type=positive_int, default=4, help="Llama blocks")
    p.add_argument("--hidden", type=positive_int, default=512, help="model width, a multiple of 16 (8 heads of "
                                                                    "even width, for RoPE)")
    p.add_argument("--seq", type=positive_int, default=128, help="tokens per sequence")
    p.add_argument("--micro", type=positive_int, default=4, help="sequences per micro-batch per rank")
    p.add_argument("--steps", type=positive_int, default=4, help="timed steps after one warm-up")
    p.add_argument("--opt-numel", type=int_in(200), default=50_000_000,
                   help="parameters of the offloaded-optimizer table (in 200 tensors)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "results", "bench_zero.md"),
                   help="the Markdown report")
    args = p.parse_args(argv)
    if args.hidden % 16:
        p.error(f"--hidden {args.hidden} must be a multiple of 16 (8 heads of even width, for RoPE)")
    try:
        check_output_file("--out", args.out)
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    load = os.getloadavg()[0]
    rows = bench_frameworks(args)
    opt_rows = bench_optimizer_step(args.opt_numel)
    args.load = (load, os.getloadavg()[0])
    write_table(os.path.abspath(args.out), args, rows, opt_rows)


if __name__ == "__main__":
    main()
