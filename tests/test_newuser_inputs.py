"""Bad inputs a new user tried (README and docs/*.md followed as written) that used to be accepted silently:
each is now one line naming the flag or file and the fix, before any process group, with nothing written.

Parse-level but one: train.py's `validate` and `hybrid.cli.main` in this process, one rank, no process group;
the resume with nothing left to train runs train.py (marked slow)."""

from __future__ import annotations

import json
import os

import pytest

import hybrid.cli
from hybrid.train.main import validate

pytestmark = pytest.mark.usefixtures("one_process")  # python, not torchrun: world 1 (tests/conftest.py)


def _train_line(argv, one_line) -> str:
    return one_line(lambda: validate(argv))


# --- train.py: flags the chosen optimizer or schedule would never read ----------------------------------------
@pytest.mark.parametrize("argv, want", [
    (["--sgd-momentum", "0.5"], ["--sgd-momentum", "--optimizer sgd", "adam"]),
    (["--optimizer", "onebit-adam", "--sgd-momentum", "0.5"], ["--sgd-momentum", "--optimizer sgd"]),
    (["--optimizer", "sgd", "--adam-beta1", "0.5"], ["--adam-beta1", "drop --adam-beta1", "--optimizer adam"]),
    (["--optimizer", "sgd", "--adam-beta2", "0.99"], ["--adam-beta2", "--sgd-momentum"]),
    (["--lr-warmup-iters", "200", "--train-iters", "100"],
     ["--lr-warmup-iters 200", "--lr-decay-iters (unset: --train-iters 100)", "--lr-warmup-iters < 100"]),
    (["--lr-decay-iters", "5"], ["--lr-warmup-iters 10", "--lr-decay-iters 5", "--lr-decay-style constant"]),
])
def test_train_flag_the_run_would_ignore_is_one_line_naming_it(argv, want, one_line):
    line = _train_line(argv + ["--train-iters", "100"] if "--train-iters" not in argv else argv, one_line)
    assert line.startswith("train.py: error: ")
    for piece in want:
        assert piece in line, line


@pytest.mark.parametrize("argv", [
    ["--optimizer", "sgd", "--sgd-momentum", "0.5"],  # sgd reads its momentum
    ["--adam-beta2", "0.99"],
    ["--train-iters", "2"],  # the default warm-up (10) with a short run: the tests' and docs' cheap runs
    ["--lr-warmup-iters", "5", "--lr-decay-iters", "5", "--lr-decay-style", "constant"],  # no decay to end
    ["--lr-warmup-iters", "2", "--lr-decay-iters", "3", "--train-iters", "5"],
])
def test_train_flags_the_run_reads_still_pass(argv):
    run = validate(argv)[0]
    assert run.optimizer.optimizer in ("adam", "sgd", "onebit-adam")


def test_onebit_adam_reads_the_betas(monkeypatch):
    """1-bit Adam reads the betas (with a freeze inside the default 100 steps: round 8 refuses one at or after
    them). At dp 2: round 19 refuses 1-bit Adam at dp 1 (nothing to compress), so the check runs as rank 0 of a
    2-rank torchrun launch would (no process group: validate stops before one)."""
    for var, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(var, value)
    run = validate(["--optimizer", "onebit-adam", "--onebit-freeze-iters", "10", "--adam-beta1", "0.8"])[0]
    assert (run.optimizer.optimizer, run.optimizer.beta1) == ("onebit-adam", 0.8)


# --- hybrid convert: DST inside SRC --------------------------------------------------------------------------
def _fake_hf_folder(path) -> str:
    """config.json + model.safetensors by name only: `detect` reads no bytes, and the DST check comes first."""
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 2, "vocab_size": 256,
                   "n_positions": 16}, f)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(b"")
    return str(path)


@pytest.mark.parametrize("inside", ["sub", "sub/deeper", "."])
def test_convert_dst_inside_src_is_refused_before_anything_is_written(inside, tmp_path, one_line):
    src = _fake_hf_folder(tmp_path / "hf")
    dst = os.path.join(src, inside)
    before = sorted(os.listdir(src))
    line = one_line(lambda: hybrid.cli.main(["convert", src, dst]))
    assert line.startswith("hybrid convert: error: DST ") and "is inside SRC" in line
    assert "give a DST outside SRC" in line
    assert sorted(os.listdir(src)) == before  # no staging directory, no DST


# --- hybrid generate: more new tokens than the context holds -------------------------------------------------
def test_generate_max_new_tokens_beyond_the_context_is_one_line_with_the_room_left(tmp_path, one_line):
    from transformers import GPT2Config, GPT2LMHeadModel
    src = tmp_path / "hf"
    # a whole checkpoint: generate checks the weights against config.json (round 19) before the prompt's room
    GPT2LMHeadModel(GPT2Config(n_embd=32, n_head=4, n_layer=2, vocab_size=256, n_positions=16)).save_pretrained(src)
    line = one_line(lambda: hybrid.cli.main(["generate", str(src), "--prompt-ids", "1,2,3,4",
                                              "--max-new-tokens", "100"]))
    assert line == ("hybrid generate: error: --max-new-tokens 100: the 4-token prompt leaves 12 of the model's 16 "
                    "positions; use --max-new-tokens 12 or less, or a shorter prompt")
    line = one_line(lambda: hybrid.cli.main(["generate", str(src), "--prompt", "x" * 10]))
    assert "--max-new-tokens 32: the 10-token prompt leaves 6" in line  # the default 32 names the flag too


def test_train_load_of_a_missing_path_names_both_things_load_takes(tmp_path, one_line):
    """docs/checkpoint.md's resume command before any save: the line used to offer only a transformers folder."""
    line = _train_line(["--load", str(tmp_path / "runs" / "ckpt")], one_line)
    assert line == (f"train.py: error: --load '{tmp_path / 'runs' / 'ckpt'}' does not exist; give an earlier run's "
                    f"--save directory (a checkpoint) or a transformers model directory (safetensors)")


def test_generate_seed_with_greedy_decoding_is_one_line_naming_it(tmp_path, one_line):
    """--seed seeds the sampling draws; greedy decoding draws nothing, so the seed was silently ignored."""
    line = one_line(lambda: hybrid.cli.main(["generate", str(tmp_path), "--prompt", "hi", "--seed", "5"]))
    assert line == ("hybrid generate: error: --seed 5 seeds sampling, but --temperature is 0 (greedy, no draws); "
                    "give --temperature > 0 or drop --seed")


@pytest.mark.slow  # train.py end to end, twice (forked from hybrid.testing's forkserver)
def test_resume_with_nothing_left_to_train_says_so_instead_of_a_nan_loss(tmp_path):
    """`--load ck --train-iters N` with the checkpoint at N or beyond trains nothing: the last line used to read
    `done: final lm loss nan`, which looks like a diverged run."""
    from hybrid import testing
    tiny = ["--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "1", "--eval-iters", "0",
            "--log-interval", "1", "--train-iters", "1"]
    ck = str(tmp_path / "ck")
    (saved,) = testing.launch(tiny + ["--save", ck], 1, cwd=str(tmp_path))
    assert saved.returncode == 0, saved.stderr
    assert "done: final lm loss " in saved.stdout and "nan" not in saved.stdout.splitlines()[-1]
    (again,) = testing.launch(tiny + ["--load", ck], 1, cwd=str(tmp_path))
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines()[-1] == ("done: no iteration to train (the checkpoint is at iteration 1, "
                                                     "--train-iters 1)")


# --- feature flags that do nothing in the run given (hybrid/cp, hybrid/moe, hybrid/data args) ------------------
@pytest.mark.parametrize("argv, world, want", [
    (["--cp-comm-type", "a2a"], 1, "train.py: error: --cp-comm-type picks how the --context-parallel-size ranks "
     "exchange keys and values; at --context-parallel-size 1 nothing is exchanged: give --context-parallel-size > 1 "
     "or drop --cp-comm-type"),
    (["--model", "tiny-mixtral", "--moe-router-bias-update-rate", "0.01"], 1, "train.py: error: "
     "--moe-router-bias-update-rate sets how fast the expert bias moves; add --moe-router-enable-expert-bias or drop "
     "the rate"),
    (["--tokenizer-type", "ByteLevel", "--tokenizer-model", "tok.json"], 1, "train.py: error: --tokenizer-model is "
     "read by --tokenizer-type HuggingFaceTokenizer; ByteLevel has no model (a token per byte): drop "
     "--tokenizer-model or use --tokenizer-type HuggingFaceTokenizer"),
])
def test_feature_flag_that_would_do_nothing_is_one_line_naming_it(argv, world, want, one_line):
    assert _train_line(argv, one_line) == want


@pytest.mark.parametrize("argv", [
    ["--model", "tiny-mixtral", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "0.01"],
    ["--tokenizer-type", "ByteLevel"],
])
def test_feature_flags_the_run_reads_still_pass(argv):
    validate(argv)


def test_cp_comm_type_with_context_parallel_still_passes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    run = validate(["--model", "tiny-llama", "--context-parallel-size", "2", "--cp-comm-type", "a2a",
                    "--seq-length", "32"])[0]
    assert run.cp.size == 2 and run.cp.comm_type.value == "a2a"


# --- the launcher's environment (hybrid/launch.py): LOCAL_RANK picks the GPU ---------------------------------
@pytest.mark.parametrize("local_rank, want", [
    ("5", "LOCAL_RANK '5' is not an integer in [0, LOCAL_WORLD_SIZE 2)"),
    ("x", "LOCAL_RANK 'x' is not an integer in [0, LOCAL_WORLD_SIZE 2)"),
    ("-1", "LOCAL_RANK '-1' is not an integer in [0, LOCAL_WORLD_SIZE 2)"),
])
def test_a_local_rank_outside_the_node_is_one_line_before_any_process_group(local_rank, want, monkeypatch, one_line):
    """LOCAL_RANK 5 on a 2-process node would make rank 0 open cuda:5 (torch's traceback, or another job's GPU)."""
    for name, value in (("WORLD_SIZE", "2"), ("RANK", "0"), ("LOCAL_WORLD_SIZE", "2"), ("LOCAL_RANK", local_rank),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)
    line = _train_line([], one_line)
    assert line == f"train.py: error: the environment's {want}; launch with torchrun --nproc-per-node N"
    line = one_line(lambda: hybrid.cli.main(["generate", "nowhere", "--prompt", "hi"]))
    assert line == f"hybrid generate: error: the environment's {want}; launch with torchrun --nproc-per-node N"


# --- hybrid convert: partition flags where nothing reads them -------------------------------------------------
@pytest.mark.parametrize("flags, want", [
    (["--pipeline-partition", "balanced"], "--pipeline-partition balanced splits the layers over "
     "--target-pipeline-parallel-size stages, and it is 1: give --target-pipeline-parallel-size N (the run's "
     "pipeline size) or drop --pipeline-partition"),
    (["--pipeline-layers-per-stage", "2"], "--pipeline-layers-per-stage splits the layers over "
     "--target-pipeline-parallel-size stages, and it is 1"),
    (["--seq-length", "64"], "--seq-length prices the layers of --pipeline-partition balanced only; add "
     "--pipeline-partition balanced (with --target-pipeline-parallel-size N) or drop --seq-length"),
    (["--target-pipeline-parallel-size", "2", "--micro-batch-size", "2"], "--micro-batch-size prices the layers of "
     "--pipeline-partition balanced only"),
])
def test_convert_partition_flag_nothing_reads_is_one_line_and_writes_nothing(flags, want, tmp_path, one_line):
    src = _fake_hf_folder(tmp_path / "hf")
    line = one_line(lambda: hybrid.cli.main(["convert", src, str(tmp_path / "out"), *flags]))
    assert line.startswith(f"hybrid convert: error: {want}"), line
    assert sorted(os.listdir(tmp_path)) == ["hf"]


# --- hybrid layout ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, want", [
    (["--moe-ffn-hidden-size", "64"], "hybrid layout: error: --moe-ffn-hidden-size 64 is the experts' width; add "
     "--num-experts or --expert-model-parallel-size to print the experts, or drop it"),
    (["--context-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "8"],
     "hybrid layout: error: "
     "--expert-model-parallel-size 8 x --expert-tensor-parallel-size 1 must divide the 4 ranks of a pipeline stage "
     "(tp x cp x dp); give --expert-model-parallel-size 1, 2 or 4"),  # CP x EP: the stage's tp x cp x dp ranks; the line comes with its command's prefix
])
def test_layout_flag_it_cannot_print_is_one_line_with_the_command_prefix(argv, want, one_line):
    line = one_line(lambda: hybrid.cli.main(["layout", "--world", "8", *argv]))
    assert line.startswith(want), line
    assert one_line.out == ""  # nothing of the layout printed before the error
