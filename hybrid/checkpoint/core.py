"""Save and load one checkpoint of the run's state with torch.distributed.checkpoint (DCP).

The checkpoint collects and stores; it does not know what the state is. Each owner of state is a `Stateful`
(hybrid/stateful.py) -- the ZeRO optimizer (the model's fp32 master weights and Adam's moments: hybrid/zero/
state.py), this rank's RNG streams (hybrid/tp/random.py: RNGState), the fault counters -- registered under a key
prefix. Their state dicts' `Shards` become DCP ShardedTensors (each global tensor's pieces, written by the rank that
owns them, read by every rank that holds them: any layout loads any other), their whole tensors plain DCP tensors,
their plain values go to state.json. What is saved (keys of the DCP state dict; `NAME` is a parameter's global
name):

    model/NAME                 fp32 master weights, the full unsharded tensor, as chunks
    optim.exp_avg/NAME         AdamW first moment, same chunks
    optim.exp_avg_sq/NAME      AdamW second moment, same chunks
    rng/<rank>/<stream>        per-rank RNG state (torch CPU/CUDA generators, the TP dropout streams):
                               keyed by rank because DCP keeps a key saved on every rank from one rank only

and, as JSON (state.json, written by rank 0): iteration, consumed samples, the Adam step, the fp16 loss scaler,
the layout and the run's flags.
"""

from __future__ import annotations

import os
from concurrent.futures import Future

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import AsyncStager

from hybrid.checkpoint import safe_read, store
from hybrid.checkpoint.faults import crash_point
from hybrid.checkpoint.shards import sharded_tensor
from hybrid.comm import CommLedger, Group
from hybrid.stateful import Shards, Stateful
from hybrid.tp.random import RNGState
from hybrid.zero.state import MOMENTS, adam_step, param_names, scaler_state  # noqa: F401  (the names tests read)


class ZeroStateful:
    """A ZeroOptimizer as the checkpoint's Stateful: its state dict with or without Adam's state."""

    def __init__(self, opt, names: dict[int, str] | None = None, optimizer: bool = True):
        self.opt, self.names, self.optimizer = opt, names, optimizer

    def state_dict(self) -> dict[str, object]:
        return self.opt.state_dict(optimizer=self.optimizer, names=self.names)

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.opt.load_state_dict(state)


def statefuls(opt, names: dict[int, str] | None, rng, optim: bool = True, rng_too: bool = True) -> dict[str, Stateful]:
    """The run's owners of state by key prefix: the optimizer's keys at the top level (model/..., optim...., and
    adam_step / scaler in state.json), this rank's generators under rng/<rank>/."""
    out: dict[str, Stateful] = {"": ZeroStateful(opt, names, optimizer=optim)}
    if rng_too:
        out[f"rng/{dist.get_rank()}/"] = RNGState(rng)
    return out


def collect(owners: dict[str, Stateful], saving: bool, stage: bool = False):
    """(DCP state dict, JSON values, each owner's own state dict) of every owner. Saving: only the pieces this rank
    writes, and (stage) CPU copies of them, so the values saved are those of now whatever training does next.
    Loading: every piece this rank holds, views the load fills in place."""
    tensors: dict[str, object] = {}
    plain: dict[str, object] = {}
    own: dict[str, dict] = {}
    for prefix, owner in owners.items():
        own[prefix] = sd = owner.state_dict()
        for k, v in sd.items():
            if isinstance(v, Shards):
                if saving and not v.write:
                    continue
                ts = [t.to("cpu", copy=True) for t in v.tensors] if stage else v.tensors
                tensors[prefix + k] = sharded_tensor(ts, v.boxes, v.global_shape)
            elif torch.is_tensor(v):
                tensors[prefix + k] = v.clone()
            else:
                plain[prefix + k] = v
    return tensors, plain, own


class _Prestaged(AsyncStager):
    """The state dict is already a private CPU copy (collect(stage=True)): nothing more to stage.
    (DCP's default stager would deep-copy ShardedTensors without their local shards.)"""

    _synchronize_after_execute = False

    def stage(self, state_dict):
        return state_dict

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        pass


# --- save -------------------------------------------------------------------------------------------
class _Writer(dcp.FileSystemWriter):
    """DCP's FileSystemWriter (every file fsynced) with the test-only crash point between this rank's data
    files and DCP's .metadata (faults.py; a no-op unless HYBRID_FAULT names it)."""

    def __init__(self, path: str, iteration: int):
        super().__init__(path, sync_files=True)
        self.iteration = iteration

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)  # synchronous: the files are written when it returns
        crash_point("after_rank_files", self.iteration)
        return future


def world_group(group: Group | None = None) -> Group:
    """`group`, or every rank of the job over the default process group (a caller that brings none: tests, tools),
    counted on a ledger of its own."""
    if group is not None:
        return group
    world = dist.get_world_size()
    if world == 1:
        return Group.solo("ckpt", CommLedger())
    return Group("ckpt", tuple(range(world)), dist.group.WORLD, CommLedger())


class PendingSave:
    """A save whose data is being (or has been) written; `finish()` makes it complete and `latest`."""

    def __init__(self, root: str, iteration: int, state: dict, group: Group, future: Future | None):
        self.root, self.iteration, self.state, self.group, self.future = root, iteration, state, group, future

    def finish(self) -> str:
        """Wait for the data, checksum this rank's files, and (rank 0) write the manifest, rename, advance
        `latest`. Collective over the save's group."""
        if self.future is not None:
            self.future.result()
        tmp = store.tmp_path(self.root, self.iteration)
        mine = {n: store.describe(os.path.join(tmp, n)) for n in store.rank_files(tmp, dist.get_rank())}
        crash_point("after_data", self.iteration)  # test-only: every rank's data durable, nothing finalized
        everyone = self.group.all_gather_object(mine)
        path = store.final_path(self.root, self.iteration)
        if self.group.rank == 0:
            store.finalize(self.root, self.iteration, {k: v for d in everyone for k, v in d.items()}, self.state)
        self.group.barrier()
        return path


def start_save(opt, names: dict[int, str], rng, root: str, iteration: int, state: dict, pg: Group | None = None,
               asynchronous: bool = False) -> PendingSave:
    """Save the optimizer's state and this rank's RNG (`save_state`)."""
    return save_state(statefuls(opt, names, rng), root, iteration, state, pg, asynchronous)


def save_state(owners: dict[str, Stateful], root: str, iteration: int, state: dict, group: Group | None = None,
               asynchronous: bool = False) -> PendingSave:
    """Write this rank's pieces of every owner's state into root/iter_N.tmp/ (plain values into state.json with
    `state`). Synchronous: returns once the data is durable; asynchronous: once it is staged (copied), the write
    runs in a thread on `group`. Either way `finish()` completes the checkpoint. Collective over `group` (every
    rank of the job; None: the default process group)."""
    group = world_group(group)
    tmp = store.tmp_path(root, iteration)
    if group.rank == 0:
        for name in store.clean_partial(root):
            print(f"checkpoint: removed the unfinished {name} of an earlier save", flush=True)
        os.makedirs(tmp)
    group.barrier()
    sd, plain, _ = collect(owners, saving=True, stage=asynchronous)
    state = dict(state, format=store.FORMAT, **plain)
    writer = _Writer(tmp, iteration)
    if asynchronous:
        future = group.delegate_async("dcp_save", lambda pg: dcp.async_save(
            sd, storage_writer=writer, process_group=pg, async_stager=_Prestaged()))
        return PendingSave(root, iteration, state, group, future)
    group.delegate("dcp_save", lambda pg: dcp.save(sd, storage_writer=writer, process_group=pg))
    return PendingSave(root, iteration, state, group, None)


# --- load -------------------------------------------------------------------------------------------
def verify(directory: str, group: Group | None = None) -> str | None:
    """Every file of `directory` against its manifest, the files spread over the ranks; the first error
    (one line) or None. Collective over `group` (None: the default process group)."""
    group = world_group(group)
    error = None
    try:
        safe_read.check_checkpoint(directory)  # manifest, state.json, .metadata: well-formed, confined, no code
        manifest = store.read_manifest(directory)
        files = sorted(manifest["files"].items())
        for name, want in files[group.rank::group.size]:
            store.verify_file(directory, name, want)
    except store.CorruptCheckpoint as e:
        error = str(e)
    return next((e for e in group.all_gather_object(error) if e), None)


def load(opt, names: dict[int, str], rng, directory: str, optim: bool = True, rng_too: bool = True,
         pg: Group | None = None) -> dict:
    """Fill the master weights (and the Adam moments and step, the loss scaler, this rank's RNG) from a
    checkpoint written at any layout (`load_state`). Returns state.json."""
    return load_state(statefuls(opt, names, rng, optim=optim, rng_too=rng_too), directory, pg)


def load_state(owners: dict[str, Stateful], directory: str, group: Group | None = None) -> dict:
    """Fill every owner's state from a checkpoint: DCP reads each piece this rank holds from whichever saved pieces
    overlap it, state.json gives the plain values; then each owner's load_state_dict puts derived state right.
    An owner's plain value the checkpoint lacks (saved before the owner kept it) is left out. An owner whose pieces
    depend on the saved layout (hybrid/compress/state.py) has `before_load(its saved plain values)` called first.
    Returns state.json.
    Collective over `group` (None: the default process group)."""
    state = store.read_state(directory)
    for prefix, owner in owners.items():  # an owner whose pieces depend on the saved layout reads its values first
        if hasattr(owner, "saved_run"):  # ... or the saved run's flags and layout (hybrid/compress/state.py)
            owner.saved_run(state)
        if hasattr(owner, "before_load"):
            owner.before_load({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
    sd, plain, own = collect(owners, saving=False)
    # .metadata through safe_read: only DCP's own classes are unpickled (an untrusted checkpoint runs no code)
    world_group(group).delegate("dcp_load", lambda pg: safe_read.load(sd, directory, process_group=pg))
    _check_finite({p: {k: sd[p + k] if torch.is_tensor(v) else v for k, v in own[p].items()} for p in own},
                  directory, group)
    for prefix, owner in owners.items():
        loaded = {}
        for k, v in own[prefix].items():
            if isinstance(v, Shards):
                loaded[k] = v  # filled in place
            elif torch.is_tensor(v):
                loaded[k] = sd[prefix + k]
            elif prefix + k in state:
                loaded[k] = state[prefix + k]
        owner.load_state_dict(loaded)
    return state


CHECKED_FINITE = ("compress/", "diloco.")  # owners whose loaded tensors feed every later step as they are


def _check_finite(own: dict, directory: str, group: Group | None) -> None:
    """Refuse a checkpoint whose compression state (PowerSGD / 1-bit Adam error feedback, warm-start Q) or DiLoCo
    outer state (anchor, outer momentum, pending delta) holds a NaN or inf: each is added into every later step
    as it is -- a NaN error feedback turns every compressed gradient into NaN, a NaN anchor every outer step: the
    resumed run could only diverge, whether the file was forged, corrupted or saved from a poisoned run. One line naming
    the file and the key, on every rank (the verdict is gathered: a rank alone raising would leave the others
    waiting in the next collective). The shapes and dtypes are the layout's own: DCP fills the buffers the owner
    allocated.

    Why here, after the process groups start, and not in train.py's checks before them (round 18 asked): only the
    values can tell -- DCP's .metadata holds each tensor's shape, dtype and chunk offsets, no statistic, and the
    manifest a checksum per file (which a forged file brings with it) -- so a check before the groups would have to
    read the outer state a second time: theta, b and the delta in flight are one fp32 copy of the model each
    (4-12 bytes a parameter: 28-84 GB at 7B), read by rank 0 alone before any rank may start (a rank refusing alone
    leaves the others in the rendezvous), on every resume, to catch a case that is rare. Here each rank scans only
    the share DCP has just read into memory (torch.isfinite: ~0.15 s of CPU per 100 MB on this machine, one
    thread) and the verdict is a few bytes; the refusal still comes before any training step and names the file
    and key, one line. What it costs in the bad case is the start-up (groups, model build: seconds)."""
    bad = None
    for prefix in CHECKED_FINITE:
        for k, v in own.get(prefix, {}).items():
            pieces = v.tensors if isinstance(v, Shards) else [v] if torch.is_tensor(v) else []
            if bad is None and any(t.is_floating_point() and not torch.isfinite(t).all() for t in pieces):
                bad = prefix + k
    bad = next((b for b in world_group(group).all_gather_object(bad) if b), None)
    if bad is not None:
        meta = safe_read.read_metadata(directory)
        files = sorted({i.relative_path for m, i in meta.storage_data.items() if m.fqn == bad}) or ["__*.distcp"]
        raise store.CorruptCheckpoint(f"{os.path.join(directory, files[0])}: {bad} holds NaN or inf, which every "
                                      f"later step would add in; not loaded (forged, corrupted, or saved from a "
                                      f"diverged run): resume from an earlier checkpoint")
