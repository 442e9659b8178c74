"""ZeRO 1-2's post-step parameter all-gather through shared memory, for a 2-rank gloo pair on one host.

Over gloo every gather crosses loopback TCP: the sender's shard is copied into the kernel's socket buffers and out
again on the receiving side, by gloo's threads, with a system call per chunk -- ~146 ms of CPU a rank a step on the
bench's 101M model for the reduce-scatter and the gather together (docs/zero.md, round 12). Here each rank's flat
parameter buffers live in a file in /dev/shm that both ranks map, so the post-step gather is

    post:  the shard is already in place (the optimizer updated u.flat[me] in the mapped file): publish it,
           ready[u] += 1 in this rank's control block
    wait:  once the peer's ready[u] has reached ours, one copy  u.flat[peer] <- peer's file's u.flat[peer],
           then taken[u] += 1 (the peer may overwrite that shard again)

no sender copy, no socket, no gloo thread: one memcpy a byte on the receiver where TCP makes two plus the system
calls. The bytes are the peer's own, so every value is the gloo gather's bit for bit (nothing is computed). Before
a rank writes its shard again (the next optimizer step, a checkpoint load) it waits for the peer's taken[u] to
reach its own ready[u]; every rank first takes what the peer posted (`ZeroOptimizer.wait_params`), then waits for
the peer to have taken its own, so the two waits cannot wait on each other.

Memory: each rank's own buffers move into its file (the same bytes, resident as shared memory), and reading the
peer's half maps the peer's pages too, which the kernel counts in both ranks' resident sets (each physical page
once in their proportional share, PSS): +the peer's half of the parameters in RSS, nothing more in physical memory.

Waiting: a rank whose peer has not posted yet sleeps in the kernel on the counter's word (futex, shared between
the processes: the poster wakes it at once, as gloo's own waits are woken), re-checking every 50 ms -- and whether
the peer still lives: each rank holds an exclusive flock(2) on its own file for its whole life, which the kernel
drops when the process ends however it ends (SIGKILL included), so a waiting rank that can take a shared lock on the
peer's file knows the peer is gone and raises at once, as gloo does when a peer's socket closes (not after gloo's
30-minute timeout).

Writers: every write of a rank's own half (the optimizer step; `sync_params_from_master` after DiLoCo's outer step
or a checkpoint load; the checkpoint's in-place fill of the master views `state_dict` hands out) first calls
`ZeroOptimizer.before_param_writes`: take what the peer posted, then wait for the peer to have taken this rank's
last post. A take of post k therefore reads exactly post k's values, never a later write's (tests/
test_zero14_shm_writers.py delays the peer's take through the test-only fault hook, `hang:op=dp.shm_take`).

Files: created O_EXCL under a name holding rank 0's random token for this set-up and unlinked by their creator once
both ranks mapped them; the only window that leaves one behind is a process killed during set-up. Such a file is
never attached to (each rank attaches only after both agreed they created theirs afresh, and checks the token), and
the next set-up on the host removes it: a file whose creator's flock can be taken belongs to no live process.

Ordering: a counter is written after the data it publishes and read before the data it guards. x86-64 keeps
stores in order with stores and loads with loads (TSO), so no fence is needed there; other architectures fall back
to gloo. Set-up is collective over the pair (through the group's counted all-reduce): each rank creates its file,
both check that they see the other's (the same host, the same /dev/shm) with the same layout, then unlink their own
(the mappings stay, nothing is left behind). Anything missing -- not x86-64, no /dev/shm or too little room in it
(Docker's default is 64 MB), another host -- and both ranks fall back to gloo, agreed through the same all-reduce.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import platform
import time
import weakref

import torch
import torch.distributed as dist

from hybrid.comm import Group, Work
from hybrid.trail import TRAIL, OpRecord

SHM_DIR = "/dev/shm"
PAGE = 4096
MAGIC = 0x5A45524F53484D31  # "ZEROSHM1": the first control word of every file
TIMEOUT_S = 1800.0  # gloo's default timeout, where the group's own (--distributed-timeout-minutes) cannot be read
HEADER = 4  # control words before the counters: magic, token, rank, layout bytes
SYS_FUTEX, FUTEX_WAIT, FUTEX_WAKE = 202, 0, 1  # x86-64 Linux; shared (not FUTEX_PRIVATE): across processes
RECHECK_S = 0.05  # a futex wait's bound: a missed wake-up (or the peer's death) costs at most this
PREFIX = "hybrid-zero-"  # every file's name: PREFIX + token + "-" + rank
TAKE_OP = "shm_take"  # the test-only fault hook's op name for a take (HYBRID_FAULT="hang:...,op=dp.shm_take,...")


class SharedFlats:
    """Both ranks' flat parameter buffers in shared memory (one file a rank), and the gather over them.

    `flat(i)` is this rank's buffer of unit i (`numels[i]` elements of `dtype`, equal halves); `all_gather(i)`
    publishes this rank's half and returns the Work that copies the peer's in. Build with `open` (collective)."""

    def __init__(self, group: Group, numels: list[int], dtype: torch.dtype, mine: mmap.mmap, peer: mmap.mmap,
                 offsets: list[int], fds: tuple[int, int]) -> None:
        self.group, self.numels, self.dtype, self.offsets = group, numels, dtype, offsets
        self._maps = (mine, peer)  # kept open for the tensors' lifetime
        self._fds = fds  # (this rank's file, locked: its liveness; the peer's: probed for the peer's)
        weakref.finalize(self, _close, fds)  # a dropped optimizer lets its lock go (the files are unlinked already)
        n = len(numels)
        self._ctrl = torch.frombuffer(mine, dtype=torch.int64, count=HEADER + 2 * n)
        self._peer_ctrl = torch.frombuffer(peer, dtype=torch.int64, count=HEADER + 2 * n)
        esize = torch.empty((), dtype=dtype).element_size()
        self._flats = [torch.frombuffer(mine, dtype=dtype, count=k, offset=o) for k, o in zip(numels, offsets)]
        self._peer_flats = [torch.frombuffer(peer, dtype=dtype, count=k, offset=o) for k, o in zip(numels, offsets)]
        self.element_size = esize
        self.posted = 0  # gathers posted through shared memory (tests read it: the path did run)
        self.timeout_s = _timeout_s(group)  # a stalled peer: an error after the group's own timeout, as gloo's

    # --- set-up ----------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, group: Group, numels: list[int], dtype: torch.dtype, shm_dir: str | None = None,
             why: list[str] | None = None) -> SharedFlats | None:
        """Collective over the 2-rank `group`: the pair's shared buffers, or None on both ranks where either cannot
        (the caller keeps gloo's gather). `shm_dir`: where the files go (default SHM_DIR, read at the call). `why`:
        a list that gets this rank's reason where a 2-rank gloo pair's set-up declined (train.py says it at start)."""
        if group.size != 2 or not group.host_staged:
            return None
        shm_dir = shm_dir or SHM_DIR
        esize = torch.empty((), dtype=dtype).element_size()
        offsets, end = [], _round_up((HEADER + 2 * len(numels)) * 8, PAGE)
        for k in numels:
            offsets.append(end)
            end = _round_up(end + k * esize, PAGE)
        if _platform_ok(shm_dir):  # a killed run's files go first (before the room is counted: they hold some),
            remove_stale(shm_dir)  # on both ranks before either creates (the all-reduce below)
        room = _supported(shm_dir, 2 * end)
        token = torch.tensor([int.from_bytes(os.urandom(6), "little") if group.rank == 0 else 0], dtype=torch.int64)
        group.all_reduce(token, tag="shm-setup")  # rank 0's token on both ranks
        path = lambda r: os.path.join(shm_dir, f"{PREFIX}{int(token)}-{r}")  # noqa: E731
        mine = _create(path(group.rank), end) if room else None
        if mine is not None:
            ctrl = torch.frombuffer(mine[0], dtype=torch.int64, count=HEADER)
            ctrl.copy_(torch.tensor([MAGIC, int(token), group.rank, end]))
        peer = None
        try:
            if _agree(group, mine is not None):
                peer = _attach(path(1 - group.rank), end, int(token), 1 - group.rank)
            ok = _agree(group, peer is not None)
        finally:
            if mine is not None:
                os.unlink(path(group.rank))  # both ranks have mapped it (or given up): nothing left behind
        if not ok:
            for m in (mine, peer):
                if m is not None:
                    os.close(m[1])  # the maps go with their last tensor
            if why is not None:
                why.append(_declined(shm_dir, 2 * end, room, mine is not None, peer is not None))
            return None
        return cls(group, numels, dtype, mine[0], peer[0], offsets, (mine[1], peer[1]))

    # --- the gather --------------------------------------------------------------------------------------------
    def flat(self, i: int) -> torch.Tensor:
        return self._flats[i]

    def all_gather(self, i: int) -> Work:
        """Publish this rank's half of unit i (already written in place) and return the Work that, once waited,
        has copied the peer's half in. Recorded on the ledger as the gather it replaces (the full unit's bytes)."""
        g = self.group
        g.ledger.record("all_gather", g.name, self.numels[i] * self.element_size)
        rec = TRAIL.start(g.name, g.ranks, "all_gather")
        seq = int(self._ctrl[HEADER + 2 * i]) + 1
        self._publish(HEADER + 2 * i, seq)  # after the data: the optimizer wrote the shard before this call
        self.posted += 1
        return Work(_Take(self, i, seq), rec)

    def wait_taken(self, units: list[int]) -> None:
        """Before this rank writes its shards of `units` again: the peer has copied the last values posted."""
        for i in units:
            self._await(HEADER + 2 * i + 1, int(self._ctrl[HEADER + 2 * i]), f"take unit {i}'s gather")

    def _take(self, i: int, seq: int) -> None:
        self._await(HEADER + 2 * i, seq, f"post unit {i}'s gather")
        _fault_hook(self.group)  # test-only: a slow reader (a no-op unless HYBRID_FAULT names dp.shm_take)
        half = self.numels[i] // 2
        lo = (1 - self.group.rank) * half
        self._flats[i][lo:lo + half].copy_(self._peer_flats[i][lo:lo + half])
        self._publish(HEADER + 2 * i + 1, seq)  # after the copy: the peer may now overwrite its half

    def _ready(self, i: int, seq: int) -> bool:
        return int(self._peer_ctrl[HEADER + 2 * i]) >= seq

    def _publish(self, word: int, value: int) -> None:
        """Set this rank's control word and wake the peer if it sleeps on it."""
        self._ctrl[word] = value
        _futex(self._ctrl.data_ptr() + 8 * word, FUTEX_WAKE, 2**31 - 1)

    def _await(self, word: int, want: int, what: str) -> None:
        """Until the peer's control word reaches `want`: asleep on it in the kernel (the futex compares the word's
        low 32 bits, little-endian first, with the value read: a change in between returns at once)."""
        t0 = time.monotonic()
        while (v := int(self._peer_ctrl[word])) < want:
            low = v & 0xFFFFFFFF
            _futex(self._peer_ctrl.data_ptr() + 8 * word, FUTEX_WAIT, low - 2**32 if low >= 2**31 else low,
                   RECHECK_S)
            peer = self.group.ranks[1 - self.group.rank]
            if int(self._peer_ctrl[word]) < want and not _held(self._fds[1]):
                raise PeerLost(f"ZeRO shared-memory gather: the peer rank {peer} exited before it would {what}")
            if time.monotonic() - t0 > self.timeout_s:
                raise PeerLost(f"ZeRO shared-memory gather: timed out after {self.timeout_s:.0f} s: the peer rank "
                               f"{peer} did not {what} (stalled?)")


class PeerLost(dist.DistError):
    """The peer of a shared-memory gather exited or stalled past the group's timeout: a communication error, as
    gloo's "Connection closed" (hybrid/liveness.py then asks the heartbeats which rank was lost and names it)."""


class _Take:
    """The backend handle of one shared-memory gather (what `Work` waits on)."""

    def __init__(self, flats: SharedFlats, i: int, seq: int) -> None:
        self.flats, self.i, self.seq = flats, i, seq

    def is_completed(self) -> bool:
        return self.flats._ready(self.i, self.seq)

    def wait(self) -> None:
        self.flats._take(self.i, self.seq)


def _timeout_s(group: Group) -> float:
    """The group's collective timeout in seconds (`Mesh.build`'s, from --distributed-timeout-minutes), read from its
    gloo backend's options; TIMEOUT_S where it has none to read."""
    try:
        return group.pg._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except Exception:  # noqa: BLE001 -- a private accessor: any failure means "not known here"
        return TIMEOUT_S


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _platform_ok(shm_dir: str) -> bool:
    """x86-64 (TSO: see the module's docstring) and `shm_dir` a directory."""
    return platform.machine().lower() in ("x86_64", "amd64") and os.path.isdir(shm_dir)


def _supported(shm_dir: str, nbytes: int) -> bool:
    """The platform, and `nbytes` free in `shm_dir` (both ranks' files). Only a first check: the room can go to
    another tenant before the files are made, which `_create`'s reservation catches."""
    if not _platform_ok(shm_dir):
        return False
    st = os.statvfs(shm_dir)
    return st.f_bavail * st.f_frsize >= nbytes


def unusable_before_start(group_size: int, device_type: str, compressed: bool, shm_dir: str | None = None
                          ) -> str | None:
    """Why the gather cannot run, from what is known before any process group (the conditions `open` and
    ZeroOptimizer._open_shared check at set-up), or None: it may -- set-up still needs the pair on one host and the
    room in /dev/shm. train.py refuses an explicit --shm-gather with it; the default falls back quietly."""
    shm_dir = shm_dir or SHM_DIR
    if device_type != "cpu":
        return "it pairs CPU ranks' host memory, and this run's parameters are on the GPU (NCCL gathers there)"
    if group_size != 2:
        return (f"it pairs the 2 ranks of a ZeRO data-parallel group, and this run's group has {group_size} "
                f"rank{'s' if group_size != 1 else ''}")
    if compressed:
        return "a gradient compressor (PowerSGD, 1-bit Adam) steps and gathers the parameters its own way"
    if not _platform_ok(shm_dir):
        return f"it needs x86-64 Linux with {shm_dir}; this is {platform.machine()}" + \
            ("" if os.path.isdir(shm_dir) else f" without {shm_dir}")
    return None


def _declined(shm_dir: str, nbytes: int, room: bool, made: bool, attached: bool) -> str:
    """Why this rank's set-up fell back to gloo (the agreement tells each rank only that one side could not)."""
    if not _platform_ok(shm_dir):
        return f"it needs x86-64 Linux with {shm_dir}; this is {platform.machine()}"
    if not room:
        st = os.statvfs(shm_dir)
        return (f"{shm_dir} has {st.f_bavail * st.f_frsize / 2**20:.0f} MiB free and the pair's files need "
                f"{nbytes / 2**20:.0f} MiB")
    if not made:
        return f"this rank could not make and reserve its file in {shm_dir} (filled since the check?)"
    if not attached:
        return (f"the peer rank's file is not in this rank's {shm_dir} (the pair on two hosts, or the peer could "
                f"not make its file)")
    return "the peer rank could not map this rank's file"


def _create(path: str, nbytes: int) -> tuple[mmap.mmap, int] | None:
    """A new file at `path` (never an existing one), mapped, with this process's exclusive flock held on it for as
    long as the returned descriptor is open (its life: the kernel drops the lock when the process ends).

    The file is made under a dot-name the stale-file sweep never reads, locked, and only then linked to `path`
    (link fails if `path` exists: O_EXCL's rule): made at `path` and locked after, another pair's sweep (`remove_stale`
    in a job's concurrent set-ups, e.g. 4 DP pairs of 8 ranks) could find it unlocked in between and unlink it."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.new")
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file nobody else has opened: cannot fail
        os.link(tmp, path)
    except OSError:
        os.close(fd)
        return None
    finally:
        os.unlink(tmp)  # empty still: a kill before this leaves a 0-byte dot-file, no memory
    try:
        os.ftruncate(fd, nbytes)
        # Reserve every page now: ftruncate alone takes no room on tmpfs, and a page first touched after another
        # tenant filled /dev/shm kills the process with SIGBUS, no Python error. A full tmpfs fails here instead
        # (ENOSPC), and the pair falls back to gloo; so does a file system that cannot reserve (EOPNOTSUPP).
        os.posix_fallocate(fd, 0, nbytes)
        return mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE), fd
    except OSError:
        os.unlink(path)
        os.close(fd)
        return None


def _attach(path: str, nbytes: int, token: int, rank: int) -> tuple[mmap.mmap, int] | None:
    """The peer's file, if this rank sees it with the peer's magic, token, rank and the same layout size, and its
    creator's lock held; with the descriptor kept open to probe that lock (`_held`)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:  # another host (or another /dev/shm): not the same machine's memory
        return None
    try:
        if os.fstat(fd).st_size != nbytes or not _held(fd):
            raise OSError("not the peer's live file")
        m = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError:
        os.close(fd)
        return None
    head = torch.frombuffer(m, dtype=torch.int64, count=HEADER).tolist()
    if head != [MAGIC, token, rank, nbytes]:
        m.close()
        os.close(fd)
        return None
    return m, fd


def _close(fds: tuple[int, ...]) -> None:
    for fd in fds:
        os.close(fd)


def _held(fd: int) -> bool:
    """Whether a live process holds the exclusive flock on the file `fd` opens (its creator: `_create`). A shared
    lock taken through this descriptor conflicts with it; once the creator is gone it succeeds (and is let go)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def remove_stale(shm_dir: str) -> list[str]:
    """Remove the files in `shm_dir` that a killed run left (a rank killed during set-up, between creating its
    file and unlinking it): ours by name, and no live process holds their lock. Returns the names removed.
    A live run's files (another job on the host, mid set-up) are left alone: their creators hold the lock."""
    removed = []
    for name in os.listdir(shm_dir):
        if not name.startswith(PREFIX):
            continue
        path = os.path.join(shm_dir, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # gone meanwhile, or not ours to read
        try:
            if not _held(fd):
                os.unlink(path)
                removed.append(name)
        except OSError:
            pass  # unlinked by someone else meanwhile
        finally:
            os.close(fd)
    return removed


def _fault_hook(group: Group) -> None:
    """The project's one test-only fault hook (hybrid/fault/inject.py, through TRAIL.on_op_start; None unless
    HYBRID_FAULT installed an injector) before a take's copy, as an op of its own that the trail does not count:
    `hang:rank=R,op=dp.shm_take,iteration=I,microbatch=M,seconds=S` makes rank R slow to read the peer's shard --
    what the writers' waits for "taken" are tested against (tests/test_zero14_shm_writers.py)."""
    if TRAIL.on_op_start is not None:
        TRAIL.on_op_start(OpRecord(group.name, tuple(group.ranks), TAKE_OP, 0, TRAIL.iteration, TRAIL.microbatch,
                                   TRAIL.phase), ())


def _agree(group: Group, ok: bool) -> bool:
    """True on both ranks iff `ok` on both (one counted all-reduce)."""
    t = torch.tensor([1.0 if ok else 0.0])
    group.all_reduce(t, tag="shm-setup")
    return int(t) == group.size


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_LIBC = ctypes.CDLL(None, use_errno=True)


def _futex(addr: int, op: int, val: int, timeout_s: float | None = None) -> None:
    """futex(2) on the 32-bit word at `addr` (ctypes releases the GIL for the call)."""
    ts = ctypes.byref(_Timespec(int(timeout_s), int(timeout_s % 1 * 1e9))) if timeout_s is not None else None
    _LIBC.syscall(ctypes.c_long(SYS_FUTEX), ctypes.c_void_p(addr), ctypes.c_int(op), ctypes.c_int(val), ts, None,
                  ctypes.c_int(0))
