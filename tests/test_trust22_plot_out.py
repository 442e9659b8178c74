"""plot_run.py --out naming an existing file that is not a PNG (round 22's adversarial review): `hybrid plan --plot`
refused it since round 20 (hybrid.cliutil.check_replaces_an_image), plot_run.py replaced it -- a CSV saved as
results.png was gone after the plot, without a word. Now one line naming --out, before any reading or drawing."""

from __future__ import annotations

import json

import pytest

from hybrid.metrics import plot

CSV = b"step,loss\n1,5.0\n"


def _metrics(tmp_path) -> str:
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps({"iteration": i, "lm_loss": 5.0 - i / 10}) + "\n" for i in (1, 2)))
    return str(path)


def test_a_non_png_at_out_was_replaced(tmp_path, monkeypatch, capsys):
    """Live: without the check the CSV is replaced by the plot's PNG."""
    out = tmp_path / "results.png"
    out.write_bytes(CSV)
    monkeypatch.setattr(plot, "check_replaces_an_image", lambda *a: None)
    plot.main([_metrics(tmp_path), "--out", str(out)])
    assert out.read_bytes().startswith(b"\x89PNG")


def test_a_non_png_at_out_is_one_line_and_kept(tmp_path, one_line):
    out = tmp_path / "results.png"
    out.write_bytes(CSV)
    line = one_line(lambda: plot.main([_metrics(tmp_path), "--out", str(out)]))
    assert line == (f"plot_run.py: error: --out {str(out)!r} exists and is not a .png image, which the plot would "
                    f"replace; give a new file name, or remove the file first")
    assert out.read_bytes() == CSV


@pytest.mark.parametrize("content", [b"", None], ids=["empty", "a-png"])
def test_a_png_or_an_empty_file_is_replaced(content, tmp_path, capsys):
    """Re-plotting over the last plot (or a touched name) is what --out is for."""
    out = tmp_path / "results.png"
    plot.main([_metrics(tmp_path), "--out", str(out)])
    if content is not None:
        out.write_bytes(content)
    plot.main([_metrics(tmp_path), "--out", str(out)])
    assert out.read_bytes().startswith(b"\x89PNG")
