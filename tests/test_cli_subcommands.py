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


def test_layout_refuses_the_cp_x_ep_mesh_train_py_refuses(capsys):
    """`hybrid layout` prints no layout train.py would not run: MoE with CP is refused by name, as hybrid/moe/args.py
    refuses it in train.py, and nothing is printed before the error."""
    with pytest.raises(SystemExit) as e:
        hybrid.cli.main(["layout", "--world", "8", "--context-parallel-size", "2", "--expert-model-parallel-size", "2"])
    assert "--context-parallel-size 2 with experts" in str(e.value.code)
    assert capsys.readouterr().out == ""


def test_a_negative_size_is_a_value_the_flag_refuses_by_name():
    """argparse takes a token starting with '-' for a flag ("expected one argument"); "-5GB" is a value (no flag
    starts with a digit), so the flag's own check names it."""
    from hybrid.convert.safetensors_out import parse_size
    args = hybrid.cli.build_parser().parse_args(["convert", "src", "dst", "--max-shard-size", "-5GB"])
    assert args.max_shard_size == "-5GB"
    with pytest.raises(ValueError, match="--max-shard-size '-5GB': give a size"):
        parse_size(args.max_shard_size)
