"""The seam between the ZeRO engine and a gradient compressor: a `DPReduction` strategy.

The engine (hybrid/zero/engine.py) reduces each unit's gradients over DP from backward hooks. With a strategy
it hands the unit over instead:

    handled = reduction.reduce(unit, group)   # True: unit.flat_grad now holds the DP *sum* (the engine then
                                              # divides by n as always); False: the engine's own all-reduce /
                                              # reduce-scatter runs (e.g. PowerSGD before its start iteration)
    reduction.end_step()                      # after the step's last unit
    reduction.build_optimizer(engine, ...)    # optional: a strategy that brings its optimizer (1-bit Adam)

Strategies: PlainReduction (only the simulated slow link), PowerSGDReduction, OneBitAdamReduction (no gradient
traffic after the freeze; the optimizer all-reduces the momentum compressed, its server chunks the ZeRO 1-2
shards). `build(CompressConfig, ...)` picks.

PowerSGD reduces the whole accumulated gradient once per step (`per_micro_batch` False): PowerSGD's factors are
a nonlinear function of the whole gradient (the orthogonalisation), so they cannot be summed per micro-batch or
reduce-scattered into shards. Under ZeRO 1-2 every rank therefore all-reduces the compressed factors, decompresses
the full unit and keeps its shard; ZeRO 2 then keeps a full gradient buffer as stage 1 does (its gradient-memory
saving is given up for the compression). ZeRO 3 is refused (hybrid/compress/args.py).

TP and PP need nothing: each rank compresses its own TP shard's matrices over its DP group (the TP partial sums
are taken before, in the engine's hook), and pipeline stages reduce their own units.
"""

from __future__ import annotations

from typing import Protocol

import torch

from hybrid.comm import Group
from hybrid.compress.link import SimulatedLink
from hybrid.compress.powersgd import REDUCERS, PowerSGDConfig, PowerSGDState, matrix_rank


class DPReduction(Protocol):
    """per_micro_batch: False when the strategy needs the whole accumulated gradient (reduced once per step; ZeRO 2
    then keeps a full gradient buffer, ZeRO 3 is refused). bind: the engine's dense units, in its order, and the
    engine (its model's parameter names, its mesh coordinates)."""

    per_micro_batch: bool

    def bind(self, units: list, engine) -> None: ...

    def reduce(self, unit, group: Group) -> bool: ...

    def end_step(self) -> None: ...


class PlainReduction:
    """The engine's own collectives (nothing compressed), with only the simulated slow link after each step."""

    per_micro_batch = True

    def __init__(self, link: SimulatedLink) -> None:
        self.link = link

    def bind(self, units: list, engine) -> None:
        pass

    def reduce(self, unit, group: Group) -> bool:
        return False

    def end_step(self) -> None:
        self.link.delay()


class PowerSGDReduction:
    """PowerSGD on every dense unit of the engine: the unit is the hook's bucket (its index is the unit's position
    in the engine's list), its parameters' gradients the bucket's tensors. Also the checkpoint's owner of the
    error feedback and warm-start factors (`state_dict`)."""

    per_micro_batch = False

    def __init__(self, cfg: PowerSGDConfig, layout: tuple[int, int, int], dtype: torch.dtype = torch.float32,
                 link: SimulatedLink | None = None) -> None:
        self.state = PowerSGDState(cfg)
        self.link = link
        self.dtype = dtype  # the gradient buffers' dtype (the engine's grad_dtype)
        self.sizes: dict[int, tuple[int, int, int]] = {}
        self.layout = layout  # (dp, tp, pp) the state belongs to
        self.index: dict[int, int] = {}  # id(unit) -> bucket index

    def bind(self, units: list, engine) -> None:
        """The engine's dense units, in the engine's order (bucket index = position), and what the checkpoint
        keys the state by: the parameters' global names, the tied twins, this rank's DP and TP coordinates."""
        from hybrid.compress.state import PowerSGDCheckpoint
        bind_powersgd(self, units, engine)
        self.checkpoint = PowerSGDCheckpoint(self)

    def reduce(self, unit, group: Group) -> bool:
        if not self.state.compressing or group.size == 1 or id(unit) not in self.index:
            return False
        buf = unit.flat_grad[:unit.numel]  # the padding (zeros, no parameter) is not sent
        tensors = [unit.grad_view(unit.flat_grad, p) for p in unit.params]
        REDUCERS[self.state.cfg.variant](self.state, self.index[id(unit)], buf, tensors, group)
        buf.mul_(group.size)  # the mean -> the sum the engine divides by n (exact when n is a power of two)
        return True

    def end_step(self) -> None:
        self.state.iter += 1
        if self.link is not None:
            self.link.delay()

    # --- checkpoint owner (hybrid/stateful.py): keyed by parameter under compress/ (hybrid/compress/state.py) -----
    def state_dict(self) -> dict[str, object]:
        """Per parameter its error feedback (a row per DP rank) and its matrix's warm-start Q; the step count and
        the layout (P is recomputed from Q). Reshards: hybrid/compress/state.py."""
        return self.checkpoint.state_dict()

    def saved_run(self, state: dict) -> None:
        """A checkpoint of the first, per-bucket layout is read as such (state.py: detect_first_layout)."""
        from hybrid.compress.state import detect_first_layout
        detect_first_layout(self.checkpoint, "powersgd", self.layout,
                            ((state.get("args") or {}).get("powersgd_rank") or 0) > 0, state)

    def before_load(self, plain: dict) -> None:
        self.checkpoint.before_load(plain)

    def load_state_dict(self, sd: dict[str, object]) -> None:
        self.checkpoint.load_state_dict(sd)


CLIP_REFUSED = ("--clip-grad does not run with --optimizer onebit-adam at --zero-stage 1 or 2: after the freeze each "
                "rank's gradient is its own and ZeRO's clip norm is one sharded global norm (DeepSpeed's 1-bit Adam "
                "does not clip the compressed momentum either); pass --clip-grad 0, or use --zero-stage 0")


def bind_powersgd(red, units: list, engine) -> None:
    """What a PowerSGD state (`red.state`: the gradient's, or 1-bit Adam's momentum's) is keyed by: the units in the
    engine's order (bucket index = position), their (error, P, Q) sizes, the parameters' global names, the tied
    twins, this rank's DP and TP coordinates."""
    from hybrid.zero.state import param_names
    red.units = units
    red.index = {id(u): i for i, u in enumerate(units)}
    red.sizes = {i: _sizes(u, red.state.cfg) for i, u in enumerate(units)}  # (error, P, Q) numbers
    red.names, red.duplicates = param_names(engine.model), engine.duplicates
    red.coords = (engine.dp.rank, engine.mesh.tp.rank)


def _sizes(unit, cfg: PowerSGDConfig) -> tuple[int, int, int]:
    """(error, P, Q) numbers of a unit's bucket: every gradient element; n r and m r per compressed matrix."""
    npn = nq = 0
    for p in unit.params:
        r = matrix_rank(tuple(p.shape), cfg)
        if r:
            npn += p.shape[0] * r
            nq += p.numel() // p.shape[0] * r
    return unit.numel, npn, nq


def build(cfg, mesh, zero) -> DPReduction | None:
    """The run's strategy from its CompressConfig (None: the engine's plain collectives, no simulated link)."""
    link = SimulatedLink(cfg.simulated_dp_bandwidth, mesh.ledger, mesh.dp_cp.name) \
        if cfg.simulated_dp_bandwidth > 0 else None
    layout = (mesh.dp_cp.size, mesh.tp.size, mesh.pp.size)
    if cfg.powersgd.enabled:
        return PowerSGDReduction(cfg.powersgd, layout, zero.grad_dtype, link)
    if cfg.onebit_freeze_iters is not None and cfg.onebit_powersgd.enabled:  # --onebit-compressor powersgd
        from hybrid.compress.momentum import MomentumPowerSGDReduction
        return MomentumPowerSGDReduction(cfg.onebit_freeze_iters, cfg.onebit_powersgd, layout, link)
    if cfg.onebit_freeze_iters is not None:
        return OneBitAdamReduction(cfg.onebit_freeze_iters, layout, link)
    return PlainReduction(link) if link is not None else None


def link_line(reduction) -> str:
    """The simulated link's end line ("" without one): the seconds it asked for and those it took."""
    link = getattr(reduction, "link", None)
    return link.line() if link is not None else ""


def owners(reduction) -> dict:
    """The checkpoint's owners ({} when not compressing): the compressor's state under compress/, keyed by
    parameter (hybrid/compress/state.py)."""
    return {"compress/": reduction} if isinstance(reduction, (PowerSGDReduction, OneBitAdamReduction)) else {}


class OneBitAdamReduction:
    """1-bit Adam (hybrid/compress/onebit.py) through the seam: the plain all-reduce (ZeRO 0) or reduce-scatter
    (ZeRO 1-2) for the warm-up, then no gradient traffic at all: each rank's own gradient goes into its whole
    momentum (ZeRO 0: in the optimizer, after clipping; ZeRO 1-2: here), and the optimizer all-reduces the
    momentum compressed. Brings its optimizer (`build_optimizer`) and owns the error feedback (`state_dict`).

    ZeRO 1-2: the compressed all-reduce's server chunk k is ZeRO shard k (`shard_align`: the engine pads each unit
    to a multiple of 8 n, as the compressed all-reduce pads, so the two partitions coincide and the math is ZeRO
    0's). Reduced once per step (`per_micro_batch` False: the momentum needs the whole accumulated local gradient,
    so ZeRO 2 keeps a full gradient buffer, as stage 1). The whole momentum exists on every rank only after a
    compressed step; after the warm-up (and after a checkpoint load) each unit's shards are all-gathered once, just
    before its first compressed step (`_whole`)."""

    per_micro_batch = False
    shard_align = 8  # ZeRO shard = server chunk: whole bytes of packed signs

    def __init__(self, freeze: int, layout: tuple[int, int, int], link: SimulatedLink | None = None) -> None:
        self.freeze, self.layout, self.link = freeze, layout, link
        self.iter = 0
        self.group: Group | None = None
        self.worker: dict[int, torch.Tensor] = {}
        self.server: dict[int, torch.Tensor] = {}
        self.lengths: list[int] = []  # each unit padded to a multiple of 8 n (the momentum's and worker error's)
        self.whole: list[bool] = []  # unit i's momentum is whole on this rank (not only its ZeRO shard)
        self.sharded = False  # ZeRO 1-2 (set by build_optimizer)
        self.optimizer = None

    def bind(self, units: list, engine) -> None:
        from hybrid.compress.state import OneBitCheckpoint
        from hybrid.zero.state import param_names
        self.units = units
        self.index = {id(u): i for i, u in enumerate(units)}
        coords = (engine.dp.rank, engine.mesh.tp.rank, engine.mesh.coords.pp)
        self.checkpoint = OneBitCheckpoint(self, param_names(engine.model), engine.duplicates, coords)

    def build_optimizer(self, engine, groups: list[dict], lr: float, betas: tuple[float, float], eps: float):
        from hybrid.compress.onebit import OneBitAdam, padded_length
        if engine.has_experts:
            raise ValueError("--optimizer onebit-adam does not run with MoE experts (their gradients are reduced "
                             "over the expert-DP group); use --optimizer adam")
        if engine.cfg.stage == 3:
            raise ValueError("--optimizer onebit-adam does not run with --zero-stage 3 (each worker compresses its "
                             "whole momentum, which stage 3 never holds); use --zero-stage 0, 1 or 2")
        if engine.cfg.sharded and engine.opt_cfg.clip_grad > 0:
            raise ValueError(CLIP_REFUSED)
        self.group = engine.dp
        n = self.group.size
        self.lengths = [padded_length(u.numel, n) for u in engine.units]
        for i, (u, length) in enumerate(zip(engine.units, self.lengths)):
            if engine.cfg.sharded and u.padded != length:
                raise RuntimeError(f"unit {u.name}: ZeRO padded it to {u.padded}, 1-bit Adam needs {length}")
            self.worker[i] = torch.zeros(length, dtype=torch.float32, device=u.master.device)
            self.server[i] = torch.zeros(length // n, dtype=torch.float32, device=u.master.device)
        self.whole = [not engine.cfg.sharded] * len(engine.units)
        self.sharded = engine.cfg.sharded
        self.optimizer = OneBitAdam(engine, groups, self.freeze, lr, betas, eps, self)
        return self.optimizer

    def all_reduce_momentum(self, i: int, m: torch.Tensor, numel: int) -> None:
        """DeepSpeed's padding: the momentum's padding [numel, len) zeroed, compressed-all-reduced in place, the
        padding zeroed again (DeepSpeed appends fresh zeros and cuts the result back)."""
        from hybrid.compress.onebit import compressed_all_reduce
        if self.group.size == 1:
            return
        m[numel:].zero_()
        compressed_all_reduce(m, self.worker[i], self.server[i], self.group)
        m[numel:].zero_()

    def reduce(self, unit, group: Group) -> bool:
        """After the freeze, ZeRO 1-2: m = b1 m + (1 - b1) g_local on the whole unit (the gradient this rank
        accumulated, TP partial sums and tied-embedding sums taken: the engine's master gradient before its division
        by n, of which the engine keeps only a shard). ZeRO 0: the gradient is left to the optimizer."""
        if self.iter < self.freeze:
            return False
        if not self.sharded:  # ZeRO 0: the master gradient is this rank's own (the engine divides by n); the
            unit.flat_grad.mul_(group.size)  # optimizer folds it in after clipping (exact when n is a power of two)
            return True
        i = self.index[id(unit)]
        st, b1 = self.optimizer.flat[i], self.optimizer.param_groups[0]["betas"][0]
        self._whole(i)
        st["exp_avg"][:unit.numel].mul_(b1).add_(unit.flat_grad[:unit.numel], alpha=1 - b1)
        return True

    def _whole(self, i: int) -> None:
        """ZeRO 1-2: unit i's momentum shards all-gathered to every rank, once (after the warm-up or a load)."""
        if not self.whole[i]:
            self.group.all_gather_in_place(self.optimizer.flat[i]["exp_avg"]).wait()
            self.whole[i] = True

    def end_step(self) -> None:
        self.iter += 1
        if self.link is not None:
            self.link.delay()

    # --- checkpoint owner: keyed by parameter under compress/ (hybrid/compress/state.py: OneBitCheckpoint) ------
    def state_dict(self) -> dict[str, object]:
        return self.checkpoint.state_dict()

    def saved_run(self, state: dict) -> None:
        """A checkpoint of the first, per-bucket layout is read as such (state.py: detect_first_layout)."""
        from hybrid.compress.state import detect_first_layout
        detect_first_layout(self.checkpoint, "onebit", self.layout,
                            (state.get("args") or {}).get("optimizer") == "onebit-adam", state)

    def before_load(self, plain: dict) -> None:
        self.checkpoint.before_load(plain)

    def load_state_dict(self, sd: dict[str, object]) -> None:
        self.checkpoint.load_state_dict(sd)
        self.whole = [not self.sharded] * len(self.whole)  # ZeRO 1-2 loaded the momentum's shard only
