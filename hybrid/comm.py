"""Process groups that count what they send.

Every collective in hybrid goes through a `Group`, which wraps one torch.distributed process group
and records each call in a `CommLedger`: calls and bytes per (collective, group name). Tests assert
communication volumes on the ledger exactly, and the planner predicts the same numbers.

Byte convention (nccl-tests' "size S", see doc/PERFORMANCE.md there):
  * all_reduce:      S = bytes of the tensor reduced (each rank's input = output size)
  * all_gather:      S = bytes of the gathered output (world x the input)
  * reduce_scatter:  S = bytes of the full input (world x the output)
  * broadcast:       S = bytes of the tensor
  * all_to_all:      S = bytes of each rank's input (= its output; (n-1)/n S leave the rank)
  * send / recv:     S = bytes of the tensor, counted by the sender (send) and receiver (recv)
  * all_to_all_v:    (variable splits, the MoE token dispatch) S = bytes this rank sends to the *other* ranks:
                     the split sizes differ per rank and per step, so the ledger counts what leaves the rank
                     (its own block never does) -- an MoE dispatch's bytes are those of the tokens routed off-rank
The wire bytes follow from S: an all-reduce ring moves 2(n-1)/n S per rank, all-gather and
reduce-scatter (n-1)/n S.

A group of size 1 never calls torch.distributed and records nothing: single-process code is the
ordinary path, not a special case.

Besides the mesh's axes (tp, dp, pp, embedding) there is the world (`Mesh.world`: start-up node ids, the
timeline, the memory peaks of the log line) and the checkpoint's own gloo groups (`Group.create`). A library
that runs its own collectives on a process group -- DCP's save and load plans -- gets it from `Group.delegate`,
which counts the call (bytes 0: the library chooses them) and keeps it in the op trail.

Every op is also recorded where it starts in the process's op trail (hybrid/trail.py: a
sequence number per group, the op in flight), which the hang watchdog reads; the trail observes only.
"""

from __future__ import annotations

import functools
import math
import threading
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable, TypeVar

import torch
import torch.distributed as dist

from hybrid.trail import TRAIL


@dataclass
class LedgerEntry:
    calls: int = 0
    bytes: int = 0


@dataclass
class CommLedger:
    """Calls and bytes per (collective, group name)."""

    entries: dict[tuple[str, str], LedgerEntry] = field(default_factory=lambda: defaultdict(LedgerEntry))

    def record(self, op: str, group: str, nbytes: int) -> None:
        e = self.entries[(op, group)]
        e.calls += 1
        e.bytes += nbytes

    def calls(self, op: str, group: str) -> int:
        return self.entries[(op, group)].calls if (op, group) in self.entries else 0

    def bytes(self, op: str | None = None, group: str | None = None) -> int:
        return sum(e.bytes for (o, g), e in self.entries.items()
                   if (op is None or o == op) and (group is None or g == group))

    def reset(self) -> None:
        self.entries.clear()

    def summary(self) -> dict[str, dict[str, int]]:
        """{"op@group": {"calls": n, "bytes": b}}, for logs and JSON."""
        return {f"{o}@{g}": {"calls": e.calls, "bytes": e.bytes} for (o, g), e in sorted(self.entries.items())}


def _eager(method):
    """A collective of a group of several ranks reached from compiled code (--compile's blocks: the TP and CP
    collectives inside them) runs eagerly, one graph break at its call site. Traced, its frame was compiled on its
    own up to the collective (which dynamo cannot trace), guarded on the ledger's counts, and recompiled when they
    changed (measured: a tiny tp 2 + SP Llama's compiled blocks made 17 graphs, 10 with this). A 1-rank group's
    call returns its input and stays traced (no break). torch._disable_dynamo imports dynamo at its first call
    only (a run that builds an optimizer has imported it already)."""
    eager = torch._disable_dynamo(method)

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        return (eager if self.size > 1 else method)(self, *args, **kwargs)
    return call


# torch 2.13 renamed the tensor-in/tensor-out collectives; keep working on older releases.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


_MAX_TAG = 2**20  # point-to-point tags of the exchange all-gather cycle below this (gloo takes any int)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


T = TypeVar("T")
_delegations: dict[int, int] = defaultdict(int)  # id(process group) -> library routines running on it now
_delegations_lock = threading.Lock()


def delegated(pg) -> bool:
    """A library routine handed `pg` by `Group.delegate` is running on it now (its collectives are counted there).
    `pg` None is the default group, which a size-1 Group hands over."""
    with _delegations_lock:
        return _delegations[id(pg)] > 0


def _open(pg, step: int) -> None:
    with _delegations_lock:
        _delegations[id(pg)] += step


@dataclass
class Group:
    """One process group (or a solo rank) plus the ledger its collectives are recorded in.

    `ranks` are global ranks in group order; `rank` is this process's index within them.
    """

    name: str
    ranks: tuple[int, ...]
    pg: "dist.ProcessGroup | None"
    ledger: CommLedger

    @classmethod
    def solo(cls, name: str, ledger: CommLedger | None = None) -> "Group":
        return cls(name=name, ranks=(dist.get_rank() if dist.is_initialized() else 0,), pg=None,
                   ledger=ledger or CommLedger())

    @classmethod
    def create(cls, name: str, ranks: list[int], ledger: CommLedger, backend: str | None = None,
               timeout: timedelta | None = None) -> "Group":
        """A new process group over `ranks` (collective over the world: every rank calls it), e.g. the
        checkpoint's gloo groups; a solo group when it has one rank."""
        if len(ranks) == 1:
            return cls.solo(name, ledger)
        pg = dist.new_group(list(ranks), backend=backend, timeout=timeout)
        return cls(name=name, ranks=tuple(ranks), pg=pg, ledger=ledger)

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def rank(self) -> int:
        return self.ranks.index(dist.get_rank()) if self.size > 1 else 0

    # --- collectives (in place where torch's are) -------------------------------------------
    @_eager
    def all_reduce(self, t: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM, tag: str = "") -> torch.Tensor:
        """`tag` files the call under "group:tag" (e.g. "dp:metrics" for logged losses), so traffic
        that is not part of the training math is counted but kept apart."""
        if self.size > 1:
            self.ledger.record("all_reduce", f"{self.name}:{tag}" if tag else self.name, _nbytes(t))
            with TRAIL.op(self.name, self.ranks, "all_reduce"):
                dist.all_reduce(t, op=op, group=self.pg)
        return t

    @_eager
    def all_gather(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Concatenate every rank's `t` along `dim`, in group order."""
        if self.size == 1:
            return t
        t_moved = t.movedim(dim, 0).contiguous()  # torch gathers along dim 0
        out = torch.empty((self.size * t_moved.shape[0],) + tuple(t_moved.shape[1:]),
                          dtype=t.dtype, device=t.device)
        self.ledger.record("all_gather", self.name, _nbytes(out))
        with TRAIL.op(self.name, self.ranks, "all_gather"):
            if self._gathers_by_exchange(out):
                _AllOf(self._exchange_gather(out, t_moved)).wait()
            else:
                _all_gather_single(out, t_moved, group=self.pg)
        return out.movedim(0, dim)

    @_eager
    def reduce_scatter(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Sum over ranks, then keep this rank's 1/size slice along `dim`."""
        if self.size == 1:
            return t
        if t.shape[dim] % self.size != 0:
            raise ValueError(f"reduce_scatter over {self.name}: dim {dim} of size {t.shape[dim]} "
                             f"is not divisible by the group size {self.size}")
        t_moved = t.movedim(dim, 0).contiguous()
        out = torch.empty((t_moved.shape[0] // self.size,) + tuple(t_moved.shape[1:]),
                          dtype=t.dtype, device=t.device)
        self.ledger.record("reduce_scatter", self.name, _nbytes(t_moved))
        with TRAIL.op(self.name, self.ranks, "reduce_scatter"):
            _reduce_scatter_single(out, t_moved, group=self.pg)
        return out.movedim(0, dim)

    @_eager
    def all_to_all(self, t: torch.Tensor, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        """Split `t` into `size` equal pieces along `scatter_dim`, send piece j to rank j, and concatenate the
        pieces received (in group order) along `gather_dim` (Ulysses' sequence <-> head exchange)."""
        if self.size == 1:
            return t
        if t.shape[scatter_dim] % self.size != 0:
            raise ValueError(f"all_to_all over {self.name}: dim {scatter_dim} of size {t.shape[scatter_dim]} "
                             f"is not divisible by the group size {self.size}")
        pieces = torch.stack(t.chunk(self.size, dim=scatter_dim))  # (size, ...): piece j goes to rank j
        out = torch.empty_like(pieces)
        self.ledger.record("all_to_all", self.name, _nbytes(pieces))
        with TRAIL.op(self.name, self.ranks, "all_to_all"):
            dist.all_to_all_single(out, pieces, group=self.pg)
        return torch.cat(out.unbind(0), dim=gather_dim)

    def all_to_all_v(self, t: torch.Tensor, out_splits: list[int], in_splits: list[int],
                          tag: str = "") -> torch.Tensor:
        """Rows of `t` (dim 0) in blocks of in_splits[j] go to group rank j; the result holds every rank's block
        for us, in group order (out_splits[j] rows from rank j). The split sizes must agree pairwise (the MoE
        dispatcher exchanges them first). Ledger: the bytes sent to other ranks (module docstring)."""
        if self.size == 1:
            return t
        t = t.contiguous()
        row = math.prod(t.shape[1:]) * t.element_size()  # bytes of one row (t may have none)
        self.ledger.record("all_to_all_v", f"{self.name}:{tag}" if tag else self.name,
                           (sum(in_splits) - in_splits[self.rank]) * row)
        out = torch.empty((sum(out_splits),) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
        with TRAIL.op(self.name, self.ranks, "all_to_all_v"):
            dist.all_to_all_single(out, t, out_splits, in_splits, group=self.pg)
        return out

    def broadcast(self, t: torch.Tensor, src_index: int = 0) -> torch.Tensor:
        if self.size > 1:
            self.ledger.record("broadcast", self.name, _nbytes(t))
            with TRAIL.op(self.name, self.ranks, "broadcast"):
                dist.broadcast(t, src=self.ranks[src_index], group=self.pg)
        return t

    def batch_p2p(self, sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]],
                  labels: tuple[str, ...] = ()) -> None:
        """Post every send and receive together (`batch_isend_irecv`) and wait for all of them.
        Peers are indices within this group. Each tensor is counted once: by its sender as
        "send", by its receiver as "recv". `labels` name each send, then each receive, in the op trail."""
        ops, landings = [], []
        for t, peer in sends:
            self.ledger.record("send", self.name, _nbytes(t))
            ops.append(dist.P2POp(dist.isend, self._wire(t), self.ranks[peer], group=self.pg))
        for t, peer in recvs:
            self.ledger.record("recv", self.name, _nbytes(t))
            buf, land = self._landing(t)
            landings.append(land)
            ops.append(dist.P2POp(dist.irecv, buf, self.ranks[peer], group=self.pg))
        if ops:
            with TRAIL.op(self.name, self.ranks, "p2p", sends=tuple(self.ranks[q] for _, q in sends),
                          recvs=tuple(self.ranks[q] for _, q in recvs), labels=labels):
                for work in dist.batch_isend_irecv(ops):
                    work.wait()
            for land in landings:
                land()

    @property
    def host_staged(self) -> bool:
        """gloo moves bytes over TCP from host memory: it all-reduces CUDA tensors through its own host copies,
        but its send / recv read the tensor's pointer as host memory ("writev: Bad address" on a CUDA tensor,
        seen on an H200 with HYBRID_BACKEND=gloo). Point-to-point CUDA tensors then go through a host copy."""
        if self.pg is None:
            return False
        if not hasattr(self, "_host_staged"):
            self._host_staged = dist.get_backend(self.pg) == "gloo"
        return self._host_staged

    def _wire(self, t: torch.Tensor) -> torch.Tensor:
        """What a send hands the backend: `t`, or its host copy (gloo, CUDA tensor; the copy is synchronous)."""
        return t.cpu() if t.is_cuda and self.host_staged else t

    def _landing(self, t: torch.Tensor):
        """(buffer the backend receives into, callable that puts it into `t` once the receive completed)."""
        if not (t.is_cuda and self.host_staged):
            return t, lambda: None
        buf = torch.empty(t.shape, dtype=t.dtype)
        return buf, lambda: t.copy_(buf)

    def batch_p2p_async(self, sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]],
                        labels: tuple[str, ...] = ()) -> list["Work"]:
        """Post every send and receive together (`batch_isend_irecv`) and return one `Work` per op -- sends,
        then receives -- without waiting: the caller waits for each where it needs it (the pipeline executor:
        a receive just before the compute that reads it, sends at the end of the step). Ledger as
        `batch_p2p`. Each op has its own op-trail record, so a hang names the one transfer waited for.
        A backend that coalesces a batch into fewer handles (NCCL) gives every op all of them: waiting
        any op then waits the whole batch, which is still correct, only less lazy."""
        if not sends and not recvs:
            return []
        ops, recs, landings = [], [], []
        items = [(t, q, dist.isend, "send") for t, q in sends] + [(t, q, dist.irecv, "recv") for t, q in recvs]
        for i, (t, peer, fn, kind) in enumerate(items):
            self.ledger.record(kind, self.name, _nbytes(t))
            label = labels[i:i + 1] if i < len(labels) else ()
            who = (self.ranks[peer],)
            recs.append(TRAIL.start(self.name, self.ranks, "p2p", sends=who if kind == "send" else (),
                                    recvs=who if kind == "recv" else (), labels=label))
            buf, land = self._landing(t) if kind == "recv" else (self._wire(t), None)
            landings.append(land)
            ops.append(dist.P2POp(fn, buf, self.ranks[peer], group=self.pg))
        handles = dist.batch_isend_irecv(ops)
        per_op = handles if len(handles) == len(ops) else [_AllOf(handles)] * len(ops)
        return [Work(h, rec, land) for h, rec, land in zip(per_op, recs, landings)]

    def barrier(self) -> None:
        if self.size > 1:
            self.ledger.record("barrier", self.name, 0)
            with TRAIL.op(self.name, self.ranks, "barrier"):
                dist.barrier(group=self.pg)

    def all_gather_object(self, obj: object) -> list:
        """Every rank's picklable `obj`, in group order (for small control data: node ids, checksums, trace
        events). Counted as calls, bytes 0: torch pickles and sizes it."""
        if self.size == 1:
            return [obj]
        out: list = [None] * self.size
        self.ledger.record("all_gather_object", self.name, 0)
        with TRAIL.op(self.name, self.ranks, "all_gather_object"):
            dist.all_gather_object(out, obj, group=self.pg)
        return out

    def delegate(self, op: str, fn: Callable[[object], T]) -> T:
        """Run `fn(pg)`, a library routine that runs its own collectives on this group's process group (DCP's save
        and load: gather the plans, scatter them, a barrier). One call of `op` on the ledger (bytes 0), one op in
        the trail (a hang inside it is named)."""
        self.ledger.record(op, self.name, 0)
        _open(self.pg, 1)
        try:
            with TRAIL.op(self.name, self.ranks, op):
                return fn(self.pg)
        finally:
            _open(self.pg, -1)

    def delegate_async(self, op: str, start: Callable[[object], Future]) -> Future:
        """`delegate` for a routine that goes on in a thread of its own (DCP's async_save): the group stays handed
        over until the returned future is done."""
        self.ledger.record(op, self.name, 0)
        _open(self.pg, 1)
        try:
            future = start(self.pg)
        except BaseException:
            _open(self.pg, -1)
            raise
        future.add_done_callback(lambda _: _open(self.pg, -1))
        return future

    # --- asynchronous collectives into caller-owned buffers (ZeRO overlap) ------------------
    # Each returns a work handle to `wait()` on before reading `out`; recorded on the ledger
    # exactly as the blocking versions (same byte convention), at issue time.
    def all_reduce_async(self, t: torch.Tensor, tag: str = "") -> "Work":
        """In-place SUM over the group, returned before it completes."""
        if self.size == 1:
            return Work(None)
        self.ledger.record("all_reduce", f"{self.name}:{tag}" if tag else self.name, _nbytes(t))
        rec = TRAIL.start(self.name, self.ranks, "all_reduce")
        return Work(dist.all_reduce(t, group=self.pg, async_op=True), rec)

    def all_gather_into(self, out: torch.Tensor, shard: torch.Tensor) -> "Work":
        """out (flat, size x shard) = every rank's `shard` concatenated in group order."""
        if self.size == 1:
            out.copy_(shard)
            return Work(None)
        self.ledger.record("all_gather", self.name, _nbytes(out))
        rec = TRAIL.start(self.name, self.ranks, "all_gather")
        if self._gathers_by_exchange(out):
            return Work(_AllOf(self._exchange_gather(out, shard)), rec)
        return Work(_all_gather_single(out, shard, group=self.pg, async_op=True), rec)

    def all_gather_in_place(self, out: torch.Tensor) -> "Work":
        """`out` (flat, `size` equal chunks) holds this rank's chunk already: every rank's chunk gathered into it.
        The exchange sends the chunk where it lies; a native all-gather needs a separate send buffer (a copy, kept
        alive by the Work)."""
        if self.size == 1:
            return Work(None)
        mine = out.view(-1).chunk(self.size)[self.rank]
        if self._gathers_by_exchange(out):
            return self.all_gather_into(out, mine)
        send = mine.clone()  # the gather writes all of `out`, this rank's chunk included
        work = self.all_gather_into(out, send)
        work.keep = send
        return work

    # --- gloo's all-gather as point-to-point exchanges ---------------------------------------
    def _gathers_by_exchange(self, out: torch.Tensor) -> bool:
        """gloo on host tensors: an all-gather is n - 1 direct sends of this rank's shard and n - 1 receives, the
        bytes of the ideal all-gather ((n-1)/n of the output per rank), but measured 3.6-6x faster than gloo's
        own all_gather_into_tensor on 2 ranks (docs/results/bench_collectives.md). The result is the same bytes
        (nothing is computed), so this changes no value anywhere; NCCL and CUDA tensors keep the native one."""
        return not out.is_cuda and self.host_staged and out.is_contiguous()

    def _exchange_gather(self, out: torch.Tensor, shard: torch.Tensor) -> list:
        """Post the exchange: out's chunk j receives rank j's shard, this rank's chunk is a local copy. Every rank
        posts its sends and receives in group order, so two gathers in flight on one group pair up in posting
        order (gloo matches a pair's messages first in, first out; each gather also has its own tag)."""
        me, n = self.rank, self.size
        parts = out.view(-1).chunk(n)
        if parts[me].data_ptr() != shard.data_ptr():  # all_gather_in_place: already there
            parts[me].copy_(shard.reshape(-1))
        return self._post_exchange([shard.reshape(-1)] * n, parts)

    def _post_exchange(self, sends, recvs) -> list:
        """Post, for every other rank j in group order, a send of sends[j] to it and a receive from it into
        recvs[j], all under this exchange's own tag; the backend handles (gathers and reduce-scatters alike)."""
        self._exchange_seq = (getattr(self, "_exchange_seq", 0) + 1) % _MAX_TAG
        ops = []
        for j in range(self.size):
            if j != self.rank:
                ops.append(dist.P2POp(dist.isend, sends[j], self.ranks[j], group=self.pg, tag=self._exchange_seq))
                ops.append(dist.P2POp(dist.irecv, recvs[j], self.ranks[j], group=self.pg, tag=self._exchange_seq))
        return dist.batch_isend_irecv(ops)

    def reduce_scatter_pieces(self, nbytes: int, sends: list[torch.Tensor], recvs: list[torch.Tensor],
                              land: Callable[[], None]) -> "Work":
        """A 2-rank gloo group's reduce-scatter of a flat unit whose gradients lie in pieces (hybrid/zero/direct.py):
        `sends` (the peer's half, piece by piece) go to the peer and `recvs` (this rank's half) come from it, in
        order, under one exchange tag (the peer posts the same pieces the other way round); `land` adds them once
        waited. Recorded as the flat unit's reduce-scatter (`nbytes`, the full unit)."""
        if not (self.size == 2 and self.host_staged):
            raise ValueError(f"reduce_scatter_pieces: a 2-rank gloo group, got {self.size} ranks on {self.name}")
        self.ledger.record("reduce_scatter", self.name, nbytes)
        rec = TRAIL.start(self.name, self.ranks, "reduce_scatter")
        self._exchange_seq = (getattr(self, "_exchange_seq", 0) + 1) % _MAX_TAG
        peer, tag = self.ranks[1 - self.rank], self._exchange_seq
        ops = [dist.P2POp(dist.isend, t, peer, group=self.pg, tag=tag) for t in sends]
        ops += [dist.P2POp(dist.irecv, t, peer, group=self.pg, tag=tag) for t in recvs]
        # a rank whose half is all padding (a unit of fewer elements than ranks) posts only sends or only receives
        return Work(_AllOf(dist.batch_isend_irecv(ops) if ops else []), rec, land=land, keep=sends)

    def reduce_scatter_into(self, out: torch.Tensor, full: torch.Tensor, recv: torch.Tensor | None = None) -> "Work":
        """out = this rank's 1/size slice (dim 0) of the SUM over ranks of `full`. `out` may be that slice of `full`
        itself (reduced in place). `recv`: a buffer of out's size the 2-rank exchange may receive into (a reused one
        saves a fresh allocation's page faults: a 74 MB one cost about as much as sending it); never read after
        the wait."""
        if self.size == 1:
            out.copy_(full)
            return Work(None)
        self.ledger.record("reduce_scatter", self.name, _nbytes(full))
        rec = TRAIL.start(self.name, self.ranks, "reduce_scatter")
        if self._reduces_by_exchange(full) and out.is_contiguous():
            return self._exchange_reduce_scatter(out, full, rec, recv)
        if out.untyped_storage().data_ptr() == full.untyped_storage().data_ptr():  # in place: the backend's own
            tmp = torch.empty_like(out)  # collective gets an output apart from its input (gloo's may overlap them)
            return Work(_reduce_scatter_single(tmp, full, group=self.pg, async_op=True), rec,
                        land=lambda: out.copy_(tmp), keep=tmp)
        return Work(_reduce_scatter_single(out, full, group=self.pg, async_op=True), rec)

    def _reduces_by_exchange(self, full: torch.Tensor) -> bool:
        """The exchange below on 2-rank gloo groups only: there x_0 + x_1 is one addition, equal bit for bit to
        gloo's reduce-scatter and all-reduce. At n > 2 gloo sums in its own order, which stage 0-1 and DDP-style
        all-reduce reproduce bit for bit (tests/test_zero.py); a group-order sum would differ in the last bits."""
        return self.size == 2 and self._gathers_by_exchange(full)

    def _exchange_reduce_scatter(self, out: torch.Tensor, full: torch.Tensor, rec,
                                 recv: torch.Tensor | None = None) -> "Work":
        """gloo on host tensors: chunk j of `full` is sent to rank j and this rank's chunk received from every
        other rank, (n-1)/n of `full` on the wire per rank -- gloo's reduce_scatter_tensor puts all of it there --
        measured 1.3-1.9x faster on 2 ranks (scripts/bench_collectives.py "point-to-point ring", the same bytes).
        The sum is taken once the receives land, in group order x_0 + x_1 + ... + x_{n-1} (used at n = 2 only:
        `_reduces_by_exchange`); at n = 2 in one pass, out = x_me + x_other, which is x_0 + x_1 bit for bit (IEEE
        addition commutes), straight into `out` (where out is this rank's chunk of `full`: in place)."""
        me, n = self.rank, self.size
        parts = full.view(-1).chunk(n)
        if parts[me].numel() != out.numel():
            raise ValueError(f"reduce_scatter_into: {full.numel()} elements do not split into {n} x {out.numel()}")
        mine = recv.view(-1) if recv is not None and n == 2 else None
        got = [parts[me] if j == me else (mine if mine is not None else torch.empty_like(parts[me])) for j in range(n)]

        def land() -> None:
            if n == 2:
                torch.add(parts[me], got[1 - me], out=out.view(-1))
                return
            out.view(-1).copy_(got[0])
            for x in got[1:]:
                out.view(-1).add_(x)

        return Work(_AllOf(self._post_exchange(parts, got)), rec, land=land, keep=got)


@dataclass
class Work:
    """A pending collective (None: it already completed, e.g. on a group of size 1), and its
    op-trail record (completed when waited for)."""

    handle: object | None
    record: object | None = None
    land: object | None = None  # after the wait: a host-staged receive's copy into its device tensor
    keep: object | None = None  # a buffer the collective reads, kept alive until it completes

    def done(self) -> bool:
        """True once the op has completed (then `wait` returns at once); never blocks."""
        return self.handle is None or self.handle.is_completed()

    def wait(self) -> None:
        if self.handle is not None:
            if self.record is None:
                self.handle.wait()
            else:
                with TRAIL.waiting(self.record):
                    self.handle.wait()
            self.handle = self.keep = None
            if self.land is not None:
                self.land()


class _AllOf:
    """Several backend handles that complete together (a coalesced batch): waited, or done, as one."""

    def __init__(self, handles: list) -> None:
        self.handles = handles

    def wait(self) -> None:
        for h in self.handles:
            h.wait()

    def is_completed(self) -> bool:
        return all(h.is_completed() for h in self.handles)
