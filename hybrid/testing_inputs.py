"""The bad-input harness of the tests: a command given a bad input ends with one line naming the flag, key or file
and the fix, before any process group (the developers' brief). One version for every test that checks it, in
place of each file's own `_one_line` and launcher-environment fixture:

    def test_x(one_line):                            # tests/conftest.py's fixture: one_line_error bound to capsys
        assert one_line(lambda: validate(argv)) == "train.py: error: ..."

    pytestmark = pytest.mark.usefixtures("one_process")   # `python`, not torchrun: no launcher variables, world 1

Imported by tests only (it imports pytest); hybrid.testing's forkserver does not load it.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

# what torchrun sets and a plain `python` run lacks: train.py reads its world and rank from these, and where to
# record its error (hybrid/launch.py) and which restart it is from the TORCHELASTIC ones
LAUNCHER_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RESTART_COUNT")


def python_environment(monkeypatch: pytest.MonkeyPatch, world: int | None = None) -> None:
    """The environment of a command run as `python ...`: no launcher variable set. `world`: WORLD_SIZE set alone,
    the world train.py's checks then see (its parse runs on each rank before any process group)."""
    for name in LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)
    if world is not None:
        monkeypatch.setenv("WORLD_SIZE", str(world))


class OneLine:
    """`one_line(call)`: run `call()`, which must end as a bad input ends, and return its one line. Checked:

    * SystemExit with a non-zero status (0 or None: the command took the input);
    * one non-blank line in what the exit printed -- stderr since the call began, with the exit message when it
      is a string (`sys.exit("train.py: error: ...")` or argparse's `error()`, which prints to stderr and exits
      2), `ignore` lines left out (DeepSpeed's import prints "[WARNING]" lines of its own to stderr);
    * no traceback in stdout or stderr, and no process group started (every check runs before it).

    `out`: what the call printed to stdout, for the tests that check it printed nothing before the error. What
    the test printed before the call is not the call's: it is read out of capsys first and left out."""

    def __init__(self, capsys: pytest.CaptureFixture) -> None:
        self.capsys = capsys
        self.out = ""

    def __call__(self, call, ignore: tuple[str, ...] = ()) -> str:
        self.capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            call()
        code = e.value.code
        self.out, err = self.capsys.readouterr()
        text = err + (f"{code}\n" if isinstance(code, str) else "")
        lines = [ln for ln in text.splitlines() if ln.strip() and not any(s in ln for s in ignore)]
        assert code not in (0, None), f"a bad input must exit non-zero, got {code!r}: {text}"
        assert len(lines) == 1, f"expected one error line, got {lines}"
        assert "Traceback" not in text + self.out, text
        assert not dist.is_initialized(), "a process group was started for a bad input"
        return lines[0]
