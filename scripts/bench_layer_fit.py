"""How repeatable is calibrate's layer fit? (issue 26, round 11)

    python scripts/bench_layer_fit.py --reps 10 [--profile PROFILE.json] [--out FILE.md]

One process, one intra-op thread, the CPU clock (as calibrate's rank 0 times its probes alone): the fp32 GEMM curve
once (calibrate.curve_sizes, as calibrate fits it), then `--reps` rounds, each timing the layers both fits read
(calibrate.layer_seconds, `--seconds` a measurement):

* old: the round-10 probe, (4, 128, 384, 6) and (1, 32, 384, 6), solved exactly for a rate and a fixed cost
  (calibrate.two_shape_solve);
* new: calibrate.CPU_PROBE -- the per-pass layer PASS_SHAPE timed, the rate from LAYER_SHAPES net of it
  (calibrate.fit_layer).

Per fit: each round's (rate, forward fixed, backward fixed), their median [min, max] and sd; with `--profile` (an
8-rank `hybrid calibrate` profile) also the main job's planned step (bench_planner_mainjob.planned_cpu) with those
three fields from each round and the rest of the profile as it is -- what the layer fit alone does to the prediction.

Not a timed test: a script that prints (and writes) a Markdown table. The load average goes with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
OLD_SHAPES = ((4, 128, 384, 6), (1, 32, 384, 6))


def curve_hw(seconds: float):
    """The cpu preset with the fp32 GEMM curve measured now (rank 0 alone, CPU clock), as make_profile builds it."""
    import torch

    from hybrid.planner import calibrate as C
    from hybrid.planner.hardware import hardware
    cpu = torch.device("cpu")
    points = [(2.0 * n**3, 2.0 * n**3 / C.matmul_flops(torch.float32, n, seconds / 2, cpu, C.CPU_CLOCK))
              for n in C.curve_sizes(512)]
    rate, t0 = C.fit_gemm_curve(points)
    return hardware("cpu").with_overrides(peak_tflops=rate / 1e12, compute_efficiency=1.0, gemm_overhead_s=t0)


def one_round(hw, seconds: float) -> dict[str, tuple[float | None, float, float]]:
    """Both fits on layers timed now."""
    import dataclasses

    import torch

    from hybrid.planner import calibrate as C
    cpu, f32 = torch.device("cpu"), torch.float32

    def timed(shape):
        return C.layer_seconds(shape, seconds, cpu, f32, C.CPU_CLOCK)
    old_probe = dataclasses.replace(C.CPU_PROBE, shapes=OLD_SHAPES, pass_shape=None)
    old = C.two_shape_solve(hw, [timed(s) for s in OLD_SHAPES], old_probe)
    per_pass = timed(C.CPU_PROBE.pass_shape)
    new = C.fit_layer(hw, [timed(s) for s in C.CPU_PROBE.shapes], per_pass)
    return {"old": old, "new": new}


def step_with(profile: dict, fit: tuple[float | None, float, float]) -> float:
    """The main job's planned step with the profile's layer fields replaced by `fit`."""
    from bench_calibrate_repeat import plan
    p = json.loads(json.dumps(profile))
    rate, f, b = fit
    p["hardware"].update(elementwise_tbps=rate / 1e12 if rate else None, layer_forward_overhead_s=f,
                         layer_backward_overhead_s=b)
    return plan(p)["step"]


def summary(xs: list[float], scale: float) -> str:
    """'median [min, max], sd %' of xs x scale."""
    xs = [x * scale for x in xs]
    mean = statistics.fmean(xs)
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return (f"{statistics.median(xs):.3g} [{min(xs):.3g}, {max(xs):.3g}], sd {100 * sd / mean if mean else 0:.0f} %")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, checked before any timing: bad input is one line naming the flag."""
    from hybrid.cliutil import OneLineParser, check_output_file, float_in, int_in
    p = OneLineParser(prog="bench_layer_fit.py", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int_in(2, 1000), default=10, help="rounds of timing both fits' layers")
    p.add_argument("--seconds", type=float_in(0.0, 60.0, low_open=True), default=0.5,
                   help="seconds a measurement (calibrate's --seconds)")
    p.add_argument("--profile", help="an 8-rank calibrate profile: plan the main job with each round's fit")
    p.add_argument("--out", help="write the Markdown table here")
    args = p.parse_args(argv)
    try:
        if args.out:
            check_output_file("--out", args.out)
        if args.profile:
            from hybrid.planner.calibrate import load_hardware
            load_hardware(args.profile)  # ValueError naming the file and the field
    except ValueError as e:
        p.error(str(e).replace("--hardware", "--profile", 1))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    profile = None
    if args.profile:
        with open(args.profile) as f:
            profile = json.load(f)
    import torch
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    hw = curve_hw(args.seconds)
    rounds = []
    for i in range(args.reps):
        r = one_round(hw, args.seconds)
        rounds.append(r)
        print(f"round {i + 1}: " + "; ".join(
            f"{k} {(v[0] or 0) / 1e9:.2f} GB/s, {v[1] * 1e3:.3f} / {v[2] * 1e3:.3f} ms"
            + (f", step {step_with(profile, v):.4g} s" if profile else "") for k, v in r.items()), flush=True)
    lines = [f"Layer fit, {args.reps} rounds, {args.seconds} s a measurement, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {load:.2f} before, "
             f"{os.getloadavg()[0]:.2f} after; GEMM curve {hw.peak_tflops * 1e3:.1f} GFLOP/s, "
             f"t0 {hw.gemm_overhead_s * 1e6:.1f} us", "",
             "| fit | rate GB/s | forward fixed ms | backward fixed ms | fixed clamped at 0 |"
             + (" main job's planned step s |" if profile else ""),
             "|---|---|---|---|---|" + ("---|" if profile else "")]
    for k in ("old", "new"):
        fits = [r[k] for r in rounds]
        zeros = sum(1 for _, f, b in fits if f == 0 or b == 0)
        row = (f"| {k} | {summary([x[0] or 0.0 for x in fits], 1e-9)} | {summary([x[1] for x in fits], 1e3)} | "
               f"{summary([x[2] for x in fits], 1e3)} | {zeros} of {len(fits)} |")
        if profile:
            row += f" {summary([step_with(profile, x) for x in fits], 1.0)} |"
        lines.append(row)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        from hybrid.cliutil import write_text
        write_text(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
