"""`hybrid checkpoint inspect DIR`: what a checkpoint directory holds and whether it loads.

    hybrid checkpoint inspect runs/ckpt                 # every checkpoint in a --save directory
    hybrid checkpoint inspect runs/ckpt/iter_0000200    # one
    hybrid checkpoint inspect runs/ckpt --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 \\
        --world-size 16                                 # ... and can each be loaded at that layout?
    (--context-parallel-size and, for an MoE model, --expert-model-parallel-size too)

For each: iteration, consumed samples, the layout it was saved at, size, and the verdict -- complete and
every checksum matching, incomplete (an unfinished save), or the first corrupt file. With a layout, whether
it loads there and why not: DCP reshards to any layout the model can be split over, so the question is the
trainer's own (hybrid/mesh.py: dp from the world size, heads / kv-heads / FFN size / layers against tp and
pp; hybrid/moe: experts against ep over a stage's tp x cp x dp ranks), asked of the model the checkpoint was
saved from. Nothing here needs a process group.

Exit status 1 (so `hybrid checkpoint inspect DIR && torchrun ... --load DIR` stops) when a complete checkpoint is
corrupt or not loadable at the layout asked about, when DIR holds no sound complete one, or when the one iter_*
directory named is not sound; 0 otherwise (an unfinished save beside sound checkpoints is normal).
"""

from __future__ import annotations

import argparse
import os

from dataclasses import dataclass

from hybrid.checkpoint import store
from hybrid.cliutil import HelpFormatter, parallel_hints, positive_int
from hybrid.mesh import ParallelDims, validate_model_dims


@dataclass(frozen=True)
class Target:
    """The layout asked about (`--tensor-model-parallel-size`, `--pipeline-model-parallel-size`, `--world-size`,
    `--context-parallel-size`, `--expert-model-parallel-size`)."""

    tp: int
    pp: int
    world: int
    cp: int = 1
    ep: int = 1

    def describe(self) -> str:
        cp = f" x cp {self.cp}" if self.cp > 1 else ""
        ep = f" (ep {self.ep})" if self.ep > 1 else ""
        return f"at tp {self.tp}{cp} x pp {self.pp}{ep} on {self.world} ranks"


def loadable_at(state: dict, target: Target) -> tuple[bool, str]:
    """(whether a checkpoint with this state.json loads at `target`, the reason or what to know). The
    rules are the trainer's: ParallelDims.from_world and validate_model_dims (hybrid/mesh.py), the
    vocabulary padding of hybrid/tp/layers.vocab_spec, the batch split of hybrid/data.BatchSpec."""
    from hybrid.data import BatchSpec
    from hybrid.tp.layers import vocab_spec
    from models import load_config
    try:
        cfg = load_config(state["model"])
    except (KeyError, ValueError) as e:
        return False, f"cannot tell: the model it was saved from is unreadable ({e})"
    try:
        dims = ParallelDims.from_world(target.world, tp=target.tp, pp=target.pp, cp=target.cp)
        validate_model_dims(dims, cfg.num_heads, cfg.num_kv_heads, cfg.num_layers, cfg.ffn_hidden_size)
        _check_experts(cfg, state["model"], dims, target.ep)
    except ValueError as e:
        return False, str(e)
    # the padding rows are not saved (shards.py): any tp loads any vocabulary
    padded = vocab_spec(cfg.vocab_size, dims.tp, 1)
    notes = [f"dp {dims.dp}", f"vocabulary {cfg.vocab_size} rows, padded to {padded.length * dims.tp} at tp {dims.tp}"]
    flags = state.get("args", {})
    gbs, micro, seq = flags.get("global_batch_size"), flags.get("micro_batch_size"), flags.get("seq_length")
    if all(type(v) is int and v > 0 for v in (gbs, micro, seq)):  # the saved batch, kept unless the run passes another
        try:
            BatchSpec(gbs, micro, seq, dims.dp)
        except ValueError as e:
            notes.append(f"the saved batch does not split at dp {dims.dp} ({e})")  # the line gives the values
    if type(seq) is int and seq > 0 and dims.cp > 1:  # the saved sequence, kept unless the run passes another
        from hybrid.cp.balance import check_divisible
        try:
            check_divisible(seq, dims.cp)
        except ValueError as e:
            notes.append(f"the saved sequence does not split at cp {dims.cp} ({e})")
    return True, "; ".join(notes)


def _check_experts(cfg, model: str, dims: ParallelDims, ep: int) -> None:
    """train.py's expert rules at this layout (hybrid/moe/args.py, hybrid/moe/parallel.ExpertLayout): EP only
    for a model with experts, folded over a stage's tp x cp x dp ranks and dividing the experts.
    A checkpoint stores every expert whole, so any EP that passes loads. The sentences are train.py's for the
    same --model and layout (tests/test_inputs15_newuser_hints.py compares them)."""
    if not cfg.num_experts:
        if ep > 1:
            raise ValueError(f"--expert-model-parallel-size: --model {model} has no experts (a dense model); drop "
                             f"the flag")
        return
    from hybrid.moe.parallel import ExpertLayout
    ExpertLayout(dims, ep).check_experts(cfg.num_experts)


def _at(state: dict, target: Target) -> str:
    ok, why = loadable_at(state, target)
    where = target.describe()
    return f"{where}: loadable ({why})" if ok else f"{where}: NOT loadable: {why}"


def _one(path: str, latest: int | None, target: Target | None = None) -> tuple[str, bool | None]:
    """(the checkpoint's line, whether it is sound: complete, every checksum matching and loadable at `target`;
    None for an unfinished save)."""
    name = os.path.basename(os.path.normpath(path))
    if not os.path.isdir(path):
        return f"{name}: not a checkpoint directory (a {'dangling link' if os.path.islink(path) else 'file'})", False
    v = store.verify_all(path)
    mark = " (latest)" if latest is not None and store.iter_name(latest) == name else ""
    size = f"{v.bytes / 2**20:.2f} MiB"
    if not v.complete:
        return (f"{name}: incomplete (no manifest.json: a save that did not finish; removed by the next save) | "
                f"{size}"), None
    try:
        s = store.read_state(path)
    except store.CorruptCheckpoint:  # named by the verdict; nothing else of it is trusted
        return f"{name}{mark}: CORRUPT: {v.error} | {size}", False
    loads = target is None or v.error is not None or loadable_at(s, target)[0]
    at = "" if target is None or v.error else "\n    " + _at(s, target)
    lay = s.get("layout", {})
    verdict = "ok: every checksum matches" if v.error is None else f"CORRUPT: {v.error}"
    return (f"{name}{mark}: iteration {s.get('iteration')} | consumed samples {s.get('consumed_samples')} | "
            f"model {s.get('model')} ({_identity(s)}) | saved at tp {lay.get('tp')}{_cp(lay)} x pp {lay.get('pp')} x "
            f"dp {lay.get('dp')}, ZeRO {lay.get('zero')} | adam step {s.get('adam_step')} | {size} | {verdict}{at}",
            v.error is None and loads)


def _identity(state: dict) -> str:
    """The model's identity hash (hybrid/checkpoint/identity.py), or why there is none."""
    ident = state.get("model_identity")
    sha = ident.get("sha256") if isinstance(ident, dict) else None
    return f"config {sha}" if isinstance(sha, str) else "config not recorded: saved before identities"


def _cp(layout: dict) -> str:
    """' x cp 2' for a checkpoint saved with context parallelism (it changes no parameter: loads at any cp)."""
    return f" x cp {layout['cp']}" if isinstance(layout.get("cp"), int) and layout["cp"] > 1 else ""


def _target(args: argparse.Namespace) -> Target | None:
    given = [f for f, v in (("--tensor-model-parallel-size", args.tensor_model_parallel_size),
                            ("--pipeline-model-parallel-size", args.pipeline_model_parallel_size),
                            ("--context-parallel-size", args.context_parallel_size),
                            ("--expert-model-parallel-size", args.expert_model_parallel_size)) if v is not None]
    if args.world_size is None:
        if given:
            raise ValueError(f"{given[0]} needs --world-size N (the ranks the run would be launched on)")
        return None
    return Target(args.tensor_model_parallel_size or 1, args.pipeline_model_parallel_size or 1, args.world_size,
                  args.context_parallel_size or 1, args.expert_model_parallel_size or 1)


def _check_foreign(path: str) -> None:
    """DIR, or the folder of the iter_* DIR named, holding another tool's checkpoint (store.foreign_checkpoint):
    ValueError naming it. Read as ours, a Megatron-LM iter_* was called "incomplete ... removed by the next save"
    and a DeepSpeed folder printed only "latest -> none"; a transformers folder is named too (--load reads it)."""
    parent = os.path.dirname(os.path.normpath(path))
    for root in (path, parent) if os.path.basename(os.path.normpath(path)).startswith("iter_") else (path,):
        if what := store.foreign_checkpoint(root):
            raise ValueError(f"{root!r} is {what}, not a hybrid --save directory; {store.foreign_advice(root, what)}")
    if os.path.isfile(os.path.join(path, "config.json")) and not store.is_checkpoint_dir(path) and \
            not _one_iteration(path):  # (a conversion writes config.json into its iteration too: round 19)
        raise ValueError(f"{path!r} is a transformers model folder (config.json), not a hybrid --save directory: "
                         f"train.py reads it as it is (--model {path} --load {path}), nothing to inspect")


def _no_latest(path: str) -> str:
    """The first line when `latest` names no complete checkpoint ("latest -> none" said neither why nor what --load
    does): the save order (store.py) writes `latest` last, so a save killed after its rename leaves complete
    iterations and no `latest` -- --load takes the newest complete one (store.candidates) --, and one killed before
    leaves only iter_*.tmp / manifest-less folders, which --load refuses and the next save removes."""
    done = store.complete_iterations(path)
    marker = os.path.join(path, store.LATEST)
    why = "no `latest` file: the save that writes it did not finish"
    if os.path.isfile(marker):
        try:
            with open(marker, "rb") as f:  # bounded, as read_latest reads it
                why = f"`latest` names {f.read(64).decode('ascii', 'replace').strip()!r}, not a complete checkpoint here"
        except OSError as e:
            why = f"`latest` is unreadable ({e.strerror})"
    if done:
        return (f"{path}: latest -> none ({why}); --load {path} resumes from {store.iter_name(done[-1])}, the newest "
                f"complete checkpoint (--ckpt-step N for another)")
    return (f"{path}: latest -> none ({why}) and no complete checkpoint: every save here was interrupted before its "
            f"manifest.json; --load {path} is refused -- start without --load (the next save removes them)")


def _one_iteration(path: str) -> bool:
    """DIR is one checkpoint (iter_*/ of a store, or a folder holding a manifest), not a store of them."""
    return os.path.isfile(os.path.join(path, store.MANIFEST)) or \
        os.path.basename(os.path.normpath(path)).startswith("iter_")


def _not_a_directory(path: str) -> str:
    """Why DIR cannot be inspected: round 19 said "is not a directory" for a path that does not exist, and for an
    iteration the store does not hold, without the iterations it does."""
    if os.path.lexists(path):
        return f"{path!r} is not a directory; give a --save directory or one of its iter_* directories"
    parent = os.path.dirname(os.path.normpath(path)) or "."
    if store.iteration_of(path) is not None and os.path.isdir(parent) and store.is_checkpoint_dir(parent):
        have = store.complete_iterations(parent)
        held = f"its complete ones: {', '.join(map(str, have[-5:]))}" if have else "it holds no complete one"
        return f"{path!r} does not exist: {parent} has no iteration {store.iteration_of(path)} ({held}); give " \
               f"{parent} (the one `latest` names) or one of its iter_* directories"
    return f"{path!r} does not exist; give a --save directory or one of its iter_* directories"


def run(args: argparse.Namespace) -> int:
    path = args.dir
    target = _target(args)
    if not os.path.isdir(path):
        raise ValueError(_not_a_directory(path))
    _check_foreign(path)
    if _one_iteration(path):
        line, sound = _one(path, None, target)
        print(line)
        return 0 if sound else 1
    if not store.is_checkpoint_dir(path):
        raise ValueError(f"{path!r} holds no checkpoint (no iter_* directories, no `latest`)")
    latest = store.read_latest(path)
    print(f"{path}: latest -> {store.iter_name(latest)}" if latest is not None else _no_latest(path))
    verdicts = []
    for name in sorted(n for n in os.listdir(path) if n.startswith("iter_")):
        line, sound = _one(os.path.join(path, name), latest, target)
        print("  " + line)
        verdicts.append(sound)
    return 0 if True in verdicts and False not in verdicts else 1


# sub-commands other tools have (Megatron's tools/checkpoint, DeepSpeed's zero_to_fp32, torch DCP's format_utils),
# which a user guesses first: what does that here (round 16: "invalid choice ... (choose from 'inspect')" alone)
_RESHARD = ("a checkpoint is resharded as it loads: resume with train.py --load DIR at the new layout (any tp, pp, "
            "dp; `hybrid checkpoint inspect DIR --tensor-model-parallel-size N --world-size W` says whether it loads "
            "there), or pre-shard a model with `hybrid convert SRC DST --target-tensor-parallel-size N`")
_CONVERT = ("conversion is its own command: `hybrid convert SRC DST` (transformers <-> hybrid, DeepSpeed -> hybrid; "
            "a hybrid SRC gives a transformers folder, one file set, whatever the layout it was saved at)")
_VERIFY = "`hybrid checkpoint inspect DIR` checks every file's checksum and says whether each checkpoint is complete"
CHECKPOINT_ACTION_HINTS = {f"action={word}": hint for words, hint in (
    (("reshard", "reshape", "repartition", "resize"), _RESHARD),
    (("convert", "export", "merge", "consolidate", "to-hf", "zero-to-fp32"), _CONVERT),
    (("verify", "check", "validate", "list", "ls", "info", "show"), _VERIFY),
    (("delete", "rm", "remove", "prune", "clean"), "checkpoints are pruned by the run itself: train.py "
                                                   "--save-keep N keeps the N newest complete ones"),
) for word in words}


# round 23: "did you mean --expert-model-parallel-size?" named another thing
ETP_HINT = {"--expert-tensor-parallel-size": "--expert-tensor-parallel-size: inspect does not take it: a checkpoint "
                                             "stores every expert whole, so it loads at any expert-TP train.py "
                                             "accepts (train.py checks it against the experts' width)"}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("checkpoint", help="inspect checkpoints", description=__doc__,
                              formatter_class=HelpFormatter, hints=CHECKPOINT_ACTION_HINTS)
    sub = p.add_subparsers(dest="action", required=True)
    q = sub.add_parser("inspect", help="iteration, layout, size and checksum verdict of checkpoints",
                       formatter_class=HelpFormatter, hints={**parallel_hints("--world-size"), **ETP_HINT})
    q.add_argument("dir", metavar="DIR", help="a --save directory or one iter_* directory")
    q.add_argument("--tensor-model-parallel-size", type=positive_int, metavar="N", default=None,
                   help="with --world-size: can it be loaded at this tp (default 1)?")
    q.add_argument("--pipeline-model-parallel-size", type=positive_int, metavar="N", default=None,
                   help="with --world-size: can it be loaded at this pp (default 1)?")
    q.add_argument("--context-parallel-size", type=positive_int, metavar="N", default=None,
                   help="with --world-size: can it be loaded at this cp (default 1)?")
    q.add_argument("--expert-model-parallel-size", type=positive_int, metavar="N", default=None,
                   help="with --world-size: can its experts be split over this ep (default 1)?")
    q.add_argument("--world-size", type=positive_int, metavar="N", default=None,
                   help="the ranks the resumed run would have (dp = world / (tp x cp x pp))")
    q.set_defaults(func=run)
