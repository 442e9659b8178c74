"""Small command-line helpers shared by the scripts: one-line errors (printed once under torchrun, recorded for
the launcher's failure summary), typed and range-checked values, output paths checked before the work and
written atomically."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import math
import os
import re
import sys
import tempfile
import time
from typing import Callable, Iterator

from hybrid.fault_hook import crash_point  # the one test-only fault hook (standard library only; a no-op unset)


def is_rank_zero() -> bool:
    """True in a single process and on global rank 0 under torchrun (RANK unset or "0"). Also where RANK is no rank
    of the world -- not an integer below WORLD_SIZE, so set by hand, never by torchrun: no rank 0 of its job prints
    the one line, so this process prints its own at once (it waited outlive_rank_zero's 60 s for one, round 25)."""
    rank, world = os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")
    return rank == "0" or not (rank.isdigit() and world.isdigit() and int(rank) < int(world))


def record_error(message: str) -> None:
    """Write `message` to torch elastic's error file (TORCHELASTIC_ERROR_FILE, set by torchrun for each worker) so
    the launcher's failure summary shows it as the root cause instead of "To enable traceback see ...".
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        with open(path, "w") as f:
            # the layout torch's ErrorHandler.record_exception writes; the summary shows "py_callstack" as the
            # failure's traceback, so it holds the one line rather than a stack
            json.dump({"message": {"message": message, "extraInfo": {"py_callstack": message,
                                                                      "timestamp": str(int(time.time()))}}}, f)
    except OSError:
        pass  # the summary then falls back to the exit code; the error line itself was already printed


def fail(message: str, status: int = 1) -> SystemExit:
    """The SystemExit that ends a run with one error line: printed by rank 0 only (every rank of a torchrun job
    checks the same inputs), recorded in every rank's elastic error file. `raise fail(...)`."""
    record_error(message)
    error = SystemExit(message if is_rank_zero() else status)
    error.message = message  # for a rank that outlives rank 0 (outlive_rank_zero)
    return error


def outlive_rank_zero(error: SystemExit, grace_s: float = 60.0) -> None:
    """A non-zero rank that failed the input checks waits for the launcher to stop it: torchrun terminates the
    other workers as soon as one exits non-zero, so a rank 1 that exits first can kill a slower rank 0 before rank 0
    prints the one error line. Rank 0 fails on the same inputs and torchrun then ends this process; if it is still
    alive after `grace_s` (rank 0 saw different files, say), it prints the line itself and the SystemExit goes on."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
    message = getattr(error, "message", None)
    if message:
        print(f"{message} (rank {os.environ.get('RANK')})", file=sys.stderr, flush=True)


def _closest(token: str, options: list[str]) -> str | None:
    """The valid flag meant by `token`: one holding all its words (--tensor-parallel -> --tensor-model-parallel-size,
    the shortest such), else one it abbreviates (--lr-warm -> --lr-warmup-iters), else the closest spelling
    (difflib, as git and pip suggest)."""
    words = set(token.lstrip("-").split("-"))
    holding = sorted((o for o in options if o.startswith("--") and words <= set(o[2:].split("-"))), key=len)
    if holding:
        return holding[0]
    prefixed = sorted((o for o in options if o.startswith(token) and len(token) > 3), key=len)
    if prefixed:  # an abbreviation (not expanded: allow_abbrev=False) of --lr-warmup-iters
        return prefixed[0]
    # 0.75, not difflib's 0.6: the shared "--" alone lifts unrelated flags to ~0.7 (--order -> --world)
    close = difflib.get_close_matches(token, options, n=1, cutoff=0.75)
    return close[0] if close else None


def _suggest(message: str, options: list[str], hints: dict[str, str] | None = None) -> str:
    """"; did you mean --lr?" for the unrecognized --flags of an argparse message that are close to a valid one.
    A flag in `hints` (another tool's name for something this command takes elsewhere: Megatron's --num-experts is
    the --model config's expert count) gets its hint instead: a near spelling of it would mislead (--num-layers is
    not --num-layers-per-virtual-pipeline-stage). --help is never the suggestion (--ep is not --help)."""
    pairs, notes = [], []
    options = [o for o in options if o not in ("-h", "--help")]
    for token in re.findall(r"(?<![\w-])(--?[\w-]+)", message.split(":", 1)[-1]):
        if hints and token.split("=")[0] in hints:
            notes.append(hints[token.split("=")[0]])
            continue
        close = _closest(token.split("=")[0], options)
        if close:
            pairs.append((token, close))
    if notes:
        return "; " + "; ".join(notes) + (_suggest_pairs(pairs) if pairs else "")
    if not pairs:
        return "; see --help"
    return _suggest_pairs(pairs)


def _choice_hint(message: str, hints: dict[str, str]) -> str:
    """"; <hint>" for argparse's "argument --flag: invalid choice: 'value' ..." when `hints` has "--flag=value" (another
    tool's choice, e.g. Megatron's --tokenizer-type GPT2BPETokenizer, and what to give here instead), or for a
    sub-command's word, "dest=value" (`hybrid checkpoint reshard`: "action=reshard"); else ""."""
    m = re.match(r"argument (--[\w-]+|\w+)(?:/[^:]*)?: invalid choice: '([^']*)'", message)
    hint = hints.get(f"{m.group(1)}={m.group(2)}") if m else None
    return f"; {hint}" if hint else ""


def _suggest_pairs(pairs: list[tuple[str, str]]) -> str:
    if len(pairs) == 1:
        return f"; did you mean {pairs[0][1]}?"
    return "; did you mean " + ", ".join(f"{good} for {bad}" for bad, good in pairs) + "?"


# a token that starts "-<digit>" or "-.<digit>" is a value, never a flag (no flag starts with a digit): "-1e-4" and
# "-inf" are negative numbers, "-5GB" a negative size the flag's own type then refuses by name
_NEGATIVE_NUMBER = re.compile(r"^-(\d|\.\d)|^-(inf|infinity|nan)$", re.IGNORECASE)


def warn_repeated(prog: str, repeated: list[str]) -> None:
    """OneLineParser.repeated's lines as warnings (rank 0): at parse time, or -- a command whose errors come after
    parsing (train.py's checks, `hybrid plan`'s search) -- once it has run, so that an error stays one line."""
    if is_rank_zero():
        for line in repeated:
            print(f"{prog}: warning: {line}", file=sys.stderr, flush=True)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line ("prog: error: ...", with the closest valid flag for a
    mistyped one) instead of the usage block, printed once under torchrun. Prefixes are not expanded
    (allow_abbrev=False, as Megatron): `--lr-warm 5` is an error, not silently `--lr-warmup-iters`."""

    def __init__(self, *args, hints: dict[str, str] | None = None, warn_repeated: bool = True, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.hints = hints or {}  # unknown flag -> what to give instead (_suggest)
        # a flag given twice: parse_args prints the warning (rank 0) where True, else the caller prints `repeated`
        # with its other warnings once its checks have passed (train.py: an error stays one line)
        self.warn_repeated = warn_repeated
        self.repeated: list[str] = []
        # argparse takes "-1e-4" and "-inf" for flags ("expected one argument"); they are negative numbers
        self._negative_number_matcher = _NEGATIVE_NUMBER

    def parse_known_args(self, args=None, namespace=None):
        """Unknown --flags are reported (with a suggestion) before argparse's own "required" check, which would
        otherwise hide a misspelt required flag."""
        argv = sys.argv[1:] if args is None else list(args)
        if not any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            options = {s for a in self._actions for s in a.option_strings}
            unknown = [t for t in argv if t.startswith("--") and t != "--" and t.split("=", 1)[0] not in options]
            if unknown:
                self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return super().parse_known_args(argv, namespace)

    def parse_args(self, args=None, namespace=None):
        """Words left over are refused by the sub-command that was given, as its own flags are: argparse's
        parse_args names the top parser (`hybrid: error: unrecognized arguments: gpt2` for `hybrid models gpt2`),
        where every other error of a sub-command reads `hybrid models: error: ...`."""
        argv = sys.argv[1:] if args is None else list(args)
        namespace, extras = self.parse_known_args(argv, namespace)
        parser = self.chosen(namespace)
        if extras:
            parser._switch_given_a_value(argv, extras)
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        self.repeated = parser.repeated_flags(argv)
        if self.warn_repeated:
            warn_repeated(parser.prog, self.repeated)
        return namespace

    def repeated_flags(self, argv: list[str]) -> list[str]:
        """One line per option given more than once with different values (`--lr 1e-3 ... --lr 1e-4`). argparse --
        and so Megatron-LM, whose flags these are -- keeps the last without a word; so does this parser (a command
        built by appending overrides, `$(hybrid plan --emit-args) --micro-batch-size 4`, means the last), but says
        which one won. Switches, repeatable options (append, count) and a value given twice the same are not
        repeats."""
        given: dict[str, list[tuple[str, str]]] = {}
        for i, token in enumerate(argv):
            if token == "--":
                break
            name, eq, value = token.partition("=")
            action = self._option_string_actions.get(name) if token.startswith("-") else None
            if action is None or action.nargs == 0 or isinstance(action, (argparse._AppendAction,
                                                                           argparse._CountAction)):
                continue
            given.setdefault(action.dest, []).append((name, value if eq else self._value_after(argv, i + 1, action)))
        lines = []
        for uses in given.values():
            if len({value for _, value in uses}) > 1:
                shown = [f"{name} {value}".rstrip() for name, value in uses]
                times = "twice" if len(uses) == 2 else f"{len(uses)} times"
                lines.append(f"{uses[0][0]} given {times} ({', '.join(shown[:-1])}, then {shown[-1]}): the "
                             f"last is used, as argparse (and Megatron-LM) does; drop the other"
                             f"{'s' if len(uses) > 2 else ''}")
        return lines

    def _value_after(self, argv: list[str], start: int, action: argparse.Action) -> str:
        """The words argparse takes as `action`'s value from argv[start:]: one (nargs None or ?), N, or every word up to
        the next option (+, *); a negative number is a value, not an option."""
        words = []
        for word in argv[start:]:
            if word.startswith("-") and not self._negative_number_matcher.match(word):
                break
            words.append(word)
            if action.nargs in (None, "?") or (isinstance(action.nargs, int) and len(words) == action.nargs):
                break
        return " ".join(words)

    def _switch_given_a_value(self, argv: list[str], extras: list[str]) -> None:
        """A word left over right after a switch (`--bf16 True`, transformers' TrainingArguments style; `--sequence-
        parallel 1`): the switch takes no value, and the word alone would be "unrecognized arguments: True; see
        --help". One line naming the switch instead."""
        for i, word in enumerate(argv[1:], 1):
            action = self._option_string_actions.get(argv[i - 1])
            if word in extras and action is not None and action.nargs == 0 and not word.startswith("-"):
                self.error(f"argument {argv[i - 1]}: a switch, it takes no value (got {word!r}): give {argv[i - 1]} "
                           f"alone, or leave it out")

    def chosen(self, namespace: argparse.Namespace) -> OneLineParser:
        """The innermost sub-command parser `namespace` was parsed by (`hybrid checkpoint inspect`), else self."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                sub = action.choices.get(getattr(namespace, action.dest, None))
                if isinstance(sub, OneLineParser):
                    return sub.chosen(namespace)
        return self

    def error(self, message: str) -> None:
        if "unrecognized arguments" in message:
            message += _suggest(message, [s for a in self._actions for s in a.option_strings], self.hints)
        elif "invalid choice" in message:
            message = message.replace("\n", " ") + _choice_hint(message, self.hints)
        text = f"{self.prog}: error: {message}"
        record_error(text)
        if is_rank_zero():
            sys.stderr.write(text + ("" if text.endswith("\n") else "\n"))
        error = SystemExit(2)
        error.message = text.rstrip("\n")
        raise error

    def check_out(self, flag: str, path: str | None) -> None:
        """A file flag (--out) writable before any work (check_output_file), else this parser's one-line error: a
        missing folder or a directory used to be found when the table was written, after the benchmark ran. None:
        not given; an empty name (an unset shell variable) is refused as check_output_file refuses it. A symbolic
        link is refused too (write_text's refusal, before the work rather than after it)."""
        if path is not None:
            try:
                check_not_link(f"{flag} {path!r}", path)
                check_output_file(flag, path)
            except ValueError as e:
                self.error(str(e))

    def read_table(self, flag: str, path: str, parse: Callable[[str], object], what: str) -> tuple[str, object]:
        """(text, parse(text)) of a UTF-8 file a script draws from (plot_cp / plot_moe's --bench), else this parser's
        one-line error naming the flag: unreadable, not UTF-8 ("give WHAT"), or parse's ValueError."""
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            return text, parse(text)
        except OSError as e:
            self.error(f"{flag} {path!r}: cannot read it ({e.strerror})")
        except UnicodeDecodeError:
            self.error(f"{flag} {path!r}: not UTF-8; give {what}")
        except ValueError as e:
            self.error(f"{flag} {path!r}: {e}")

    def results_out(self, out: str | None, quick: bool, default: str) -> str:
        """--out of a benchmark whose default report is a measured table in docs/results: a --quick smoke run
        (it measures nothing) must name its own --out, else this parser's one-line error -- `bench_zero.py
        --quick` used to replace docs/results/bench_zero.md with the smoke table."""
        if out is None and quick:
            self.error(f"--quick measures nothing: give --out FILE (without it the smoke table would replace the "
                       f"measured {os.path.relpath(os.path.abspath(default))})")
        return out or default


@contextlib.contextmanager
def interruptible_start(prog: str) -> Iterator[None]:
    """Around an entry point's first imports (torch: seconds, a minute on a loaded machine): a Ctrl-C there ends
    with one line (rank 0's, as every error under torchrun) and status 130, not Python's traceback through torch's
    import on every rank. This module imports the standard library only, so the entry point can import it first."""
    try:
        yield
    except KeyboardInterrupt:
        if is_rank_zero():
            print(f"{prog}: interrupted while starting, before any work: nothing was run or written", file=sys.stderr)
        raise SystemExit(130) from None


def parallel_hints(world: str, short: bool = True) -> dict[str, str]:
    """Unknown-flag hints of a command that takes the layout's sizes: dp is never a flag (it is what the world leaves
    after tp x cp x pp; --data-parallel-size got "did you mean --context-parallel-size?", --dp "--simulated-dp-
    bandwidth?"), and, where `short`, torchtitan's and Megatron's short names of the sizes the command has
    (`hybrid plan --tp 2` got "did you mean --allow-cross-node-tp?"). `world`: where this command's world comes from."""
    dp = f"dp is not a flag: it is what the other sizes leave, {world} / (tp x cp x pp)"
    out = {flag: f"{flag}: {dp}" for flag in ("--data-parallel-size", "--dp", "--dp-size")}
    if short:
        out.update({flag: f"{flag}: the flag is {name}" for flag, name in (
            ("--tp", "--tensor-model-parallel-size"), ("--pp", "--pipeline-model-parallel-size"),
            ("--cp", "--context-parallel-size"), ("--ep", "--expert-model-parallel-size"))})
    return out


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """--help keeps the description's line breaks (examples) and shows every option's default."""


# --- typed values (argparse `type=`): the error names the flag, argparse prefixes it --------------------

def _number(text: str, kind: type) -> float | int:
    try:
        value = kind(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                         f"got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def int_in(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """argparse type: an integer in [low, high] (None: unbounded)."""
    def parse(text: str) -> int:
        value = _number(text, int)
        if not in_range(value, low, high):
            raise argparse.ArgumentTypeError(f"expected an integer {_range(low, high)}, got {value}")
        return value
    parse.__name__ = "int"
    return parse


def float_in(low: float | None = None, high: float | None = None, low_open: bool = False,
             high_open: bool = False) -> Callable[[str], float]:
    """argparse type: a finite float in the interval (open or closed ends; None: unbounded)."""
    def parse(text: str) -> float:
        value = _number(text, float)
        if not in_range(value, low, high, low_open, high_open):
            raise argparse.ArgumentTypeError(f"expected a number {_range(low, high, low_open, high_open)}, "
                                             f"got {text}")
        return value
    parse.__name__ = "float"
    return parse


def _range(low, high, low_open: bool = False, high_open: bool = False) -> str:
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"{'<' if high_open else '<='} {high}"
    return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


positive_int = int_in(1)
nonnegative_int = int_in(0)
positive_float = float_in(0.0, low_open=True)
nonnegative_float = float_in(0.0)


def plural(n: int, noun: str, many: str | None = None, spec: str = "") -> str:
    """"1 document", "2 documents", "0 documents": a count and its noun in a message (`noun` singular; `many` the
    plural where it is not noun + "s": "entry", "entries"; `spec` the count's format, "," for "2,608")."""
    return f"{n:{spec}} {noun}" if n == 1 else f"{n:{spec}} {many or noun + 's'}"


def divisors(n: int) -> list[int]:
    """The positive divisors of n >= 1, ascending: the sizes a flag that must divide n can take (said in its error)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def nearest_multiples(value: int, m: int) -> list[int]:
    """The multiples of m >= 1 either side of a value m does not divide (the one below only when positive): what a
    size that must be a multiple of m can be changed to, said in its error."""
    below = value // m * m
    return [v for v in (below, below + m) if v > 0]


def one_of(values: list[int]) -> str:
    """"1, 2 or 4" (or "1" alone): the values a message offers."""
    return ", ".join(map(str, values[:-1])) + (f" or {values[-1]}" if len(values) > 1 else str(values[-1]))


# --- typed values outside argparse (a config's fields, a JSON file's keys): one set of predicates --------------

def is_integer(value) -> bool:
    """An int that is not a bool: True is an int to Python, so `isinstance(True, int)` lets ZeroConfig(stage=True)
    through as stage 1."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite(value) -> bool:
    """A finite real number, int or float, not a bool: NaN fails no `value < low` test (every comparison with NaN is
    False) and inf passes any `value >= low`, so a range check alone takes both. An int is finite however large
    (math.isfinite would overflow converting 10**400 to a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def in_range(value, low=None, high=None, low_open: bool = False, high_open: bool = False) -> bool:
    """low <= value <= high, an end strict when open, None unbounded."""
    if low is not None and (value <= low if low_open else value < low):
        return False
    return high is None or (value < high if high_open else value <= high)


def number_kind(integer: bool = False, low=None, high=None, low_open: bool = False, high_open: bool = False) -> str:
    """What check_number asks for, in words: "a positive integer", "an integer >= 0", "a finite number > 0",
    "a finite number in [0, 1)"; the bounds as the caller wrote them (pass 0 and 1, not 0.0 and 1.0)."""
    if integer and low == 1 and not low_open and high is None:
        return "a positive integer"
    kind = "an integer" if integer else "a finite number"
    return kind if low is None and high is None else f"{kind} {_range(low, high, low_open, high_open)}"


def check_number(name: str, value, low=None, high=None, *, low_open: bool = False, high_open: bool = False,
                 integer: bool = False, note: str = "", show: Callable[[object], str] = repr) -> None:
    """ValueError "{name} must be {number_kind}{note}, got {show(value)}" unless `value` is a finite number (an
    int when `integer`; never a bool) in range: the one check behind the typed configs' fields and the values that
    arrive without argparse (a JSON file: `show=json.dumps` prints the value as the file wrote it). `note`: the
    unit or what 0 means, e.g. " (GB/s; 0: off)"."""
    ok = is_integer(value) if integer else is_finite(value)
    if not ok or not in_range(value, low, high, low_open, high_open):
        raise ValueError(f"{name} must be {number_kind(integer, low, high, low_open, high_open)}{note}, "
                         f"got {show(value)}")


# --- output paths -----------------------------------------------------------------------------------------

def check_output_file(flag: str, path: str) -> None:
    """Before any work: `path` can be written as a regular file -- it is absent or a regular file (not a
    directory, device such as /dev/null, FIFO or socket), and a file can be created beside it, which is what
    atomic_output does (so /proc, /sys and read-only mounts fail here, not after the work). ValueError naming
    the flag otherwise."""
    if not path:
        raise ValueError(f"{flag}: give a file name")
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path!r} is a directory; give a file name")
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"{flag} {path!r} is not a regular file (a device, FIFO or socket); give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"{flag} {path!r}: its directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"{flag} {path!r} is not writable")
    _probe_create(flag, path, parent)


def _probe_create(flag: str, path: str, parent: str) -> None:
    """Create and remove a temporary file in `parent`: os.access says yes to root everywhere, but /proc, /sys
    and read-only file systems refuse the create that atomic_output will do."""
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.probe.", dir=parent)
    except OSError as e:
        raise ValueError(f"{flag} {path!r}: cannot create a file in {parent} ({e.strerror}); "
                         f"give a path on a writable file system") from None
    os.close(fd)
    os.remove(probe)


def package_root(path: str) -> str | None:
    """The outermost Python package (a folder holding __init__.py) that `path`, or the nearest existing folder above
    it, lies in; None outside any."""
    probe, root = os.path.realpath(path), None
    while not os.path.isdir(probe) and probe != os.path.dirname(probe):
        probe = os.path.dirname(probe)
    while probe != os.path.dirname(probe) and os.path.isfile(os.path.join(probe, "__init__.py")):
        root, probe = probe, os.path.dirname(probe)
    return root


def check_outside_packages(flag: str, path: str, what: str) -> None:
    """An output inside a Python package (the repository's hybrid/ or models/) would be written among its source
    files, where `git add -A` commits it and the package ships it. train.py's --save has refused it since round 16;
    round 19 found `hybrid convert`'s DST, train_tokenizer.py's --output and preprocess_data.py's --output-prefix
    writing there. ValueError naming the flag, the package and a path beside it."""
    if package := package_root(path):
        beside = os.path.join(os.path.dirname(package), os.path.basename(os.path.normpath(path)))
        beside = beside if os.path.relpath(beside).startswith("..") else os.path.relpath(beside)
        raise ValueError(f"{flag} {path!r} is inside the Python package {package} (its folders hold __init__.py): "
                         f"{what} would be written among its source files; give a path outside it, e.g. {flag} "
                         f"{beside}")


def check_output_dir(flag: str, path: str) -> None:
    """Before any work: `path` is a writable directory, or can be created (its nearest existing ancestor is a
    writable directory). For directory outputs (a checkpoint or TensorBoard directory)."""
    if not path:
        raise ValueError(f"{flag}: give a directory")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{flag} {path!r} exists and is not a directory")
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        if os.path.islink(probe):  # exists() is False for a link loop or a link to nothing: mkdir would fail later
            raise ValueError(f"{flag} {path!r}: {probe} is a symbolic link that does not resolve (a loop, or its "
                             f"target is missing); give a directory")
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path!r} is not writable ({probe})")
    _probe_create(flag, path, probe)  # /proc, /sys, read-only mounts: os.access says yes to root


_UMASK = os.umask(0o022)
os.umask(_UMASK)  # the process's umask, read once at import (no other thread yet: os.umask sets it to read it)


def new_temporary(path: str, suffix: str = ".tmp", infix: str = "") -> tuple[int, str]:
    """(fd, name) of a new file beside `path`, `.NAME.<infix>XXXXXXXX<suffix>`, with an ordinary file's mode (as
    open() gives; mkstemp makes it 0600). mkstemp creates it O_CREAT | O_EXCL, never through a link: a fixed
    temporary name someone made a link to a file elsewhere would be written through, and two writers of one
    output would share it. The caller closes fd."""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.{infix}", suffix=suffix,
                               dir=os.path.dirname(os.path.abspath(path)))
    os.fchmod(fd, 0o666 & ~_UMASK)
    return fd, tmp


@contextlib.contextmanager
def atomic_output(path: str, suffix: str = "") -> Iterator[str]:
    """Yield a temporary path beside `path`; on success it is renamed onto `path` (atomic on POSIX), on an
    exception removed -- a failed run leaves nothing half-written. `suffix` keeps the extension for writers
    that infer the format from it (matplotlib)."""
    fd, tmp = new_temporary(path, suffix=suffix, infix="tmp.")
    os.close(fd)
    try:
        yield tmp
        crash_point("output_written")  # test-only: the new bytes whole under `tmp`; `path` still the old file
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


# the first bytes of the image formats matplotlib writes that have a signature (pgf, raw and rgba have none)
IMAGE_SIGNATURES = {"png": (b"\x89PNG\r\n\x1a\n",), "pdf": (b"%PDF",), "eps": (b"%!PS", b"\xc5\xd0\xd3\xc6"),
                    "ps": (b"%!PS",), "jpg": (b"\xff\xd8\xff",), "jpeg": (b"\xff\xd8\xff",),
                    "tif": (b"II*\x00", b"MM\x00*"), "tiff": (b"II*\x00", b"MM\x00*"), "webp": (b"RIFF",),
                    "svgz": (b"\x1f\x8b",)}


def check_replaces_an_image(path: str, flag: str = "--plot") -> None:
    """A plot's output (`flag`: hybrid plan's --plot, plot_run.py's --out) naming an existing file that is not an
    image of its extension's format (a mistyped name that hits notes.svg, a CSV saved as results.png): ValueError
    before the work, whose plot would have replaced it. An image of that format is replaced, as re-plotting is
    meant to (calibrate's --out rule, profile.check_replaces_a_profile); an empty file too. Round 22: plot_run.py
    replaced the CSV, which hybrid plan refused."""
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if not os.path.isfile(path) or (ext not in IMAGE_SIGNATURES and ext != "svg"):
        return
    with open(path, "rb") as f:
        head = f.read(4096)
    image = (not head or b"<svg" in head) if ext == "svg" else (not head or head.startswith(IMAGE_SIGNATURES[ext]))
    if not image:
        raise ValueError(f"{flag} {path!r} exists and is not a .{ext} image, which the plot would replace; give a "
                         f"new file name, or remove the file first")


def check_not_link(what: str, path: str) -> None:
    """ValueError naming `what` (the path, or a flag and its value) when `path` is a symbolic link: an output is
    never written through one (write_text, OneLineParser.check_out)."""
    if os.path.islink(path):
        raise ValueError(f"{what} is a symbolic link (to {os.readlink(path)!r}); give the file's own path (nothing "
                         f"is written through a link)")


def json_problem(e: json.JSONDecodeError) -> str:
    """What is wrong with a JSON file, for "FILE: not valid JSON (...)": the parser's message with its line and
    column, without the doubled word its own format leaves ("Invalid control character at" + " at line 1"); an empty
    file, or one that ends before its JSON does (a copy or download cut short: the error sits at the end of the
    text, or in a string never closed), said as such, since "Expecting ',' delimiter" does not tell the user that."""
    text = e.doc if isinstance(e.doc, str) else ""
    if not text.strip():
        return "the file is empty"
    where = f"line {e.lineno} column {e.colno}"
    if e.msg.startswith("Unterminated string"):  # e.pos: where the string opens
        return f"the string at {where} is never closed, the file ends inside it: cut short? write the whole file"
    if e.pos >= len(text.rstrip()):
        return f"the file ends at {where} before the JSON does: cut short? write the whole file"
    return f"{e.msg.removesuffix(' at')} at {where}"


def write_text(path: str, text: str) -> None:
    """`text` into `path`, whole or not at all (atomic_output): a report is never left half-written. A symbolic
    link at `path` is refused (ValueError naming it): the rename would replace the link with a file while whoever
    made it expects its target written -- say so, and write neither."""
    check_not_link(repr(path), path)
    with atomic_output(path) as tmp, open(tmp, "w") as f:
        f.write(text)


def package_version(pkg: str) -> str:
    """Installed version of `pkg`, or "not installed" (for benchmark reports)."""
    import importlib.metadata

    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo, else what platform knows (for benchmark reports)."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]")
QUOTED_COMMAND = re.compile(r"`([^`]*)`")


def command_flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string `parser` accepts (--no-x forms of BooleanOptionalAction included)."""
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


def foreign_flags(message: str, accepted: set[str], commands: dict[str, set[str]],
                  given: tuple[str, ...] = ()) -> list[str]:
    """The flags `message` names that the command printing it does not accept. A flag inside a quoted command
    line (`hybrid calibrate --out FILE`, `train.py --hardware X`) belongs to that command: it is checked against
    `commands[name]` (the name: the longest key the quoted text starts with); the others against `accepted`.
    Flags the user typed (`given`, echoed back as what was wrong) are not suggestions and are left alone."""
    foreign = []
    for quoted in QUOTED_COMMAND.findall(message):
        name = max((k for k in commands if quoted.startswith(k)), key=len, default=None)
        if name is not None:
            foreign += [f for f in FLAG.findall(quoted) if f not in commands[name]]
    bare = QUOTED_COMMAND.sub("", message)
    for name in (k for k in commands if " " not in k):  # unquoted: "launch with torchrun --nproc-per-node N"
        follows = re.compile(rf"(?<![\w/.-]){re.escape(name)}((?:\s+--[a-z][a-z0-9-]*(?:\s+(?!--)[^\s;,)]+)?)+)")
        for m in follows.finditer(bare):
            foreign += [f for f in FLAG.findall(m.group(1)) if f not in commands[name]]
        bare = follows.sub("", bare)
    typed = {g.split("=", 1)[0] for g in given}
    return foreign + [f for f in FLAG.findall(bare) if f not in accepted and f not in typed]
