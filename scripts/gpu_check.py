"""GPU evidence in one command: the CUDA path's correctness, its speed against transformers, the machine's GEMM
curve and the planner's prediction for what was measured -- written as JSON and Markdown into one folder.

    python scripts/gpu_check.py --out gpu_results            # one GPU, ~5 minutes on an H200
    python scripts/gpu_check.py --dry-run --out /tmp/gpu      # the same code on CPU with tiny sizes (the test suite)
    [--only env,hf_match,...] [--budget-s 420]

Results go to OUT/gpu_check.json and OUT/gpu_check.md after every section; a later run into the same folder (say
--only for the sections that failed) replaces the sections it runs and keeps the others.

Sections (each runs on its own; a failure is recorded with its traceback and the next one runs):

  env           torch / CUDA / driver / transformers versions, the device, the date.
  ceilings      a large bf16 matmul (TFLOP/s) and a device-to-device copy (read + write bytes/s): the two rates
                every later number is read against (median of 10 timed calls after 3 warm-ups, device events).
  hf_match      our GPT-2 and Llama against transformers' (attention "sdpa"), same weights: logits, loss and every
                parameter gradient. fp32 (TF32 off): max |ours - theirs| / max |theirs| <= 1e-5. bf16 (parameters
                cast, buffers such as RoPE's inverse frequencies kept fp32, on both sides): ours vs transformers'
                fp32 result must err at most 2 x max(transformers' own bf16 error, u), u = 2^-8 the bf16 unit
                roundoff -- |ours - exact| <= |ours - theirs| + |theirs - exact|, so two implementations of the same
                math in bf16 land within a small multiple of each other's error.
  zero_offload  one process, fp32, 3 steps of ZeRO 3: optimizer and parameters offloaded (pinned host memory,
                non-blocking copies: the default on CUDA) must equal the same offload with blocking, unpinned
                copies bit for bit (a copy racing the optimizer would differ), and are compared with no offload
                (the step on the GPU) with the same per-tensor AdamW arithmetic (--cpu-adam torch-loop) and with
                the default CPU optimizer.
  multi_rank    two ranks on one GPU: NCCL refuses two ranks on one device, so gloo with CUDA tensors
                (HYBRID_BACKEND=gloo HYBRID_DEVICE=cuda:0) under torchrun, at tp 2, pp 2 and dp 2 with ZeRO 3 +
                offload; each run's losses against one NCCL rank's (fp32, 3 steps).
  speed         train.py (what users run) on a ~1.2B-parameter Llama (Llama 3.2 1B's shape), seq 4096, --bf16,
                micro-batch 1, 8 micro-batches a step, selective recomputation off and on, and --compile:
                tokens/s, TFLOP/s, MFU against the device's dense bf16 peak, peak memory (median and spread over
                the timed steps). Then transformers' LlamaForCausalLM of the same config in a loop shaped like its
                Trainer with bf16=True (fp32 weights under bf16 autocast, fused AdamW, use_cache=False, "sdpa",
                no clipping), the same step; and one
                micro-batch's forward + backward of both models with bf16 weights, ours also with each block under
                torch.compile.
  breakdown     the speed run's step taken apart in one process: device bytes of the model states, of one
                micro-batch's forward and its forward + backward peak, of the optimizer step; device time of the
                forward + backward, the gradient sync and the optimizer step; each beside the planner's term.
  calibrate     `hybrid calibrate --ranks 1` on the device (GEMM curve, copy rate, a layer's memory-bound rate),
                then every GEMM shape of the speed model timed and set against the curve: the h200 preset's and
                the one just measured.
  planner       the planner's step time and memory for the speed runs' layouts, from the h200 preset and from the
                measured profile, against the measured step and peak memory.

The machine's own PyTorch and transformers are used; the project comes from this checkout (sys.path), nothing is
installed. `--dry-run` runs every section on CPU with a tiny model, so the script cannot rot (tests/test_gpu_check.py);
its train.py and calibrate commands run as forks of hybrid.testing's forkserver rather than new interpreters.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from a checkout

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from hybrid.cliutil import HelpFormatter, OneLineParser, float_in, write_text  # noqa: E402

SECTIONS = ("env", "ceilings", "hf_match", "zero_offload", "multi_rank", "speed", "breakdown", "calibrate", "planner")
BF16_UNIT_ROUNDOFF = 2.0**-8  # bf16 keeps 8 significant bits: a rounding errs by at most 2^-8 relative


@dataclass(frozen=True)
class Sizes:
    """Problem sizes: REAL on a GPU, DRY on CPU (--dry-run)."""

    matmul_n: int  # ceilings: n x n x n bf16 product
    copy_bytes: int  # ceilings: device-to-device copy
    match: dict  # hf_match / zero_offload: hidden, heads, layers, seq, vocab, batch
    speed_model: dict  # the speed model (Llama): layers, hidden, heads, kv, ffn, vocab
    seq: int  # speed: tokens per sequence
    micro_batches: int  # speed: micro-batches of one sequence per step
    iters: int  # speed: train.py iterations; the first `warm` are not timed
    warm: int
    calib: tuple  # calibrate flags
    timeout_s: float  # one subprocess


REAL = Sizes(matmul_n=8192, copy_bytes=2**31,
             match=dict(hidden=256, heads=4, layers=2, seq=256, vocab=1024, batch=2),
             speed_model=dict(layers=16, hidden=2048, heads=32, kv=8, ffn=8192, vocab=128256),
             seq=4096, micro_batches=8, iters=13, warm=3,
             calib=("--matmul-size", "8192", "--copy-bytes", str(2**31), "--seconds", "0.5", "--base", "h200"),
             timeout_s=200)
DRY = Sizes(matmul_n=128, copy_bytes=2**20,
            match=dict(hidden=32, heads=4, layers=2, seq=16, vocab=96, batch=2),
            speed_model=dict(layers=2, hidden=64, heads=4, kv=2, ffn=128, vocab=256),
            seq=32, micro_batches=2, iters=4, warm=1,
            calib=("--matmul-size", "64", "--copy-bytes", str(2**20), "--seconds", "0.02", "--base", "h200"),
            timeout_s=300)


class Check:
    """The results, written to OUT/gpu_check.json and OUT/gpu_check.md after every section."""

    def __init__(self, out: str, dry: bool, budget_s: float):
        self.out, self.dry, self.budget_s = out, dry, budget_s
        self.sizes = DRY if dry else REAL
        self.device = torch.device("cpu" if dry else "cuda")
        self.start = time.monotonic()
        self.results: dict = {"dry_run": dry, "sections": earlier_sections(out, dry)}

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)

    def run(self, name: str, fn: Callable[["Check"], dict], needs_s: float) -> None:
        if self.left() < needs_s:
            self.record(name, "skipped", 0.0, error=f"{self.left():.0f} s of the budget left, the section needs "
                                                     f"~{needs_s:.0f} s (--budget-s)")
            return
        print(f"gpu_check: {name} ...", flush=True)
        t0 = time.monotonic()
        try:
            result = fn(self)
            self.record(name, "ok" if result.pop("passed", True) else "failed", time.monotonic() - t0, result)
        except Exception:  # noqa: BLE001 -- one section's failure is a result; the next section still runs
            self.record(name, "error", time.monotonic() - t0, error=traceback.format_exc(limit=8))
        finally:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def record(self, name: str, status: str, seconds: float, result: dict | None = None, error: str | None = None):
        self.results["sections"][name] = {"status": status, "seconds": round(seconds, 1), "result": result or {},
                                          **({"error": error} if error else {})}
        print(f"gpu_check: {name}: {status} in {seconds:.0f} s" + (f"\n{error}" if error else ""), flush=True)
        self.write()

    def write(self) -> None:
        # each whole or not at all, never through a link (a kill mid-run leaves the last record's files whole)
        write_text(os.path.join(self.out, "gpu_check.json"), json.dumps(self.results, indent=1, default=str) + "\n")
        write_text(os.path.join(self.out, "gpu_check.md"), markdown(self.results))


def earlier_sections(out: str, dry: bool) -> dict:
    """The sections an earlier run of the same kind (dry or not) wrote into `out`, kept beside this run's."""
    try:
        with open(os.path.join(out, "gpu_check.json")) as f:
            earlier = json.load(f)
    except (OSError, ValueError):
        return {}
    return dict(earlier.get("sections", {})) if earlier.get("dry_run") == dry else {}


def commit() -> str:
    """HYBRID_COMMIT (set it where the checkout travels without .git), else git's short hash of this checkout."""
    if os.environ.get("HYBRID_COMMIT"):
        return os.environ["HYBRID_COMMIT"]
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# --- timing -----------------------------------------------------------------------------------------------------

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, reps: int = 10, warmup: int = 3) -> list[float]:
    """Seconds of each of `reps` calls after `warmup` untimed ones (device events on CUDA)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return out


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def peak_memory(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


# --- env, ceilings ----------------------------------------------------------------------------------------------

def env(c: Check) -> dict:
    import transformers
    out = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "transformers": transformers.__version__, "machine": platform.platform(), "cpus": os.cpu_count(),
           "commit": commit()}
    if c.device.type == "cuda":
        p = torch.cuda.get_device_properties(0)
        out.update(device=p.name, capability=f"{p.major}.{p.minor}", multiprocessors=p.multi_processor_count,
                   total_memory_bytes=p.total_memory, gpus=torch.cuda.device_count())
        try:
            q = "driver_version,name,memory.total,clocks.max.sm,power.limit"
            out["nvidia_smi"] = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                                               capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            out["nvidia_smi"] = f"not run: {e}"
    else:
        out["device"] = "cpu (dry run)"
    return out


def ceilings(c: Check) -> dict:
    n, dev = c.sizes.matmul_n, c.device
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)  # random data: zeros run faster than real data
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    mm = spread(timed(lambda: a @ b, dev))
    src = torch.randn(c.sizes.copy_bytes // 4, device=dev)
    dst = torch.empty_like(src)
    cp = spread(timed(lambda: dst.copy_(src), dev))
    return {"matmul_n": n, "bf16_matmul_tflops": 2 * n**3 / mm["median"] / 1e12, "matmul_s": mm,
            "copy_bytes": c.sizes.copy_bytes, "copy_tbps_read_plus_write": 2 * c.sizes.copy_bytes / cp["median"] / 1e12,
            "copy_s": cp}


# --- correctness against transformers ---------------------------------------------------------------------------

def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|, in fp32."""
    a, b = a.detach().float(), b.detach().float()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


def hf_config(kind: str, m: dict, **extra):
    from transformers import GPT2Config, LlamaConfig
    if kind == "gpt2":
        return GPT2Config(n_layer=m["layers"], n_embd=m["hidden"], n_head=m["heads"], vocab_size=m["vocab"],
                          n_positions=m["seq"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                          eos_token_id=0, attn_implementation="sdpa", **extra)
    return LlamaConfig(num_hidden_layers=m["layers"], hidden_size=m["hidden"], num_attention_heads=m["heads"],
                       num_key_value_heads=m.get("kv", m["heads"] // 2), intermediate_size=m.get("ffn", 3 * m["hidden"]),
                       vocab_size=m["vocab"], max_position_embeddings=m["seq"], attention_dropout=0.0,
                       tie_word_embeddings=m.get("tied", False), attn_implementation="sdpa", use_cache=False, **extra)


def hf_class(kind: str):
    from transformers import GPT2LMHeadModel, LlamaForCausalLM
    return GPT2LMHeadModel if kind == "gpt2" else LlamaForCausalLM


def solo_tp():
    from hybrid.comm import Group
    from hybrid.tp import TPContext
    return TPContext(Group.solo("tp"))


def cast_parameters(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Parameters to `dtype`, buffers (RoPE's inverse frequencies) kept: as hybrid's --bf16 flat buffers hold them."""
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


def forward_backward(model: nn.Module, ids: torch.Tensor, ours: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(logits, loss, gradients by transformers' parameter names)."""
    from hybrid.comm import Group
    from models import shift_labels
    from models.hf_io import export_hf_state_dict
    model.zero_grad(set_to_none=True)
    if ours:
        logits = model(ids)
        loss = model(ids, shift_labels(ids))
        loss.backward()
        return logits, loss, export_hf_state_dict(model, Group.solo("tp"), grads=True)
    out = model(ids, labels=ids)
    out.loss.backward()
    return out.logits, out.loss, {k: p.grad for k, p in model.named_parameters()}


def compare(kind: str, c: Check, tmp: str) -> dict:
    from models import build_model, from_hf
    from models.hf_io import load_hf_checkpoint
    m, dev = c.sizes.match, c.device
    cfg = hf_config(kind, m)
    torch.manual_seed(0)
    hf = hf_class(kind)(cfg).eval()
    path = os.path.join(tmp, kind)
    hf.save_pretrained(path)
    ours = build_model(from_hf(cfg), solo_tp(), seed=None).eval()
    load_hf_checkpoint(ours, path, 0)
    hf, ours = hf.to(dev), ours.to(dev)
    ids = torch.randint(0, m["vocab"], (m["batch"], m["seq"]), generator=torch.Generator().manual_seed(1)).to(dev)
    ref = forward_backward(hf, ids, ours=False)
    got = forward_backward(ours, ids, ours=True)
    fp32 = errors(got, ref)
    hf16 = forward_backward(cast_parameters(copy.deepcopy(hf), torch.bfloat16), ids, ours=False)
    ours16 = forward_backward(cast_parameters(copy.deepcopy(ours), torch.bfloat16), ids, ours=True)
    e_hf, e_ours = errors(hf16, ref), errors(ours16, ref)
    bound = {k: 2 * max(e_hf[k], BF16_UNIT_ROUNDOFF) for k in e_hf}
    return {"fp32_rel_err": fp32, "fp32_ok": max(fp32.values()) <= 1e-5,
            "bf16_rel_err_vs_fp32_reference": {"ours": e_ours, "transformers": e_hf, "bound": bound},
            "bf16_ok": all(e_ours[k] <= bound[k] for k in bound)}


def errors(got, ref) -> dict:
    (logits, loss, grads), (r_logits, r_loss, r_grads) = got, ref
    if sorted(grads) != sorted(r_grads):
        raise AssertionError(f"gradient names differ: {sorted(set(grads) ^ set(r_grads))}")
    return {"logits": rel(logits, r_logits), "loss": rel(loss, r_loss),
            "grads": max(rel(grads[k], r_grads[k]) for k in r_grads)}


def hf_match(c: Check) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (TF32 keeps 10 mantissa bits)
    torch.backends.cudnn.allow_tf32 = False
    with tempfile.TemporaryDirectory() as tmp:
        out = {kind: compare(kind, c, tmp) for kind in ("gpt2", "llama")}
    out["passed"] = all(r["fp32_ok"] and r["bf16_ok"] for r in out.values())
    return out


# --- ZeRO 3 + offload -------------------------------------------------------------------------------------------

def zero_run(c: Check, zero_cfg, pinned: bool = True) -> dict:
    """3 fp32 steps of one process under `zero_cfg`: losses, final weights, fp32 master shards."""
    from hybrid.mesh import Mesh
    from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
    from hybrid.zero import ZeroOptimizer
    from models import build_model, from_hf, shift_labels

    class Unpinned(ZeroOptimizer):
        pin = property(lambda self: False, lambda self, value: None)  # host shards pageable, copies blocking

    m = c.sizes.match
    mesh = Mesh.single(c.device)
    model = nn.ModuleList([build_model(from_hf(hf_config("llama", m)), solo_tp(), seed=1234)]).to(c.device)
    opt = (ZeroOptimizer if pinned else Unpinned)(model, mesh, zero_cfg, OptimizerConfig(lr=1e-3, clip_grad=1.0))
    gen = torch.Generator().manual_seed(2)
    ids = [torch.randint(0, m["vocab"], (m["batch"], m["seq"]), generator=gen) for _ in range(2)]
    batches = [(x, shift_labels(x)) for x in ids]
    runner = LocalForwardBackward(model[0], c.device)
    losses = [train_step(model, batches, opt, mesh, runner=runner) for _ in range(3)]
    with opt.gathered():
        weights = torch.cat([p.detach().float().cpu().flatten() for p in model.parameters()])
    master = torch.cat([u.master.detach().float().cpu().flatten() for u in opt.units])
    pinned_ok = all(u.master.is_pinned() for u in opt.units) if c.device.type == "cuda" and pinned else None
    return {"losses": losses, "weights": weights, "master": master, "optimizer": opt.optimizer_kind,
            "host_shards_pinned": pinned_ok}


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in fp32 units in the last place between a and b (0: bit for bit)."""
    ia, ib = a.contiguous().view(torch.int32).long(), b.contiguous().view(torch.int32).long()
    ia = torch.where(ia < 0, -(ia & 0x7FFFFFFF), ia)  # sign-magnitude to a monotone integer line
    ib = torch.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int((ia - ib).abs().max())


def zero_offload(c: Check) -> dict:
    from hybrid.zero import ZeroConfig
    from hybrid.zero.config import CpuAdam
    # CpuAdam.TORCH: torch's AdamW, on CPU the fused kernel the non-offloaded path runs (bit for bit on one CPU)
    torch_adam = dict(stage=3, offload_optimizer=True, offload_params=True, cpu_adam=CpuAdam.TORCH)
    on_device = zero_run(c, ZeroConfig(stage=3))
    pinned = zero_run(c, ZeroConfig(**torch_adam))
    blocking = zero_run(c, ZeroConfig(**torch_adam), pinned=False)
    default = zero_run(c, ZeroConfig(stage=3, offload_optimizer=True, offload_params=True))

    def diff(a: dict, b: dict) -> dict:
        return {"weights_bit_equal": torch.equal(a["weights"], b["weights"]),
                "master_bit_equal": torch.equal(a["master"], b["master"]),
                "max_ulps_master": ulps(a["master"], b["master"]),
                "max_rel_master": rel(a["master"], b["master"]), "losses": [a["losses"], b["losses"]]}

    race = diff(pinned, blocking)
    return {"optimizers": {"device": on_device["optimizer"], "offload_torch": pinned["optimizer"],
                           "offload_default": default["optimizer"]},
            "host_master_shards_pinned": pinned["host_shards_pinned"],
            "pinned_nonblocking_vs_unpinned_blocking": race,
            "offload_vs_device_same_adamw_arithmetic": diff(pinned, on_device),
            "offload_default_optimizer_vs_device": diff(default, on_device),
            "passed": race["weights_bit_equal"] and race["master_bit_equal"]
            and diff(pinned, on_device)["max_rel_master"] <= 1e-5}


# --- train.py runs ----------------------------------------------------------------------------------------------

def train_py(c: Check, flags: list[str], ranks: int = 1, env: dict | None = None, tag: str = "run",
             timeout_s: float | None = None) -> dict:
    """Run scripts/train.py (torchrun for ranks > 1); its JSON-lines records and the log's last lines."""
    metrics = os.path.join(c.out, f"metrics_{tag}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
              if ranks > 1 else [sys.executable])
    cmd = launch + [os.path.join(ROOT, "scripts", "train.py"), *flags, "--eval-iters", "0", "--log-interval", "1",
                    "--metrics-file", metrics]
    full_env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    t0 = time.monotonic()
    try:
        proc = python_command(c, cmd, full_env, timeout_s or c.sizes.timeout_s)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"train.py ({tag}) still running after {e.timeout:.0f} s; stopped:\n"
                           + _text(e.stdout)[-1500:] + _text(e.stderr)[-1500:]) from None
    log = (proc.stdout + proc.stderr).strip().splitlines()
    write_text(os.path.join(c.out, f"log_{tag}.txt"), " ".join(cmd) + "\n" + "\n".join(log) + "\n")
    if proc.returncode != 0:
        raise RuntimeError(f"train.py ({tag}) exited {proc.returncode}:\n" + "\n".join(log[-25:]))
    with open(metrics) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return {"records": [r for r in records if "lm_loss" in r], "wall_s": time.monotonic() - t0, "log_tail": log[-6:],
            "log": log}


def python_command(c: Check, cmd: list[str], env: dict, timeout_s: float, cwd: str | None = None):
    """`cmd` (sys.executable, then a script or -m and a module; `-m torch.distributed.run ...` for torchrun) run to
    completion: subprocess.run's result. On a GPU a new process, as a user runs it. The dry run forks it from
    hybrid.testing's forkserver (torch and hybrid imported once) instead: the same command line, torchrun's
    arguments parsed by torch's own parser, run as __main__ with torchrun's environment -- without the ~3 s of CPU
    each new interpreter spends importing, 13 of them, most of the dry run's CPU time."""
    if not c.dry:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout_s)
    from hybrid import testing
    args, where = cmd[1:], cwd or os.getcwd()
    if args[:2] == ["-m", "torch.distributed.run"]:
        return testing.torchrun_cli(args[2:], env=env, cwd=where, timeout=timeout_s)
    return testing.run(args, env=env, cwd=where, timeout=timeout_s)


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def isolated(fn: Callable[[], dict]) -> dict:
    """fn()'s result, or its error: one part of a section failing leaves the others' numbers."""
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return {"error": traceback.format_exc(limit=6)[-3000:]}


def multi_rank(c: Check) -> dict:
    base = ["--model", "tiny-llama", "--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--train-iters", "3", "--lr-warmup-iters", "0", "--distributed-timeout-minutes", "1",
            "--watchdog-timeout", "45"]  # nested below the collectives' 60 s (docs/operations.md)
    limit = None if c.dry else 120.0  # a hang must not eat the GPU lease
    dev = "cpu" if c.device.type == "cpu" else "cuda:0"
    ref = train_py(c, base, env={"HYBRID_DEVICE": dev}, tag="ref1", timeout_s=limit)  # one rank: NCCL on a GPU
    ref_losses = [r["lm_loss"] for r in ref["records"]]
    layouts = {"tp2": ["--tensor-model-parallel-size", "2"], "pp2": ["--pipeline-model-parallel-size", "2"],
               "dp2_zero3_offload": ["--zero-stage", "3", "--offload-optimizer", "--offload-params"]}
    out = {"reference_losses_1_rank": ref_losses, "backend": "gloo", "device": dev}
    for name, flags in layouts.items():
        try:
            run = train_py(c, base + flags, ranks=2, env={"HYBRID_BACKEND": "gloo", "HYBRID_DEVICE": dev}, tag=name,
                           timeout_s=limit)
            losses = [r["lm_loss"] for r in run["records"]]
            err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
            out[name] = {"losses": losses, "max_rel_err": err, "ok": len(losses) == len(ref_losses) and err <= 1e-5}
        except Exception as e:  # noqa: BLE001 -- what gloo cannot do with CUDA tensors is a finding
            out[name] = {"ok": False, "error": str(e)[-2000:]}
    out["not_covered_with_one_device"] = ("NCCL with more than one rank (NCCL refuses two ranks on one device), "
                                          "so NVLink collectives, NCCL's stream overlap and multi-GPU speed")
    out["passed"] = all(out[k]["ok"] for k in layouts)
    return out


# --- speed ------------------------------------------------------------------------------------------------------

def speed_config(c: Check):
    m = dict(c.sizes.speed_model, seq=c.sizes.seq, tied=True)
    return hf_config("llama", m, rope_theta=500000.0)


def train_py_speed(c: Check, cfg_dir: str, recompute: str | None, extra: tuple[str, ...] = ()) -> dict:
    s = c.sizes
    flags = ["--model", cfg_dir, "--bf16", "--seq-length", str(s.seq), "--micro-batch-size", "1",
             "--global-batch-size", str(s.micro_batches), "--train-iters", str(s.iters), "--lr-warmup-iters", "0",
             *extra]
    if recompute:
        flags += ["--recompute-granularity", recompute]
    run = train_py(c, flags, tag=f"speed_{recompute or 'none'}{''.join(extra).replace('-', '_')}")
    timed_steps = run["records"][s.warm:]
    key = "max_memory_allocated_bytes" if c.device.type == "cuda" else "peak_rss_bytes"
    return {"step_s": spread([r["iteration_time_s"] for r in timed_steps]),
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed_steps),
            "model_tflops": statistics.median(r["tflops_per_device"] for r in timed_steps),
            "hw_tflops": statistics.median(r["hw_tflops_per_device"] for r in timed_steps),
            "mfu": statistics.median(r["mfu"] for r in timed_steps) if "mfu" in timed_steps[0] else None,
            "peak_memory_bytes": max(r[key] for r in timed_steps), "memory_measure": key,
            "losses": [r["lm_loss"] for r in run["records"]], "log_tail": run["log_tail"],
            "time_split": [line for line in run["log"] if "time split" in line][-1:]}


def hf_trainer_step(c: Check, hf_cfg) -> dict:
    """transformers in a loop shaped like its Trainer with bf16=True: fp32 weights, bf16 autocast, fused AdamW,
    s.micro_batches micro-batches accumulated, one optimizer step -- no gradient clipping (the Trainer clips at 1.0,
    train.py does too) and no data loader: the loop is no slower than the Trainer would be."""
    s, dev = c.sizes, c.device
    reset_peak(dev)
    with torch.device(dev):
        model = hf_class("llama")(hf_cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    ids = torch.randint(0, hf_cfg.vocab_size, (s.micro_batches, 1, s.seq), device=dev)

    def step() -> None:
        for x in ids:
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = model(input_ids=x, labels=x, use_cache=False).loss / s.micro_batches
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    times = timed(step, dev, reps=s.iters - s.warm, warmup=s.warm)
    out = {"step_s": spread(times), "peak_memory_bytes": peak_memory(dev)}
    del model, opt
    return out


def fwd_bwd(c: Check, hf_cfg) -> dict:
    """One micro-batch's forward + backward, bf16 weights, eager: ours, transformers'; ours with torch.compile."""
    from models import build_model, from_hf, shift_labels
    s, dev = c.sizes, c.device
    x = torch.randint(0, hf_cfg.vocab_size, (1, s.seq), device=dev)
    labels = shift_labels(x)
    out = {}
    with torch.device(dev):
        hf = cast_parameters(hf_class("llama")(hf_cfg).train(), torch.bfloat16)
    reset_peak(dev)
    out["transformers_eager"] = {"s": spread(timed(lambda: hf(input_ids=x, labels=x, use_cache=False).loss.backward(),
                                                   dev)), "peak_memory_bytes": peak_memory(dev)}
    del hf
    ours = cast_parameters(build_model(from_hf(hf_cfg), solo_tp(), seed=1234).to(dev).train(), torch.bfloat16)
    reset_peak(dev)
    out["ours_eager"] = {"s": spread(timed(lambda: ours(x, labels).backward(), dev)),
                         "peak_memory_bytes": peak_memory(dev)}
    if c.left() > 150 or c.dry:
        out["ours_compiled_blocks"] = isolated(lambda: compiled(c, ours, x, labels))
    else:
        out["ours_compiled_blocks"] = {"skipped": f"{c.left():.0f} s of the budget left"}
    return out


def compiled(c: Check, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> dict:
    """Forward + backward with every block under torch.compile; the first call's time includes compiling."""
    from hybrid.train.loop import compile_blocks
    t0 = time.monotonic()
    compile_blocks([model], backend="eager" if c.dry else "inductor")  # dry: this code, not inductor's C++ build
    model(x, labels).backward()
    sync(c.device)
    compile_s = time.monotonic() - t0
    reset_peak(c.device)
    return {"s": spread(timed(lambda: model(x, labels).backward(), c.device)), "peak_memory_bytes": peak_memory(c.device),
            "compile_s": compile_s}


def speed(c: Check) -> dict:
    from hybrid.metrics.flops import model_flops_per_token
    from models import from_hf
    hf_cfg = speed_config(c)
    cfg = from_hf(hf_cfg)
    out = {"model": {**c.sizes.speed_model, "parameters": cfg.num_parameters, "seq": c.sizes.seq,
                     "micro_batch": 1, "micro_batches": c.sizes.micro_batches},
           "model_flops_per_token": model_flops_per_token(cfg, c.sizes.seq)}
    with tempfile.TemporaryDirectory() as cfg_dir:
        hf_cfg.save_pretrained(cfg_dir)  # config.json only: train.py initialises the weights itself
        for recompute in (None, "selective"):
            out[f"train_py_recompute_{recompute or 'none'}"] = isolated(lambda: train_py_speed(c, cfg_dir, recompute))
        # --compile: inductor's C++ build alone takes ~40 s on a CPU, so the dry run leaves it to tests/test_compile.py
        out["train_py_compile"] = ({"skipped": "dry run (tests/test_compile.py runs train.py --compile)"} if c.dry
                                   else isolated(lambda: train_py_speed(c, cfg_dir, None, ("--compile",))))
    hf = out["transformers_trainer_step"] = isolated(lambda: hf_trainer_step(c, hf_cfg))
    out["fwd_bwd_one_micro_batch"] = isolated(lambda: fwd_bwd(c, hf_cfg))
    ours = out["train_py_recompute_none"]
    if "step_s" in hf:
        hf["tokens_per_s"] = c.sizes.micro_batches * c.sizes.seq / hf["step_s"]["median"]
        if "step_s" in ours:
            out["ours_over_transformers_step_time"] = ours["step_s"]["median"] / hf["step_s"]["median"]
    out["passed"] = not any("error" in v for v in out.values() if isinstance(v, dict))
    if "step_s" in hf and "step_s" in out["train_py_compile"]:
        out["ours_compiled_over_transformers_step_time"] = (out["train_py_compile"]["step_s"]["median"]
                                                            / hf["step_s"]["median"])
    return out


# --- the step taken apart ---------------------------------------------------------------------------------------

def breakdown(c: Check) -> dict:
    """train.py's step of the speed model (ZeRO 0, bf16 with its default fp32 gradients, clip 1.0), taken apart in one process: device bytes of
    the model states, of one micro-batch's forward (what it keeps) and at the forward + backward peak, and of the
    optimizer step; device time of the micro-batches' forward + backward, of the gradient sync and of the
    optimizer step -- each beside the planner's term for it (h200 preset)."""
    from hybrid.mesh import Mesh
    from hybrid.planner import Cluster, Layout, Workload, evaluate, hardware
    from hybrid.planner.model import ActivationProfile, Precision as PlanPrecision
    from hybrid.planner.ops import KernelProfile
    from hybrid.train_step import LocalForwardBackward, OptimizerConfig
    from hybrid.zero import Precision, ZeroConfig, ZeroOptimizer
    from models import build_model, from_hf, shift_labels
    s, dev = c.sizes, c.device
    cfg = from_hf(speed_config(c))
    mesh = Mesh.single(dev)
    model = nn.ModuleList([build_model(cfg, solo_tp(), seed=1234)]).to(dev)
    opt = ZeroOptimizer(model, mesh, ZeroConfig(stage=0, precision=Precision.BF16, accumulate_fp32_grads=True), OptimizerConfig(lr=1e-4, clip_grad=1.0))
    runner = LocalForwardBackward(model[0], dev)
    ids = torch.randint(0, cfg.vocab_size, (s.micro_batches, 1, s.seq), generator=torch.Generator().manual_seed(3))
    batches = [(x, shift_labels(x)) for x in ids]
    allocated = (lambda: torch.cuda.memory_allocated(dev)) if dev.type == "cuda" else (lambda: 0)
    phases = {"forward_backward": lambda: runner.forward_backward(batches), "finish_backward": opt.finish_backward,
              "optimizer_step": opt.step}
    times: dict[str, list[float]] = {k: [] for k in phases}
    peaks: dict[str, int] = {}
    for it in range(s.iters - s.warm + 1):  # the first step (Adam's moments created) is not timed
        opt.zero_grad()
        opt.begin_step(len(batches))
        for name, fn in phases.items():
            reset_peak(dev)
            if it:
                times[name] += timed(fn, dev, reps=1, warmup=0)
            else:
                fn()
            peaks[name] = max(peaks.get(name, 0), peak_memory(dev) or 0)
    opt.zero_grad()
    states = allocated()  # parameters, gradients, fp32 master and Adam moments
    x, y = batches[0]
    reset_peak(dev)
    loss = model[0](x.to(dev), y.to(dev))
    kept = allocated() - states
    loss.backward()
    one_mb_peak = (peak_memory(dev) or 0) - states
    work = Workload(cfg, global_batch=s.micro_batches, seq_length=s.seq, precision=PlanPrecision.MIXED,
                    activations=ActivationProfile.BF16_FLASH, kernels=KernelProfile.EAGER,
                    fp32_grads=True)  # train.py's layers and --bf16's fp32 gradients (round 22's default)
    plan = evaluate(work, Cluster(gpus=1, hw=hardware("h200")), Layout(micro_batch=1))
    rank = plan.memory.ranks[0]
    return {"measured": {"states_bytes": states, "one_micro_batch_forward_kept_bytes": kept,
                         "one_micro_batch_forward_backward_peak_above_states_bytes": one_mb_peak,
                         "peak_bytes_by_phase": peaks, "seconds_by_phase": {k: spread(v) for k, v in times.items()}},
            "planner_h200": {"states_bytes": rank.states.device, "activations_bytes": rank.activations,
                             "step_transient_bytes": rank.step_transient, "workspace_bytes": rank.workspace,
                             "forward_backward_s": plan.time.compute, "optimizer_s": plan.time.optimizer}}


# --- calibrate and the planner ----------------------------------------------------------------------------------

def calibrate(c: Check) -> dict:
    from hybrid.planner import hardware
    from hybrid.planner.calibrate import load_hardware
    from hybrid.planner.model import ActivationProfile, Shard
    from models import from_hf
    path = os.path.join(c.out, "h200_profile.json")
    backend = "gloo" if c.dry else "nccl"
    proc = python_command(c, [sys.executable, "-m", "hybrid.cli", "calibrate", "--ranks", "1", "--backend", backend,
                              *c.sizes.calib, "--out", path], {**os.environ, "PYTHONPATH": ROOT}, c.sizes.timeout_s,
                          cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"hybrid calibrate exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")
    with open(path) as f:
        profile = json.load(f)
    measured_hw, preset = load_hardware(path), hardware("h200")
    cfg = from_hf(speed_config(c))
    shard = Shard(cfg, 1, cfg.vocab_size, ActivationProfile.BF16_FLASH)
    s = c.sizes.seq
    fwd = list(shard.layer_gemms(1, s)) + [shard.head_gemm(1, s)]
    shapes = {(g.m, g.n, g.k, g.batch): g for f in fwd for g in (f, *f.backward())}
    rows = []
    for g in shapes.values():
        a = torch.randn(g.batch, g.m, g.k, device=c.device, dtype=torch.bfloat16)
        b = torch.randn(g.batch, g.k, g.n, device=c.device, dtype=torch.bfloat16)
        t = statistics.median(timed(lambda: torch.bmm(a, b), c.device, reps=10, warmup=2))
        rows.append({"m": g.m, "n": g.n, "k": g.k, "batch": g.batch, "measured_s": t,
                     "measured_tflops": g.flops / t / 1e12,
                     "preset_s": preset.gemm_seconds(g, 2), "profile_s": measured_hw.gemm_seconds(g, 2)})
        del a, b
    total = sum(r["measured_s"] for r in rows)
    return {"profile": {k: profile[k] for k in ("hardware", "matmul_tflops", "matmul_overhead_s", "measured")},
            "gemms": rows, "sum_measured_s": total,
            "sum_preset_over_measured": sum(r["preset_s"] for r in rows) / total,
            "sum_profile_over_measured": sum(r["profile_s"] for r in rows) / total,
            "log_tail": proc.stdout.strip().splitlines()[-4:]}


def planner(c: Check) -> dict:
    from hybrid.planner import Cluster, Layout, Recompute, Workload, evaluate, hardware
    from hybrid.planner.calibrate import load_hardware
    from hybrid.planner.model import ActivationProfile, Precision
    from hybrid.planner.ops import KernelProfile
    from models import from_hf
    speed_res = c.results["sections"].get("speed", {}).get("result", {})
    profile = os.path.join(c.out, "h200_profile.json")
    hws = {"h200 preset": hardware("h200")}
    if os.path.exists(profile):
        hws["measured profile"] = load_hardware(profile)
    work = Workload(from_hf(speed_config(c)), global_batch=c.sizes.micro_batches, seq_length=c.sizes.seq,
                    precision=Precision.MIXED, activations=ActivationProfile.BF16_FLASH, fp32_grads=True,
                    kernels=KernelProfile.EAGER)  # train.py's eager layers; its --bf16's fp32 gradients (round 22)
    out = {}
    for rc in (Recompute.NONE, Recompute.SELECTIVE):
        measured = speed_res.get(f"train_py_recompute_{rc.value}")
        for name, hw in hws.items():
            plan = evaluate(work, Cluster(gpus=1, hw=hw), Layout(micro_batch=1, recompute=rc))
            t, mem = plan.time, plan.memory.peak
            row = {"step_s": t.total, "compute_s": t.compute, "optimizer_s": t.optimizer,
                   "memory_bytes": mem.total, "memory_without_workspace_bytes": mem.total - mem.workspace,
                   "mfu": plan.mfu}
            if measured:
                row["step_error"] = t.total / measured["step_s"]["median"] - 1
                row["memory_error_without_workspace"] = (mem.total - mem.workspace) / measured["peak_memory_bytes"] - 1
            out[f"{rc.value} / {name}"] = row
    return out


# --- report -----------------------------------------------------------------------------------------------------

def fmt(x, digits: int = 3) -> str:
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def markdown(results: dict) -> str:
    lines = [f"# gpu_check{' (dry run on CPU: tiny sizes, measures nothing)' if results['dry_run'] else ''}", ""]
    lines += ["| section | status | seconds |", "|---|---|---|"]
    lines += [f"| {k} | {v['status']} | {v['seconds']} |" for k, v in results["sections"].items()]
    for name, sec in results["sections"].items():
        lines += ["", f"## {name}: {sec['status']}", ""]
        if sec.get("error"):
            lines += ["```", sec["error"].strip(), "```"]
        lines += ["```json", json.dumps(sec["result"], indent=1, default=fmt)[:20000], "```"]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--out", required=True, metavar="DIR", help="folder for gpu_check.json / .md, logs and the profile")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: exercises the code, measures nothing")
    p.add_argument("--only", default=None, metavar="LIST",
                   help="comma-separated sections to run, of: " + ", ".join(SECTIONS) + "; None: all")
    p.add_argument("--budget-s", type=float_in(0.0, low_open=True), default=420.0, metavar="X",  # finite: inf was taken
                   help="skip a section when less than its estimate is left of this many seconds")
    args = p.parse_args(argv)
    only = list(SECTIONS) if args.only is None else [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if not only:
        p.error(f"--only {args.only!r} names no section; give some of {','.join(SECTIONS)}, or omit it for all")
    if unknown:
        p.error(f"--only {args.only!r}: unknown section(s) {', '.join(unknown)}; choose from {','.join(SECTIONS)}")
    if not args.budget_s > 0:
        p.error(f"--budget-s must be > 0 seconds, got {args.budget_s}")
    if not args.dry_run and not torch.cuda.is_available():
        p.error("no CUDA device: run on a GPU machine, or pass --dry-run to exercise the script on CPU")
    args.out = writable_folder(p, args.out)
    args.only = only
    return args


def writable_folder(p: argparse.ArgumentParser, out: str) -> str:
    """--out as an absolute path (the calibrate section runs from the checkout), created if missing and checked
    writable before any section runs: one line otherwise."""
    if not out.strip():
        p.error("--out is empty; give a folder (created if missing)")
    out = os.path.abspath(out)
    if os.path.exists(out) and not os.path.isdir(out):
        p.error(f"--out {out!r} is a file; give a folder (created if missing)")
    try:
        os.makedirs(out, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        p.error(f"--out {out!r}: cannot write there ({e.strerror or e}); give a writable folder")
    return out


# section -> (function, seconds it needs on an H200, estimated)
PLAN = {"env": (env, 0), "ceilings": (ceilings, 10), "hf_match": (hf_match, 20), "zero_offload": (zero_offload, 20),
        "multi_rank": (multi_rank, 60), "speed": (speed, 120), "breakdown": (breakdown, 40), "calibrate": (calibrate, 40),
        "planner": (planner, 0)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    c = Check(args.out, args.dry_run, args.budget_s)
    if c.device.type == "cpu":
        torch.set_num_threads(1)
    for name in SECTIONS:
        if name in args.only:
            fn, needs = PLAN[name]
            c.run(name, fn, 0 if args.dry_run else needs)
    statuses = {k: v["status"] for k, v in c.results["sections"].items()}
    print("gpu_check: " + ", ".join(f"{k} {v}" for k, v in statuses.items())
          + f" ({time.monotonic() - c.start:.0f} s); {os.path.join(args.out, 'gpu_check.md')}", flush=True)
    return 0 if all(v == "ok" for v in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
