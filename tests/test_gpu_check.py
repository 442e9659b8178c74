"""scripts/gpu_check.py cannot rot: its --dry-run runs every section's code on CPU with a tiny model (the GPU run
is the same code at the sizes in the script), and its bad inputs end with one line before any work."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
import torch

from hybrid import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.py")
SECTIONS = ("env", "ceilings", "hf_match", "zero_offload", "multi_rank", "speed", "breakdown", "calibrate",
            "planner")


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    proc = testing.run([SCRIPT, "--dry-run", "--out", str(out)], timeout=600)  # a fork of hybrid.testing's forkserver
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "gpu_check.json").read_text())


@pytest.mark.slow
def test_dry_run_runs_every_section(dry):
    _, results = dry
    assert results["dry_run"] is True
    assert {k: v["status"] for k, v in results["sections"].items()} == {k: "ok" for k in SECTIONS}


@pytest.mark.slow
def test_dry_run_compares_with_transformers_in_fp32_and_bf16(dry):
    r = dry[1]["sections"]["hf_match"]["result"]
    for kind in ("gpt2", "llama"):
        assert max(r[kind]["fp32_rel_err"].values()) <= 1e-5
        bf16 = r[kind]["bf16_rel_err_vs_fp32_reference"]
        assert all(bf16["ours"][k] <= bf16["bound"][k] for k in bf16["bound"])
        assert all(bf16["bound"][k] >= 2 * 2.0**-8 for k in bf16["bound"])


@pytest.mark.slow
def test_dry_run_offload_copies_are_bit_exact(dry):
    r = dry[1]["sections"]["zero_offload"]["result"]
    assert r["pinned_nonblocking_vs_unpinned_blocking"]["master_bit_equal"]
    assert r["offload_vs_device_same_adamw_arithmetic"]["master_bit_equal"]  # one CPU: the same kernels


@pytest.mark.slow
def test_dry_run_two_rank_layouts_match_one_rank(dry):
    r = dry[1]["sections"]["multi_rank"]["result"]
    for layout in ("tp2", "pp2", "dp2_zero3_offload"):
        assert r[layout]["ok"] and len(r[layout]["losses"]) == 3, r[layout]


@pytest.mark.slow
def test_dry_run_speed_calibrate_and_planner_report_numbers(dry):
    out, results = dry
    s = results["sections"]
    speed = s["speed"]["result"]
    for run in ("train_py_recompute_none", "train_py_recompute_selective"):
        assert speed[run]["step_s"]["n"] == 3 and speed[run]["tokens_per_s"] > 0
    assert speed["fwd_bwd_one_micro_batch"]["ours_compiled_blocks"]["s"]["median"] > 0
    assert s["calibrate"]["result"]["gemms"] and (out / "h200_profile.json").exists()
    assert set(s["planner"]["result"]) == {f"{rc} / {hw}" for rc in ("none", "selective")
                                           for hw in ("h200 preset", "measured profile")}
    md = (out / "gpu_check.md").read_text()
    assert all(f"## {name}: ok" in md for name in SECTIONS)


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    script = sys.modules["gpu_check"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(script)
    return script


def test_a_later_run_into_the_folder_keeps_the_sections_it_does_not_run(tmp_path, monkeypatch):
    """--only reruns a part (the GPU lease is short): its sections are replaced, the others kept. --out is taken
    relative to where the command runs, though the calibrate section runs from the checkout."""
    monkeypatch.chdir(tmp_path)
    script = _script()
    assert script.main(["--dry-run", "--out", "rel", "--only", "env"]) == 0
    assert script.main(["--dry-run", "--out", "rel", "--only", "ceilings"]) == 0
    results = json.loads((tmp_path / "rel" / "gpu_check.json").read_text())
    assert list(results["sections"]) == ["env", "ceilings"]
    assert results["sections"]["env"]["result"]["commit"] != "unknown"  # git's hash of this checkout


@pytest.mark.parametrize("argv, message", [
    (["--dry-run", "--out", "{f}"], "is a file"),
    (["--dry-run", "--out", ""], "--out is empty"),
    (["--dry-run", "--out", "{f}/sub"], "cannot write there"),
    (["--out", "{d}", "--only", ""], "names no section"),
    (["--out", "{d}", "--only", "env,bogus"], "unknown section"),
    (["--out", "{d}", "--budget-s", "0"], "--budget-s"),
    (["--out", "{d}", "--budget-s", "nan"], "--budget-s"),
] + ([] if torch.cuda.is_available() else [(["--out", "{d}"], "--dry-run")]))
def test_bad_input_is_one_line_before_any_work(tmp_path, capsys, argv, message):
    f = tmp_path / "file"
    f.write_text("x")
    argv = [a.format(f=f, d=tmp_path / "out") for a in argv]
    with pytest.raises(SystemExit) as e:
        _script().main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and message in err[-1], err
    assert not (tmp_path / "out").exists()  # nothing written
