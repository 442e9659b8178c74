"""Dropout random streams under tensor parallelism (Megatron-LM's model-parallel RNG).

A dropout mask must be drawn from a stream that matches how its tensor is laid out over TP:

* REPLICATED region -- tensors every TP rank holds whole (the residual stream and the embedding
  output without sequence parallelism). Every TP rank must draw the *same* mask, or the replicas
  diverge: the stream is seeded alike on all TP ranks (Megatron's default / "data-parallel" state).
* TENSOR_PARALLEL region -- tensors split over TP (attention probabilities of this rank's heads;
  under sequence parallelism also the residual stream's T/t tokens). Each rank holds different
  elements, which need independent masks: the stream is seeded per TP rank (Megatron's
  "model-parallel-rng", seed + 2718 + tp_rank).

Seeds follow Megatron's `_set_random_seed` / `model_parallel_cuda_manual_seed`: the base seed is
`--seed + 100 * pp_rank` (each pipeline stage's layers get their own streams); both streams are the
same on every data-parallel rank, as in Megatron (DP ranks see different samples).

`fork(region)` swaps the stream into the default generator of the device for the duration of the
block -- as Megatron's `CudaRNGStatesTracker.fork()` -- so fused kernels that draw from the default
generator (SDPA's dropout) use it too; the default generator is restored afterwards. Works for any
device with a default generator (CPU here, CUDA). `get_state()` / `set_state()` give the streams'
positions for a checkpoint; `restored(state)` replays them for activation recomputation.
"""

from __future__ import annotations

import contextlib
import enum
from typing import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

TP_SEED_OFFSET = 2718  # Megatron's: any positive offset separates the two streams
PP_SEED_STRIDE = 100  # Megatron's per-pipeline-stage seed offset


class Region(enum.Enum):
    """Which stream a dropout draws from (see the module docstring)."""

    REPLICATED = "replicated"
    TENSOR_PARALLEL = "tensor-parallel"


def default_generator(device: torch.device) -> torch.Generator:
    """The generator torch's random ops on `device` draw from when given none."""
    if device.type == "cpu":
        return torch.default_generator
    module = getattr(torch, device.type)
    return module.default_generators[device.index if device.index is not None else module.current_device()]


class ParallelRNG:
    """The two dropout streams of one rank, seeded from `seed`, this rank's TP and PP coordinates.

    Example:
        rng = ParallelRNG(seed=1234, tp_rank=mesh.coords.tp, pp_rank=mesh.coords.pp, device=mesh.device)
        with rng.fork(Region.TENSOR_PARALLEL):
            y = F.dropout(x, 0.1)          # a mask of this rank's own
        state = rng.get_state()            # checkpoint it; rng.set_state(state) resumes the streams
    """

    def __init__(self, seed: int, tp_rank: int = 0, pp_rank: int = 0, device: torch.device | str = "cpu"):
        self.seed, self.tp_rank, self.pp_rank = seed, tp_rank, pp_rank
        self.device = torch.device(device)
        self._gens = {r: torch.Generator(self.device).manual_seed(self.stream_seed(r)) for r in Region}

    def stream_seed(self, region: Region) -> int:
        """The seed of `region`'s stream on this rank (Megatron's arithmetic)."""
        base = self.seed + PP_SEED_STRIDE * self.pp_rank
        return base if region is Region.REPLICATED else base + TP_SEED_OFFSET + self.tp_rank

    @contextlib.contextmanager
    def fork(self, region: Region) -> Iterator[None]:
        """Run the block with `region`'s stream as the device's default generator; the stream
        advances by what the block drew, the default generator is left as it was."""
        default, stream = default_generator(self.device), self._gens[region]
        outer = default.get_state()
        default.set_state(stream.get_state())
        try:
            yield
        finally:
            stream.set_state(default.get_state())
            default.set_state(outer)

    def get_state(self) -> dict[str, torch.Tensor]:
        """Every stream's position, keyed by region name (uint8 tensors; save with the checkpoint)."""
        return {r.value: g.get_state() for r, g in self._gens.items()}

    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        """Resume the streams from `get_state()`'s result."""
        missing = {r.value for r in Region} - set(state)
        if missing:
            raise ValueError(f"RNG state lacks the stream(s) {sorted(missing)}; it must come from ParallelRNG.get_state")
        for r, g in self._gens.items():
            g.set_state(state[r.value])

    @contextlib.contextmanager
    def restored(self, state: dict[str, torch.Tensor]) -> Iterator[None]:
        """Run the block from the positions in `state` and go back to the current ones afterwards:
        activation recomputation redraws exactly the masks of the original forward."""
        now = self.get_state()
        self.set_state(state)
        try:
            yield
        finally:
            self.set_state(now)


class RNGState:
    """This rank's generators as a Stateful (hybrid/stateful.py): torch's default CPU generator, the CUDA one when
    in use, and the ParallelRNG dropout streams (when given). Whole tensors of this rank alone -- the checkpoint
    keys them by rank, and restores them on the same layout only (a stream belongs to a (tp, pp) coordinate)."""

    def __init__(self, rng: ParallelRNG | None = None):
        self.rng = rng

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {"torch_cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["torch_cuda"] = torch.cuda.get_rng_state()
        if self.rng is not None:
            out.update(self.rng.get_state())
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        torch.set_rng_state(state["torch_cpu"])
        if "torch_cuda" in state:
            torch.cuda.set_rng_state(state["torch_cuda"])
        if self.rng is not None:
            self.rng.set_state({k: state[k] for k in self.rng.get_state()})


class Dropout(nn.Module):
    """Dropout whose mask comes from one region's stream; the identity in eval mode or at p = 0."""

    def __init__(self, p: float, rng: ParallelRNG, region: Region):
        super().__init__()
        self.p, self.rng, self.region = p, rng, region

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        with self.rng.fork(self.region):
            return F.dropout(x, self.p, training=True)

    def extra_repr(self) -> str:
        return f"p={self.p}, region={self.region.value}"
