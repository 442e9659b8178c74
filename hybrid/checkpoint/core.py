"""Save and load one checkpoint of a ZeroOptimizer-trained model with torch.distributed.checkpoint (DCP).

What is saved (keys of the DCP state dict; `NAME` is a parameter's global name):

    model/NAME                 fp32 master weights, the full unsharded tensor, as chunks (shards.py)
    optim.exp_avg/NAME         AdamW first moment, same chunks
    optim.exp_avg_sq/NAME      AdamW second moment, same chunks
    rng/<rank>/<stream>        per-rank RNG state (torch CPU/CUDA generators, the TP dropout streams):
                               keyed by rank because DCP keeps a key saved on every rank from one rank only

and, as JSON (state.json, written by rank 0): iteration, consumed samples, the Adam step, the fp16 loss
scaler, the layout and the run's flags. The compute-dtype parameters are not saved: they are the master
weights cast (bf16/fp16) or the master weights themselves (fp32), and are rebuilt from them on load
(ZeroOptimizer.sync_params_from_master).
"""

from __future__ import annotations

import os
from collections import defaultdict
from concurrent.futures import Future

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import AsyncStager

from hybrid.checkpoint import safe_read, store
from hybrid.checkpoint.faults import crash_point
from hybrid.checkpoint.shards import Chunk, optimizer_chunks, sharded_tensor

MOMENTS = ("exp_avg", "exp_avg_sq")
MODEL = "model"


def param_names(model) -> dict[int, str]:
    """id(param) -> global name, for every chunk of a pipeline rank (names are layout-independent)."""
    names: dict[int, str] = {}
    for chunk in (model if isinstance(model, torch.nn.ModuleList) else [model]):
        for n, p in chunk.named_parameters():
            names.setdefault(id(p), n)
    return names


# --- the optimizer's state ---------------------------------------------------------------------------
def ensure_adam_state(opt) -> None:
    """Zero moments and step 0 where AdamW has not stepped yet, laid out as the optimizer itself would
    create them (torch: a float32 step tensor, on the device when fused; DeepSpeed's CPU Adam: an int)."""
    deepspeed = opt.optimizer_kind.startswith("deepspeed")
    for group in opt.optimizer.param_groups:
        for p in group["params"]:
            st = opt.optimizer.state[p]
            if st:
                continue
            if deepspeed:
                st["step"] = 0
            else:
                on_device = group.get("fused") or group.get("capturable")
                st["step"] = torch.zeros((), dtype=torch.float32, device=p.device if on_device else "cpu")
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def adam_step(opt) -> int:
    """AdamW's step count (the same for every parameter; 0 before the first step)."""
    for group in opt.optimizer.param_groups:
        for p in group["params"]:
            st = opt.optimizer.state.get(p)
            if st and "step" in st:
                return int(st["step"])
    return 0


def set_adam_step(opt, step: int) -> None:
    for group in opt.optimizer.param_groups:
        for p in group["params"]:
            st = opt.optimizer.state[p]
            if torch.is_tensor(st["step"]):
                st["step"].fill_(float(step))
            else:
                st["step"] = step
    if opt.optimizer_kind.startswith("deepspeed"):
        _replay_deepspeed_step(opt.optimizer, step)


def _replay_deepspeed_step(optimizer, step: int) -> None:
    """DeepSpeed's CPU Adam keeps beta1^t, beta2^t in C++, multiplied once per step; a fresh optimizer at
    step t would take std::pow instead -- another rounding. Replaying steps 1..t on a one-element dummy
    rebuilds the products bit for bit (the dummy's update is thrown away)."""
    group = optimizer.param_groups[0]
    b1, b2 = group["betas"]
    dummy = [torch.zeros(1) for _ in range(4)]
    for s in range(1, step + 1):
        optimizer.ds_opt_adam.adam_update(optimizer.opt_id, s, group["lr"], b1, b2, group["eps"], 0.0,
                                          group["bias_correction"], *dummy)


def scaler_state(opt) -> dict:
    return {"loss_scale": opt.loss_scale, "good_steps": opt.good_steps, "skipped_steps": opt.skipped_steps}


def load_scaler_state(opt, state: dict) -> None:
    opt.loss_scale, opt.good_steps, opt.skipped_steps = state["loss_scale"], state["good_steps"], state["skipped_steps"]


# --- DCP state dicts --------------------------------------------------------------------------------
def _tensor(opt, c: Chunk, kind: str) -> torch.Tensor:
    base = opt.units[c.unit].views[c.seg] if kind == MODEL else opt.moment(c.unit, c.seg, kind)
    return base[c.lo:c.hi].view(c.sizes)


def _key(kind: str, name: str) -> str:
    return f"{MODEL}/{name}" if kind == MODEL else f"optim.{kind}/{name}"


def tensor_state(opt, chunks: list[Chunk], kinds: tuple[str, ...], stage: bool = False) -> dict:
    """One ShardedTensor per (kind, parameter) over this rank's chunks: views of the live state, or (stage)
    CPU copies of them, so the values saved are those of now whatever training does next."""
    by_name: dict[str, list[Chunk]] = defaultdict(list)
    for c in chunks:
        by_name[c.name].append(c)
    out = {}
    for kind in kinds:
        for name, cs in by_name.items():
            ts = [_tensor(opt, c, kind) for c in cs]
            if stage:
                ts = [t.to("cpu", copy=True) for t in ts]
            out[_key(kind, name)] = sharded_tensor(ts, [(c.offsets, c.sizes) for c in cs], cs[0].global_shape)
    return out


def rng_state(rank: int, rng) -> dict[str, torch.Tensor]:
    """This rank's generators (torch CPU, CUDA when in use, the ParallelRNG dropout streams)."""
    out = {f"rng/{rank}/torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out[f"rng/{rank}/torch_cuda"] = torch.cuda.get_rng_state()
    if rng is not None:
        out.update({f"rng/{rank}/{k}": v for k, v in rng.get_state().items()})
    return out


def set_rng_state(rank: int, rng, state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state[f"rng/{rank}/torch_cpu"])
    if f"rng/{rank}/torch_cuda" in state:
        torch.cuda.set_rng_state(state[f"rng/{rank}/torch_cuda"])
    if rng is not None:
        rng.set_state({k: state[f"rng/{rank}/{k}"] for k in rng.get_state()})


class _Prestaged(AsyncStager):
    """The state dict is already a private CPU copy (tensor_state(stage=True)): nothing more to stage.
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


class PendingSave:
    """A save whose data is being (or has been) written; `finish()` makes it complete and `latest`."""

    def __init__(self, root: str, iteration: int, state: dict, pg, future: Future | None):
        self.root, self.iteration, self.state, self.pg, self.future = root, iteration, state, pg, future

    def finish(self) -> str:
        """Wait for the data, checksum this rank's files, and (rank 0) write the manifest, rename, advance
        `latest`. Collective over the save's process group."""
        if self.future is not None:
            self.future.result()
        tmp = store.tmp_path(self.root, self.iteration)
        rank = dist.get_rank(self.pg)
        mine = {n: store.describe(os.path.join(tmp, n)) for n in store.rank_files(tmp, dist.get_rank())}
        crash_point("after_data", self.iteration)  # test-only: every rank's data durable, nothing finalized
        everyone: list = [None] * dist.get_world_size(self.pg)
        dist.all_gather_object(everyone, mine, group=self.pg)
        path = store.final_path(self.root, self.iteration)
        if rank == 0:
            store.finalize(self.root, self.iteration, {k: v for d in everyone for k, v in d.items()}, self.state)
        dist.barrier(group=self.pg)
        return path


def start_save(opt, names: dict[int, str], rng, root: str, iteration: int, state: dict, pg=None,
               asynchronous: bool = False) -> PendingSave:
    """Write this rank's owned chunks (and its RNG state) into root/iter_N.tmp/. Synchronous: returns once
    the data is durable; asynchronous: once it is staged (copied), the write runs in a thread on `pg`.
    Either way `finish()` completes the checkpoint. Collective over `pg` (every rank of the job)."""
    rank = dist.get_rank()
    tmp = store.tmp_path(root, iteration)
    if dist.get_rank(pg) == 0:
        for name in store.clean_partial(root):
            print(f"checkpoint: removed the unfinished {name} of an earlier save", flush=True)
        os.makedirs(tmp)
    dist.barrier(group=pg)
    opt.wait_params()  # fp32 master shards view the buffers a post-step all-gather may still be writing
    ensure_adam_state(opt)
    owned = [c for c in optimizer_chunks(opt, names) if c.owner]
    sd = tensor_state(opt, owned, (MODEL, *MOMENTS), stage=asynchronous)
    sd.update({k: v.clone() for k, v in rng_state(rank, rng).items()})
    state = dict(state, format=store.FORMAT, adam_step=adam_step(opt), scaler=scaler_state(opt))
    writer = _Writer(tmp, iteration)
    if asynchronous:
        future = dcp.async_save(sd, storage_writer=writer, process_group=pg, async_stager=_Prestaged())
        return PendingSave(root, iteration, state, pg, future)
    dcp.save(sd, storage_writer=writer, process_group=pg)
    return PendingSave(root, iteration, state, pg, None)


# --- load -------------------------------------------------------------------------------------------
def verify(directory: str, pg=None) -> str | None:
    """Every file of `directory` against its manifest, the files spread over the ranks; the first error
    (one line) or None. Collective over `pg`."""
    error = None
    try:
        safe_read.check_checkpoint(directory)  # manifest, state.json, .metadata: well-formed, confined, no code
        manifest = store.read_manifest(directory)
        files = sorted(manifest["files"].items())
        world, rank = dist.get_world_size(pg), dist.get_rank(pg)
        for name, want in files[rank::world]:
            store.verify_file(directory, name, want)
    except store.CorruptCheckpoint as e:
        error = str(e)
    errors: list = [None] * dist.get_world_size(pg)
    dist.all_gather_object(errors, error, group=pg)
    return next((e for e in errors if e), None)


def load(opt, names: dict[int, str], rng, directory: str, optim: bool = True, rng_too: bool = True,
         pg=None) -> dict:
    """Fill the master weights (and the Adam moments and step, the loss scaler, this rank's RNG) from a
    checkpoint written at any layout: DCP reads each chunk this rank holds from whichever saved chunks
    overlap it. Then the parameters are rebuilt from the master weights. Returns state.json."""
    state = store.read_state(directory)
    if optim:
        ensure_adam_state(opt)
    kinds = (MODEL, *MOMENTS) if optim else (MODEL,)
    sd = tensor_state(opt, optimizer_chunks(opt, names), kinds)
    rank = dist.get_rank()
    rngs = {k: v.clone() for k, v in rng_state(rank, rng).items()} if rng_too else {}
    sd.update(rngs)
    opt.wait_params()  # a post-step all-gather in flight would write the buffers the master views
    safe_read.load(sd, directory, process_group=pg)  # .metadata: only DCP's own classes (safe_read.py)
    if optim:
        set_adam_step(opt, state["adam_step"])
        load_scaler_state(opt, state["scaler"])
    if rng_too:
        set_rng_state(rank, rng, {k: sd[k] for k in rngs})
    opt.sync_params_from_master()
    return state
