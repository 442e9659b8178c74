"""train.py with the data pipeline: a blend of indexed datasets trains, the validation loss is the same on every
layout and printed as Megatron prints it, the TensorBoard events (read back with tensorboard's EventAccumulator)
and the JSON-lines records hold the logged numbers, and bad data inputs are one error line before any process
group."""

from __future__ import annotations

import importlib
import json
import os
import re

import numpy as np
import pytest
import torch.distributed as dist

from hybrid import testing
from hybrid.data.indexed import IndexedDatasetWriter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
train_main = importlib.import_module("hybrid.train.main")
VALID = re.compile(r"^ validation loss at iteration (\d+)( on (?:validation|test) set)? \| lm loss value: (\S+) \| "
                   r"lm loss PPL: (\S+) \| $", re.M)


def byte_dataset(prefix: str, n_docs: int = 300, seed: int = 0) -> None:
    """Byte-token documents (vocabulary 256, the tiny presets') from the pydoc corpus' paragraphs."""
    import pydoc_data.topics
    text = "\n\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)).encode()
    paras = [p for p in text.split(b"\n\n") if p][:n_docs]
    w = IndexedDatasetWriter(prefix, np.uint16)
    for p in paras:
        w.add_document(np.frombuffer(p, np.uint8).astype(np.uint16))
    w.finalize()


COMMON = ["--seq-length", "32", "--global-batch-size", "8", "--train-iters", "4", "--log-interval", "2",
          "--eval-interval", "2", "--eval-iters", "2", "--split", "90,8,2"]


def _run(nproc: int, argv: list[str]) -> str:
    """`torchrun --nproc-per-node N scripts/train.py ARGV` (N > 1) or `python scripts/train.py ARGV`, as forks of
    hybrid.testing's forkserver."""
    env = {"OMP_NUM_THREADS": "1"}
    if nproc > 1:
        out = testing.torchrun(argv, nproc, env=env, cwd=ROOT, timeout=300)
    else:
        out = testing.run([os.path.join(ROOT, "scripts", "train.py"), *argv], env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One single-process run on a blend of two indexed datasets, writing TensorBoard and JSON lines."""
    d = tmp_path_factory.mktemp("ref")
    byte_dataset(str(d / "a"), 200)
    byte_dataset(str(d / "b"), 400)
    data = ["--data-path", "0.4", str(d / "a"), "0.6", str(d / "b")]
    out = _run(1, COMMON + data + ["--micro-batch-size", "2", "--timing-log-interval", "1",
                                   "--tensorboard-dir", str(d / "tb"),
                                   "--metrics-file", str(d / "m.jsonl"), "--hardware", hardware_profile(d, 2.0)])
    return data, out, d


def hardware_profile(d, fp32_tflops: float) -> str:
    """A `hybrid calibrate` profile whose fp32 matmul rate is `fp32_tflops` (MFU's peak for an fp32 run; no
    compute_units, so not shared among ranks)."""
    import dataclasses

    from hybrid.planner.calibrate import FORMAT
    from hybrid.planner.hardware import hardware
    hw = dataclasses.asdict(hardware("cpu").with_overrides(compute_units=None))
    path = d / "hw.json"
    path.write_text(json.dumps({"format": FORMAT, "hardware": hw, "matmul_tflops": {"fp32": fp32_tflops}}))
    return str(path)


@pytest.mark.slow
def test_validation_loss_is_the_same_on_every_layout(reference):
    """The 3 validation/test numbers (iteration 2; iteration 4 once, by the final evaluation, on the samples the
    periodic one would read; the test set) of tp 2 x pp 2 with sequence
    parallelism, of pp 2 (interleaved, v 2) x dp 2 and of ZeRO-3 (parameters gathered by forward hooks) x dp 2
    equal the single process's. Tolerance 1e-5 relative: the line prints 7 digits (rounding <= 1e-6 relative)
    and the runs differ only by fp32 reduction order over 4 steps (observed <= 2e-7 relative)."""
    data, ref, _ = reference
    found = VALID.findall(ref)
    assert [(it, where) for it, where, _, _ in found] == [("2", ""), ("4", " on validation set"),
                                                          ("4", " on test set")], ref
    ref_losses = [float(v) for _, _, v, _ in found]
    for _, _, v, ppl in found:
        assert float(ppl) == pytest.approx(np.exp(float(v)), rel=1e-6)
    for nproc, layout in ((4, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                               "--sequence-parallel", "--micro-batch-size", "2"]),
                          (4, ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
                               "--micro-batch-size", "1"]),
                          (2, ["--zero-stage", "3", "--zero3-keep-gathered", "--micro-batch-size", "2"])):
        out = _run(nproc, COMMON + data + layout)
        assert [float(v) for _, _, v, _ in VALID.findall(out)] == pytest.approx(ref_losses, rel=1e-5), out


@pytest.mark.slow
def test_tensorboard_and_metrics_file_hold_the_logged_numbers(reference):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, out, d = reference
    tb, jl = d / "tb", d / "m.jsonl"
    logged = {int(m[0]): (float(m[1]), float(m[2]), float(m[3])) for m in re.findall(
        r"iteration +(\d+)/\d+ \| lm loss (\S+) \|.* \| ([\d.e+-]+) TFLOP/s/device \| MFU ([\d.]+)%", out)}
    valid = [float(v) for v in re.findall(r"validation loss at iteration \d+[^|]* \| lm loss value: (\S+)", out)]
    assert sorted(logged) == [2, 4] and len(valid) == 3, out
    assert "metrics: MFU against 2 TFLOP/s per rank (--hardware " in out, out  # the profile's fp32 rate
    acc = EventAccumulator(str(tb))
    acc.Reload()
    scalars = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    assert {"lm loss", "learning-rate", "grad-norm", "throughput", "lm loss validation"} <= set(scalars)
    records = [json.loads(line) for line in jl.read_text().splitlines()]
    train = {r["iteration"]: r for r in records if "lm_loss" in r}
    for it, (loss, tflops, mfu) in logged.items():
        assert scalars["lm loss"][it] == pytest.approx(loss, abs=5e-5)  # the line prints 4 decimals
        assert scalars["lm loss"][it] == pytest.approx(train[it]["lm_loss"], rel=1e-7)  # TensorBoard: float32
        assert train[it]["tflops_per_device"] == pytest.approx(tflops, rel=5e-3)  # printed to 3 digits
        assert train[it]["mfu"] == pytest.approx(train[it]["tflops_per_device"] / 2, rel=1e-12)
        assert 100 * train[it]["mfu"] == pytest.approx(mfu, abs=5e-3)
        assert train[it]["consumed_samples"] == it * 8  # --global-batch-size 8
        assert scalars["mem-peak-rss-bytes"][it] == pytest.approx(train[it]["peak_rss_bytes"], rel=1e-7)
        assert train[it]["peak_rss_bytes_per_rank"] == [train[it]["peak_rss_bytes"]]  # one rank
    assert scalars["lm loss validation"][2] == pytest.approx(valid[0], rel=1e-6)  # printed to 7 digits
    assert scalars["lm loss test"][4] == pytest.approx(valid[-1], rel=1e-6)


def _no_process_group(*a, **k):
    raise AssertionError("a process group was started for a bad input")


def _bad_cases(d: str):
    byte_dataset(f"{d}/ok", 50)
    byte_dataset(f"{d}/tiny", 2)  # two short paragraphs: fewer tokens than one --seq-length 256 sample
    os.makedirs(f"{d}/noidx", exist_ok=True)
    byte_dataset(f"{d}/noidx/x", 5)
    os.remove(f"{d}/noidx/x.idx")
    byte_dataset(f"{d}/trunc", 20)
    with open(f"{d}/trunc.bin", "r+b") as f:
        f.truncate(10)
    big = IndexedDatasetWriter(f"{d}/bigvocab", np.uint16)
    big.add_document(np.arange(0, 1000))
    big.finalize()
    with open(f"{d}/tok.json", "w") as f:  # a tokenizers JSON with a vocabulary of 300 > tiny-gpt2's 256
        json.dump({"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None,
                   "post_processor": None, "decoder": None,
                   "model": {"type": "WordLevel", "vocab": {f"w{i}": i for i in range(300)}, "unk_token": "w0"}}, f)
    from transformers import GPT2Config
    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=64).to_json_file(f"{d}/small.json")
    return [
        (["--model", f"{d}/small.json", "--seq-length", "32"], "byte tokens need a vocabulary of 256"),
        (["--data-path", f"{d}/missing"], "--data-path"),
        (["--data-path", f"{d}/noidx/x"], "x.idx is missing"),
        (["--data-path", f"{d}/trunc"], "truncated"),
        (["--data-path", f"{d}/ok.bin"], "give the prefix"),
        (["--data-path", "0.5", f"{d}/ok", "x", f"{d}/ok"], "weight/prefix pairs"),
        (["--data-path", f"{d}/ok", "--split", "1,2,3,4"], "--split"),
        (["--data-path", f"{d}/tiny", "--seq-length", "256", "--split", "1,0,0"], "fewer than one sample"),
        (["--data-path", f"{d}/bigvocab"], "token id 999"),
        (["--data-path", f"{d}/ok", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
          f"{d}/tok.json"], "vocabulary 300 exceeds the model's 256"),
        (["--eval-iters", "-1"], "--eval-iters"),
        (["--eval-interval", "0"], "--eval-interval"),
        (["--data-path", f"{d}/ok", "--split", "0,1,0"], "gives training no data"),
    ]


def test_bad_data_inputs_are_one_error_line_before_any_process_group(tmp_path, monkeypatch, capsys):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_ERROR_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(dist, "init_process_group", _no_process_group)
    cases = _bad_cases(str(tmp_path))
    capsys.readouterr()  # what writing the cases' files printed (transformers' warnings on small.json's token ids)
    for argv, fragment in cases:
        with pytest.raises(SystemExit) as e:
            train_main.main(argv)
        out, err = capsys.readouterr()
        text = err + (f"{e.value.code}\n" if isinstance(e.value.code, str) else "")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("train.py: error: "), (argv, lines)
        assert fragment in lines[0], (fragment, lines[0])


@pytest.mark.slow
def test_the_run_prints_its_measured_time_split_and_the_planners_prediction(reference):
    """Every log interval: the measured split of the step (op-trail phases, hybrid/fault/straggler.py); once at the
    start with --hardware: the planner's prediction of the same shares for this layout (hybrid/metrics/split.py).
    A single process has no collectives and no pipeline: both say 0 there, and each line's shares add up to 100 %
    (to the printed rounding)."""
    _, out, _ = reference
    splits = re.findall(r"^time split, iterations \d+-\d+ \(mean over ranks\): compute ([\d.]+)%, collectives "
                        r"([\d.]+)%, pipeline waits ([\d.]+)%, optimizer ([\d.]+)%, other ([\d.]+)%$", out, re.M)
    assert len(splits) == 2, out
    for shares in splits:
        assert sum(map(float, shares)) == pytest.approx(100, abs=0.3) and float(shares[1]) == float(shares[2]) == 0
    (pred,) = re.findall(r"^planner: predicted \S+ s/step on .*: compute ([\d.]+)%, collectives ([\d.]+)%, pipeline "
                         r"waits ([\d.]+)% \(bubble [\d.]+%\), optimizer ([\d.]+)%$", out, re.M)
    assert sum(map(float, pred)) == pytest.approx(100, abs=0.3) and float(pred[1]) == float(pred[2]) == 0, pred
