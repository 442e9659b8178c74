"""Checkpoint save / load throughput and the time training is blocked: hybrid vs torch FSDP2 + DCP vs DeepSpeed.

    python scripts/bench_checkpoint.py                 # writes docs/results/bench_checkpoint.md (~10 min idle)
    python scripts/bench_checkpoint.py --quick --out /tmp/c.md   # smoke run (tiny model; measures nothing)

The same model as scripts/bench_zero.py (a ~100M-parameter Llama built from hybrid's layers at tp 1, so every
framework wraps the same nn.Module), fp32, ZeRO-3 / FULL_SHARD over `--dp` gloo ranks on CPU, after one
training step (so the AdamW moments exist). What each saves is the resumable state: fp32 parameters and both
AdamW moments, sharded, each rank writing its own part. Rows, each in fresh processes per repeat:

* hybrid ZeRO-3: `hybrid.checkpoint.core.start_save(...).finish()` (DCP + ShardedTensor, every file fsynced,
  manifest of sha256 checksums, rename, `latest`); `--async-save`'s path (stage a CPU copy, write in a thread on
  its own gloo group); load = sha256 of every file + DCP read;
* torch FSDP2 + DCP, as torchtitan does it: `fully_shard` per block + root, `get_state_dict(model, optimizer)`,
  `dcp.save` (FileSystemWriter, fsynced) / `dcp.async_save` on a separate gloo group, load = `dcp.load` +
  `set_state_dict`;
* DeepSpeed ZeRO-3 (DS_ACCELERATOR=cpu, bench_zero.py's recommended ZeRO-3 config) `engine.save_checkpoint` /
  `engine.load_checkpoint` with its default checkpoint engine (torch.save per rank). DeepSpeed does not fsync:
  "until durable" adds an fsync of its files, so every row is compared at the same guarantee.

Per repeat and row: the disk's write bandwidth (each rank writes and fsyncs 1/dp of the checkpoint's bytes at
once) and read bandwidth (the same files read back after their pages are evicted), a synchronous save, an
asynchronous one (blocked = until the call returns; complete = until the checkpoint is durable), and a load from
disk (each checkpoint file's pages evicted from the page cache first, posix_fadvise DONTNEED; nothing
system-wide). Times are the slowest rank's. After each load the state is checked against the saved one (the
parameters and moments are perturbed before loading), so a load that skipped something cannot look fast.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import bench_zero  # noqa: E402  (the model, its batches and DeepSpeed's recommended ZeRO-3 config)
from hybrid.checkpoint.store import fsync_path  # noqa: E402
from hybrid.cliutil import (HelpFormatter, OneLineParser, cpu_name, int_in, package_version,  # noqa: E402
                            positive_int, write_text)
from hybrid.testing import run_distributed  # noqa: E402


# --- the file system ---------------------------------------------------------------------------------
def files_under(directory: str) -> list[str]:
    return sorted(os.path.join(d, n) for d, _, names in os.walk(directory) for n in names)


def fsync_all(directory: str) -> None:
    for path in files_under(directory):
        fsync_path(path)


def evict(directory: str) -> None:
    """Drop these files' (clean) pages from the page cache, so the next read comes from the disk."""
    for path in files_under(directory):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def dir_bytes(directory: str) -> int:
    return sum(os.path.getsize(p) for p in files_under(directory))


def timed(fn) -> float:
    """Seconds of `fn()` on the slowest rank (every rank starts together)."""
    dist.barrier()
    t = time.perf_counter()
    fn()
    mine = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return float(mine)


def disk_bandwidth(directory: str, nbytes: int) -> tuple[float, float]:
    """(write, read) GB/s of the disk as the ranks use it: each writes nbytes / world bytes to its own file
    and fsyncs it, all at once; then each reads its file back after evicting its pages."""
    rank, world = dist.get_rank(), dist.get_world_size()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"probe.{rank}")
    share = max(1, nbytes // world)
    block = os.urandom(min(share, 1 << 24))

    def write():
        with open(path, "wb") as f:
            left = share
            while left > 0:
                f.write(block[:left])
                left -= len(block)
            f.flush()
            os.fsync(f.fileno())

    def read():
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
    w = timed(write)
    evict(directory)
    r = timed(read)
    os.remove(path)
    return share * world / w / 1e9, share * world / r / 1e9


# --- one framework: build + one step, then save / async save / load ----------------------------------
class Hybrid:
    name = "hybrid ZeRO-3"

    def __init__(self, args, rank: int, world: int):
        from hybrid.checkpoint import core
        from hybrid.mesh import Mesh, ParallelDims
        from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
        from hybrid.zero import ZeroConfig, ZeroOptimizer
        self.core = core
        self.mesh = Mesh.build(ParallelDims(dp=world))
        self.model = torch.nn.ModuleList([bench_zero.build(args)])
        self.opt = ZeroOptimizer(self.model, self.mesh, ZeroConfig(stage=3), OptimizerConfig(lr=1e-3,
                                                                                              weight_decay=0.01))
        self.names = core.param_names(self.model)
        from hybrid.comm import Group
        self.pg = Group.create("ckpt", list(range(world)), self.mesh.ledger, backend="gloo")  # as RunCheckpoints
        train_step(self.model, [bench_zero.batch(args, rank, 0)], self.opt, self.mesh,
                   runner=LocalForwardBackward(self.model[0], self.mesh.device))

    def tensors(self) -> list[torch.Tensor]:
        out = []
        for u in self.opt.units:
            out.append(u.master)
            out += [self.opt.optimizer.state[v][k] for v in u.views for k in self.core.MOMENTS]
        return out

    def save(self, d: str, asynchronous: bool = False):
        pending = self.core.start_save(self.opt, self.names, None, d, 1, self.state_json(), pg=self.pg,
                                       asynchronous=asynchronous)
        return pending.finish if asynchronous else pending.finish()

    def state_json(self) -> dict:
        """The state.json fields a resume checks (store.read_state): a training run's, one Adam step in."""
        return {"iteration": 1, "consumed_samples": 0, "adam_step": 1, "model": "bench",
                "layout": {"tp": 1, "pp": 1, "dp": self.mesh.dims.dp, "zero": 3},
                "scaler": {"loss_scale": 1.0, "good_steps": 0, "skipped_steps": 0}}

    def load(self, d: str) -> None:
        from hybrid.checkpoint import store
        path = store.final_path(d, 1)
        t = time.perf_counter()
        error = self.core.verify(path, self.pg)  # ends in an all-gather: about the slowest rank's time
        self.verify_s = time.perf_counter() - t
        if error:
            raise RuntimeError(error)
        self.core.load(self.opt, self.names, None, path, rng_too=False, pg=self.pg)


class FSDP2:
    name = "torch FSDP2 + DCP"

    def __init__(self, args, rank: int, world: int):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        self.model = bench_zero.build(args)
        mesh = init_device_mesh("cpu", (world,))
        for block in self.model.layers.values():
            fully_shard(block, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        self.opt = torch.optim.AdamW(self.model.parameters(), fused=True, **bench_zero._adamw_kw(args))
        self.pg = dist.new_group(backend="gloo")  # torchtitan: async_save on its own gloo group
        x, y = bench_zero.batch(args, rank, 0)
        self.model(x, y).backward()
        self.opt.step()
        self.opt.zero_grad()

    def tensors(self) -> list[torch.Tensor]:
        out = []
        for p in self.model.parameters():
            out.append(p.to_local())
            out += [self.opt.state[p][k].to_local() for k in ("exp_avg", "exp_avg_sq")]
        return out

    def _state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict
        msd, osd = get_state_dict(self.model, self.opt)
        return {"model": msd, "optim": osd}

    def save(self, d: str, asynchronous: bool = False):
        import torch.distributed.checkpoint as dcp
        writer = dcp.FileSystemWriter(d, sync_files=True)
        if asynchronous:
            future = dcp.async_save(self._state(), storage_writer=writer, process_group=self.pg)
            return future.result
        dcp.save(self._state(), storage_writer=writer)

    def load(self, d: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict
        state = self._state()
        dcp.load(state, storage_reader=dcp.FileSystemReader(d))
        set_state_dict(self.model, self.opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


class DeepSpeed:
    name = "DeepSpeed ZeRO-3"

    def __init__(self, args, rank: int, world: int):
        import deepspeed
        model = bench_zero.build(args)
        from hybrid.zero.cpu_adam_build import load_op
        load_op("deepspeed_shm_comm")  # its CPU collectives op, loaded here first: a stale build lock is named
        load_op("fused_adam")  # the config's AdamW, built by initialize otherwise: the same
        self.engine, self.opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                           config=bench_zero.deepspeed_config(args))
        x, y = bench_zero.batch(args, rank, 0)
        self.engine.backward(self.engine(x, y))
        self.engine.step()

    def tensors(self) -> list[torch.Tensor]:
        out = []
        for flat in self.opt.fp32_partitioned_groups_flat:  # this rank's fp32 master partition per group
            out.append(flat)
            out += [self.opt.optimizer.state[flat][k] for k in ("exp_avg", "exp_avg_sq")]
        return out

    def save(self, d: str, asynchronous: bool = False):
        if asynchronous:
            raise NotImplementedError
        self.engine.save_checkpoint(d, tag="bench")

    def load(self, d: str) -> None:
        path, _ = self.engine.load_checkpoint(d, tag="bench")
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint in {d}")


FRAMEWORKS = [Hybrid, FSDP2, DeepSpeed]
NO_ASYNC = {"DeepSpeed ZeRO-3": "n/a: DeepSpeed's asynchronous engines (decoupled / fast) need the async_io op "
                                "(DeepNVMe, libaio), not compatible on this machine"}


def _fingerprint(fw) -> torch.Tensor:
    return torch.stack([t.detach().double().sum() for t in fw.tensors()])


def measure(fw, root: str) -> dict:
    """One repeat of one framework (collective)."""
    rank = dist.get_rank()
    d = os.path.join(root, "sync")
    row = {"save_s": timed(lambda: fw.save(d))}
    row["durable_s"] = row["save_s"] + timed(lambda: fsync_all(d) if rank == 0 else None)
    row["bytes"] = dir_bytes(d)
    row["disk_write_gbps"], row["disk_read_gbps"] = disk_bandwidth(os.path.join(root, "probe"), row["bytes"])
    want = _fingerprint(fw)
    with torch.no_grad():  # perturb what the load must restore
        for t in fw.tensors():
            t.add_(1.0)
    if rank == 0:
        evict(d)
    row["load_s"] = timed(lambda: fw.load(d))
    if hasattr(fw, "verify_s"):
        row["verify_s"] = fw.verify_s
    got = _fingerprint(fw)
    if not torch.equal(got, want):
        raise RuntimeError(f"{fw.name}: the loaded state differs from the saved one")
    if fw.name not in NO_ASYNC:
        a = os.path.join(root, "async")
        wait = []
        row["async_blocked_s"] = timed(lambda: wait.append(fw.save(a, asynchronous=True)))
        row["async_total_s"] = row["async_blocked_s"] + timed(lambda: wait[0]())
    dist.barrier()
    if rank == 0:
        shutil.rmtree(root, ignore_errors=True)
    dist.barrier()
    return row


def _spawned(rank, world, index, args, root):
    torch.set_num_threads(1)
    fw = FRAMEWORKS[index](args, rank, world)
    return measure(fw, os.path.join(root, f"row{index}"))


def _spawned_all(rank, world, args, root):
    """--quick: every row in the same processes (start-up paid once; measures nothing)."""
    return [_spawned(rank, world, i, args, root) for i in range(len(FRAMEWORKS))]


def run_row(index: int, args, root: str) -> dict:
    try:
        return run_distributed(_spawned, args.dp, args=(index, args, root), timeout=1800)[0]
    except Exception as e:  # a framework that does not run here is reported, not hidden
        return {"error": str(e).strip().splitlines()[-1][:160]}


def bench(args, root: str) -> list[list[dict]]:
    """results[repeat][row]; each repeat runs every row once in turn, in fresh processes."""
    if args.quick:
        return [run_distributed(_spawned_all, args.dp, args=(args, root), timeout=900)[0]]
    results = []
    for rep in range(args.repeats):
        results.append([])
        for i, fw in enumerate(FRAMEWORKS):
            t0 = time.time()
            results[-1].append(run_row(i, args, root))
            print(f"repeat {rep + 1}/{args.repeats} {fw.name}: {results[-1][-1]} ({time.time() - t0:.0f}s, "
                  f"load {os.getloadavg()[0]:.1f})", flush=True)
    return results


# --- the report --------------------------------------------------------------------------------------
def cell(values: list[float], fmt: str = "{:.2f}") -> str:
    """median (min - max)"""
    if not values:
        return ""
    med = fmt.format(statistics.median(values))
    return med if fmt.format(min(values)) == fmt.format(max(values)) else f"{med} ({fmt.format(min(values))} - {fmt.format(max(values))})"


def table(results: list[list[dict]]) -> list[str]:
    lines = ["| framework | checkpoint GB | save call s | until durable s | durable save GB/s | disk write GB/s "
             "(same run) | save / disk | async: training blocked s | async: until durable s | load s (from disk) | "
             "load GB/s | disk read GB/s (same run) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, fw in enumerate(FRAMEWORKS):
        ok = [r[i] for r in results if "save_s" in r[i]]
        if not ok:
            lines.append(f"| {fw.name} | failed: {results[0][i].get('error', '?')} |" + " |" * 12)
            continue
        gb = [r["bytes"] / 1e9 for r in ok]
        save_gbps = [r["bytes"] / r["durable_s"] / 1e9 for r in ok]
        ratio = [r["bytes"] / r["durable_s"] / 1e9 / r["disk_write_gbps"] for r in ok]
        load_gbps = [r["bytes"] / r["load_s"] / 1e9 for r in ok]
        if fw.name in NO_ASYNC:
            blocked, total = NO_ASYNC[fw.name], ""
        else:
            blocked, total = cell([r["async_blocked_s"] for r in ok]), cell([r["async_total_s"] for r in ok])
        lines.append(f"| {fw.name} | {cell(gb, '{:.3f}')} | {cell([r['save_s'] for r in ok])} | "
                     f"{cell([r['durable_s'] for r in ok])} | {cell(save_gbps, '{:.3f}')} | "
                     f"{cell([r['disk_write_gbps'] for r in ok], '{:.3f}')} | {cell(ratio)} | {blocked} | {total} | "
                     f"{cell([r['load_s'] for r in ok])} | {cell([r['verify_s'] for r in ok if 'verify_s' in r]) or 'none kept'} | "
                     f"{cell(load_gbps, '{:.3f}')} | "
                     f"{cell([r['disk_read_gbps'] for r in ok], '{:.3f}')} |")
    return lines


def write_report(path: str, args, results: list[list[dict]]) -> None:
    cfg = bench_zero.model_config(args)
    lines = ["# Checkpoint benchmark (`python scripts/bench_checkpoint.py" + (" --quick" if args.quick else "") + "`)",
             "",
             *(["**--quick smoke run: tiny model, all rows in one pair of processes; these numbers measure "
                "nothing.**", ""] if args.quick else []),
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; machine: "
             f"{os.cpu_count()}-core CPU ({cpu_name()}), shared with other jobs; 1-min load average "
             f"{args.load[0]:.2f} at the start, {args.load[1]:.2f} at the end (above {os.cpu_count()} means other "
             f"processes competed for the cores and the disk); disk: the file system of {args.dir}",
             f"- versions: torch {torch.__version__}, deepspeed {package_version('deepspeed')}",
             f"- model: Llama, {args.layers} layers, hidden {args.hidden}, 8 heads, FFN {3 * args.hidden}, vocab "
             f"{args.vocab}, untied head: {cfg.num_parameters / 1e6:.1f}M parameters, fp32; saved: parameters + "
             f"AdamW exp_avg + exp_avg_sq = 12 bytes x {cfg.num_parameters / 1e6:.1f}M = "
             f"{12 * cfg.num_parameters / 1e9:.3f} GB plus each format's metadata",
             f"- run: ZeRO-3 / FULL_SHARD over dp {args.dp} gloo ranks, one thread per rank, one training step "
             f"before the saves; {args.repeats} repeat(s), each running every row once in fresh processes, in the "
             "order below; each cell: median over repeats (min - max); every time the slowest rank's",
             "- save call: until the framework's save returns (hybrid, DCP: every file fsynced, hybrid also "
             "checksums, renames and writes `latest`; DeepSpeed: torch.save, no fsync). until durable: plus an "
             "fsync of every file of the checkpoint (the durability hybrid and DCP already have). GB/s = "
             "checkpoint bytes / until-durable time. disk write GB/s: each rank writes and fsyncs 1/dp of the "
             "checkpoint's bytes at once, in the same processes, just after the save",
             "- async: blocked = until the asynchronous save call returns (the CPU staging copy); until durable = "
             "until its write completes (hybrid: finish(); DCP: the future). load: each checkpoint file's pages "
             "evicted first (posix_fadvise DONTNEED), the loaded state checked against the saved one; hybrid's "
             "includes the sha256 of every file",
             "- peers as their docs recommend: FSDP2 + DCP as torchtitan (get_state_dict / set_state_dict, "
             "FileSystemWriter, async_save on a separate gloo group); DeepSpeed ZeRO-3 with bench_zero.py's "
             "recommended config and its default checkpoint engine",
             "", *table(results)]
    write_text(path, "\n".join(lines) + "\n")
    print("\n".join(lines))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(prog="bench_checkpoint.py", description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--dp", type=int_in(1, 64), default=2, help="ranks (ZeRO-3 / FULL_SHARD over them); keep it <= "
                                                              "the cores")
    p.add_argument("--layers", type=positive_int, default=2, help="Llama blocks")
    p.add_argument("--hidden", type=positive_int, default=1024, help="model width, a multiple of 16")
    p.add_argument("--vocab", type=positive_int, default=36000, help="vocabulary (with the defaults: 101M parameters)")
    p.add_argument("--seq", type=positive_int, default=64, help="tokens per sequence of the one training step")
    p.add_argument("--micro", type=positive_int, default=1, help="sequences per rank in the one training step")
    p.add_argument("--repeats", type=positive_int, default=3, help="repeats of every row (the spread)")
    p.add_argument("--dir", default=None, help="scratch directory on the disk to measure (default: a new one under "
                                               "the system temp directory); removed afterwards")
    p.add_argument("--quick", action="store_true", help="smoke run: a tiny model, 1 repeat (measures nothing)")
    p.add_argument("--out", default=None, help="the Markdown report (default docs/results/bench_checkpoint.md; "
                                               "--quick: required)")
    args = p.parse_args(argv)
    args.out = p.results_out(args.out, args.quick, os.path.join(os.path.dirname(__file__), "..", "docs", "results",
                                                                "bench_checkpoint.md"))
    if args.quick:
        args.layers, args.hidden, args.vocab, args.seq, args.repeats = 1, 64, 256, 16, 1
    if args.hidden % 16:
        p.error(f"--hidden {args.hidden} must be a multiple of 16 (8 heads of even width, for RoPE)")
    if args.dp > (os.cpu_count() or 1):
        p.error(f"--dp {args.dp}: more ranks than the {os.cpu_count()} cores; use --dp <= {os.cpu_count()}")
    if args.dir is not None and os.path.exists(args.dir) and not os.path.isdir(args.dir):
        p.error(f"--dir {args.dir!r} exists and is not a directory")
    p.check_out("--out", args.out)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    os.makedirs(args.dir, exist_ok=True) if args.dir else None
    root = tempfile.mkdtemp(prefix="bench_checkpoint.", dir=args.dir)
    args.dir = os.path.dirname(root)
    load = os.getloadavg()[0]
    try:
        results = bench(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    args.load = (load, os.getloadavg()[0])
    write_report(os.path.abspath(args.out), args, results)


if __name__ == "__main__":
    main()
