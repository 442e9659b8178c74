"""Candidate causes of the GPT-3 175B miss (issue 26, round 13), each priced on every row it would move.

    python -m hybrid.planner.causes          # docs/planner/rounds.md "Round 13: GPT-3 175B, the candidate causes"
    python -m hybrid.planner.causes 0 2      # only those candidates (their index in candidates())
    python -m hybrid.planner.causes --nemo-settings   # NeMo 24.07's GPT-3 row with the DGXC YAML's settings
    python -m hybrid.planner.causes --one-layer-chunks   # NeMo's one-layer-a-chunk rows at the two fixed-cost probes

The DGXC GPT-3 175B rows (published_recipes.py, t 4 p 8, s 2048; v 12 at v24.11.1, v 6 at v25.04.01) are all
optimistic, +10 to +26 %. Each candidate cause is a knob on the planner's model that can only slow a plan down
(`Candidate`): a fixed cost per pipeline hand-off, a fixed cost per layer pass, a slower GEMM asymptote, slower TP
collectives, slower memory-bound kernels. For each this module prints

* the knob's value that zeroes each GPT-3 row's miss (`implied`): the four DGXC tables' smallest-GPU columns and
  NeMo 24.07's two GPT-3 175B rows (published_more, planned as NeMo's table states them). A real cause has one
  value for all six; values that differ by multiples say the rows are not missing that cost;
* every affected check row's error at the median of those values (`priced`): the GPT-3 rows, the other DGXC
  tables, NeMo 24.07 (its other rows), Megatron-Core's weak scaling and, for the pipeline hand-off, the A100
  pipelines (Korthikanti, Narayanan; same Megatron schedule). A cause that fixes GPT-3 must leave these within
  +-15 %.

Nothing here changes the model: the value is a probe tuned to the GPT-3 rows, which are CHECK rows, so it may
never ship (no FIT row has a pipeline, an s 2048 GPT block on H100, or a Megatron-TE H100 step:
published.Role). A candidate that survives would have to be priced from a measurement, not from these rows.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from hybrid.planner import time as planner_time
from hybrid.planner.fit import solve
from hybrid.planner.hardware import Hardware
from hybrid.planner.published import PublishedRun, korthikanti_runs, narayanan_runs
from hybrid.planner.published_more import Result, evaluate, mcore_weak_runs, nemo_runs, summary_line


@contextmanager
def _hardware_changed(change: Callable[[Hardware], Hardware]) -> Iterator[None]:
    """Every PublishedRun (and ContextRun) plans on change(its preset) inside the block."""
    original = PublishedRun.hardware
    PublishedRun.hardware = lambda run: change(original(run))
    try:
        yield
    finally:
        PublishedRun.hardware = original


@contextmanager
def _handoff_cost(c: float) -> Iterator[None]:
    """Each stage's forward and backward pay `c` seconds per edge it hands off on or receives from (the first and
    last stage one, the others two): a rank-busy cost per (micro-batch, chunk) hand-off, as a blocking message's
    transfer is priced (time._stages), on top of the transfer itself."""
    original = planner_time._stages

    def stages(work, cluster, layout, ctx=None):  # time._stages' signature (ctx: the caller's _context)
        st = original(work, cluster, layout, ctx)
        n = layout.pp * layout.v
        if layout.pp == 1 or c == 0:
            return st
        edges = [(s > 0) + (s < n - 1) for s in range(n)]
        t = st.times
        times = replace(t, forward=tuple(f + c * k for f, k in zip(t.forward, edges)),
                        backward=tuple(b + c * k for b, k in zip(t.backward, edges)))
        extra = max(sum(2 * c * edges[s] for s in layout.rank_stages(r)) for r in range(layout.pp))
        return replace(st, times=times, busy=st.busy + extra, p2p=st.p2p + extra)

    planner_time._stages = stages
    try:
        yield
    finally:
        planner_time._stages = original


@dataclass(frozen=True)
class Candidate:
    """One suspected cause as a knob x (x = `none`: today's model; moving towards `worst` slows every plan).

    Attributes:
        name, unit: what it is, and the unit x is printed in (`scale` x the knob's value).
        apply: x -> a context manager inside which the planner prices with the cause at x.
        none, worst: the knob's neutral value and the far end of the range searched for a zero miss.
    """

    name: str
    unit: str
    scale: float
    apply: Callable[[float], object]
    none: float
    worst: float

    def error(self, run: PublishedRun, x: float) -> float | None:
        with self.apply(x):
            return evaluate(run).error

    def implied(self, run: PublishedRun) -> float | None:
        """x at which the row's error is 0 (None: not reached within [none, worst])."""
        if (self.error(run, self.worst) or 0.0) > 0:
            return None
        return solve(lambda x: self.error(run, x), 0.0, self.none, self.worst, iters=8)


def candidates() -> tuple[Candidate, ...]:
    return (
        Candidate("a fixed cost per pipeline hand-off (each stage edge, forward and backward)", "ms", 1e3,
                  _handoff_cost, 0.0, 5e-3),
        Candidate("a fixed cost per layer pass (forward and backward each, every layer, every micro-batch)", "ms",
                  1e3, lambda x: _hardware_changed(lambda hw: hw.with_overrides(layer_forward_overhead_s=x,
                                                                                layer_backward_overhead_s=x)),
                  0.0, 5e-3),
        Candidate("a slower GEMM asymptote (x today's, BF16 and FP8 alike)", "x", 1.0,
                  lambda x: _hardware_changed(lambda hw: hw.with_overrides(
                      compute_efficiency=hw.compute_efficiency * x)), 1.0, 0.4),
        Candidate("slower TP collectives (NVLink bandwidth / x, latency x x)", "x", 1.0,
                  lambda x: _hardware_changed(lambda hw: hw.with_overrides(
                      intra_node_gbps=hw.intra_node_gbps / x, intra_latency_s=hw.intra_latency_s * x)), 1.0, 12.0),
        Candidate("slower memory-bound kernels (their rate / x, per-kernel latency x x)", "x", 1.0,
                  lambda x: _hardware_changed(lambda hw: hw.with_overrides(
                      elementwise_tbps=hw.elementwise_bytes_per_s / 1e12 / x,
                      kernel_overhead_s=hw.kernel_overhead_s * x)), 1.0, 30.0),
    )


def gpt3_probe_rows() -> list[PublishedRun]:
    """The rows the knob is solved on: each DGXC GPT-3 table's smallest-GPU column, NeMo 24.07's GPT-3 175B rows."""
    from hybrid.planner.published_recipes import TABLES, table_runs
    return ([table_runs(t)[0] for t in TABLES if t.model == "GPT3-175B"]
            + [r for r in nemo_runs() if "GPT3-175B" in r.name])


def affected_groups() -> list[tuple[str, list[PublishedRun]]]:
    """The check rows each knob moves, grouped as docs/planner/rounds.md reports them."""
    from hybrid.planner.published_recipes import TABLES, table_runs
    return [("DGXC GPT-3 175B", [r for t in TABLES if t.model == "GPT3-175B" for r in table_runs(t)]),
            ("DGXC other models, pipelined (pp > 1)",
             [r for t in TABLES if t.model != "GPT3-175B" for r in table_runs(t) if r.space.pp != (1,)]),
            ("DGXC other models, pp 1", [r for t in TABLES for r in table_runs(t) if r.space.pp == (1,)]),
            ("NeMo 24.07 / Megatron-Bridge, not GPT-3 175B", [r for r in nemo_runs() if "GPT3-175B" not in r.name]),
            ("Megatron-Core weak scaling", mcore_weak_runs()),
            ("A100 Megatron pipelines (Korthikanti, Narayanan), pp > 1",
             [r for r in korthikanti_runs() + narayanan_runs() if r.space.pp != (1,)])]


def _fmt(x: float | None, c: Candidate) -> str:
    return "not reached" if x is None else f"{x * c.scale:.3g} {c.unit}"


def report(emit: Callable[[str], None] = print, only: tuple[int, ...] = ()) -> None:
    """Each candidate's implied values and the affected rows' summaries at their median, emitted line by line
    (`only`: those candidates, by their index in candidates())."""
    probes, groups = gpt3_probe_rows(), affected_groups()
    for i, c in enumerate(candidates()):
        if only and i not in only:
            continue
        out: list[str] = []
        implied = [c.implied(r) for r in probes]
        found = [x for x in implied if x is not None]
        out.append(f"#### {c.name}\n")
        out.append("| GPT-3 175B row | today | x that zeroes it |\n|---|---|---|")
        out += [f"| {r.name} | {100 * c.error(r, c.none):+.1f} % | {_fmt(x, c)} |" for r, x in zip(probes, implied)]
        if not found:
            emit("\n".join(out) + "\n\nno value within the range searched zeroes any row\n")
            continue
        x = statistics.median(found)
        out.append(f"\nat the median, x = {_fmt(x, c)} (a probe, tuned to check rows; never shipped):\n")
        emit("\n".join(out))
        with c.apply(x):
            for what, rows in groups:
                emit(summary_line(what, [evaluate(r) for r in rows]))
        emit("")


def results_today() -> list[tuple[str, list[Result]]]:
    return [(what, [evaluate(r) for r in rows]) for what, rows in affected_groups()]


def nemo_settings_what_if() -> list[str]:
    """NeMo 24.07's GPT-3 175B 128-GPU row (published_more, the planner's picks) with each of the DGXC YAML's settings
    (delayed FP8 scaling, bf16 gradients, the overlapped reduction) and all three: its error each way."""
    from hybrid.planner.layout import Workload
    from hybrid.planner.ops import Fp8Scaling
    run = next(r for r in nemo_runs() if "GPT3-175B" in r.name)
    changes = (("as planned", {}), ("delayed scaling", {"fp8_scaling": Fp8Scaling.DELAYED}),
               ("bf16 gradients", {"fp32_grads": False}), ("overlapped reduction", {"overlap_grad_reduce": True}))
    changes += (("all three", {k: v for _, c in changes for k, v in c.items()}),)
    out = []
    for what, change in changes:
        work: Workload = replace(run.workload, **change)
        out.append(f"{run.name}, {what}: {100 * evaluate(replace(run, workload=work)).error:+.1f} %")
    return out


# the medians report() prints for candidates 0 and 1 (docs/planner/rounds.md "Round 13"): probes, never shipped
HANDOFF_PROBE_S, LAYER_PASS_PROBE_S = 0.283e-3, 0.371e-3


def one_layer_chunk_what_if() -> list[str]:
    """NeMo 24.07's rows with one layer a virtual stage or close (Llama2-13B / 70B, Nemotron-22B / 340B): their error
    today, with the hand-off probe and with the layer-pass probe."""
    hand_off, layer_pass = candidates()[:2]
    out = []
    for run in (r for r in nemo_runs() if any(k in r.name for k in ("LLAMA2-70B", "LLAMA2-13B", "Nemotron-22B",
                                                                       "Nemotron-340B"))):
        today = evaluate(run)
        with hand_off.apply(HANDOFF_PROBE_S):
            a = evaluate(run).error
        with layer_pass.apply(LAYER_PASS_PROBE_S):
            b = evaluate(run).error
        out.append(f"| {run.name} | {today.layout} | {100 * today.error:+.1f} % | {100 * a:+.1f} % | "
                   f"{100 * b:+.1f} % |")
    return out


def parse_args(argv: list[str] | None = None):
    """The module's command line (its docstring's four forms). An index that is no candidate's is one line naming
    the range: `int()` of "--help" was a traceback, and 9 printed nothing and exited 0."""
    import argparse
    from hybrid.cliutil import OneLineParser
    n = len(candidates())
    p = OneLineParser(prog="python -m hybrid.planner.causes", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("only", nargs="*", type=int, metavar="I", help=f"only these candidates (0 to {n - 1}); none: all, "
                   "after today's summaries")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--nemo-settings", action="store_true", help="NeMo 24.07's GPT-3 row with the DGXC YAML's "
                      "settings")
    what.add_argument("--one-layer-chunks", action="store_true", help="NeMo's one-layer-a-chunk rows at the two "
                      "fixed-cost probes")
    args = p.parse_args(argv)
    if bad := [i for i in args.only if not 0 <= i < n]:
        p.error(f"candidate {bad[0]} does not exist: give indices 0 to {n - 1} (none: all {n})")
    if args.only and (args.nemo_settings or args.one_layer_chunks):
        p.error("candidate indices select rows of the default report; give them without --nemo-settings / "
                "--one-layer-chunks")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.nemo_settings:
        print("\n".join(nemo_settings_what_if()))
        return
    if args.one_layer_chunks:
        print("\n".join(one_layer_chunk_what_if()))
        return
    only = tuple(args.only)  # candidate indices; none: all, after today's summaries
    if not only:
        print("today (no knob):\n")
        for what, results in results_today():
            print(summary_line(what, results))
        print(flush=True)
    report(lambda line: print(line, flush=True), only)


if __name__ == "__main__":
    main()
