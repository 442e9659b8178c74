"""Which flags each command accepts, for the tests that walk every error message's suggestions
(hybrid/cliutil.py's foreign_flags): a message may only suggest flags of the command that prints it, or of a
command it quotes (`hybrid calibrate --out FILE`, torchrun --nproc-per-node N)."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def commands() -> dict[str, frozenset[str]]:
    """{name a message quotes the command by: its option strings}: every `hybrid` subcommand, train.py, torchrun."""
    from torch.distributed.run import get_args_parser

    import hybrid.cli
    from hybrid.cliutil import command_flags
    from hybrid.train.args import build_parser
    sub = next(a for a in hybrid.cli.build_parser()._actions if isinstance(getattr(a, "choices", None), dict))
    out = {f"hybrid {name}": frozenset(command_flags(p)) for name, p in sub.choices.items()}
    out.update({"train.py": frozenset(command_flags(build_parser())),
                "torchrun": frozenset(command_flags(get_args_parser()))})
    return out


def foreign(message: str, command: str, argv=()) -> list[str]:
    """The flags `message` (printed by `command`, run with `argv`) suggests that no command it names accepts."""
    from hybrid.cliutil import foreign_flags
    table = commands()
    return foreign_flags(message, set(table[command]), {k: set(v) for k, v in table.items()}, tuple(argv))
