"""train.py --compile (each Transformer block's forward under torch.compile) trains as the eager run does: tp 2
with sequence parallelism and dropout on both residual branches and the attention probabilities, so the TP
collectives, the sequence-parallel gathers and the tensor-parallel dropout streams all run inside compiled
forwards; and at dp 2 under ZeRO 3, where each block's parameters are gathered around its compiled forward. Inductor
fuses the elementwise kernels but keeps fp32 arithmetic: fp32 tolerance 1e-5."""

from __future__ import annotations

import json
import os

import pytest

from hybrid import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ["--model", "tiny-gpt2", "--tensor-model-parallel-size", "2", "--sequence-parallel", "--hidden-dropout", "0.1",
         "--attention-dropout", "0.1", "--train-iters", "3", "--log-interval", "1", "--eval-iters", "0"]


def _losses(tmp_path, extra: list[str], flags: list[str] = FLAGS) -> list[float]:
    out = tmp_path / f"m{len(extra)}.jsonl"
    proc = testing.torchrun_cli(["--standalone", "--nproc-per-node", "2", os.path.join(ROOT, "scripts", "train.py"),
                                 *flags, "--metrics-file", str(out), *extra], env={"OMP_NUM_THREADS": "1"},
                                timeout=600)  # its ranks forked from hybrid.testing's forkserver
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [r["lm_loss"] for r in map(json.loads, out.read_text().splitlines()) if "lm_loss" in r]


@pytest.mark.slow
def test_compiled_blocks_train_as_the_eager_run(tmp_path):
    eager, compiled = _losses(tmp_path, []), _losses(tmp_path, ["--compile"])
    assert len(eager) == len(compiled) == 3
    for a, b in zip(compiled, eager):
        assert abs(a - b) <= 1e-5 * abs(b), (compiled, eager)


ZERO3 = ["--model", "tiny-llama", "--zero-stage", "3", "--train-iters", "3", "--log-interval", "1", "--eval-iters", "0"]


@pytest.mark.slow
def test_compiled_blocks_under_zero3_train_as_the_eager_run(tmp_path):
    """dp 2, ZeRO 3: each block's parameters are gathered by the forward pre-hook before its compiled forward runs
    and freed (0-byte storage) after it, forward and backward; the compiled run's losses equal the eager run's to
    fp32 tolerance (a graph traced on freed storage, or a stale gather, would not)."""
    eager, compiled = _losses(tmp_path, [], ZERO3), _losses(tmp_path, ["--compile"], ZERO3)
    assert len(eager) == len(compiled) == 3
    for a, b in zip(compiled, eager):
        assert abs(a - b) <= 1e-5 * abs(b), (compiled, eager)


def test_auto_parallel_with_compile_searches_only_what_compile_runs_with(monkeypatch):
    """--auto-parallel --compile: the planner searches every ZeRO stage (all run with --compile) and keeps the
    recomputation given (none here), so the layout it picks is one the run accepts."""
    from hybrid import planner
    from hybrid.train.args import apply_auto_parallel, parse_args
    seen = []
    real = planner.search

    def spy(work, cluster, space, **kw):
        seen.append(space)
        return real(work, cluster, space, **kw)
    monkeypatch.setattr(planner, "search", spy)
    args = parse_args(["--auto-parallel", "--compile", "--global-batch-size", "16", "--seq-length", "32"])
    apply_auto_parallel(args, 4)
    assert [int(z) for z in seen[0].zero] == [0, 1, 2, 3] and [r.value for r in seen[0].recompute] == ["none"]
    assert args.zero_stage in (0, 1, 2, 3)
