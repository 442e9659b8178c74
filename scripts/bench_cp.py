"""Attention forward + backward per rank under context parallelism, against the unsharded attention and, as a peer,
torch's `torch.distributed.tensor.experimental.context_parallel` -- on CPU with gloo ranks (one thread each).

    python scripts/bench_cp.py --out docs/results/bench_cp.md            # the table of docs/context-parallel.md
    python scripts/bench_cp.py --quick --out /tmp/cp.md                  # smoke run (tiny sizes; measures nothing)
    [--seq 8192] [--cp 2] [--heads 8] [--kv-heads 8] [--head-dim 64] [--repeats 10] [--warmup 1]  (defaults)

Rows (milliseconds of one causal attention forward + backward, the median of --repeats after --warmup): wall time
as the slowest rank's after a barrier, and CPU time (the process's, over all its threads, gloo's included) as the
largest rank's. Every process computes on one thread -- the unsharded row too -- so the ideal per-rank time at CP
c is unsharded / c. --cp above this machine's cores is refused (the project's benchmark rule: no more ranks than
cores; ranks sharing a core measure the contention), unless --oversubscribe.

* unsharded: F.scaled_dot_product_attention(is_causal=True) over the whole sequence in one process on one thread
  (torch's CPU flash kernel) -- what one rank would do without CP;
* hybrid p2p / a2a / allgather at CP ranks: `CPContext.attention` on each rank's T/CP load-balanced tokens;
* torch context_parallel (ring, allgather rotation) at CP ranks: SDPA inside `context_parallel(mesh, buffers=[q, k,
  v])`, as torchtitan uses it -- where it runs on gloo / CPU; otherwise its row says why.

The ideal per-rank time at CP c is unsharded / c (the balanced causal work) plus the exposed communication. Timing
claims need a quiet machine: the load average is recorded with the table.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from hybrid.comm import CommLedger, Group  # noqa: E402
from hybrid.cp import CommType, CPContext, shard  # noqa: E402
from hybrid.testing import run_distributed  # noqa: E402


def _one_line_parser():
    """hybrid.cliutil's OneLineParser from this checkout, imported when parsing (`python scripts/...`)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from hybrid.cliutil import OneLineParser
    return OneLineParser


def _inputs(args):
    gen = torch.Generator().manual_seed(0)
    shape = lambda n: (1, n, args.seq, args.head_dim)  # noqa: E731
    q, k, v = (torch.randn(shape(n), generator=gen) for n in (args.heads, args.kv_heads, args.kv_heads))
    return q, k, v, torch.randn(shape(args.heads), generator=gen)


def _time(fn, args, barrier=None) -> tuple[float, float]:
    """(wall ms, CPU ms) of fn, medians over --repeats: wall up to the barrier after it (the slowest rank sets
    it), CPU time of fn alone (this process's, every thread: the barrier's wait excluded)."""
    wall, cpu = [], []
    for i in range(args.warmup + args.repeats):
        if barrier:
            barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        c1 = time.process_time()
        if barrier:
            barrier()
        if i >= args.warmup:
            wall.append(time.perf_counter() - t0)
            cpu.append(c1 - c0)
    return 1e3 * statistics.median(wall), 1e3 * statistics.median(cpu)


def unsharded(args) -> tuple[float, float]:
    torch.set_num_threads(1)  # as each CP rank (run_distributed: one thread each)
    q, k, v, do = _inputs(args)
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def step():
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=args.heads != args.kv_heads).backward(do)
    return _time(step, args)


def _ours(rank: int, world: int, args) -> dict:
    group = Group("cp", tuple(range(world)), dist.group.WORLD, CommLedger())
    q, k, v, do = (shard(t, rank, world, dim=2) for t in _inputs(args))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = {}
    for comm in CommType:
        if comm is CommType.A2A and (args.heads % world or args.kv_heads % world):
            out[comm.value] = f"not run: a2a needs heads ({args.heads}, {args.kv_heads}) divisible by cp {world}"
            continue
        ctx = CPContext(group, comm)
        out[comm.value] = _time(lambda: ctx.attention(q, k, v).backward(do), args, dist.barrier)
    out["torch"] = _torch_peer(rank, world, args)
    return out


def _torch_peer(rank: int, world: int, args):
    """torch's context_parallel around plain SDPA (it shards the buffers in place, head-tail load balanced)."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method
        mesh = init_device_mesh("cpu", (world,))
        set_rotate_method("allgather")
        q, k, v, do = _inputs(args)
        if args.heads != args.kv_heads:  # torch's CP SDPA takes equal heads: repeat K, V (as transformers does)
            r = args.heads // args.kv_heads
            k, v = k.repeat_interleave(r, 1), v.repeat_interleave(r, 1)

        def step():
            qq, kk, vv, dd = (t.clone() for t in (q, k, v, do))
            with context_parallel(mesh, buffers=[qq, kk, vv, dd], buffer_seq_dims=[2, 2, 2, 2],
                                  no_restore_buffers={qq, kk, vv, dd}):
                qq, kk, vv = (t.requires_grad_() for t in (qq, kk, vv))
                F.scaled_dot_product_attention(qq, kk, vv, is_causal=True).backward(dd)
        return _time(step, args, dist.barrier)
    except Exception as e:  # a peer that does not run here is reported, not hidden
        return f"not run on gloo/CPU: {type(e).__name__}: {str(e).splitlines()[0][:160]}"


def table(args) -> str:
    base, base_cpu = unsharded(args)
    ranks = run_distributed(_ours, args.cp, args=(args,), timeout=3600)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [f"attention forward + backward, causal, seq {args.seq}, {args.heads} query / {args.kv_heads} kv heads, "
             f"head dim {args.head_dim}, fp32, every process 1 thread, CP {args.cp} gloo ranks on {cores()} cores; "
             f"median of {args.repeats} runs after {args.warmup} warm-up; {platform.processor() or 'cpu'}, "
             f"load average {load:.1f}, torch {torch.__version__}", "",
             "| attention | per-rank wall ms | per-rank CPU ms | wall vs unsharded | CPU vs unsharded | "
             "CPU vs unsharded / CP |", "|---|---|---|---|---|---|",
             f"| unsharded (one process, SDPA flash) | {base:.1f} | {base_cpu:.1f} | 1.00 | 1.00 | {args.cp:.2f} |"]
    for name in [c.value for c in CommType] + ["torch"]:
        values = [r[name] for r in ranks]
        label = f"torch context_parallel (CP {args.cp})" if name == "torch" else f"hybrid {name} (CP {args.cp})"
        if any(isinstance(x, str) for x in values):
            why = next(x for x in values if isinstance(x, str))
            lines.append(f"| {label} | {why} | | | | |")
            continue
        ms, cpu = max(w for w, _ in values), max(c for _, c in values)
        lines.append(f"| {label} | {ms:.1f} | {cpu:.1f} | {ms / base:.2f} | {cpu / base_cpu:.2f} | "
                     f"{cpu / (base_cpu / args.cp):.2f} |")
    return "\n".join(lines) + "\n"


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check(args) -> None:
    """Bad sizes: ValueError naming the flag and the fix, before any process starts."""
    for flag, value in (("--seq", args.seq), ("--heads", args.heads), ("--kv-heads", args.kv_heads),
                        ("--head-dim", args.head_dim), ("--repeats", args.repeats)):
        if value < 1:
            raise ValueError(f"{flag} {value} must be a positive integer")
    if args.warmup < 0:
        raise ValueError(f"--warmup {args.warmup} must be 0 or more")
    if not 2 <= args.cp <= 8:
        raise ValueError(f"--cp {args.cp}: use 2 to 8 ranks (gloo processes on this machine)")
    if args.seq % (2 * args.cp):
        raise ValueError(f"--seq {args.seq} is not divisible by 2 x --cp ({2 * args.cp}): the load-balanced "
                         f"split cuts it into 2 x --cp chunks")
    if args.heads % args.kv_heads:
        raise ValueError(f"--heads {args.heads} is not divisible by --kv-heads {args.kv_heads}")
    if args.cp > cores() and not (args.oversubscribe or args.quick):
        raise ValueError(f"--cp {args.cp} is more ranks than this machine's {cores()} cores: ranks sharing a core "
                         f"time the contention (no more ranks than cores); use --cp {cores()} or less, or "
                         f"--oversubscribe")


def main(argv=None) -> None:
    p = _one_line_parser()(prog="bench_cp.py", description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=8192, help="tokens of the one sequence (divisible by 2 x --cp)")
    p.add_argument("--cp", type=int, default=2, help="context-parallel ranks, 2 to 8 and at most the machine's "
                   "cores (gloo, one thread each)")
    p.add_argument("--heads", type=int, default=8, help="query heads")
    p.add_argument("--kv-heads", type=int, default=8, help="key/value heads (dividing --heads; fewer: GQA)")
    p.add_argument("--head-dim", type=int, default=64, help="head dimension")
    p.add_argument("--repeats", type=int, default=10, help="timed runs (the median is reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one repeat, CP 2 on any machine: checks the "
                   "script runs (times nothing)")
    p.add_argument("--oversubscribe", action="store_true", help="allow --cp above the machine's cores (the "
                   "timings then include the ranks' contention for cores)")
    p.add_argument("--out", default=None, help="write the table here (markdown)")
    args = p.parse_args(argv)
    p.check_out("--out", args.out)
    if args.quick:
        args.seq, args.cp, args.heads, args.kv_heads, args.head_dim, args.repeats, args.warmup = 256, 2, 4, 2, 16, 1, 1
    try:
        check(args)
    except ValueError as e:
        p.error(str(e))  # "bench_cp.py: error: ...", as its flag errors (it lacked "error:")
    text = table(args)
    print(text, end="")
    if args.out:
        from hybrid.cliutil import write_text  # whole or not at all, never through a link
        write_text(args.out, text)


if __name__ == "__main__":
    main()
