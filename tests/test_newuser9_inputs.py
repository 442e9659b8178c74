"""Ninth-round new-user findings: what a first-time user met following README.md and docs/ through the newest
features -- a --timeline at pp 1 that drew nothing, 1-bit Adam's refusals met one per try, `hybrid plan --plot`
given a name matplotlib cannot write refused after the search with a random temporary's suffix as the "format".

In this process, one rank, no process group (the shared harness: hybrid/testing_inputs.py, conftest's `one_line`),
except the one train.py run marked slow."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn as nn

import hybrid.cli
from hybrid.pipeline.timeline import chrome_trace
from hybrid.train.main import validate
from hybrid.train_step import LocalForwardBackward

pytestmark = pytest.mark.usefixtures("one_process")  # tests/conftest.py: python, not torchrun: world 1


def _world(monkeypatch, n: int) -> None:
    """torchrun's environment for rank 0 of `n` on one node: validate then checks the layout of an n-rank job."""
    for name, value in (("WORLD_SIZE", str(n)), ("RANK", "0"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", str(n)),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)


# --- 1. --timeline at pp 1: the local step records F / B as one pipeline stage does ----------------------------------
class _TinyLM(nn.Module):
    """(inputs, labels) -> a scalar loss, as the model chunks train.py builds."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Linear(4, 4)

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return ((self.w(inputs) - labels) ** 2).mean()


def _batches(m: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)) for _ in range(m)]


def test_pp1_timeline_has_a_forward_and_a_backward_per_micro_batch():
    """It wrote a trace with the process-name row alone (LocalForwardBackward kept no events): Perfetto showed
    nothing. Each F ends where its B starts, in micro-batch order, and only the latest step is kept."""
    runner = LocalForwardBackward(_TinyLM(), torch.device("cpu"), record_timeline=True)
    runner.forward_backward(_batches(3))
    runner.forward_backward(_batches(3))
    names = [(e.name, e.microbatch) for e in runner.events]
    assert names == [(op, mb) for mb in range(3) for op in ("forward", "backward")]
    for f, b in zip(runner.events[::2], runner.events[1::2]):
        assert f.start <= f.end == b.start <= b.end
    trace = chrome_trace({0: runner.events}, {0: 0})
    assert [e["name"] for e in trace["traceEvents"] if e["ph"] == "X"] == ["F0", "B0", "F1", "B1", "F2", "B2"]


def test_pp1_timeline_off_records_nothing_and_the_loss_is_the_same():
    torch.manual_seed(0)
    on, off = _TinyLM(), _TinyLM()
    off.load_state_dict(on.state_dict())
    loss_on = LocalForwardBackward(on, torch.device("cpu"), record_timeline=True).forward_backward(_batches(2))
    quiet = LocalForwardBackward(off, torch.device("cpu"))
    assert torch.equal(quiet.forward_backward(_batches(2)), loss_on) and quiet.events == []
    assert torch.equal(on.w.weight.grad, off.w.weight.grad)


def _train_pp1(rank: int, world: int, argv: list[str]) -> None:
    from hybrid.train import loop
    from hybrid.train.args import configure, parse_args
    run, corpus = configure(parse_args(argv), world)
    loop.run(run, corpus, torch.device("cpu"))


@pytest.mark.slow
def test_train_py_pp1_timeline_file_shows_the_steps_compute_and_a_finished_rerun_keeps_it(tmp_path):
    """train.py's own wiring (loop.build_runner): one rank, pp 1, two micro-batches. The same command again (it
    resumes from its --save, finished: no step to run) used to replace that trace with an empty one."""
    from hybrid.testing import run_distributed
    path = str(tmp_path / "t.json")
    argv = ["--model", "tiny-gpt2", "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--train-iters", "1", "--eval-iters", "0", "--timeline", path, "--save", str(tmp_path / "ck")]
    run_distributed(_train_pp1, 1, args=(argv,), timeout=300)
    with open(path) as f:
        first = f.read()
    assert [e["name"] for e in json.loads(first)["traceEvents"] if e["ph"] == "X"] == ["F0", "B0", "F1", "B1"]
    run_distributed(_train_pp1, 1, args=(argv + ["--load", str(tmp_path / "ck")],), timeout=300)
    with open(path) as f:
        assert f.read() == first


# --- 2. 1-bit Adam: every conflict in the one line, not one per try --------------------------------------------------
def test_onebit_adam_with_offload_at_zero1_names_clip_and_offload_at_once(one_line, monkeypatch):
    """It took two tries: the default --clip-grad 1.0 was refused first; with --clip-grad 0 the next try was refused
    for --offload-optimizer."""
    _world(monkeypatch, 2)
    argv = ["--optimizer", "onebit-adam", "--zero-stage", "1", "--offload-optimizer", "--onebit-freeze-iters", "1",
            "--train-iters", "3"]
    line = one_line(lambda: validate(argv))
    assert line.startswith("train.py: error: --clip-grad does not run with --optimizer onebit-adam"), line
    assert "pass --clip-grad 0" in line and "drop --offload-optimizer" in line, line
    # the fixes the line names, taken together, give a run train.py accepts
    run = validate([a for a in argv if a != "--offload-optimizer"] + ["--clip-grad", "0"])[0]
    assert run.zero.stage == 1


@pytest.mark.parametrize("argv, pieces", [
    (["--zero-stage", "3", "--offload-optimizer", "--fp16"],
     ["--zero-stage 3", "drop --fp16", "drop --offload-optimizer"]),
    (["--zero-stage", "2", "--powersgd-rank", "2", "--powersgd-start-iter", "2"],
     ["pass --clip-grad 0", "--powersgd-rank are exclusive"]),
])
def test_onebit_adam_names_every_conflict(argv, pieces, one_line, monkeypatch):
    _world(monkeypatch, 2)
    line = one_line(lambda: validate(["--optimizer", "onebit-adam", "--onebit-freeze-iters", "1",
                                      "--train-iters", "3"] + argv))
    for piece in pieces:
        assert piece in line, line
    assert line.count("; also ") == len(pieces) - 1, line


# --- 3. hybrid plan --plot: the image format is checked with the file, before the search ----------------------------
PLAN = ["plan", "--model", "tiny-gpt2", "--gpus", "4", "--global-batch-size", "16", "--seq-length", "128",
        "--gpu", "h100-80g"]


@pytest.mark.parametrize("name, want", [("plan", "has no extension"), ("plan.txt", "has extension .txt")])
def test_plan_plot_without_an_image_extension_is_one_line_before_the_search(name, want, tmp_path, one_line,
                                                                          monkeypatch):
    """It searched, then failed in savefig: "Format 'mkezqglq' is not supported" (the temporary's random suffix)."""
    import hybrid.planner.cli as plan_cli

    def no_search(*a, **k):
        raise AssertionError("searched before refusing --plot")

    monkeypatch.setattr(plan_cli, "search", no_search)
    path = str(tmp_path / name)
    line = one_line(lambda: hybrid.cli.main(PLAN + ["--plot", path]))
    assert line.startswith(f"hybrid plan: error: --plot {path!r} {want}"), line
    assert "FILE.png" in line and os.listdir(tmp_path) == []


def test_plan_plot_formats_matplotlib_writes_still_pass():
    from matplotlib.backend_bases import FigureCanvasBase
    from hybrid.planner.cli import _check_plot_format
    formats = FigureCanvasBase.get_supported_filetypes()
    for name in ("m.png", "m.PNG", "dir.v2/m.svg", "m.pdf"):
        _check_plot_format(name, formats)


# --- 4. hybrid plan --context-parallel-size on an MoE model ---------------------------------------------------------
# It ranked CP layouts train.py then refused; round 16 runs CP x EP (hybrid/moe), so the planner ranks them
# (tests/test_cpmoe16_planner.py) and CP 1 stays the plain search:
def test_plan_cp_size_1_of_an_moe_model_still_plans(capsys):
    hybrid.cli.main(["plan", "--model", "tiny-mixtral", "--gpus", "4", "--global-batch-size", "16", "--seq-length",
                     "128", "--gpu", "h100-80g", "--context-parallel-size", "1", "--top", "1"])
    assert " 1  tp" in capsys.readouterr().out


# --- 5. hybrid generate: an empty prompt named as such --------------------------------------------------------------
def test_generate_empty_prompt_names_the_flag():
    """'--prompt ""' said "prompt: 0 tokens, 0 outside the vocabulary [0, 256)" (--prompt-ids '' is refused by its
    parse: no id)."""
    import argparse
    from types import SimpleNamespace
    from hybrid.generate.decode import prompt_ids
    codec = SimpleNamespace(encode=lambda text: list(text.encode()))  # UTF-8 bytes, as the byte-level codec
    cfg = SimpleNamespace(vocab_size=256, max_position_embeddings=64)
    with pytest.raises(ValueError, match="^--prompt is empty \\(0 tokens\\); give a prompt of at least one token$"):
        prompt_ids(argparse.Namespace(prompt="", prompt_ids=None), cfg, codec)
    assert prompt_ids(argparse.Namespace(prompt="hi", prompt_ids=None), cfg, codec).tolist() == [[104, 105]]


# --- 6. hybrid plan --scan-gpus --top: the best layout per count, --top was ignored ---------------------------------
def test_plan_scan_gpus_with_top_is_one_line(one_line):
    argv = ["plan", "--model", "tiny-gpt2", "--global-batch-size", "16", "--seq-length", "128", "--gpu", "h100-80g",
            "--scan-gpus", "2,4", "--top", "3"]
    line = one_line(lambda: hybrid.cli.main(argv))
    assert line == ("hybrid plan: error: --top does not run with --scan-gpus (one row, the best layout, per GPU "
                    "count); drop one of them")


def test_plan_top_unset_shows_five(capsys):
    hybrid.cli.main(PLAN)
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln[:3].strip().isdigit()]
    assert [int(r.split()[0]) for r in rows] == [1, 2, 3, 4, 5]
