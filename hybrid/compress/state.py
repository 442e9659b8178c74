"""PowerSGD's checkpointable state keyed by parameter, so it reshards (hybrid/stateful.py's `Shards`).

The engine's buckets (units) differ between layouts, the parameters do not: a bucket's error feedback is its
parameters' gradients end to end, and each compressed matrix's warm-start Q is a slice of the bucket's Q. So each
parameter NAME (its global, layout-independent name) gets (prefix `compress/`):

    powersgd.error/NAME   global (dp, *full shape): DP rank d's residual e_d in row d, each TP shard at its place
                          (the parameter's ShardSpec, as the master weights); padding rows are not saved
    powersgd.q/NAME       global (T, m, r): the warm-start Q of the matrix (n x m = the TP shard viewed as
                          (shape[0], -1)); T = tp for a TP-split parameter (row t: the shard starting at
                          starts[t]), 1 for a replicated one; saved by DP rank 0 (Q is the output of
                          all-reduces)
    powersgd              {"iter", "dp", "tp", "pp", "rank"} (state.json)

Loading at another layout (`before_load` reads the saved layout first):

* PP: exact -- the same parameters, the same TP shards, every tensor maps.
* TP: the error feedback maps exactly, element by element (it is a residual of the gradient, in the gradient's
  coordinates). Q maps for replicated parameters; a TP-split matrix has another shape at another TP (another
  power iteration altogether), so its Q is drawn afresh as the hook draws a new bucket's (as every Q is when
  --powersgd-rank changed: another width).
* DP: each rank is given the saved ranks' mean error. Exact for the next step's factors: every operation before
  each all-reduce is linear in M_i = g_i + e_i (P = sum_i M_i Q, then Q = sum_i M_i^T P / n after P's
  orthonormalisation, which is scale-free), so the factors depend on the errors only through their mean
  (tests/test_compress_reshard.py checks it).
* The gradient dtype (--grad-reduce-in-bf16 given at one run and not the other): every buffer is allocated in the
  loading run's dtype and DCP's copy casts into it -- bf16 -> fp32 exactly, fp32 -> bf16 the rounding a bf16 run
  gives its own residual each step (tests/test_compress23_bf16_grads.py).

The residual in vocabulary padding rows is exactly zero (their gradient rows are zero; zero rows of M stay zero
through M Q, the column-wise orthonormalisation and P Q^T), so leaving them out of the checkpoint loses nothing.
"""

from __future__ import annotations

import math

import torch

from hybrid.compress.powersgd import PowerSGDState, matrix_rank
from hybrid.stateful import Shards, flat_rectangles, global_box, is_owner
from hybrid.tp import spec_of
from hybrid.tp.sharding import full_shape

ERROR, Q, COUNTERS = "powersgd.error/", "powersgd.q/", "powersgd"


def q_offsets(params: list[torch.Tensor], state: PowerSGDState) -> dict[int, tuple[int, int, int]]:
    """id(param) -> (offset in the bucket's flat Q, m, r) for each compressed matrix: the layout reduce_bucket
    gives Q -- compressed matrices grouped by shape in order of first appearance (powersgd._grouped_by_shape)."""
    groups: dict[tuple[int, int], list[torch.Tensor]] = {}
    for p in params:
        if matrix_rank(tuple(p.shape), state.cfg):
            groups.setdefault((p.shape[0], p.numel() // p.shape[0]), []).append(p)
    out, at = {}, 0
    for (n, m), ps in groups.items():
        r = matrix_rank((n, m), state.cfg)
        for p in ps:
            out[id(p)] = (at, m, r)
            at += m * r
    return out


def _tp_row(p: torch.Tensor, tp_rank: int) -> tuple[int, int]:
    """(T, this shard's row) of p's Q: one row per distinct TP shard (replicated kv-heads share the first's)."""
    spec = spec_of(p)
    if spec.dim is None:
        return 1, 0
    return len(spec.starts), spec.starts.index(spec.starts[tp_rank])


def _error_box(p: torch.Tensor, tp_rank: int):
    """(global box of p's real rows, flat stop) -- None when this TP shard is all padding."""
    rect, = flat_rectangles(0, p.numel(), math.prod(p.shape[1:]))
    return global_box(p, tp_rank, rect)


class PowerSGDCheckpoint:
    """The owner side of PowerSGDReduction's state (`compress/` keys). `red` is the reduction: its `state`,
    `units`, `names`, `duplicates`, `coords` (DP rank, TP rank) and `layout` (dp, tp, pp)."""

    keys = (ERROR, Q, COUNTERS)  # (error prefix, Q prefix, counters key); MomentumCheckpoint (momentum.py) has its own

    def __init__(self, red) -> None:
        self.red = red
        self.saved: dict | None = None  # set by before_load: the checkpoint's counters (its layout)
        self._pending: dict = {}
        self.legacy: str | None = None  # "<global rank>/" of a first-layout checkpoint (detect_first_layout)

    def _entries(self):
        """(unit index, param, its flat offset in the unit, its Q (offset, m, r) or None, the first copy's
        (unit index, param, offset, Q) when p is a tied twin of one earlier on this rank, else None)."""
        first: dict[str, tuple] = {}
        for i, u in enumerate(self.red.units):
            qs = q_offsets(u.params, self.red.state)
            for p, off in zip(u.params, u.offsets):
                name = self.red.names[id(p)]
                entry = (i, p, off, qs.get(id(p)))
                yield (*entry, first.get(name))
                first.setdefault(name, entry)

    # --- save -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, object]:
        if self.saved is not None and self.legacy is not None:
            return legacy_powersgd_dict(self.red, self.legacy)
        if self.saved is not None:
            return self._load_dict()
        red, s = self.red, self.red.state
        dp, tp_rank = red.coords
        err_key, q_key, counters = self.keys
        out: dict[str, object] = {counters: dict(iter=s.iter, dp=red.layout[0], tp=red.layout[1], pp=red.layout[2],
                                                 rank=s.cfg.rank)}
        for i, p, off, qo, twin in self._entries():
            if twin is not None:
                continue
            name, owner = red.names[id(p)], is_owner(p, tp_rank, 0, True, id(p) in red.duplicates)
            g = _error_box(p, tp_rank)
            if g is not None:
                err = s.error[i] if i in s.error else torch.zeros(red.units[i].numel, dtype=red.dtype)
                (goff, size), a, b = g
                out[err_key + name] = Shards((red.layout[0], *full_shape(p, spec_of(p))),
                                           [err[off + a:off + b].view(1, *size)], [((dp, *goff), (1, *size))],
                                           write=owner)
            if qo is not None:
                at, m, r = qo
                q = s.q[i][at:at + m * r] if i in s.q else torch.zeros(m * r, dtype=red.dtype)
                rows, row = _tp_row(p, tp_rank)
                out[q_key + name] = Shards((rows, m, r), [q.view(1, m, r)], [((row, 0, 0), (1, m, r))],
                                       write=dp == 0 and owner)
        return out

    # --- load -----------------------------------------------------------------------------------------------
    def before_load(self, plain: dict) -> None:
        """The checkpoint's plain values under our prefix: its counters say at which layout it was saved (none:
        saved without PowerSGD, which starts afresh)."""
        self.saved = plain.get(self.keys[2]) or dict(iter=0, dp=0, tp=0, pp=0)
        self._saved_rank, self._saved_tp = self.saved.get("rank", self.red.state.cfg.rank), self.saved["tp"]

    def _load_dict(self) -> dict[str, object]:
        """Fresh buffers for every piece to read (filled in place by the load), kept in `_pending`; nothing when
        no compressed step ran before the save (the state then starts empty, as in the saved run)."""
        red, saved = self.red, self.saved
        if not saved["iter"] > red.state.cfg.start_iter:
            return {}
        dp, tp_rank = red.coords
        numel_q = {i: n for i, (_, _, n) in red.sizes.items()}
        pend = self._pending = {"error": {i: torch.zeros(u.numel, dtype=red.dtype) for i, u in enumerate(red.units)},
                                "q": {i: torch.zeros(numel_q[i], dtype=red.dtype) for i in range(len(red.units))},
                                "mean": [], "twins": [], "fresh": set()}
        out: dict[str, object] = {}
        err_key, q_key, _ = self.keys
        for i, p, off, qo, twin in self._entries():
            if twin is not None:
                pend["twins"].append(((i, p, off, qo), twin))
                continue
            name, g = red.names[id(p)], _error_box(p, tp_rank)
            if g is not None:
                (goff, size), a, b = g
                view, shape = pend["error"][i][off + a:off + b].view(*size), (saved["dp"], *full_shape(p, spec_of(p)))
                if saved["dp"] == red.layout[0]:  # this DP rank's own row
                    out[err_key + name] = Shards(shape, [view.unsqueeze(0)], [((dp, *goff), (1, *size))], write=False)
                else:  # every saved DP row, averaged in load_state_dict
                    rows = torch.zeros(saved["dp"], *size, dtype=red.dtype)
                    out[err_key + name] = Shards(shape, [rows], [((0, *goff), (saved["dp"], *size))], write=False)
                    pend["mean"].append((rows, view))
            if qo is not None:
                (at, m, r), (n_rows, row) = qo, _tp_row(p, tp_rank)
                if not self._q_is_fresh(p):
                    out[q_key + name] = Shards((n_rows, m, r), [pend["q"][i][at:at + m * r].view(1, m, r)],
                                           [((row, 0, 0), (1, m, r))], write=False)
                else:
                    pend["fresh"].add(i)
        return out

    def load_state_dict(self, sd: dict[str, object]) -> None:
        """The pieces are filled: DP-averaged errors written, tied twins copied, the state installed."""
        red, s, saved = self.red, self.red.state, self.saved
        self.saved, pend, self._pending = None, self._pending, {}
        if self.legacy is not None:
            legacy, self.legacy = self.legacy, None
            return legacy_powersgd_load(red, legacy, sd)
        s.iter = saved["iter"]
        s.error.clear(), s.p.clear(), s.q.clear()
        s.restore_draws(0)
        if not saved["iter"] > s.cfg.start_iter:
            return
        for rows, view in pend["mean"]:
            view.copy_(rows.sum(0) / rows.shape[0])
        for (i, p, off, qo), (j, _, o, qk) in pend["twins"]:
            pend["error"][i][off:off + p.numel()].copy_(pend["error"][j][o:o + p.numel()])
            if qo is not None and qk is not None:
                pend["q"][i][qo[0]:qo[0] + qo[1] * qo[2]].copy_(pend["q"][j][qk[0]:qk[0] + qk[1] * qk[2]])
        s.restore_draws(len(red.units))  # every bucket drew its seed at the first compressed step
        for i, u in enumerate(red.units):
            s.error[i], s.q[i] = pend["error"][i], pend["q"][i]
            s.p[i] = s.q[i].new_empty(red.sizes[i][1])
            if i in pend["fresh"]:
                self._fresh_q(i, u)

    def _q_is_fresh(self, p: torch.Tensor) -> bool:
        """p's Q does not map: another --powersgd-rank (another Q width), or a TP-split matrix at another TP."""
        return self._saved_rank != self.red.state.cfg.rank or spec_of(p).dim is not None and \
            self._saved_tp != self.red.layout[1]

    def _fresh_q(self, i: int, u) -> None:
        """A bucket with matrices whose Q does not map (`_q_is_fresh`): their Q drawn as the hook draws a new
        bucket's (one seed from the state's generator)."""
        from hybrid.compress.powersgd import _initial_q
        red, s = self.red, self.red.state
        qs = [s.q[i][at:at + m * r].view(1, m, r) for p in u.params
              if (qo := q_offsets(u.params, s).get(id(p))) is not None and self._q_is_fresh(p)
              for at, m, r in [qo]]
        _initial_q(s, qs, red.dtype)


# --- 1-bit Adam ------------------------------------------------------------------------------------------------------
WORKER, SERVER, REST, ONEBIT = "onebit.worker_error/", "onebit.server_error/", "onebit.rest/", "onebit"


class OneBitCheckpoint:
    """OneBitAdamReduction's error feedback keyed by parameter (`compress/` keys):

        onebit.worker_error/NAME   global (dp, *full shape): DP rank d's worker residual in row d (as PowerSGD's)
        onebit.server_error/NAME   global full shape: the server residual is a residual of the element's one
                                   server (the DP rank whose chunk of the padded unit holds it), so each element
                                   has one value, written by its server -- sharded like a ZeRO shard
        onebit.rest/<dp>.<tp>.<pp> what no parameter holds: the zeros padding each unit to a multiple of 8 dp and
                                   vocabulary padding rows, whose residuals are not zero (sign(0) is +1); read
                                   back at the same layout only
        onebit                     {"iter", "dp", "tp", "pp"} (state.json)

    At another TP or PP the residuals map element by element, the padding's start at zero. A DP change is refused by
    name: sign compression is not linear, so no map of the worker residuals onto another number of workers gives
    the saved run's next step (their mean would be an approximation); resume at the saved DP size."""

    def __init__(self, red, names: dict[int, str], duplicates: set[int], coords: tuple[int, int, int]) -> None:
        self.red, self.names, self.duplicates, self.coords = red, names, duplicates, coords  # (dp, tp, pp) ranks
        self.saved: dict | None = None
        self.legacy: str | None = None  # "<global rank>/" of a first-layout checkpoint (detect_first_layout)

    def _pieces(self, i: int, u, server: bool, taken: dict[str, int]):
        """(key, global shape, local view, global box, write) of unit i's buffers on this rank, and the flat indices
        of the buffer no piece covers."""
        red, (dp, tp_rank, _) = self.red, self.coords
        n, buf = red.group.size, (red.server if server else red.worker)[i]
        lo = dp * buf.numel() if server else 0  # the server chunk's place in the padded unit
        covered = torch.zeros(buf.numel(), dtype=torch.bool)
        out = []
        for p, off in zip(u.params, u.offsets):
            name = self.names[id(p)]
            a, b = max(off, lo), min(off + p.numel(), lo + buf.numel())
            if taken.setdefault(name, i) != i or b <= a:  # a tied twin in another unit: left to the rest
                continue
            write = is_owner(p, tp_rank, 0, True, id(p) in self.duplicates)
            for rect in flat_rectangles(a - off, b - off, math.prod(p.shape[1:])):
                g = global_box(p, tp_rank, rect)
                if g is None:
                    continue
                (goff, size), s0, s1 = g
                view = buf[off + s0 - lo:off + s1 - lo].view(*size)
                covered[off + s0 - lo:off + s1 - lo] = True
                if server:
                    out.append((SERVER + name, full_shape(p, spec_of(p)), view, (goff, size), write))
                else:
                    out.append((WORKER + name, (n, *full_shape(p, spec_of(p))), view.unsqueeze(0),
                                ((dp, *goff), (1, *size)), write))
        return out, (~covered).nonzero().view(-1)

    def _shards(self) -> tuple[dict[str, Shards], list[tuple[torch.Tensor, torch.Tensor]]]:
        pieces: dict[str, list] = {}
        rest, taken = [], {}
        for i, u in enumerate(self.red.units):
            for server in (False, True):
                found, left = self._pieces(i, u, server, taken)
                for key, shape, view, box, write in found:
                    pieces.setdefault(key, [shape, [], [], write])
                    pieces[key][1].append(view)
                    pieces[key][2].append(box)
                rest.append(((self.red.server if server else self.red.worker)[i], left))
        return {k: Shards(tuple(s), ts, bs, w) for k, (s, ts, bs, w) in pieces.items()}, rest

    def _rest_key(self) -> str:
        dp, tp, pp = self.coords
        return f"{REST}{dp}.{tp}.{pp}"

    def state_dict(self) -> dict[str, object]:
        red = self.red
        shards, rest = self._shards()
        if self.saved is None:  # saving
            out: dict[str, object] = {ONEBIT: dict(iter=red.iter, dp=red.layout[0], tp=red.layout[1],
                                                   pp=red.layout[2])}
            out[self._rest_key()] = torch.cat([buf[idx] for buf, idx in rest])
            return {**out, **shards}
        if self.legacy is not None:
            return legacy_onebit_dict(red, self.legacy)
        if self.saved["iter"] <= red.freeze:  # no compressed step before the save: nothing to read
            return {}
        self._rest = rest
        same = all(self.saved[k] == v for k, v in zip(("dp", "tp", "pp"), red.layout))
        extra = {self._rest_key(): torch.zeros(sum(idx.numel() for _, idx in rest))} if same else {}
        return {**shards, **extra}

    def before_load(self, plain: dict) -> None:
        saved = plain.get(ONEBIT) or dict(iter=0, dp=self.red.layout[0], tp=0, pp=0)
        if saved["dp"] != self.red.layout[0] and saved["iter"] > self.red.freeze:
            from hybrid.cliutil import fail  # every rank reads the same values: one line, no traceback
            raise fail(f"train.py: error: --optimizer onebit-adam: the checkpoint's error feedback was saved at dp "
                       f"{saved['dp']}, this run has dp {self.red.layout[0]} (sign compression does not reshard "
                       f"across DP sizes); resume at dp {saved['dp']}")
        self.saved = saved

    def load_state_dict(self, sd: dict[str, object]) -> None:
        """Pieces filled in place; the padding's residuals from this rank's rest (same layout) or zero."""
        red, saved, self.saved = self.red, self.saved, None
        if self.legacy is not None:
            legacy, self.legacy = self.legacy, None
            return legacy_onebit_load(red, legacy, sd)
        red.iter = saved["iter"]
        if saved["iter"] <= red.freeze:
            for buf in (*red.worker.values(), *red.server.values()):
                buf.zero_()
            return
        rest, at = sd.get(self._rest_key()), 0
        for buf, idx in self._rest:
            buf[idx] = rest[at:at + idx.numel()] if rest is not None else 0.0
            at += idx.numel()


# --- checkpoints saved in the first layout (per rank, per bucket) ----------------------------------------------------
LEGACY_COUNTERS = {"powersgd": 5, "onebit": 4}  # [iter, draws, dp, tp, pp] / [iter, dp, tp, pp]


def detect_first_layout(checkpoint, kind: str, layout: tuple[int, int, int], compressing: bool, state: dict) -> None:
    """Compressor state saved in the first layout (before the state was keyed by parameter): per global rank r under
    `compress/<r>/`, per bucket i (the engine's i-th dense unit) -- `counters` (int64: PowerSGD [iter, draws, dp,
    tp, pp], 1-bit Adam [iter, dp, tp, pp]), `error.<i>` and `q.<i>` (PowerSGD), `worker_error.<i>` and
    `server_error.<i>` (1-bit Adam), all DCP tensors. Such a checkpoint has no `compress/` value in state.json, so
    to the owner it looked saved without compression and its error feedback was dropped silently.

    Told apart by the saved run's state.json (read before the load, hybrid/checkpoint/core.py `saved_run`): its
    flags ("args") compressing with this compressor (`compressing`), no counters in the per-parameter layout. The
    owner then reads the old keys and installs them as the old code did (`checkpoint.legacy` = "<rank>/") --
    exactly, at the layout they were saved at, the only layout that layout ever loaded at; another layout is refused
    by name."""
    checkpoint.legacy = None
    if f"compress/{kind}" in state or not compressing:
        return
    saved = state.get("layout") or {}
    saved = tuple(saved.get(k) for k in ("dp", "tp", "pp"))
    if saved != tuple(layout):
        from hybrid.cliutil import fail
        flag = "--powersgd-rank" if kind == "powersgd" else "--optimizer onebit-adam"
        raise fail(f"train.py: error: {flag}: the checkpoint's compressor state is in the first, per-bucket layout "
                   f"(compress/<rank>/), which reads back only at the layout it was saved at: dp x tp x pp = "
                   f"{' x '.join(map(str, saved))}, this run is {' x '.join(map(str, layout))}; resume at that "
                   f"layout (its next save is in the per-parameter layout, which reshards)")
    import torch.distributed as dist
    checkpoint.legacy = f"{dist.get_rank() if dist.is_initialized() else 0}/"


def legacy_powersgd_dict(red, rank: str) -> dict[str, object]:
    out: dict[str, object] = {rank + "counters": torch.zeros(LEGACY_COUNTERS["powersgd"], dtype=torch.int64)}
    for i, (ne, _, nq) in red.sizes.items():
        out[f"{rank}error.{i}"] = torch.zeros(ne, dtype=red.dtype)
        out[f"{rank}q.{i}"] = torch.zeros(nq, dtype=red.dtype)
    return out


def legacy_powersgd_load(red, rank: str, sd: dict[str, object]) -> None:
    """As the first layout's PowerSGDReduction.load_state_dict: counters, then the buckets' error and Q (P is
    recomputed from Q); nothing when no compressed step ran before the save."""
    s = red.state
    it, draws = (int(v) for v in sd[rank + "counters"][:2])
    s.iter = it
    s.error.clear(), s.p.clear(), s.q.clear()
    s.restore_draws(draws)
    if it <= s.cfg.start_iter:
        return
    for i, (_, npn, _) in red.sizes.items():
        s.error[i], s.q[i] = sd[f"{rank}error.{i}"].clone(), sd[f"{rank}q.{i}"].clone()
        s.p[i] = s.q[i].new_empty(npn)


def legacy_onebit_dict(red, rank: str) -> dict[str, object]:
    out: dict[str, object] = {rank + "counters": torch.zeros(LEGACY_COUNTERS["onebit"], dtype=torch.int64)}
    for i in red.worker:
        out[f"{rank}worker_error.{i}"] = torch.zeros_like(red.worker[i])
        out[f"{rank}server_error.{i}"] = torch.zeros_like(red.server[i])
    return out


def legacy_onebit_load(red, rank: str, sd: dict[str, object]) -> None:
    """As the first layout's OneBitAdamReduction.load_state_dict: the step count and every bucket's residuals."""
    red.iter = int(sd[rank + "counters"][0])
    for i in red.worker:
        red.worker[i].copy_(sd[f"{rank}worker_error.{i}"])
        red.server[i].copy_(sd[f"{rank}server_error.{i}"])
