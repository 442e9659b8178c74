"""The `hybrid` command.

    hybrid layout --world 16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
    hybrid models [NAME ...]   (the model presets: all, or NAME and NAME-...; a folder: that transformers model)
    hybrid plan ...            (the layout planner; hybrid calibrate measures a machine for it)
    hybrid checkpoint inspect DIR
    hybrid convert SRC DST     (checkpoints: transformers <-> hybrid, DeepSpeed -> hybrid)
    hybrid generate SRC        (decoding from a checkpoint, any TP x PP under torchrun)

Training itself is launched with torchrun: `torchrun --nproc-per-node N -m hybrid.train ...` (or
`python -m hybrid.train ...` for one process).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys

# nothing here imports torch at module level: the console script imports this module before main() runs, and a
# Ctrl-C during torch's import (seconds; a minute on a loaded machine) must reach main()'s one line and status 130,
# not Python's traceback (round 16); the sub-commands' modules, which do import it, load inside main()
from hybrid.cliutil import HelpFormatter, OneLineParser, fail, int_in, parallel_hints, positive_int, warn_repeated

# the modules whose add_parser(subparsers) registers a sub-command, with the commands each registers; every one is
# part of the package, so one that does not import is a broken install, not an optional feature -- never skipped.
# A command line naming one of them first imports that module alone: `hybrid plan` then loads no torch (the
# checkpoint, convert and generate modules import it: seconds, more under load); --help and errors import them all
SUBCOMMANDS = {"hybrid.planner.cli": ("plan", "calibrate"), "hybrid.checkpoint.inspect": ("checkpoint",),
               "hybrid.convert.cli": ("convert",), "hybrid.generate.cli": ("generate",)}
MAX_WORLD = 2**16  # `layout` prints a line per TP group: beyond this it is a wall of text, not a layout


def _layout(args: argparse.Namespace) -> None:
    from hybrid.mesh import Axis, ParallelDims
    dims = ParallelDims.from_world(args.world, tp=args.tensor_model_parallel_size,
                                   pp=args.pipeline_model_parallel_size, cp=args.context_parallel_size)
    experts = []  # MoE: which ranks hold which experts (checked before anything is printed)
    moe = args.expert_model_parallel_size > 1 or args.expert_tensor_parallel_size > 1 or args.num_experts
    if args.moe_ffn_hidden_size and not moe:  # it only labels the experts' columns: without experts, no line reads it
        raise ValueError(f"--moe-ffn-hidden-size {args.moe_ffn_hidden_size} is the experts' width; add --num-experts "
                         f"or --expert-model-parallel-size to print the experts, or drop it")
    if moe:  # with CP the expert layers fold the stage's tp x cp x dp ranks, as train.py runs them (hybrid/moe)
        from hybrid.moe.parallel import ExpertLayout
        experts = ExpertLayout(dims, args.expert_model_parallel_size, args.expert_tensor_parallel_size).describe(
            args.num_experts or args.expert_model_parallel_size, args.moe_ffn_hidden_size)
    if dims.cp == 1:
        print(f"world {dims.world} = tp {dims.tp} x dp {dims.dp} x pp {dims.pp} (rank = tp + tp_size*(dp + dp_size*pp))")
    else:
        print(f"world {dims.world} = tp {dims.tp} x cp {dims.cp} x dp {dims.dp} x pp {dims.pp} "
              f"(rank = tp + tp_size*(cp + cp_size*(dp + dp_size*pp)))")
    for pp in range(dims.pp):
        print(f"pipeline stage {pp}:")
        for g in sorted(dims.group_ranks(Axis.TP)):
            c = dims.coords(g[0])
            if c.pp == pp:
                print(f"  dp {c.dp}{f' cp {c.cp}' if dims.cp > 1 else ''}: tp group {g}")
    if dims.cp > 1:
        print("cp groups:", dims.group_ranks(Axis.CP))
        print("dp x cp groups (gradients, ZeRO):", dims.group_ranks((Axis.CP, Axis.DP)))
    print("dp groups:", dims.group_ranks(Axis.DP))
    print("pp groups:", dims.group_ranks(Axis.PP))
    print("embedding groups:", dims.embedding_group_ranks())
    for line in experts:
        print(line)


def preset_family(word: str, presets: list[str]) -> list[str]:
    """The presets `hybrid models WORD` shows: WORD itself and those named WORD-... (gpt2: gpt2, gpt2-medium,
    gpt2-large, gpt2-xl; llama: the llama-3 sizes). ValueError naming the closest preset when none is."""
    family = [p for p in presets if p == word or p.startswith(word + "-")]
    if not family and os.sep in word:  # a path, not a name: say so rather than "no preset" (nothing is there)
        raise ValueError(f"{word!r}: no such folder; give a folder holding a transformers config.json, or a preset "
                         f"(`hybrid models` lists them)")
    if not family:
        near = difflib.get_close_matches(word, presets, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""  # as models.config words it for --model
        raise ValueError(f"no preset {word!r}{hint} (`hybrid models` lists them all; NAME may also be a folder "
                         f"holding a transformers config.json)")  # this command has no --model: NAME is the word
    return family


def _model_config(name: str):
    """load_config's model, its errors said of the NAME `hybrid models` was given: load_config words them for
    train.py's flag ("--model DIR: the directory has no config.json"), which this command does not take."""
    from models.config import load_config
    try:
        return load_config(name)
    except ValueError as e:
        text = str(e)
        raise ValueError(text[len("--model "):] if text.startswith("--model ") else
                         f"{name}{text[len('--model'):]}" if text.startswith("--model:") else text) from None


def _models(args: argparse.Namespace) -> None:
    """The presets' sizes; a NAME that is a folder (what --model takes besides a preset) is that model, read and
    checked as train.py reads it -- `hybrid models path/to/hf_model` was "no preset" while the line said --model
    takes such a folder."""
    from models.presets import PRESETS
    names = [p for word in args.names
             for p in ([word] if os.path.exists(word) else preset_family(word, list(PRESETS)))] \
        if args.names else list(PRESETS)
    configs = {name: _model_config(name) for name in dict.fromkeys(names)}  # a bad config.json: one line, no table
    print(f"{'preset':<14} {'arch':<6} {'params':>10} {'layers':>6} {'hidden':>6} {'heads':>5} {'kv':>3} {'vocab':>7}")
    for name, c in configs.items():
        print(f"{name:<14} {c.arch:<6} {c.num_parameters / 1e6:>9.1f}M {c.num_layers:>6} {c.hidden_size:>6} "
              f"{c.num_heads:>5} {c.num_kv_heads:>3} {c.vocab_size:>7}")


# commands users guess from the docs' words or other tools: where that lives (round 16: "invalid choice" alone)
COMMAND_HINTS = {
    "command=train": "training is launched with torchrun, not `hybrid`: torchrun --nproc-per-node N -m hybrid.train "
                     "... (one process: python -m hybrid.train ...; in a checkout: scripts/train.py)",
    "command=inspect": "give `hybrid checkpoint inspect DIR`",
    "command=reshard": "a checkpoint is resharded as it loads (train.py --load DIR at any layout); `hybrid convert "
                       "SRC DST --target-tensor-parallel-size N` pre-shards a model",
    "command=export": "give `hybrid convert SRC DST` (a hybrid SRC gives a transformers folder)",
    "command=preprocess": "in a checkout: python scripts/preprocess_data.py (docs/data.md)",
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The `hybrid` parser; with `argv` whose first word is a sub-command of SUBCOMMANDS, only that module's (the
    others are not imported)."""
    parser = OneLineParser(prog="hybrid", description="Hybrid-parallel (TP x CP x PP x DP) training toolkit",
                           formatter_class=HelpFormatter, hints=COMMAND_HINTS,
                           warn_repeated=False)  # main prints them once the command has run: an error stays one line
    sub = parser.add_subparsers(dest="command", required=True)
    world = "give the ranks as --world N (train.py's world: the processes launched)"
    p = sub.add_parser("layout", help="print the rank layout of a mesh", formatter_class=HelpFormatter,
                       hints={**parallel_hints("--world"), **{flag: f"{flag}: {world}" for flag in (
                           "--world-size", "--gpus", "--num-gpus", "--nproc-per-node")}})
    p.add_argument("--world", type=int_in(1, MAX_WORLD), metavar="N", required=True, help="number of ranks (required)")
    p.add_argument("--tensor-model-parallel-size", type=positive_int, metavar="N", default=1, help="tp")
    p.add_argument("--pipeline-model-parallel-size", type=positive_int, metavar="N", default=1, help="pp")
    p.add_argument("--context-parallel-size", type=positive_int, metavar="N", default=1,
                   help="cp: ranks splitting each sequence")
    p.add_argument("--expert-model-parallel-size", type=positive_int, metavar="N", default=1,
                   help="MoE: EP, folded over each stage's ranks (hybrid/moe/parallel.py)")
    p.add_argument("--expert-tensor-parallel-size", type=positive_int, metavar="N", default=1,
                   help="MoE: expert-TP, ranks splitting each expert's width (innermost of the folding)")
    p.add_argument("--moe-ffn-hidden-size", type=positive_int, metavar="N", default=None,
                   help="MoE: the experts' width, to print which columns each expert-TP rank holds")
    p.add_argument("--num-experts", type=positive_int, metavar="N", default=None,
                   help="MoE: experts per layer, to print which ranks hold which (default: EP, one each)")
    p.set_defaults(func=_layout)
    p = sub.add_parser("models", help="list model presets", formatter_class=HelpFormatter)
    p.add_argument("names", nargs="*", metavar="NAME", help="only these presets and those named NAME-...; a folder: "
                   "the transformers model in it (config.json), as --model reads it (default: all presets)")
    p.set_defaults(func=_models)
    named = [m for m, commands in SUBCOMMANDS.items() if argv and argv[0] in commands]
    for module in named or SUBCOMMANDS:  # each feature registers its own; a broken install fails here, loudly
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    try:
        argv = sys.argv[1:] if argv is None else argv
        parser = build_parser(argv)
        args = parser.parse_args(argv)
    except KeyboardInterrupt:  # Ctrl-C while the sub-commands' modules import (torch: seconds, a minute under load)
        print("hybrid: interrupted while starting, before any work: nothing was run or written", file=sys.stderr)
        raise SystemExit(130) from None
    try:
        status = args.func(args)  # an int where the command has a verdict (checkpoint inspect), else None
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
    except BrokenPipeError:  # `hybrid layout ... | head`: the reader has all it wanted; end as a Unix tool ends
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's own flush must not fail again
        raise SystemExit(141) from None  # 128 + SIGPIPE, the status a tool killed by the closed pipe has
    except ValueError as e:  # the prefix argparse gives the same command's errors: `hybrid checkpoint inspect`
        command = " ".join(filter(None, (args.command, getattr(args, "action", None))))
        raise fail(f"hybrid {command}: error: {e}") from None
    warn_repeated(f"hybrid {' '.join(filter(None, (args.command, getattr(args, 'action', None))))}", parser.repeated)
    if status:
        raise SystemExit(status)


if __name__ == "__main__":
    main(sys.argv[1:])
