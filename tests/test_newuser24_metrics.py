"""A fresh run given another run's --metrics-file or --tensorboard-dir (round 24).

Repro: the README's calibrate chain (`... train.py ... --metrics-file run.jsonl && python scripts/plot_run.py run.jsonl`)
run a second time, at another layout: the second run -- resuming nothing, so starting at iteration 1 -- was accepted
and appended its records after the first run's. plot_run keeps the later record of a repeated iteration, so the plot
showed one curve: the second run up to its last iteration, the first run's records after it (a --tensorboard-dir:
TensorBoard and plot_run merged the two runs' event files the same way). Now refused before any
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
    """A real 2-iteration run: its checkpoint, metrics file and TensorBoard folder (one forked rank, ~3 s)."""
    d = tmp_path_factory.mktemp("run")
    (run,) = launch(TRAIN + ["--train-iters", "2", "--save", str(d / "ck"), "--metrics-file", str(d / "m.jsonl"),
                             "--tensorboard-dir", str(d / "tb")], 1, launcher_env=False)
    assert run.returncode == 0, run.stderr[-2000:]
    return d


@pytest.mark.slow  # the module's forked run: ~3-5 s of CPU
def test_a_fresh_run_into_another_runs_metrics_file_is_refused_and_the_file_kept(finished, one_line, one_process):
    metrics = finished / "m.jsonl"
    before = metrics.read_bytes()
    line = one_line(lambda: validate(TRAIN + ["--train-iters", "5", "--metrics-file", str(metrics)]))
    assert line == (f"train.py: error: --metrics-file {str(metrics)!r} holds another run's records (up to iteration "
                    f"2), and this run resumes no checkpoint: it starts at iteration 1 and would append after them "
                    f"(plot_run.py would draw the two runs as one); give a new file, or --load the checkpoint of the "
                    f"run that wrote it")
    assert metrics.read_bytes() == before


@pytest.mark.slow  # the module's forked run: ~3-5 s of CPU
def test_a_fresh_run_into_another_runs_tensorboard_dir_is_refused_and_the_folder_kept(finished, one_line,
                                                                                    one_process):
    """TensorBoard merges the event files of a folder by step, and plot_run reads them the same way: the new run's
    steps 1-2 and the old run's later ones drew one curve."""
    tb = finished / "tb"
    before = sorted(p.name for p in tb.iterdir())
    line = one_line(lambda: validate(TRAIN + ["--train-iters", "5", "--tensorboard-dir", str(tb)]))
    assert line == (f"train.py: error: --tensorboard-dir {str(tb)!r} holds another run's event files, and this run "
                    f"resumes no checkpoint: it starts at iteration 1 beside them (TensorBoard and plot_run.py would "
                    f"draw the two runs as one); give a new folder, or --load the checkpoint of the run that wrote "
                    f"them")
    assert sorted(p.name for p in tb.iterdir()) == before


@pytest.mark.slow  # the module's forked run: ~3-5 s of CPU
def test_the_resume_of_the_run_that_wrote_them_still_appends(finished, one_process):
    metrics, tb = str(finished / "m.jsonl"), str(finished / "tb")
    run = validate(TRAIN + ["--train-iters", "3", "--load", str(finished / "ck"), "--metrics-file", metrics,
                            "--tensorboard-dir", tb])[0]
    assert run.metrics.metrics_file == metrics and run.metrics.tensorboard_dir == tb
    assert run.checkpoint.load is not None


def test_a_first_attempt_killed_before_its_first_save_continues_its_file(tmp_path, one_process, monkeypatch):
    """`--save D --load D` with no checkpoint in D yet (the same command again after a kill before the first save),
    and a torchrun restart: the records are this job's own; plot_run keeps the re-run iterations' later records."""
    metrics, tb = tmp_path / "m.jsonl", tmp_path / "tb"
    metrics.write_text('{"iteration": 1, "lm_loss": 5.5}\n{"iteration": 2, "lm_loss": 5.4}\n')
    tb.mkdir()
    (tb / "events.out.tfevents.1.host.1.0").write_bytes(b"")
    d, outputs = str(tmp_path / "ck"), ["--metrics-file", str(metrics), "--tensorboard-dir", str(tb)]
    assert validate(TRAIN + ["--save", d, "--load", d] + outputs)[0].metrics.metrics_file == str(metrics)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert validate(TRAIN + outputs)[0].metrics.tensorboard_dir == str(tb)


def test_a_restart_count_that_is_no_number_is_no_restart(tmp_path, one_line, one_process, monkeypatch):
    """torchrun sets TORCHELASTIC_RESTART_COUNT; any other value is read as no restart, never as int()'s message."""
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "abc")
    assert validate(TRAIN + ["--metrics-file", str(tmp_path / "new.jsonl")])[0].metrics.metrics_file
    (tmp_path / "m.jsonl").write_text('{"iteration": 3, "lm_loss": 5.0}\n')
    line = one_line(lambda: validate(TRAIN + ["--metrics-file", str(tmp_path / "m.jsonl")]))
    assert "holds another run's records (up to iteration 3)" in line
