"""Model-state and communication accounting for ZeRO, measured and predicted (the paper's formulas).

Memory. `state_ledger(zero)` counts every storage the ZeRO optimizer holds -- parameters (flat
buffers or stage-3 shards), gradients, fp32 master weights, Adam moments -- once, by kind and by
*placement*: "device" (the compute device) or "offload" (host memory chosen by --offload-*). The
placement, not the device type, is the key, so an offloaded tensor is told apart even on a CPU-only
machine where both are "cpu". `paper_state_bytes` gives what ZeRO (Rajbhandari et al. 2020, Sec. 5)
predicts; with mixed precision (b = 2, fp32 master weights) it is

    stage 1: 2 Psi + 2 Psi + 12 Psi / n      stage 2: 2 Psi + 14 Psi / n      stage 3: 16 Psi / n

for this rank's Psi parameters (its TP/PP share: the sum of numel of its model before ZeRO); with fp32
gradients (`accumulate_fp32_grads`) the gradient term is 4 Psi (4 Psi / n at stages 2-3). The
engine pads each flat unit to a multiple of n (< n elements per unit), so what it holds is the
formula at Psi' with Psi <= Psi' <= Psi + (n - 1) x (number of units). In fp32 the master weights
*are* the parameter shard (K = 8).

Communication. `paper_volume(ledger)` converts the CommLedger (nccl-tests sizes S) to the paper's
per-step volume unit: an all-reduce counts 2 S (reduce-scatter + all-gather), a reduce-scatter or
an all-gather S. Per step with one micro-batch the DP group then carries 2 b Psi for stages 0-2
and 3 b Psi for stage 3 (forward all-gather, backward all-gather, gradient reduce-scatter). The
wire bytes per rank are (n-1)/n of that.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from hybrid.comm import CommLedger
from hybrid.measured_memory import ModelStateLedger, StateKind, storage_key
from hybrid.zero.config import ZeroConfig
from hybrid.zero.engine import ZeroOptimizer

DEVICE, OFFLOAD = "device", "offload"


def state_ledger(zero: ZeroOptimizer) -> ModelStateLedger:
    """Bytes per (kind, placement) this rank holds, each storage once (the first kind wins)."""
    entries: dict = defaultdict(int)
    seen: set = set()

    def add(kind: StateKind, t: torch.Tensor | None, offloaded: bool) -> None:
        if t is None:
            return
        key = storage_key(t)
        if key[2] and key not in seen:  # a freed (0-byte) storage holds nothing
            seen.add(key)
            entries[(kind, OFFLOAD if offloaded else DEVICE)] += key[2]

    opt_off, par_off = zero.cfg.offload_optimizer, zero.cfg.offload_params
    for u in zero.units:
        add(StateKind.PARAMETERS, u.flat, False)
        add(StateKind.PARAMETERS, u.shard, par_off)
    for u in zero.units:
        add(StateKind.GRADIENTS, u.flat_grad, False)
        add(StateKind.GRADIENTS, u.grad_shard, False)
        add(StateKind.GRADIENTS, u.full_grad, False)
        for p in u.params:
            add(StateKind.GRADIENTS, p.grad, False)
        add(StateKind.GRADIENTS, u.master_grad, opt_off)
    for u in zero.units:
        add(StateKind.MASTER_WEIGHTS, u.master, opt_off)
    for state in zero.optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                kind = StateKind.OPTIMIZER_SCALARS if value.dim() == 0 else StateKind.OPTIMIZER_STATES
                add(kind, value, opt_off)
    return ModelStateLedger(entries=dict(entries))


def paper_state_bytes(cfg: ZeroConfig, psi: int, dp: int) -> dict[tuple[StateKind, str], int]:
    """ZeRO's model-state formula in bytes per (kind, placement) for `psi` parameters on a rank of a
    data-parallel group of `dp` ranks (a partition over n = dp for stages 1-3, n = 1 for stage 0)."""
    n = dp if cfg.sharded else 1
    b = torch.empty((), dtype=cfg.precision.dtype).element_size()
    opt = OFFLOAD if cfg.offload_optimizer else DEVICE
    out: dict = defaultdict(int)
    out[(StateKind.PARAMETERS, OFFLOAD if cfg.offload_params else DEVICE)] += b * psi // (n if cfg.stage == 3 else 1)
    g = torch.empty((), dtype=cfg.grad_dtype).element_size()  # 4 with accumulate_fp32_grads
    out[(StateKind.GRADIENTS, DEVICE)] += g * psi // (n if cfg.stage >= 2 else 1)
    master_is_shard = cfg.precision.dtype == torch.float32 and cfg.offload_params == cfg.offload_optimizer
    if not master_is_shard:
        out[(StateKind.MASTER_WEIGHTS, opt)] += 4 * psi // n
    out[(StateKind.OPTIMIZER_STATES, opt)] += 8 * psi // n  # Adam: exp_avg + exp_avg_sq, fp32
    return dict(out)


def paper_volume(ledger: CommLedger, group: str = "dp") -> int:
    """Per-step bytes in the paper's unit: 2 S per all-reduce, S per reduce-scatter / all-gather.
    Tagged traffic ("dp:metrics", "dp:clip", "dp:overflow") is not counted."""
    return (2 * ledger.bytes("all_reduce", group) + ledger.bytes("reduce_scatter", group)
            + ledger.bytes("all_gather", group))
