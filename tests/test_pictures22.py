"""The docs' pictures redraw from their own data (round 22): scripts/plot_planner_accuracy.py, plot_zero_memory.py,
plot_cp.py and plot_moe.py each write a PNG from the code's numbers or a results table, and what they draw is what
the source says -- the planner plot's counts are families' (hybrid.planner.families.stats, the table docs/planner.md
prints), the ZeRO bars the paper's 16 Psi / n arithmetic written out here, the CP and MoE bars the tables' cells.
The plot of every published row is tests/test_planner19_docs_families.py's, beside the guide's tables: one planning
of every row serves both (the schedule simulations it caches are most of a first planning's ~12 s of CPU)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG = b"\x89PNG\r\n\x1a\n"


def _script(name: str):
    """scripts/<name>.py as a module, registered (its dataclasses look their module up in sys.modules)."""
    spec = importlib.util.spec_from_file_location(f"_pictures22_{name}", os.path.join(ROOT, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _png(path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == PNG


def _families_counts(rows) -> dict:
    """families.stats's all-rows cells, read back: planned rows (any role), CHECK within ±15 %, planned CHECK rows,
    rejected CHECK rows."""
    from hybrid.planner.families import stats
    cells = [c.strip() for c in stats(rows).split("|")]
    within, of = cells[5].split(" of ")  # check rows | fit rows | mean | median | spread | within | rejected
    return {"planned": sum(r.error is not None for r in rows), "check_within": int(within), "check_planned": int(of),
            "check_rejected": int(cells[6]), "median": cells[3], "mean": cells[2]}


def _row(family: str, role, error, name: str = "r"):
    from hybrid.planner.families import FamilyRow
    return FamilyRow(name, family, "H100", 8, 1, 1, 1, 8, 3, role, error, "" if error is not None else "too big")


def test_planner_plot_counts_are_families_counts_on_made_up_rows(tmp_path):
    """Rows on both sides of the band's edges, FIT and CHECK, a rejected one: the points drawn, those inside the
    band and the histogram's rows are what families.stats counts."""
    from hybrid.planner.published import Role
    plot = _script("plot_planner_accuracy")
    errors = [0.0, 0.149, -0.149, 0.151, -0.151, 0.3, -0.2, 0.05]
    points = [plot.Point(_row("torchtitan (FSDP2, DTensor TP / PP)", Role.CHECK, e), 10.0 ** (i % 4))
              for i, e in enumerate(errors)]
    points += [plot.Point(_row("OLMo-core (FSDP2)", Role.FIT, 0.4), 123.0),
               plot.Point(_row("OLMo-core (FSDP2)", Role.CHECK, None), 50.0)]
    out = tmp_path / "acc.png"
    drawn = plot.draw(points, str(out))
    want = _families_counts([p.row for p in points])
    assert _png(out)
    assert drawn["points"] == want["planned"] == 9
    assert drawn["within_band"] == 4  # 0, +-0.149, 0.05 of the checks; not +-0.151, 0.3, -0.2 nor the FIT's 0.4
    assert drawn["check_points"] == want["check_planned"] == 8
    assert drawn["check_within_band"] == want["check_within"] == 4
    assert drawn["rejected"] == want["check_rejected"] == 1


def test_zero_memory_bars_are_the_papers_bytes(tmp_path):
    """bf16 + fp32 Adam, Psi parameters, n ranks: stage 0 16 Psi, 1 4 Psi + 12 Psi/n, 2 2 Psi + 14 Psi/n, 3 16 Psi/n
    (ZeRO, Sec. 5); offload moves the 12 Psi/n of master + moments (and at stage 3 the 2 Psi/n parameters) to host."""
    from models.config import load_config
    plot = _script("plot_zero_memory")
    out = tmp_path / "zero.png"
    data = dict(plot.main(["--out", str(out), "--model", "tiny-llama", "--dp", "4"]))
    psi, n = load_config("tiny-llama").num_parameters, 4

    def total(label: str, placement: str) -> int:
        return sum(v for (_, p), v in data[label].items() if p == placement)

    assert _png(out)
    for label, device in (("stage 0", 16 * psi), ("stage 1", 4 * psi + 12 * psi // n),
                          ("stage 2", 2 * psi + 14 * psi // n), ("stage 3", 16 * psi // n)):
        assert (total(label, "device"), total(label, "offload")) == (device, 0), label
    offloaded = [label for label in data if "offload" in label]
    assert [(total(k, "device"), total(k, "offload")) for k in offloaded] == [
        (2 * psi + 2 * psi // n, 12 * psi // n), (2 * psi // n, 14 * psi // n)]


def test_zero_memory_bad_dp_is_one_line(tmp_path, capsys):
    plot = _script("plot_zero_memory")
    with pytest.raises(SystemExit):
        plot.main(["--out", str(tmp_path / "z.png"), "--dp", "0"])
    assert "--dp" in capsys.readouterr().err and not os.listdir(tmp_path)


def test_cp_plot_draws_the_bench_table_and_a_one_over_cp_memory(tmp_path):
    plot = _script("plot_cp")
    bench = os.path.join(ROOT, "docs", "results", "bench_cp.md")
    out = tmp_path / "cp.png"
    drawn = plot.main(["--out", str(out), "--bench", bench])
    assert _png(out)
    table = [line.split("|") for line in open(bench).read().splitlines() if line.startswith("| ") and
             line.split("|")[2].strip().replace(".", "").isdigit()]
    assert drawn["rows"] == [(c[1].strip(), float(c[2]), float(c[3])) for c in table]
    assert drawn["skipped"] == ["torch context_parallel (CP 2)"]
    one = drawn["memory"][1]
    for cp, gib in drawn["memory"].items():
        assert gib == pytest.approx([g / cp for g in one], rel=1e-12), cp
    assert one[-1] / one[0] == pytest.approx(131072 / 8192)  # linear in the sequence (flash: no s x s scores)


def test_cp_plot_refuses_a_file_without_the_table(tmp_path, capsys):
    plot = _script("plot_cp")
    bad = tmp_path / "not_bench.md"
    bad.write_text("# something else\n")
    with pytest.raises(SystemExit):
        plot.main(["--out", str(tmp_path / "cp.png"), "--bench", str(bad)])
    assert "--bench" in capsys.readouterr().err and not (tmp_path / "cp.png").exists()


MOE = """# MoE layer
- shape: 64 tokens per rank, E 4
| row | ours s/step | megatron s/step | ratio |
|---|---|---|---|
| MoE layer fwd+bwd, EP 2, alltoall | 0.5 (0.25-0.75) | 1.0 (0.5-2.0) | 0.5 (0.4-0.6) (ours faster) |

- saved for backward per rank: ours 1.50 MiB, megatron 2.25 MiB; parameters per rank: ours 3.00 MiB, megatron 3.00 MiB

| local experts (EP 1, one thread) | s/step fwd+bwd |
|---|---|
| loop | 0.125 (0.100-0.150) |
| torch grouped_mm | 0.250 (0.200-0.300) |
"""


def test_moe_plot_reads_every_number_of_the_bench_table(tmp_path):
    plot = _script("plot_moe")
    bench = tmp_path / "bench_moe.md"
    bench.write_text(MOE)
    out = tmp_path / "moe.png"
    data = plot.main(["--out", str(out), "--bench", str(bench)])
    assert _png(out)
    assert data["layer"] == {"hybrid": (0.5, 0.25, 0.75), "megatron-core": (1.0, 0.5, 2.0)}
    assert data["memory"] == {"saved for backward": (1.5, 2.25), "parameters": (3.0, 3.0)}
    assert data["experts"] == {"loop": (0.125, 0.1, 0.15), "torch grouped_mm": (0.25, 0.2, 0.3)}
    assert data["shape"] == "64 tokens per rank, E 4"


def test_moe_plot_draws_the_committed_table(tmp_path):
    plot = _script("plot_moe")
    data = plot.main(["--out", str(tmp_path / "moe.png"), "--bench",
                      os.path.join(ROOT, "docs", "results", "bench_moe.md")])
    assert _png(tmp_path / "moe.png") and len(data["experts"]) == 2 and set(data["layer"]) == {"hybrid",
                                                                                               "megatron-core"}


def test_moe_plot_refuses_a_table_without_the_memory_line(tmp_path, capsys):
    plot = _script("plot_moe")
    bench = tmp_path / "bench_moe.md"
    bench.write_text(MOE.replace("saved for backward", "kept"))
    with pytest.raises(SystemExit):
        plot.main(["--out", str(tmp_path / "moe.png"), "--bench", str(bench)])
    assert "saved for backward" in capsys.readouterr().err and not (tmp_path / "moe.png").exists()
