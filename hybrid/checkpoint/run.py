"""Checkpoints inside a training run: resume, periodic and final saves, retention, SIGTERM.

    ckpt = RunCheckpoints(args.ckpt, mesh, model, optimizer, rng, run_info)
    start, consumed = ckpt.resume()
    for it in range(start, train_iters):
        ...step...
        if ckpt.after_step(it + 1, consumed):   # True: SIGTERM was handled (saved); stop
            break
    ckpt.finish(iteration, consumed)             # the final save; waits for an asynchronous one
"""

from __future__ import annotations

import dataclasses
import os
import signal
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from hybrid.checkpoint import identity, store
from hybrid.checkpoint.args import CheckpointConfig
from hybrid.cliutil import fail
from hybrid.comm import Group
from hybrid.stateful import Stateful

if TYPE_CHECKING:
    from hybrid.checkpoint import core


def _core():
    """hybrid.checkpoint.core, imported by the first save or load: torch.distributed.checkpoint (and DTensor
    with it) costs every rank ~0.7 s of CPU to import, which a run without --save / --load does not need."""
    from hybrid.checkpoint import core
    return core


def _log(msg: str) -> None:
    if dist.get_rank() == 0:
        print(msg, flush=True)


def _same_config(path: str, model: str | None) -> bool:
    """The checkpoint's own config.json (written by `hybrid convert`) describes the model this run builds from
    --model, whatever the spelling of the path or preset it was saved under."""
    from models import load_config
    own = os.path.join(path, "config.json")
    try:
        return model is not None and os.path.isfile(own) and load_config(own) == load_config(model)
    except (OSError, ValueError, KeyError):
        return False


class RunCheckpoints:
    """The checkpoint side of one run. `info` is JSON-able and saved in state.json (the layout, the model,
    the flags); `info["layout"]` decides whether the per-rank RNG state can be restored (same layout only).
    The state is the optimizer's (the model's master weights, Adam), the RNG's, and that of any further owners
    given as {key prefix: Stateful} (the fault counters: {"fault.": FaultTolerance}); the data position is the
    iteration and the samples consumed, recorded in state.json."""

    def __init__(self, cfg: CheckpointConfig, mesh, model, optimizer, rng, info: dict,
                 owners: dict[str, Stateful] | None = None):
        self.cfg, self.mesh, self.opt, self.rng, self.info = cfg, mesh, optimizer, rng, info
        self.owners = dict(owners or {})
        active = cfg.save is not None or cfg.load is not None
        self.names = _core().param_names(model) if active else {}
        if cfg.identity is not None:  # the model by its config (checkpoint/identity.py), compared on load
            self.info = dict(info, model_identity=cfg.identity)
        self.pending: core.PendingSave | None = None
        self.last_saved: int | None = None
        # gloo groups of every rank, counted on the mesh's ledger: the save's own (a background save's
        # collectives run on it, never interleaved with training's), and one for the main thread's checks
        # (verify, SIGTERM agreement) (none when the run neither saves nor loads)
        ranks, ledger = list(range(mesh.dims.world)), mesh.ledger
        self.pg = Group.create("ckpt", ranks, ledger, backend="gloo") if active else None
        self.ctl = Group.create("ckpt_ctl", ranks, ledger, backend="gloo") if active else None
        self._signalled = False
        if cfg.exit_signal_handler:
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        self._signalled = True  # acted on after the current step (after_step)

    # --- resume -----------------------------------------------------------------------------------------
    def resume(self) -> tuple[int, int]:
        """Load the newest complete, intact checkpoint of --load (or --ckpt-step's); (iteration, consumed
        samples) to continue from -- (0, 0) without --load. A corrupt one is skipped with a warning (an
        explicit --ckpt-step is an error instead). Errors are one line on every rank at once (SystemExit:
        the verdict is collective)."""
        if self.cfg.load is None:
            if self.cfg.fresh_start_note:
                _log(self.cfg.fresh_start_note)
            return 0, 0
        root = self.cfg.load
        tries = [self.cfg.ckpt_step] if self.cfg.ckpt_step is not None else store.candidates(root)
        for i, iteration in enumerate(tries):
            path = store.final_path(root, iteration)
            error = _core().verify(path, self.ctl)
            if error is None:
                return self._load(path)
            if self.cfg.ckpt_step is not None:
                raise fail(f"train.py: error: --ckpt-step {iteration}: {error}")
            later = (f"falling back to the previous complete checkpoint (iteration {tries[i + 1]})"
                     if i + 1 < len(tries) else "there is no previous complete checkpoint to fall back to")
            _log(f"checkpoint: warning: {error}; {later}")
        which = (f"its only checkpoint (iteration {tries[0]}) failed its checksums" if len(tries) == 1 else
                 f"every one of its {len(tries)} checkpoints failed its checksums")
        raise fail(f"train.py: error: --load {root}: no intact checkpoint ({which}); restore the damaged files "
                   f"(`hybrid checkpoint inspect {root}` names them) or drop --load to start from scratch")

    def _load(self, path: str) -> tuple[int, int]:
        saved = store.read_state(path)
        model_only = saved.get("contents") == "model"  # `hybrid convert` output: weights, no optimizer or RNG
        why = identity.mismatch(saved, path, self.cfg.identity, self.info.get("model")) if self.cfg.identity else None
        if why is None and self.cfg.identity is None and saved.get("model") != self.info.get("model") \
                and not _same_config(path, self.info.get("model")):
            why = f"--load {path} holds model {saved.get('model')!r}, this run trains {self.info.get('model')!r}"
        if why:
            raise fail(f"train.py: error: {why}")
        # RNG streams are per (tp, pp, dp) coordinate: restorable on the same mesh only
        same = all(saved["layout"].get(k) == self.info["layout"].get(k) for k in ("tp", "pp", "dp"))
        rng = self.cfg.load_rng and same and not model_only
        optim = self.cfg.load_optim and not model_only
        owners = {**_core().statefuls(self.opt, self.names, self.rng, optim=optim, rng_too=rng), **self.owners}
        try:
            state = _core().load_state(owners, path, self.pg)
        except store.CorruptCheckpoint as e:  # a data file that is not DCP's tensors (safe_read.py): one line
            raise fail(f"train.py: error: --load {path}: {e}") from None
        _log(resumed_line(path, saved["layout"], state, model_only, optim, rng, same))
        self.last_saved = state["iteration"]
        return state["iteration"], state["consumed_samples"]

    # --- save -------------------------------------------------------------------------------------------
    def save(self, iteration: int, consumed: int) -> None:
        """A checkpoint of the state after `iteration` steps (asynchronous: completed by the next save or by
        finish)."""
        self.wait()
        state = dict(self.info, iteration=iteration, consumed_samples=consumed)
        owners = {**_core().statefuls(self.opt, self.names, self.rng), **self.owners}
        pending = _core().save_state(owners, self.cfg.save, iteration, state, self.pg,
                                     asynchronous=self.cfg.async_save)
        self.last_saved = iteration
        if self.cfg.async_save:
            self.pending = pending
            _log(f"checkpoint: saving iteration {iteration} to {self.cfg.save} in the background")
        else:
            self._complete(pending)

    def wait(self) -> None:
        """Complete the asynchronous save in flight, if any."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            self._complete(pending)

    def _complete(self, pending: core.PendingSave) -> None:
        path = pending.finish()
        _log(f"checkpoint: saved iteration {pending.iteration} to {path}")
        if self.cfg.overwrite and dist.get_rank() == 0:  # --overwrite-save: another run's, now replaced
            gone = store.remove_iterations(self.cfg.save, [i for i in self.cfg.overwrite if i != pending.iteration])
            print(f"checkpoint: --overwrite-save: removed the earlier run's {len(gone)} checkpoint(s) from "
                  f"{self.cfg.save}", flush=True)
        self.cfg = dataclasses.replace(self.cfg, overwrite=())
        if self.cfg.save_keep and dist.get_rank() == 0:
            for gone in store.retain(self.cfg.save, self.cfg.save_keep):
                print(f"checkpoint: removed {store.final_path(self.cfg.save, gone)} (--save-keep "
                      f"{self.cfg.save_keep})", flush=True)

    def after_step(self, iteration: int, consumed: int) -> bool:
        """After step `iteration` (1-based count of completed steps): the periodic save, and SIGTERM. True
        when the run must stop (the checkpoint is then complete)."""
        if self.cfg.save and self.cfg.save_interval and iteration % self.cfg.save_interval == 0:
            self.save(iteration, consumed)
        if self.cfg.exit_interval and iteration % self.cfg.exit_interval == 0:
            if self.cfg.save and self.last_saved != iteration:
                self.save(iteration, consumed)
            self.wait()
            _log(f"checkpoint: --exit-interval {self.cfg.exit_interval}: stopping after iteration {iteration}")
            return True
        if self.cfg.exit_signal_handler and self._any_rank_signalled():
            if self.last_saved != iteration:
                self.save(iteration, consumed)
            self.wait()
            _log(f"checkpoint: SIGTERM: saved iteration {iteration}; exiting")
            return True
        return False

    def _any_rank_signalled(self) -> bool:
        """The signal may reach the ranks at different steps; all stop at the same one (an all-reduce)."""
        flag = torch.tensor([float(self._signalled)])
        return self.ctl.all_reduce(flag, op=dist.ReduceOp.MAX, tag="sigterm").item() > 0

    def finish(self, iteration: int, consumed: int) -> None:
        """The final save (when --save and not just saved), then wait for any background save."""
        if self.cfg.save and self.last_saved != iteration:
            self.save(iteration, consumed)
        self.wait()


def resumed_line(path: str, lay: dict, state: dict, model_only: bool, optim: bool, rng: bool, same: bool) -> str:
    """'checkpoint: resumed from DIR (saved at tp 2 x cp 2 x pp 1 x dp 1, ZeRO 0) | iteration N | ...': the layout
    as `hybrid checkpoint inspect` and the resume's layout line name it, CP included (round 21: this line left a
    CP 2 checkpoint's cp out, "tp 2 x pp 1 x dp 1", beside the layout line's "tp 2 x cp 2 x pp 1 x dp 1").
    A converted checkpoint (model_only) holds neither optimizer state nor RNG streams: "weights only" says both
    (round 22: it also said "RNG not restored (--no-load-rng)", a flag the user had not given)."""
    cp = f" x cp {lay['cp']}" if isinstance(lay.get("cp"), int) and lay["cp"] > 1 else ""
    return (f"checkpoint: resumed from {path} (saved at tp {lay['tp']}{cp} x pp {lay['pp']} x dp {lay['dp']}, "
            f"ZeRO {lay['zero']}) | iteration {state['iteration']} | consumed samples {state['consumed_samples']}"
            f"{' | weights only (a converted checkpoint)' if model_only else ''}"
            f"{'' if optim or model_only else ' | optimizer state not loaded'}"
            f"{'' if rng or model_only else ' | RNG not restored (' + ('--no-load-rng' if same else 'another layout') + ')'}")
