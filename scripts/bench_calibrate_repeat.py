"""How repeatable is `hybrid calibrate` for the main job's prediction? (issue 26, round 10)

    python scripts/bench_calibrate_repeat.py --runs 4 --out docs/results/calibrate_repeat.md
    python scripts/bench_calibrate_repeat.py --runs 4 --code old=/tmp/old_tree --code new=.   # alternate two trees

Runs `hybrid calibrate --ranks 8` (what scripts/bench_planner_mainjob.py runs) `--runs` times back to back -- with
several `--code NAME=DIR` trees, alternating them round by round so the machine's drift falls on all alike -- and
tabulates every profile field the main job's prediction reads, with the planner's step for the main job
(tp 2 x pp 2 x dp 2, tiny-gpt2, fp32: bench_planner_mainjob.main_job) from each profile. Then, per field, how far
the prediction moves when that field alone takes each run's value and the others their median over the runs
(`sensitivity`): which fields swing, and which of them move the prediction.

Not a timed test: a script that writes a results file. The load average is printed with every calibration.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

# Profile fields the main job's plan reads (hardware.<name>; fp32's rate and t0 replace peak / gemm_overhead_s)
FIELDS = ("peak_tflops", "gemm_overhead_s", "hbm_tbps", "elementwise_tbps", "layer_forward_overhead_s",
          "layer_backward_overhead_s", "tp_layer_forward_overhead_s", "tp_layer_backward_overhead_s",
          "intra_node_gbps", "intra_latency_s", "collective_cpu_s", "p2p_cpu_s", "comm_cpu_s_per_byte")


def _one_line_parser():
    """hybrid.cliutil's OneLineParser from this checkout, imported when parsing (`python scripts/...`)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from hybrid.cliutil import OneLineParser
    return OneLineParser


def fields_of(profile: dict) -> dict[str, float]:
    """The FIELDS of a profile as the fp32 plan reads them (load_hardware(..., Precision.FP32))."""
    hw = profile["hardware"]
    out = {k: hw.get(k) or 0.0 for k in FIELDS}
    out["peak_tflops"] = profile["matmul_tflops"]["fp32"]
    out["gemm_overhead_s"] = profile.get("matmul_overhead_s", {}).get("fp32", hw["gemm_overhead_s"])
    return out


def with_fields(profile: dict, values: dict[str, float]) -> dict:
    """A copy of `profile` with FIELDS set to `values` (fp32's rate and t0 where the plan reads them)."""
    p = json.loads(json.dumps(profile))
    for k, v in values.items():
        p["hardware"][k] = v
    p["matmul_tflops"]["fp32"] = values["peak_tflops"]
    p.setdefault("matmul_overhead_s", {})["fp32"] = values["gemm_overhead_s"]
    return p


def plan(profile: dict) -> dict[str, float]:
    """bench_planner_mainjob.planned_cpu of a profile dict: the main job's step, makespan, compute and comm CPU."""
    from bench_planner_mainjob import planned_cpu
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(profile, f)
    try:
        return planned_cpu(f.name)
    finally:
        os.unlink(f.name)


def sensitivity(profiles: list[dict]) -> dict[str, tuple[float, float]]:
    """Per field: (min, max) of the main job's planned step with that field alone at each run's value and every
    other field at its median over the runs."""
    values = [fields_of(p) for p in profiles]
    median = {k: statistics.median(v[k] for v in values) for k in FIELDS}
    out = {}
    for k in FIELDS:
        steps = [plan(with_fields(profiles[0], median | {k: v[k]}))["step"] for v in values]
        out[k] = (min(steps), max(steps))
    out["(all at the median)"] = (plan(with_fields(profiles[0], median))["step"],) * 2
    return out


def spread(xs: list[float]) -> str:
    """'median [min, max] (max/min - 1 %)'"""
    lo, hi = min(xs), max(xs)
    return f"{statistics.median(xs):.4g} [{lo:.4g}, {hi:.4g}] ({100 * (hi / lo - 1) if lo > 0 else 0:.0f} %)"


def calibrate(code: str, out: str, ranks: int) -> tuple[float, float, float]:
    """`hybrid calibrate --ranks N --out OUT` from tree `code`: (seconds, load average before, after)."""
    env = dict(os.environ, PYTHONPATH=code, OMP_NUM_THREADS="1")
    load = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "hybrid.cli", "calibrate", "--ranks", str(ranks), "--out", out],
                          env=env, cwd=code, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"calibrate from {code} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return time.perf_counter() - start, load, os.getloadavg()[0]


def report(rows: dict[str, list[dict]], ranks: int) -> list[str]:
    """The Markdown tables: per tree, every run's fields and planned step; the spread per field; the sensitivity."""
    lines = [f"# calibrate's repeatability on the main job ({ranks} gloo ranks, {os.cpu_count()} CPUs, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", ""]
    for name, runs in rows.items():
        lines += [f"## {name}", "", "| run | seconds | load before/after | " + " | ".join(FIELDS)
                  + " | planned step s | makespan s | comm CPU s |", "|" + "---|" * (len(FIELDS) + 6)]
        for i, r in enumerate(runs):
            f, p = fields_of(r["profile"]), plan(r["profile"])
            lines.append(f"| {i + 1} | {r['seconds']:.0f} | {r['load'][0]:.2f}/{r['load'][1]:.2f} | "
                         + " | ".join(f"{f[k]:.4g}" for k in FIELDS)
                         + f" | {p['step']:.4g} | {p['makespan']:.4g} | {p['comm']:.4g} |")
        steps = [plan(r["profile"])["step"] for r in runs]
        lines += ["", f"planned step: {spread(steps)}; calibrate seconds: "
                  f"{spread([r['seconds'] for r in runs])}", "", "| field | median [min, max] (spread) | "
                  "planned step with this field alone varying: min - max |", "|---|---|---|"]
        sens = sensitivity([r["profile"] for r in runs])
        values = [fields_of(r["profile"]) for r in runs]
        for k in FIELDS:
            lo, hi = sens[k]
            lines.append(f"| {k} | {spread([v[k] for v in values])} | {lo:.4g} - {hi:.4g} "
                         f"({100 * (hi / lo - 1):.1f} %) |")
        lines.append(f"| all fields at their medians | | {sens['(all at the median)'][0]:.4g} |")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    from hybrid.cliutil import int_in
    p = _one_line_parser()(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int_in(2, 100), default=4, help="calibrations per tree")
    p.add_argument("--ranks", type=int_in(2, 1024), default=8, help="calibrate --ranks (the main job's 8)")
    p.add_argument("--code", action="append", metavar="NAME=DIR",
                   help="a source tree to calibrate with (repeatable; alternated run by run); default: this one")
    p.add_argument("--keep", metavar="DIR", help="keep the profiles here (NAME_run<i>.json)")
    p.add_argument("--out", help="write the Markdown report here")
    p.add_argument("--profiles", metavar="DIR", help="tabulate the profiles in DIR (NAME_run<i>.json), no calibration")
    args = p.parse_args(argv)
    p.check_out("--out", args.out)
    for c in args.code or ():
        if "=" not in c or not os.path.isdir(os.path.join(c.split("=", 1)[1], "hybrid")):
            p.error(f"--code {c}: give NAME=DIR, DIR a source tree holding hybrid/ (e.g. old=/tmp/old_tree)")
    codes = dict(c.split("=", 1) for c in args.code) if args.code else {"this tree": ROOT}
    rows: dict[str, list[dict]] = {name: [] for name in codes}
    if args.profiles:
        for name in codes:
            for i in range(args.runs):
                with open(os.path.join(args.profiles, f"{name}_run{i + 1}.json")) as f:
                    rows[name].append({"profile": json.load(f), "seconds": float("nan"), "load": (0.0, 0.0)})
    else:
        keep = args.keep or tempfile.mkdtemp(prefix="calrepeat")
        os.makedirs(keep, exist_ok=True)
        for i in range(args.runs):
            for name, code in codes.items():
                out = os.path.join(keep, f"{name}_run{i + 1}.json")
                seconds, before, after = calibrate(os.path.abspath(code), out, args.ranks)
                with open(out) as f:
                    profile = json.load(f)
                rows[name].append({"profile": profile, "seconds": seconds, "load": (before, after)})
                print(f"{name} run {i + 1}: {seconds:.0f} s, load {before:.2f} -> {after:.2f}, planned step "
                      f"{plan(profile)['step']:.4g} s", flush=True)
    text = "\n".join(report(rows, args.ranks)) + "\n"
    print(text)
    if args.out:
        from hybrid.cliutil import write_text
        write_text(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
