"""docs/troubleshooting.md and docs/checkpoint.md's trust sections say what the code prints (issue 24).

Every error line the pages quote -- each backticked span in the first column of troubleshooting.md's tables, and the
lines checkpoint.md quotes -- is matched against the lines the code really prints for the bad inputs of
tests/test_inputs.py and tests/test_trust.py, rerun here in-process (the flags, the DeepSpeed JSON, config and data
files, output paths, the hostile checkpoints through train.py and `hybrid generate`, the damaged transformers folders).
A quoted line matches when its words are a printed line's: `...` stands for an elided part, and the example's values
(numbers, quoted names, paths, lists, placeholders such as X or N) for any value. The lines no table prints (a lost
rank, the NaN guard, a damaged newest checkpoint, a stale build lock, inputs tested in other files) are held to the
code's own strings instead: their words between values must be string literals of hybrid/, models/ or scripts/
(at most three joined, as a message is composed of fixed and variable parts). A reworded line fails either way.
"""

from __future__ import annotations

import os
import re
import shutil
import sys

import pytest
import torch.distributed as dist

import hybrid.cli
import hybrid.testing
from test_trust import hf_folder, saved  # noqa: F401 -- the fixtures: a saved checkpoint, a transformers folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(name: str) -> str:
    with open(os.path.join(ROOT, "docs", name)) as f:
        return f.read()


def _table_spans(text: str) -> list[str]:
    """The backticked spans of each table row's first cell (the header and rule rows aside)."""
    spans = []
    for line in text.splitlines():
        if line.startswith("| `"):
            first = re.split(r"(?<!\\)\|", line)[1]
            spans += [s.replace("\\|", "|") for s in re.findall(r"`([^`]+)`", first)]
    return spans


def _section(text: str, title: str) -> str:
    return text.split(f"## {title}")[1].split("\n## ")[0]


# what a quoted example may show in place of the printed value
_VALUE = [
    (r"'[^']*'", r"'[^']*'"),                                   # a quoted name or path
    (r'"[^"]*"', r'"[^"]*"'),
    (r"\[[^\]]*\]", r"\[[^\]]*\]"),                             # a list or shape
    (r"(?<![\w-])(?:X|N|M|S|DIR|FILE)(?![\w-])", r"\S+"),      # a placeholder
    (r"[\w.~-]*/[\w./~*-]*", r"\S*"),                            # a path
    (r"(?<![\w.-])[a-z_]\w*\.(?:bin|idx|txt|json|distcp)(?![\w.])", r"\S+"),  # a file name
    (r"(?<![\w-])-?\d+(?:[.,_]\d+)*(?:e[+-]?\d+)?(?!\w)", r"-?\d+(?:[.,_]\d+)*(?:e[+-]?\d+)?"),  # a number
]
_TOKEN = re.compile("|".join(f"({p})" for p, _ in _VALUE))


def pattern(quoted: str) -> re.Pattern:
    """A regex a printed line must contain: the quoted words literally, its values as any value, `...` as anything."""
    parts = []
    for piece in quoted.split("..."):
        piece, out, at = piece.strip(), [], 0
        for m in _TOKEN.finditer(piece):
            out.append(re.escape(piece[at:m.start()]))
            out.append(_VALUE[m.lastindex - 1][1])
            at = m.end()
        out.append(re.escape(piece[at:]))
        parts.append("".join(out))
    return re.compile(".*?".join(p for p in parts if p))


# --- the lines the code prints for the suite's bad inputs ---------------------------------------------------------
def _error_text(fn, argv) -> str:
    """What fn(argv) printed to stderr before its SystemExit, plus a string exit code."""
    import contextlib
    import io
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            fn(argv)
        except SystemExit as e:
            return err.getvalue() + (f"{e.code}\n" if isinstance(e.code, str) else "")
    return err.getvalue()


def _inputs_lines(tmp_path) -> list[str]:
    import test_inputs as ti
    lines = []
    for i, (name, command, argv, files, env, _) in enumerate(ti.CASES):
        root = tmp_path / f"in{i}"
        root.mkdir()
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(root)
            for var in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_ERROR_FILE", "MASTER_ADDR",
                        "MASTER_PORT"):
                mp.delenv(var, raising=False)
            for var, value in env.items():
                mp.setenv(var, value)
            mp.setattr(dist, "init_process_group", ti._no_process_group)
            mp.setattr(hybrid.testing, "run_distributed", ti._no_process_group)
            if command == "plan-nompl":
                mp.setitem(sys.modules, "matplotlib", None)
            ti._write_files(root, files)
            lines += _error_text(*ti._argv(command, argv, root)).splitlines()
    for i, (name, argv, files, _) in enumerate(ti.SCRIPT_CASES):
        root = tmp_path / f"sc{i}"
        root.mkdir()
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(root)
            ti._write_files(root, files)
            module = ti._script(name)
            argv = [a.replace("{d}", str(root)) for a in argv]
            if "--no-matplotlib" in argv:
                argv.remove("--no-matplotlib")
                mp.setattr(module, "matplotlib", None)
            lines += _error_text(module.parse_args, argv).splitlines()
    return lines


def _trust_lines(tmp_path, saved: str, hf_folder: str) -> list[str]:
    """The hostile checkpoints through train.py and generate; the damaged transformers folders."""
    import test_trust as tt
    lines = []
    for i, (name, plant, _) in enumerate(tt.CASES):
        for reader in ("train", "generate"):
            case = tmp_path / f"tr{i}{reader}"
            case.mkdir()
            ck, _, out = tt._planted(saved, case, plant)
            with pytest.MonkeyPatch.context() as mp:
                tt._isolate(mp, case)
                mp.setattr(dist, "init_process_group", tt._no_process_group)
                lines += _error_text(*tt.READERS[reader][0](ck, out)).splitlines()
    for i, ((name, edit, argv, _), command) in enumerate(tt.FOLDER_RUNS):
        case = tmp_path / f"hf{i}"
        case.mkdir()
        src = str(case / "src")
        shutil.copytree(hf_folder, src)
        edit(src)
        with pytest.MonkeyPatch.context() as mp:
            tt._isolate(mp, case)
            mp.setattr(dist, "init_process_group", tt._no_process_group)
            args = ([command, src, str(case / "out")] if command == "convert" else
                    [command, src, "--max-new-tokens", "2"] + [a.replace("{src}", src) for a in argv]
                    + (["--prompt-ids", "1,2"] if not argv else []))
            lines += _error_text(hybrid.cli.main, args).splitlines()
    return lines


@pytest.fixture(scope="module")
def printed(tmp_path_factory, saved, hf_folder) -> list[str]:
    return (_inputs_lines(tmp_path_factory.mktemp("inputs"))
            + _trust_lines(tmp_path_factory.mktemp("trust"), saved, hf_folder))


def _source_strings() -> str:
    """Every string the code can print, as written: each string literal and f-string of hybrid/, models/ and
    scripts/ (adjacent literals joined, as Python joins them), a NUL where an f-string puts a value."""
    import ast
    out = []
    for top in ("hybrid", "models", "scripts"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    for node in ast.walk(ast.parse(open(os.path.join(d, f)).read())):
                        if isinstance(node, ast.JoinedStr):
                            out.append("".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values))
                        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                            out.append(node.value)
    return "\n".join(out)


# besides _VALUE's: a one-letter name (x, d), a file or tensor name (d.bin, transformer.wpe.weight), SRC, a flag
# (the code often puts the flag in from a variable)
_NAME = re.compile("|".join(p for p, _ in _VALUE) + r"|(?<![\w-])[a-z]\d?(?![\w-])|[\w-]*\.[\w.]*\w|\bSRC\b|--[\w-]+")


def literal_runs(quoted: str) -> list[str]:
    """The quoted line's words between its values, names and elisions, its program prefix aside: what the code
    must hold as written."""
    quoted = re.sub(r"^[\w. ]+: (error|warning): ", "", quoted)
    quoted = re.sub(r"\(\w+Error: [^()]*\)", "...", quoted)  # a library's exception, quoted as it says it
    runs = []
    for piece in quoted.split("..."):
        runs += [r.strip() for r in _NAME.split(piece.strip()) if r and len(r.strip()) >= 6]
    return runs


def in_code(run: str, src: str) -> bool:
    """The run is in the code as written, or as up to three strings joined at a word or a punctuation mark (a
    message composed of fixed parts and variable ones: f"{what} need a vocabulary of {n}", what = "byte tokens")."""
    cuts = sorted({c for m in re.finditer(r"[\s:;(),]+", run) for c in m.span()})

    def joined(start: int, parts: int) -> bool:
        return run[start:] in src or parts > 1 and any(
            run[start:c] in src and joined(c, parts - 1) for c in cuts if start < c < len(run))
    return joined(0, 3)


def _quoted_lines() -> list[str]:
    """Every error line the two pages quote: troubleshooting.md's table spans (a bare name aside) and the lines
    checkpoint.md shows indented under its untrusted-checkpoint and model-identity sections."""
    spans = [s for s in _table_spans(_read("troubleshooting.md")) if " " in s]
    ckpt = _read("checkpoint.md")
    for title in ("Untrusted checkpoints: files are data", "The model a checkpoint holds"):
        spans += [ln.strip() for ln in _section(ckpt, title).splitlines() if ln.startswith("    ") and ln.strip()]
    return spans


def test_every_quoted_error_line_is_printed_or_written_so_in_the_code(printed):
    """A quoted line the suite's bad inputs print must match one of those lines; the others (printed only by a
    running job, or by inputs tested elsewhere) must hold the code's own words between their values."""
    quoted = _quoted_lines()
    assert len(quoted) >= 130 and len(printed) >= 380, (len(quoted), len(printed))
    src = _source_strings()
    matched = [q for q in quoted if any(pattern(q).search(ln) for ln in printed)]
    assert len(matched) >= 75, [q for q in quoted if q not in matched]  # 79 of 133 today
    wrong = {q: [r for r in literal_runs(q) if not in_code(r, src)] for q in quoted if q not in matched}
    wrong = {q: runs for q, runs in wrong.items() if runs}
    assert not wrong, wrong


def test_the_matching_is_strict_about_words_and_loose_about_values():
    line = ("train.py: error: --deepspeed-config: gradient_accumulation_steps must be in [1, 9007199254740992], "
            "got 0")
    assert pattern("gradient_accumulation_steps must be in [1, 64], got 3").search(line)
    assert not pattern("gradient_accumulation_steps must be >= 1, got 0").search(line)
    assert pattern("--load 'runs/ckpt': no ... (the newest: X)").search("--load '/a/b': no such (the newest: y)")
    assert literal_runs("--data-path d: d.idx is missing (found N)") == ["is missing (found"]


def test_the_pages_counts_are_the_tests():
    """troubleshooting.md's row counts are test_inputs' tables; checkpoint.md's count of malformed checkpoints is
    test_trust's, and the identity hash it shows is tiny-gpt2's."""
    import test_inputs as ti
    import test_trust as tt

    from hybrid.checkpoint.identity import model_identity
    from models import load_config
    text = _read("troubleshooting.md")
    assert f"({len(ti.CASES)} of them on a machine without CUDA, plus {len(ti.SCRIPT_CASES)} for the benchmark" in \
        text.replace("\n", " ")
    payloads = [c for c in tt.CASES if "payload" in c[0] or "bytes-entry" in c[0]]
    assert f"and {len(tt.CASES) - len(payloads)} other malformed" in _read("checkpoint.md").replace("\n", " ")
    sha = model_identity(load_config("tiny-gpt2"))["sha256"]
    assert f"`model tiny-gpt2 (config {sha})`" in _read("checkpoint.md")
