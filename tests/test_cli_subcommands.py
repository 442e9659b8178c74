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


def test_layout_prints_the_cp_x_ep_mesh_train_py_runs(capsys):
    """`hybrid layout` at world 8 = cp 2 x dp 4, EP 2, 4 experts (train.py runs CP x EP since round 16): the expert
    layers fold the stage's 8 ranks as ep 2 x expert-dp 4 (Megatron: expert-DP carved from DP x CP), so each EP
    group is a CP pair -- rank = cp + 2 dp, hand-derived -- and the routing counts are summed over the CP pairs."""
    hybrid.cli.main(["layout", "--world", "8", "--context-parallel-size", "2", "--expert-model-parallel-size", "2",
                     "--num-experts", "4"])
    out = capsys.readouterr().out
    assert "ep groups (token all-to-all): [[0, 1], [2, 3], [4, 5], [6, 7]]" in out
    assert "expert-dp groups (expert gradients, ZeRO): [[0, 2, 4, 6], [1, 3, 5, 7]]" in out
    assert "tp x cp groups (a micro-batch's tokens: routing counts summed): [[0, 1], [2, 3], [4, 5], [6, 7]]" in out
    assert "  rank 1: experts 2-3" in out and "  rank 6: experts 0-1" in out


def test_a_negative_size_is_a_value_the_flag_refuses_by_name():
    """argparse takes a token starting with '-' for a flag ("expected one argument"); "-5GB" is a value (no flag
    starts with a digit), so the flag's own check names it."""
    from hybrid.convert.safetensors_out import parse_size
    args = hybrid.cli.build_parser().parse_args(["convert", "src", "dst", "--max-shard-size", "-5GB"])
    assert args.max_shard_size == "-5GB"
    with pytest.raises(ValueError, match="--max-shard-size '-5GB': give a size"):
        parse_size(args.max_shard_size)
