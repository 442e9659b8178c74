"""Speed of hybrid's tensor-parallel layers and models against their peers, side by side, on CPU.

    python scripts/bench_tp.py --out docs/results/bench_tp.md   # ~14 minutes on 2 cores under load ~16
    python scripts/bench_tp.py --quick --out /tmp/tp.md          # smoke run (tiny sizes; measures nothing)
    [--runs 3] [--repeats 10] [--mlp-repeats 20] [--warmup 1] [--hidden 1024] [--seq 128] [--batch 1]
    [--layers 2] [--vocab 2048]

Two comparisons in one run:

1. MLP block at tp = 2 (two gloo ranks, one thread each), forward + backward:
       Y = GeLU(X A) B,   A = [A_1 A_2] (h -> 4h, column-parallel),   B = [B_1; B_2] (4h -> h, row-parallel)
   ours (hybrid.tp, batch-first (B, T, h)) against megatron-core's tensor_parallel.ColumnParallelLinear /
   RowParallelLinear (sequence-first (T, B, h)), built from the same weights, exact (erf) GeLU on both.
   Both run one all-reduce forward (g, after B_i) and one backward (f, before A_i), and both overlap the
   backward one with the weight-gradient GEMM (megatron's async_op=True; ours hybrid.tp's ColumnParallelLinear
   with enter=True, one autograd node); the input requires grad, as inside a model, so the backward
   all-reduce happens on both sides.
2. One training step (forward, backward, fused AdamW step on both sides) at tp = 1 in one process with one
   thread, of our GPT-2 and Llama against transformers' GPT2LMHeadModel / LlamaForCausalLM (attention "sdpa",
   its default; use_cache=False) of the same config, starting from the same weights. GPT-2 twice: the peer with
   GPT-2's own `gelu_new` (Python ops) and with `gelu_pytorch_tanh` (the fused kernel hybrid uses).

Op counts (MLP, run 1, rank 0, one more untimed step per side): every op torch.profiler records in the step (ATen ops
at every nesting level -- e.g. the copy_ inside addmm --, autograd nodes, Python autograd Functions, c10d calls) with
its calls, and the bytes of the tensor storages the step's ATen ops create (a TorchDispatchMode: top-level ops,
what Python and the autograd engine call). Deterministic, unlike time on a shared machine: the report lists the ops
whose counts differ between the two sides, and both totals.

Timing: `--warmup` untimed steps each, then `--runs` runs of `--mlp-repeats` (MLP; a run = fresh processes) or
`--repeats` (training steps; a run = a block in the same process) rounds that alternate ours and the peer
(ABAB), so a noisy machine slows both alike. Each run gives a ratio median(ours) / median(peer); the table
reports their median and min-max, and claims a lead only where the min-max excludes 1.0. Each step is timed with
time.perf_counter (at tp = 2 after a barrier, as the slower rank's time). Also the ratio of median CPU time
(time.process_time, all threads of the process; at tp = 2 the slower rank's): it leaves out time the OS gave
to other programs, so it moves less on a shared, loaded machine -- but it also leaves out time a rank waits
for its peer.

megatron-core on CPU: its linear layers run unchanged given `use_cpu_initialization=True` (weights are
initialised on the host instead of under its CUDA RNG tracker, which asserts "Torch not compiled with
CUDA enabled" on a CPU build) and `gradient_accumulation_fusion=False` (a CUDA extension); its
parallel_state builds gloo groups from the default process group. If it is missing or fails, its row
is skipped with the reason.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import torch  # noqa: E402
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from hybrid.comm import Group
from hybrid.mesh import Mesh, ParallelDims
from hybrid.testing import run_distributed
from hybrid.tp import ColumnParallelLinear, RowParallelLinear, TPContext, init_parameters
from hybrid.cliutil import OneLineParser, cpu_name, package_version, positive_int, write_text  # noqa: E402

TP = 2  # ranks of the MLP comparison
NUM_HEADS, NUM_KV_HEADS = 4, 2  # of the model comparison (Llama uses grouped-query attention)

# megatron-core warns at import (no Transformer Engine / Apex: it falls back to its local kernels)
# and at the first backward; the spawned ranks re-import this module, so filter here.
warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
warnings.filterwarnings("ignore", message=".*CUDA_DEVICE_MAX_CONNECTIONS.*")


@dataclass(frozen=True)
class Shape:
    """Sizes of one run.

    Attributes:
        batch: sequences per step B.
        seq: tokens per sequence T.
        hidden: model width h (the MLP is h -> 4h -> h).
        layers: Transformer blocks of the model comparison.
        vocab: vocabulary of the model comparison (small, so the LM head does not dominate).
    """

    batch: int
    seq: int
    hidden: int
    layers: int
    vocab: int


@dataclass(frozen=True)
class Sample:
    """One timed step, in seconds: wall clock (perf_counter) and CPU time of the process (process_time)."""

    wall: float
    cpu: float


def timed(fn: Callable[[], object]) -> Sample:
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return Sample(time.perf_counter() - w0, time.process_time() - c0)


@dataclass
class Row:
    """One comparison: per-step samples of ours and the peer (the peer's empty, with the reason in
    `skipped`, when it could not run)."""

    name: str
    peer: str
    ours: list[Sample]
    theirs: list[Sample]
    skipped: str = ""
    run_ratios: list[float] = field(default_factory=list)  # per run: median(ours) / median(peer), wall
    ops: dict[str, "OpCounts"] = field(default_factory=dict)  # side -> one step's op counts (MLP row, rank 0)

    def ratio(self, stat: Callable[[list[float]], float], cpu: bool = False) -> float:
        """stat(ours) / stat(peer) over wall (or CPU) seconds."""
        pick = (lambda s: s.cpu) if cpu else (lambda s: s.wall)
        return stat([pick(s) for s in self.ours]) / stat([pick(s) for s in self.theirs])

    def paired_ratio(self) -> float:
        """Median over rounds of ours_i / peer_i (wall): the two steps of a round ran back to back,
        so a burst of outside load spoils one round's ratio, not a whole side's median."""
        return statistics.median(a.wall / b.wall for a, b in zip(self.ours, self.theirs))


def interleaved(steps: dict[str, Callable[[], Sample]], warmup: int, repeats: int,
                log: Callable[[str], None]) -> dict[str, list[Sample]]:
    """Run each step `warmup` times untimed, then `repeats` rounds of A, B, A, B, ...; each step
    times itself (so it can leave set-up such as a barrier out)."""
    for name, step in steps.items():
        for _ in range(warmup):
            step()
        if warmup:
            log(f"  {name}: warmed up ({warmup} steps)")
    times: dict[str, list[Sample]] = {name: [] for name in steps}
    for i in range(repeats):
        for name, step in steps.items():
            times[name].append(step())
        if (i + 1) % max(1, repeats // 3) == 0 or i + 1 == repeats:
            log("  %d/%d repeats, median so far: %s" % (i + 1, repeats, ", ".join(
                f"{n} {1e3 * statistics.median(s.wall for s in t):.1f} ms" for n, t in times.items())))
    return times


# --- op counts ---------------------------------------------------------------------------------

@dataclass
class OpCounts:
    """What one step runs: calls per op name (torch.profiler: every nesting level, autograd nodes included) and
    bytes of new tensor storages per top-level ATen op (`_NewStorageBytes`)."""

    calls: dict[str, int]
    new_bytes: dict[str, int]


class _NewStorageBytes(TorchDispatchMode):
    """Bytes of the storages each top-level ATen op creates (an output whose storage existed before is a view or
    an in-place result and counts nothing)."""

    def __init__(self):
        super().__init__()
        self.bytes: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = {t.untyped_storage().data_ptr() for t in _tensors(args, kwargs)}
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                s = t.untyped_storage()
                if s.data_ptr() not in before and s.nbytes():
                    name = func.overloadpacket.__name__  # "mm", as the profiler's "aten::mm"
                    self.bytes[name] = self.bytes.get(name, 0) + s.nbytes()
        return out


def _tensors(args, kwargs) -> list[torch.Tensor]:
    flat = list(args) + list((kwargs or {}).values())
    flat += [t for a in flat if isinstance(a, (tuple, list)) for t in a]
    return [t for t in flat if isinstance(t, torch.Tensor) and t.device.type == "cpu"]


def op_counts(step: Callable[[], object]) -> OpCounts:
    """Two runs of `step`: one under torch.profiler (calls per op name), one under `_NewStorageBytes`."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    calls: dict[str, int] = {}
    for e in prof.events():
        calls[e.name] = calls.get(e.name, 0) + 1
    probe = _NewStorageBytes()
    with probe:
        step()
    return OpCounts(calls, probe.bytes)


# --- 1. MLP block at tp = 2 ------------------------------------------------------------------

class HybridMLP(nn.Module):
    """h -> 4h (column-parallel) -> GeLU -> h (row-parallel), batch-first (B, T, h)."""

    def __init__(self, hidden: int, tp: TPContext):
        super().__init__()
        self.fc = ColumnParallelLinear(hidden, 4 * hidden, tp)
        self.proj = RowParallelLinear(4 * hidden, hidden, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))  # (B, T, h), summed over TP


class MegatronMLP(nn.Module):
    """The same block from megatron-core's layers, sequence-first (T, B, h); uses megatron's global
    parallel_state, which the caller initialises."""

    def __init__(self, hidden: int):
        super().__init__()
        from megatron.core import tensor_parallel
        from megatron.core.model_parallel_config import ModelParallelConfig
        config = ModelParallelConfig(
            tensor_model_parallel_size=TP, sequence_parallel=False,
            use_cpu_initialization=True,  # host init: no CUDA RNG tracker
            perform_initialization=True, params_dtype=torch.float32,
            gradient_accumulation_fusion=False)  # the fused wgrad GEMM is a CUDA extension
        init = nn.init.xavier_normal_  # any; the benchmark copies these weights into ours
        self.fc = tensor_parallel.ColumnParallelLinear(hidden, 4 * hidden, config=config, init_method=init,
                                                       bias=True, gather_output=False)
        self.proj = tensor_parallel.RowParallelLinear(4 * hidden, hidden, config=config, init_method=init,
                                                      bias=True, input_is_parallel=True, skip_bias_add=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.fc(x)
        y, _ = self.proj(F.gelu(y))
        return y  # (T, B, h)


def _timed_step(model: nn.Module, x: torch.Tensor, grad_out: torch.Tensor) -> Callable[[], Sample]:
    """Forward + backward of the block; all ranks start together (barrier), each times itself."""
    params = list(model.parameters())

    def step() -> Sample:
        for p in params + [x]:
            p.grad = None
        dist.barrier()
        return timed(lambda: model(x).backward(grad_out))
    return step


def _mlp_rank(rank: int, world: int, shape: Shape, warmup: int, repeats: int, count_ops: bool = False) -> dict:
    """One rank of the MLP comparison: per-step seconds of each side, why megatron was skipped, and (count_ops)
    one more step per side counted op by op (`op_counts`)."""
    log = (lambda msg: print(msg, flush=True)) if rank == 0 else (lambda msg: None)
    mesh = Mesh.build(ParallelDims.from_world(world, tp=world), device=torch.device("cpu"))
    ours = HybridMLP(shape.hidden, TPContext(mesh.tp))
    init_parameters(ours, seed=0, tp_rank=mesh.tp.rank)

    gen = torch.Generator().manual_seed(1)  # same input on every rank (replicated activations)
    x = torch.randn(shape.batch, shape.seq, shape.hidden, generator=gen).requires_grad_()  # (B, T, h)
    grad_out = torch.randn(shape.batch, shape.seq, shape.hidden, generator=gen)
    steps = {"ours": _timed_step(ours, x, grad_out)}

    skipped, max_diff = "", float("nan")
    try:
        from megatron.core import parallel_state
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
        theirs = MegatronMLP(shape.hidden)
        with torch.no_grad():  # identical shards: both split A by rows of (4h, h) and B by columns of (h, 4h)
            for mine, peer in ((ours.fc, theirs.fc), (ours.proj, theirs.proj)):
                mine.weight.copy_(peer.weight)
                mine.bias.copy_(peer.bias)
        x_sbh = x.detach().transpose(0, 1).contiguous().requires_grad_()  # (T, B, h)
        with torch.no_grad():
            max_diff = (ours(x) - theirs(x_sbh).transpose(0, 1)).abs().max().item()
        steps["megatron"] = _timed_step(theirs, x_sbh, grad_out.transpose(0, 1).contiguous())
    except Exception as e:  # missing package or no CPU path: report it, never invent numbers
        skipped = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        log(f"  megatron-core skipped: {skipped}")
    if not skipped:
        log(f"  same weights, same input: max |ours - megatron| = {max_diff:.2e}")
    times = interleaved(steps, warmup, repeats, log)
    ops = {side: op_counts(step) for side, step in steps.items()} if count_ops else {}
    # plain tuples and dicts: the parent unpickles them without this module's classes
    return {"times": {side: [(t.wall, t.cpu) for t in ts] for side, ts in times.items()}, "skipped": skipped,
            "ops": {side: (o.calls, o.new_bytes) for side, o in ops.items()}}


def bench_mlp(shape: Shape, warmup: int, repeats: int, runs: int) -> Row:
    """`runs` separate runs (fresh processes each), `repeats` interleaved steps per side in each; the
    ratio per run is median(ours) / median(megatron), and the row reports the median and spread of those."""
    h = shape.hidden
    name = f"MLP {h}->{4 * h}->{h} fwd+bwd, tp {TP}, (B, T) = ({shape.batch}, {shape.seq})"
    peer = "megatron-core Column/RowParallelLinear"
    row = Row(name, peer, [], [])
    for run in range(runs):
        print(f"[1/4] {name}: ours vs {peer} ({TP} gloo ranks), run {run + 1}/{runs}", flush=True)
        results = run_distributed(_mlp_rank, TP, args=(shape, warmup, repeats, run == 0), timeout=600)
        # a step lasts as long as its slowest rank
        per_step = {side: [Sample(max(w for w, _ in ss), max(c for _, c in ss))
                           for ss in zip(*(r["times"][side] for r in results))]
                    for side in results[0]["times"]}
        row.skipped = results[0]["skipped"]
        if run == 0:  # the ranks run the same ops (the same shards' shapes); rank 0's counts
            row.ops = {side: OpCounts(*o) for side, o in results[0]["ops"].items()}
        row.ours += per_step["ours"]
        if row.skipped:
            return row
        row.theirs += per_step["megatron"]
        row.run_ratios.append(statistics.median(s.wall for s in per_step["ours"]) /
                              statistics.median(s.wall for s in per_step["megatron"]))
    return row


# --- 2. training step at tp = 1 against transformers -------------------------------------------

def hf_configs(shape: Shape, gelu: str = "gelu_new") -> dict:
    """transformers configs of the two model families at the benchmark's size, no dropout, no KV cache
    (`use_cache=False`: training builds none), GPT-2 with the MLP activation `gelu` -- "gelu_new" (GPT-2's
    own, tanh GELU written as Python ops) or "gelu_pytorch_tanh" (the same function as one fused kernel,
    which is what hybrid's GPT-2 runs for either name)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    ffn = 64 * round(8 * shape.hidden / 3 / 64) or 64  # Llama's ~8h/3 SwiGLU width, a multiple of 64
    gpt2 = GPT2Config(n_layer=shape.layers, n_embd=shape.hidden, n_head=NUM_HEADS, vocab_size=shape.vocab,
                      n_positions=shape.seq, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      bos_token_id=0, eos_token_id=0, use_cache=False, activation_function=gelu)
    llama = LlamaConfig(num_hidden_layers=shape.layers, hidden_size=shape.hidden, num_attention_heads=NUM_HEADS,
                        num_key_value_heads=NUM_KV_HEADS, intermediate_size=ffn, vocab_size=shape.vocab,
                        max_position_embeddings=shape.seq, tie_word_embeddings=False,
                        bos_token_id=0, eos_token_id=0, use_cache=False)
    return {"GPT-2": (GPT2LMHeadModel, gpt2), "Llama": (LlamaForCausalLM, llama)}


def _train_step(loss_fn: Callable[[], torch.Tensor], opt: torch.optim.Optimizer) -> Callable[[], Sample]:
    def step() -> None:
        loss_fn().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return lambda: timed(step)


def bench_model(label: str, gelu: str, index: int, shape: Shape, warmup: int, repeats: int, runs: int) -> Row:
    from transformers.utils import logging as hf_logging
    from models import build_model, from_hf, shift_labels
    from models.hf_io import load_hf_checkpoint
    hf_logging.set_verbosity_error()  # "loss_type=None ... unrecognized" and the like
    hf_logging.disable_progress_bar()  # save_pretrained's shard bar
    cls, hf_cfg = hf_configs(shape, gelu)[label]
    torch.manual_seed(0)
    hf = cls(hf_cfg).train()
    attn = hf.config._attn_implementation
    with tempfile.TemporaryDirectory() as d:  # our model from transformers' weights
        hf.save_pretrained(d)
        ours = build_model(from_hf(hf_cfg), TPContext(Group.solo("tp")), seed=None).train()
        load_hf_checkpoint(ours, d, tp_rank=0)
    n_params = sum(p.numel() for p in hf.parameters())
    act = f", peer MLP {gelu}" if label == "GPT-2" else ""
    name = (f"{label} train step (fwd+bwd+AdamW), tp 1, L={shape.layers} h={shape.hidden} "
            f"V={shape.vocab} (B, T) = ({shape.batch}, {shape.seq}){act}")
    peer = f"transformers {cls.__name__} ({attn}, use_cache=False)"
    print(f"[{index}/4] {name}, {n_params / 1e6:.1f}M params: ours vs {peer}", flush=True)

    ids = torch.randint(0, shape.vocab, (shape.batch, shape.seq), generator=torch.Generator().manual_seed(2))
    labels = shift_labels(ids)
    with torch.no_grad():
        l_ours, l_hf = ours(ids, labels).item(), hf(ids, labels=ids).loss.item()
    print(f"  same weights, same batch: loss ours {l_ours:.6f}, transformers {l_hf:.6f}", flush=True)
    # the same optimizer kernel on both sides (torch's fused CPU AdamW), so the ratio is about the model
    steps = {"ours": _train_step(lambda: ours(ids, labels),
                                 torch.optim.AdamW(ours.parameters(), lr=1e-4, fused=True)),
             "transformers": _train_step(lambda: hf(ids, labels=ids).loss,
                                         torch.optim.AdamW(hf.parameters(), lr=1e-4, fused=True))}
    row = Row(name, peer, [], [])
    for run in range(runs):  # blocks of interleaved rounds in this process; the ratio's spread is over blocks
        times = interleaved(steps, warmup if run == 0 else 0, repeats, lambda msg: print(msg, flush=True))
        row.ours += times["ours"]
        row.theirs += times["transformers"]
        row.run_ratios.append(statistics.median(s.wall for s in times["ours"]) /
                              statistics.median(s.wall for s in times["transformers"]))
    return row


# --- report ------------------------------------------------------------------------------------

def _ms(samples: list[Sample]) -> str:
    walls = [s.wall for s in samples]
    return f"{1e3 * statistics.median(walls):.1f} / {1e3 * min(walls):.1f}"


def verdict(ratios: list[float]) -> str:
    """A lead only where every run's ratio is on the same side of 1.0 (the min-max spread excludes it)."""
    if len(ratios) < 2:
        return "no lead claimed (one run)"
    if max(ratios) < 1.0:
        return "ours faster"
    if min(ratios) > 1.0:
        return "peer faster"
    return "no lead claimed (spread includes 1.0)"


def table(rows: list[Row]) -> str:
    """Wall-clock ms over all runs, the per-run ratio's median and min-max, the CPU-time ratio, and the verdict."""
    lines = ["| comparison | peer | ours ms (median / min) | peer ms (median / min) "
             "| ours/peer, median of runs (min - max) | ours/peer CPU time (median) | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.skipped:
            lines.append(f"| {r.name} | {r.peer} | {_ms(r.ours)} | skipped: {r.skipped} | - | - | - |")
            continue
        q = r.run_ratios
        lines.append(f"| {r.name} | {r.peer} | {_ms(r.ours)} | {_ms(r.theirs)} | {statistics.median(q):.3f} "
                     f"({min(q):.3f} - {max(q):.3f}) | {r.ratio(statistics.median, cpu=True):.3f} | {verdict(q)} |")
    return "\n".join(lines)


def op_table(row: Row) -> str:
    """The MLP's ops per fwd+bwd step whose counts differ between ours and the peer, then the totals."""
    if len(row.ops) < 2:
        return ""
    ours, peer = row.ops["ours"], row.ops["megatron"]
    lines = ["| op (torch.profiler name) | ours calls | megatron-core calls | ours / megatron-core new bytes |",
             "|---|---|---|---|"]
    for name in sorted(set(ours.calls) | set(peer.calls)):
        a, b = ours.calls.get(name, 0), peer.calls.get(name, 0)
        if a != b:
            key = name.removeprefix("aten::")
            lines.append(f"| {name} | {a} | {b} | {ours.new_bytes.get(key, 0)} / {peer.new_bytes.get(key, 0)} |")
    lines.append(f"| all (ops and autograd nodes; bytes of every new storage) | {sum(ours.calls.values())} | "
                 f"{sum(peer.calls.values())} | {sum(ours.new_bytes.values())} / {sum(peer.new_bytes.values())} |")
    return "\n".join(lines)


_version = package_version


def _commit() -> str:
    """The checkout benchmarked: short commit, "+ local changes" when tracked files differ from it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "diff", "--quiet", "HEAD"]).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" + local changes" if dirty else "")


def report(rows: list[Row], args: argparse.Namespace, load: tuple[float, float]) -> str:
    """Setup lines and the table; `load` is the 1-minute load average before and after the run
    (above ~2 on this 2-core machine something else competed for the cores)."""
    cpu = cpu_name()
    command = "python scripts/bench_tp.py " + " ".join(sys.argv[1:])
    return "\n".join([
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {os.cpu_count()}-core CPU ({cpu}), gloo, torch.set_num_threads(1) per process",
        f"- versions: torch {torch.__version__}, megatron-core {_version('megatron-core')}, "
        f"transformers {_version('transformers')}, python {platform.python_version()}",
        f"- command: `{command.strip()}` at commit {_commit()}",
        f"- timing: {args.warmup} warm-up steps, then {args.runs} runs of interleaved (ABAB) steps per side: "
        f"{args.mlp_repeats} (MLP; each run in fresh processes), {args.repeats} (training steps; runs are blocks in "
        f"one process); ratio per run = median ours / median peer; a lead is claimed only where the min-max over "
        f"runs excludes 1.0; 1-min load average {load[0]:.2f} at the start, {load[1]:.2f} at the end",
        "- same optimizer kernel on both sides of the model rows: torch.optim.AdamW(fused=True); transformers "
        "with use_cache=False; GPT-2 twice, the peer with its own gelu_new and with gelu_pytorch_tanh (hybrid runs "
        "the fused tanh GELU, nn.GELU(approximate='tanh'), for either name)",
        "",
        table(rows),
        "",
    ] + ([f"Ops of one MLP step (rank 0, run 1), where the two sides differ ({rows[0].name}):", "", ops, ""]
         if (ops := op_table(rows[0])) else []))


# --- command line ------------------------------------------------------------------------------

_Parser, _positive = OneLineParser, positive_int


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _Parser(prog="bench_tp.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=_positive, default=10, help="timed training steps per side per run (default 10)")
    p.add_argument("--mlp-repeats", type=_positive, default=20, help="timed MLP steps per side per run (default 20)")
    p.add_argument("--runs", type=_positive, default=3, help="runs per comparison, for the ratio's spread (default 3)")
    p.add_argument("--warmup", type=_positive, default=1, help="untimed steps per side first (default 1)")
    p.add_argument("--hidden", type=_positive, default=1024, help="model width h (default 1024)")
    p.add_argument("--seq", type=_positive, default=128, help="tokens per sequence T (default 128)")
    p.add_argument("--batch", type=_positive, default=1, help="sequences per step B (default 1)")
    p.add_argument("--layers", type=_positive, default=2, help="Transformer blocks of the models (default 2)")
    p.add_argument("--vocab", type=_positive, default=2048, help="vocabulary of the models (default 2048)")
    p.add_argument("--out", metavar="FILE.md", help="also write the report (setup + table) as markdown")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: tiny sizes, 2 steps, 1 run (checks the script, measures nothing)")
    args = p.parse_args(argv)
    if args.quick:
        args.hidden, args.seq, args.batch, args.layers, args.vocab = 64, 16, 1, 1, 128
        args.repeats, args.mlp_repeats, args.runs, args.warmup = 2, 2, 1, 1
    if args.hidden % (2 * NUM_HEADS) != 0:
        p.error(f"--hidden {args.hidden}: must be a multiple of {2 * NUM_HEADS} "
                f"({NUM_HEADS} heads of even width, for RoPE)")
    if args.seq < 2:
        p.error("--seq must be at least 2 (the loss predicts the next token)")
    p.check_out("--out", args.out)  # a regular file in an existing, writable directory
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    shape = Shape(batch=args.batch, seq=args.seq, hidden=args.hidden, layers=args.layers, vocab=args.vocab)
    start = time.perf_counter()
    load_before = os.getloadavg()[0]
    rows = [bench_mlp(shape, args.warmup, args.mlp_repeats, args.runs)]
    torch.set_num_threads(1)  # the same single thread per process as the TP ranks
    for index, (label, gelu) in enumerate((("GPT-2", "gelu_new"), ("GPT-2", "gelu_pytorch_tanh"), ("Llama", "")), 2):
        rows.append(bench_model(label, gelu, index, shape, args.warmup, args.repeats, args.runs))
    text = report(rows, args, (load_before, os.getloadavg()[0]))
    print(f"\n{text}\ntotal {time.perf_counter() - start:.0f} s", flush=True)
    if args.out:
        write_text(args.out, text)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
