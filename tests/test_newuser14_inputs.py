"""Round 14's new-user pass (the newest surfaces, bad inputs): each finding's input ends in one line naming the
flag, key or file and the fix, before any search or work -- or, where the input was good, does what it said.

1. `hybrid checkpoint inspect`'s own errors said "hybrid checkpoint: error:" while argparse's said "hybrid checkpoint
   inspect: error:" for the same command (the known gap of round 13).
2. `python -m hybrid.planner.causes` took its candidate indices with int(): "--help" or "abc" was a traceback, and an
   index no candidate has (9, -1) printed nothing and exited 0.
3. `hybrid plan --hardware FILE`: a profile with an unknown top-level key (a misspelt `matmul_tflops`, whose fp32 rate
   --precision fp32 plans on) was read without a word, the key dropped; a rate written Infinity was reported as
   "got NaN".
4. train.py: Megatron's --recompute-activations, --tp-comm-overlap, --kv-channels, --make-vocab-size-divisible-by,
   --fp8 / --fp8-format said only "see --help"; --hierarchical-context-parallel-sizes and --align-param-gather got a
   near spelling that misleads ("did you mean --context-parallel-size?").
5. train.py --shm-gather (round 14's flag) at --zero-stage 0 or 3, where there is no post-step gather, was taken
   and did nothing.

In this process (conftest's `one_line`: one line, no traceback, no process group); nothing is searched or measured
(each entry point past its checks is replaced by one that fails the test)."""

from __future__ import annotations

import json
import os

import pytest

from hybrid.cli import main as hybrid_main

pytestmark = pytest.mark.usefixtures("one_process")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "hybrid", "planner", "data", "h200_calibrated.json")


def _never(*a, **k):
    raise AssertionError("the bad input reached the work")


class Reached(Exception):
    pass


# --- 1. hybrid checkpoint inspect: its errors carry the command's name ---------------------------------------------
def test_inspect_errors_have_the_same_prefix_as_its_argparse_errors(tmp_path, one_line):
    missing = str(tmp_path / "none")
    line = one_line(lambda: hybrid_main(["checkpoint", "inspect", missing]))
    assert line == (f"hybrid checkpoint inspect: error: {missing!r} does not exist; give a --save directory or "
                    f"one of its iter_* directories")  # round 19: "is not a directory" for a path that is not there
    parsed = one_line(lambda: hybrid_main(["checkpoint", "inspect", missing, "--world-size", "0"]))
    assert parsed.startswith("hybrid checkpoint inspect: error: argument --world-size")


def test_other_commands_keep_their_one_word_prefix(one_line):
    """The prefix adds the action only where the command has one: `hybrid models` stays `hybrid models`."""
    assert one_line(lambda: hybrid_main(["models", "nope"])).startswith("hybrid models: error: no preset 'nope'")


# --- 2. the causes module's command line -----------------------------------------------------------------------------
@pytest.mark.parametrize("argv, line", [
    (["9"], "candidate 9 does not exist: give indices 0 to 4 (none: all 5)"),
    (["-1"], "candidate -1 does not exist: give indices 0 to 4 (none: all 5)"),
    (["abc"], "argument I: invalid int value: 'abc'"),
    (["--bogus"], "unrecognized arguments: --bogus; see --help"),
    (["0", "--nemo-settings"], "candidate indices select rows of the default report; give them without "
                               "--nemo-settings / --one-layer-chunks"),
])
def test_causes_bad_index_or_flag_is_one_line_before_any_planning(argv, line, one_line, monkeypatch):
    from hybrid.planner import causes
    for name in ("report", "results_today", "nemo_settings_what_if", "one_layer_chunk_what_if"):
        monkeypatch.setattr(causes, name, _never)
    assert one_line(lambda: causes.main(argv)) == f"python -m hybrid.planner.causes: error: {line}"
    assert one_line.out == ""


def test_causes_good_indices_reach_the_report(monkeypatch):
    from hybrid.planner import causes

    def reached(emit, only):
        raise Reached(only)
    monkeypatch.setattr(causes, "report", reached)
    with pytest.raises(Reached) as e:
        causes.main(["1", "3"])
    assert e.value.args[0] == (1, 3)


# --- 3. hybrid plan --hardware: the profile's top level and its infinities -------------------------------------------
PLAN = ["plan", "--model", "tiny-gpt2", "--gpus", "4", "--global-batch-size", "16", "--seq-length", "128"]


def _profile(tmp_path, edit) -> str:
    with open(SHIPPED, encoding="utf-8") as f:
        text = f.read()
    path = tmp_path / "hw.json"
    path.write_text(edit(text))
    return str(path)


def _rename_top(old: str, new: str):
    def edit(text: str) -> str:
        d = json.loads(text)
        d[new] = d.pop(old)
        return json.dumps(d)
    return edit


@pytest.mark.parametrize("edit, fragment", [
    (_rename_top("matmul_tflops", "matmul_tflop"), "unknown key matmul_tflop; did you mean matmul_tflops? known: "
                                                   "format, hardware, matmul_overhead_s, matmul_tflops,"),
    (_rename_top("not_measured", "notes"), "unknown key notes; known: format,"),
    (lambda t: t.replace("709.9996661294043", "Infinity"), "hardware.peak_tflops must be a finite number > 0, got "
                                                           "Infinity"),
    (lambda t: t.replace("709.9996661294043", "-Infinity"), "hardware.peak_tflops must be a finite number > 0, got "
                                                            "-Infinity"),
    (lambda t: t.replace("709.9996661294043", "NaN"), "hardware.peak_tflops must be a finite number > 0, got NaN"),
])
def test_plan_hardware_unknown_top_key_or_infinity_is_one_line_before_the_search(tmp_path, edit, fragment, one_line,
                                                                                  monkeypatch):
    import hybrid.planner.cli as plan_cli
    monkeypatch.setattr(plan_cli, "search", _never)
    path = _profile(tmp_path, edit)
    line = one_line(lambda: hybrid_main(PLAN + ["--hardware", path, "--precision", "fp32"]))
    assert line.startswith(f"hybrid plan: error: --hardware {path}: {fragment}"), line


@pytest.mark.parametrize("path", [SHIPPED] + sorted(
    os.path.join(ROOT, "docs", "results", "data", n) for n in os.listdir(os.path.join(ROOT, "docs", "results", "data"))
    if n.endswith(".hw8.json")))
def test_every_profile_the_repository_ships_still_loads(path):
    """The top-level check knows every key `hybrid calibrate` writes: the profiles it wrote in rounds 12-13 load."""
    from hybrid.planner.calibrate import load_hardware
    from hybrid.planner.model import Precision
    assert load_hardware(path, Precision.FP32).peak_tflops > 0


# --- 4. train.py: Megatron flags that said "see --help" or a misleading near spelling ------------------------------
@pytest.mark.parametrize("flag, hint", [
    (["--recompute-activations"], "train.py's flag is --recompute-granularity selective"),
    (["--tp-comm-overlap"], "Transformer Engine's userbuffer overlap is not implemented"),
    (["--kv-channels", "64"], "write head_dim (the llama family) there"),
    (["--make-vocab-size-divisible-by", "128"], "the vocabulary is padded to a multiple of "
                                                "--tensor-model-parallel-size (no more)"),
    (["--fp8"], "not implemented in training (`hybrid plan --fp8` prices it): train in --bf16; drop the flag"),
    (["--fp8-format", "hybrid"], "not implemented in training"),
    (["--hierarchical-context-parallel-sizes", "2", "2"], "hierarchical context parallelism (a2a+p2p) is not "
                                                          "implemented: give --context-parallel-size N with "
                                                          "--cp-comm-type a2a or p2p"),
    (["--align-param-gather"], "not implemented (Megatron's launches every pipeline stage's parameter all-gathers "
                               "at once)"),
])
def test_train_megatron_flags_name_what_to_do(flag, hint, one_line):
    from hybrid.train.main import validate
    line = one_line(lambda: validate(["--model", "tiny-gpt2"] + flag))
    assert line.startswith(f"train.py: error: unrecognized arguments: {flag[0]}; {flag[0]}: ") and hint in line, line
    assert "did you mean" not in line and "see --help" not in line


# --- 5. train.py --shm-gather asked for by name where it does nothing -----------------------------------------------
@pytest.mark.parametrize("stage", ["0", "3"])
def test_train_shm_gather_by_name_outside_stages_1_2_is_one_line(stage, one_line):
    """Round 14 made the shared-memory gather ZeRO 1-2's default and took --shm-gather at any stage without a word
    (stage 0 and 3 have no post-step gather: the flag did nothing), as --overlap-param-gather is refused there."""
    from hybrid.train.main import validate
    line = one_line(lambda: validate(["--model", "tiny-gpt2", "--zero-stage", stage, "--shm-gather"]))
    assert line == (f"train.py: error: --shm-gather applies to --zero-stage 1 or 2 (their post-step parameter "
                    f"all-gather); got --zero-stage {stage}: drop the flag")


@pytest.mark.parametrize("argv", [["--zero-stage", "1", "--shm-gather"], ["--zero-stage", "3", "--no-shm-gather"],
                                  ["--zero-stage", "0"]])
def test_train_shm_gather_where_it_applies_or_turned_off_is_taken(argv):
    from hybrid.train.args import configure, parse_args
    run, _ = configure(parse_args(["--model", "tiny-gpt2"] + argv), 2)  # dp 2: the pair it runs on (round 15
    assert run.zero.shm_gather == ("--no-shm-gather" not in argv)        # refuses it by name at dp 1)
