"""NaN/inf guard (Megatron's --check-for-nan-in-loss-and-grad): a non-finite loss or gradient on any
rank makes every rank skip the optimizer step.

Before the optimizer step each rank checks its own loss share and its reduced gradients (for ZeRO,
the gradient shards it will step on), and sets its slot of a world-sized flag vector; one SUM over
TP, PP and DP -- each rank sits in exactly one group per axis, so the three sums are the sum over
the world -- tells every rank the same set of bad ranks. On a bad step nothing is touched:
parameters, master weights and Adam moments keep their values bit for bit, and the next step's
zero_grad discards the gradients. After `max_skipped` consecutive skips the run stops with EXIT_NAN.

Before the first step (`check_weights`) the weights themselves are checked the same way: a checkpoint or
`--load` folder holding NaN/inf would make every step non-finite, so the run stops at once with one line naming
the first such parameter instead of skipping --max-skipped-steps steps.

fp16: a non-finite gradient is the dynamic loss scaler's signal to halve the scale, which
hybrid/zero/engine.py already does (skipping the step on every rank); the guard leaves those steps
to it (loss included: a scaled loss may overflow too) and only counts them toward --max-skipped-steps.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from hybrid.trail import TRAIL
from hybrid.mesh import Mesh

EXIT_NAN = 65  # sysexits EX_DATAERR: the data or the numbers went bad; restarting will not help


class TooManySkippedSteps(SystemExit):
    """--max-skipped-steps consecutive steps had a non-finite loss or gradient."""


def world_sum(mesh: Mesh, t: torch.Tensor, tag: str) -> torch.Tensor:
    """SUM over every rank: over TP, then PP, then DP x CP (the mesh's groups tile the world)."""
    for g in (mesh.tp, mesh.pp, mesh.dp_cp):
        g.all_reduce(t, tag=tag)
    return t


def _grads(optimizer) -> list[tuple[nn.Parameter, torch.Tensor]]:
    """(parameter, this rank's gradient of it) as the optimizer will step on them: a ZeRO
    optimizer's reduced shards by segment, otherwise each parameter's .grad."""
    if hasattr(optimizer, "units"):
        return [(s.param, u.grad_shard[s.lo:s.hi]) for u in optimizer.units for s in u.segments]
    return [(p, p.grad) for g in optimizer.param_groups for p in g["params"] if p.grad is not None]


def _all_finite(optimizer) -> bool:
    """Every gradient finite, checked over a ZeRO optimizer's flat shards (a few large tensors, one host read;
    their padding is zeros) -- False also when there are no flat shards to check, so the caller looks closer."""
    flats = [u.grad_shard for u in getattr(optimizer, "units", ())]
    if not flats:
        return False
    return bool(torch.stack([torch.isfinite(f).all() for f in flats]).all())


def _masters(optimizer) -> list[tuple[nn.Parameter, torch.Tensor]]:
    """(parameter, this rank's fp32 master values of it): a ZeRO optimizer's master shards by segment (under
    ZeRO 3 the parameters themselves hold no data between steps), otherwise each parameter."""
    if hasattr(optimizer, "units"):
        return [(s.param, u.views[i]) for u in optimizer.units for i, s in enumerate(u.segments) if u.views]
    return [(p, p.detach()) for g in optimizer.param_groups for p in g["params"]]


class NanGuard:
    """Decides, with one world-wide flag exchange, whether this step's update is applied."""

    def __init__(self, mesh: Mesh, model: nn.Module, max_skipped: int, defer_grads: bool = False):
        self.mesh, self.max_skipped, self.defer_grads = mesh, max_skipped, defer_grads
        self.order = {id(p): (i, n) for i, (n, p) in enumerate(model.named_parameters())}
        self.consecutive = 0
        self.skipped: list[int] = []  # iterations skipped

    def first_non_finite(self, loss: torch.Tensor | None, optimizer) -> str | None:
        """'loss', the name of the first parameter (model order) whose gradient is not finite, or None."""
        if loss is not None and not torch.isfinite(loss).all():
            return "loss"
        if _all_finite(optimizer):  # the common case, without a device synchronisation per parameter
            return None
        bad = [p for p, g in _grads(optimizer) if not torch.isfinite(g).all()]
        if not bad:
            return None
        return f"gradient of {min(self.order.get(id(p), (1 << 30, '?')) for p in bad)[1]}"

    def first_non_finite_weight(self, optimizer) -> str | None:
        """The name of the first parameter (model order) whose master weights are not finite on this rank."""
        bad = [p for p, w in _masters(optimizer) if not torch.isfinite(w).all()]
        return min(self.order.get(id(p), (1 << 30, "?")) for p in bad)[1] if bad else None

    def check_weights(self, optimizer) -> None:
        """Before the first step: every rank's weights finite, or SystemExit(EXIT_NAN) on every rank with one
        line (from the lowest rank holding a non-finite weight, which names it)."""
        from hybrid.cliutil import record_error
        what = self.first_non_finite_weight(optimizer)
        flags = torch.zeros(self.mesh.dims.world, device=self.mesh.device)
        flags[self.mesh.rank] = 1.0 if what else 0.0
        bad = world_sum(self.mesh, flags, "nan").nonzero().flatten().tolist()
        if not bad:
            return
        line = (f"train.py: error: nan-guard: the weights at the start of training are not finite ("
                f"{what + ' on rank ' + str(self.mesh.rank) if what else 'on ranks ' + str(bad)}; non-finite on ranks "
                f"{bad}): the --load checkpoint or folder holds NaN/inf; load an earlier checkpoint")
        record_error(line)
        if self.mesh.rank == bad[0]:
            import sys
            print(line, file=sys.stderr, flush=True)
        raise TooManySkippedSteps(EXIT_NAN)

    def step_is_finite(self, loss: torch.Tensor | None, optimizer, iteration: int) -> bool:
        if self.defer_grads:  # fp16: the loss scaler decides (a scaled loss or gradient may overflow)
            return True
        what = self.first_non_finite(loss, optimizer)
        flags = torch.zeros(self.mesh.dims.world, device=self.mesh.device)
        flags[self.mesh.rank] = 1.0 if what else 0.0
        bad_ranks = world_sum(self.mesh, flags, "nan").nonzero().flatten().tolist()
        if not bad_ranks:
            return True
        self.consecutive += 1
        self.skipped.append(iteration)
        if what:
            print(f"nan-guard: iteration {iteration}: rank {self.mesh.rank}: non-finite {what}", flush=True)
        if self.mesh.rank == 0:
            print(f"nan-guard: iteration {iteration}: skipped the step on every rank (non-finite on ranks "
                  f"{bad_ranks}; {self.consecutive} consecutive)", flush=True)
        return False

    def after_step(self, optimizer, iteration: int, applied: bool) -> None:
        """Count the step; stop the run after max_skipped consecutive skips (ours or fp16's)."""
        if applied:  # else step_is_finite counted it already
            report = getattr(optimizer, "last_report", None)
            fp16_skip = self.defer_grads and report is not None and report.skipped
            self.consecutive = self.consecutive + 1 if fp16_skip else 0
        if self.consecutive >= self.max_skipped:
            msg = (f"nan-guard: {self.consecutive} consecutive steps skipped at iteration {iteration} "
                   f"(--max-skipped-steps {self.max_skipped}); stopping with exit code {EXIT_NAN}")
            if self.mesh.rank == 0:
                print(msg, flush=True)
            from hybrid.cliutil import record_error
            record_error(f"train.py: error: {msg}")  # torchrun's summary shows it
            raise TooManySkippedSteps(EXIT_NAN)


class GuardedOptimizer:
    """The optimizer as train_step sees it: `step()` asks the guard (None: the guard is off) first. Everything else
    (begin_step, finish_backward, param_groups, loss_scale, ...) is the wrapped optimizer's."""

    def __init__(self, inner, guard: NanGuard | None, runner: "GuardedRunner"):
        self.inner, self.guard, self.runner = inner, guard, runner
        self.iteration = 0
        self.applied = True

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step(self):
        TRAIL.enter("optimizer")
        self.applied = self.guard is None or self.guard.step_is_finite(self.runner.last_loss, self.inner, self.iteration)
        if self.applied:
            return self.inner.step()
        if hasattr(self.inner, "last_report"):  # what the log line reads: a skipped step has no norm
            from hybrid.zero.engine import StepReport
            self.inner.last_report = StepReport(grad_norm=None, skipped=True, loss_scale=self.inner.loss_scale)
        return None


class GuardedRunner:
    """Keeps the last forward/backward's loss share for the guard."""

    def __init__(self, inner):
        self.inner = inner
        self.last_loss: torch.Tensor | None = None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward_backward(self, batches):
        self.last_loss = self.inner.forward_backward(batches)
        return self.last_loss
