"""train_step reduces the step's loss before the optimizer step, so ZeRO 1-2's parameter all-gathers (posted by the
step, waited in the next forward) are the last collectives a step posts on the DP group.

A collective posted after the gathers on the same group completes after them: gloo sends a pair's messages in
order, NCCL runs a communicator's kernels in order. Before round 11 train_step all-reduced the loss after the step
and so waited for every gather at the end of the step, where nothing overlapped them (docs/zero.md; the PhaseClock
in docs/results/bench_zero_ddp.md showed ~105 ms a step there). One process, stub groups and a stub optimizer
that record the order of calls: fails if the loss reduction moves back after `step()`, and checks the value
returned is still the global mean (sum over DP, divided by the loss scale and the DP size).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from hybrid.train_step import train_step


class _Group:
    def __init__(self, name: str, size: int, events: list, add: float = 0.0) -> None:
        self.name, self.size, self.events, self.add = name, size, events, add

    def all_reduce(self, t: torch.Tensor, tag: str = "") -> torch.Tensor:
        self.events.append(f"all_reduce {self.name}:{tag}")
        return t.add_(self.add)  # the other ranks' share of the sum


class _Mesh:
    def __init__(self, events: list) -> None:
        self.device = torch.device("cpu")
        self.pp = _Group("pp", 1, events)
        self.dp = self.dp_cp = _Group("dp", 2, events, add=3.0)  # the other DP rank's loss: 3.0 (x the scale)
        self.tp = _Group("tp", 1, events)


class _ZeroLike:
    """What train_step calls on a ZeroOptimizer; `step` stands for the write-back that posts the gathers."""

    def __init__(self, events: list, model: nn.Module) -> None:
        self.events, self.loss_scale = events, 1.0
        self.param_groups = [{"params": list(model.parameters()), "lr": 0.0}]

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def begin_step(self, m: int) -> None:
        self.events.append("begin_step")

    def finish_backward(self, model, mesh) -> None:
        self.events.append("finish_backward")

    def step(self) -> None:
        self.events.append("step (posts the parameter all-gathers)")


class _Runner:
    def forward_backward(self, batches) -> torch.Tensor:
        return torch.tensor(1.0)  # this rank's loss


def test_train_step_reduces_the_loss_before_the_step_posts_the_gathers():
    events: list[str] = []
    model = nn.Linear(2, 2)
    mesh = _Mesh(events)
    loss = train_step(model, [(torch.zeros(1), torch.zeros(1))], _ZeroLike(events, model), mesh, runner=_Runner())
    assert events == ["begin_step", "finish_backward", "all_reduce pp:metrics", "all_reduce dp:metrics",
                      "step (posts the parameter all-gathers)"]
    assert loss == (1.0 + 3.0) / 2  # the mean over the two DP ranks' losses
