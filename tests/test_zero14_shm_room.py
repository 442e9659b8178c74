"""The shared-memory gather reserves its pages when it makes its files (hybrid/zero/shm.py `_create`): ftruncate
alone takes no room on tmpfs, so a /dev/shm another tenant fills after set-up used to kill both ranks with SIGBUS
at the optimizer's first write (no Python error; found by newuser14). Now every page is reserved up front
(posix_fallocate): a full tmpfs fails at set-up, where both ranks fall back to gloo's gather, and a co-tenant
writing later gets ENOSPC instead of killing the run."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from hybrid.mesh import Mesh, ParallelDims
from hybrid.testing import run_distributed
from hybrid.zero import shm

SHM = "/dev/shm"


@pytest.mark.skipif(not os.path.isdir(SHM), reason="no /dev/shm")
def test_a_new_file_holds_every_page_it_maps(tmp_path):
    """st_blocks counts the pages the file system gave the file: all of them before any write (0 with ftruncate
    alone on tmpfs, so this fails if the reservation goes)."""
    path = os.path.join(SHM, f"{shm.PREFIX}test-{os.getpid()}")
    nbytes = 64 * 4096
    made = shm._create(path, nbytes)
    try:
        assert made is not None
        assert os.fstat(made[1]).st_blocks * 512 >= nbytes
    finally:
        os.unlink(path)
        if made is not None:
            os.close(made[1])


def _full_on_rank_1(rank: int, world: int, tmp: str) -> tuple[bool, list[str]]:
    if rank == 1:  # this rank's file system has no room left when the file is made (after statvfs said yes)
        def no_room(fd, offset, length):
            raise OSError(errno.ENOSPC, "No space left on device")
        os.posix_fallocate = no_room
    mesh = Mesh.build(ParallelDims(dp=world))
    flats = shm.SharedFlats.open(mesh.dp, [1024, 4096], torch.float32, shm_dir=tmp)
    mesh.dp.barrier()
    return flats is not None, sorted(os.listdir(tmp))


def test_a_file_system_without_room_at_set_up_sends_both_ranks_to_gloo_and_leaves_no_file(tmp_path):
    assert run_distributed(_full_on_rank_1, 2, args=(str(tmp_path),)) == [(False, []), (False, [])]


SCRIPT = textwrap.dedent("""
    import os, subprocess, sys, torch
    from hybrid.mesh import Mesh, ParallelDims
    from hybrid.testing import run_distributed
    from hybrid.zero import shm

    def fn(rank, world, d):
        mesh = Mesh.build(ParallelDims(dp=world))
        flats = shm.SharedFlats.open(mesh.dp, [96 * 1024], torch.float32, shm_dir=d)  # 384 KiB a rank of 1 MiB
        mesh.dp.barrier()
        filled = None
        if rank == 0:  # another job on the host takes what is left of the tmpfs
            filled = subprocess.run(["dd", "if=/dev/zero", f"of={d}/other-job", "bs=64k", "count=64"],
                                    capture_output=True).returncode
        mesh.dp.barrier()
        flats.flat(0).fill_(1.0)  # the optimizer writing in place: SIGBUS here without the reservation
        mesh.dp.barrier()
        return flats is not None, filled

    if __name__ == "__main__":
        print("RESULT", run_distributed(fn, 2, args=(sys.argv[1],), timeout=120, start_method="fork"), flush=True)
""")


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root to mount a tiny tmpfs")
def test_a_tmpfs_filled_by_another_tenant_after_set_up_does_not_kill_the_ranks(tmp_path):
    """The injected fault itself: a 1 MiB tmpfs, the pair set up in it, `dd` fills the rest, then the write."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    script = tmp_path / "fill.py"
    script.write_text(SCRIPT)
    cmd = f"mount -t tmpfs -o size=1M tmpfs {mnt} && {sys.executable} {script} {mnt}"
    out = subprocess.run(["unshare", "-m", "bash", "-c", cmd], capture_output=True, text=True, timeout=300)
    if "mount" in out.stderr and "permission denied" in out.stderr.lower():
        pytest.skip("cannot mount a tmpfs here")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    # both ranks set up through shared memory, the co-tenant's dd failed (no room: ours is reserved), both wrote
    assert "RESULT [(True, 1), (True, None)]" in out.stdout, out.stdout[-2000:]


def test_a_sweep_at_the_instant_a_file_is_made_leaves_it(tmp_path, monkeypatch):
    """Another pair's stale-file sweep running between the file's creation and its lock (8 ranks set up 4 pairs at
    once) must not unlink it: the file appears under its name only once locked. The sweep is injected at the
    creator's lock call; with the file made at its name and locked after, the sweep removed it (round 14's suite:
    FileNotFoundError at the set-up's unlink)."""
    import fcntl
    real, swept = fcntl.flock, []

    def flock_after_a_sweep(fd, op):
        if op & fcntl.LOCK_EX and not swept:
            monkeypatch.setattr(fcntl, "flock", real)  # the sweep's own probes lock for real
            swept.append(shm.remove_stale(str(tmp_path)))
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock_after_a_sweep)
    path = str(tmp_path / f"{shm.PREFIX}7-0")
    made = shm._create(path, 4096)
    assert made is not None and swept == [[]] and os.path.exists(path)
    assert sorted(os.listdir(tmp_path)) == [f"{shm.PREFIX}7-0"]  # no dot-file left behind
    os.close(made[1])
