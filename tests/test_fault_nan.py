"""NaN/inf guard: a NaN in one TP rank's gradient makes every rank skip the step with its state bit for
bit untouched, logs the iteration, rank and parameter; K consecutive skips stop the run with exit 65."""

from __future__ import annotations

import contextlib
import io
import re

import pytest
import torch

from hybrid.data import load_corpus, micro_batches
from hybrid.fault.nan_guard import EXIT_NAN, TooManySkippedSteps
from hybrid.fault.session import FaultTolerance
from hybrid.testing import launch
from hybrid.mesh import Mesh
from hybrid.testing import run_distributed
from hybrid.tp import TPContext
from hybrid.train.args import parse_args, run_config
from hybrid.train.loop import build_runner
from hybrid.train_step import OptimizerConfig, train_step
from hybrid.zero import ZeroOptimizer

# 2 ranks tp2, the training entry point's defaults otherwise (ZeRO stage 0, fp32, clipping on)
ARGV = ["--tensor-model-parallel-size", "2", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--seq-length", "32", "--train-iters", "12", "--log-interval", "2", "--max-skipped-steps", "3"]
FAULT = "nan:rank=1,iterations=7,9-12"  # rank 1 = tp rank 1; rank 0 has finite gradients


def _state(model, zopt: ZeroOptimizer) -> list[torch.Tensor]:
    """Everything a step may change: parameters, fp32 masters, Adam moments and step counts."""
    out = [p.detach().clone() for p in model.parameters()] + [u.master.clone() for u in zopt.units]
    for st in zopt.optimizer.state.values():
        out += [v.clone() if torch.is_tensor(v) else torch.tensor(v) for _, v in sorted(st.items())]
    return out


def _run(rank, world):
    """The loop of hybrid/train/loop.py (same builders, same FaultTolerance hooks), with a state
    snapshot after every iteration."""
    run = run_config(parse_args(ARGV), world)
    batch = run.training.batch
    mesh = Mesh.build(run.parallel.dims, device=torch.device("cpu"))
    model, runner = build_runner(run, mesh, TPContext(mesh.tp))
    opt_cfg = OptimizerConfig(lr=run.optimizer.lr, warmup_iters=run.optimizer.warmup_iters,
                              train_iters=run.training.train_iters, clip_grad=run.optimizer.clip_grad)
    zopt = ZeroOptimizer(model, mesh, run.zero, opt_cfg)
    corpus = load_corpus()
    log, states, stopped_at = io.StringIO(), [_state(model, zopt)], None
    with contextlib.redirect_stdout(log):
        ft = FaultTolerance.start(run.fault, mesh, model, runner, zopt, run.training.log_interval,
                                  run.metrics.timing_log_interval)
        try:
            for it in range(run.training.train_iters):
                ft.begin_iteration(it)
                train_step(model, micro_batches(corpus, batch, run.training.seed, it, mesh.coords.dp), ft.optimizer, mesh,
                           lr=opt_cfg.lr_at(it), runner=ft.runner)
                ft.end_iteration(it)
                states.append(_state(model, zopt))
        except TooManySkippedSteps as e:
            stopped_at = (it + 1, e.code)
            states.append(_state(model, zopt))
        ft.stop()
    return states, ft.guard.skipped, stopped_at, log.getvalue()


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_nan_in_one_tp_rank_gradient_skips_the_step_on_every_rank_bit_identically(monkeypatch):
    monkeypatch.setenv("HYBRID_FAULT", FAULT)
    results = run_distributed(_run, 2, timeout=300)
    for rank, (states, skipped, stopped_at, log) in enumerate(results):
        # states[i] = after iteration i (1-based); iteration 7 skipped: state after 7 == after 6, bit for bit
        assert _equal(states[7], states[6]), f"rank {rank}: skipped step changed the state"
        assert not _equal(states[8], states[7]) and not _equal(states[6], states[5]), "good steps do update"
        # 9, 10, 11 skipped: the third consecutive skip stops the run with EXIT_NAN, on every rank alike
        assert skipped == [7, 9, 10, 11] and stopped_at == (11, EXIT_NAN), (rank, skipped, stopped_at)
        assert _equal(states[11], states[8]) and len(states) == 12
        if rank == 1:  # model order: the embedding shard comes first
            assert f"nan-guard: iteration 7: rank {rank}: non-finite gradient of 0.wte.weight" in log, log
        else:
            assert f"rank {rank}: non-finite" not in log, log
    log0 = results[0][3]
    assert "iteration 7: skipped the step on every rank (non-finite on ranks [1]; 1 consecutive)" in log0, log0
    assert "3 consecutive steps skipped at iteration 11 (--max-skipped-steps 3); stopping with exit code 65" in log0
    # the per-rank times (default: every 10 log intervals) are printed at once for the intervals that skipped a step
    printed = re.findall(r"step time ms p50/p90/max, iterations (\d+-\d+)", log0)
    assert {"7-8", "9-10"} <= set(printed), log0
    for other in set(printed) - {"7-8", "9-10"}:  # only when a (load-induced) straggler was named for it
        assert f"medians over iterations {other}" in log0, log0


@pytest.mark.slow
def test_consecutive_skips_end_the_training_job_with_exit_code_65():
    (run,) = launch(["--seq-length", "32", "--micro-batch-size", "2", "--train-iters", "6", "--max-skipped-steps",
                     "2"], 1, {"HYBRID_FAULT": "nan:rank=0,iterations=3-4"})
    assert run.returncode == EXIT_NAN, run.stderr[-2000:]
    assert "nan-guard: iteration 3: rank 0: non-finite gradient of 0.wte.weight" in run.stdout, run.stdout
    assert "stopping with exit code 65" in run.stdout


def test_the_guard_can_be_switched_off():
    assert parse_args(["--no-check-for-nan-in-loss-and-grad"]).check_for_nan_in_loss_and_grad is False
    assert parse_args([]).check_for_nan_in_loss_and_grad is True


def test_the_one_fault_hook_parses_every_kind_and_rejects_a_bad_one():
    """HYBRID_FAULT (hybrid/fault/inject.py) is the only test-only hook; unset, nothing is injected."""
    import pytest

    from hybrid.fault.inject import Fault, faults_for, parse
    faults = parse("signal:rank=1,iteration=3,signal=SIGKILL; nan:rank=0,iterations=2,5-6; slow:rank=2,ms=50")
    assert faults == [Fault("signal", 1, iteration=3, signal="SIGKILL"),
                      Fault("nan", 0, iterations=frozenset({2, 5, 6})), Fault("slow", 2, ms=50.0)]
    with pytest.raises(ValueError, match="signal=SIGKILL"):
        parse("signal:rank=1,iteration=3,signal=SIGNOPE")
    with pytest.raises(ValueError, match="unknown fault"):
        parse("boom:rank=1")
    assert faults_for(0) == [] or "HYBRID_FAULT" in __import__("os").environ


def test_a_slow_fault_with_restart_sleeps_only_in_that_torchrun_attempt(monkeypatch):
    """`slow:...,restart=0` (tests/test_fault_nodes.py's elastic test) slows torchrun's first attempt only: the
    restarted job runs at full speed; without restart= every attempt is slowed."""
    import time

    from hybrid.fault.inject import Injector, parse
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    for attempt in ("0", "1"):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", attempt)
        Injector(parse("slow:rank=0,ms=300,restart=0")).on_forward()
        Injector(parse("slow:rank=0,ms=50")).on_forward()
    assert slept == [0.3, 0.05, 0.05]
