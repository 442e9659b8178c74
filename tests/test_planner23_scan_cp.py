"""`hybrid plan --scan-gpus` with `--context-parallel-size` (round 23; refused by name until then): at each GPU count
the fastest layout over the CP sizes and comm types, as `--gpus N --context-parallel-size ...` ranks it.

Each count's row is the CP table's first row at that count (the same search, context.search_cp; the `#` column
dropped), its --json the same plan's cp_plan_json; a count no CP size divides, or where nothing fits, says why in one
row. In-process, a CPU preset and one GPU preset (~1-2 s)."""

from __future__ import annotations

import json

import pytest

from hybrid.planner.cli import main

# the cpu preset (fp32, RSS MiB) and an H100 one (mem GB): tiny-llama, and llama-3-8b at 64k with tp 4 pinned
CPU = ["--model", "tiny-llama", "--gpu", "cpu", "--global-batch-size", "8", "--seq-length", "128",
       "--context-parallel-size", "1,2"]
GPU = ["--model", "llama-3-8b", "--gpu", "h100-80g", "--global-batch-size", "1", "--seq-length", "65536",
       "--activation-profile", "bf16-flash", "--tensor-model-parallel-size", "4", "--recompute-granularity", "none",
       "--context-parallel-size", "1,2,4"]  # 8 GPUs: cp 2 wins, 16: cp 4 (a scan that drops a size fails)


def _out(capsys, argv: list[str]) -> str:
    assert main(argv) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def _first_row(capsys, argv: list[str], gpus: int) -> str:
    """The CP table's row 1 at --gpus N, without its `#` column."""
    line = next(x for x in _out(capsys, argv + ["--gpus", str(gpus), "--top", "1"]).splitlines()
                if x.startswith(" 1  "))
    return line[4:]


@pytest.mark.parametrize("argv, counts, cp_wins", [(CPU, (2, 4), False), (GPU, (8, 16), True)], ids=["cpu", "h100"])
def test_each_counts_row_is_the_cp_tables_best_at_that_count(capsys, argv, counts, cp_wins):
    lines = _out(capsys, argv + ["--scan-gpus", ",".join(map(str, counts))]).splitlines()
    assert lines[0].split()[:2] == ["GPUs", "layout"] and "CP s" in lines[0] and lines[-1].startswith("CP s: ")
    rows = lines[1:-1]
    assert [int(r.split()[0]) for r in rows] == list(counts)
    for n, row in zip(counts, rows):  # the memory column aside: a CPU's RSS MiB adds this process's size now
        got, want = row[8:].split(), _first_row(capsys, argv, n).split()
        assert got[:-5] + got[-4:] == want[:-5] + want[-4:], n
        assert float(got[-5].replace(",", "")) == pytest.approx(float(want[-5].replace(",", "")), rel=0.02)
    assert any(" cp" in r for r in rows) is cp_wins  # h100: CP wins, so the scan searched CP, not the plain space


def test_scan_json_is_each_counts_best_cp_plan(capsys):
    scan = json.loads(_out(capsys, GPU + ["--scan-gpus", "8,16", "--json"]))
    for row in scan:
        best = json.loads(_out(capsys, GPU + ["--gpus", str(row["gpus"]), "--json", "--top", "1"]))["plans"][0]
        assert row["best"] == best and best["layout"]["context_parallel_size"] == row["gpus"] // 4


def test_a_count_no_size_divides_or_nothing_fits_says_why(capsys):
    lines = _out(capsys, GPU + ["--scan-gpus", "3,8"]).splitlines()
    assert lines[1].split()[0] == "3" and "none fits:" in lines[1] and "does not divide 3 GPUs" in lines[1]
    assert lines[2].split()[0] == "8" and "cp2" in lines[2]
    assert "x cp 2 does not divide 4 GPUs" in _out(capsys, GPU + ["--scan-gpus", "4", "--json"])  # tp 4 pinned
    small = _out(capsys, GPU + ["--scan-gpus", "8", "--gpu-memory", "4"]).splitlines()[1]
    assert "none fits:" in small and "OOM" in small and "cp 2's reduced tp4 pp" in small
