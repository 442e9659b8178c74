"""scripts/ writers (benchmarks, plots, gpu_check, reference_losses, cpu_time): results are written whole or not at
all (cliutil.write_text / atomic_output: a unique temporary renamed onto the file) and never through a link --
the --out checks (OneLineParser.check_out) refuse a link before the benchmark runs, write_text refuses one at the
write, cpu_time's appended --json refuses one at parse time. Each script's writes are listed below with their guard
(the AST scan of tests/test_trust16_writers.py, over scripts/): a new raw open(..., "w") fails until reviewed.
Shown live first: a plain open(link, "w") -- what bench_compile, bench_cp, bench_startup, bench_planner_mainjob,
gpu_check and reference_losses did -- writes the link's target.
"""

from __future__ import annotations

import os
import sys

import pytest

from hybrid import cliutil
from tests.write_scan import ROOT, _writes

SCRIPT_WRITERS = {
    ("scripts/bench_calibrate_repeat.py", "main", "write_text"): "write_text",
    ("scripts/bench_checkpoint.py", "FSDP2.save", "save"): "DCP into the benchmark's own scratch folder",
    ("scripts/bench_checkpoint.py", "disk_bandwidth.write", "open(wb)"): "probe.<rank> in its own scratch folder",
    ("scripts/bench_checkpoint.py", "measure", "save"): "DCP into the benchmark's own scratch folder",
    ("scripts/bench_checkpoint.py", "write_report", "write_text"): "write_text",
    ("scripts/bench_collectives.py", "main", "write_text"): "write_text",
    ("scripts/bench_comm_efficient.py", "main", "open(w)"): "inside atomic_output",
    ("scripts/bench_compile.py", "main", "write_text"): "write_text (trust17: was open(w))",
    ("scripts/bench_cp.py", "main", "write_text"): "write_text (trust17: was open(w))",
    ("scripts/bench_layer_fit.py", "main", "write_text"): "write_text",
    ("scripts/bench_moe.py", "main", "write_text"): "write_text",
    ("scripts/bench_pipeline.py", "main", "write_text"): "write_text",
    ("scripts/bench_planner.py", "write_report", "write_text"): "write_text",
    ("scripts/bench_planner_mainjob.py", "_emit", "write_text"): "write_text (trust17: was open(w))",
    ("scripts/bench_planner_mainjob.py", "install_accounting.dump", "open(w)"): "rank<r>.json in a mkdtemp folder",
    ("scripts/bench_planner_mainjob.py", "install_components.dump", "open(w)"): "components<r>.json, mkdtemp folder",
    ("scripts/bench_startup.py", "main", "write_text"): "write_text (trust17: was open(w))",
    ("scripts/bench_tp.py", "bench_model", "save_pretrained"): "a TemporaryDirectory",
    ("scripts/bench_tp.py", "main", "write_text"): "write_text",
    ("scripts/bench_zero.py", "memory_baseline", "open(w)"): "/proc/self/clear_refs",
    ("scripts/bench_zero.py", "write_table", "open(w)"): "inside atomic_output",
    ("scripts/cpu_time.py", "main", "open(a)"): "appended one line; a link refused at parse time (trust17)",
    ("scripts/gpu_check.py", "Check.write", "write_text"): "write_text (trust17: was open(w))",
    ("scripts/gpu_check.py", "compare", "save_pretrained"): "a TemporaryDirectory's subfolder",
    ("scripts/gpu_check.py", "speed", "save_pretrained"): "a TemporaryDirectory",
    ("scripts/gpu_check.py", "train_py", "write_text"): "write_text (trust17: was open(w))",
    ("scripts/plot_comm_efficient.py", "main", "savefig"): "inside atomic_output",
    ("scripts/plot_cp.py", "draw", "savefig"): "inside atomic_output",
    ("scripts/plot_moe.py", "draw", "savefig"): "inside atomic_output",
    ("scripts/plot_planner_accuracy.py", "draw", "savefig"): "inside atomic_output",
    ("scripts/plot_schedule.py", "draw", "savefig"): "inside atomic_output",
    ("scripts/plot_zero_memory.py", "draw", "savefig"): "inside atomic_output",
    ("scripts/reference_losses.py", "main", "write_text"): "write_text (trust17: was open(w))",
}


def test_every_write_of_the_scripts_is_listed_with_its_guard():
    found = set()
    for f in sorted(os.listdir(os.path.join(ROOT, "scripts"))):
        if f.endswith(".py"):
            found |= _writes(os.path.join(ROOT, "scripts", f))
    assert found - set(SCRIPT_WRITERS) == set(), f"unreviewed script writers: {found - set(SCRIPT_WRITERS)}"
    assert set(SCRIPT_WRITERS) - found == set(), f"listed writers no longer found: {set(SCRIPT_WRITERS) - found}"


@pytest.fixture
def link(tmp_path):
    """results.md, a link to a file of the user's elsewhere -- which a plain open(link, "w") writes (shown first)."""
    target = tmp_path / "elsewhere" / "precious.txt"
    target.parent.mkdir()
    target.write_text("naive")
    os.symlink(target, tmp_path / "results.md")
    with open(tmp_path / "results.md", "w") as f:  # the naive write: through the link
        f.write("written through")
    assert target.read_text() == "written through"
    target.write_text("the user's own file\n")
    return str(tmp_path / "results.md"), target


def test_write_text_refuses_a_link_and_leaves_its_target(link):
    path, target = link
    with pytest.raises(ValueError, match="is a symbolic link"):
        cliutil.write_text(path, "| table |\n")
    assert target.read_text() == "the user's own file\n" and os.path.islink(path)


def test_a_benchmarks_out_check_refuses_a_link_before_any_work(link, capsys):
    path, target = link
    p = cliutil.OneLineParser(prog="bench_x.py")
    with pytest.raises(SystemExit):
        p.check_out("--out", path)
    assert f"--out {path!r} is a symbolic link" in capsys.readouterr().err
    assert target.read_text() == "the user's own file\n"


def test_cpu_time_refuses_an_appended_json_that_is_a_link(link, monkeypatch, capsys):
    """In this process (its main() under runpy): the refusal comes at parse time, before the command would run."""
    import runpy
    path, target = link
    monkeypatch.setattr(sys, "argv", ["cpu_time.py", "--json", path, "--", "true"])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(os.path.join(ROOT, "scripts", "cpu_time.py"), run_name="__main__")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "is a symbolic link" in err, err
    assert target.read_text() == "the user's own file\n"
