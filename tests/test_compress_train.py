"""train.py with gradient compression: its flags are checked before any process group, and a PowerSGD run saved
mid-run (after compression started: error feedback and warm-start factors non-zero) resumes bit for bit."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from hybrid import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import train as train_script  # noqa: E402

COMMON = ["--global-batch-size", "8", "--seq-length", "32", "--micro-batch-size", "2", "--log-interval", "1",
          "--lr", "3e-3", "--train-iters", "6", "--powersgd-rank", "2", "--powersgd-start-iter", "2",
          "--zero-stage", "2", "--eval-iters", "1"]  # end-of-run validation and test: one batch each (none read)


def runnable(argv: list[str]) -> list[str]:
    """`argv` without COMMON's --powersgd-start-iter where its last --powersgd-rank is 0 (a run over COMMON with
    PowerSGD switched off): train.py refuses a flag that nothing would read."""
    ranks = [argv[i + 1] for i, word in enumerate(argv) if word == "--powersgd-rank"]
    if not ranks or ranks[-1] != "0" or "--powersgd-start-iter" not in argv:
        return argv
    i = argv.index("--powersgd-start-iter")
    return argv[:i] + argv[i + 2:]


@pytest.mark.parametrize("argv,message", [
    (["--powersgd-rank", "-1"], "--powersgd-rank must be a non-negative integer"),
    (["--powersgd-rank", "2", "--powersgd-start-iter", "1"], "--powersgd-start-iter must be >= 2"),
    (["--powersgd-rank", "2", "--zero-stage", "3"], "--powersgd-rank does not run with --zero-stage 3"),
    (["--simulated-dp-bandwidth", "-1"], "--simulated-dp-bandwidth must be a finite number >= 0"),
    (["--optimizer", "onebit-adam", "--onebit-freeze-iters", "0"], "--onebit-freeze-iters must be a positive"),
    (["--optimizer", "onebit-adam", "--zero-stage", "3"], "--optimizer onebit-adam does not run with --zero-stage 3"),
    (["--optimizer", "onebit-adam", "--powersgd-rank", "2"], "--optimizer onebit-adam and --powersgd-rank are"),
    (["--optimizer", "onebit-adam", "--fp16"], "--optimizer onebit-adam does not run with --fp16"),
    (["--powersgd-rank", "2", "--diloco-inner-steps", "4"], "--powersgd-rank does not run with --diloco-inner-steps"),
])
def test_bad_compression_flags_are_rejected_before_any_process_group(argv, message, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit, match=re.escape(message)) as e:
        train_script.main(argv)
    assert "\n" not in str(e.value)
    assert not torch.distributed.is_initialized()


def _losses(path: str) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "lm_loss" in rec:
                found.setdefault(rec["iteration"], []).append(repr(rec["lm_loss"]))
    return found


def _tensors(root: str) -> dict[str, torch.Tensor]:
    it_dir = os.path.join(root, open(os.path.join(root, "latest")).read().strip())
    meta = dcp.FileSystemReader(it_dir).read_metadata().state_dict_metadata
    sd = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items()
          if isinstance(m, TensorStorageMetadata)}
    dcp.load(sd, storage_reader=dcp.FileSystemReader(it_dir), no_dist=True)
    return sd


def _run(flags: list[str]):
    out = testing.torchrun(runnable(COMMON + flags), 2, env={"OMP_NUM_THREADS": "1"}, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


ONEBIT = ["--powersgd-rank", "0", "--zero-stage", "0", "--optimizer", "onebit-adam", "--onebit-freeze-iters", "2"]


@pytest.mark.parametrize("method", ["powersgd-zero2", "onebit-adam"])
def test_compressed_run_saved_mid_run_resumes_bit_for_bit_dp2(tmp_path, method):
    """Saved after step 4 (compression running since step 3: error feedback non-zero), resumed for steps 5-6:
    the losses and every saved tensor (weights, moments, error feedback) equal the uninterrupted run's."""
    extra = ONEBIT if method == "onebit-adam" else []
    a = assert_resume_bit_for_bit(lambda flags: _run(extra + flags), tmp_path)
    errors = [k for k in a if k.startswith("compress/") and "error" in k]
    assert errors and any(a[k].abs().max() > 0 for k in errors), sorted(a)[:20]


def assert_resume_bit_for_bit(run, tmp_path) -> dict:
    """`run(flags)` 6 steps straight, and 4 + 2 across a save and --load: the same loss at every step and every
    saved tensor bit for bit; returns the straight run's tensors (for the caller's own key checks)."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir(), resumed.mkdir()
    run(["--save", str(straight / "ckpt"), "--metrics-file", str(straight / "m.jsonl")])
    run(["--save", str(resumed / "ckpt"), "--exit-interval", "4", "--metrics-file", str(resumed / "m.jsonl")])
    run(["--load", str(resumed / "ckpt"), "--save", str(resumed / "ckpt"), "--metrics-file",
         str(resumed / "m2.jsonl")])
    want, first, second = (_losses(str(straight / "m.jsonl")), _losses(str(resumed / "m.jsonl")),
                           _losses(str(resumed / "m2.jsonl")))
    assert sorted(first) == [1, 2, 3, 4] and sorted(second) == [5, 6], (first, second)
    for it in range(1, 7):
        assert (first.get(it) or second.get(it)) == want[it], it
    a, b = _tensors(str(straight / "ckpt")), _tensors(str(resumed / "ckpt"))
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    return a


# slow: 4 train.py runs end to end. The fast tier keeps the link's own checks in tests/test_compress_link.py (it
# sleeps the DP gradient bytes over the bandwidth each step, counts only the DP group's gradient collectives, and is
# off by default)
@pytest.mark.slow
@pytest.mark.parametrize("powersgd", [False, True])
def test_simulated_dp_link_changes_the_time_not_the_numbers(tmp_path, powersgd):
    """--simulated-dp-bandwidth sleeps after each step (hybrid/compress/link.py); the losses stay bit for bit."""
    flags = [] if powersgd else ["--powersgd-rank", "0"]
    plain = _run(flags + ["--train-iters", "3", "--metrics-file", str(tmp_path / "a.jsonl")])
    slow = _run(flags + ["--train-iters", "3", "--simulated-dp-bandwidth", "0.01",
                         "--metrics-file", str(tmp_path / "b.jsonl")])
    assert plain.returncode == slow.returncode == 0
    a, b = _losses(str(tmp_path / "a.jsonl")), _losses(str(tmp_path / "b.jsonl"))
    assert a == b and sorted(a) == [1, 2, 3]


def test_deepspeed_config_onebitadam_sets_the_flags_and_names_what_it_ignores(tmp_path):
    from hybrid.train.args import run_config
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3, "freeze_step": 7}}}))
    run = run_config(train_script.parse_args(["--deepspeed-config", str(path)]), world=2)
    assert run.compress.onebit_freeze_iters == 7 and run.flag_values["optimizer"] == "onebit-adam"
    assert "optimizer" not in run.ds_unsupported and run.optimizer.lr == 1e-3  # params.lr read (--lr)
    with pytest.raises(ValueError, match="freeze_step 7 != --onebit-freeze-iters 5"):
        run_config(train_script.parse_args(["--deepspeed-config", str(path), "--onebit-freeze-iters", "5"]), world=2)
    plain = tmp_path / "adam.json"
    plain.write_text(json.dumps({"optimizer": {"type": "Adam"}}))
    run = run_config(train_script.parse_args(["--deepspeed-config", str(plain)]), world=2)
    assert run.compress.onebit_freeze_iters is None and "optimizer" not in run.ds_unsupported
