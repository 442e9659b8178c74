"""Checkpoint flags of the training entry point (Megatron-LM's names); hybrid/train/args.py calls
`add_arguments` and, before any process group, `check`."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from hybrid.checkpoint import store
from hybrid.cliutil import check_output_dir, package_root


@dataclass(frozen=True)
class CheckpointConfig:
    """What to save and what to resume from.

    Attributes:
        save: directory to write checkpoints into (`--save`); None: no checkpoints.
        save_interval: save every this many iterations (`--save-interval`); None: only at the end.
        save_keep: keep this many newest complete checkpoints, deleting older ones (`--save-keep`);
            None: keep all. The newest complete one is never deleted.
        load: hybrid checkpoint directory to resume from (`--load` naming one); None: start fresh.
        ckpt_step: resume from this iteration's checkpoint instead of the latest (`--ckpt-step`).
        load_optim: restore Adam moments, step and the fp16 loss scaler (off: `--no-load-optim`).
        load_rng: restore each rank's RNG streams when the layout is the saved one (off: `--no-load-rng`).
        async_save: write in a background thread on its own gloo group (`--async-save`).
        exit_signal_handler: on SIGTERM finish the step, save, exit 0 (`--exit-signal-handler`).
        exit_interval: stop after an iteration divisible by this, saving first when --save is given
            (`--exit-interval`, Megatron's name); None: run to --train-iters.
        fresh_start_note: why a `--load DIR` equal to `--save` starts from scratch (logged at the start).
        identity: the model's identity (hybrid/checkpoint/identity.py: config fields and their hash), recorded in
            every state.json and compared with a loaded checkpoint's; None when the run neither saves nor loads.
        overwrite: with `--overwrite-save`, the iterations of another run's complete checkpoints found in --save;
            they are removed once this run's first checkpoint is complete (until then they stay loadable).
    """

    save: str | None = None
    save_interval: int | None = None
    save_keep: int | None = None
    load: str | None = None
    ckpt_step: int | None = None
    load_optim: bool = True
    load_rng: bool = True
    async_save: bool = False
    exit_signal_handler: bool = False
    exit_interval: int | None = None
    fresh_start_note: str | None = None  # why a --load DIR equal to --save starts from scratch (logged)
    identity: dict | None = None  # the --model's identity (identity.py): saved in state.json, compared on load
    overwrite: tuple[int, ...] = ()  # --overwrite-save: another run's iterations in --save, removed after the
    # first checkpoint of this run is complete


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("checkpointing")
    g.add_argument("--save", default=None, metavar="PATH",
                   help="directory for checkpoints (sharded, atomic; docs/checkpoint.md); also saved at the end")
    g.add_argument("--save-interval", type=int, default=None, metavar="N", help="save every N iterations")
    g.add_argument("--save-keep", type=int, default=None, metavar="N",
                   help="keep the N newest complete checkpoints (never deletes the newest); None: all")
    g.add_argument("--ckpt-step", type=int, default=None, metavar="N",
                   help="with --load DIR: resume from iteration N's checkpoint, not the latest")
    g.add_argument("--no-load-optim", action="store_true", help="--load: do not restore the optimizer state")
    g.add_argument("--no-load-rng", action="store_true", help="--load: do not restore the RNG state")
    g.add_argument("--async-save", action="store_true",
                   help="write checkpoints in the background (training blocks only to copy the shards)")
    g.add_argument("--exit-interval", type=int, default=None, metavar="N",
                   help="stop after an iteration divisible by N (saved first with --save); resume with --load")
    g.add_argument("--exit-signal-handler", action="store_true",
                   help="on SIGTERM: finish the current step, save a checkpoint, exit 0")
    g.add_argument("--overwrite-save", action="store_true",
                   help="--save DIR may hold another run's checkpoints (not the one --load resumes): replace them "
                        "(removed once this run's first checkpoint is complete); without it such a DIR is refused")


def resume_dir(path: str | None) -> str | None:
    """`--load PATH` names a hybrid checkpoint directory (resume) rather than a transformers model folder
    (initial weights, models/hf_io.py)."""
    return path if path and store.is_checkpoint_dir(path) else None


def iteration_dir(path: str) -> tuple[str, int] | None:
    """(the checkpoint directory, the iteration) when `path` is one iteration of a hybrid checkpoint
    (`DIR/iter_0000010` beside DIR's `latest`), else None."""
    real = os.path.realpath(path)
    name, root = os.path.basename(real), os.path.dirname(real)
    if not (name.startswith("iter_") and name[5:].isdigit() and len(name) >= 12):
        return None
    return (root, int(name[5:])) if store.is_checkpoint_dir(root) else None


def _check_not_in_iteration(args: argparse.Namespace) -> None:
    """--load naming one iteration of a checkpoint would be read as a transformers folder (and fail on its missing
    safetensors); --save inside one would write a checkpoint into another checkpoint's files."""
    if args.load is not None and os.path.isdir(args.load) and (found := iteration_dir(args.load)):
        root, n = found
        raise ValueError(f"--load {args.load!r} is iteration {n} of the checkpoint directory {root}; give --load "
                         f"{root} (with --ckpt-step {n} for this iteration)")
    if args.save is not None and (found := enclosing_iteration(args.save)):
        raise ValueError(f"--save {args.save!r} is inside iteration {found[1]} of the checkpoint directory "
                         f"{found[0]}; give a directory of its own (or --save {found[0]} --load {found[0]} to "
                         f"continue that run)")


def enclosing_iteration(path: str) -> tuple[str, int] | None:
    """(checkpoint directory, iteration) of the iteration folder `path` is or lies inside (real paths; `path` need
    not exist), else None."""
    probe = os.path.realpath(path)
    while probe != os.path.dirname(probe):
        if found := iteration_dir(probe):
            return found
        probe = os.path.dirname(probe)
    return None


def _inside(path: str, folder: str) -> bool:
    """`path` is `folder` or below it (real paths: a link or `..` does not hide it; neither need exist yet)."""
    p, f = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([p, f]) == f


def _beside(folder: str, name: str) -> str:
    """A path named `name` next to `folder` (what to give instead of one inside it), as the user would type it."""
    return os.path.relpath(os.path.join(os.path.dirname(os.path.realpath(folder)), name))


def check_other_outputs(save: str | None, outputs: dict[str, str | None],
                        folders: frozenset[str] = frozenset()) -> None:
    """The run's other outputs (`outputs`: flag -> path; `folders`: the flags whose path is a directory) stay out
    of the checkpoints. Inside one iteration of any checkpoint, what the run writes is lost with that folder: a save
    of the same iteration replaces it whole and --save-keep deletes it (a --timeline there ended the run in a
    traceback at its very end, the timeline unwritten). Inside the --save directory (the same folder, or below it),
    the checkpoint directory is no longer the run's checkpoints alone, the unit a resume copies and `hybrid
    checkpoint inspect` describes; and --save inside --tensorboard-dir puts the checkpoint shards under the folder
    TensorBoard reads recursively. ValueError naming both and a path beside the checkpoints."""
    for flag, path in outputs.items():
        if path is None:
            continue
        name = os.path.basename(os.path.normpath(path))
        if found := enclosing_iteration(path if flag in folders else os.path.dirname(os.path.abspath(path))):
            raise ValueError(f"{flag} {path!r} is inside iteration {found[1]} of the checkpoint directory "
                             f"{found[0]}: a later save of that iteration replaces the folder and --save-keep "
                             f"deletes it, with what the run wrote there; give a path outside the checkpoints, "
                             f"e.g. {flag} {_beside(found[0], name)}")
        if save is not None and _inside(path, save):
            what = "the same folder as" if os.path.realpath(path) == os.path.realpath(save) else "inside"
            mine = _beside(save, "tensorboard" if flag in folders and _inside(save, path) else name)
            raise ValueError(f"{flag} {path!r} is {what} --save {save!r}: the checkpoint directory holds the run's "
                             f"checkpoints alone (iter_*/, latest), the folder a resume copies and `hybrid checkpoint "
                             f"inspect` reads; give {flag} a path beside it, e.g. {flag} {mine}")
        if save is not None and flag in folders and _inside(save, path):
            raise ValueError(f"--save {save!r} is inside {flag} {path!r}: TensorBoard reads every folder under it, "
                             f"the checkpoint shards included; give them separate folders, e.g. {flag} "
                             f"{os.path.join(path, 'tensorboard')} --save {save}")


def _source_files(path: str) -> list[str]:
    """What makes an existing folder a source folder: a git repository's `.git`, and its first Python files."""
    if not os.path.isdir(path) or store.is_checkpoint_dir(path):  # our checkpoints there already: a run's folder
        return []
    names = sorted(os.listdir(path))
    return [n for n in names if n == ".git"] + [n for n in names if n.endswith(".py")][:2]


def _check_source_tree(args: argparse.Namespace) -> None:
    """--save inside a Python package (the repository's hybrid/, models/) or into a folder of source files (tests/,
    scripts/, a repository's root) would write iter_*/ and `latest` among them, where `git add -A` commits gigabytes
    and a package ships them. A package is refused outright; a folder of source files without --overwrite-save
    (the flag's consent to write where other files are). ValueError naming --save and a directory of its own."""
    if args.save is None:
        return
    if package := package_root(args.save):
        mine = os.path.relpath(os.path.join(os.path.dirname(package), "checkpoints"))
        raise ValueError(f"--save {args.save!r} is inside the Python package {package} (its folders hold "
                         f"__init__.py): checkpoints would be written among its source files; give a directory "
                         f"outside it, e.g. --save {mine}")
    found = _source_files(args.save)
    if found and not args.overwrite_save:  # a repository's root: a folder in it; a source folder: one beside it
        mine = os.path.join(args.save, "checkpoints") if ".git" in found else \
            os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(args.save)), "checkpoints"))
        raise ValueError(f"--save {args.save!r} holds source files ({', '.join(found)}): checkpoints (iter_*/, "
                         f"latest) would be written among them; give a directory of its own, e.g. --save {mine}, "
                         f"or pass --overwrite-save to write there anyway")


def _is_model_folder(path: str) -> bool:
    """A transformers model folder (config.json beside its weights) that holds none of our checkpoints."""
    names = set(os.listdir(path)) if os.path.isdir(path) else set()
    return "config.json" in names and bool(names & {"model.safetensors", "model.safetensors.index.json",
                                                    "pytorch_model.bin"}) and not store.is_checkpoint_dir(path)


def _check_model_folder(args: argparse.Namespace) -> None:
    """--save naming a transformers model folder. The same folder as --load (`--load hf --save hf`, "fine-tune in
    place") read as Megatron's resume convention found no checkpoint there and started from scratch, dropping the
    weights --load named; refused outright. Another model folder: our iter_*/ and `latest` among its files make a
    later --load of it resume them instead of reading the model; refused without --overwrite-save."""
    if args.save is None or not _is_model_folder(args.save):
        return
    if _same_dir(args.load, args.save):
        raise ValueError(f"--save {args.save!r} is the transformers model folder --load reads the initial weights "
                         f"from, and --save DIR --load DIR means resume: with no checkpoint in it the run would start "
                         f"from scratch, the weights unread; give --save a directory of its own, e.g. --save "
                         f"{args.save.rstrip(os.sep)}_ckpt")
    if not args.overwrite_save:
        raise ValueError(f"--save {args.save!r} is a transformers model folder (config.json and its weights): "
                         f"checkpoints would be written among its files, and a later --load of it would resume them "
                         f"rather than read the model; give a directory of its own, or pass --overwrite-save to "
                         f"write there anyway")


def _same_dir(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and os.path.realpath(a) == os.path.realpath(b)


def _auto_resume(args: argparse.Namespace) -> None:
    """Restartable jobs (torchrun --max-restarts) keep their flags across attempts, so:
    * `--save DIR --load DIR` (Megatron's convention) with no complete checkpoint in DIR yet -- the first
      attempt, or a crash before the first save completed -- starts fresh instead of failing;
    * a restarted attempt (TORCHELASTIC_RESTART_COUNT > 0) given only `--save DIR` resumes from DIR's latest
      complete checkpoint by itself."""
    has_ckpt = args.save is not None and os.path.isdir(args.save) and bool(store.complete_iterations(args.save))
    if _same_dir(args.load, args.save) and not has_ckpt:
        args.load = None
        args.fresh_start_note = f"checkpoint: no complete checkpoint in {args.save} yet; starting from scratch"
    elif args.load is None and has_ckpt and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        args.load = args.save
        args.fresh_start_note = None


def _check_foreign(args: argparse.Namespace) -> None:
    """--load or --save naming another tool's checkpoint folder (store.foreign_checkpoint): --load would read its
    iter_* / `latest` as unfinished hybrid saves ("holds no complete checkpoint"), and a save would write our
    `latest` over DeepSpeed's and replace a Megatron iter_* directory of the same iteration. ValueError naming it."""
    if args.load is not None and (what := store.foreign_checkpoint(args.load)):
        raise ValueError(f"--load {args.load!r} is {what}, which train.py does not read; "
                         f"{store.foreign_advice(args.load, what)}")
    if args.save is not None and (what := store.foreign_checkpoint(args.save)) and not args.overwrite_save:
        mine = "its `latest`" if "DeepSpeed" in what else "its iter_* directory of each iteration saved"
        raise ValueError(f"--save {args.save!r} holds {what}; saves there would replace {mine}: save to another "
                         f"directory, or pass --overwrite-save")


def _not_ours(save: str) -> list[str]:
    """Entries of the --save folder that a save replaces but no hybrid save wrote: an iter_NNNNNNN entry without
    manifest.json (hybrid renames an iteration into place only once its manifest is written, so every one of its
    own has it), and a `latest` that is not a regular file holding an iter_NNNNNNN name."""
    if not os.path.isdir(save):
        return []
    done = {store.iter_name(i) for i in store.complete_iterations(save)}
    found = [n for n in sorted(os.listdir(save)) if store.iteration_of(n) is not None and n not in done]
    latest = os.path.join(save, store.LATEST)
    if os.path.lexists(latest) and not (os.path.isfile(latest) and store.read_latest_name(save)):
        found.append(store.LATEST)
    return found


def _check_not_ours(args: argparse.Namespace) -> None:
    """--save DIR holding an iter_NNNNNNN entry or a `latest` that no hybrid save wrote (a folder of the user's, a
    Megatron-LM iteration whose tracker file is gone, notes named `latest`): the save of that iteration deleted the
    folder (shutil.rmtree) and every save replaced `latest`, without a word (round 22). Refused unless
    --overwrite-save consents; a `latest` that is a directory is refused either way (a save cannot replace it with
    its file). ValueError naming --save and the entries."""
    if args.save is None:
        return
    found = _not_ours(args.save)
    latest = os.path.join(args.save, store.LATEST)
    if os.path.isdir(latest):
        raise ValueError(f"--save {args.save!r}: its `latest` is a directory, where every save writes the file "
                         f"naming its newest checkpoint; move it, or give --save a directory of its own")
    if found and not args.overwrite_save:
        raise ValueError(f"--save {args.save!r} holds {', '.join(map(repr, found[:3]))}{' ...' if len(found) > 3 else ''}, "
                         f"which no hybrid save wrote (an iter_* without manifest.json, a `latest` not naming one): "
                         f"a save replaces them, deleting what they hold; give a directory of its own, or pass "
                         f"--overwrite-save to replace them")


def _check_save_dir(args: argparse.Namespace) -> tuple[int, ...]:
    """--save DIR holding another run's complete checkpoints -- any the run does not resume from (--load DIR, the
    same folder) -- is refused unless --overwrite-save consents; returns the iterations to replace."""
    if args.save is None or not os.path.isdir(args.save):
        return ()
    theirs = tuple(store.complete_iterations(args.save))
    if _same_dir(args.load, args.save) and args.ckpt_step is not None:
        return _check_rollback(args, tuple(i for i in theirs if i > args.ckpt_step))
    if not theirs or _same_dir(args.load, args.save):
        return ()
    if not args.overwrite_save:
        latest = store.read_latest(args.save)
        raise ValueError(f"--save {args.save!r} holds another run's checkpoints ({len(theirs)}, latest iteration "
                         f"{latest if latest is not None else theirs[-1]}); resume it with --load {args.save}, save "
                         f"elsewhere, or pass --overwrite-save to replace them")
    return theirs


def _check_rollback(args: argparse.Namespace, later: tuple[int, ...]) -> tuple[int, ...]:
    """--ckpt-step N into the --save it resumes from, which holds later checkpoints: the run would replace them one
    by one as it reaches their iterations (a mix of two timelines meanwhile). With --overwrite-save they are the
    abandoned ones, removed once this run's first checkpoint is complete; without it, refused."""
    if later and not args.overwrite_save:
        raise ValueError(f"--ckpt-step {args.ckpt_step} resumes into --save {args.save!r}, which holds later "
                         f"checkpoints ({', '.join(map(str, later))}) the run would replace as it reaches them; pass "
                         f"--overwrite-save to roll back (they are removed once this run's first checkpoint is "
                         f"complete), or save elsewhere")
    return later


def _resume_candidate(load: str, step: int | None) -> tuple[str, dict, object]:
    """(directory, state.json, DCP metadata) of the checkpoint the resume will load: --ckpt-step's, else the first
    of store.candidates whose small files are well-formed (safe_read.check_checkpoint) and whose every file is
    there at its manifest's size (a stat each: a truncated copy is named here, before any process group); the
    checksums are verified after start-up, on every rank. ValueError naming the file when none is."""
    from hybrid.checkpoint import safe_read
    tries = [step] if step is not None else store.candidates(load)
    errors = []
    for iteration in tries:
        directory = store.final_path(load, iteration)
        try:
            meta = safe_read.check_checkpoint(directory)
            for name, want in sorted(store.read_manifest(directory)["files"].items()):
                store.verify_file(directory, name, want, checksum=False)
            return directory, store.read_state(directory), meta
        except store.CorruptCheckpoint as e:
            errors.append(str(e))
    if step is not None:
        raise ValueError(f"--ckpt-step {step}: {errors[0]}")
    raise ValueError(f"--load {load!r}: no intact checkpoint (the newest: {errors[0]}); see `hybrid checkpoint "
                     f"inspect {load}`")


def resume_keys(checkpoint: CheckpointConfig) -> tuple[str, frozenset[str]] | None:
    """(directory, the tensor keys of its DCP metadata) of the checkpoint the run resumes; None without one. For
    the checks of state a feature keeps under its own keys (hybrid/moe/args.check_resume: the expert bias)."""
    if checkpoint.load is None:
        return None
    directory, _, meta = _resume_candidate(checkpoint.load, checkpoint.ckpt_step)
    return directory, frozenset(meta.state_dict_metadata)


def _check_model(load: str, step: int | None, model: str, cfg) -> None:
    """The checkpoint to resume holds --model's model: the same identity (config fields, not the path) and every
    parameter's shape in DCP's metadata. ValueError (one line, the first differing field) otherwise."""
    from hybrid.checkpoint.identity import mismatch, model_identity, shape_mismatch
    directory, state, meta = _resume_candidate(load, step)
    why = mismatch(state, directory, model_identity(cfg), model, type(cfg)) or shape_mismatch(meta, cfg, directory)
    if why:
        raise ValueError(why)


def check(args: argparse.Namespace) -> CheckpointConfig:
    """ValueError naming the flag and the fix. A --load naming a hybrid checkpoint directory moves to the
    config (`args.load` is then None: it keeps meaning transformers initial weights)."""
    if args.save_interval is not None and args.save_interval < 1:
        raise ValueError(f"--save-interval must be a positive number of iterations, got {args.save_interval}")
    if args.save_keep is not None and args.save_keep < 1:
        raise ValueError(f"--save-keep must be at least 1, got {args.save_keep}")
    if args.save is None:
        for flag, on in (("--save-interval", args.save_interval is not None), ("--save-keep", args.save_keep),
                         ("--async-save", args.async_save), ("--exit-signal-handler", args.exit_signal_handler),
                         ("--overwrite-save", getattr(args, "overwrite_save", False))):
            if on:
                raise ValueError(f"{flag} needs --save DIR")
    else:
        check_output_dir("--save", args.save)
    if args.exit_interval is not None and args.exit_interval < 1:
        raise ValueError(f"--exit-interval must be a positive number of iterations, got {args.exit_interval}")
    n = getattr(args, "train_iters", None)
    if args.exit_interval is not None and isinstance(n, int) and args.exit_interval > n:  # never reached: a no-op
        raise ValueError(f"--exit-interval {args.exit_interval} stops after an iteration divisible by it, and "
                         f"--train-iters {n} ends the run first, so it would never stop it; give --exit-interval N "
                         f"<= {n}, or drop it")
    args.overwrite_save = getattr(args, "overwrite_save", False)  # a Namespace built by hand may lack it
    _check_not_in_iteration(args)
    _check_foreign(args)
    _check_source_tree(args)
    _check_model_folder(args)
    _auto_resume(args)
    load = resume_dir(args.load)
    if args.load is not None and load is None and os.path.isdir(args.load) and not os.listdir(args.load):
        raise ValueError(f"--load {args.load!r} is an empty directory: no checkpoint (iter_*/) and no transformers "
                         f"model; give the --save directory of an earlier run")
    _check_not_ours(args)
    overwrite = _check_save_dir(args)
    cfg = None
    if args.save is not None or load is not None:
        from models import load_config
        cfg = load_config(args.model)
    if load is not None:
        done = store.complete_iterations(load)
        if not done:
            raise ValueError(f"--load {load!r} holds no complete checkpoint (only unfinished saves)")
        if args.ckpt_step is not None and args.ckpt_step not in done:
            raise ValueError(f"--ckpt-step {args.ckpt_step}: {load!r} has no complete checkpoint of that iteration "
                             f"(it has {', '.join(map(str, done[-5:]))})")
        _check_model(load, args.ckpt_step, args.model, cfg)
        args.load = None
    elif args.ckpt_step is not None or args.no_load_optim or args.no_load_rng:
        raise ValueError("--ckpt-step / --no-load-optim / --no-load-rng need --load DIR naming a checkpoint "
                         "directory (an earlier --save)")
    from hybrid.checkpoint.identity import model_identity
    return CheckpointConfig(save=args.save, save_interval=args.save_interval, save_keep=args.save_keep, load=load,
                            ckpt_step=args.ckpt_step, load_optim=not args.no_load_optim,
                            load_rng=not args.no_load_rng, async_save=args.async_save,
                            exit_signal_handler=args.exit_signal_handler, exit_interval=args.exit_interval,
                            fresh_start_note=getattr(args, "fresh_start_note", None),
                            identity=model_identity(cfg) if cfg is not None else None, overwrite=overwrite)
