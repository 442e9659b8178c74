"""ZeRO 1-2's shared-memory post-step gather (hybrid/zero/shm.py), on by default since round 14: every writer of a
rank's shards waits for the peer to have taken its last posted values, and files left by a killed run are neither
read nor kept.

The writers (each rank's half of a unit's flat parameters lives in the file the peer copies it from; at fp32 the
master *is* that half): the optimizer step, DiLoCo's outer step (hybrid/diloco/outer.py, the masters overwritten
outside `step`), `sync_params_from_master` (bf16: the cast master copied into the shard), a checkpoint load's
in-place fill of the views `state_dict` hands out. There is no NaN-guard rollback (a skipped step writes and posts
nothing: hybrid/fault/nan_guard.py), no elastic re-plan inside a run, and a compressor runs gloo's gather (no shared
file). For each writer: rank 1 is made slow to take rank 0's post through the project's one test-only fault hook
(HYBRID_FAULT's `hang`, at the take: op `dp.shm_take`), while rank 0 goes straight on to write; what rank 1 took
must be exactly what rank 0 had posted. Without the wait rank 0 overwrites its half during rank 1's second of delay
and rank 1 copies the new values (checked by hand for each writer, the wait removed: docs/zero.md round 14)."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.mesh import Mesh, ParallelDims
from hybrid import testing
from hybrid.testing import run_distributed
from hybrid.tp import TPContext
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from hybrid.zero.config import Precision
from models import build_pipeline_chunks, load_config

# clip 0: no collective inside the step, so nothing but the wait for "taken" holds rank 0 back from its write
OPT = OptimizerConfig(lr=1e-2, eps=1e-5, decay_style="constant", clip_grad=0.0)
DELAY_S, IT = 1.0, 7  # rank 1's takes in iteration IT sleep this long first
WRITERS = ["step", "diloco", "sync_bf16", "checkpoint_fill"]


def _slow_takes(rank: int) -> None:
    """Rank 1's takes of this iteration sleep DELAY_S first: the one test-only hook, as HYBRID_FAULT installs it."""
    from hybrid.fault.inject import Injector, parse
    from hybrid.trail import TRAIL
    TRAIL.begin_iteration(IT)
    TRAIL.enter("other", 0)
    faults = parse(f"hang:rank=1,op=dp.shm_take,iteration={IT},microbatch=0,seconds={DELAY_S}")
    TRAIL.on_op_start = Injector([f for f in faults if f.rank == rank]).on_op_start


def _write(writer: str, opt: ZeroOptimizer, diloco) -> None:
    """The writer under test, as every rank runs it."""
    if writer == "step":  # again on the same reduced gradients: a second update of the master shards
        opt.step()
    elif writer == "diloco":  # the outer step overwrites the masters (fp32: the shards in the file)
        diloco.after_step(0)
    elif writer == "sync_bf16":  # new masters (not shared at bf16), cast into the shards
        for u in opt.units:
            u.master.add_(0.5)
        opt.sync_params_from_master()
    else:  # a checkpoint load: state_dict's views filled in place, then load_state_dict
        sd = opt.state_dict(optimizer=False)
        for k, v in sd.items():
            if k.startswith("model/"):
                for t in v.tensors:
                    t.add_(0.5)
        opt.load_state_dict(sd)


def _writer_run(rank, world, tmp, writer):
    from hybrid.diloco.args import DiLoCoConfig
    from hybrid.diloco.outer import DiLoCo
    from hybrid.trail import TRAIL
    from hybrid.zero import shm
    shm.SHM_DIR = tmp
    mesh = Mesh.build(ParallelDims(dp=world))
    chunks = build_pipeline_chunks(load_config("tiny-llama"), TPContext(mesh.tp), 0, 1, 1, seed=3)
    precision = Precision.BF16 if writer == "sync_bf16" else Precision.FP32
    opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=1, precision=precision), OPT)  # shm_gather: the default
    diloco = DiLoCo(DiLoCoConfig(inner_steps=1, outer_momentum=0.0), opt, mesh.tp) if writer == "diloco" else None
    spec = BatchSpec(2 * world, 2, 16, world)
    train_step(chunks, micro_batches(load_corpus(), spec, 3, 0, mesh.coords.dp), opt, mesh,
               runner=LocalForwardBackward(chunks[0], mesh.device))  # posts every unit's gather, left in flight
    mine = lambda u: u.flat[slice(*u.shard_range)].float()  # noqa: E731  (this rank's half, in the file)
    theirs = lambda u: u.flat[u.shard_range[1]:] if rank == 0 else u.flat[:u.shard_range[0]]  # noqa: E731
    posted = [mine(u).clone() for u in opt.units]
    _slow_takes(rank)
    if rank == 1:
        opt.wait_params()  # slow: each take sleeps first
    took = [theirs(u).float().clone() for u in opt.units]
    TRAIL.on_op_start = None
    _write(writer, opt, diloco)
    changed = any(not torch.equal(mine(u), p) for u, p in zip(opt.units, posted))
    opt.wait_params()
    mesh.dp.barrier()
    return {"active": opt.shm_gather_active, "posted": posted, "took": took, "changed": changed}


@pytest.mark.slow  # a 2-rank job per writer, each with a second of injected delay
@pytest.mark.parametrize("writer", WRITERS)
def test_a_slow_peers_take_reads_the_posted_shard_not_the_next_write(tmp_path, writer):
    r0, r1 = run_distributed(_writer_run, 2, args=(str(tmp_path), writer))
    assert r0["active"] and r1["active"]  # the default ran the shared path
    assert r0["changed"]  # the writer did overwrite rank 0's half (else the test shows nothing)
    for want, got in zip(r0["posted"], r1["took"]):
        assert torch.equal(got, want)
    assert os.listdir(tmp_path) == []


def _defaults_run(rank, world, tmp):
    from hybrid.zero import shm
    shm.SHM_DIR = tmp
    mesh = Mesh.build(ParallelDims(dp=world))
    out = {}
    for stage in (0, 1, 2, 3):
        chunks = build_pipeline_chunks(load_config("tiny-llama"), TPContext(mesh.tp), 0, 1, 1, seed=3)
        out[stage] = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=stage), OPT).shm_gather_active
    chunks = build_pipeline_chunks(load_config("tiny-llama"), TPContext(mesh.tp), 0, 1, 1, seed=3)
    out["off"] = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=1, shm_gather=False), OPT).shm_gather_active
    return out


def test_the_default_gathers_through_shared_memory_at_stages_1_and_2_only_and_false_turns_it_off(tmp_path):
    for r in run_distributed(_defaults_run, 2, args=(str(tmp_path),)):
        assert r == {0: False, 1: True, 2: True, 3: False, "off": False}


def test_shm_gather_is_on_by_default_and_off_by_name_from_train_py():
    from hybrid.train.args import parse_args, run_config
    assert ZeroConfig().shm_gather and ZeroConfig(stage=3).shm_gather  # accepted everywhere: used where it applies
    assert run_config(parse_args(["--zero-stage", "1"]), world=2).zero.shm_gather
    assert not run_config(parse_args(["--zero-stage", "1", "--no-shm-gather"]), world=2).zero.shm_gather


# --- files a killed run left -------------------------------------------------------------------------------------
def _file(path: str, nbytes: int, token: int, rank: int) -> None:
    """A file as a set-up writes it (magic, token, rank, size), with no live creator: what SIGKILL leaves."""
    from hybrid.zero import shm
    head = torch.tensor([shm.MAGIC, token, rank, nbytes], dtype=torch.int64)
    with open(path, "wb") as f:
        f.write(head.numpy().tobytes() + bytes(nbytes - 32))


def test_a_dead_creators_file_is_never_attached_and_is_swept_while_a_live_ones_stays(tmp_path):
    from hybrid.zero import shm
    dead, live = str(tmp_path / f"{shm.PREFIX}5-1"), str(tmp_path / f"{shm.PREFIX}6-0")
    _file(dead, 8192, 5, 1)
    assert shm._attach(dead, 8192, 5, 1) is None  # a perfect header, but no one holds its lock: stale
    made = shm._create(live, 8192)  # this process is the live creator
    torch.frombuffer(made[0], dtype=torch.int64, count=4).copy_(torch.tensor([shm.MAGIC, 6, 0, 8192]))
    attached = shm._attach(live, 8192, 6, 0)
    assert attached is not None
    assert shm.remove_stale(str(tmp_path)) == [os.path.basename(dead)]
    assert os.listdir(tmp_path) == [os.path.basename(live)]
    for fd in (made[1], attached[1]):
        os.close(fd)


KILLED = """
import os, signal, sys
from hybrid.zero import shm
made = shm._create(sys.argv[1], 8192)
print("created", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _after_kill_run(rank, world, tmp):
    """A fresh pair's set-up in the directory the killed process left its file in, then one gather."""
    from hybrid.zero import shm
    mesh = Mesh.build(ParallelDims(dp=world))
    flats = shm.SharedFlats.open(mesh.dp, [4], torch.float32, shm_dir=tmp)
    flats.flat(0)[2 * rank:2 * rank + 2] = torch.tensor([1.0, 2.0]) + 10 * rank
    flats.all_gather(0).wait()
    mesh.dp.barrier()
    return flats.flat(0).tolist(), os.listdir(tmp)


@pytest.mark.slow  # a killed process, then a 2-rank job
def test_a_file_left_by_a_sigkilled_rank_is_removed_by_the_next_set_up(tmp_path):
    """The killed creator is a fork of hybrid.testing's forkserver running `python -c KILLED` (no interpreter
    start-up): a process of its own, whose file and lock the kernel handles on SIGKILL as an interpreter's."""
    from hybrid.zero import shm
    left = str(tmp_path / f"{shm.PREFIX}77-0")
    p = testing.run(["-c", KILLED, left], timeout=120)
    assert p.returncode == -signal.SIGKILL and "created" in p.stdout
    assert os.listdir(tmp_path) == [os.path.basename(left)]  # SIGKILL left it behind
    for gathered, files in run_distributed(_after_kill_run, 2, args=(str(tmp_path),)):
        assert gathered == [1.0, 2.0, 11.0, 12.0]
        assert files == []  # the stale file swept, the pair's own unlinked


# --- a peer that dies while this rank waits ----------------------------------------------------------------------
HOLDER = """
import sys, time, torch
from hybrid.zero import shm
m, fd = shm._create(sys.argv[1], int(sys.argv[2]))
torch.frombuffer(m, dtype=torch.int64, count=4).copy_(torch.tensor([shm.MAGIC, 9, 1, int(sys.argv[2])]))
print("ready", flush=True)
time.sleep(600)
"""


def _pair_with_a_holder(tmp_path):
    """This process's file and a helper process's (a fork running HOLDER: the peer, holding its lock), wired as a
    SharedFlats."""
    from types import SimpleNamespace

    from hybrid.comm import CommLedger
    from hybrid.zero import shm
    nbytes = 2 * shm.PAGE
    mine, peer_path = shm._create(str(tmp_path / "mine"), nbytes), str(tmp_path / "peer")
    holder = testing.start(["-c", HOLDER, peer_path, str(nbytes)])  # a fork: its own process, flock and death
    deadline = time.monotonic() + 120
    while holder.stdout() != "ready\n":
        assert holder.poll() is None and time.monotonic() < deadline, (holder.stdout(), holder.stderr())
        time.sleep(0.01)
    peer = shm._attach(peer_path, nbytes, 9, 1)
    assert peer is not None  # alive: its lock is held
    group = SimpleNamespace(name="dp", ranks=(0, 1), rank=0, size=2, ledger=CommLedger(), pg=None)
    return holder, shm.SharedFlats(group, [4], torch.float32, mine[0], peer[0], [shm.PAGE], (mine[1], peer[1]))


@pytest.mark.slow  # a helper process, killed
def test_a_take_from_a_peer_killed_mid_wait_raises_a_comm_error_naming_it_not_after_the_timeout(tmp_path):
    """The peer's flock goes with its process (SIGKILL included): the waiting rank sees it within a re-check and
    raises PeerLost (a torch DistError, which hybrid/liveness.py treats as a lost peer, as gloo's closed socket),
    where the futex alone would have waited out the group's timeout (an hour here: the other message)."""
    import torch.distributed as dist
    holder, flats = _pair_with_a_holder(tmp_path)
    try:
        flats.timeout_s = 3600.0
        work = flats.all_gather(0)
        holder.kill()
        holder.wait()
        with pytest.raises(dist.DistError, match="peer rank 1 exited before it would post unit 0's gather"):
            work.wait()
    finally:
        holder.kill()


@pytest.mark.slow  # a helper process, stopped
def test_a_take_from_a_stalled_peer_times_out_after_the_groups_timeout(tmp_path):
    """A SIGSTOPped peer keeps its lock: the wait ends at the group's timeout (--distributed-timeout-minutes, read
    from the gloo group; 1 s here) with a "timed out" comm error, as gloo's own collectives do."""
    import torch.distributed as dist
    holder, flats = _pair_with_a_holder(tmp_path)
    try:
        flats.timeout_s = 1.0
        work = flats.all_gather(0)
        holder.send_signal(signal.SIGSTOP)
        with pytest.raises(dist.DistError, match="timed out after 1 s: the peer rank 1 did not post unit 0's gather"):
            work.wait()
    finally:
        holder.kill()


def _timeout_run(rank, world):
    import datetime

    from hybrid.zero import shm
    mesh = Mesh.build(ParallelDims(dp=world), timeout=datetime.timedelta(seconds=42))
    return shm._timeout_s(mesh.dp)


def test_the_wait_is_bounded_by_the_groups_own_timeout():
    assert run_distributed(_timeout_run, 2) == [42.0, 42.0]
