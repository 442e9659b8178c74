"""What the training loop holds: the watchdog, the NaN guard, the straggler report and the injector,
wired to one rank's mesh, model, runner and optimizer.

    ft = FaultTolerance.start(args.fault, mesh, model, runner, optimizer, args.log_interval)
    for it in range(iters):
        ft.begin_iteration(it)
        loss = train_step(model, batches, ft.optimizer, mesh, lr=..., runner=ft.runner)
        ft.end_iteration(it)
    ft.stop()

The training step itself is unchanged: the guard sits in front of `optimizer.step()` (GuardedOptimizer)
and everything else only observes the op trail.
"""

from __future__ import annotations

import torch.nn as nn

from hybrid.fault import nodes
from hybrid.fault.args import FaultConfig
from hybrid.fault.inject import Injector, faults_for
from hybrid.fault.nan_guard import GuardedOptimizer, GuardedRunner, NanGuard
from hybrid.fault.straggler import StragglerReport
from hybrid.trail import TRAIL
from hybrid.fault.watchdog import HangWatchdog
from hybrid.mesh import Mesh


class FaultTolerance:
    def __init__(self, cfg: FaultConfig, mesh: Mesh, model: nn.Module, runner, optimizer, log_interval: int,
                 timing_every: int = 1):
        from hybrid.pipeline.executor import PipelineExecutor
        from hybrid.zero import Precision

        self.cfg, self.mesh, self.model, self.log_interval = cfg, mesh, model, log_interval
        TRAIL.reset()
        self.injector = Injector(faults_for(mesh.rank))
        TRAIL.on_op_start = self.injector.on_op_start if self.injector else None
        self._mb = 0
        self._local = not isinstance(runner, PipelineExecutor)  # no executor to name phases: hooks do
        for chunk in (model if isinstance(model, nn.ModuleList) else [model]):
            chunk.register_forward_pre_hook(self._before_forward)
            if self._local:
                chunk.register_forward_hook(lambda *_: TRAIL.enter("backward"))
        self.runner = GuardedRunner(runner)
        self.guard = None
        if cfg.check_nan:
            precision = getattr(getattr(optimizer, "cfg", None), "precision", None)
            self.guard = NanGuard(mesh, model, cfg.max_skipped_steps, defer_grads=precision is Precision.FP16)
        self.optimizer = GuardedOptimizer(optimizer, self.guard, self.runner)
        self.straggler = StragglerReport(mesh, cfg.straggler_factor)
        self.timing_every = timing_every  # print the report every this many log intervals (or when off)
        self._first: int | None = None  # the first iteration of the interval (a resumed run's is not 1)
        self._intervals = 0
        self._skipped = False  # a step of this interval was skipped (NaN guard or fp16 overflow)
        self.watchdog = None
        if cfg.watchdog_timeout > 0 and mesh.dims.world > 1:
            self.watchdog = HangWatchdog(mesh.rank, mesh.dims.world, cfg.watchdog_timeout).start()

    @classmethod
    def start(cls, cfg: FaultConfig, mesh: Mesh, model: nn.Module, runner, optimizer,
              log_interval: int, timing_every: int = 1) -> "FaultTolerance":
        """Collective (gathers node ids). Rank 0 prints the node layout."""
        line = nodes.describe(mesh.dims, mesh.world)
        if mesh.rank == 0:
            print(line, flush=True)
        return cls(cfg, mesh, model, runner, optimizer, log_interval, timing_every)

    def _before_forward(self, module, args) -> None:
        if self._local:  # one forward per micro-batch
            TRAIL.enter("forward", self._mb)
            self._mb += 1
        self.injector.on_forward()

    def check_weights(self) -> None:
        """Before the first step (collective): the NaN guard's check of the loaded or initial weights."""
        if self.guard is not None:
            self.guard.check_weights(self.optimizer.inner)

    def begin_iteration(self, it: int) -> None:
        """`it` 0-based, as the loop counts; the trail and every message use it + 1, as the log does."""
        self._mb = 0
        if self._first is None:
            self._first = it + 1
        TRAIL.begin_iteration(it + 1)
        self.injector.begin_iteration(it + 1, self.model)
        self.optimizer.iteration = it + 1
        if self.watchdog:
            self.watchdog.armed = True

    def end_iteration(self, it: int) -> None:
        """Collective every log interval (straggler table); raises TooManySkippedSteps (exit 65)."""
        if self.watchdog:
            self.watchdog.armed = False
        self.straggler.record(TRAIL.take_phase_seconds())
        report = getattr(self.optimizer.inner, "last_report", None)
        applied = self.optimizer.applied  # False: the NaN guard skipped it; else fp16's overflow check may have
        self._skipped |= not applied or bool(getattr(report, "skipped", False))
        if (it + 1) % self.log_interval == 0:
            lines = self.straggler.report(self._first, it + 1)  # collective: every interval, printed or not
            self._intervals += 1
            if self.straggler.named or self._skipped or self._intervals % self.timing_every == 0:
                for line in lines:
                    print(line, flush=True)
            self._first, self._skipped = it + 2, False
        if self.guard is not None:
            self.guard.after_step(self.optimizer.inner, it + 1, self.optimizer.applied)

    def state_dict(self) -> dict[str, object]:
        """The NaN guard's counters as a Stateful (hybrid/stateful.py): the iterations it skipped and the current
        run of consecutive skips, so a resumed run stops at --max-skipped-steps where an uninterrupted one would.
        The same on every rank (the guard's verdict is collective)."""
        if self.guard is None:
            return {}
        return {"nan_skipped": list(self.guard.skipped), "nan_consecutive": self.guard.consecutive}

    def load_state_dict(self, state: dict[str, object]) -> None:
        if self.guard is not None and "nan_consecutive" in state:
            self.guard.skipped, self.guard.consecutive = list(state["nan_skipped"]), state["nan_consecutive"]

    def stop(self) -> None:
        if self.watchdog:
            self.watchdog.stop()
        TRAIL.on_op_start = None
