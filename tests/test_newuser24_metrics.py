"""A fresh run given another run's --metrics-file (round 24).

Repro: the README's calibrate chain (`... train.py ... --metrics-file run.jsonl && python scripts/plot_run.py run.jsonl`)
run a second time, at another layout: the second run -- resuming nothing, so starting at iteration 1 -- was accepted
and appended its records after the first run's. plot_run keeps the later record of a repeated iteration, so the plot
showed one curve: the second run up to its last iteration, the first run's records after it. Now refused before any
process group, one line naming the file; a run that continues the file (a resume, `--save D --load D` before D's
first checkpoint, a torchrun restart) still appends (hybrid/metrics/args.check_not_another_run)."""

from __future__ import annotations

import pytest

from hybrid.testing import launch
from hybrid.train.main import validate

TRAIN = ["--model", "tiny-gpt2", "--seq-length", "32", "--micro-batch-size", "1", "--global-batch-size", "1",
         "--eval-iters", "0", "--log-interval", "1"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A real 2-iteration run: its checkpoint and its metrics file (one forked rank, ~3 s)."""
    d = tmp_path_factory.mktemp("run")
    (run,) = launch(TRAIN + ["--train-iters", "2", "--save", str(d / "ck"), "--metrics-file", str(d / "m.jsonl")],
                    1, launcher_env=False)
    assert run.returncode == 0, run.stderr[-2000:]
    return d


def test_a_fresh_run_into_another_runs_metrics_file_is_refused_and_the_file_kept(finished, one_line, one_process):
    metrics = finished / "m.jsonl"
    before = metrics.read_bytes()
    line = one_line(lambda: validate(TRAIN + ["--train-iters", "5", "--metrics-file", str(metrics)]))
    assert line == (f"train.py: error: --metrics-file {str(metrics)!r} holds another run's records (up to iteration "
                    f"2), and this run resumes no checkpoint: it starts at iteration 1 and would append after them "
                    f"(plot_run.py would draw the two runs as one); give a new file, or --load the checkpoint of the "
                    f"run that wrote it")
    assert metrics.read_bytes() == before


def test_the_resume_of_the_run_that_wrote_it_still_appends(finished, one_process):
    metrics = str(finished / "m.jsonl")
    run = validate(TRAIN + ["--train-iters", "3", "--load", str(finished / "ck"), "--metrics-file", metrics])[0]
    assert run.metrics.metrics_file == metrics and run.checkpoint.load is not None


def test_a_first_attempt_killed_before_its_first_save_continues_its_file(tmp_path, one_process, monkeypatch):
    """`--save D --load D` with no checkpoint in D yet (the same command again after a kill before the first save),
    and a torchrun restart: the records are this job's own; plot_run keeps the re-run iterations' later records."""
    metrics = tmp_path / "m.jsonl"
    metrics.write_text('{"iteration": 1, "lm_loss": 5.5}\n{"iteration": 2, "lm_loss": 5.4}\n')
    d = str(tmp_path / "ck")
    assert validate(TRAIN + ["--save", d, "--load", d, "--metrics-file", str(metrics)])[0].metrics.metrics_file
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert validate(TRAIN + ["--metrics-file", str(metrics)])[0].metrics.metrics_file == str(metrics)
