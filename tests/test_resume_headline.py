"""Exact resume of the headline configuration through train.py under torchrun, with dropout on (issue 24).

tp 2 x pp 2 x dp 2 on 8 CPU ranks, ZeRO 3 with the optimizer and the parameters offloaded (DeepSpeed's CPU Adam
when it builds, `--cpu-adam auto`), `--bf16`, Llama (GQA) with `--hidden-dropout 0.1 --attention-dropout 0.1`, so
every step draws dropout masks from each rank's tensor-parallel RNG streams (hybrid/tp/random.py):

* run A trains 4 steps and saves after steps 2 and 4;
* run B, new processes, resumes from A's step 2 (`--ckpt-step 2`) and trains to 4;
* run C does the same with `--no-load-rng`.

B's weights (fp32 master weights, both Adam moments) and logged losses after step 4 equal A's bit for bit; C's
differ -- the check that fails when the RNG state is not restored (C is that mutation, run every time)."""

from __future__ import annotations

import re

import pytest
import torch

from hybrid import testing
from hybrid.checkpoint import safe_read, store

HEADLINE = ["--model", "tiny-llama", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
            "--zero-stage", "3", "--offload-optimizer", "--offload-params", "--bf16",
            "--hidden-dropout", "0.1", "--attention-dropout", "0.1",
            "--seq-length", "32", "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "4",
            "--log-interval", "1", "--eval-iters", "1"]  # the end's validation and test: one batch each, not 10
# (none is read here; at 10 they were half of each run's CPU: 12 vs 6 s of the ranks' CPU a run, measured)


def _torchrun(argv: list[str], cwd) -> str:
    """`torchrun --standalone --nproc-per-node 8 -m hybrid.train HEADLINE ARGV`, the ranks forked from
    hybrid.testing's forkserver (new processes each run, as torchrun's: nothing carries over but the files)."""
    env = {k: None for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HYBRID_FAULT", "TORCHELASTIC_RESTART_COUNT")}
    out = testing.torchrun(HEADLINE + argv, 8, env={**env, "OMP_NUM_THREADS": "1"}, cwd=str(cwd), timeout=900)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    return out.stdout


def _losses(stdout: str) -> dict[int, str]:
    return {int(i): loss for i, loss in re.findall(r"iteration +(\d+)/\d+ \| lm loss (\S+)", stdout)}


def _tensors(it_dir: str) -> dict[str, torch.Tensor]:
    """Every saved tensor but the RNG states, read whole (DCP gathers the chunks every rank wrote)."""
    meta = safe_read.read_metadata(it_dir).state_dict_metadata
    sd = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype) for k, m in meta.items() if not k.startswith("rng/")}
    safe_read.load(sd, it_dir, no_dist=True)
    return sd


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("headline")
    a = _torchrun(["--save", str(root / "A"), "--save-interval", "2"], root)
    b = _torchrun(["--load", str(root / "A"), "--ckpt-step", "2", "--save", str(root / "B")], root)
    c = _torchrun(["--load", str(root / "A"), "--ckpt-step", "2", "--no-load-rng", "--save", str(root / "C")], root)
    return {"root": root, "A": a, "B": b, "C": c}


@pytest.mark.slow  # three 8-rank train.py runs
def test_the_headline_configuration_resumes_bit_identically_with_dropout(runs):
    root = runs["root"]
    assert "zero: stage 3 | bf16 | offload optimizer" in runs["A"] and "| offload params" in runs["A"]
    assert "resumed from" in runs["B"] and "RNG not restored" not in runs["B"]
    want, got = _tensors(store.final_path(str(root / "A"), 4)), _tensors(store.final_path(str(root / "B"), 4))
    assert sorted(want) == sorted(got) and any(k.startswith("optim.exp_avg/") for k in want)
    for key in want:
        assert torch.equal(want[key], got[key]), key
    a, b = _losses(runs["A"]), _losses(runs["B"])
    assert sorted(b) == [3, 4] and all(a[i] == b[i] for i in b), (a, b)


@pytest.mark.slow  # three 8-rank train.py runs
def test_without_the_rng_restore_the_resumed_run_differs(runs):
    """The mutation the test above must catch: the same resume with the dropout streams not restored."""
    assert "RNG not restored (--no-load-rng)" in runs["C"]
    want, other = _tensors(store.final_path(str(runs["root"] / "A"), 4)), \
        _tensors(store.final_path(str(runs["root"] / "C"), 4))
    assert any(not torch.equal(want[k], other[k]) for k in want if k.startswith("model/"))
