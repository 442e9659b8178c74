"""README's planner chain, run as written in a shell: `hybrid calibrate` measures this machine, `hybrid plan` plans
the run's shapes on it and emits train.py's flags, and train.py runs exactly that layout -- its start-up lines show
the planned layout and the planner's figures for it in the units its log lines measure (ms/iter, peak RSS MiB),
and the plot is drawn. Also: `hybrid calibrate --help` is written for users."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_chain() -> str:
    """The README line that calibrates, plans with --emit-args and trains what the plan emits."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = [ln.strip() for ln in f if ln.startswith("hybrid calibrate --out cpu.json && torchrun")]
    assert len(lines) == 1, lines
    return lines[0]


def test_the_chain_is_one_line_that_trains_what_the_plan_emits():
    line = readme_chain()
    plan = re.search(r"\$\((hybrid plan [^)]*)\)", line).group(1)
    assert "--emit-args" in plan and "--hardware cpu.json" in plan
    train = line.split("scripts/train.py", 1)[1]
    emitted = ("--seq-length", "--global-batch-size", "--micro-batch-size", "--tensor-model-parallel-size",
               "--pipeline-model-parallel-size", "--zero-stage", "--model")
    assert not any(f in train.replace(plan, "") for f in emitted), "the layout and shapes come from the plan alone"
    # the run's shapes: the plan's --seq-length is what train.py runs (train.py's default would be 128 anyway)
    assert "--seq-length 128" in plan and "--precision fp32 --activation-profile fp32-flash" in plan


@pytest.fixture(scope="module")
def chain_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("readme_chain")
    os.symlink(os.path.join(ROOT, "scripts"), d / "scripts")
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    line = readme_chain()
    p = subprocess.run(["bash", "-c", line], cwd=d, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    plan = re.search(r"\$\((hybrid plan [^)]*)\)", line).group(1)
    return p.stdout, shlex.split(_emitted(plan, d)), d


def _emitted(plan: str, cwd) -> str:
    """What the chain's `hybrid plan ... --emit-args` printed: the same command, in this process (its parser and
    its search, on the chain's cpu.json) -- not a second interpreter's start-up and imports (~4 s of CPU)."""
    import contextlib
    import io

    import hybrid.cli
    out, here = io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out):
            hybrid.cli.main(shlex.split(plan)[1:])
    finally:
        os.chdir(here)
    return out.getvalue()


@pytest.mark.slow  # the README line in a real shell: calibrate, plan, torchrun (a new interpreter's RSS)
def test_the_chain_runs_as_written_and_trains_the_planned_layout(chain_run):
    out, flags, d = chain_run
    assert "calibrate: wrote cpu.json" in out
    f = dict(zip(flags[::2], flags[1::2]))
    tp, pp, mb = (int(f[k]) for k in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                                      "--micro-batch-size"))
    head = re.search(r"^hybrid: tiny-gpt2 .* \| tp (\d+) .*x dp (\d+) on 4 cpu ranks \| global batch (\d+) = micro "
                     r"(\d+) .* \| seq (\d+)", out, re.M)
    assert head, out
    assert (int(head.group(1)), int(head.group(2)), int(head.group(3)), int(head.group(4)), head.group(5)) == \
        (tp, 4 // (tp * pp), int(f["--global-batch-size"]), mb, f["--seq-length"])
    assert re.search(rf"^zero: stage {f['--zero-stage']} ", out, re.M), out
    assert (d / "run.png").stat().st_size > 0


@pytest.mark.slow  # the README line in a real shell: calibrate, plan, torchrun (a new interpreter's RSS)
def test_the_run_prints_the_plans_figures_in_the_units_it_measures(chain_run):
    """The planner's line for the layout (ms/iter, tokens/s, peak RSS MiB of the fullest rank), printed once; the
    measured peak RSS (the metrics file's, max over ranks) is of the same kind: the planned figure is the rank's
    tensors plus the process before its model, which on this CPU is most of it -- within 25 %, the run's
    gloo buffers, autograd graph and allocator slack being what the planner leaves out."""
    out, _, d = chain_run
    lines = re.findall(r"^planner: this layout on cpu\.json: ([\d.,]+) ms/iter, ([\d,]+) tokens/s, peak RSS "
                       r"([\d,]+) MiB on the fullest rank", out, re.M)
    assert len(lines) == 1, out
    planned_mib = float(lines[0][2].replace(",", ""))
    records = [json.loads(x) for x in open(d / "run.jsonl")]
    measured_mib = max(r["peak_rss_bytes"] for r in records if "peak_rss_bytes" in r) / 2**20
    assert 0.75 * measured_mib <= planned_mib <= 1.25 * measured_mib, (planned_mib, measured_mib)
    assert re.search(r"\| +[\d.]+ ms/iter \|", out) and "TFLOP/s/device" in out


def test_calibrate_help_is_written_for_users(capsys):
    """What it does, how long, what to run next, where the method is documented; no implementation notes; its
    example `hybrid plan` line is one `hybrid plan` accepts."""
    import hybrid.cli
    with pytest.raises(SystemExit):
        hybrid.cli.main(["calibrate", "--help"])
    text = capsys.readouterr().out
    for note in ("LAYER_SHAPES", "fit_layer", "nccl-tests", "least squares", "busbw", "hardware.py", "time.py"):
        assert note not in text, note
    assert "about 40 s with 4 ranks on a 2-core CPU" in text and "docs/planner/validation.md" in text and "--hardware FILE" in text
    example = re.search(r"^  (hybrid plan .*?)\s+#", text.replace("\\\n", ""), re.M | re.S).group(1)
    args = hybrid.cli.build_parser().parse_args(shlex.split(example)[1:])
    assert args.emit_args and args.hardware == "cpu.json"
