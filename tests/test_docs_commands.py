"""Every command in README.md and docs/*.md runs: a documented flag combination can never crash unnoticed.

Commands are read from the fenced shell blocks and the indented code blocks of the docs (lines starting with
torchrun, hybrid, python, bash or scripts/), so a command added to the docs is tested without editing this file.
Each is run as written, shortened only where a full run would take minutes: `--train-iters` becomes 2 (added when
absent; one step past a PowerSGD start, 1-bit Adam freeze or DiLoCo period, so the method engages), `--log-interval` 1,
`--eval-iters` 1 (the validation and test passes run, on one global batch each),
`hybrid calibrate` measures at tiny sizes, and placeholders are filled (`path/to/hf_model` -> a tiny transformers
GPT-2 saved here, a trailing `...` dropped, `cpu.json` -> a profile `hybrid calibrate` wrote on this machine:
CALIBRATED). The few commands that cannot run here, or that another test runs as written, are listed in SKIP with
the reason and where they are covered instead.

How they run: a `python` or `hybrid` command as one fork of hybrid.testing's forkserver (the interpreter with
torch and hybrid already imported: the command's own code runs as __main__, without a new interpreter's ~4 s of
CPU), a single-node `torchrun` as its ranks forked the same way (hybrid.testing.torchrun_cli: its arguments parsed
by torch's own parser, torchrun's environment), anything else (mkdir) in the shell. `hybrid plan` runs in this
process (hybrid.cli.main, what `python -m hybrid.cli` runs, its output and exit status captured), as does
`hybrid convert` (at one intra-op thread, as a fork runs; transformers, which its verification loads, already
imported here), each distinct plan search once: the pages print the Llama-3-70B search four ways (README's
--top 5, planner.md's table, --json and --plot), and a search of the same inputs returns the same result, so the
later commands print theirs from the first one's (SEARCHED). One run per distinct flag combination: a train.py
command whose program and flag names (not values) an earlier command already ran is parsed and checked in-process
instead (hybrid.train.main.validate: every check a run makes before its process group), so a value that is wrong
still fails.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

from hybrid import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STARTS = ("torchrun", "hybrid ", "python", "bash ", "scripts/", "mkdir ")
SKIP = {  # substring of the command -> why it is not run here, and what covers it
    "bash scripts/test.sh": "the test command itself (CI runs it)",
    "bash scripts/setup.sh": "run by scripts/test.sh before the suite; the rest of the line is run below",
    "HEAD_NODE": "a multi-node template; two agents on loopback run in tests/test_fault_nodes.py",
    "plot_run.py quickstart.jsonl": "the README main job's plot of its metrics file: run by tests/test_training.py",
    "--timeline timeline.json": "the README's main job: run as written by tests/test_training.py (its first 20 "
                                "losses against tests/data/quickstart_losses.json, timeline, checkpoint, "
                                "validation loss, memory, plot)",
    "--offload-optimizer --offload-params --bf16": "run as written, with its output checked, by "
                                                   "tests/test_zero_flags.py (README's headline ZeRO command)",
    "scripts/gpu_check.py --out gpu_results": "needs a GPU; tests/test_gpu_check.py runs the same script with "
                                              "--dry-run (every section, CPU, tiny sizes)",
    "$(hybrid plan": "README's planner chain (a shell substitution): run as written by tests/test_readme_chain.py",
    "hybrid calibrate --out cpu.json": "the planner chain's calibration (README): run as written, at full size, by "
                                       "tests/test_readme_chain.py",
    "plot_run.py run.jsonl": "the planner chain's plot of its metrics file: run by tests/test_readme_chain.py",
    "hybrid calibrate --ranks 4 --out cpu.json": "the planner chain's calibration again (--ranks 4 is the default): "
                                                 "run as written, at full size, by tests/test_readme_chain.py; the "
                                                 "page's next command plans on CALIBRATED",
    "hybrid calibrate --ranks 1 --base h200": "needs a GPU (without CUDA, --base h200 is refused: "
                                              "tests/test_newuser20_inputs.py); tests/test_gpu_check.py runs the "
                                              "one-rank --base h200 calibration with --backend gloo (--dry-run)",
    "scripts/bench_pipeline.py --pp 2": "a 20-minute benchmark for a quiet machine; its --quick mode runs in "
                                        "tests/test_bench_smoke.py",
    # round 20: the indented code blocks' commands (read since then)
    "hybrid convert ds_run/": "needs a DeepSpeed ZeRO checkpoint: tests/test_convert.py::"
                              "test_deepspeed_zero3_checkpoint_converts_with_the_deepspeed_models_logits writes one "
                              "with DeepSpeed and converts it with `hybrid convert`",
    "hybrid convert ds_moe_run/": "needs a DeepSpeed-MoE checkpoint: tests/test_convert_deepspeed_moe.py writes one "
                                  "with DeepSpeed and converts it with `hybrid convert`",
    "scripts/bench_cp.py --seq 8192": "a benchmark for a quiet machine (T 8192, 10 repeats); tests/test_cp_bench.py "
                                      "runs the script at small sizes",
    "scripts/bench_moe.py --out": "a benchmark for a quiet machine; its --quick mode runs in tests/test_bench_smoke.py",
    "scripts/bench_zero.py --ddp-only": "a benchmark for a quiet machine; its --quick mode runs in "
                                        "tests/test_bench_smoke.py",
}


# `cpu.json` in each working directory: a profile `hybrid calibrate` wrote on this machine (8 ranks, round 14's main
# job), standing for the output of docs/planner.md's `hybrid calibrate --ranks 4 --out cpu.json` (SKIP: README's
# chain runs that command at full size and trains on its profile), which the page's `hybrid plan --hardware cpu.json`
# reads; planning on it is the same code as on a fresh one (load_hardware, the search)
CALIBRATED = os.path.join(ROOT, "docs", "results", "data", "mainjob_r14_run3.hw8.json")


def documented_commands() -> list[tuple[str, str]]:
    """(file, command) for each command line in a fenced bash/sh block or an indented code block; `\\`
    continuations joined."""
    found = []
    for path in ["README.md"] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + sorted(
            glob.glob(os.path.join(ROOT, "docs", "planner", "*.md"))):  # the planner's record pages too
        text = open(os.path.join(ROOT, path)).read()
        for block in shell_blocks(text) + indented_blocks(text):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.strip().removeprefix("$ ")
                if line.startswith(STARTS) and line.isascii():  # not a diagram's "torchrun ─► train.py"
                    found.append((os.path.relpath(os.path.join(ROOT, path), ROOT), line))
    return found


def indented_blocks(text: str) -> list[str]:
    """The bodies of markdown's indented code blocks (4 spaces, after a blank line, not a list item's continuation),
    dedented: docs/checkpoint.md's, convert.md's, moe.md's and zero.md's first commands are written so (round 20:
    untested until then). Lines inside fences are not read here."""
    blocks, body, fenced, prev, last_text = [], None, False, "", ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        code = not fenced and line.startswith("    ") and line.strip()
        if body is not None and (code or not line.strip()):
            body.append(line[4:])
        elif body is not None:
            blocks.append("\n".join(body).rstrip() + "\n")
            body = None
        if body is None and code and not prev.strip() and not re.match(r"\s|[*+-] |\d+\. ", last_text):
            body = [line[4:]]
        prev, last_text = line, (line if line.strip() and body is None else last_text)
    if body is not None:
        blocks.append("\n".join(body).rstrip() + "\n")
    return blocks


def shell_blocks(text: str) -> list[str]:
    """The bodies of the fenced blocks whose language is a shell's (or none), fences read line by line in
    pairs: a fence of another language (```text, ```python) opens a block that is skipped, and its closing
    fence is never mistaken for an opener (which ran the prose after it)."""
    blocks, lang, body = [], None, []
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if lang is None:
                lang, body = line.lstrip()[3:].strip(), []
            else:
                if lang in ("", "bash", "sh", "shell", "console"):
                    blocks.append("\n".join(body) + "\n")
                lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def _pieces(command: str) -> list[str]:
    """The command without its comment, split at `&&` (each part run in turn), skipped parts removed."""
    command = re.sub(r"\s+#.*$", "", command)
    parts = [p.strip() for p in command.split("&&")]
    return [p for p in parts if not any(s in p for s in SKIP if s != "HEAD_NODE")]


def _argv(part: str, hf_model: str) -> list[str]:
    """The command's words: placeholders filled, `scripts/` made absolute, train.py runs and calibrate shortened."""
    words = shlex.split(part.replace("path/to/hf_model", hf_model))
    if words and words[-1] == "...":
        words = words[:-1]
    if words[0] == "hybrid":
        words = ["python", "-m", "hybrid.cli"] + words[1:]
    words = [os.path.join(ROOT, w) if w.startswith("scripts/") else w for w in words]
    if any(w.endswith("train.py") or w == "hybrid.train" for w in words):
        words = _shorten(words)
    if words[3:4] == ["calibrate"]:  # the same measurements, at sizes that take a second (docs/planner.md)
        words += ["--seconds", "0.05", "--matmul-size", "64", "--copy-bytes", "1048576"]
        ranks = words[words.index("--ranks") + 1] if "--ranks" in words else None
        if ranks != "1":  # one rank times no collective, and calibrate refuses --sizes there
            words += ["--sizes", "8,65536"]
    return words


def _shorten(words: list[str]) -> list[str]:
    """Two optimizer steps (three resuming with --load: one past the save of an earlier, shortened command), every
    step logged, one global batch per validation (the end's validation and test loss, not train.py's default 10 of
    each: 20 forward batches that took most of a 2-step run's compute): enough to run every code path the flags
    select."""
    out, i, iters = [], 0, 2
    while i < len(words):
        if words[i] in ("--train-iters", "--log-interval", "--eval-iters"):
            i += 2
            continue
        if words[i] in ENGAGE_AT and i + 1 < len(words) and words[i + 1].isdigit():
            iters = max(iters, int(words[i + 1]) + 1)
        out.append(words[i])
        i += 1
    if "--load" in words:  # a resume: one step past the run that saved (itself shortened to 2), so it trains
        iters += 1
    return out + ["--train-iters", str(iters), "--log-interval", "1", "--eval-iters", "1"]


# flags whose value is the step a method starts at, or its period: the run goes one step past it, so the method
# engages (train.py refuses a start at or past --train-iters, where it would never run)
ENGAGE_AT = ("--powersgd-start-iter", "--onebit-freeze-iters", "--diloco-inner-steps")


WORKDIRS: dict[str, str] = {}


@pytest.fixture
def workdir(where, tmp_path_factory) -> str:
    """One working directory per doc file, shared by its commands in document order (a tokenizer, then the data
    it writes, then a run on it), holding what the commands name as their own input: `corpus.jsonl` (Python's
    pydoc topics as JSON lines), `path/to/config.json` (a tiny GPT-2 whose vocabulary holds a 4096 tokenizer),
    `cpu.json` (CALIBRATED) and `tests/` (the repository's, read-only by intent: docs/moe.md copies a config from
    tests/data/configs/ as a user in a checkout would)."""
    if where not in WORKDIRS:
        import json
        import shutil

        from pydoc_data.topics import topics
        from transformers import GPT2Config
        d = tmp_path_factory.mktemp(where.replace("/", "_"))
        with open(d / "corpus.jsonl", "w") as f:
            for text in topics.values():
                f.write(json.dumps({"text": text}) + "\n")
        (d / "path" / "to").mkdir(parents=True)
        GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=256, vocab_size=4096).to_json_file(
            str(d / "path" / "to" / "config.json"))
        shutil.copyfile(CALIBRATED, d / "cpu.json")
        os.symlink(os.path.join(ROOT, "tests"), d / "tests")  # data a page copies as from a checkout (moe.md's config)
        WORKDIRS[where] = str(d)
    return WORKDIRS[where]


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> str:
    """A tiny transformers GPT-2 folder (config.json + safetensors), as `path/to/hf_model` stands for."""
    from transformers import GPT2Config, GPT2LMHeadModel
    path = tmp_path_factory.mktemp("hf_model")
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=256, vocab_size=300)).save_pretrained(path)
    return str(path)


COMMANDS = documented_commands()


# commands whose printed output the page quotes: after the run, the lines `rows` matches (re.match) must be
# `count` and each must be a line of the page (docs/planner.md's example tables had drifted from what `hybrid plan`
# prints). Checked on this file's own run of the command, not by a second search of it in another test (~3 s of
# CPU each); tests/test_planner_docs_examples.py checks the page's other quoted outputs (the 405B error line,
# the worked example's TFLOP/s), which no documented command prints.
PRINTED_ON_THE_PAGE = {
    "hybrid plan --model llama-3-70b --gpus 64 --gpu h100-80g --global-batch-size 512 --seq-length 4096":
        (r" +\d+  tp|best:|searched", 7),  # the Llama-3-70B table on 64 H100: its 5 rows, best and searched
    "hybrid plan --model llama-3-8b --global-batch-size 512 --seq-length 4096 --gpu h100-80g --scan-gpus 8,64,512":
        (r" +\d+  tp", 3),  # the Llama-3-8B scan: one row for each GPU count
}


def test_the_docs_hold_the_commands_this_test_runs():
    assert len(COMMANDS) >= 8, COMMANDS  # README's quick start and "Using it" at least
    assert any("--zero-stage 3 --offload-optimizer --offload-params --bf16" in c for _, c in COMMANDS)
    documented = {(w, p) for w, c in COMMANDS for p in _pieces(c)}
    assert {("docs/planner.md", c) for c in PRINTED_ON_THE_PAGE} <= documented, "an output check lost its command"
    # docs/planner.md's `hybrid calibrate --ranks 4 --out cpu.json` is skipped as README's chain's own command
    # (tests/test_readme_chain.py runs it): the same only while 4 is calibrate's default
    from hybrid.planner.calibrate import CalibrationConfig
    assert CalibrationConfig.ranks == 4 and any(
        c.startswith("hybrid calibrate --out cpu.json && ") for w, c in COMMANDS if w == "README.md")


def test_indented_code_blocks_are_read_and_list_continuations_and_fences_are_not():
    """The pages whose first commands sit in indented code blocks (round 20: run since then, not before)."""
    pages = {w for w, c in COMMANDS}
    for where, piece in (("docs/checkpoint.md", "--save runs/ckpt"), ("docs/convert.md", "hybrid convert path/to/hf_"),
                         ("docs/moe.md", "--model tiny-mixtral"), ("docs/zero.md", "--offload-params --bf16")):
        assert any(w == where and piece in c for w, c in COMMANDS), (where, piece, where in pages)
    text = ("Prose.\n\n    hybrid models\n    python x.py \\\n        --flag\n\n* item\n\n    hybrid layout --world 2\n\n"
            "```text\n\n    hybrid plan\n```\n1. step\n    python continuation.py\n")
    assert indented_blocks(text) == ["hybrid models\npython x.py \\\n    --flag\n"]


def _check_printed_rows(where: str, part: str, stdout: str) -> None:
    """The rows PRINTED_ON_THE_PAGE picks from the command's output are lines of the page it is documented on."""
    rows_pattern, count = PRINTED_ON_THE_PAGE[part]
    page = open(os.path.join(ROOT, where)).read()
    rows = [line for line in stdout.splitlines() if re.match(rows_pattern, line)]
    assert len(rows) == count, stdout[-3000:]
    for line in rows:
        assert line in page, f"{where}: `{part}` now prints a row the page does not hold:\n{line}"


RAN: set[tuple] = set()  # the flag combinations of the train.py commands run so far


def _train_index(argv: list[str]) -> int | None:
    """Where train.py (or -m hybrid.train) is in a command; None: the command does not train."""
    return next((i for i, w in enumerate(argv) if w.endswith("train.py") or w == "hybrid.train"), None)


def _flag_combination(argv: list[str]) -> tuple:
    """A train.py command's launcher, entry and flag names, values left out: `torchrun --nproc-per-node 4
    scripts/train.py --save ckpt` -> ("torchrun", "train.py", "--nproc-per-node", "--save")."""
    return (argv[0], os.path.basename(argv[_train_index(argv)])) + tuple(sorted(w for w in argv if w[:2] == "--"))


SEARCHED: dict[bytes, object] = {}  # the planner searches the `hybrid plan` commands ran, by their pickled inputs


def _memo_search(search):
    """hybrid.planner.search.search, each distinct call made once (SEARCHED); inputs that do not pickle are searched."""
    import pickle

    def memo(*args, **kwargs):
        try:
            key = pickle.dumps((args, sorted(kwargs.items())))
        except (pickle.PicklingError, TypeError, AttributeError):
            return search(*args, **kwargs)
        if key not in SEARCHED:
            SEARCHED[key] = search(*args, **kwargs)
        return SEARCHED[key]
    return memo


IN_PROCESS = ("plan", "convert")  # the `hybrid` commands run in this process (module docstring)


def _in_process(argv: list[str], workdir: str, monkeypatch) -> subprocess.CompletedProcess:
    """`hybrid plan ...` or `hybrid convert ...` in this process (module docstring): hybrid.cli.main in the
    command's directory, its stdout, stderr and exit status (SystemExit's code; a message is printed to stderr, as
    the interpreter would). A plan's search is memoised (SEARCHED); a conversion runs at one intra-op thread, as its
    fork did (OMP_NUM_THREADS=1), without a fork's ~1.6 s of CPU importing transformers (which this process has:
    the hf_model fixture) for its verification against the transformers model."""
    import contextlib
    import io

    from suite_threads import one_thread

    from hybrid import cli
    from hybrid.planner import cli as planner_cli
    from hybrid.planner.search import search
    out, err, status = io.StringIO(), io.StringIO(), 0
    with monkeypatch.context() as m, one_thread():
        m.chdir(workdir)
        m.setattr(planner_cli, "search", _memo_search(search))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main(argv[3:])
            except SystemExit as e:
                status = e.code if isinstance(e.code, int) else 1
                if not isinstance(e.code, int):
                    print(e.code, file=sys.stderr)
    return subprocess.CompletedProcess(argv, status, out.getvalue(), err.getvalue())


def _execute(argv: list[str], workdir: str, monkeypatch) -> subprocess.CompletedProcess:
    """Run one command (see the module docstring): `hybrid plan` and `hybrid convert` in this process, a fork for
    python and single-node torchrun, else the shell."""
    env = {"PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    if argv[:3] == ["python", "-m", "hybrid.cli"] and argv[3:4] and argv[3] in IN_PROCESS:
        return _in_process(argv, workdir, monkeypatch)
    if argv[0] in ("python", "python3"):
        return testing.run(argv[1:], env=env, cwd=workdir, timeout=400)
    if argv[0] == "torchrun":
        return testing.torchrun_cli(argv[1:], env=env, cwd=workdir, timeout=400)
    return subprocess.run(argv, cwd=workdir, env=dict(os.environ, **env), capture_output=True, text=True,
                          timeout=400)


def _check_in_process(argv: list[str], workdir: str, monkeypatch) -> None:
    """train.py's parse and every check before the process group (hybrid.train.main.validate), on rank 0 of the
    command's world: SystemExit with the one-line error for a bad value."""
    from torch.distributed.run import get_args_parser

    from hybrid.train.main import validate
    ta = get_args_parser().parse_args(argv[1:]) if argv[0] == "torchrun" else None
    world = int(ta.nproc_per_node) if ta else 1
    if ta:
        for k, v in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                         MASTER_ADDR="127.0.0.1", MASTER_PORT="29500").items():
            monkeypatch.setenv(k, v)
    monkeypatch.chdir(workdir)
    validate(argv[_train_index(argv) + 1:])


@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{w}:{c[:60]}" for w, c in COMMANDS])
@pytest.mark.slow
# hybrid/convert/__init__.py's own filter of DCP's one-process warning, set when it is imported (as a command's
# process has it): pytest's per-test warning capture drops filters set during an earlier test, so `hybrid convert`
# run in this process would report it
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")
def test_documented_command_runs(where, command, hf_model, workdir, monkeypatch):
    if "HEAD_NODE" in command or not _pieces(command):
        reasons = [why for s, why in SKIP.items() if s in command]
        pytest.skip(reasons[-1])  # the most specific: setup.sh only says why the first half of a line is not run
    for part in _pieces(command):
        argv = _argv(part, hf_model)
        trains = _train_index(argv) is not None
        if trains and _flag_combination(argv) in RAN:
            _check_in_process(argv, workdir, monkeypatch)
            continue
        out = _execute(argv, workdir, monkeypatch)
        assert out.returncode == 0, f"{where}: {part}\n{out.stdout[-1500:]}\n{out.stderr[-3000:]}"
        if part in PRINTED_ON_THE_PAGE:
            _check_printed_rows(where, part, out.stdout)
        if trains:
            assert "done: final lm loss" in out.stdout, out.stdout[-1500:]
            RAN.add(_flag_combination(argv))
