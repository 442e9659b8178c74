"""Round 18's new-user pass over `hybrid plan` and `hybrid calibrate` with bad and edge inputs. Most were one line
naming the flag and the fix already (a missing / empty / truncated / non-profile / binary --hardware, a model name
or folder that does not exist, a config.json that is malformed or whose sizes do not divide, --tp-plan with
--emit-args, --explain with --json). These were not:

1. A pinned --tensor-model-parallel-size that splits neither the model nor the GPUs (tp 5 of gpt2's 12 heads on 8
   GPUs) named the reasons, then "Try more GPUs, a GPU with more memory, or unpin dimensions" -- memory was never
   the problem. Now the TP sizes that split the model on those GPUs (a pinned --pipeline-model-parallel-size 24
   of 12 layers, or 3 on 8 GPUs: the PP sizes); and a request rejected for no memory reason no longer points at
   memory.
2. `hybrid calibrate --out LINK` (to a profile, or to nothing) measured for its minute, then the rename replaced the
   link itself with a file; `hybrid plan --plot LINK` the same after the search. Now one line before the work, as
   write_text and every benchmark's --out refuse a link (trust17).
3. `hybrid plan --help` printed the --plot example joined to the line before it by a run of spaces (the docstring's
   line continuation was a Python escape, as test_newuser11's inspect example was).
4. `hybrid calibrate --ranks 1` said "spawning 1 gloo ranks" and "with 1 ranks at once".
5. An empty --hardware (`--hardware $HW` with HW unset) was ignored: the plan was made on the a100-80g preset, the
   table headed by it and nothing said; an empty --plot wrote no plot, an empty --scan-gpus said "--gpus is
   required". Now train.py's line for an empty flag, before the search.
"""

from __future__ import annotations

import os

import pytest

from hybrid.planner import cli as plan_cli


def _plan_error(argv: list[str], capsys) -> str:
    assert plan_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


GPT2_8 = ["--model", "gpt2", "--gpus", "8", "--global-batch-size", "64"]


@pytest.mark.parametrize("argv, fix", [
    (GPT2_8 + ["--tensor-model-parallel-size", "5"],
     "Give --tensor-model-parallel-size 1, 2 or 4 (the sizes that split the model on 8 GPUs)."),
    (["--model", "gpt2", "--gpus", "7", "--global-batch-size", "64", "--tensor-model-parallel-size", "2"],
     "Give --tensor-model-parallel-size 1 (the sizes that split the model on 7 GPUs)."),
    (GPT2_8 + ["--pipeline-model-parallel-size", "24"],
     "Give --pipeline-model-parallel-size 1, 2, 4 or 8 (the sizes that split the layers on 8 GPUs)."),
    (GPT2_8 + ["--pipeline-model-parallel-size", "3"],
     "Give --pipeline-model-parallel-size 1, 2, 4 or 8 (the sizes that split the layers on 8 GPUs)."),
    (GPT2_8 + ["--micro-batch-size", "3"], "Change the sizes the reasons name, or unpin dimensions."),
])
def test_a_request_no_memory_would_fix_names_the_fix_that_would(argv, fix, capsys):
    line = _plan_error(argv, capsys)
    assert line.startswith("hybrid plan: error: no layout of the 124.4M-parameter model") and line.endswith(fix), line


def test_each_size_offered_plans(capsys):
    """gpt2 (12 heads, MLP 3072, 12 layers) on one node of 8: tp 1, 2, 4 divide heads, MLP and GPUs (8 does not
    divide 12 heads); pp 1, 2, 4, 8 divide the GPUs and are at most the 12 layers."""
    for flag, sizes in (("--tensor-model-parallel-size", "124"), ("--pipeline-model-parallel-size", "1248")):
        for size in sizes:
            assert plan_cli.main(GPT2_8 + [flag, size, "--top", "1", "--json"]) == 0, (flag, size)
    capsys.readouterr()


def test_an_out_of_memory_request_still_points_at_memory(capsys):
    line = _plan_error(["--model", "llama-3-70b", "--gpus", "8", "--global-batch-size", "64", "--zero-stage", "0",
                        "--recompute-granularity", "none"], capsys)
    assert "rejected for OOM" in line and line.endswith("Try more GPUs, a GPU with more memory, or unpin "
                                                        "dimensions."), line


@pytest.mark.parametrize("target", ["profile", "nowhere"])
def test_calibrate_out_a_link_is_one_line_before_any_work(target, tmp_path, one_line, monkeypatch):
    from hybrid.cli import main
    from hybrid.planner import calibrate
    monkeypatch.setattr(calibrate, "calibrate", lambda cfg: pytest.fail("measured before the --out check"))
    (tmp_path / "profile").write_text('{"format": "hybrid-hardware-profile/1", "hardware": {}}\n')
    link = tmp_path / "hw.json"
    link.symlink_to(target)
    line = one_line(lambda: main(["calibrate", "--out", str(link)]))
    assert line == (f"hybrid calibrate: error: --out {str(link)!r} is a symbolic link (to {target!r}); give the "
                    f"file's own path (nothing is written through a link)"), line
    assert os.readlink(link) == target


def test_plan_plot_a_link_is_one_line_before_the_search(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(plan_cli, "search", lambda *a, **k: pytest.fail("searched before the --plot check"))
    link = tmp_path / "mem.png"
    link.symlink_to("elsewhere.png")
    line = _plan_error(GPT2_8 + ["--plot", str(link)], capsys)
    assert line == (f"hybrid plan: error: --plot {str(link)!r} is a symbolic link (to 'elsewhere.png'); give the "
                    f"file's own path (nothing is written through a link)"), line


def test_plan_help_shows_the_plot_example_on_two_lines(capsys):
    with pytest.raises(SystemExit):
        plan_cli.main(["--help"])
    out = capsys.readouterr().out
    assert "--seq-length 4096 \\\n                --plot mem.png" in out, out


def test_calibrate_counts_one_rank_in_the_singular(tmp_path, capsys, monkeypatch):
    from hybrid.cli import main
    from hybrid.planner import calibrate

    class Stop(Exception):
        pass

    monkeypatch.setattr(calibrate, "ranks_leave_ctrl_c_to_this_process", lambda: None)
    monkeypatch.setattr(calibrate, "calibrate", lambda cfg: (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        main(["calibrate", "--ranks", "1", "--backend", "gloo", "--out", str(tmp_path / "hw.json")])
    assert capsys.readouterr().out == "calibrate: spawning 1 gloo rank ...\n"


@pytest.mark.parametrize("flag", ["--hardware", "--plot", "--scan-gpus", "--model"])
def test_an_empty_path_or_list_is_one_line_naming_it(flag, capsys, monkeypatch):
    monkeypatch.setattr(plan_cli, "search", lambda *a, **k: pytest.fail("searched with an empty " + flag))
    argv = [a for a in GPT2_8 if a not in ("--model", "gpt2")] if flag == "--model" else list(GPT2_8)
    if flag == "--scan-gpus":
        argv = [a for a in argv if a not in ("--gpus", "8")]
    assert _plan_error(argv + [flag, ""], capsys) == f"hybrid plan: error: {flag} is empty; give a value or omit " \
                                                       f"the flag"


def test_a_width_the_heads_do_not_divide_names_the_widths_and_head_counts_that_work(capsys):
    """--hidden-size 100 with 3 heads: the nearest multiples of 3 (99, 102) and the head counts dividing 100, each of
    which then plans (round 17's new-user finding: the line named no valid value)."""
    sizes = ["--num-layers", "4", "--gpus", "2", "--global-batch-size", "8", "--seq-length", "128"]
    line = _plan_error(sizes + ["--hidden-size", "100", "--num-attention-heads", "3"], capsys)
    assert line.endswith("--hidden-size 100 is not divisible by --num-attention-heads 3; give --hidden-size 99 or "
                         "102, or --num-attention-heads 2, 4, 5 or 10"), line
    for fixed in (["--hidden-size", "99", "--num-attention-heads", "3"], ["--hidden-size", "102", "--num-attention-heads", "3"],
                  ["--hidden-size", "100", "--num-attention-heads", "5"]):
        assert plan_cli.main(sizes + fixed + ["--top", "1", "--json"]) == 0, fixed
    capsys.readouterr()
