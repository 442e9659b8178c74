"""scripts/plot_run.py: a PNG of one or more runs' loss / throughput / memory curves, read from JSON-lines files
(as train.py's --metrics-file writes them) and TensorBoard directories (written by the same MetricsWriter the
trainer uses); each bad input is one error line. A real run's metrics file is plotted by the README's quick start
(tests/test_training.py)."""

from __future__ import annotations

import json

import pytest

from hybrid.metrics import plot
from hybrid.metrics.writer import MetricsWriter

PNG = b"\x89PNG\r\n\x1a\n"


def _write_run(writer: MetricsWriter, losses: list[float], valid_at: int) -> None:
    """Records as hybrid/metrics/loop.py writes them, through the real writer."""
    for it, loss in enumerate(losses, 1):
        writer.write(it, {"lm_loss": loss, "lr": 1e-3, "tokens_per_s": 1000.0 + it, "iteration_time_s": 0.1,
                          "peak_rss_bytes": (300 + it) * 2**20, "peak_rss_bytes_per_rank": [(300 + it) * 2**20] * 2})
    writer.write_eval(valid_at, {"validation": losses[valid_at - 1] - 0.1})
    writer.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    a, b = [5.0, 4.5, 4.0, 3.8], [5.2, 4.9, 4.4, 4.1]
    _write_run(MetricsWriter(None, str(d / "a.jsonl"), True), a, 4)
    _write_run(MetricsWriter(str(d / "tb"), None, True), b, 2)
    return d, a, b


def test_reads_jsonl_and_tensorboard_runs_back(runs):
    d, a, b = runs
    ra = plot.read_run(str(d / "a.jsonl"), "a")
    rb = plot.read_run(str(d / "tb"), "b")
    assert [ra.loss[i] for i in sorted(ra.loss)] == a
    assert [rb.loss[i] for i in sorted(rb.loss)] == pytest.approx(b, rel=1e-7)  # TensorBoard stores float32
    assert ra.valid == {4: pytest.approx(3.7)} and rb.valid == {2: pytest.approx(4.8, rel=1e-7)}
    assert ra.memory[3] == rb.memory[3] == 303 * 2**20 and ra.memory_label == rb.memory_label == "peak RSS"
    assert rb.tokens_per_s[2] == 1002.0


def test_a_resumed_runs_repeated_iterations_keep_the_later_record(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"iteration": i, "lm_loss": v}) + "\n"
                            for i, v in ((1, 5.0), (2, 4.0), (2, 4.5), (3, 4.2))))
    assert plot.read_run(str(path), "r").loss == {1: 5.0, 2: 4.5, 3: 4.2}


def test_one_curve_per_run_in_every_panel(runs):
    d, a, b = runs
    fig = plot.draw([plot.read_run(str(d / "a.jsonl"), "a"), plot.read_run(str(d / "tb"), "b")])
    loss_ax, tps_ax, mem_ax = fig.axes
    train = [ln for ln in loss_ax.get_lines() if not ln.get_label().endswith("(validation)")]
    assert [ln.get_label() for ln in train] == ["a", "b"]
    assert list(train[0].get_ydata()) == a
    assert len(loss_ax.get_lines()) == 4  # and each run's validation markers
    assert len(tps_ax.get_lines()) == 2 and len(mem_ax.get_lines()) == 2
    assert list(mem_ax.get_lines()[0].get_ydata()) == [301, 302, 303, 304]  # MiB
    assert mem_ax.get_ylim()[0] == tps_ax.get_ylim()[0] == 0  # from 0: a 3 MiB rise on 300 is no cliff
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_writes_a_png(runs, tmp_path, capsys):
    d, _, _ = runs
    out = tmp_path / "cmp.png"
    plot.main([str(d / "a.jsonl"), str(d / "tb"), "--label", "tp2", "--label", "tp4", "--out", str(out)])
    data = out.read_bytes()
    assert data[:8] == PNG
    import matplotlib.image
    height, width = matplotlib.image.imread(str(out)).shape[:2]
    assert (width, height) == (15 * 110, int(4.5 * 110))  # figsize x dpi
    assert "wrote" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["cmp.png"], "no temporary file left"


def _bad_cases(d):
    (d / "empty.jsonl").write_text("")
    (d / "blank.jsonl").write_text("\n\n")
    (d / "notjson.jsonl").write_text('{"iteration": 1, "lm_loss": 5.0}\n{"iteration": 2, lm_loss}\n')
    (d / "noiter.jsonl").write_text('{"lm_loss": 5.0}\n')
    (d / "evalonly.jsonl").write_text('{"iteration": 10, "lm loss validation": 4.0}\n')
    (d / "tbempty").mkdir()
    (d / "ok.jsonl").write_text('{"iteration": 1, "lm_loss": 5.0}\n')
    return [
        ([str(d / "missing.jsonl")], "missing.jsonl does not exist"),
        ([str(d / "empty.jsonl")], "is empty"),
        ([str(d / "blank.jsonl")], "is empty"),
        ([str(d / "notjson.jsonl")], "line 2 is not JSON"),
        ([str(d / "noiter.jsonl")], "line 1 has no integer \"iteration\""),
        ([str(d / "evalonly.jsonl")], "has no training loss"),
        ([str(d / "tbempty")], "holds no TensorBoard event files"),
        ([str(d / "ok.jsonl"), "--out", str(d / "x.jpg")], "writes PNG"),
        ([str(d / "ok.jsonl"), "--out", str(d / "no" / "x.png")], "does not exist; create it first"),
        ([str(d / "ok.jsonl"), str(d / "ok.jsonl"), "--label", "one"], "--label given 1 times for 2 runs"),
    ]


def test_bad_inputs_are_one_error_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for argv, fragment in _bad_cases(tmp_path):
        before = sorted(p.name for p in tmp_path.iterdir())
        with pytest.raises(SystemExit) as e:
            plot.main(argv)
        message = str(e.value.code)
        assert message.startswith("plot_run.py: error: ") and "\n" not in message and fragment in message, message
        assert sorted(p.name for p in tmp_path.iterdir()) == before, "nothing written"


def test_without_matplotlib_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    import sys
    (tmp_path / "ok.jsonl").write_text('{"iteration": 1, "lm_loss": 5.0}\n')
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    with pytest.raises(SystemExit, match="needs matplotlib: pip install matplotlib"):
        plot.main([str(tmp_path / "ok.jsonl"), "--out", str(tmp_path / "x.png")])
