"""1-bit Adam's scheme with PowerSGD in place of the signs: Adam up to the freeze, then the variance frozen and each
rank's *momentum* all-reduced as rank-r PowerSGD factors (`--optimizer onebit-adam --onebit-compressor powersgd
--powersgd-rank R`; docs/comm-efficient.md, "PowerSGD r = 4 on the momentum").

Why: PowerSGD of the gradient with Adam after it (torch's hook) misses AdamW by 12-18 % at r = 4 on the bench; Adam
normalises each coordinate by a v that the compressed gradient feeds, and error compensation does not commute with
that nonlinearity (Tang et al. 2021, Sec. 3). 1-bit Adam freezes v first, so the update is linear in the momentum,
and compresses the momentum with error feedback. Their analysis allows any compressor C with error compensation;
this is C = PowerSGD (Vogels et al. 2019) -- the arithmetic of hybrid/compress/powersgd.py's `reduce_bucket`,
torch's hook, applied to the momentum buffer of each engine unit:

    steps < freeze:  AdamW (no bias correction, as DeepSpeed's 1-bit Adam), gradient all-reduced exactly
    steps >= freeze: m_i = b1 m~ + (1 - b1) g_i          g_i this rank's own gradient; m~ last step's reduced m
                     M'_i = m_i + e_i;  P = orth(sum_i M'_i Q);  Q = (sum_i M'_i^T P) / n;  m~ = P Q^T
                     e_i = M'_i - m~                        (worker error feedback; Q warm-started)
                     1-D tensors and small matrices (n m <= 2 r (n + m)): the exact mean, no residual
                     p -= lr (m~ / (sqrt(v_freeze) + eps) + wd p)

No server-side error feedback: 1-bit Adam needs one because its server compresses the averaged chunks a second time;
here P and Q are summed exactly by all-reduces and every rank decompresses the same m~ = P Q^T, so nothing is
compressed twice. Bytes per step after the freeze, on the ledger: 4 (sum over compressed matrices of r (n + m) +
the uncompressed elements) -- the gradient PowerSGD's r-(n + m) bytes (powersgd.bucket_elements), now carrying the
momentum.

The optimizer is 1-bit Adam's (onebit.OneBitAdam, unchanged); only its `all_reduce_momentum` is this class's. The
checkpoint holds the PowerSGD state keyed by parameter as PowerSGD's (state.PowerSGDCheckpoint) under its own keys
(`momentum_powersgd.*`), so a gradient-PowerSGD or sign 1-bit Adam checkpoint is never read as this one's.
"""

from __future__ import annotations

import dataclasses

import torch

from hybrid.compress.link import SimulatedLink
from hybrid.compress.powersgd import PowerSGDConfig, PowerSGDState, reduce_bucket
from hybrid.compress.reduction import OneBitAdamReduction, bind_powersgd
from hybrid.compress.state import PowerSGDCheckpoint

COUNTERS = "momentum_powersgd"


class MomentumCheckpoint(PowerSGDCheckpoint):
    """PowerSGD's per-parameter checkpoint (error feedback of the momentum, warm-start Q, the step count) under the
    `momentum_powersgd` keys."""

    keys = ("momentum_powersgd.error/", "momentum_powersgd.q/", COUNTERS)

    def before_load(self, plain: dict) -> None:
        other = [k for k in ("powersgd", "onebit") if k in plain]
        if COUNTERS not in plain and other:
            from hybrid.cliutil import fail  # every rank reads the same values: one line, no traceback
            flag = "--powersgd-rank (on the gradient)" if other[0] == "powersgd" else "--onebit-compressor sign"
            raise fail(f"train.py: error: --onebit-compressor powersgd: the checkpoint holds the state of {flag}, "
                       f"another compressor; resume it with that compressor's flags")
        super().before_load(plain)


class MomentumPowerSGDReduction(OneBitAdamReduction):
    """OneBitAdamReduction (warm-up, frozen variance, the momentum folded in and all-reduced by the optimizer) with
    PowerSGD of rank r as the momentum's compressed all-reduce. The PowerSGD state's step count is the reduction's
    (`start_iter` = the freeze), so the checkpoint's counters are PowerSGD's."""

    def __init__(self, freeze: int, cfg: PowerSGDConfig, layout: tuple[int, int, int],
                 link: SimulatedLink | None = None) -> None:
        super().__init__(freeze, layout, link)
        self.state = PowerSGDState(dataclasses.replace(cfg, start_iter=freeze))
        self.dtype = torch.float32  # the momentum's (OneBitAdam keeps it in fp32)

    def bind(self, units: list, engine) -> None:
        """As PowerSGDReduction.bind: what the checkpoint keys the state by (names, tied twins, DP and TP rank)."""
        bind_powersgd(self, units, engine)
        self.checkpoint = MomentumCheckpoint(self)

    def build_optimizer(self, engine, groups: list[dict], lr: float, betas: tuple[float, float], eps: float):
        opt = super().build_optimizer(engine, groups, lr, betas, eps)
        self.worker.clear(), self.server.clear()  # the sign compressor's residuals: not used here
        return opt

    def all_reduce_momentum(self, i: int, m: torch.Tensor, numel: int) -> None:
        """Unit i's momentum (fp32, padded) replaced by the DP mean of its PowerSGD approximation, in place; the
        padding stays zero (never sent)."""
        if self.group.size == 1:
            return
        u = self.units[i]
        tensors = [m[off:off + p.numel()].view_as(p) for p, off in zip(u.params, u.offsets)]
        m[numel:].zero_()
        reduce_bucket(self.state, i, m[:numel], tensors, self.group)

    def end_step(self) -> None:
        self.state.iter += 1
        super().end_step()

    # --- checkpoint owner -----------------------------------------------------------------------------------------
    def saved_run(self, state: dict) -> None:
        self.checkpoint.legacy = None  # no first-layout checkpoints of this compressor exist

    def load_state_dict(self, sd: dict[str, object]) -> None:
        self.checkpoint.load_state_dict(sd)
        self.iter = self.state.iter
        self.whole = [not self.sharded] * len(self.whole)  # ZeRO 1-2 loaded the momentum's shard only
