"""The parallel layout: one object that says how ranks form the TP x CP x DP x PP mesh.

Two halves, kept apart so the rank arithmetic is unit-tested with no processes:

* `ParallelDims` -- pure data: the sizes, the rank order, validation, and "which ranks share
  my tensor/context/data/pipeline group". No torch.distributed calls.
* `Mesh` -- `ParallelDims` plus this rank's coordinates and one `Group` per axis (built with
  `torch.distributed.new_group`), handed down to every layer, schedule and optimizer that needs one.

Rank order (Megatron's `RankGenerator`, order "tp-cp-ep-dp-pp" without EP): TP is innermost, then CP, then DP,
then PP -- a mixed-radix number whose digits are the coordinates, innermost first:

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

so with 8 GPUs per node and tp <= 8 every TP group lives inside one node (TP moves the most bytes, two
all-reduces per layer per micro-batch), context parallelism -- a ring or all-to-all of keys and values every
layer -- comes next and stays inside the node when tp x cp <= 8, then the DP replicas of a stage, and the
pipeline stages -- whose point-to-point traffic is the lightest -- are spread across nodes. The order is data
(`ParallelDims.order`): the arithmetic below never names an axis, so another order or another axis (expert
parallelism) is a new string, not new code.

Gradients of every parameter are reduced over DP x CP (Megatron's dp_cp group): each CP rank saw different
tokens of the same sequences, exactly as DP ranks see different sequences. `Mesh.dp_cp` is that group (the DP
group itself when cp = 1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum

import torch
import torch.distributed as dist

from hybrid.cliutil import check_number
from hybrid.comm import CommLedger, Group


class Axis(Enum):
    """A mesh axis; the value is the name used in the ledger, in `ParallelDims.order` and in error messages."""

    TP = "tp"
    CP = "cp"
    DP = "dp"
    PP = "pp"


DEFAULT_ORDER = "tp-cp-dp-pp"  # innermost first (Megatron's "tp-cp-ep-dp-pp", no EP yet)
FLAGS = {"tp": "--tensor-model-parallel-size", "cp": "--context-parallel-size",
         "pp": "--pipeline-model-parallel-size", "dp": "data-parallel size"}


@dataclass(frozen=True)
class Coords:
    """Where one rank sits in the mesh."""

    tp: int
    dp: int
    pp: int
    cp: int = 0


@dataclass(frozen=True)
class ParallelDims:
    """Sizes of the mesh axes and their rank order. world = tp * cp * dp * pp.

    Attributes:
        tp: tensor-parallel size (`--tensor-model-parallel-size`).
        pp: pipeline-parallel size (`--pipeline-model-parallel-size`).
        dp: data-parallel size (derived from the world size in the scripts).
        cp: context-parallel size (`--context-parallel-size`): ranks splitting each sequence.
        order: the axes from innermost (consecutive ranks) to outermost, joined by "-".
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    order: str = DEFAULT_ORDER

    def __post_init__(self) -> None:
        for axis in ("tp", "pp", "dp", "cp"):
            check_number(FLAGS[axis], getattr(self, axis), 1, integer=True)
        if sorted(self.axes) != sorted(a.value for a in Axis):
            raise ValueError(f"rank order {self.order!r} must name each of {[a.value for a in Axis]} once")

    @classmethod
    def from_world(cls, world_size: int, tp: int = 1, pp: int = 1, cp: int = 1) -> "ParallelDims":
        """dp = world / (tp * cp * pp); raises if the world does not factor that way."""
        for flag, value in (("world size", world_size), (FLAGS["tp"], tp), (FLAGS["pp"], pp), (FLAGS["cp"], cp)):
            check_number(flag, value, 1, integer=True)
        model = tp * cp * pp
        if world_size % model != 0:
            launch = (f" (this is one process: launch {model} or a multiple with torchrun --nproc-per-node)"
                      if world_size == 1 else "")
            cp_part = f" x --context-parallel-size ({cp})" if cp > 1 else ""
            raise ValueError(
                f"world size {world_size} is not divisible by --tensor-model-parallel-size ({tp}){cp_part} x "
                f"--pipeline-model-parallel-size ({pp}) = {model}; choose sizes whose product divides "
                f"{world_size}{launch}")
        return cls(tp=tp, pp=pp, dp=world_size // model, cp=cp)

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(self.order.split("-"))

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def size(self, axis: Axis) -> int:
        return getattr(self, axis.value)

    # --- rank arithmetic: a mixed-radix number, digits in `order` (innermost first) -------------
    def coords(self, rank: int) -> Coords:
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} outside world of size {self.world}")
        digits = {}
        for name in self.axes:
            n = getattr(self, name)
            digits[name], rank = rank % n, rank // n
        return Coords(**digits)

    def rank(self, c: Coords) -> int:
        r = 0
        for name in reversed(self.axes):
            r = r * getattr(self, name) + getattr(c, name)
        return r

    def group_ranks(self, axis: Axis | tuple[Axis, ...]) -> list[list[int]]:
        """Every group along `axis` (or along several axes together, e.g. (CP, DP)): the ranks that differ only
        in those coordinates, in rank order; groups ordered by the other coordinates (tp, cp, dp, pp)."""
        axes = {a.value for a in (axis if isinstance(axis, tuple) else (axis,))}
        others = [a.value for a in Axis if a.value not in axes]
        groups: dict[tuple[int, ...], list[int]] = {}
        for r in range(self.world):
            c = self.coords(r)
            groups.setdefault(tuple(getattr(c, a) for a in others), []).append(r)
        out = [groups[k] for k in sorted(groups)]
        size = 1
        for a in axes:
            size *= getattr(self, a)
        assert all(len(g) == size for g in out)  # internal invariant, not user input
        return out

    def embedding_group_ranks(self) -> list[list[int]]:
        """First and last pipeline stage of each pipeline: they hold the two copies of a tied
        embedding (input embedding on stage 0, LM head on stage pp-1) and sum their gradients."""
        return [[g[0], g[-1]] if len(g) > 1 else [g[0]] for g in self.group_ranks(Axis.PP)]

    def group_of(self, axis: Axis | tuple[Axis, ...], rank: int) -> list[int]:
        return next(g for g in self.group_ranks(axis) if rank in g)


def validate_model_dims(dims: ParallelDims, num_heads: int, num_kv_heads: int, num_layers: int,
                        ffn_hidden_size: int | None = None) -> None:
    """Check that a model can be split over `dims`; each failure names the flag and the fix. The trainer
    (hybrid/train/args.check_args) and `hybrid checkpoint inspect --world-size` both ask this."""
    if num_heads % dims.tp != 0:
        raise ValueError(f"--tensor-model-parallel-size {dims.tp} does not divide the {num_heads} attention heads; "
                         f"use a divisor of {num_heads}")
    if num_kv_heads % dims.tp != 0 and dims.tp % num_kv_heads != 0:
        raise ValueError(f"--tensor-model-parallel-size {dims.tp} and the {num_kv_heads} key/value heads must divide "
                         f"one another (kv-heads are split, or replicated when tp exceeds them)")
    if ffn_hidden_size is not None and ffn_hidden_size % dims.tp != 0:
        # the MLP's first projection is column-parallel, its second row-parallel: an even split of the FFN size
        raise ValueError(f"--tensor-model-parallel-size {dims.tp} does not divide the FFN size {ffn_hidden_size}; "
                         f"use a divisor of {ffn_hidden_size}")
    if num_layers < dims.pp:
        raise ValueError(f"--pipeline-model-parallel-size {dims.pp} exceeds the {num_layers} layers; "
                         f"use at most {num_layers} stages")


def default_backend() -> tuple[str, torch.device]:
    """NCCL + the local CUDA device when present, gloo + CPU otherwise; HYBRID_BACKEND/HYBRID_DEVICE override.
    A typo'd value is a ValueError naming the variable (hybrid/launch.check_launch asks before any process group:
    "cpux" was torch's RuntimeError, "glo" an AssertionError inside init_process_group)."""
    backend = os.environ.get("HYBRID_BACKEND")
    device = os.environ.get("HYBRID_DEVICE")
    if device is None:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"HYBRID_DEVICE={device!r} is not a device; give cpu or cuda:N, or unset it") from None
    if dev.type not in ("cpu", "cuda") or (dev.type == "cuda" and not torch.cuda.is_available()):
        have = "cpu or cuda:N" if torch.cuda.is_available() else "cpu (this machine has no CUDA)"
        raise ValueError(f"HYBRID_DEVICE={device!r}: hybrid runs on {have}; give that, or unset it")
    if backend is None:
        backend = "nccl" if dev.type == "cuda" else "gloo"
    if backend not in ("gloo", "nccl") or (backend == "nccl" and dev.type != "cuda"):
        raise ValueError(f"HYBRID_BACKEND={backend!r} with device {device}: give gloo (any device) or nccl (CUDA), "
                         f"or unset it")
    return backend, dev


@dataclass
class Mesh:
    """This rank's view of the layout: its coordinates and one `Group` per axis.

    Build with `Mesh.build(dims)` after `torch.distributed.init_process_group`, or `Mesh.single()`
    for one process (every group of size 1; collectives are no-ops).
    """

    dims: ParallelDims
    rank: int
    tp: Group
    dp: Group
    pp: Group
    embedding: Group
    device: torch.device
    ledger: CommLedger = field(default_factory=CommLedger)
    cp: Group | None = None  # context parallel (None: a solo group, cp = 1)
    dp_cp: Group | None = None  # DP x CP, where gradients are reduced and ZeRO shards (None: the DP group)
    world: Group | None = None  # every rank: start-up and logging collectives (node ids, timeline, memory peaks)
    ep: Group | None = None  # MoE: the expert-parallel group (hybrid/moe/parallel.py); None for a dense model
    edp: Group | None = None  # MoE: the expert-data-parallel group, over which expert gradients are reduced
    etp: Group | None = None  # MoE: the expert-tensor-parallel group, splitting each expert's width
    tp_cp: Group | None = None  # MoE with TP (+ SP) x CP: the ranks one micro-batch's tokens are spread over,
    #                             where the routing counts are summed (Megatron's tp_cp_group); None otherwise

    def __post_init__(self) -> None:
        if self.cp is None:
            self.cp = Group.solo("cp", self.ledger)
        if self.dp_cp is None:
            self.dp_cp = self.dp
        if self.world is None:
            self.world = Group.solo("world", self.ledger)

    @property
    def expert_dp(self) -> Group:
        """The group expert parameters are replicated (and ZeRO-sharded) over: edp, or dp_cp without MoE."""
        return self.edp if self.edp is not None else self.dp_cp

    @property
    def coords(self) -> Coords:
        return self.dims.coords(self.rank)

    @property
    def is_first_stage(self) -> bool:
        return self.coords.pp == 0

    @property
    def is_last_stage(self) -> bool:
        return self.coords.pp == self.dims.pp - 1

    @classmethod
    def single(cls, device: torch.device | str = "cpu", ledger: CommLedger | None = None) -> "Mesh":
        ledger = ledger or CommLedger()
        solo = {a: Group.solo(a, ledger) for a in ("tp", "dp", "pp", "embedding")}
        return cls(dims=ParallelDims(), rank=0, device=torch.device(device), ledger=ledger, **solo)

    @classmethod
    def build(cls, dims: ParallelDims, device: torch.device | None = None,
              ledger: CommLedger | None = None, timeout: timedelta | None = None,
              expert_groups: dict[str, list[list[int]]] | None = None) -> "Mesh":
        """Create the process groups. Collective: every rank of the world must call it with equal `dims`.
        `timeout` bounds each group's collectives (`--distributed-timeout-minutes`; new_group does not inherit
        init_process_group's timeout, so it is passed on). `expert_groups` (an MoE model's, from
        hybrid.moe.parallel.ExpertLayout.groups: {"ep": ranks of every group, "edp": ...}) adds those groups."""
        if not dist.is_initialized():
            raise RuntimeError("Mesh.build needs torch.distributed.init_process_group first")
        world, rank = dist.get_world_size(), dist.get_rank()
        if world != dims.world:
            raise ValueError(f"layout tp={dims.tp} x cp={dims.cp} x dp={dims.dp} x pp={dims.pp} = {dims.world} ranks, "
                             f"but the world has {world}; fix the sizes or the number of processes")
        ledger = ledger or CommLedger()
        groups = {axis.value: _new_groups(dims.group_ranks(axis), rank, axis.value, ledger, timeout)
                  for axis in Axis}
        groups["embedding"] = _new_groups(dims.embedding_group_ranks(), rank, "embedding", ledger, timeout)
        groups["dp_cp"] = (_new_groups(dims.group_ranks((Axis.CP, Axis.DP)), rank, "dp_cp", ledger, timeout)
                           if dims.cp > 1 else groups["dp"])
        groups["world"] = (Group("world", tuple(range(world)), dist.group.WORLD, ledger) if world > 1
                           else Group.solo("world", ledger))
        for name, ranks in (expert_groups or {}).items():
            groups[name] = _new_groups(ranks, rank, name, ledger, timeout)
        device = device or default_backend()[1]
        return cls(dims=dims, rank=rank, device=device, ledger=ledger, **groups)


def _new_groups(all_ranks: list[list[int]], rank: int, name: str, ledger: CommLedger,
                timeout: timedelta | None = None) -> Group:
    """`new_group` is collective over the whole world, so every rank creates every group and keeps its own."""
    mine = None
    for ranks in all_ranks:
        pg = dist.new_group(ranks, timeout=timeout) if len(ranks) > 1 else None
        if rank in ranks:
            mine = Group(name=name, ranks=tuple(ranks), pg=pg, ledger=ledger)
    if mine is None:  # rank belongs to no group of this kind (cannot happen for the axes)
        mine = Group.solo(name, ledger)
    return mine
