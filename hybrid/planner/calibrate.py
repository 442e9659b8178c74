"""`hybrid calibrate`: measure this machine and write a hardware profile that `hybrid plan --hardware FILE`
uses in place of a preset.

    hybrid calibrate --ranks 4 --out cpu.json          # spawns 4 ranks (gloo on CPU, nccl on GPUs)
    hybrid plan --model tiny-gpt2 --gpus 4 --global-batch-size 16 --hardware cpu.json --precision fp32 \\
                --activation-profile fp32-flash

What is measured, with every rank running at once (so a CPU's cores are shared as they are in training; each
rank has one intra-op thread, as hybrid.testing.run_distributed and the CPU scripts set it):

* matmul FLOP/s per dtype (fp32; bf16 where the device runs it): n x n x n products, 2 n^3 FLOPs each, with
  every rank busy at once (median rank) and with rank 0 alone; and the GEMM curve (hardware.py): rank 0 alone
  at n / 8, n / 4, n / 2 and n, fitted to t = W / R + t0 (least squares) -> `peak_tflops` = R (bf16 when
  measured, else fp32; `load_hardware(..., Precision.FP32)` takes the fp32 curve) with `compute_efficiency` 1
  (R is an achieved rate already) and `gemm_overhead_s` = t0. On GPUs (nccl) the all-at-once rate; on a CPU (gloo) the alone rate, and
  `compute_units` = the CPU count: ranks beyond the cores share them, which the planner's shared-compute
  bound prices (time.py) -- an idle pipeline rank gives its core to the others;
* memory bandwidth: a large tensor copy, read + write bytes / second (alone on a CPU, as above) -> `hbm_tbps`
  (the GEMMs' operand-traffic bound);
* real Transformer layers (models.GPT2Block, no dropout; `LayerProbe`), forward and backward, each pass timed as
  training runs it (`layer_seconds`: IN_FLIGHT forwards with their graphs kept, then their backwards; round 23),
  on a CPU every rank at once, each on its CPU clock, the median rank's reading (`occupied_seconds`, round 23 --
  the cores as busy as in training); rank 0 alone on a GPU.
  On a CPU, fp32 at small shapes unlike the benchmarks' (so they validate it), two measurements: the per-pass
  layer PASS_SHAPE (one token, h 64: its GEMMs and bytes vanish) whose time beyond its GEMMs is a fixed cost per
  layer pass -> `layer_forward_overhead_s` / `layer_backward_overhead_s` (Python, the dispatcher, autograd:
  what makes a small layer slower than its bytes, as t0 does for a GEMM); and the rate layers LAYER_SHAPES,
  whose time beyond their GEMMs (on the curve just fitted) and that cost is the memory-bound traffic the
  planner counts for a layer (time.layer_parts) at one rate, least squares (`fit_layer`) -> `elementwise_tbps`
  (a CPU core runs GELU's tanh and softmax's exp below its copy rate: 4.2-5.2 against 13.4-13.9 GB/s on this
  2-core VM, and the copy rate under-predicted a layer by 10-13 %, docs/results/bench_interleaved.md).
  Until round 11 the rate and one fixed cost were solved exactly from two h-384 layers, where the GEMMs take
  75-85 % of the time: a few % of noise moved the fixed costs 0-4 ms between calibrations (`two_shape_solve`,
  kept as the reference). On a GPU bf16 at GPU_PROBE's larger shapes: the memory-bound bytes are priced at the
  copy rate and the larger probe layer alone gives `kernel_overhead_s` (`fit_gpu_kernel_overhead`: the smaller one
  was host-bound on an H200), both layers' plans kept beside their measurements. On a CPU, when noise leaves no
  positive rate the copy rate is kept and the fixed costs are the per-pass layer's time beyond its GEMMs;
* all-reduce (and on GPUs all-gather: `timed_collectives`) over all ranks for sizes S (nccl-tests' size: the
  reduced tensor, the gathered output), timed back to back over a few calls after a warm-up (on a CPU a block
  of calls untimed, then the median of COLLECTIVE_BLOCKS = 5 blocks' means; rank 0's block means kept in the
  profile):
  algbw = S / t, busbw = algbw x 2(n - 1)/n (all-reduce) or x (n - 1)/n (all-gather), the nccl-tests
  convention (doc/PERFORMANCE.md there) -> `intra_node_gbps` is the all-reduce busbw at the largest size,
  `intra_latency_s` the time of the smallest all-reduce -- on a CPU the median of that reading and of 10 short
  rounds of it taken between the other probes (`LatencyRounds`, round 22: one reading is one moment of the OS
  scheduler);
* gloo with a core per rank (`skew_probe`): an 8-byte all-reduce after matmul bursts of ~0.5, 2 and 10 ms, the
  mean over calls and ranks. Beyond its back-to-back time a call then waits for the ranks to meet -- one
  finishes its burst later, the other waits inside the call, blocked, and must be woken -- and that wait grows
  with the compute since the last sync: fitted (`fit_skew`) to wait(c) = `collective_skew_s` +
  `collective_skew_per_s` x c, which the planner charges each TP collective for the compute before it
  (hardware.sync_wait_seconds; `hybrid plan --explain`'s tp_wait). Timing every call after a 10 ms burst, as
  calibrate did before, read an 8-byte all-reduce at 1.9 ms on this 2-core VM (quiet), the wait of a 10 ms
  burst, and charged it to TP all-reduces a ~1 ms layer part apart: every 2-rank layout was planned slow,
  tp 2 at b 1 by 1 / 0.76 (docs/planner/validation.md, "The ranks' skew at a collective"). Not with more ranks than
  cores (the scheduler's waits: the shared-compute bound) or nccl.

* gloo only, every pair of ranks (0, 1), (2, 3), ... at once (`pair_comm_cpu`): the CPU seconds a rank burns per
  TP all-reduce of the small probe layer run at tp 2 on the pair, per pipeline message (its peer late) and per
  byte -> `collective_cpu_s`, `p2p_cpu_s`, `comm_cpu_s_per_byte`: with more ranks than cores that CPU is work the
  cores do besides compute, which the shared-compute bound adds (time.comm_cpu_seconds). Each the median of
  PAIR_BLOCKS runs (1: more did not pay, below); the all-reduce's and the smallest message's also in 5 rounds
  between the other probes (at every other latency round since round 25: PAIR_ROUND_EVERY), per rank the median
  of the probe's reading and the rounds' (`PairRounds`, round 24:
  as the latency's, one reading is one moment). On the same pairs (`tp_pass_cpu`): the per-pass layer at tp 2
  and unsharded, the calling thread's CPU outside its TP all-reduces, forward and backward -> what a pass at
  tp > 1 costs beyond the planner's sharded layer, `tp_layer_forward_overhead_s` / `tp_layer_backward_overhead_s`
  (`fit_tp_pass`: the TP autograd Functions, the first touches after each blocking all-reduce; round 11); and
  (`edge_pass_cpu`) the pipeline stage's edges the same way -- the runtime's GPT-2 stage with no layers, first only
  (the vocab-parallel embedding) and last only (final norm, vocab-parallel LM head and cross-entropy) -> what they
  cost a pass at tp > 1 beyond the planner's sharded kernels, `tp_embedding_*` / `tp_head_*_overhead_s`
  (`fit_edge_pass`; round 12). And (`executor_action_cpu`, round 14) the pipeline executor itself: the pair run as a
  pp-2 pipeline (1F1B, 4 one-token micro-batches) over stages that compute next to nothing, the calling thread's
  CPU per forward / backward action less the stage's call, the autograd call and the receives' waits ->
  `executor_forward_cpu_s` / `executor_backward_cpu_s` (the executor's Python, priced per chunk pass).

* gloo only, every rank at once on its CPU clock, the median rank's (`optimizer_step_cpu`, round 14; rank 0 alone
  until round 23): the runtime's ZeroOptimizer at train.py's defaults (stage 0, fp32, clip 1.0, fused AdamW) over
  one-token GPT-2 stages of 1 and 4 layers, 8 wide (20 and 68 parameter tensors, next to no bytes): zero_grad + begin_step + finish_backward + step, CPU seconds a
  step; the line through the two sizes, less the planner's own bytes -> `optimizer_tensor_cpu_s` (a tensor) and
  `optimizer_step_cpu_s` (a step), added to the optimizer term (`fit_optimizer_step`). Since round 24 on the main
  job's mesh as far as the world factors (`job_mesh_dims`: tp 2 x pp 2 x dp 2 on 8 ranks), each rank its stage's
  TP shard, timed outside the collectives' waits (`outside_comm_waits`: the pair probe prices those) -- on a
  one-rank mesh every gradient sync was a no-op and the job's optimizer read ~1.6x its plan.

On a CPU the collectives and the pair probe keep the median of their blocks (`block_median`): with more ranks than
cores a block is one draw of the OS scheduler, and a stall in one block moves a mean but not the median (round 10:
docs/results/bench_planner_mainjob.md).

On a CPU every probe a rank runs alone (the GEMM curve, the copy) or every rank at once (the layers, the optimizer)
is timed on its CPU clock (`solo_clock`: user + sys seconds of the process), the same as wall on a quiet core and not
stretched by other processes on a loaded machine; the all-at-once rates stay wall (they measure the sharing).

Not measured (one machine cannot): the network between nodes, PCIe, host memory for offload. Those fields
keep the `cpu` preset's values (or `--base` preset's) and the profile says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import signal
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from unittest import mock

import torch
import torch.distributed as dist

from hybrid.cliutil import check_not_link, check_output_file, plural
from hybrid.comm import CommLedger, Group
from hybrid.planner.hardware import GB, GpuKind, Hardware, hardware
from hybrid.planner.model import Precision
from hybrid.planner.profile import (DEFAULT_SIZES, FORMAT, GPU_COPY_BYTES, GPU_MATMUL_N, HELP,  # noqa: F401 (re-exported)
                                    PROFILE_KEYS, CalibrationConfig, _check_field, _refuse_unknown, add_parser,
                                    check_replaces_a_profile, load_hardware)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # profile.DTYPE_NAMES, as torch dtypes
# torch 2.13 renamed the tensor-in/tensor-out all-gather (as hybrid/comm.py handles it)
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def bus_bandwidth(op: str, size_bytes: float, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s, nccl-tests' convention: algbw = S / t; busbw = algbw x 2(n-1)/n for
    all_reduce, x (n-1)/n for all_gather and reduce_scatter."""
    algbw = size_bytes / seconds
    factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
    return algbw, algbw * factor


def _timed(fn, seconds: float, min_calls: int = 2, clock=time.perf_counter) -> float:
    """Seconds per call of fn() on `clock`: one warm-up, then calls until `seconds` have passed on it (at least
    min_calls). `time.process_time` (CPU_CLOCK) times a CPU rank's own work: the seconds it spends on a core, which
    other processes on the machine do not stretch as they stretch wall time."""
    fn()
    calls, start = 0, clock()
    while calls < min_calls or clock() - start < seconds:
        fn()
        calls += 1
    return (clock() - start) / calls


def block_median(means: list[float]) -> float:
    """The statistic of a CPU probe's repeated blocks: their median. A block is one draw of the OS scheduler (with
    8 ranks on 2 cores one block of 20 back-to-back 8-byte all-reduces read 5.6-9.9 ms within one calibration,
    docs/results/bench_planner_mainjob.md, round 10): a block that met a stall moves a mean over blocks by its
    whole excess but a median not at all, and the median of B blocks' means still estimates the mean a call
    costs (what a step sums) where the blocks are alike."""
    if not means:
        raise ValueError("block_median: no blocks")
    return statistics.median(means)


def occupied_seconds(seconds: float, world: int, cores: int) -> float:
    """CPU seconds each rank times a probe for when all `world` ranks run it at once on `cores` cores: `seconds`
    x cores / world where the ranks outnumber the cores, so the cores' wall time stays `seconds` (what rank 0 alone
    took), else `seconds` (a core each)."""
    return seconds * min(1.0, cores / world)


def rank_median(readings: list) -> list[float] | None:
    """Element by element, the median over the ranks that read a probe (None: a rank that did not run it, as on a
    GPU, where rank 0 alone does): with every rank timing at once each rank is one draw of the cores' sharing
    (block_median's reasoning), and the median rank's reading is kept. None if no rank read it."""
    rows = [list(r) for r in readings if r is not None]
    return [statistics.median(col) for col in zip(*rows)] if rows else None


CPU_CLOCK = time.process_time  # a CPU rank's probes alone: user + sys seconds of the process (all its threads)


def solo_clock(device: torch.device):
    """The clock a rank's probes alone are timed on: on a CPU its own CPU seconds (one rank, one intra-op thread,
    busy throughout: the same as wall on a quiet core, and not stretched by other processes on a loaded one); a
    GPU's work is wall time."""
    return time.perf_counter if device.type == "cuda" else CPU_CLOCK


def matmul_flops(dtype: torch.dtype, n: int, seconds: float, device: torch.device,
                 clock=time.perf_counter) -> float | None:
    """FLOP/s of n x n x n matmuls in `dtype` (2 n^3 FLOPs each); None if the device cannot run them."""
    try:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

        def step() -> None:
            torch.mm(a, b, out=out)
            sync()
        return 2.0 * n**3 / _timed(step, seconds, clock=clock)
    except (RuntimeError, TypeError):
        return None


def curve_sizes(n: int) -> tuple[int, ...]:
    """The matmul sides the GEMM curve is measured at: n / 8, n / 4, n / 2, n (at least 8)."""
    return tuple(sorted({max(8, n // 8), max(8, n // 4), max(8, n // 2), n}))


def fit_gemm_curve(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(rate R in FLOP/s, fixed seconds t0) of t = W / R + t0, least squares over (W FLOPs, t seconds) points
    (hardware.py's GEMM curve without the roofline: square n^3 products are compute-bound). A negative t0
    (noise) is clamped to 0 and R refitted through the origin; with one point R = W / t."""
    if len(points) == 1 or len({w for w, _ in points}) == 1:
        w, t = points[-1]
        return w / t, 0.0
    n = len(points)
    mw = sum(w for w, _ in points) / n
    mt = sum(t for _, t in points) / n
    slope = sum((w - mw) * (t - mt) for w, t in points) / sum((w - mw) ** 2 for w, _ in points)
    t0 = mt - slope * mw
    if slope <= 0 or t0 < 0:
        slope, t0 = sum(w * t for w, t in points) / sum(w * w for w, _ in points), 0.0
    return 1.0 / slope, t0


def copy_bandwidth(nbytes: int, seconds: float, device: torch.device, clock=time.perf_counter) -> float:
    """Bytes/s of a tensor copy, read + written."""
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step() -> None:
        dst.copy_(src)
        sync()
    return 2.0 * nbytes / _timed(step, seconds, clock=clock)


# (micro-batch, sequence, hidden, heads) calibrate times on a CPU. The rate probes: small enough that the
# memory-bound traffic is over half of what the GEMMs leave (at h 384 the GEMMs took 75-85 % of a layer, and a few
# % of timing noise on them swung the rest by 25-50 %: docs/results/bench_planner_mainjob.md, round 11).
LAYER_SHAPES = ((8, 128, 64, 4), (4, 128, 128, 4))
# The per-pass probe: one token through a layer of 50k parameters -- its GEMMs and memory-bound bytes (10 / 20 us,
# 5 / 12 KB) vanish beside what every pass pays (Python, the dispatcher, autograd: 0.13 / 0.37 ms here, the same
# over h 16-128). Not h 384: there one token's backward also writes 7 MB of fresh weight gradients (page faults,
# 1.3-3.3 ms from one calibration to the next), a cost of the parameters, not of the pass.
PASS_SHAPE = (1, 1, 64, 4)
TP_PROBE_SHAPE = (1, 32, 384, 6)  # the layer pair_comm_cpu runs at tp 2 (a 48 KiB TP all-reduce)


@dataclass(frozen=True)
class LayerProbe:
    """The real layers `calibrate` times, and how the planner prices them.

    Attributes:
        shapes: (micro-batch, sequence, hidden, heads) of the layers timed for the memory-bound rate (a CPU) or
            the kernel latency (a GPU: the first, the larger, alone; the second is kept as a check).
        dtype: the layer's parameters and activations ("fp32" or "bf16", a DTYPES key).
        precision, profile: the planner's Workload fields for such a layer.
        pass_shape: the layer whose time is the fixed cost of a pass (fit_layer), or None (a GPU: no such cost).
    """

    shapes: tuple[tuple[int, int, int, int], ...]
    dtype: str
    precision: Precision
    profile: str  # an ActivationProfile value (hybrid.planner.model imports this module's names lazily)
    pass_shape: tuple[int, int, int, int] | None = None


# A CPU core: small fp32 layers, as the runtime trains there. A GPU: bf16 layers large enough that the memory-bound
# kernels, not launches, dominate what the GEMMs leave (the CPU shapes took 0.3-2.4 ms on an H200, all launch
# overhead, and fitted a 47 GB/s "rate" that priced a 1.2B model's step at 9 s against 0.76 measured).
CPU_PROBE = LayerProbe(LAYER_SHAPES, "fp32", Precision.FP32, "fp32-flash", PASS_SHAPE)
GPU_PROBE = LayerProbe(((2, 2048, 2048, 16), (1, 512, 1024, 8)), "bf16", Precision.MIXED, "bf16-flash")


def probe_for(device: torch.device) -> LayerProbe:
    return GPU_PROBE if device.type == "cuda" else CPU_PROBE


def layer_config(shape: tuple[int, int, int, int]):
    """The one-layer GPT-2 (no dropout) of `shape`, as a models.ModelConfig."""
    from transformers import GPT2Config

    from models import from_hf
    _, s, h, a = shape
    return from_hf(GPT2Config(n_layer=1, n_embd=h, n_head=a, vocab_size=256, n_positions=s, resid_pdrop=0.0,
                              embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))


# Micro-batches whose graphs a probe layer keeps before their backwards, as training does: 1F1B's first stage at
# pp 2 holds 2 (the main job), and in any schedule a layer's forward and its backward are apart, other passes
# between. Timed back to back instead (each forward freed at once, each backward right after its own forward), the
# per-pass layer's forward read 0.198 ms against 0.265 with 2 in flight (5 alternations each, load 12, round 23).
IN_FLIGHT = 2


def layer_seconds(shape: tuple[int, int, int, int], seconds: float, device: torch.device,
                  dtype: torch.dtype = torch.float32, clock=time.perf_counter) -> tuple[float, float]:
    """(forward, backward) seconds of one GPT-2 block of `shape` in `dtype`, each pass timed on its own as training
    runs it: rounds of IN_FLIGHT forwards (the autograd graph recorded and kept), then their backwards, oldest
    first, until 2 x `seconds` have passed on `clock` (after a warm-up round); the mean forward and backward.
    Until round 23 the forward ran alone under torch.no_grad() and the backward was forward + backward timed
    together less it: the graph's cost (+55 us a pass on the per-pass layer) was booked into the backward, and
    neither pass paid for following other work (the main job's layers' forward took 96.6 ms of CPU a step
    against 61.1 planned, round 23)."""
    from hybrid.comm import Group
    from hybrid.tp import TPContext
    from models.gpt2 import GPT2Block
    b, s, h, _ = shape
    block = GPT2Block(layer_config(shape), TPContext(Group.solo("tp"))).to(device, dtype)
    x = torch.randn(b, s, h, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(b, s, h, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(fn):
        start = clock()
        out = fn()
        sync()
        return out, clock() - start

    def one_round() -> tuple[float, float]:
        outs = [timed(lambda: block(x)) for _ in range(IN_FLIGHT)]
        return sum(t for _, t in outs), sum(timed(lambda: y.backward(grad))[1] for y, _ in outs)
    # One mean over the seconds, not block_median: round 10 tried 5 blocks of the same seconds and the layers'
    # times spread as much (4-14 % under load 7-28, on the CPU clock: other processes' cache and memory traffic,
    # not stalls a median drops), the fitted per-pass costs more (sd 54 / 82 % against 31 / 54 %).
    one_round()
    fwd = bwd = 0.0
    passes, start = 0, clock()
    while passes == 0 or clock() - start < 2 * seconds:
        f, bw = one_round()
        fwd, bwd, passes = fwd + f, bwd + bw, passes + IN_FLIGHT
    return fwd / passes, bwd / passes


def _probe_workload(shape: tuple[int, int, int, int], probe: LayerProbe):
    """The planner's Workload of one probe layer of `shape`: one micro-batch of b sequences, eager kernels."""
    from hybrid.planner.layout import Workload
    from hybrid.planner.model import ActivationProfile
    from hybrid.planner.ops import KernelProfile
    b, s = shape[:2]
    return Workload(layer_config(shape), global_batch=b, seq_length=s, precision=probe.precision,
                    activations=ActivationProfile(probe.profile), kernels=KernelProfile.EAGER, fp32_grads=False)


def layer_parts_of(hw: Hardware, shape: tuple[int, int, int, int], probe: LayerProbe = CPU_PROBE):
    """The planner's parts of one layer of `shape` (time.LayerParts: compute seconds, memory-bound bytes and
    kernels, per pass)."""
    from hybrid.planner.layout import Cluster, Layout
    from hybrid.planner.time import layer_parts
    return layer_parts(_probe_workload(shape, probe), Cluster(gpus=1, hw=hw), Layout(micro_batch=shape[0]))


def _rests(hw: Hardware, measured: list[tuple[float, float]], shapes, probe: LayerProbe):
    """Per shape, per pass: (seconds beyond the GEMMs and flash attention on `hw`, memory-bound bytes)."""
    parts = [layer_parts_of(hw, shape, probe) for shape in shapes]
    return [((f - p.forward_s, p.forward_bytes), (b - p.backward_s, p.backward_bytes))
            for (f, b), p in zip(measured, parts)]


def fit_layer(hw: Hardware, measured: list[tuple[float, float]], per_pass: tuple[float, float],
              probe: LayerProbe = CPU_PROBE) -> tuple[float | None, float, float]:
    """(elementwise bytes/s, forward fixed s, backward fixed s) of a layer pass on a CPU. Each pass of each layer
    takes its GEMMs (and flash attention) on `hw`, plus its memory-bound bytes x / rate, plus a fixed cost c of
    the pass (Python, the dispatcher, autograd): the rest r = t - GEMMs = x u + c, u = 1 / rate.

    `per_pass` (forward, backward) is the probe's pass_shape layer, whose bytes x0 are ~0: its rest r0 is the
    cost c almost alone, measured, not solved for. The rate comes from the larger `measured` layers (the probe's
    shapes) net of it -- r - r0 = (x - x0) u for each shape and pass, least squares through the origin over the
    2 x len(shapes) points: u = sum (x - x0)(r - r0) / sum (x - x0)^2 -- and then c = r0 - x0 u (x0 u is ~1 %
    of r0 here). Timing noise d on a time moves c by d (plus x0 du) and u by at most sum |x - x0| (|d| + |d0|) /
    sum (x - x0)^2: no difference of two nearly equal solutions, as the exact two-shape solve this replaces
    (`two_shape_solve`) had. When the layers leave no positive rate (noise), the rate is None (the copy rate is
    kept) and c is r0."""
    (f0, b0), = _rests(hw, [per_pass], [probe.pass_shape], probe)
    points = [(r - p0[0], x - p0[1]) for shape in _rests(hw, measured, probe.shapes, probe)
              for (r, x), p0 in zip(shape, (f0, b0))]
    sxx, sxr = sum(x * x for _, x in points), sum(x * r for r, x in points)
    u = sxr / sxx if sxx > 0 else 0.0
    if u <= 0:
        return None, max(0.0, f0[0]), max(0.0, b0[0])
    return 1.0 / u, max(0.0, f0[0] - f0[1] * u), max(0.0, b0[0] - b0[1] * u)


def two_shape_solve(hw: Hardware, measured: list[tuple[float, float]],
                    probe: LayerProbe) -> tuple[float | None, float, float]:
    """The layer fit calibrate used until round 11, kept as the reference its replacement is measured against
    (tests/test_calibrate_layerfit.py) and the GPU record (test_calibrate.py): rate and fixed cost solved exactly
    from the two shapes' forward + backward totals, the fixed cost split by the passes' residuals; no positive
    solution -> the larger shape's rate, no fixed cost. Ill-conditioned where the GEMMs take most of a layer:
    a few % of noise moved its fixed costs 0-4 ms between calibrations."""
    rests = [(f - p.forward_s, b - p.backward_s, p.forward_bytes, p.backward_bytes)
             for (f, b), p in zip(measured, (layer_parts_of(hw, shape, probe) for shape in probe.shapes))]
    (f1, b1, tf1, tb1), (f2, b2, tf2, tb2) = rests
    t1, t2 = tf1 + tb1, tf2 + tb2
    rate = (t1 - t2) / (f1 + b1 - f2 - b2) if f1 + b1 != f2 + b2 else -1.0
    fixed = f1 + b1 - t1 / rate if rate > 0 else -1.0
    if rate <= 0 or fixed < 0:
        return (t1 / (f1 + b1) if f1 + b1 > 0 and t1 > 0 else None), 0.0, 0.0
    fwd = [f - tf / rate for f, _, tf, _ in rests]  # each shape's forward residual beyond its bytes
    share = min(1.0, max(0.0, statistics.fmean(fwd) / fixed))
    return rate, fixed * share, fixed * (1 - share)


def fit_gpu_kernel_overhead(hw: Hardware, measured: tuple[float, float], rate: float,
                            probe: LayerProbe = GPU_PROBE) -> float:
    """Hardware.kernel_overhead_s of a GPU: what the probe's larger layer (`measured`: forward, backward seconds)
    takes beyond its GEMMs and flash attention on `hw` and its memory-bound bytes at `rate` (the measured copy
    rate, as the presets price them), over its memory-bound kernels (ops.py); 0 when nothing is left.

    Why not fit_layer's two-shape solve: on an H200 the smaller probe layer (b 1, s 512, h 1024) took 0.43 / 1.54
    ms against 0.16 / 0.34 of GPU work -- the host issuing eager PyTorch's kernels was the bound, not the GPU
    (docs/results/gpu_h200.md, run 2) -- and solved with the larger one it gave no positive cost and a 6 TB/s
    "rate" above the card's 4.8 TB/s. This is the method hybrid/planner/fit.py fits KERNEL_OVERHEAD_S with (copy
    rate fixed, the kernel latency the one unknown); the smaller shape is kept in the profile as a check."""
    p = layer_parts_of(hw, probe.shapes[0], probe)
    rest = sum(measured) - p.forward_s - p.backward_s - (p.forward_bytes + p.backward_bytes) / rate
    return max(0.0, rest / (p.forward_kernels + p.backward_kernels))


def planned_pass_seconds(hw: Hardware, shape: tuple[int, int, int, int], tp: int,
                         probe: LayerProbe = CPU_PROBE) -> tuple[float, float]:
    """The planner's (forward, backward) seconds of one layer of `shape` at tensor-parallel size `tp`, its TP
    collectives not included (time.layer_passes)."""
    from hybrid.planner.layout import Cluster, Layout
    from hybrid.planner.time import _context, layer_passes
    ctx = _context(_probe_workload(shape, probe), Cluster(gpus=tp, hw=hw), Layout(tp=tp, micro_batch=shape[0]))
    fwd, bwd = layer_passes(ctx)
    return fwd.total, bwd.total


def planned_layer_seconds(hw: Hardware, probe: LayerProbe, shapes=None) -> list[list[float]]:
    """[forward, backward] seconds of each probe layer (or of `shapes`) as `hw` plans them (time.layer_passes)."""
    return [list(planned_pass_seconds(hw, shape, 1, probe)) for shape in (probe.shapes if shapes is None else shapes)]


def layer_kernels(hw: Hardware, probe: LayerProbe) -> int:
    """Memory-bound kernels of one probe layer, forward + backward (ops.py): what a GPU's fixed cost divides by."""
    p = layer_parts_of(hw, probe.shapes[0], probe)
    return p.forward_kernels + p.backward_kernels


# Blocks of back-to-back calls per collective size on a CPU. Round 10 tried 15 (sizes <= 64 KiB) with PAIR_BLOCKS 5:
# on a quiet machine, 3 calibrations each alternated with this setting, the main job's planned step spread 21 %
# (0.255-0.308 s) against 15 % (0.284-0.327 s) here, calibrate took 53 s against 36 s, and the spread came from the
# fitted per-pass layer costs (layer_backward_overhead_s alone moved the step 20-29 %), not the collectives:
# docs/results/bench_planner_mainjob.md. Kept at 5 / 1.
COLLECTIVE_BLOCKS = 5


def _collective_seconds(op: str, size: int, world: int, device: torch.device, blocks: int = COLLECTIVE_BLOCKS,
                        calls: int | None = None, warmup: int | None = None) -> tuple[float, list[float]]:
    """(seconds of one collective of nccl-tests size `size`, every rank calling it together -- the slowest rank's
    block_median: all ranks time the same calls, and the max is all-reduced --, this rank's block means). On a CPU
    `blocks` blocks of `calls` calls after `warmup` untimed ones (default: a block's worth); one block on a GPU."""
    elems = max(1, size // 4)
    if op == "all_reduce":
        t = torch.ones(elems, device=device)
        call = (lambda: dist.all_reduce(t))
    else:
        shard = torch.ones(max(1, elems // world), device=device)
        out = torch.empty(shard.numel() * world, device=device)
        call = (lambda: _all_gather_single(out, shard))
    calls = calls or (20 if size <= 2**20 else 5)
    for _ in range(1 if device.type == "cuda" else calls if warmup is None else warmup):  # the scheduler settles
        call()
    dist.barrier()
    # Back to back: the call's own time (latency + bytes / bandwidth), the ranks in lock step. NCCL runs on its
    # stream, overlapping the compute stream. gloo with a core per rank: what a call waits for its ranks to meet
    # after compute (their skew) is measured apart, as a function of that compute (skew_probe) -- timing each call
    # after a 10 ms matmul burst read an 8-byte all-reduce at 1.9 ms on 2 ranks, the skew of a 10 ms burst, and
    # the planner charged it to TP all-reduces with ~1 ms of compute between them (every 2-rank layout planned
    # slow, tp 2 at b 1 by 1 / 0.76). More gloo ranks than cores: a burst would time the OS scheduler (8 ranks on
    # 2 cores: a 17-21 ms "latency"), which the shared-compute bound prices. On a CPU one block of calls is one
    # draw of the scheduler (8 ranks on 2 cores: the smallest all-reduce read 1.7-3.7 ms in five calibrations,
    # moving the main job's planned step from 0.20 to 0.28 s): the median of the blocks' means (block_median).
    # Under load (round 10, load 7-28) the 8-byte all-reduce's blocks read 5.6-9.9 ms within one calibration;
    # 15 blocks did not make the quiet machine's planned step more repeatable (COLLECTIVE_BLOCKS).
    block_means = []
    for _ in range(1 if device.type == "cuda" else blocks):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        block_means.append((time.perf_counter() - start) / calls)
    took = torch.tensor([block_median(block_means)], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return took.item(), block_means


def timed_collectives(backend: str) -> tuple[str, ...]:
    """The collectives calibrate times at every size: the all-reduce (`intra_node_gbps`, `intra_latency_s`) and, on
    GPUs (nccl), the all-gather beside it as nccl-tests reports both. On a CPU (gloo) the all-reduce alone since
    round 25: no field reads the all-gather, and its sizes were about half of the collectives' time -- 6.9 of
    14.1 s of rank 0's wall in an 8-rank calibration (load 16), the collectives ~28 % of its CPU."""
    return ("all_reduce", "all_gather") if backend == "nccl" else ("all_reduce",)


# `intra_latency_s` on a CPU (round 22): short rounds of the smallest all-reduce between calibrate's other probes,
# the median over them and the collectives' own reading (`latency_of`). With 8 ranks on 2 cores a run of back-to-back
# calls reads the OS scheduler of that moment: within one calibration-long span (77 s, load 9-17) the median of 5
# blocks of 20 calls, taken 10 times, read 2.2-4.7 ms; between quiet calibrations minutes apart the one reading
# moved 2.68 -> 3.75 ms (the main job's planned step 0.229 -> 0.278 s, its measured median 0.265 -> 0.268: round 21,
# docs/results/bench_planner_mainjob.md). More blocks back to back (15, round 10) sample the same moment, so did
# not pay; rounds spread over the calibration's ~50 s sample the scheduler as the job's 70 s meet it.
LATENCY_ROUND_BLOCKS = 2  # blocks a round: their block_median (the mean of two) the round's reading, the slowest rank's
LATENCY_ROUND_CALLS = 20  # calls a block, as the collectives' blocks (what the planner's level was checked on): where
#                          a call's time has a long tail a short block's mean reads lower (rounds of 10-call blocks
#                          after 5 calls read 0.23-1.6x, median 0.71x, their calibration's 20-call reading; load 13-53)
LATENCY_ROUND_WARMUP = 10  # untimed calls first: the ranks come from a barrier (the first 10-call block read 1.3x)


class LatencyRounds:
    """The rounds of the smallest all-reduce one rank times between calibrate's probes (every rank calls `take` at
    the same points: each round is collective). `seconds`: each round's reading, in time order; empty where none
    ran (one rank, or a GPU: NCCL's latency does not move with a scheduler, one reading stays)."""

    def __init__(self, size: int, world: int, device: torch.device):
        self.size, self.world, self.device = size, world, device
        self.on = world > 1 and device.type == "cpu"
        self.seconds: list[float] = []

    def take(self) -> None:
        """One round: LATENCY_ROUND_BLOCKS blocks of LATENCY_ROUND_CALLS all-reduces of `size` bytes."""
        if self.on:
            seconds, _ = _collective_seconds("all_reduce", self.size, self.world, self.device,
                                             blocks=LATENCY_ROUND_BLOCKS, calls=LATENCY_ROUND_CALLS,
                                             warmup=LATENCY_ROUND_WARMUP)
            self.seconds.append(seconds)


def latency_of(smallest: float, rounds: list[float]) -> float:
    """`intra_latency_s`: the median of the rounds' readings and the collectives' own (`smallest`, the smallest
    all-reduce's block_median) -- a median of medians, so one round that met a stall (or the one quiet moment)
    moves it by at most one rank of the order; the collectives' reading alone where no rounds ran."""
    return statistics.median([smallest, *rounds])


SKEW_BURSTS = (96, 384, 2048)  # k of the 512 x k x 512 matmul bursts: ~0.5, 2 and 10 ms on a ~100 GFLOP/s core


def skew_probe(world: int, bursts: tuple[int, ...] = SKEW_BURSTS, calls: int = 20) -> list[tuple[float, float]]:
    """gloo, a core per rank: [(compute seconds, seconds of an 8-byte all-reduce after it)], after each burst -- a
    512 x k x 512 matmul (at the largest k its 4.2 MiB of operands exceed a core's L2, like a layer's GEMMs) --
    `calls` rounds of burst then call, as ranks meet at the TP collectives between a layer's GEMMs. Both are means over the calls and over the ranks (all-reduced): the mean wait over
    ranks is what the later rank costs the step (the earlier waits |skew| inside the call, the later 0: E max(c0,
    c1) = c + E|c0 - c1| / 2), plus waking a rank blocked in the call."""
    t = torch.ones(2)  # 8 bytes
    out = []
    for k in bursts:
        a, b = torch.randn(512, k), torch.randn(k, 512)
        burst = (lambda: a @ b)
        burst()
        dist.all_reduce(t)
        dist.barrier()
        compute = waited = 0.0
        for _ in range(calls):
            start = time.perf_counter()
            burst()
            mid = time.perf_counter()
            dist.all_reduce(t)
            compute, waited = compute + mid - start, waited + time.perf_counter() - mid
        sums = torch.tensor([compute / calls, waited / calls], dtype=torch.float64)
        dist.all_reduce(sums)
        out.append((sums[0].item() / world, sums[1].item() / world))
    return out


def measures_skew(world: int, backend: str) -> bool:
    """Does calibrate run skew_probe? gloo with a core per rank (2 to cpu_count ranks). With more ranks than cores
    the waits are the OS scheduler's, which the shared-compute bound prices (the fields stay 0, the main job's 8
    ranks on 2 cores plan as before); NCCL's collectives run on their own stream."""
    return backend == "gloo" and 1 < world <= (os.cpu_count() or 1)


def fit_skew(points: list[tuple[float, float]], back_to_back: float) -> dict[str, float]:
    """Hardware.collective_skew_s and collective_skew_per_s from skew_probe's points: the wait after c seconds of
    compute, each burst's call less `back_to_back` (the smallest all-reduce's time back to back, what the planner
    charges a call), fitted to wait(c) = skew_s + per_s x c by least squares over the bursts. Noise that gives a
    negative slope keeps the mean wait with no slope; a negative intercept refits through the origin; no wait at
    all gives 0, 0."""
    rows = [(c, max(0.0, call - back_to_back)) for c, call in points]
    n = len(rows)
    mc, mw = sum(c for c, _ in rows) / n, sum(w for _, w in rows) / n
    var = sum((c - mc) ** 2 for c, _ in rows)
    slope = sum((c - mc) * (w - mw) for c, w in rows) / var if var > 0 else 0.0
    if slope <= 0:
        return {"collective_skew_s": mw, "collective_skew_per_s": 0.0}
    if mw - slope * mc < 0:  # var > 0: some c > 0
        slope = sum(c * w for c, w in rows) / sum(c * c for c, _ in rows)
        return {"collective_skew_s": 0.0, "collective_skew_per_s": slope}
    return {"collective_skew_s": mw - slope * mc, "collective_skew_per_s": slope}


CPU_COMM_SIZES = (8, 2**16, 2**20)  # bytes: a call's own cost, a main-job-sized activation, per byte


@dataclass
class ThreadTimedGroup(Group):
    """The runtime's counted `Group` (ledger, op trail: Group.all_reduce runs unchanged) that also sums the calling
    thread's CPU seconds inside its all-reduces -- what pair_comm_cpu charges a TP all-reduce. A Group of its own
    kind, built once, so no attribute of a live Group is swapped while the probe runs.

    Attributes:
        all_reduce_thread_s: time.thread_time() spent inside `all_reduce` since the last reset (set it to 0.0).
    """

    all_reduce_thread_s: float = 0.0

    @classmethod
    def of(cls, group: Group) -> "ThreadTimedGroup":
        """`group`'s process group, ranks and ledger, timed."""
        return cls(name=group.name, ranks=group.ranks, pg=group.pg, ledger=group.ledger)

    def all_reduce(self, t: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM, tag: str = "") -> torch.Tensor:
        t0 = time.thread_time()
        try:
            return super().all_reduce(t, op=op, tag=tag)
        finally:
            self.all_reduce_thread_s += time.thread_time() - t0


PAIR_BLOCKS = 1  # runs of each pair_comm_cpu measurement, their median kept (5 tried in round 10: COLLECTIVE_BLOCKS)


@dataclass
class Pair:
    """A rank's pair for the gloo CPU probes: ranks (0, 1), (2, 3), ... each a tp-2 `hybrid.comm.Group`, timed
    (ThreadTimedGroup), counted on `ledger`; `peer` the other rank of the pair (0 or 1 within it). Made once, at the
    start of a calibration (every rank creates every group: new_group is collective), and shared by pair_comm_cpu
    and PairRounds."""

    group: "ThreadTimedGroup"
    ledger: CommLedger
    peer: int
    rank: int
    layer: tuple | None = None  # (the TP probe layer: GPT2Block at TP_PROBE_SHAPE on `group`, input, gradient)
    burst: tuple | None = None  # the late side's matmul operands (message_call)

    @classmethod
    def make(cls, rank: int, world: int) -> "Pair | None":
        """This rank's pair, or None on the odd rank out (it still creates every group)."""
        ledger = CommLedger()
        groups = [Group.create("tp", [2 * i, 2 * i + 1], ledger) for i in range(world // 2)]
        if rank >= 2 * (world // 2):
            return None
        return cls(ThreadTimedGroup.of(groups[rank // 2]), ledger, 1 - rank % 2, rank)

    def per_call(self, run, count, blocks: int = 1) -> float:
        """CPU seconds per call of run()'s collectives: inside them on this thread (the group's all-reduces, and
        what run() returns), and gloo's threads -- the block_median of `blocks` runs (one run is one draw of the
        scheduler: a call's CPU grows with how long gloo polls for a peer that is not on a core)."""
        per_call = []
        for _ in range(blocks):
            self.group.all_reduce_thread_s = 0.0
            self.ledger.reset()
            start, start_main = CPU_CLOCK(), time.thread_time()
            extra = run()
            others = (CPU_CLOCK() - start) - (time.thread_time() - start_main)
            per_call.append((self.group.all_reduce_thread_s + (extra or 0.0) + others) / max(1, count(self.ledger)))
        return block_median(per_call)

    def layer_call(self, blocks: int = 1) -> tuple[int, float]:
        """(bytes of one TP all-reduce, CPU seconds per call): the TP probe layer's forward + backward 6 times."""
        from hybrid.tp import TPContext
        from models.gpt2 import GPT2Block
        b, s_, h, _ = TP_PROBE_SHAPE
        if self.layer is None:  # made at the first use, one warm-up pass
            self.layer = (GPT2Block(layer_config(TP_PROBE_SHAPE), TPContext(self.group)),
                          torch.randn(b, s_, h, requires_grad=True), torch.randn(b, s_, h))
            self.layer[0](self.layer[1]).backward(self.layer[2])
        block, x, grad = self.layer

        def layers() -> None:
            for _ in range(6):
                block(x).backward(grad)
        return b * s_ * h * 4, self.per_call(layers, lambda lg: lg.calls("all_reduce", "tp"), blocks)

    def message_call(self, size: int, blocks: int = 1, rounds: int = 12) -> float:
        """CPU seconds per pipeline message of `size` bytes: `rounds` round trips (each rank one send and one
        receive), one side late each (a matmul burst with operands beyond a core's L2 first, not counted)."""
        if self.burst is None:
            self.burst = torch.randn(512, 2048), torch.randn(2048, 512)
        a, w = self.burst
        t = torch.ones(max(1, size // 4))
        buf = torch.empty_like(t)

        def messages() -> float:
            inside = 0.0
            for i in range(rounds):
                if i % 2 == self.rank % 2:
                    a @ w
                t0 = time.thread_time()
                order = 1 if self.rank % 2 == 0 else -1  # the even rank sends first, the odd one receives first
                for sends, recvs in (([(t, self.peer)], []), ([], [(buf, self.peer)]))[::order]:
                    self.group.batch_p2p(sends, recvs)
                inside += time.thread_time() - t0
            return inside
        return self.per_call(messages, lambda lg: lg.calls("send", "tp") + lg.calls("recv", "tp"), blocks)


def pair_comm_cpu(rank: int, world: int, sizes: tuple[int, ...] = CPU_COMM_SIZES,
                  blocks: int = PAIR_BLOCKS, pair: Pair | None = None) -> dict | None:
    """gloo: the CPU seconds a rank's process burns per collective call and per pipeline message (a send or a
    receive), every pair of ranks (0, 1), (2, 3), ... at it at once -- the groups a TP 2 / DP 2 / pipeline
    neighbour pair runs on, sharing the cores as in training; through the runtime's `hybrid.comm.Group` (ledger,
    op trail). Counted: the calling thread's CPU inside the calls and gloo's threads' throughout
    (time.thread_time against process_time), nothing else:

    * "tp_layer": a small layer (TP_PROBE_SHAPE) at tp 2 on the pair, forward + backward, a TP all-reduce
      as training meets it (its autograd wrapper, a lock-step peer that may be descheduled) -> per call;
    * "send_recv": messages of each size, each round one side arriving late (a matmul burst with operands beyond
      a core's L2 first, not counted), as a pipeline message meets a receiver waiting in its bubble.

    With more ranks than cores a collective's wall time is mostly waiting for a core, but its CPU seconds are
    work the cores must do: the shared-compute bound adds them (time.py). Each number is the median of `blocks`
    runs (block_median): one run's collective_cpu_s read 0.33-0.81 ms over four calibrations (round 10); on a
    calibration PairRounds adds readings of the first two taken between the other probes. `pair`: this rank's
    (Pair.make; made here when not given). None on the odd rank out."""
    if pair is None:
        pair = Pair.make(rank, world)
    if pair is None:  # the odd rank out only waits
        dist.barrier()
        return None
    out: dict = {"tp_layer": [pair.layer_call(blocks)], "send_recv": []}
    out["tp_pass"] = tp_pass_cpu(pair.group)
    out["edge_pass"] = edge_pass_cpu(pair.group)
    out["executor"] = executor_action_cpu(pair.group)
    for size in sizes:
        out["send_recv"].append((size, pair.message_call(size, blocks)))
    dist.barrier()
    return out


# A pair round at every PAIR_ROUND_EVERY-th of the latency's points (round 25; every point until then): 5 rounds on
# a calibration's 10 points. A pair round is the dearest repeat calibrate makes -- ~0.3 s of CPU a rank (the TP probe
# layer's 6 passes and 12 message round trips with their matmul bursts), a third of README's 4-rank calibration's CPU
# with 10 -- and what it buys is the median's place: on round 24's three quiet 8-rank profiles the fields from the
# even or the odd 5 of the 10 rounds moved the main job's plan -1.8..+2.5 % from all 10's, where the plan spread
# 9.7 % between those calibrations (the latency and the TP pass overheads: docs/results/bench_planner_mainjob.md,
# "Twenty-fifth round"). The latency's rounds (~0.03 s a rank each) stay at every point.
PAIR_ROUND_EVERY = 2


class PairRounds:
    """Readings of the pair probe's two gloo CPU costs that set the plan -- a TP all-reduce's (Pair.layer_call)
    and the smallest pipeline message's (Pair.message_call) -- taken between calibrate's probes, as LatencyRounds
    takes the latency's (every rank calls `take` at the same points; each pair times its own), at the first of
    every `every` points (PAIR_ROUND_EVERY). `readings`: this rank's (collective s a call, message s a call) per
    round, in time order; empty where none ran (one rank, a GPU, the odd rank out). Round 23's quiet profiles read
    collective_cpu_s 250-401 us and p2p_cpu_s 553-1060 us, one reading each at one moment
    (docs/results/bench_planner_mainjob.md, "Twenty-fourth round")."""

    def __init__(self, pair: Pair | None, on: bool, every: int = PAIR_ROUND_EVERY):
        self.pair, self.on, self.every = pair, on and pair is not None, every
        self.points = 0  # take() calls so far: the same count on every rank, so every pair's rounds are at once
        self.readings: list[tuple[float, float]] = []

    def take(self) -> None:
        point, self.points = self.points, self.points + 1
        if self.on and point % self.every == 0:
            self.readings.append((self.pair.layer_call()[1], self.pair.message_call(CPU_COMM_SIZES[0])))


TP_PASS_CALLS = 20  # passes of each layer a block (round 11: a 1-token tp-2 pass 2.4-2.9 ms CPU, 36 ms wall at load 15)
TP_PASS_BLOCKS = 2  # blocks of each, alternated (tp 2, unsharded, tp 2, unsharded): drift falls on both alike


def tp_pass_cpu(group: "ThreadTimedGroup", calls: int = TP_PASS_CALLS, blocks: int = TP_PASS_BLOCKS,
                shape: tuple[int, int, int, int] = PASS_SHAPE) -> dict[str, list[float]]:
    """The calling thread's CPU seconds of one layer's (forward, backward) pass outside its TP all-reduces: the
    per-pass layer `shape` sharded over `group` (tp 2) and unsharded, on this rank at the same moment. One token:
    the GEMMs and bytes sharding halves are microseconds, so the difference is what a TP pass costs as a pass --
    round 11 (docs/results/bench_planner_mainjob.md): 2.4 against 0.69 ms at tp 2, flat from 1 to 1024 tokens
    within the noise, of which ~0.6 ms four bare all-reduces beside an unsharded pass also cost (first touches
    after a blocking wait) and the rest the TP layer's own autograd Functions. Blocks of `calls` passes, not
    alternated passes: a pass right after a tp-2 pass would pay its last all-reduce's cold start."""
    from hybrid.tp import TPContext
    from models.gpt2 import GPT2Block
    b, s_, h, _ = shape
    x, grad = torch.randn(b, s_, h, requires_grad=True), torch.randn(b, s_, h)
    models = {"tp2": GPT2Block(layer_config(shape), TPContext(group)),
              "tp1": GPT2Block(layer_config(shape), TPContext(Group.solo("tp")))}
    return _pass_cpu(group, {k: (lambda m=m: m(x), grad) for k, m in models.items()}, calls, blocks)


def _pass_cpu(group: "ThreadTimedGroup", passes: dict, calls: int, blocks: int) -> dict[str, list[float]]:
    """Per name in `passes` ({name: (forward() -> output, output's gradient or None for a scalar)}): the calling
    thread's CPU seconds of one (forward, backward) outside `group`'s all-reduces, the mean over `blocks` rounds of
    `calls` passes each, the names alternated by block (drift falls on every one alike); one warm-up pass each."""
    for forward, grad in passes.values():
        forward().backward(grad)  # warm-up
    sums = {k: [0.0, 0.0] for k in passes}
    for _ in range(blocks):
        for name, (forward, grad) in passes.items():
            fwd, bwd = sums[name]
            for _ in range(calls):
                group.all_reduce_thread_s, t0 = 0.0, time.thread_time()
                y = forward()
                t1, inside = time.thread_time(), group.all_reduce_thread_s
                y.backward(grad)
                t2 = time.thread_time()
                fwd += t1 - t0 - inside
                bwd += t2 - t1 - (group.all_reduce_thread_s - inside)
            sums[name] = [fwd, bwd]
    return {k: [v / (calls * blocks) for v in vs] for k, vs in sums.items()}


EDGES = ("embedding", "head")  # the first stage's token + position embedding; the last's final norm, LM head, loss


def edge_pass_cpu(group: "ThreadTimedGroup", calls: int = TP_PASS_CALLS, blocks: int = TP_PASS_BLOCKS,
                  shape: tuple[int, int, int, int] = PASS_SHAPE) -> dict[str, list[float]]:
    """The stage edges' passes as tp_pass_cpu times the layer's: the runtime's own GPT-2 stage with no layers,
    first only (VocabParallelEmbedding -- its exit all-reduce at tp 2 -- plus the position embedding) and last only
    (final LayerNorm, the tied vocab-parallel LM head, the vocab-parallel cross-entropy: at tp 2 its autograd
    Function and three all-reduces, unsharded torch's fused F.cross_entropy), at tp 2 over `group` and unsharded,
    one token of `shape`'s vocabulary (256) and width. Keys "<edge>_tp2" / "<edge>_tp1" (EDGES): (forward,
    backward) CPU seconds outside the all-reduces. Round 12 (docs/results/bench_planner_mainjob.md): the main job's
    head and loss at tp 2 took 4.2x the CPU of its planned kernels, the embedding 4.6x: fixed costs a pass, as the
    layer's (~15 small ops and three blocking all-reduces in the loss where unsharded runs one fused kernel)."""
    from hybrid.tp import TPContext
    from models.common import StageLayout
    from models.gpt2 import GPT2
    b, s_, h, _ = shape
    cfg = layer_config(shape)
    ids = torch.randint(0, cfg.vocab_size, (b, s_))
    x, grad = torch.randn(b, s_, h, requires_grad=True), torch.randn(b, s_, h)
    passes = {}
    for tp, ctx in (("tp2", TPContext(group)), ("tp1", TPContext(Group.solo("tp")))):
        emb = GPT2(cfg, ctx, StageLayout((), first=True, last=False))
        head = GPT2(cfg, ctx, StageLayout((), first=False, last=True))
        passes[f"embedding_{tp}"] = (lambda m=emb: m(ids), grad)
        passes[f"head_{tp}"] = (lambda m=head: m(x, ids), None)
    return _pass_cpu(group, passes, calls, blocks)


EXECUTOR_MICROBATCHES = 4  # the main job's micro-batches a step (global 16 / (micro-batch 2 x dp 2)), 1F1B
EXECUTOR_STEPS = 10  # steps timed after one untimed warm-up step
EXECUTOR_BLOCKS = 3  # runs of EXECUTOR_STEPS, their median kept (block_median: one run is one scheduler draw)


class _GlueStage(torch.nn.Module):
    """A pipeline stage that computes next to nothing, so what an action costs beyond it is the executor's own:
    the first stage scales the token ids (as floats, broadcast to the stage's width) by one parameter, a later
    one its input; the last takes the mean as its loss. Its calls' CPU (this thread) is summed in `cpu_s`."""

    def __init__(self, first: bool, last: bool, width: int):
        from models.common import StageLayout
        super().__init__()
        self.stage, self.width = StageLayout((), first=first, last=last), width
        self.w = torch.nn.Parameter(torch.ones(()))
        self.cpu_s = 0.0

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        t0 = time.thread_time()
        h = x.float().unsqueeze(-1).expand(*x.shape, self.width) if self.stage.first else x
        y = h * self.w
        out = y.mean() if self.stage.last else y
        self.cpu_s += time.thread_time() - t0
        return out


def _timed_executor():
    """PipelineExecutor with its compute actions, its receives' waits, its message runs and the autograd calls
    timed on the calling thread's CPU clock (sums in `.cpu`): the executor's code runs unchanged."""
    from hybrid.pipeline import executor as ex

    class Timed(ex.PipelineExecutor):
        cpu: dict

        def _timed(self, key: str, fn, *args):
            t0 = time.thread_time()
            try:
                return fn(*args)
            finally:
                self.cpu[key] += time.thread_time() - t0

        def _take(self, a, op, st):  # a receive's wait: message CPU (p2p_cpu_s), not the executor's
            return self._timed("take", super()._take, a, op, st)

        def _forward(self, a, batches, st):
            self.cpu["forward_actions"] += 1
            return self._timed("forward", super()._forward, a, batches, st)

        def _backward_step(self, a, batches, st):
            self.cpu["backward_actions"] += 1
            return self._timed("backward", super()._backward_step, a, batches, st)

        def _communicate(self, run, st):  # a run of messages: p2p_cpu_s prices it
            self.cpu["runs"] += 1
            return self._timed("messages", super()._communicate, run, st)

        def _finish_sends(self, st):
            return self._timed("messages", super()._finish_sends, st)
    return Timed


def executor_action_cpu(group: Group, m: int = EXECUTOR_MICROBATCHES, steps: int = EXECUTOR_STEPS,
                        blocks: int = EXECUTOR_BLOCKS, width: int = PASS_SHAPE[2]) -> dict[str, float]:
    """The pipeline executor's own CPU per compute action (hybrid/pipeline/executor.py: the schedule walk, the
    op trail's phase switch, taking the input, requires_grad_, the loss's 1/m and its running sum, the input
    gradient's hand-over, the held-bytes bookkeeping), the pair as a pp-2 pipeline running 1F1B over `m`
    one-token micro-batches of `width` -- the glue round 12's `--account` found unpriced in the main job (~16 CPU ms
    a step, "executor forward / backward"). Per action: the calling thread's CPU in the action less the stage's
    call (forward) or the autograd call (backward) and less the receive's wait; the step's remaining loop CPU
    (outside every action and message run) spread over its runs. Keys "forward" / "backward": seconds an action,
    the block_median of `blocks` runs of `steps` steps (one warm-up step first)."""
    from hybrid.pipeline import executor as ex
    from hybrid.pipeline.schedules import ScheduleKind, build_schedule
    rank = group.rank
    chunk = _GlueStage(first=rank == 0, last=rank == group.size - 1, width=width)
    schedule = build_schedule(ScheduleKind.ONE_F_ONE_B, group.size, m)[rank]
    runner = _timed_executor()([chunk], schedule, group, ex.StageIO((1, 1, width)), torch.device("cpu"))
    batches = [(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long)) for _ in range(m)]
    autograd = {"s": 0.0}
    backward0 = ex._backward

    def timed_backward(output, grad):  # the autograd engine's call: the model's backward, not the executor's
        t0 = time.thread_time()
        backward0(output, grad)
        autograd["s"] += time.thread_time() - t0
    per = {"forward": [], "backward": []}
    ex._backward = timed_backward  # restored below; the executor looks it up at each call
    try:
        runner.cpu = dict.fromkeys(("take", "forward", "backward", "messages", "forward_actions",
                                    "backward_actions", "runs"), 0.0)
        runner.forward_backward(batches)  # warm-up
        for _ in range(blocks):
            runner.cpu = dict.fromkeys(runner.cpu, 0.0)
            chunk.cpu_s = autograd["s"] = 0.0
            t0 = time.thread_time()
            for _ in range(steps):
                runner.forward_backward(batches)
            total = time.thread_time() - t0
            c = runner.cpu
            actions = c["forward_actions"] + c["backward_actions"]
            loop = (total - c["forward"] - c["backward"] - c["messages"]) / (actions + c["runs"])
            # a take is a forward's (the activation) or a backward's (the gradient): split by the actions
            # that take one (every forward but the first stage's, every backward but the last's)
            takes_f = c["forward_actions"] if rank > 0 else 0.0
            takes_b = c["backward_actions"] if rank < group.size - 1 else 0.0
            take = c["take"] / max(1.0, takes_f + takes_b)
            per["forward"].append((c["forward"] - chunk.cpu_s - take * takes_f) / c["forward_actions"] + loop)
            per["backward"].append((c["backward"] - autograd["s"] - take * takes_b) / c["backward_actions"] + loop)
    finally:
        ex._backward = backward0
    return {k: block_median(v) for k, v in per.items()}


def fit_executor(per_rank: list[dict | None]) -> dict[str, float]:
    """Hardware's executor_{forward,backward}_cpu_s from executor_action_cpu (median over ranks; clamped at 0)."""
    rows = [r["executor"] for r in per_rank if r and "executor" in r]
    if not rows:
        return {}
    return {f"executor_{k}_cpu_s": max(0.0, statistics.median(r[k] for r in rows)) for k in ("forward", "backward")}


OPTIMIZER_PROBE_LAYERS = (1, 4)  # GPT-2 stages of 1 and 4 layers: 20 and 68 parameter tensors
# Their width: 8 (2 heads), so the bytes are ~nothing (2.9k and 5.4k parameters) and the line through the two sizes
# is the Python per tensor and per step alone. At h 64 (66k and 217k parameters) the fit had to take the bytes off
# at the profile's memory-bound rate first, which on this VM (3.6 GB/s: the layer's GELU / softmax mix) priced the
# larger stage's bytes above its whole measured step -- fused AdamW streams faster -- and clamped the slope at 0.
OPTIMIZER_PROBE_WIDTH = 8
OPTIMIZER_STEPS = 8  # optimizer steps a block (20 until round 24: on the job's mesh a step is ~20 collectives)
OPTIMIZER_BLOCKS = 3  # blocks per stage size, the sizes alternated; the median block kept (block_median)


def _probe_stage(layers: int, width: int = OPTIMIZER_PROBE_WIDTH, mesh=None):
    """The runtime's GPT-2 stage of `layers` layers at `width` (2 heads): on `mesh` (hybrid.mesh.Mesh) this rank's
    -- its TP shard, the first stage's embedding or the last's head and loss (tied to the first's at pp 2) --
    else one stage holding everything, one rank."""
    from hybrid.tp import TPContext
    from models.common import StageLayout
    from models.gpt2 import GPT2
    cfg = dataclasses.replace(layer_config((1, PASS_SHAPE[1], width, 2)), num_layers=layers)
    if mesh is None:
        return GPT2(cfg, TPContext(Group.solo("tp")))
    return GPT2(cfg, TPContext(mesh.tp), StageLayout(tuple(range(layers)), mesh.is_first_stage, mesh.is_last_stage))


def job_mesh_dims(world: int):
    """The parallel sizes the optimizer probe runs at with `world` ranks: the main job's (README: tp 2 x pp 2 x dp
    2 on 8 ranks) where the world factors so -- tp 2, pp 2 and the rest data-parallel -- else as much of it as
    divides (tp 2, dp the rest; one rank: nothing). What finish_backward and step do around their collectives
    (the TP partial-gradient and tied-embedding syncs, the DP buckets, clipping's norm over every rank) only runs
    on a mesh of more than one rank."""
    from hybrid.mesh import ParallelDims
    tp = 2 if world % 2 == 0 else 1
    pp = 2 if world % 4 == 0 else 1
    return ParallelDims.from_world(world, tp=tp, pp=pp)


@contextmanager
def outside_comm_waits(clock=CPU_CLOCK):
    """A clock of `clock`'s seconds outside the op trail's blocking waits (hybrid/trail.py: a collective's wait is
    "comm", a pipeline message's "p2p"): what the main job's `--account` books in a phase that calls collectives --
    the waits (and gloo's CPU in them) go to comm, which the planner prices per call from the pair probe
    (collective_cpu_s; time.comm_cpu_seconds). Yields the clock; the trail's own switch is restored after."""
    from hybrid.trail import TRAIL
    waits = {"s": 0.0, "since": None}
    switch0 = TRAIL._switch  # the bound method: an attribute of this instance only, deleted below

    def switch(phase: str) -> str:
        if waits["since"] is not None:
            waits["s"] += clock() - waits["since"]
        waits["since"] = clock() if phase in ("comm", "p2p") else None
        return switch0(phase)
    TRAIL._switch = switch
    try:
        yield lambda: clock() - waits["s"]
    finally:
        del TRAIL._switch


class _ProbeRunner:
    """train_step's forward_backward for the optimizer probe: the stage's forward and backward of one micro-batch
    (a loss on the last stage, else its activation's gradient of ones), its seconds on `clock` summed in `seconds`
    (the model's: left out of the optimizer's). Returns the loss share as the pipeline executor does (0 off the
    last stage)."""

    def __init__(self, model, inputs, clock):
        self.model, self.inputs, self.clock, self.seconds = model, inputs, clock, 0.0

    def forward_backward(self, batches) -> torch.Tensor:
        t0 = self.clock()
        out = self.model(*self.inputs)
        out.backward(None if out.dim() == 0 else torch.ones_like(out))
        self.seconds += self.clock() - t0
        return out.detach() if out.dim() == 0 else torch.zeros(())


def optimizer_step_cpu(layers: tuple[int, ...] = OPTIMIZER_PROBE_LAYERS, steps: int = OPTIMIZER_STEPS,
                       blocks: int = OPTIMIZER_BLOCKS, clock=CPU_CLOCK, dims=None) -> list[tuple[int, int, float]]:
    """The train step's optimizer work as train.py runs it, on this rank: hybrid.train_step.train_step itself with
    the runtime's ZeroOptimizer at train.py's defaults (stage 0, fp32, clip 1.0, torch's fused AdamW) behind the
    default NaN guard (hybrid/fault: its finite check and flag all-reduce before the step) over a one-token GPT-2
    stage of each size in `layers` (OPTIMIZER_PROBE_WIDTH wide: next to no bytes) -- zero_grad, begin_step,
    finish_backward (the gradient buckets, the TP partial-gradient and tied-embedding syncs, the DP reductions),
    the loss's reduction, the guarded step (master gradients, the clip norm and its all-reduce, AdamW, the
    write-back), timed on `clock` less the stage's forward and backward (_ProbeRunner: the model's) and outside
    the collectives' waits (outside_comm_waits: their CPU is the pair probe's). `dims` (hybrid.mesh.ParallelDims;
    collective: every rank at once) runs it on that mesh, as the job: round 24's --account read the main job's
    optimizer at 29-30 ms of CPU a step (all ranks) against 18-19 planned from a one-rank mesh, where every sync
    is a no-op; None: one rank. Per size: (parameter tensors, parameters, CPU seconds a step), the block_median
    of `blocks` blocks of `steps` steps, the sizes alternated by block."""
    from hybrid.fault.nan_guard import GuardedOptimizer, GuardedRunner, NanGuard
    from hybrid.mesh import Mesh
    from hybrid.train_step import OptimizerConfig, train_step
    from hybrid.zero.config import ZeroConfig
    from hybrid.zero.engine import ZeroOptimizer
    mesh = Mesh.single() if dims is None or dims.world == 1 else Mesh.build(dims, torch.device("cpu"))
    runs = []
    with outside_comm_waits(clock) as timed:
        for n in layers:
            model = _probe_stage(n, mesh=mesh if dims is not None else None)
            ids = torch.zeros(1, PASS_SHAPE[1], dtype=torch.long)  # a later stage's input: the activation
            x = ids if model.stage.first else torch.randn(1, PASS_SHAPE[1], OPTIMIZER_PROBE_WIDTH)
            runner = GuardedRunner(_ProbeRunner(model, (x, ids), timed))
            opt = GuardedOptimizer(ZeroOptimizer(model, mesh, ZeroConfig(), OptimizerConfig()),
                                   NanGuard(mesh, model, max_skipped=10), runner)
            runs.append((model, runner, opt, []))

        def step(model, runner, opt) -> float:
            model0, t0 = runner.inner.seconds, timed()
            train_step(model, [runner.inner.inputs], opt, mesh, runner=runner)  # one micro-batch: begin_step(1)
            return timed() - t0 - (runner.inner.seconds - model0)
        for model, runner, opt, _ in runs:
            step(model, runner, opt)  # warm-up: the optimizer's state is made in its first step
        for _ in range(blocks):
            for model, runner, opt, means in runs:
                means.append(sum(step(model, runner, opt) for _ in range(steps)) / steps)
    return [(len(list(model.parameters())), sum(p.numel() for p in model.parameters()), block_median(means))
            for model, _, _, means in runs]


def fit_optimizer_step(points: list[tuple[int, int, float]], hw: Hardware) -> dict[str, float]:
    """Hardware's optimizer_tensor_cpu_s and optimizer_step_cpu_s from optimizer_step_cpu's sizes: each size's
    CPU less what the planner already prices for its step on `hw` (its bytes at the memory-bound rate:
    time.optimizer_bytes_per_param, fp32), then the line through the smallest and the largest in the parameter
    tensors: slope per tensor, intercept per step; each clamped at 0."""
    if len(points) < 2:
        return {}
    from hybrid.planner.time import optimizer_bytes_per_param
    per_param = optimizer_bytes_per_param(_probe_workload(PASS_SHAPE, CPU_PROBE))  # fp32: clip and AdamW, 40 B
    rest = sorted((k, c - per_param * n / hw.elementwise_bytes_per_s) for k, n, c in points)
    (k0, c0), (k1, c1) = rest[0], rest[-1]
    slope = max(0.0, (c1 - c0) / (k1 - k0)) if k1 > k0 else 0.0
    return {"optimizer_tensor_cpu_s": slope, "optimizer_step_cpu_s": max(0.0, c0 - slope * k0)}


def fit_tp_pass(per_rank: list[dict | None], hw: Hardware, probe: LayerProbe = CPU_PROBE) -> dict[str, float]:
    """Hardware's tp_layer_{forward,backward}_overhead_s from tp_pass_cpu's measurements (median over ranks): per
    pass, the tp-2 layer's CPU less the unsharded one's (measured together: the same clock, load and sharing),
    less what the planner already makes of that difference on `hw` (the halved GEMMs and bytes: microseconds at
    one token). 0 where sharding cost nothing (clamped, the raw difference is in the profile's record)."""
    rows = [r["tp_pass"] for r in per_rank if r and "tp_pass" in r]
    if not rows:
        return {}
    plain = dataclasses.replace(hw, tp_layer_forward_overhead_s=0.0, tp_layer_backward_overhead_s=0.0)
    planned = [a - b for a, b in zip(planned_pass_seconds(plain, probe.pass_shape, 2, probe),
                                     planned_pass_seconds(plain, probe.pass_shape, 1, probe))]
    measured = [statistics.median(r["tp2"][i] - r["tp1"][i] for r in rows) for i in (0, 1)]
    return {"tp_layer_forward_overhead_s": max(0.0, measured[0] - planned[0]),
            "tp_layer_backward_overhead_s": max(0.0, measured[1] - planned[1])}


EDGE_FIELDS = {"embedding": ("tp_embedding_forward_overhead_s", "tp_embedding_backward_overhead_s"),
               "head": ("tp_head_forward_overhead_s", "tp_head_backward_overhead_s")}
EDGE_FIXED_FIELDS = {edge: tuple(f"{edge}_{d}_overhead_s" for d in ("forward", "backward")) for edge in EDGES}


def planned_edge_seconds(hw: Hardware, shape: tuple[int, int, int, int], tp: int,
                         probe: LayerProbe = CPU_PROBE) -> dict[str, tuple[float, float]]:
    """The planner's (forward, backward) seconds of the stage edges (EDGES) for one micro-batch of `shape` at
    tensor-parallel size `tp`, their TP collectives not included (time._edge_cost)."""
    from hybrid.planner.layout import Cluster, Layout
    from hybrid.planner.time import _context, _edge_cost
    ctx = _context(_probe_workload(shape, probe), Cluster(gpus=tp, hw=hw), Layout(tp=tp, micro_batch=shape[0]))
    return {edge: (c.forward.total, c.backward.total)
            for edge, c in (("embedding", _edge_cost(ctx, True, False)), ("head", _edge_cost(ctx, False, True)))}


def fit_edge_pass(per_rank: list[dict | None], hw: Hardware, probe: LayerProbe = CPU_PROBE) -> dict[str, float]:
    """Hardware's stage-edge fixed costs from edge_pass_cpu's measurements (median over ranks), per pass, clamped
    at 0 (the raw medians are in the profile):

    * {embedding,head}_{forward,backward}_overhead_s (round 25): the unsharded edge's CPU less the planner's
      kernels for it on `hw` -- its fixed cost, as layer_*_overhead_s is a layer's. At one token the kernels plan
      ~0 where the pass read 0.12-0.16 ms (round 24: calib24b), a cost the plan missed at every tp (the tp fields
      below are differences, so it cancelled out of them); the main job runs 16 passes of each edge a step;
    * tp_{embedding,head}_{forward,backward}_overhead_s: as fit_tp_pass does the layer's, the tp-2 edge's CPU
      less the unsharded one's, less what the planner already makes of that difference on `hw`."""
    rows = [r["edge_pass"] for r in per_rank if r and "edge_pass" in r]
    if not rows:
        return {}
    fields = [f for pairs in (EDGE_FIELDS, EDGE_FIXED_FIELDS) for pair in pairs.values() for f in pair]
    plain = dataclasses.replace(hw, **dict.fromkeys(fields, 0.0))
    tp2, tp1 = (planned_edge_seconds(plain, probe.pass_shape, tp, probe) for tp in (2, 1))
    out = {}
    for edge, names in EDGE_FIELDS.items():
        for i, name in enumerate(names):
            measured = statistics.median(r[f"{edge}_tp2"][i] - r[f"{edge}_tp1"][i] for r in rows)
            out[name] = max(0.0, measured - (tp2[edge][i] - tp1[edge][i]))
            alone = statistics.median(r[f"{edge}_tp1"][i] for r in rows)
            out[EDGE_FIXED_FIELDS[edge][i]] = max(0.0, alone - tp1[edge][i])
    return out


def fit_comm_cpu(per_rank: list[dict | None], rounds: bool = True) -> dict[str, float]:
    """Hardware's gloo CPU fields from pair_comm_cpu's measurements (median over ranks): `collective_cpu_s` the
    TP-2 probe layer's CPU per all-reduce, less its bytes at the per-byte cost; `p2p_cpu_s` the smallest
    message's, and `comm_cpu_s_per_byte` the messages' rise from the smallest to the largest over their bytes
    (the pair probe's own readings: one moment). With `rounds` (PairRounds' readings, where a rank has them) the
    layer's and the smallest message's per-call CPU is first, per rank, the median of the probe's reading and the
    rounds' -- a median of medians, as latency_of: one round that met a stall moves it one place in the order."""
    rows = [r for r in per_rank if r]

    def per_rank_call(r: dict, one: float, i: int) -> float:
        return statistics.median([one, *(x[i] for x in r.get("rounds", ()))]) if rounds else one
    msgs = [(size, statistics.median(r["send_recv"][i][1] for r in rows))
            for i, (size, _) in enumerate(rows[0]["send_recv"])]
    (s0, c0), (s1, c1) = msgs[0], msgs[-1]
    per_byte = max(0.0, (c1 - c0) / (s1 - s0)) if s1 > s0 else 0.0
    layer_size = rows[0]["tp_layer"][0][0]
    layer_call = statistics.median(per_rank_call(r, r["tp_layer"][0][1], 0) for r in rows)
    message = statistics.median(per_rank_call(r, r["send_recv"][0][1], 1) for r in rows)
    return {"collective_cpu_s": max(0.0, layer_call - per_byte * layer_size), "p2p_cpu_s": message,
            "comm_cpu_s_per_byte": per_byte}


def _measure_rank(rank: int, world: int, cfg: CalibrationConfig) -> dict:
    """Runs on every spawned rank: compute and memory rates with every rank busy at once and with rank 0
    alone (the others wait in a barrier), then the collectives."""
    device = torch.device(f"cuda:{rank}") if cfg.backend == "nccl" else torch.device("cpu")
    say = (lambda msg: print(f"calibrate: {msg}", flush=True)) if rank == 0 else (lambda msg: None)
    out: dict = {"matmul_flops": {}, "matmul_flops_alone": {}, "matmul_curve": {},
                 "collectives": {"all_reduce": [], "all_gather": []}}
    clock = solo_clock(device)  # the probes alone (the all-at-once rates are wall: they measure the sharing)
    latency = LatencyRounds(min(cfg.sizes), world, device)
    pair = Pair.make(rank, world) if world > 1 and cfg.backend == "gloo" else None  # collective: every rank
    pair_rounds = PairRounds(pair, on=world > 1 and cfg.backend == "gloo")

    def rounds() -> None:
        """A round of the smallest all-reduce (LatencyRounds) and of the pairs' gloo CPU (PairRounds): the rounds
        spread over the calibration, between its probes."""
        latency.take()
        pair_rounds.take()

    def alone(fn):
        """fn() on rank 0 while the others wait; then the rounds."""
        dist.barrier()
        value = fn() if rank == 0 else None
        dist.barrier()
        rounds()
        return value

    def occupied(fn):
        """fn() on every rank at once (the cores as busy as in training); then the rounds, as `alone`."""
        dist.barrier()
        value = fn()
        dist.barrier()
        rounds()
        return value

    for name, dtype in DTYPES.items():
        dist.barrier()
        together = matmul_flops(dtype, cfg.matmul_n, cfg.seconds, device)
        solo = alone(lambda: matmul_flops(dtype, cfg.matmul_n, cfg.seconds, device, clock))
        out["matmul_flops"][name], out["matmul_flops_alone"][name] = together, solo
        if together is None:
            say(f"matmul {name}: unsupported")
            continue
        if rank == 0:
            say(f"matmul {name} {cfg.matmul_n}^3: {together / 1e9:.1f} GFLOP/s per rank with {plural(world, 'rank')} at once, "
                f"{solo / 1e9:.1f} alone (rank 0)")
        curve = alone(lambda: [(n, matmul_flops(dtype, n, cfg.seconds / 2, device, clock))
                               for n in curve_sizes(cfg.matmul_n)])
        out["matmul_curve"][name] = curve
        if rank == 0:
            say(f"matmul {name} curve (rank 0 alone): " + ", ".join(f"{n}^3 {r / 1e9:.1f}" for n, r in curve)
                + " GFLOP/s")
    dist.barrier()
    out["copy_bytes_per_s"] = copy_bandwidth(cfg.copy_bytes, cfg.seconds, device)
    out["copy_bytes_per_s_alone"] = alone(lambda: copy_bandwidth(cfg.copy_bytes, cfg.seconds, device, clock))
    if rank == 0:
        say(f"memory copy {cfg.copy_bytes / 2**20:.0f} MiB: {out['copy_bytes_per_s'] / GB:.2f} GB/s per rank with "
            f"{world} at once, {out['copy_bytes_per_s_alone'] / GB:.2f} alone (rank 0)")
    probe = probe_for(device)
    shapes = probe.shapes + ((probe.pass_shape,) if probe.pass_shape else ())
    timed = [_layer_probe(shape, probe, cfg, device, clock, alone, occupied) for shape in shapes]
    out["layer_seconds"] = timed[:len(probe.shapes)]
    if probe.pass_shape:
        out["layer_pass_seconds"] = timed[-1]
    if rank == 0:
        who = ("rank 0 alone" if device.type == "cuda" or world == 1
               else f"rank 0's, {world} ranks at once: the profile fits the median rank's")
        for shape, (f, b) in zip(shapes, timed):
            say(f"one {probe.dtype} GPT-2 layer (b, s, h) = {shape[:3]}: forward {f * 1e3:.2f} ms, backward "
                f"{b * 1e3:.2f} ms ({who})")
    if cfg.backend == "gloo":  # a CPU: the optimizer's work beyond its bytes, every rank at once on its CPU clock
        dims = job_mesh_dims(world)  # the main job's mesh, as far as the world factors (round 24)
        out["optimizer_step"] = occupied(lambda: optimizer_step_cpu(clock=clock, dims=dims))
        out["optimizer_mesh"] = {"tp": dims.tp, "pp": dims.pp, "dp": dims.dp}
        if rank == 0:
            say("the optimizer step (ZeroOptimizer, stage 0, fp32) of one-token GPT-2 stages, CPU ms a step: "
                + ", ".join(f"{k} tensors {c * 1e3:.3f}" for k, _, c in out["optimizer_step"])
                + f" (rank 0's on a tp {dims.tp} x pp {dims.pp} x dp {dims.dp} mesh, outside the collectives' waits; "
                f"{world} ranks at once: the profile fits the median rank's)")
    for op in timed_collectives(cfg.backend) if world > 1 else ():  # one rank: nothing to time
        for size in cfg.sizes:
            seconds, blocks = _collective_seconds(op, size, world, device)
            algbw, busbw = bus_bandwidth(op, size, seconds, world)
            out["collectives"][op].append({"bytes": size, "seconds": seconds, "algbw_gbps": algbw / GB,
                                           "busbw_gbps": busbw / GB, "rank0_block_seconds": blocks})
            say(f"{op} {size:>10,d} B over {world} ranks: {seconds * 1e6:10.1f} us, algbw {algbw / GB:7.3f} GB/s, "
                f"busbw {busbw / GB:7.3f} GB/s")
    if measures_skew(world, cfg.backend):  # a core per rank: the ranks' skew after compute
        out["skew"] = skew_probe(world)
        if rank == 0:
            say("8-byte all-reduce after compute: " + ", ".join(f"{c * 1e3:.2f} ms -> {w * 1e6:.0f} us"
                                                                  for c, w in out["skew"]) + " (mean over ranks)")
    if world > 1 and cfg.backend == "gloo":
        out["comm_cpu"] = pair_comm_cpu(rank, world, pair=pair)
        rounds()
        if out["comm_cpu"] is not None:
            out["comm_cpu"]["rounds"] = pair_rounds.readings
        if rank == 0:
            say("gloo CPU seconds per call, pairs at once: " + "; ".join(
                f"{op} " + ", ".join(f"{size:,d} B {c * 1e6:.0f} us" for size, c in rows)
                for op, rows in out["comm_cpu"].items() if op in ("tp_layer", "send_recv")))
            say(f"gloo CPU in {len(pair_rounds.readings)} rounds between the probes (rank 0's), a TP all-reduce / "
                "an 8-byte message, us: "
                + ", ".join(f"{c * 1e6:.0f} / {m * 1e6:.0f}" for c, m in pair_rounds.readings))
            say("a 1-token layer pass outside its TP all-reduces, CPU ms (forward, backward): " + "; ".join(
                f"{k} {f * 1e3:.3f}, {b * 1e3:.3f}" for k, (f, b) in out["comm_cpu"]["tp_pass"].items()))
            say("a 1-token stage edge outside its TP all-reduces, CPU ms (forward, backward): " + "; ".join(
                f"{k} {f * 1e3:.3f}, {b * 1e3:.3f}" for k, (f, b) in out["comm_cpu"]["edge_pass"].items()))
            say("the pipeline executor's own CPU per action (the pair as pp 2, 1F1B): forward "
                f"{out['comm_cpu']['executor']['forward'] * 1e6:.0f} us, backward "
                f"{out['comm_cpu']['executor']['backward'] * 1e6:.0f} us")
    out["latency_rounds"] = latency.seconds
    if latency.seconds and rank == 0:
        say(f"all_reduce {latency.size:,d} B in {len(latency.seconds)} rounds between the probes: "
            + ", ".join(f"{t * 1e6:.0f}" for t in latency.seconds) + " us")
    return out


def _layer_probe(shape, probe: LayerProbe, cfg: CalibrationConfig, device: torch.device, clock, alone, occupied):
    """(forward, backward) seconds of one probe layer of `shape`. On a CPU every rank times it at once, each on its
    CPU clock for occupied_seconds (make_profile keeps the median rank's): a pass of a small layer is mostly
    Python, the dispatcher and autograd, and what it costs a core depends on what else the cores run -- rank 0 alone
    beside an idle core read the per-pass layer 0.13 / 0.38 ms, with the 8 ranks at once 0.18-0.23 / 0.53-0.60
    (load 14, round 23), and the main job runs 8 ranks on 2 cores throughout. On a GPU rank 0 alone (its device)."""
    if device.type == "cuda":
        return alone(lambda: layer_seconds(shape, cfg.seconds, device, DTYPES[probe.dtype], clock))
    seconds = occupied_seconds(cfg.seconds, dist.get_world_size(), os.cpu_count() or 1)
    return occupied(lambda: layer_seconds(shape, seconds, device, DTYPES[probe.dtype], clock))


def calibrate(cfg: CalibrationConfig = CalibrationConfig(), timeout: float = 300.0) -> dict:
    """Spawn cfg.ranks processes, measure, and return the profile (a JSON-ready dict; see `load_hardware`)."""
    from hybrid.testing import run_distributed
    load = os.getloadavg()[0]
    per_rank = run_distributed(_measure_rank, cfg.ranks, args=(cfg,), timeout=timeout, backend=cfg.backend)
    profile = make_profile(cfg, per_rank)
    # Other processes on the cores move every wall-timed field (gloo's latency and its CPU per call most: with 8
    # ranks on 2 cores under load 8-28, intra_latency_s read 3.9-7.6 ms; round 10): kept so a profile says how
    # quiet the machine was. The 1-minute average before the ranks start, and after (theirs included).
    profile["measured"]["load_average_before_after"] = [load, os.getloadavg()[0]]
    return profile


def layer_readings(per_rank: list[dict]) -> dict:
    """The probe layers' (forward, backward) seconds the profile fits: per shape (and the per-pass layer), the
    median over the ranks that timed it (rank_median: every rank at once on a CPU; rank 0 alone on a GPU)."""
    out = {"layer_seconds": [rank_median([r["layer_seconds"][i] for r in per_rank])
                             for i in range(len(per_rank[0]["layer_seconds"]))]}
    if "layer_pass_seconds" in per_rank[0]:
        out["layer_pass_seconds"] = rank_median([r["layer_pass_seconds"] for r in per_rank])
    return out


def optimizer_readings(per_rank: list[dict]) -> list[tuple[int, int, float]]:
    """optimizer_step_cpu's (tensors, parameters, CPU seconds a step) per stage size, the median over the ranks
    that ran it (rank_median; every rank at once on a CPU since round 23, as the main job's 8 ranks step on 2
    cores: rank 0 alone beside an idle core read 0.39 / 0.83 ms a step where the 8 at once read 0.83 / 1.47, and
    the job's optimizer took 20.5 ms of CPU a step against 10.4 planned from rank 0 alone)."""
    runs = [r.get("optimizer_step") for r in per_rank]
    sizes = [rank_median([run[i] for run in runs if run]) for i in range(len(per_rank[0]["optimizer_step"]))]
    return [(int(k), int(n), c) for k, n, c in sizes]


def _layer_ranks_record(per_rank: list[dict]) -> dict:
    """Every rank's probe-layer readings where more than one rank timed them (a CPU): what the medians came from."""
    if sum(r["layer_seconds"][0] is not None for r in per_rank) < 2:
        return {}
    return {"layer_probe_ranks_at_once": len(per_rank),
            "layer_forward_backward_seconds_per_rank": [r["layer_seconds"] for r in per_rank],
            **({"layer_pass_forward_backward_seconds_per_rank": [r["layer_pass_seconds"] for r in per_rank]}
               if "layer_pass_seconds" in per_rank[0] else {})}


def _pass_record(rank0: dict, hw: Hardware, curve: Hardware, probe: LayerProbe) -> dict:
    """The per-pass probe layer in the profile: its shape, measured and planned seconds (empty on a GPU)."""
    if not probe.pass_shape or "layer_pass_seconds" not in rank0:
        return {}
    planned = planned_layer_seconds(dataclasses.replace(hw, peak_tflops=curve.peak_tflops,
                                                        gemm_overhead_s=curve.gemm_overhead_s),
                                    probe, [probe.pass_shape])[0]
    return {"layer_pass_shape_b_s_h_heads": list(probe.pass_shape),
            "layer_pass_forward_backward_seconds": list(rank0["layer_pass_seconds"]),
            "layer_pass_forward_backward_planned_seconds": planned}


def _tp_pass_record(per_rank: list[dict], probe: LayerProbe) -> dict:
    """The pair probe's 1-token layers in the profile (tp_pass_cpu): per pass, (forward, backward) CPU seconds
    outside the TP all-reduces at tp 2 and unsharded, medians over ranks; empty where none ran."""
    rows = [r["comm_cpu"]["tp_pass"] for r in per_rank if r.get("comm_cpu") and "tp_pass" in r["comm_cpu"]]
    if not rows:
        return {}
    edges = [r["comm_cpu"]["edge_pass"] for r in per_rank if r.get("comm_cpu") and "edge_pass" in r["comm_cpu"]]
    return {"tp_pass_shape_b_s_h_heads": list(probe.pass_shape),
            "tp_pass_forward_backward_cpu_seconds": {k: [statistics.median(r[k][i] for r in rows) for i in (0, 1)]
                                                     for k in ("tp2", "tp1")},
            **({"edge_pass_forward_backward_cpu_seconds": {k: [statistics.median(r[k][i] for r in edges)
                                                               for i in (0, 1)] for k in edges[0]}} if edges else {})}


def _pair_rounds_record(per_rank: list[dict]) -> dict:
    """Every rank's PairRounds readings, and the gloo CPU fields the pair probe's own readings alone give (what
    calibrate fitted before round 24), beside the fitted ones; {} where no pair probe ran."""
    comm = [r.get("comm_cpu") for r in per_rank]
    if not any(comm):
        return {}
    return {"pair_cpu_rounds_s_per_rank": [c.get("rounds", []) if c else None for c in comm],
            "pair_cpu_one_reading": fit_comm_cpu(comm, rounds=False)}


def _glue_record(per_rank: list[dict]) -> dict:
    """The executor and optimizer probes' raw numbers in the profile: the executor's per-action CPU seconds of
    every rank that ran it, and the optimizer steps (tensors, parameters, the median rank's CPU seconds; and every
    rank's CPU seconds); empty where none ran."""
    execs = [r["comm_cpu"]["executor"] for r in per_rank if r.get("comm_cpu") and "executor" in r["comm_cpu"]]
    out = {}
    if execs:
        out["executor_action_cpu_seconds_per_rank"] = execs
    if per_rank[0].get("optimizer_step"):
        out["optimizer_step_tensors_params_cpu_seconds"] = [list(x) for x in optimizer_readings(per_rank)]
        out["optimizer_step_mesh"] = per_rank[0].get("optimizer_mesh")  # None: a profile before round 24
        out["optimizer_step_cpu_seconds_per_rank"] = [[c for _, _, c in r["optimizer_step"]]
                                                      for r in per_rank if r.get("optimizer_step")]
    return out


def make_profile(cfg: CalibrationConfig, per_rank: list[dict]) -> dict:
    """The profile from every rank's measurements: medians over ranks, collectives from rank 0 (all ranks
    report the slowest rank's time)."""
    together, alone, curves = {}, {}, {}
    for name in DTYPES:
        rates = [r["matmul_flops"][name] for r in per_rank]
        if all(x is not None for x in rates):
            together[name] = statistics.median(rates) / 1e12
            alone[name] = per_rank[0]["matmul_flops_alone"][name] / 1e12
            curves[name] = fit_gemm_curve([(2.0 * n**3, 2.0 * n**3 / r)
                                           for n, r in per_rank[0]["matmul_curve"][name]])
    if "fp32" not in together:
        raise ValueError("fp32 matmuls could not be measured on this device")
    # Ranks sharing a CPU's cores: a rank's rate alone, and how many such rates the cores give at once.
    # Separate devices (nccl): the rate with every device busy, no sharing.
    cores = os.cpu_count() if cfg.backend == "gloo" else None
    matmul = alone if cores else together
    # The GEMM curve from rank 0's sizes: its asymptotic rate is the peak (e = 1), its t0 the fixed cost; on
    # GPUs the asymptote is scaled by the all-at-once / alone ratio at matmul_n (devices share power and host).
    peaks = {k: curves[k][0] / 1e12 * (1.0 if cores else together[k] / alone[k]) for k in curves}
    overheads = {k: curves[k][1] for k in curves}
    main = "bf16" if "bf16" in peaks else "fp32"
    collectives = per_rank[0]["collectives"]
    base = hardware(cfg.base)
    # one rank times no collective: the node (its size, NVLink rate and latency) is the base preset's
    node = node_fields(collectives["all_reduce"], cfg.ranks, base, per_rank[0].get("latency_rounds", []))
    copy = (per_rank[0]["copy_bytes_per_s_alone"] if cores
            else statistics.median(r["copy_bytes_per_s"] for r in per_rank))
    memory_gb = _host_memory_gb() / cfg.ranks if cfg.backend == "gloo" else base.memory_gb
    hw = base.with_overrides(
        name=f"calibrated {platform.node() or 'host'} ({cfg.ranks} x {cfg.backend})",
        peak_tflops=peaks[main], compute_efficiency=1.0, gemm_overhead_s=overheads[main], hbm_tbps=copy / 1e12,
        **node, memory_gb=memory_gb, compute_units=cores,

        memory_bytes=None if cfg.backend == "gloo" else base.memory_bytes)  # the card's real capacity
    # flash attention keeps the base preset's achieved TFLOP/s, now a share of the measured peak (none on a CPU:
    # its calibrated layer times the attention core as GEMMs), and a CPU has no FP8 GEMMs
    hw = dataclasses.replace(hw, fp8_tflops=None if cores else base.fp8_tflops,
                             flash_efficiency=(min(1.0, base.flash_efficiency * base.peak_tflops / peaks[main])
                                               if base.flash_efficiency and not cores else None))
    # the layer's GEMMs on its dtype's curve (the probe's: fp32 on a CPU, bf16 on a GPU)
    probe = CPU_PROBE if cfg.backend == "gloo" else GPU_PROBE
    curve = hw.with_overrides(peak_tflops=peaks[probe.dtype], gemm_overhead_s=overheads[probe.dtype])
    read = layer_readings(per_rank)
    layers = [tuple(x) for x in read["layer_seconds"]]
    if cores and cfg.ranks > 1:  # gloo's CPU per collective call, message and byte (the shared-compute bound)
        hw = hw.with_overrides(**fit_comm_cpu([r.get("comm_cpu") for r in per_rank]))
        hw = hw.with_overrides(**fit_executor([r.get("comm_cpu") for r in per_rank]))
    if per_rank[0].get("skew"):  # a core per rank: what a collective waits for its ranks after compute
        hw = hw.with_overrides(**fit_skew(per_rank[0]["skew"], node["intra_latency_s"]))
    if cores:  # a CPU: a cost per layer pass (Python, the dispatcher, autograd) timed, a rate net of it
        rate, fixed_fwd, fixed_bwd = fit_layer(curve, layers, tuple(read["layer_pass_seconds"]), probe)
        hw = hw.with_overrides(elementwise_tbps=rate / 1e12 if rate else None, layer_forward_overhead_s=fixed_fwd,
                               layer_backward_overhead_s=fixed_bwd, kernel_overhead_s=0.0)
        if per_rank[0].get("optimizer_step"):  # the optimizer's CPU beyond its bytes, at this profile's rate
            hw = hw.with_overrides(**fit_optimizer_step(optimizer_readings(per_rank), hw))
        if cfg.ranks > 1:  # what a pass at tp > 1 costs beyond the sharded layer (the pair probe's 1-token layers)
            comm = [r.get("comm_cpu") for r in per_rank]
            for fit in (fit_tp_pass, fit_edge_pass):  # each against the planner on this profile's GEMM curve
                hw = hw.with_overrides(**fit(comm, dataclasses.replace(
                    hw, peak_tflops=curve.peak_tflops, gemm_overhead_s=curve.gemm_overhead_s), probe))
    else:  # a GPU: the copy rate, and the larger layer's rest spread over its memory-bound kernels (ops.py)
        rate = copy
        hw = hw.with_overrides(elementwise_tbps=rate / 1e12, layer_forward_overhead_s=0.0,
                               layer_backward_overhead_s=0.0,
                               kernel_overhead_s=fit_gpu_kernel_overhead(curve, layers[0], rate, probe))
    return {
        "format": FORMAT,
        "hardware": asdict(hw),
        "matmul_tflops": peaks,
        "matmul_overhead_s": overheads,
        "matmul_tflops_at_matmul_n": matmul,
        "matmul_tflops_all_ranks_at_once": together,
        "matmul_tflops_one_rank_alone": alone,
        "measured": {"ranks": cfg.ranks, "backend": cfg.backend, "threads_per_rank": 1 if cfg.backend == "gloo"
                     else None, "matmul_n": cfg.matmul_n, "copy_bytes": cfg.copy_bytes,
                     "matmul_curve_rank0_alone": {k: [{"n": n, "flops_per_s": r} for n, r in v]
                                                  for k, v in ((k, per_rank[0]["matmul_curve"][k]) for k in curves)},
                     "memory_copy_gbps": copy / GB, "layer_shapes_b_s_h_heads": [list(x) for x in probe.shapes],
                     "layer_dtype": probe.dtype,
                     "layer_forward_backward_seconds": [list(x) for x in layers],
                     "layer_forward_backward_planned_seconds": planned_layer_seconds(
                         dataclasses.replace(hw, peak_tflops=curve.peak_tflops, gemm_overhead_s=curve.gemm_overhead_s),
                         probe),
                     **_pass_record(read, hw, curve, probe),
                     **_layer_ranks_record(per_rank),
                     **_tp_pass_record(per_rank, probe),
                     "elementwise_gbps": rate / GB if rate else None, "cpu_count": os.cpu_count(), "collectives": collectives,
                     "intra_latency_rounds_s": per_rank[0].get("latency_rounds", []),
                     "comm_cpu_seconds_rank0": per_rank[0].get("comm_cpu"),
                     **_pair_rounds_record(per_rank),
                     **_glue_record(per_rank),
                     "all_reduce_8_bytes_after_compute_s": per_rank[0].get("skew"),
                     "probe_clock": "cpu" if cores else "wall",
                     "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                     "torch": torch.__version__, "machine": platform.platform()},
        "not_measured": {"from_preset": cfg.base,
                         "fields": ["inter_node_gbps", "inter_latency_s", "pcie_gbps", "host_memory_gb",
                                    "cpu_adam_params_per_s"] + (sorted(node) if cfg.ranks == 1 else [])},
    }


def node_fields(all_reduces: list[dict], ranks: int, base: Hardware, rounds: list[float] = ()) -> dict:
    """gpus_per_node, intra_node_gbps (busbw of the largest all-reduce) and intra_latency_s (the smallest's time,
    with the latency `rounds` where a CPU's ran: latency_of) from the timed all-reduces; with one rank none was
    timed and the base preset's node is kept."""
    if ranks == 1:
        return {"gpus_per_node": base.gpus_per_node, "intra_node_gbps": base.intra_node_gbps,
                "intra_latency_s": base.intra_latency_s}
    largest = max(all_reduces, key=lambda e: e["bytes"])
    smallest = min(all_reduces, key=lambda e: e["bytes"])
    return {"gpus_per_node": ranks, "intra_node_gbps": largest["busbw_gbps"],
            "intra_latency_s": latency_of(smallest["seconds"], list(rounds))}


def _host_memory_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB
    except (ValueError, OSError, AttributeError):
        return hardware(GpuKind.CPU).memory_gb


def save_profile(profile: dict, path: str) -> None:
    """Write atomically: a failure leaves no half-written profile."""
    from hybrid.cliutil import atomic_output
    with atomic_output(path) as tmp:
        with open(tmp, "w") as f:
            json.dump(profile, f, indent=2)
            f.write("\n")


# --- command line -----------------------------------------------------------------------------------

def oversubscribed(ranks: int, backend: str, cores: int) -> str | None:
    """gloo ranks beyond the cores: what the profile's timings then mean, or None. A warning, not a refusal: the
    probes a rank runs alone are timed on its CPU clock and stay right, and the wall-timed collectives time the OS
    scheduler handing the cores round -- which is what a training run of as many ranks on these cores meets, and
    what the planner's shared-compute bound prices (the main job's 8 ranks on 2 cores plan from such a profile).
    For anything else (the links themselves, another rank count) the collectives' numbers are meaningless."""
    if backend != "gloo" or ranks <= cores:
        return None
    return (f"--ranks {ranks} on {cores} CPU cores: ranks share cores, so the timed collectives (intra_latency_s, "
            f"intra_node_gbps) measure the OS scheduler, not gloo; measuring anyway, as a training run of {ranks} "
            f"ranks on these cores meets the same scheduler (the planner prices it) -- plan only that run with this "
            f"profile; for the links themselves give --ranks {cores} (no more ranks than cores)")


def ranks_leave_ctrl_c_to_this_process() -> int | None:
    """Ctrl-C sends SIGINT to every process of the terminal's foreground group: the forkserver that forks the ranks
    (while it imports, before it ignores SIGINT itself) and each rank would print a KeyboardInterrupt traceback of
    its own. The forkserver is started here with SIGINT ignored -- a disposition exec keeps and every rank forked
    from it inherits -- so this process alone takes the Ctrl-C (`stop_ranks` then ends them). Returns the
    forkserver's pid where this call started it, None where one was running (the tests': left as it is)."""
    from multiprocessing import forkserver

    from hybrid.testing import _forkserver
    _forkserver()  # the context with its preload set (hybrid/testing.py); a fork of a forkserver reuses that one
    server = forkserver._forkserver
    before = server._forkserver_pid
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        server.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)
    return server._forkserver_pid if server._forkserver_pid != before else None


def stop_ranks(forkserver_pid: int | None) -> None:
    """After a Ctrl-C, before the exit's clean-up unlinks the job's queue semaphores: every rank started is killed,
    then the forkserver this run started -- so it forks no rank still asked of it (a start the Ctrl-C cut short
    while the forkserver imported), which would find its queue gone and print a traceback of its own."""
    import multiprocessing
    for p in multiprocessing.active_children():
        p.kill()
        p.join()
    if forkserver_pid is not None:
        os.kill(forkserver_pid, signal.SIGKILL)
        os.waitpid(forkserver_pid, 0)


def interrupted(cfg: CalibrationConfig, out: str, seconds: float) -> SystemExit:
    """Ctrl-C while measuring: one line (what was measured, what to rerun), exit status 130 (128 + SIGINT, as a
    shell reports a command Ctrl-C ended). The profile is written only whole (save_profile), so nothing is."""
    argv = sys.argv[sys.argv.index("calibrate") + 1:] if "calibrate" in sys.argv else ["--out", out]
    ranks = f"{cfg.ranks} {cfg.backend} rank{'s' if cfg.ranks != 1 else ''}"
    print(f"hybrid calibrate: interrupted after {seconds:.0f} s of measuring (any lines above are what the {ranks} "
          f"measured; stopped): nothing written to {out}; rerun `hybrid calibrate {shlex.join(argv)}` to the end "
          f"to write the profile", file=sys.stderr, flush=True)
    return SystemExit(130)


def _quiet_deepspeed() -> dict[str, str]:
    """The ranks' environment beyond this process's: without CUDA, DS_ACCELERATOR=cpu (DeepSpeed's own choice
    there), or the ranks' CPU Adam preload (hybrid/testing_preload.py) prints DeepSpeed's "Setting accelerator to
    CPU. If you have GPU or other accelerator, we were unable to detect it." into calibrate's report."""
    return {} if torch.cuda.is_available() or "DS_ACCELERATOR" in os.environ else {"DS_ACCELERATOR": "cpu"}


def run(args: argparse.Namespace) -> None:
    if args.sizes is not None and args.ranks == 1:  # one rank times no collective: the sizes would go unread
        raise ValueError("--sizes: --ranks 1 times no collectives (the --base preset's links are kept); "
                         "drop --sizes or give --ranks 2 or more")
    text = args.sizes if args.sizes is not None else ",".join(str(s) for s in DEFAULT_SIZES)
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--sizes {args.sizes!r}: give comma-separated byte counts, e.g. 8,65536,8388608") from None
    if max(sizes) > 2**34:
        raise ValueError(f"--sizes: {max(sizes)} bytes is more than 16 GiB per collective; give smaller sizes")
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("--backend nccl needs CUDA devices; this machine has none (use gloo)")
    if backend == "nccl" and args.ranks > torch.cuda.device_count():
        raise ValueError(f"--ranks {args.ranks}: nccl takes one GPU a rank and this machine has "
                         f"{torch.cuda.device_count()}; use --ranks {torch.cuda.device_count()}")
    gpu = backend == "nccl"
    if not gpu and args.backend is None and args.base != GpuKind.CPU.value:
        raise ValueError(f"--base {args.base} is a GPU preset, but this machine has no CUDA device: calibrate would "
                         f"time this CPU over gloo and keep the {args.base}'s node links, a profile of neither; run "
                         f"it on the {args.base} machine, or drop --base to profile this CPU (--backend gloo to "
                         f"mix them anyway)")
    check_not_link(f"--out {args.out!r}", args.out)  # round 18: measured, then the rename replaced the link itself
    check_output_file("--out", args.out)
    check_replaces_a_profile(args.out)
    cfg = CalibrationConfig(ranks=args.ranks, backend=backend,
                            matmul_n=args.matmul_size or (GPU_MATMUL_N if gpu else CalibrationConfig.matmul_n),
                            copy_bytes=args.copy_bytes or (GPU_COPY_BYTES if gpu else CalibrationConfig.copy_bytes),
                            sizes=sizes, seconds=args.seconds, base=args.base)
    if warning := oversubscribed(cfg.ranks, backend, os.cpu_count() or 1):
        print(f"hybrid calibrate: warning: {warning}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    print(f"calibrate: spawning {plural(cfg.ranks, backend + ' rank')} ...", flush=True)
    server = None
    try:
        with mock.patch.dict(os.environ, _quiet_deepspeed()):  # the forkserver the ranks fork from starts here
            server = ranks_leave_ctrl_c_to_this_process()
            profile = calibrate(cfg)
        save_profile(profile, args.out)  # atomic: an interrupt during the write leaves nothing
    except KeyboardInterrupt:
        stop_ranks(server)
        raise interrupted(cfg, args.out, time.perf_counter() - start) from None
    hw = profile["hardware"]
    print(f"calibrate: wrote {args.out} in {time.perf_counter() - start:.0f} s: matmul "
          + ", ".join(f"{k} {v * 1e3:.1f} GFLOP/s" for k, v in profile["matmul_tflops"].items())
          + (f" per rank alone ({hw['compute_units']} cores shared)" if hw["compute_units"] else " per device")
          + f", memory {hw['hbm_tbps'] * 1e3:.2f} GB/s (elementwise kernels "
          + (f"{hw['elementwise_tbps'] * 1e3:.2f} GB/s" if hw.get("elementwise_tbps") else "at that rate")
          + (f"), all-reduce busbw {hw['intra_node_gbps']:.3f} GB/s, latency {hw['intra_latency_s'] * 1e6:.0f} us"
             + (f", wait after c s of compute {hw['collective_skew_s'] * 1e6:.0f} us + "
                f"{hw['collective_skew_per_s']:.3f} c" if measures_skew(cfg.ranks, cfg.backend) else "")
             if cfg.ranks > 1 else f"), no collectives (one rank: the {cfg.base} preset's node is kept)")
          + f". Use: hybrid plan --hardware {args.out} ...")
    before, after = profile["measured"]["load_average_before_after"]
    print(f"calibrate: load average {before:.2f} before, {after:.2f} after ({os.cpu_count()} CPUs; other processes "
          "on the cores move the timed collectives: calibrate on a quiet machine)")
