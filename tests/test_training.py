"""Parallel training equals single-process training, and the main job's flags are checked.

The single-process references run in the test process at one intra-op thread, as every rank does
(tests/suite_threads.py: at torch's default two threads their OpenMP workers spin on the suite's shared cores); each
is compared within RTOL (+ ATOL), never bit for bit, so the thread count's summation order is inside every bound."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys

import pytest
import torch

from hybrid import testing
from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.dp import GradAverager
from hybrid.mesh import Mesh, ParallelDims
from hybrid.testing import run_distributed
from hybrid.tp import TPContext, gather_full, spec_of
from hybrid.train_step import OptimizerConfig, train_step
from models import build_model, load_config
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import reference_losses  # noqa: E402
import train as train_script  # noqa: E402

STEPS, GLOBAL, MICRO, SEQ = 4, 8, 2, 32
RTOL = 1e-5
ATOL = 1e-7


def _train(mesh: Mesh, model_name: str, sp: bool = False):
    """STEPS AdamW steps on the same global batches; returns losses and full weights."""
    cfg = load_config(model_name)
    model = build_model(cfg, TPContext(mesh.tp, sequence_parallel=sp), seed=7)
    opt_cfg = OptimizerConfig(lr=0.05, warmup_iters=1, train_iters=STEPS)
    # SGD, not Adam: Adam's early steps are ~lr*sign(g), so elements whose gradient is at rounding
    # level (GPT-2's key bias has gradient exactly 0: softmax ignores a per-query shift) flip with
    # summation order -- even between two single-process runs that differ only in accumulation.
    # SGD keeps weights a smooth function of the gradients, so 1e-5 tests the parallel math.
    opt = torch.optim.SGD(model.parameters(), lr=opt_cfg.lr, momentum=0.9)
    averager = GradAverager(model.parameters(), mesh.dp, bucket_bytes=64 * 1024)  # several buckets
    spec = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp)
    corpus = load_corpus()
    losses = [train_step(model, micro_batches(corpus, spec, 3, it, mesh.coords.dp), opt, mesh, averager,
                         lr=opt_cfg.lr_at(it)) for it in range(STEPS)]
    weights = {n: gather_full(p.detach(), spec_of(p), mesh.tp) for n, p in model.named_parameters()}
    return losses, weights


def _parallel(rank, world, model_name, tp, sp):
    return _train(Mesh.build(ParallelDims.from_world(world, tp=tp)), model_name, sp)


@pytest.mark.parametrize("model_name,tp,sp", [("tiny-gpt2", 2, False), ("tiny-llama", 2, True)])
@pytest.mark.slow
def test_tp2_dp2_training_matches_single_process(model_name, tp, sp):
    ref_losses, ref_weights = _train(Mesh.single(), model_name)
    results = run_distributed(_parallel, 4, args=(model_name, tp, sp))
    for losses, weights in results:
        for a, b in zip(losses, ref_losses):
            assert abs(a - b) <= RTOL * abs(b), f"loss {a} != {b}"
        for name, w in weights.items():
            # relative to the tensor's largest entry, plus ATOL for tensors that are ~0 in exact
            # arithmetic (GPT-2's key bias: gradient identically zero, so only rounding moves it)
            ref = ref_weights[name]
            err = (w - ref).abs().max().item()
            assert err <= RTOL * ref.abs().max().item() + ATOL, f"{name}: abs err {err:.2e}"
    assert ref_losses[-1] < ref_losses[0]


@pytest.mark.parametrize("argv,world,message", [
    (["--tensor-model-parallel-size", "3"], 4, "--tensor-model-parallel-size"),
    (["--tensor-model-parallel-size", "8"], 8, "does not divide the 4 attention heads"),
    (["--global-batch-size", "10", "--micro-batch-size", "4"], 2, "--global-batch-size 10 must be a multiple"),
    (["--seq-length", "1000"], 1, "--seq-length 1000 exceeds"),
    (["--sequence-parallel", "--tensor-model-parallel-size", "2", "--seq-length", "33"], 2, "--sequence-parallel"),
    (["--model", "no-such-model"], 1, "--model 'no-such-model'"),
    (["--micro-batch-size", "0"], 1, "--micro-batch-size must be >= 1"),
    (["--pipeline-model-parallel-size", "3"], 8, "--pipeline-model-parallel-size (3)"),
    (["--pipeline-model-parallel-size", "8"], 8, "exceeds the 4 layers"),
    (["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "3"], 2,
     "--num-layers-per-virtual-pipeline-stage 3 must divide"),
    (["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "interleaved"], 2,
     "needs --num-layers-per-virtual-pipeline-stage"),
    (["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "12",
      "--micro-batch-size", "4"], 2, "multiple of --pipeline-model-parallel-size 2"),
    (["--pipeline-model-parallel-size", "2", "--pipeline-layers-per-stage", "1,2"], 2, "--pipeline-layers-per-stage"),
    (["--auto-parallel"], 4, "--auto-parallel needs --global-batch-size"),
    (["--auto-parallel", "--global-batch-size", "8", "--hardware", "/nonexistent.json"], 4, "--hardware"),
])
def test_bad_flags_are_rejected_before_any_process_group(argv, world, message, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    with pytest.raises(SystemExit, match=re.escape(message)) as e:
        train_script.main(argv)
    assert "\n" not in str(e.value), "the error is one line"
    assert not torch.distributed.is_initialized()


def test_auto_parallel_asks_the_planner_for_a_layout_that_passes_every_check(monkeypatch, capsys):
    """--auto-parallel sets the layout flags from the planner's best plan, before any process group."""
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    args = train_script.parse_args(["--auto-parallel", "--global-batch-size", "32", "--seq-length", "64"])
    train_script.apply_auto_parallel(args, 8)
    cfg, dims, batch, plan = train_script.check_args(args, 8)
    assert dims.world == 8 and batch.global_batch == 32
    assert "auto-parallel: tp" in capsys.readouterr().out
    assert not torch.distributed.is_initialized()


def test_missing_data_path_is_rejected(monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(SystemExit, match="--data-path"):
        train_script.main(["--data-path", str(tmp_path / "missing.txt")])


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """The README's main command as written (tp 2 x pp 2 x dp 2 on 8 processes, its checkpoint, metrics file,
    timeline and plot), run once for every test below, stopped after reference_losses.ITERATIONS steps by
    --exit-interval (the schedule and data order still follow its --train-iters) and logging every step."""
    workdir = tmp_path_factory.mktemp("quickstart")
    return reference_losses.run_quickstart(str(workdir), timeout=400, runner=_forked), workdir


def _forked(argv: list[str], cwd: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """A part of the README command (reference_losses.command_parts: `python -m torch.distributed.run ...` or
    `python SCRIPT ...`) run by hybrid.testing: torchrun's ranks, or the script, forked from its forkserver."""
    if argv[1:3] == ["-m", "torch.distributed.run"]:
        return testing.torchrun_cli(argv[3:], env=env, cwd=cwd, timeout=timeout)
    return testing.run(argv[1:], env=env, cwd=cwd, timeout=timeout)


@pytest.mark.slow
def test_quickstart_first_losses_equal_the_committed_reference(quickstart):
    """Every one of the first 20 losses, as logged at full precision (the JSON-lines repr: equal strings are equal
    floats) and on the log line, equals tests/data/quickstart_losses.json: any numeric change to training shows up.
    An intended one: `python scripts/reference_losses.py --write`."""
    run, _ = quickstart
    diffs = reference_losses.differences(run, reference_losses.load_reference())
    assert not diffs, "; ".join(diffs) + " (an intended change: python scripts/reference_losses.py --write)"


@pytest.mark.slow
def test_quickstart_trains_saves_a_checkpoint_validates_and_plots(quickstart):
    run, workdir = quickstart
    out = run["stdout"]
    losses = [float(x) for x in run["logged"]]
    assert len(losses) == reference_losses.ITERATIONS and losses[-1] < losses[0] - 0.5, out
    events = json.loads((workdir / "timeline.json").read_text())["traceEvents"]
    forwards = [e for e in events if e.get("cat") == "forward"]
    assert len(forwards) == 8 * 4, "4 micro-batches forwarded by each of 8 ranks in the last step"
    assert "checkpoint: saved iteration 20 to quickstart_ckpt/iter_0000020" in out, out[-2000:]
    assert (workdir / "quickstart_ckpt" / "iter_0000020").is_dir()
    assert re.search(r"validation loss at iteration 20 on validation set \| lm loss value: \S+", out), out[-2000:]
    png = (workdir / "quickstart.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and "wrote quickstart.png" in run["outputs"][0]


def _import_torch_peak_rss(tmp) -> int:
    """Peak RSS of a process started as the quickstart's ranks are (a fork of hybrid.testing's forkserver) that only
    imports torch: a floor for any training rank's. (A fork maps the server's pages lazily, so a fresh interpreter's
    figure is not comparable.)"""
    probe = tmp / "import_torch_rss.py"
    probe.write_text("import torch  # noqa: F401\nfrom hybrid.metrics.peak_memory import peak_rss_bytes\n"
                     "print(peak_rss_bytes())\n")
    out = testing.run([str(probe)], env={"OMP_NUM_THREADS": "1"}, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


@pytest.mark.slow
def test_quickstart_logs_each_ranks_peak_memory(quickstart, tmp_path):
    """CPU: every log record holds the 8 ranks' peak RSS (hybrid/metrics/peak_memory.py). Each is above what importing
    torch alone takes, below the host's memory, never falls (a peak since start), and the log line shows the
    largest, in MiB."""
    run, _ = quickstart
    records = [r for r in run["records"] if "lm_loss" in r]
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    floor = _import_torch_peak_rss(tmp_path)
    per_rank = [r["peak_rss_bytes_per_rank"] for r in records]
    assert all(len(p) == 8 for p in per_rank)
    assert all(floor < b < host for p in per_rank for b in p), (floor, per_rank[0])
    assert all(a <= b for prev, cur in zip(per_rank, per_rank[1:]) for a, b in zip(prev, cur))
    assert all(r["peak_rss_bytes"] == max(r["peak_rss_bytes_per_rank"]) for r in records)
    shown = [float(m) for m in re.findall(r"\| peak RSS ([\d.]+) MiB \(max, rank \d", run["stdout"])]
    assert shown == pytest.approx([r["peak_rss_bytes"] / 2**20 for r in records], abs=0.051)
