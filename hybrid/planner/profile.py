"""A hardware profile without the runtime: its format, the loader `hybrid plan --hardware FILE` reads it with (every
field checked, one line naming the key and the fix), what `hybrid calibrate` is configured with, and its command
line. No torch import, so `hybrid plan` starts without loading the runtime; the measuring itself (torch, process
groups) is calibrate.py, which re-exports these names and is imported only when `hybrid calibrate` runs."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from dataclasses import MISSING, dataclass, fields

from hybrid.cliutil import HelpFormatter, check_number, float_in, int_in, json_problem
from hybrid.planner.hardware import FIELD_RULES, NULLABLE_FIELDS, ZERO_OK_FIELDS, GpuKind, Hardware, hardware
from hybrid.planner.model import Precision

FORMAT = "hybrid-hardware-profile/1"
DTYPE_NAMES = ("fp32", "bf16")  # the matmul rates a profile may hold (calibrate.DTYPES: their torch dtypes)
DEFAULT_SIZES = (8, 2**16, 2**20, 2**23)  # bytes: latency, small, medium, large
GPU_MATMUL_N, GPU_COPY_BYTES = 8192, 2**30  # nccl defaults: products that fill a GPU, a copy far beyond its L2


@dataclass(frozen=True)
class CalibrationConfig:
    """What `calibrate` measures.

    Attributes:
        ranks: processes spawned (the N of the collectives; the device count of the profile). One rank (a
            machine with one GPU) measures compute and memory only: the collective fields keep `base`'s values
            and the profile lists them under "not_measured".
        backend: torch.distributed backend ("gloo" on CPU, "nccl" on GPUs).
        matmul_n: side of the square matmuls, elements.
        copy_bytes: size of the tensor copied to measure memory bandwidth, bytes.
        sizes: collective sizes S, bytes (nccl-tests' convention).
        seconds: time spent per matmul / copy measurement, seconds.
        base: preset whose unmeasured fields (network, PCIe, host memory) the profile keeps.
    """

    ranks: int = 4
    backend: str = "gloo"
    matmul_n: int = 512
    copy_bytes: int = 2**26
    sizes: tuple[int, ...] = DEFAULT_SIZES
    seconds: float = 0.5
    base: str = GpuKind.CPU.value

    def __post_init__(self) -> None:
        for flag, value in (("--ranks", self.ranks), ("--matmul-size", self.matmul_n),
                            ("--copy-bytes", self.copy_bytes)):
            check_number(flag, value, 1, integer=True)
        check_number("--seconds", self.seconds, 0, low_open=True)
        if not self.sizes or min(self.sizes) < 4:
            raise ValueError(f"--sizes must be byte counts >= 4, got {self.sizes}")
        hardware(self.base)  # ValueError naming the presets


# the top-level keys `hybrid calibrate` writes (`measure`): the loader reads format, hardware, matmul_tflops and
# matmul_overhead_s; the others are the record of what was measured
PROFILE_KEYS = ("format", "hardware", "matmul_tflops", "matmul_overhead_s", "matmul_tflops_at_matmul_n",
                "matmul_tflops_all_ranks_at_once", "matmul_tflops_one_rank_alone", "measured", "not_measured")


def load_hardware(path: str, precision: Precision | None = None) -> Hardware:
    """The Hardware of a profile written by `hybrid calibrate`. With Precision.FP32 the fp32 matmul rate is
    the peak (the profile's default peak is bf16 where it was measured). Every missing or ill-typed field is a
    ValueError naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            profile = json.load(f)  # NaN / Infinity read as floats: _check_field names the one written
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--hardware {path}: cannot read a profile ({e})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--hardware {path}: not valid JSON ({json_problem(e)})") from None
    except (ValueError, RecursionError) as e:  # nesting deeper than the parser's stack, a 5000-digit number
        raise ValueError(f"--hardware {path}: not a JSON file hybrid reads ({type(e).__name__})") from None
    if isinstance(profile, dict) and isinstance(profile.get("format"), str) and profile["format"] != FORMAT \
            and profile["format"].startswith(FORMAT.split("/")[0] + "/"):
        raise ValueError(f"--hardware {path}: a profile of format {profile['format']!r}, this hybrid reads {FORMAT}; "
                         f"re-run `hybrid calibrate --out {path}` on that machine")
    if not isinstance(profile, dict) or profile.get("format") != FORMAT:
        raise ValueError(f"--hardware {path}: not a {FORMAT} file (write one with `hybrid calibrate --out FILE`)")
    _refuse_unknown(path, "", profile, PROFILE_KEYS)  # a misspelt matmul_tflops would plan fp32 on the bf16 peak
    fields_ = profile.get("hardware")
    if not isinstance(fields_, dict):
        raise ValueError(f"--hardware {path}: no \"hardware\" object; write the profile with `hybrid calibrate`")
    known = {f.name: f for f in fields(Hardware)}
    _refuse_unknown(path, "hardware.", fields_, known)  # a misspelled optional key would be dropped, its value unused
    for name, f in known.items():
        required = f.default is MISSING and f.default_factory is MISSING
        if name not in fields_:
            if required:
                raise ValueError(f"--hardware {path}: hardware.{name} is missing; re-run `hybrid calibrate`")
            continue
        _check_field(path, name, fields_[name])
    matmul = profile.get("matmul_tflops", {})
    if not isinstance(matmul, dict):  # a string or list here was read as "no fp32 rate" and planned on
        raise ValueError(f"--hardware {path}: matmul_tflops must be an object of rates by dtype, got "
                         f"{json.dumps(matmul)}; re-run `hybrid calibrate`")
    _refuse_unknown(path, "matmul_tflops.", matmul, DTYPE_NAMES)
    for dtype, rate in matmul.items():
        _check_field(path, f"matmul_tflops.{dtype}", rate, where="")
    try:
        hw = Hardware(**{k: v for k, v in fields_.items() if k in known})
    except (TypeError, ValueError) as e:
        raise ValueError(f"--hardware {path}: {e}") from None
    if precision is Precision.FP32 and isinstance(matmul, dict) and "fp32" in matmul:
        overhead = profile.get("matmul_overhead_s", {})
        t0 = overhead.get("fp32") if isinstance(overhead, dict) else None
        if t0 is not None:
            _check_field(path, "gemm_overhead_s", t0, where="matmul_overhead_s.")
        hw = hw.with_overrides(peak_tflops=matmul["fp32"], gemm_overhead_s=t0)
    return hw


# what `hybrid calibrate` measures of a CPU beyond its rates, field by field added over the rounds (the executor's
# and the optimizer's Python costs in round 14, ...): a gloo profile written before one lacks it, and Hardware
# prices it 0 -- tiny-gpt2 on 4 ranks of this CPU: 3 % faster without round 14's, 2.9x faster (0.023 s against
# 0.068, another best layout) without any of them
CPU_COSTS = tuple(f for f in ZERO_OK_FIELDS if f not in ("gemm_overhead_s", "kernel_overhead_s"))


def missing_cpu_costs(path: str) -> list[str]:
    """The CPU_COSTS a gloo calibration's profile (hardware.compute_units set) lacks: written by an older `hybrid
    calibrate` (every profile written now holds every field). [] for a GPU profile; call after load_hardware."""
    with open(path, encoding="utf-8") as f:
        fields_ = json.load(f)["hardware"]
    return [] if fields_.get("compute_units") is None else [k for k in CPU_COSTS if k not in fields_]


def _refuse_unknown(path: str, where: str, given: dict, known) -> None:
    """A key the loader does not know is one line naming it (and the nearest known one): a hand-edited profile's
    `inter_dc_gpbs` or `matmul_tflops.fp23` would otherwise be dropped and the plan made without it."""
    for key in given:
        if key not in known:
            near = difflib.get_close_matches(str(key), [str(k) for k in known], n=1)
            hint = f"did you mean {where}{near[0]}? " if near else ""
            raise ValueError(f"--hardware {path}: unknown key {where}{key}; {hint}known: "
                             f"{', '.join(sorted(str(k) for k in known))}")


def _check_field(path: str, name: str, value, where: str = "hardware.") -> None:
    """Each number by Hardware's rule for it (None where the field may be null), the name a string: one line naming
    the file, the key and the fix."""
    if name == "name":
        if not isinstance(value, str):
            raise ValueError(f"--hardware {path}: hardware.name must be a string, got {json.dumps(value)}")
        return
    if name == "flash_rates":  # the card whose flash benchmarks shape the rate (Hardware.flash_rates)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"--hardware {path}: {where}flash_rates must be a --gpu name or null, got "
                             f"{json.dumps(value)}")
        return
    if name in NULLABLE_FIELDS and value is None:
        return
    # Hardware's own rule for the field (hardware.FIELD_RULES: the same check_number every typed config uses, so a
    # bool, NaN, an infinity or a value out of range fails here, named by its key); a matmul rate: > 0. A measured
    # latency is never 0 (the dataclass allows 0 for the planner's what-ifs; a profile never did).
    rule = FIELD_RULES.get(name, {"low": 0, "low_open": True})
    if name in ("intra_latency_s", "inter_latency_s"):
        rule = {"low": 0, "low_open": True}
    try:
        check_number(f"--hardware {path}: {where}{name}", value, **rule, show=json.dumps)
    except ValueError as e:
        raise ValueError(f"{e}; correct it, or re-run `hybrid calibrate --out {path}`") from None


# --- command line -----------------------------------------------------------------------------------

HELP = """Measure this machine and write a hardware profile (JSON) for `hybrid plan --hardware FILE` (the planner then
predicts step times and memory for this machine instead of a preset) and for `train.py --hardware FILE` (MFU
against the matmul rate measured here).

It starts --ranks processes (gloo on a CPU, nccl on GPUs), each timing matrix products, a memory copy, real
Transformer layers and the optimizer step, then collectives between them, printing each result as it comes:
about 40 s with 4 ranks on a 2-core CPU (longer on a loaded one), a minute or two on GPUs. Use as many ranks
as you will train with on one machine: on a CPU they share its cores as training ranks do. What it cannot measure
on one machine (the network between nodes, PCIe, host memory for offload) comes from the --base preset, and the
profile says which fields did.

  hybrid calibrate --out cpu.json                                  # this machine, 4 CPU ranks
  hybrid plan --model tiny-gpt2 --gpus 4 --global-batch-size 16 --seq-length 128 --hardware cpu.json \\
      --precision fp32 --emit-args                                 # the fastest layout, as train.py flags
  hybrid calibrate --ranks 1 --base h200 --out h200.json           # one GPU; the node's links from the preset

How each number is measured and fitted: docs/planner/validation.md, "Calibration"."""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `calibrate` on the `hybrid` command's subparsers (--help: HELP, for users; the module docstring
    is the implementation's)."""
    ranks = "give --ranks N: calibrate starts its own processes"
    p = subparsers.add_parser("calibrate", help="measure this machine; write a hardware profile for `hybrid plan`",
                              description=HELP, formatter_class=HelpFormatter,
                              hints={flag: f"{flag}: {ranks}" for flag in ("--nproc-per-node", "--world-size")})
    p.add_argument("--out", default="hardware.json", metavar="FILE", help="profile to write (JSON)")
    p.add_argument("--ranks", type=int_in(1, 1024), metavar="N", default=CalibrationConfig.ranks,
                   help="processes to spawn (with nccl at most the GPU count; 1: no collectives timed, the "
                        "--base preset's node kept)")
    p.add_argument("--backend", default=None, choices=("gloo", "nccl"),
                   help="gloo (CPU) or nccl (GPUs); None: nccl when CUDA is present")
    p.add_argument("--matmul-size", type=int_in(1, 2**15), metavar="N", default=None,
                   help=f"n of the n^3 matmuls; None: {CalibrationConfig.matmul_n} with gloo, {GPU_MATMUL_N} with "
                        "nccl (a GPU reaches its rate only on large products)")
    p.add_argument("--copy-bytes", type=int_in(4, 2**34), metavar="N", default=None,
                   help=f"bytes of the tensor copied to time memory bandwidth; None: {CalibrationConfig.copy_bytes} "
                        f"with gloo, {GPU_COPY_BYTES} with nccl (far beyond a GPU's L2 cache)")
    p.add_argument("--sizes", default=None,
                   help="collective sizes in bytes, comma-separated (with --ranks 2 or more); None: "
                        + ",".join(str(s) for s in DEFAULT_SIZES))
    p.add_argument("--seconds", type=float_in(0.0, 600.0, low_open=True), metavar="X",
                   default=CalibrationConfig.seconds, help="per compute measurement")
    p.add_argument("--base", default=GpuKind.CPU.value, choices=[k.value for k in GpuKind],
                   help="preset giving the fields not measured (network, PCIe, host memory)")
    p.set_defaults(func=_run)
    return p


def check_replaces_a_profile(path: str) -> None:
    """--out naming an existing file that is not a hardware profile (a typo'd `--out train.py`, a results JSON):
    ValueError before the minute of measuring, which would have replaced it. A profile, of any format version, is
    replaced, as re-calibrating is meant to. Only the first MiB is read: a profile is a few KiB."""
    if not os.path.isfile(path):
        return
    try:
        with open(path, "rb") as f:
            profile = json.loads(f.read(2**20).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        profile = None
    if not isinstance(profile, dict) or not str(profile.get("format")).startswith(FORMAT.split("/")[0] + "/"):
        raise ValueError(f"--out {path!r} exists and is not a hardware profile ({FORMAT}), which it would replace; "
                         f"give a new file name, or remove the file first")


def _run(args: argparse.Namespace) -> None:
    """`hybrid calibrate`'s body, imported only now: it loads torch (seconds; a minute under load) and starts the
    ranks. A Ctrl-C during that import is hybrid.cli's start-up line and status 130, not Python's traceback."""
    try:
        from hybrid.planner import calibrate
    except KeyboardInterrupt:
        print("hybrid: interrupted while starting, before any work: nothing was run or written", file=sys.stderr)
        raise SystemExit(130) from None
    calibrate.run(args)
