"""gloo's collectives against the same results built from other gloo collectives: which way should hybrid's `Group`
run an all-gather and a reduce-scatter on CPU?

    python scripts/bench_collectives.py                 # writes docs/results/bench_collectives.md
    python scripts/bench_collectives.py --quick --out /tmp/c.md   # smoke run (small sizes, 2 steps)

Each row is one way of producing the same output on every rank (checked equal to the native collective's before
timing), over `--ranks` gloo processes with one thread each:

* all-gather (output S bytes, each rank's input S / n): gloo's `all_gather_into_tensor`; an all-reduce of the
  zero-filled output with this rank's shard written in (x + 0 = x exactly); a ring of point-to-point sends.
* reduce-scatter (input S bytes, output S / n): gloo's `reduce_scatter_tensor`; an all-reduce of a copy of the
  input, then this rank's slice; a ring of point-to-point sends, each rank adding its own chunk to what arrives.

Wire bytes per rank, ideal: all-gather and reduce-scatter (n-1)/n S, all-reduce 2(n-1)/n S. The time is the median
over `--steps` calls (a barrier before each), the slowest rank's; `--repeats` rounds give the spread.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from hybrid.cliutil import HelpFormatter, OneLineParser, cpu_name, positive_int, write_text  # noqa: E402
from hybrid.testing import run_distributed  # noqa: E402

MB = 2**20


def ring_all_gather(out: torch.Tensor, shard: torch.Tensor, rank: int, world: int) -> None:
    """Step s: send the chunk received at step s - 1 (own chunk at s = 0) to rank + 1, receive chunk
    (rank - s - 1) mod n from rank - 1. n - 1 steps, (n-1)/n S bytes sent per rank."""
    chunks = list(out.chunk(world))
    chunks[rank].copy_(shard)
    for s in range(world - 1):
        send, recv = chunks[(rank - s) % world], chunks[(rank - s - 1) % world]
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()


def ring_reduce_scatter(out: torch.Tensor, full: torch.Tensor, rank: int, world: int) -> None:
    """Step s: send the running sum of chunk (rank - s - 1) mod n to rank + 1, receive the running sum of chunk
    (rank - s - 2) mod n and add this rank's own part of it; after n - 1 steps the sum of chunk `rank` is here."""
    chunks = list(full.chunk(world))
    acc = chunks[(rank - 1) % world].clone()
    for s in range(world - 1):
        c = (rank - s - 2) % world
        incoming = torch.empty_like(chunks[c])
        ops = [dist.P2POp(dist.isend, acc, (rank + 1) % world), dist.P2POp(dist.irecv, incoming, (rank - 1) % world)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        acc = incoming.add_(chunks[c])
    out.copy_(acc)


def ways(rank: int, world: int, numel: int) -> dict:
    shard = torch.randn(numel // world, generator=torch.Generator().manual_seed(rank))
    full = torch.randn(numel, generator=torch.Generator().manual_seed(100 + rank))
    gathered, part = torch.empty(numel), torch.empty(numel // world)

    def ag_reduce():
        gathered.zero_()
        gathered.chunk(world)[rank].copy_(shard)
        dist.all_reduce(gathered)

    def rs_reduce():
        tmp = full.clone()
        dist.all_reduce(tmp)
        part.copy_(tmp.chunk(world)[rank])

    return {
        ("all-gather", "gloo all_gather_into_tensor"): (lambda: dist.all_gather_into_tensor(gathered, shard), gathered),
        ("all-gather", "all-reduce of the zero-filled output"): (ag_reduce, gathered),
        ("all-gather", "point-to-point ring"): (lambda: ring_all_gather(gathered, shard, rank, world), gathered),
        ("reduce-scatter", "gloo reduce_scatter_tensor"): (lambda: dist.reduce_scatter_tensor(part, full), part),
        ("reduce-scatter", "all-reduce, then the rank's slice"): (rs_reduce, part),
        ("reduce-scatter", "point-to-point ring"): (lambda: ring_reduce_scatter(part, full, rank, world), part),
    }


def measure(rank: int, world: int, sizes: list[int], steps: int) -> dict:
    torch.set_num_threads(1)
    out = {}
    for numel in sizes:
        rows = ways(rank, world, numel)
        reference = {}
        for (op, how), (fn, result) in rows.items():
            fn()
            if op not in reference:
                reference[op] = result.clone()
            elif not torch.allclose(result, reference[op], rtol=1e-6, atol=1e-6):
                raise RuntimeError(f"{op} by {how} differs from gloo's native result")
            times = []
            for _ in range(steps):
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            out[(numel, op, how)] = times
    return out


def parse(argv):
    p = OneLineParser(prog="bench_collectives.py", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--ranks", type=positive_int, default=2, help="gloo ranks (no more than cores)")
    p.add_argument("--mb", default="16,128,400", help="output sizes in MiB (fp32), comma-separated")
    p.add_argument("--steps", type=positive_int, default=10, help="timed calls per row (median)")
    p.add_argument("--repeats", type=positive_int, default=3, help="rounds (the spread)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 MiB, 2 steps, 1 repeat")
    p.add_argument("--out", default=None, help="Markdown report (default docs/results/bench_collectives.md)")
    args = p.parse_args(argv)
    if args.quick:
        args.mb, args.steps, args.repeats = "1", 2, 1
    try:
        args.sizes = [int(float(x) * MB / 4) // args.ranks * args.ranks for x in args.mb.split(",")]
    except ValueError:
        p.error(f"--mb {args.mb!r}: give sizes in MiB separated by commas, e.g. 16,128")
    if any(n < args.ranks for n in args.sizes):
        p.error(f"--mb {args.mb!r}: every size must hold at least one float per rank")
    args.out = p.results_out(args.out, args.quick, os.path.join(os.path.dirname(__file__), "..", "docs", "results",
                                                                "bench_collectives.md"))
    p.check_out("--out", args.out)  # the parser's one line (check_output_file's ValueError was a traceback)
    return args


def main(argv=None) -> None:
    args = parse(argv)
    load0 = os.getloadavg()[0]
    rounds = []
    for r in range(args.repeats):
        per_rank = run_distributed(measure, args.ranks, args=(args.sizes, args.steps), timeout=3600)
        slowest = {k: [max(ts[i] for ts in (pr[k] for pr in per_rank)) for i in range(args.steps)]
                   for k in per_rank[0]}
        rounds.append({k: statistics.median(v) for k, v in slowest.items()})
        print(f"round {r + 1}/{args.repeats} done", flush=True)
    lines = [
        "# gloo collectives (`python scripts/bench_collectives.py`)", "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; machine: {os.cpu_count()}-core "
        f"CPU ({cpu_name()}); 1-min load average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end",
        f"- torch {torch.__version__}; {args.ranks} gloo ranks, one thread each; fp32; median of {args.steps} calls "
        f"(slowest rank), {args.repeats} repeats: median (min - max over repeats)",
        "- ratio = native time / this way's time in the same repeat: above 1.0 this way is faster", "",
        "| op | size (MiB) | way | ms | ratio to native |", "|---|---:|---|---:|---:|"]
    for (numel, op, how) in rounds[0]:
        ms = [rd[(numel, op, how)] * 1e3 for rd in rounds]
        native = next(h for (n, o, h) in rounds[0] if n == numel and o == op)
        ratios = [rd[(numel, op, native)] / rd[(numel, op, how)] for rd in rounds]
        rtxt = "(native)" if how == native else \
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f} - {max(ratios):.2f})"
        lines.append(f"| {op} | {numel * 4 / MB:.0f} | {how} | {statistics.median(ms):.1f} "
                     f"({min(ms):.1f} - {max(ms):.1f}) | {rtxt} |")
    write_text(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
