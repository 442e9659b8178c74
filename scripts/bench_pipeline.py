"""Speed and activation memory of hybrid's pipeline executor against torch.distributed.pipelining, on CPU.

    python scripts/bench_pipeline.py --out docs/results/bench_pipeline.md   # ~9 minutes on 2 cores under load 16-46
    python scripts/bench_pipeline.py --quick --out /tmp/pp.md               # smoke run (measures nothing)
    python scripts/bench_pipeline.py --pp 2 --microbatches 4 --out docs/results/bench_zero_bubble.md  # zero-bubble rows
    [--pp 2] [--microbatches 4] [--repeats 10] [--runs 3] [--warmup 1] [--hidden 256] [--layers 8] [--seq 128]
    [--micro-batch 2] [--vocab 2048]

--pp is at most the cores (2 here): with more ranks than cores the OS scheduler, not the runtime, sets the time.

One model split, one set of micro-batches, four schedules on two runtimes side by side (eight runtimes), for
each pipeline size pp (pp gloo ranks, one thread each):

* ours:  `PipelineExecutor` walking `build_schedule(kind, pp, m, v)[rank]` for kind 1F1B, GPipe, ZB-H1, ZBV;
* torch: `torch.distributed.pipelining`'s `Schedule1F1B`, `ScheduleGPipe`, `ScheduleInterleavedZeroBubble` with
  one stage a rank (torch's ZB1P: ZB-H1's lists, op for op) and `ScheduleZBVZeroBubble`, over one
  `PipelineStage` per chunk.

Both run the very same chunk modules (`build_pipeline_chunks`, GPT-2 layout: stage 0 embeds, the last stage has
the tied head and the loss). 1F1B, GPipe and ZB-H1 cut the model into pp stages; ZBV into 2 pp (two a rank, in a V:
stages r and 2 pp - 1 - r, so rank 0 holds the embedding and the head), built from the same seed. torch computes the loss outside the stage (`loss_fn(stage output, target)`), so its
stage module is a thin wrapper returning the chunk's hidden states, or its logits on the last stage, and
`loss_fn` is the same `lm_loss` our last chunk calls. Loss semantics agree: ours scales each micro-batch's
loss by 1/m before backward, torch (`scale_grads=True`) divides the accumulated gradients by m after the
last backward; both give the gradient of the mean over micro-batches (checked below, same weights).

Zero bubble: besides the ours/torch rows, ZB-H1 against our 1F1B, timed in the same rounds: its row gives ZB-H1
against our 1F1B (median ms with min - max, the ratio per block) beside the simulator's prediction:
`simulate` of both lists with each stage's F, full-backward, B and W seconds measured in the untimed profiling
steps (the medians of the executor's own timeline events), messages free. "within 10 %" compares the measured
saving 1 - ZB/1F1B with the predicted one. ZBV likewise, its simulation priced with the F, B and W seconds
measured on its own 2 pp stages (half as deep as the others').

Timing: `warmup` untimed steps per runtime, then `repeats` rounds that run the eight in turn (ABAB...), so
a noisy machine slows all alike. A step is forward + backward of all m micro-batches (no optimizer),
started after a barrier; its time is the slowest rank's. Reported: median and min, and ours/torch of
the medians, of the mins, and the median of the per-round ratios (below 1.0: ours faster); the table gives the
ratio per block of rounds with its min-max. Also the CPU seconds a step costs, summed over
the ranks (`time.process_time`, all threads of each process, gloo's included): wall-clock time on a
shared machine moves with whatever else runs, CPU time much less, so it shows runtime overhead even when
the wall-clock ratios are noise.

Memory, extra (untimed) steps per runtime, measured the same way on both:

* peak live tensors: `LiveTensorProbe`, one TorchDispatchMode around the whole step, the same function for both
  runtimes: every storage an ATen op creates counts from its creation until it is freed;

* saved activations: `hybrid.measured_memory.SavedActivationLedger` (saved_tensors_hooks) entered around the whole
  step, each forward tagged with its micro-batch (ours through `on_forward`; torch by wrapping the stage's
  `forward_one_chunk`, and its `loss_fn`, which runs outside the stage). Peak bytes per stage.
* held outputs: stage outputs a runtime keeps alive that autograd did not save (a sent activation's
  values, the last stage's logits): ours `peak_held_output_bytes`; torch the distinct storages of the
  outputs in `PipelineStage.fwd_cache` (and `output_chunks`), sampled after every forward -- the only
  point where they grow.
* torch also keeps per-micro-batch receive buffers for activations and gradients allocated across steps
  (`args_recv_info`, `grad_recv_info`); their total is reported beside the table.

Where the time goes: PROFILE_STEPS more untimed steps per runtime time each rank's forward / loss /
backward (ours from the executor's own timeline, torch by wrapping `forward_one_chunk`, `loss_fn` and
`backward_one_chunk`); the rest of a rank's step is waiting on messages, bubbles and runtime overhead. In the
same steps the runtime's own CPU: the main thread's CPU time (time.thread_time) of the step minus its CPU inside
the model's compute, counted the same way on both sides (`ComputeCPU`: each chunk's forward, torch's loss_fn, every
run of the autograd engine) -- the scheduling, message posting and reaping, loss and gradient scaling that a
runtime adds to the step (waiting costs no CPU: gloo's waits block).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
import warnings
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import torch  # noqa: E402
import torch.distributed as dist
import torch.nn as nn
from torch.autograd.variable import Variable
from torch.utils._python_dispatch import TorchDispatchMode

from hybrid.measured_memory import SavedActivationLedger, storage_key
from hybrid.mesh import Mesh, ParallelDims
from hybrid.pipeline import Costs, ScheduleKind, build_schedule, simulate
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.testing import run_distributed
from hybrid.tp import TPContext
from hybrid.cliutil import OneLineParser, cpu_name, package_version, positive_int, write_text  # noqa: E402

NUM_HEADS = 4
KINDS = {"1F1B": ScheduleKind.ONE_F_ONE_B, "GPipe": ScheduleKind.GPIPE, "ZB-H1": ScheduleKind.ZB_H1,
         "ZBV": ScheduleKind.ZBV}
# torch.distributed.pipelining's class for each; the zero-bubble ones take a list of stages. ZB-H1 is torch's
# ScheduleInterleavedZeroBubble with one stage a rank ("ZB1P"), whose lists equal ours op for op
# (tests/test_pipeline_zero_bubble.py), as ScheduleZBVZeroBubble's equal our ZBV's.
TORCH_CLASS = {ScheduleKind.ONE_F_ONE_B: "Schedule1F1B", ScheduleKind.GPIPE: "ScheduleGPipe",
               ScheduleKind.ZB_H1: "ScheduleInterleavedZeroBubble", ScheduleKind.ZBV: "ScheduleZBVZeroBubble"}
ZB_NAME = "ours ZB-H1"  # the zero-bubble row compares it with "ours 1F1B" and the simulator
COMPUTE = ("forward", "backward", "backward_input", "backward_weight")  # the executor's compute events
MiB = 2 ** 20
PROFILE_STEPS = 2  # untimed steps per runtime that split each rank's step into compute and waiting

warnings.filterwarnings("ignore", message=".*pipelining.*")  # torch's "prototype" notices, in every rank


@dataclass(frozen=True)
class Shape:
    """Sizes of one run.

    Attributes:
        layers: Transformer blocks L, split evenly over the pp stages (a multiple of pp).
        hidden: model width h (NUM_HEADS heads).
        seq: tokens per sequence T.
        micro_batch: sequences per micro-batch b.
        vocab: vocabulary (small, so the LM head on the last stage does not dominate).
        m: micro-batches per step.
    """

    layers: int
    hidden: int
    seq: int
    micro_batch: int
    vocab: int
    m: int


@dataclass
class PPResult:
    """What one pipeline size measured; per-rank lists are indexed by pipeline rank."""

    pp: int
    times: dict[str, list[float]]  # runtime name -> per-step seconds (slowest rank)
    cpu: dict[str, list[float]]  # runtime name -> per-step CPU seconds, summed over ranks
    saved: dict[str, list[int]]  # runtime name -> peak saved-activation bytes per stage
    held: dict[str, list[int]]  # runtime name -> peak held output bytes per stage
    live: dict[str, list[int]]  # runtime name -> peak live tensor bytes per stage (LiveTensorProbe)
    torch_recv_buffers: list[int]  # per stage, bytes of torch's persistent receive buffers
    # runtime name -> per stage, medians: (step s, compute s, main-thread CPU s of the step, its CPU s in compute)
    busy: dict[str, list[tuple[float, float, float, float]]]
    check: dict[str, float] = field(default_factory=dict)  # loss / gradient agreement
    op_seconds: list[dict[str, float]] = field(default_factory=list)  # per stage, median s of each compute event
    predicted: dict[str, float] = field(default_factory=dict)  # schedule -> simulated step s (stage costs above)


def model_config(shape: Shape):
    from transformers import GPT2Config
    from models import from_hf
    return from_hf(GPT2Config(n_layer=shape.layers, n_embd=shape.hidden, n_head=NUM_HEADS, vocab_size=shape.vocab,
                              n_positions=shape.seq, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                              bos_token_id=0, eos_token_id=0))


def make_batches(shape: Shape, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    from models import shift_labels
    gen = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, shape.vocab, (shape.micro_batch, shape.seq), generator=gen) for _ in range(shape.m)]
    return [(x, shift_labels(x)) for x in ids]


def _distinct_bytes(tensors) -> int:
    """Bytes of the distinct storages under `tensors` (a freed 1-element stub counts 0)."""
    keys = {storage_key(t) for t in tensors if isinstance(t, torch.Tensor) and t.numel() > 1}
    return sum(k[2] for k in keys)


class LiveTensorProbe(TorchDispatchMode):
    """One memory probe for both runtimes: peak bytes of the tensor storages that ATen ops create while it
    is active (forward, loss, backward, gradients, sent / received activations, temporaries), each counted
    until its storage is freed (a weakref finalizer on the storage; views share it and count once).
    Storages that exist before the step (weights; torch's receive buffers, allocated on its first step) are
    not counted, on either side."""

    def __init__(self):
        super().__init__()
        self.current = self.peak = 0
        self._live: set[int] = set()

    def _track(self, t: torch.Tensor) -> None:
        s = t.untyped_storage()
        key = s.data_ptr()
        if key == 0 or key in self._live:
            return
        self._live.add(key)
        n = s.nbytes()
        self.current += n
        self.peak = max(self.peak, self.current)
        weakref.finalize(s, self._release, key, n)

    def _release(self, key: int, n: int) -> None:
        self._live.discard(key)
        self.current -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                self._track(t)
        return out


def peak_live_bytes(run: Callable[[], object]) -> int:
    """The probe around one step: the same function for ours and torch."""
    probe = LiveTensorProbe()
    with probe:
        run()
    return probe.peak


class ComputeCPU:
    """Main-thread CPU seconds (time.thread_time) inside the model's compute, counted the same way for both runtimes:
    each chunk's forward (module hooks; ours computes the loss there too), torch's loss_fn (outside its stage, it
    calls `region`), and each run of the autograd engine, which both runtimes call (ours directly, torch through
    torch.autograd.backward). Nested regions count once."""

    def __init__(self):
        self.seconds, self._depth, self._t0 = 0.0, 0, 0.0

    def enter(self, *_) -> None:
        if self._depth == 0:
            self._t0 = time.thread_time()
        self._depth += 1

    def exit(self, *_) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.thread_time() - self._t0

    @contextmanager
    def region(self):
        self.enter()
        try:
            yield
        finally:
            self.exit()

    @contextmanager
    def installed(self, chunks: nn.ModuleList):
        """Count during the block: hooks on `chunks`, the autograd engine behind a counting proxy."""
        handles = [h for c in chunks
                   for h in (c.register_forward_pre_hook(self.enter), c.register_forward_hook(self.exit))]
        engine = Variable._execution_engine
        Variable._execution_engine = _CountingEngine(engine, self)
        try:
            yield self
        finally:
            Variable._execution_engine = engine
            for h in handles:
                h.remove()


class _CountingEngine:
    """The autograd engine, its run_backward (backward and autograd.grad alike) counted as compute."""

    def __init__(self, engine, probe: ComputeCPU):
        self._engine, self._probe = engine, probe

    def run_backward(self, *args, **kwargs):
        with self._probe.region():
            return self._engine.run_backward(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._engine, name)


# --- the two runtimes, one step each ---------------------------------------------------------

class Ours:
    """hybrid's executor over this rank's action list."""

    def __init__(self, chunks: nn.ModuleList, kind: ScheduleKind, mesh: Mesh, shape: Shape):
        self.chunks, self.kind, self.mesh, self.shape = chunks, kind, mesh, shape
        self.params = list(chunks.parameters())
        self.io = StageIO((shape.micro_batch, shape.seq, shape.hidden))
        self.schedule = build_schedule(kind, mesh.dims.pp, shape.m, len(chunks))[mesh.coords.pp]
        self.executor = self._executor()

    def _executor(self, **kw) -> PipelineExecutor:
        return PipelineExecutor(self.chunks, self.schedule, self.mesh.pp, self.io, self.mesh.device,
                                placement=self.kind.placement, **kw)

    def step(self, batches) -> float:
        """Loss on the last stage (mean over micro-batches), 0 elsewhere."""
        return self.executor.forward_backward(batches).item()

    def measure(self, batches) -> tuple[int, int]:
        """(peak saved-activation bytes, peak held output bytes) of one step."""
        ledger = SavedActivationLedger(params=self.chunks.parameters())
        ex = self._executor(on_forward=lambda mb, c: ledger.tagged(mb))
        with ledger:
            ex.forward_backward(batches)
        _check_released(ledger, "ours")
        return ledger.peak_bytes, ex.peak_held_output_bytes

    def compute_seconds(self, batches) -> tuple[float, float, float]:
        """(step seconds, seconds in forward / backward compute, main-thread CPU seconds) of one step, from the
        executor's timeline."""
        ex = self._executor(record_timeline=True)
        t0, c0 = time.perf_counter(), time.thread_time()
        ex.forward_backward(batches)
        total, cpu = time.perf_counter() - t0, time.thread_time() - c0
        self.last_events = ex.events
        return total, sum(e.end - e.start for e in ex.events if e.name in COMPUTE), cpu


class StageModule(nn.Module):
    """A chunk as torch's PipelineStage wants it: x -> hidden states, or logits on the last stage (torch's
    schedule applies `loss_fn` to them)."""

    def __init__(self, chunk: nn.Module):
        super().__init__()
        self.chunk = chunk

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.chunk(x, None)  # (b, T, h), or (b, T, V) logits on the last stage


class Torch:
    """torch.distributed.pipelining's schedule of the same kind (TORCH_CLASS) over one PipelineStage per chunk of
    this rank (ZBV: two, global stages r and 2 pp - 1 - r, as ours)."""

    def __init__(self, chunks: nn.ModuleList, kind: ScheduleKind, mesh: Mesh, shape: Shape):
        import torch.distributed.pipelining as pipelining
        from torch.distributed.pipelining import PipelineStage
        from models.common import lm_loss
        pp, rank = mesh.dims.pp, mesh.coords.pp
        self.chunks, self.shape, self.params = chunks, shape, list(chunks.parameters())
        self.first = any(c.stage.first for c in chunks)
        self.last = any(c.stage.last for c in chunks)  # under ZBV rank 0 holds the first and the last stage
        self.stages = [PipelineStage(StageModule(c), kind.placement.stage(rank, i, pp), pp * len(chunks),
                                     mesh.device, group=mesh.pp.pg) for i, c in enumerate(chunks)]
        self.ledger: SavedActivationLedger | None = None  # set only while measuring
        self.held_peak = 0
        self.busy: float | None = None  # seconds in forward / loss / backward, counted only when not None
        self._mb = None  # micro-batch of the latest forward: torch computes its loss right after
        self.cpu_probe: ComputeCPU | None = None  # set while the runtime's own CPU is measured
        tail = next((c for c in chunks if c.stage.last), None)

        def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            with self.ledger.tagged(self._mb) if self.ledger else nullcontext(), self._timer(), \
                    self.cpu_probe.region() if self.cpu_probe else nullcontext():
                return lm_loss(logits, labels, tail.wte.vocab_start, tail.tp)

        cls = getattr(pipelining, TORCH_CLASS[kind])
        stages = self.stages if kind.splits_backward else self.stages[0]
        self.schedule = cls(stages, shape.m, loss_fn=loss_fn, scale_grads=True)
        for stage in self.stages:
            self._instrument(stage)

    def _instrument(self, stage) -> None:
        """Tag each forward with its micro-batch (saved-activation ledger), sample the held outputs, time the
        computes. The schedule calls them through the instance, so these wrappers see every micro-batch."""
        forward_one_chunk, backward_one_chunk = stage.forward_one_chunk, stage.backward_one_chunk
        backward_weight = getattr(stage, "backward_weight_one_chunk", None)

        def tagged_forward(fwd_chunk_id: int, *args, **kwargs):
            self._mb = fwd_chunk_id
            with self.ledger.tagged(fwd_chunk_id) if self.ledger else nullcontext(), self._timer():
                out = forward_one_chunk(fwd_chunk_id, *args, **kwargs)
            if self.ledger:
                held = [t for s in self.stages for outs, _ in s.fwd_cache.values() for t in outs]
                held += [t for s in self.stages for t in s.output_chunks if isinstance(t, torch.Tensor)]
                self.held_peak = max(self.held_peak, _distinct_bytes(held))
            return out

        def timed(fn):
            def run(*args, **kwargs):
                with self._timer():
                    return fn(*args, **kwargs)
            return run
        stage.forward_one_chunk, stage.backward_one_chunk = tagged_forward, timed(backward_one_chunk)
        if backward_weight is not None:  # W of the zero-bubble schedules
            stage.backward_weight_one_chunk = timed(backward_weight)

    @contextmanager
    def _timer(self):
        if self.busy is None:
            yield
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.busy += time.perf_counter() - t0

    def step(self, batches) -> float:
        args = (torch.cat([x for x, _ in batches]),) if self.first else ()  # re-split into the same m micro-batches
        target = torch.cat([y for _, y in batches]) if self.last else None
        losses: list[torch.Tensor] | None = [] if self.last else None
        self.schedule.step(*args, target=target, losses=losses, return_outputs=False)
        return torch.stack(losses).mean().item() if self.last else 0.0  # torch's losses: unscaled per micro-batch

    def measure(self, batches) -> tuple[int, int]:
        self.ledger, self.held_peak = SavedActivationLedger(params=self.chunks.parameters()), 0
        try:
            with self.ledger:
                self.step(batches)
            _check_released(self.ledger, "torch")
            return self.ledger.peak_bytes, self.held_peak
        finally:
            self.ledger = None

    def compute_seconds(self, batches) -> tuple[float, float, float]:
        """(step seconds, seconds in forward / loss / backward compute, main-thread CPU seconds) of one step."""
        self.busy = 0.0
        try:
            t0, c0 = time.perf_counter(), time.thread_time()
            self.step(batches)
            return time.perf_counter() - t0, self.busy, time.thread_time() - c0
        finally:
            self.busy = None

    def recv_buffer_bytes(self) -> int:
        infos = [i for s in self.stages for infos in s.args_recv_info.values() for i in infos]
        infos += [i for s in self.stages for infos in s.grad_recv_info.values() for i in infos]
        return _distinct_bytes(getattr(i, "buffer", None) for i in infos)


def _check_released(ledger: SavedActivationLedger, who: str) -> None:
    if ledger.current_bytes != 0:
        raise RuntimeError(f"{who}: {ledger.current_bytes} saved bytes still held after the step")


# --- one pipeline size on pp ranks -------------------------------------------------------------

def _timed(run: Callable[[], object], params: list[nn.Parameter]) -> Callable[[], tuple[float, float]]:
    """The step as (wall seconds, CPU seconds of this process, all its threads)."""
    def step() -> tuple[float, float]:
        for p in params:
            p.grad = None
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        return time.perf_counter() - t0, time.process_time() - c0
    return step


def _grads(params: list[nn.Parameter]) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]


def _rank(rank: int, world: int, shape: Shape, warmup: int, repeats: int) -> dict:
    from models import build_pipeline_chunks
    log = (lambda msg: print(msg, flush=True)) if rank == 0 else (lambda msg: None)
    torch.manual_seed(0)
    mesh = Mesh.build(ParallelDims(pp=world), device=torch.device("cpu"))
    cfg = model_config(shape)
    tp = TPContext(mesh.tp)
    chunks = build_pipeline_chunks(cfg, tp, mesh.coords.pp, world, seed=0).train()
    # ZBV: the same model (same seed, same global parameter names) cut into 2 pp stages, two a rank in a V
    v_stages = [ScheduleKind.ZBV.placement.stage(mesh.coords.pp, c, world) for c in range(2)]
    v_chunks = build_pipeline_chunks(cfg, tp, mesh.coords.pp, world, 2, seed=0, stage_ids=v_stages).train()
    batches = make_batches(shape)
    runtimes = {}
    for name, kind in KINDS.items():
        own = v_chunks if kind is ScheduleKind.ZBV else chunks
        runtimes[f"ours {name}"] = Ours(own, kind, mesh, shape)
        runtimes[f"torch {name}"] = Torch(own, kind, mesh, shape)

    # warm-up (torch infers shapes on its first step), then the same step on both from the same weights
    steps = {n: _timed(lambda r=r: r.step(batches), r.params) for n, r in runtimes.items()}
    for n, step in steps.items():
        for _ in range(warmup):
            step()
        log(f"  {n}: warmed up ({warmup} steps)")
    check = {}
    for name in KINDS:
        out = {}
        for side in ("ours", "torch"):
            r = runtimes[f"{side} {name}"]
            for p in r.params:
                p.grad = None
            out[side] = (r.step(batches), _grads(r.params))
        diff = max(((a - b).abs().max().item() for a, b in zip(out["ours"][1], out["torch"][1])), default=0.0)
        scale = max((g.abs().max().item() for g in out["torch"][1]), default=0.0)
        check[f"{name} loss ours"], check[f"{name} loss torch"] = out["ours"][0], out["torch"][0]
        check[f"{name} max |grad diff| / max |grad|"] = diff / scale if scale else diff
    grads = {}
    for name in ("ours 1F1B", ZB_NAME):  # ZB-H1 computes the same gradients as 1F1B, bit for bit
        for p in runtimes[name].params:
            p.grad = None
        runtimes[name].step(batches)
        grads[name] = _grads(runtimes[name].params)
    check["ZB-H1 gradients equal 1F1B's"] = float(all(torch.equal(a, b) for a, b in zip(*grads.values())))

    times: dict[str, list[float]] = {n: [] for n in runtimes}
    cpu: dict[str, list[float]] = {n: [] for n in runtimes}
    for i in range(repeats):
        for n, step in steps.items():
            wall, used = step()
            times[n].append(wall)
            cpu[n].append(used)
        log(f"  {i + 1}/{repeats} rounds, median so far: " + ", ".join(
            f"{n} {1e3 * statistics.median(t):.0f} ms" for n, t in times.items()))

    saved, held, live, busy, ops = {}, {}, {}, {}, {}
    for n, r in runtimes.items():
        for p in r.params:
            p.grad = None
        dist.barrier()
        saved[n], held[n] = r.measure(batches)
        for p in r.params:
            p.grad = None
        dist.barrier()
        live[n] = peak_live_bytes(lambda r=r: r.step(batches))
        busy[n] = []
        for _ in range(PROFILE_STEPS):
            for p in r.params:
                p.grad = None
            dist.barrier()
            with ComputeCPU().installed(r.chunks) as probe:  # the runtime's own CPU = main thread's - compute's
                if isinstance(r, Torch):
                    r.cpu_probe = probe  # torch's loss runs outside the stage's chunk (ours: inside the last chunk)
                step_s, compute_s, main_cpu = r.compute_seconds(batches)
                if isinstance(r, Torch):
                    r.cpu_probe = None
            busy[n].append((step_s, compute_s, main_cpu, probe.seconds))
            if isinstance(r, Ours):  # the simulator's input: per chunk (ZBV's V chunks apart), each compute's seconds
                for e in r.last_events:
                    if e.name in COMPUTE:
                        key = ("v", e.chunk) if r.chunks is v_chunks else ("loop", 0)
                        ops.setdefault(key, {}).setdefault(e.name, []).append(e.end - e.start)
    log(f"  memory measured (one ledger step per runtime), compute / wait split ({PROFILE_STEPS} steps per runtime)")
    recv = runtimes["torch 1F1B"].recv_buffer_bytes()
    return {"times": times, "cpu": cpu, "saved": saved, "held": held, "live": live, "busy": busy, "recv": recv,
            "check": check, "ops": {k: {n: statistics.median(t) for n, t in per.items()} for k, per in ops.items()}}


def bench(pp: int, shape: Shape, warmup: int, repeats: int) -> PPResult:
    results = run_distributed(_rank, pp, args=(shape, warmup, repeats), timeout=900)
    names = list(results[0]["times"])
    times = {n: [max(ts) for ts in zip(*(r["times"][n] for r in results))] for n in names}  # slowest rank
    cpu = {n: [sum(ts) for ts in zip(*(r["cpu"][n] for r in results))] for n in names}  # all ranks together
    # gradient differences: the worst over ranks; losses: the last stage's (it computes them)
    check = {k: max(r["check"][k] for r in results) for k in results[0]["check"] if "grad" in k}
    check["ZB-H1 gradients equal 1F1B's"] = min(r["check"]["ZB-H1 gradients equal 1F1B's"] for r in results)
    for name, kind in KINDS.items():  # the loss from the rank holding the last stage (rank 0 under ZBV's V)
        v = 2 if kind is ScheduleKind.ZBV else 1
        holder = results[kind.placement.rank_chunk(pp * v - 1, pp)[0]]["check"]
        check.update({k: holder[k] for k in (f"{name} loss ours", f"{name} loss torch")})
    ops = [r["ops"][("loop", 0)] for r in results]
    v_ops = [[r["ops"][("v", c)] for c in range(2)] for r in results]
    return PPResult(pp=pp, times=times, cpu=cpu,
                    saved={n: [r["saved"][n] for r in results] for n in names},
                    held={n: [r["held"][n] for r in results] for n in names},
                    live={n: [r["live"][n] for r in results] for n in names},
                    torch_recv_buffers=[r["recv"] for r in results], check=check, op_seconds=ops,
                    predicted=predicted_steps(ops, v_ops, shape.m),
                    busy={n: [tuple(statistics.median(s[i] for s in r["busy"][n]) for i in range(4)) for r in results]
                          for n in names})


def _split_costs(per_stage: list[dict[str, float]]) -> Costs:
    """Costs with each global stage's measured F, and B + W as its backward with W's share of it."""
    b, w = [o.get("backward_input", 0.0) for o in per_stage], [o.get("backward_weight", 0.0) for o in per_stage]
    return Costs(stage_forward=tuple(o["forward"] for o in per_stage), stage_backward=tuple(x + y for x, y in zip(b, w)),
                 stage_weight_share=tuple(y / (x + y) if x + y > 0 else 0.5 for x, y in zip(b, w)))


def predicted_steps(ops: list[dict[str, float]], v_ops: list[list[dict[str, float]]], m: int) -> dict[str, float]:
    """The simulator's step time of 1F1B and ZB-H1 from the measured per-stage seconds of F, the full backward
    (1F1B), B and W (ZB-H1), and of ZBV from the seconds of F, B, W measured on each of its 2 pp stages (rank r's
    chunk c is the V's stage r or 2 pp - 1 - r); messages free."""
    pp, zbv = len(ops), ScheduleKind.ZBV
    full = Costs(stage_forward=tuple(o["forward"] for o in ops), stage_backward=tuple(o["backward"] for o in ops))
    v_stages = [{} for _ in range(2 * pp)]
    for r, per_chunk in enumerate(v_ops):
        for c, o in enumerate(per_chunk):
            v_stages[zbv.placement.stage(r, c, pp)] = o
    return {"1F1B": simulate(build_schedule(ScheduleKind.ONE_F_ONE_B, pp, m), full).makespan,
            "ZB-H1": simulate(build_schedule(ScheduleKind.ZB_H1, pp, m), _split_costs(ops)).makespan,
            "ZBV": simulate(build_schedule(zbv, pp, m, 2), _split_costs(v_stages), placement=zbv.placement).makespan}


# --- report ------------------------------------------------------------------------------------

def _ms(ts: list[float]) -> str:
    return f"{1e3 * statistics.median(ts):.0f} / {1e3 * min(ts):.0f}"


def _mib(per_stage: list[int]) -> str:
    return " / ".join(f"{b / MiB:.1f}" for b in per_stage)


def _paired(ours: list[float], theirs: list[float]) -> float:
    """Median over rounds of ours/torch within a round: adjacent steps, so slow drifts of the machine cancel."""
    return statistics.median(a / b for a, b in zip(ours, theirs))


def block_ratios(ours: list[float], theirs: list[float], runs: int) -> list[float]:
    """The rounds cut into `runs` consecutive blocks; per block median(ours) / median(torch)."""
    n = len(ours) // runs
    return [statistics.median(ours[i * n:(i + 1) * n]) / statistics.median(theirs[i * n:(i + 1) * n])
            for i in range(runs)]


def verdict(ratios: list[float]) -> str:
    """A lead only where every block's ratio is on the same side of 1.0 (the min-max excludes it)."""
    if len(ratios) < 2:
        return "no lead claimed (one block)"
    if max(ratios) < 1.0:
        return "ours faster"
    if min(ratios) > 1.0:
        return "torch faster"
    return "no lead claimed (spread includes 1.0)"


def time_table(results: list[PPResult], m: int, runs: int) -> str:
    lines = ["| pp | m | schedule | ours ms (median / min) | torch ms (median / min) "
             "| ours/torch, median of blocks (min - max) | CPU s per step, all ranks: ours / torch (median) "
             "| ours/torch CPU (paired median) | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        for name in KINDS:
            ours, theirs = f"ours {name}", f"torch {name}"
            q = block_ratios(res.times[ours], res.times[theirs], runs)
            lines.append(f"| {res.pp} | {m} | {name} | {_ms(res.times[ours])} | {_ms(res.times[theirs])} "
                         f"| {statistics.median(q):.3f} ({min(q):.3f} - {max(q):.3f}) "
                         f"| {statistics.median(res.cpu[ours]):.2f} / {statistics.median(res.cpu[theirs]):.2f} "
                         f"| {_paired(res.cpu[ours], res.cpu[theirs]):.3f} | {verdict(q)} |")
    return "\n".join(lines)


def zero_bubble_table(results: list[PPResult], m: int, runs: int) -> str:
    """ZB-H1 against our 1F1B, measured in the same rounds, beside the simulator's prediction."""
    lines = ["| pp | m | 1F1B ms, median (min - max) | ZB-H1 ms, median (min - max) | ZB-H1 / 1F1B, median of blocks "
             "(min - max) | simulated ZB-H1 / 1F1B (step ms) | saving measured / simulated | within 10 % "
             "| ZBV ms, median (min - max) | ZBV / 1F1B, median of blocks (min - max) | simulated ZBV / 1F1B "
             "| ZBV saving measured / simulated | within 10 % |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        ours, zb, zbv = res.times["ours 1F1B"], res.times[ZB_NAME], res.times["ours ZBV"]
        q, qv = block_ratios(zb, ours, runs), block_ratios(zbv, ours, runs)
        p1, pz = res.predicted["1F1B"], res.predicted["ZB-H1"]
        saving, predicted = 1 - statistics.median(q), 1 - pz / p1
        close = abs(saving - predicted) <= 0.1 * abs(predicted) if predicted else False
        pv = res.predicted["ZBV"]
        saving_v, predicted_v = 1 - statistics.median(qv), 1 - pv / p1
        close_v = abs(saving_v - predicted_v) <= 0.1 * abs(predicted_v) if predicted_v else False
        lines.append(f"| {res.pp} | {m} | {1e3 * statistics.median(ours):.0f} ({1e3 * min(ours):.0f} - "
                     f"{1e3 * max(ours):.0f}) | {1e3 * statistics.median(zb):.0f} ({1e3 * min(zb):.0f} - "
                     f"{1e3 * max(zb):.0f}) | {statistics.median(q):.3f} ({min(q):.3f} - {max(q):.3f}) "
                     f"| {pz / p1:.3f} ({1e3 * pz:.0f} / {1e3 * p1:.0f}) | {100 * saving:.1f} % / {100 * predicted:.1f} % "
                     f"| {'yes' if close else 'no'} | {1e3 * statistics.median(zbv):.0f} ({1e3 * min(zbv):.0f} - "
                     f"{1e3 * max(zbv):.0f}) | {statistics.median(qv):.3f} ({min(qv):.3f} - {max(qv):.3f}) "
                     f"| {pv / p1:.3f} | {100 * saving_v:.1f} % / {100 * predicted_v:.1f} % "
                     f"| {'yes' if close_v else 'no'} |")
    return "\n".join(lines)


def stage_seconds_lines(results: list[PPResult]) -> list[str]:
    """The loop stages' seconds (1F1B, GPipe, ZB-H1); ZBV's per-chunk seconds feed its prediction likewise."""
    def fmt(o: dict[str, float]) -> str:
        return ", ".join(f"{k.replace('backward_input', 'B').replace('backward_weight', 'W')} {1e3 * v:.1f}"
                         for k, v in sorted(o.items()))
    return [f"- measured ms per micro-batch (the simulator's input), pp {res.pp}: " +
            " | ".join(f"stage {r}: {fmt(o)}" for r, o in enumerate(res.op_seconds)) for res in results]


def floor_lines(results: list[PPResult]) -> list[str]:
    """How far any 1F1B runtime could lead torch's: the simulated 1F1B step from the measured per-stage F and B
    (messages, waits and the runtime's own work free) is the least time a runtime of this schedule over these
    computes can take; torch's median step over it bounds the speed-up (the issue asks 1.05)."""
    out = []
    for res in results:
        floor = res.predicted["1F1B"]
        ours, theirs = statistics.median(res.times["ours 1F1B"]), statistics.median(res.times["torch 1F1B"])
        out.append(f"- 1F1B floor, pp {res.pp}: {1e3 * floor:.0f} ms simulated from the measured F and B above "
                   f"(messages and runtime work free); torch's median step / floor = {theirs / floor:.3f} (the "
                   f"largest speed-up over torch any runtime of this schedule over these computes can have), "
                   f"ours / floor = {ours / floor:.3f}")
    return out


def memory_table(results: list[PPResult]) -> str:
    lines = ["| pp | schedule | peak live tensors MiB per stage (one probe, both sides): ours | torch "
             "| saved activations MiB per stage (one ledger, both sides): ours | torch | ours <= torch (live) |",
             "|---|---|---|---|---|---|---|"]
    for res in results:
        for name in KINDS:
            ours, theirs = f"ours {name}", f"torch {name}"
            ok = all(a <= b for a, b in zip(res.live[ours], res.live[theirs]))
            lines.append(f"| {res.pp} | {name} | {_mib(res.live[ours])} | {_mib(res.live[theirs])} "
                         f"| {_mib(res.saved[ours])} | {_mib(res.saved[theirs])} | {'yes' if ok else 'no'} |")
    return "\n".join(lines)


def split_table(results: list[PPResult]) -> str:
    """Per stage: compute (forward, loss, backward) and the rest of the step (waiting on messages, bubbles,
    the runtime's own work), median of the PROFILE_STEPS untimed steps."""
    def cells(per_stage: list[tuple[float, float, float, float]]) -> str:
        return " / ".join(f"{1e3 * c:.0f} + {1e3 * (t - c):.0f}" for t, c, _, _ in per_stage)

    def own(per_stage: list[tuple[float, float, float, float]]) -> str:  # main-thread CPU outside compute
        return " / ".join(f"{1e3 * (m - mc):.1f} ({100 * (m - mc) / t:.1f} %)" for t, _, m, mc in per_stage)
    lines = ["| pp | schedule | ours: compute + rest ms, per stage | torch: compute + rest ms, per stage "
             "| runtime's own CPU ms (% of the step), per stage: ours | torch |",
             "|---|---|---|---|---|---|"]
    for res in results:
        for name in KINDS:
            o, t = res.busy[f"ours {name}"], res.busy[f"torch {name}"]
            lines.append(f"| {res.pp} | {name} | {cells(o)} | {cells(t)} | {own(o)} | {own(t)} |")
    return "\n".join(lines)


def checks(results: list[PPResult]) -> list[str]:
    out = []
    for res in results:
        c = res.check
        parts = [f"{name}: loss ours {c[f'{name} loss ours']:.6f} / torch {c[f'{name} loss torch']:.6f}, "
                 f"max |grad diff| / max |grad| {c[f'{name} max |grad diff| / max |grad|']:.1e}" for name in KINDS]
        out.append(f"- same weights and micro-batches, pp {res.pp}: " + "; ".join(parts))
        out.append(f"- torch's persistent receive buffers (m activations + m gradients), pp {res.pp}, MiB per stage: "
                   f"{_mib(res.torch_recv_buffers)}")
        out.append(f"- ZB-H1's gradients equal our 1F1B's bit for bit, pp {res.pp}: "
                   f"{'yes' if c['ZB-H1 gradients equal 1F1B' + chr(39) + 's'] else 'NO'}")
    return out


_version = package_version


def report(results: list[PPResult], args: argparse.Namespace, shape: Shape, load: tuple[float, float]) -> str:
    """Setup lines, the table, and the correctness / buffer notes; `load` is the 1-minute load average
    before and after (on this 2-core machine, pp = 4 already runs two ranks per core)."""
    cpu = cpu_name()
    command = "python scripts/bench_pipeline.py " + " ".join(sys.argv[1:])
    return "\n".join([
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {os.cpu_count()}-core CPU ({cpu}), gloo, one process per pipeline rank, "
        "torch.set_num_threads(1) per process",
        f"- versions: torch {torch.__version__}, transformers {_version('transformers')}, "
        f"python {platform.python_version()}",
        f"- command: `{command.strip()}`",
        f"- model: GPT-2, L={shape.layers}, h={shape.hidden}, {NUM_HEADS} heads, V={shape.vocab}, fp32; "
        f"micro-batch (b, T) = ({shape.micro_batch}, {shape.seq}), m = {shape.m}; layers split evenly",
        f"- timing: forward + backward of one step (no optimizer), {args.warmup} warm-up step(s), then "
        f"{args.repeats * args.runs} "
        f"interleaved rounds (ours and torch: 1F1B, GPipe, ZB-H1, ZBV) in {args.runs} consecutive blocks; "
        f"slowest rank per step; ratio per block = median ours / median torch; a lead is claimed only where the "
        f"min-max over blocks excludes 1.0; 1-min load average {load[0]:.2f} at the start, {load[1]:.2f} at the end",
        "",
        time_table(results, shape.m, args.runs),
        "",
        "Zero bubble (ours): ZB-H1 and ZBV against 1F1B in the same rounds, beside the simulator's prediction from the "
        "measured per-stage F, B, W seconds (ZBV's on its own 2 pp stages; messages free):",
        "",
        zero_bubble_table(results, shape.m, args.runs),
        "",
        *stage_seconds_lines(results),
        *floor_lines(results),
        "",
        "Memory (untimed steps per runtime; the same two probes on both sides: `LiveTensorProbe`, a dispatch mode "
        "counting every storage an op creates during the step until it is freed, and the saved-tensor ledger):",
        "",
        memory_table(results),
        "",
        f"Where the time goes ({PROFILE_STEPS} more untimed steps per runtime, median; compute = forward, loss "
        "and backward; rest = waiting on messages and bubbles, plus the runtime's own work; the runtime's own CPU = "
        "the main thread's CPU time of the step minus its CPU inside forward, loss and autograd backward, the same "
        "probe on both sides):",
        "",
        split_table(results),
        "",
        *checks(results),
        "",
    ])


# --- command line ------------------------------------------------------------------------------

_Parser, _positive = OneLineParser, positive_int


def _sizes(text: str) -> list[int]:
    try:
        values = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 2, e.g. 2,4; got {text!r}") from None
    if any(v < 2 for v in values):
        raise argparse.ArgumentTypeError(f"pipeline sizes must be >= 2 (a pipeline needs two stages), got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _Parser(prog="bench_pipeline.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--pp", type=_sizes, default=[2], help="pipeline sizes, comma-separated, each <= the cores "
                   "(default 2)")
    p.add_argument("--microbatches", type=_positive, default=4, help="micro-batches per step m (default 4)")
    p.add_argument("--repeats", type=_positive, default=10,
                   help="timed rounds of the eight runtimes per block (default 10)")
    p.add_argument("--runs", type=_positive, default=3, help="blocks of rounds, for the ratio's spread (default 3)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: tiny sizes, 2 rounds, 1 block (checks the script, measures nothing)")
    p.add_argument("--warmup", type=_positive, default=1,
                   help="untimed steps per runtime first (default 1; one more untimed step checks the gradients)")
    p.add_argument("--hidden", type=_positive, default=256,
                   help=f"model width h, a multiple of {NUM_HEADS} (default 256)")
    p.add_argument("--layers", type=_positive, default=8, help="Transformer blocks L (default 8)")
    p.add_argument("--seq", type=_positive, default=128, help="tokens per sequence T (default 128)")
    p.add_argument("--micro-batch", type=_positive, default=2, help="sequences per micro-batch b (default 2)")
    p.add_argument("--vocab", type=_positive, default=2048, help="vocabulary V (default 2048)")
    p.add_argument("--out", metavar="FILE.md", help="also write the report (setup + table) as markdown")
    args = p.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.seq, args.micro_batch, args.vocab = 16, 2 * max(args.pp), 8, 1, 64
        args.microbatches, args.repeats, args.runs, args.warmup = 2, 2, 1, 1
    cores = os.cpu_count() or 1
    if max(args.pp) > cores:
        p.error(f"--pp {max(args.pp)}: more ranks than the {cores} cores would time the OS scheduler, not the "
                f"runtimes; use --pp <= {cores}")
    if args.hidden % NUM_HEADS != 0:
        p.error(f"--hidden {args.hidden}: must be a multiple of the {NUM_HEADS} heads")
    bad = [pp for pp in args.pp if args.layers % (2 * pp) != 0]
    if bad:
        p.error(f"--layers {args.layers}: ZBV's even split into 2 x pp stages needs a multiple of 2 x every --pp "
                f"size, not of {2 * bad[0]}")
    if args.microbatches < max(args.pp):
        p.error(f"--microbatches {args.microbatches}: torch's Schedule1F1B needs m >= pp; use >= {max(args.pp)}")
    for pp in args.pp:  # torch's ZB1P indexes rounds of max(1, m // pp) micro-batches
        rounds = max(1, args.microbatches // pp)
        if args.microbatches % rounds:
            p.error(f"--microbatches {args.microbatches}: torch's ScheduleInterleavedZeroBubble needs m a multiple "
                    f"of max(1, m // pp) = {rounds} at --pp {pp}; use a multiple of {pp}")
    if args.seq < 2:
        p.error("--seq must be at least 2 (the loss predicts the next token)")
    p.check_out("--out", args.out)  # a regular file in an existing, writable directory
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    shape = Shape(layers=args.layers, hidden=args.hidden, seq=args.seq, micro_batch=args.micro_batch,
                  vocab=args.vocab, m=args.microbatches)
    start = time.perf_counter()
    load_before = os.getloadavg()[0]
    results = []
    for i, pp in enumerate(args.pp, 1):
        print(f"[{i}/{len(args.pp)}] pp {pp}, m {shape.m}: ours vs torch.distributed.pipelining, 1F1B, GPipe, "
              f"ZB-H1 and ZBV "
              f"({pp} gloo ranks)", flush=True)
        results.append(bench(pp, shape, args.warmup, args.repeats * args.runs))
    text = report(results, args, shape, (load_before, os.getloadavg()[0]))
    print(f"\n{text}\ntotal {time.perf_counter() - start:.0f} s", flush=True)
    if args.out:
        write_text(args.out, text)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
