"""The `hybrid` command registers every sub-command, and a sub-command whose module does not import is an error,
not a silently missing command (a broken install must fail loudly)."""

from __future__ import annotations

import sys

import pytest

import hybrid.cli


def test_every_subcommand_is_registered():
    names = set(hybrid.cli.build_parser()._subparsers._group_actions[0].choices)
    assert {"layout", "models", "plan", "calibrate", "checkpoint", "convert", "generate"} <= names


@pytest.mark.parametrize("module", hybrid.cli.SUBCOMMANDS)
def test_a_subcommand_that_does_not_import_fails_loudly(module, monkeypatch):
    """sys.modules[name] = None makes `import name` raise ModuleNotFoundError, as a missing file or a missing
    dependency would: building the parser raises it instead of dropping the command."""
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ModuleNotFoundError):
        hybrid.cli.build_parser()
