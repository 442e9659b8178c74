"""A chunk's backward in two halves, B (input gradient) now and W (weight gradients) later, for the
zero-bubble schedules (Qi et al. 2024). The method is torch.distributed.pipelining's stage_backward_input /
stage_backward_weight (torch/distributed/pipelining/_backward.py), rewritten on the public GradientEdge API
with one change: W runs through the autograd engine with `inputs=` the weights, so each weight's gradient is
accumulated by its AccumulateGrad node and its post-accumulate-grad hooks fire (the ZeRO engine starts a
unit's gradient reduction from them: after the unit's last W). torch instead adds `weight.grad += dw` by hand.

The graph of one micro-batch through a chunk, from the output y (or the loss) down to the input x and the
weights. An *intermediate* is a node on a path y -> x that some weight's subgraph hangs from: a linear's
AddmmBackward (its mat2 edge leads to the weight through TBackward), a norm's NativeLayerNormBackward.

* B: `torch.autograd.grad(y, x, dy, retain_graph=True)` (without its shape check) runs only the nodes on the paths to x, and each of them
  computes only the outputs those paths need (autograd's needs-input-grad mask: AddmmBackward computes
  dy W, not x^T dy). A pre-hook on every intermediate keeps the gradient arriving there: the output gradient
  of that linear or norm. The graph is retained: W needs the nodes and what they saved.
* W: per group of weights sharing intermediates, the engine runs from those intermediates, fed the kept
  gradients, to the weights: AddmmBackward now computes x^T dy and the bias sum only. The same node, the same
  saved tensors and the same incoming gradient as a full backward: the weight gradients are the same numbers.

Memory. After B, the nodes above the topmost intermediates (e.g. the loss's, holding the logits) are unreachable
and freed; everything from the intermediates down stays until W, plus the kept output gradients. After W the
last references go and the rest is released (`WeightWork` is the only owner).

First stage. Its input is token ids: no input gradient exists, the intermediates cannot be found from x, and
nobody waits for a B. As torch does, B does nothing there and W runs the whole backward.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge
from torch.autograd.variable import Variable

from hybrid.tp.layers import BackwardPart, backward_part

Backward = Callable[[torch.Tensor, torch.Tensor | None], None]  # full backward of (output, output grad)


@dataclass
class _Group:
    """Weights (their AccumulateGrad nodes) and the intermediates their subgraphs hang from."""

    weights: set[Node]
    intermediates: list[Node]
    grads: list[tuple[torch.Tensor | None, ...] | None] = field(default_factory=list)


@dataclass
class WeightWork:
    """What B leaves for W of one (micro-batch, chunk): the groups with their kept output gradients, or (first
    stage) the whole backward to run. Dropping it releases the graph."""

    groups: list[_Group] = field(default_factory=list)
    params: list[torch.Tensor] = field(default_factory=list)
    deferred: tuple[torch.Tensor, torch.Tensor | None] | None = None  # first stage: (output, output grad)

    def held_grads(self) -> list[torch.Tensor]:
        """The output gradients kept for W (their bytes are held between B and W)."""
        return [g for group in self.groups for grads in group.grads if grads for g in grads if g is not None]


def _node_of(t: torch.Tensor) -> Node | None:
    """The node a gradient for `t` flows into: its grad_fn, or a leaf's AccumulateGrad."""
    return get_gradient_edge(t).node if t.requires_grad else None


def _reverse_edges(root: Node) -> dict[Node, list[Node]]:
    """child -> parents over the graph below `root` (parents: the nodes that send it gradients); the keys are in
    breadth-first order from the root, the same on every rank (ids are not)."""
    parents: dict[Node, list[Node]] = collections.defaultdict(list)
    parents[root] = []
    queue, seen = collections.deque([root]), {root}
    while queue:
        node = queue.popleft()
        for child, _ in node.next_functions:
            if child is None:
                continue
            parents[child].append(node)
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return parents


def _upward(starts: Iterable[Node], parents: dict[Node, list[Node]], stop: set[Node]) -> tuple[set[Node], set[Node]]:
    """Nodes reached from `starts` walking towards the output, not passing through `stop`; and the `stop`
    nodes met on the way."""
    seen, met = set(starts), set()
    queue = collections.deque(seen)
    while queue:
        for parent in parents.get(queue.popleft(), ()):
            if parent in stop:
                met.add(parent)
            elif parent not in seen:
                seen.add(parent)
                queue.append(parent)
    return seen, met


def _groups(output: torch.Tensor, x: torch.Tensor, params: Sequence[torch.Tensor]) -> list[_Group]:
    """Weights grouped by shared intermediates (union of overlapping groups), as torch's get_param_groups."""
    parents = _reverse_edges(output.grad_fn)
    rank = {node: k for k, node in enumerate(parents)}
    on_input_path, _ = _upward([_node_of(x)], parents, stop=set())
    groups: dict[Node, _Group] = {}
    for p in params:
        node = _node_of(p)
        if node is None or node not in parents:  # p took no part in this micro-batch
            continue
        _, met = _upward([node], parents, stop=on_input_path)
        group = _Group({node}, sorted(met, key=rank.__getitem__))
        for other in {id(g): g for i in met if (g := groups.get(i)) is not None}.values():
            group.weights |= other.weights
            group.intermediates = sorted(set(group.intermediates) | set(other.intermediates), key=rank.__getitem__)
        for i in group.intermediates:
            groups[i] = group
    return list({id(g): g for g in groups.values()}.values())


def backward_input(output: torch.Tensor, grad: torch.Tensor | None, x: torch.Tensor | None,
                   params: Sequence[torch.Tensor], full: Backward) -> tuple[torch.Tensor | None, WeightWork]:
    """B: d loss / d x, and what W needs. `grad` None: `output` is the loss. `x` None (first stage): nothing runs
    now, W will run `full(output, grad)`."""
    if x is None:
        return None, WeightWork(deferred=(output, grad))
    grad = torch.ones_like(output) if grad is None else grad
    work = WeightWork(groups=_groups(output, x, params), params=list(params))
    handles = []
    for group in work.groups:
        group.grads = [None] * len(group.intermediates)
        for k, node in enumerate(group.intermediates):
            handles.append(node.register_prehook(_keeper(group, k)))
    try:
        # torch.autograd.grad(output, x, grad, retain_graph=True) less its shape check: the executor has freed
        # a sent output's values (only its graph is needed), as for the full backward (Megatron's custom_backward)
        with backward_part(BackwardPart.INPUT):  # TP's fused entry linears skip their weight gradient here
            (dx,) = Variable._execution_engine.run_backward(
                tensors=(output,), grad_tensors=(grad,), keep_graph=True, create_graph=False, inputs=(x,),
                allow_unreachable=True, accumulate_grad=False)
    finally:
        for h in handles:
            h.remove()
    return dx, work


def _keeper(group: _Group, k: int) -> Callable:
    def keep(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
        group.grads[k] = grad_outputs
    return keep


def backward_weight(work: WeightWork, full: Backward) -> None:
    """W: accumulate the weight gradients into .grad through the autograd engine (hooks fire), then drop the
    graph. One engine call per group; within a group whose intermediates feed one another, a pre-hook pins each
    intermediate's gradient to the kept one, so nothing arrives twice (torch's "clamp")."""
    if work.deferred is not None:
        full(*work.deferred)
        work.deferred = None
        return
    nodes = [(_node_of(p), p) for p in work.params if p.requires_grad]
    for group in work.groups:
        _run_group(group, [p for node, p in nodes if node in group.weights])  # in parameter order
    work.groups.clear()


def _run_group(group: _Group, weights: list[torch.Tensor]) -> None:
    roots, grads = [], []
    for node, kept in zip(group.intermediates, group.grads):
        for i, g in enumerate(kept or ()):
            if g is not None:
                roots.append(GradientEdge(node, i))
                grads.append(g)
    if not roots:
        return
    handles = []
    if len(group.intermediates) > 1:
        handles = [node.register_prehook(lambda _, kept=kept: kept)
                   for node, kept in zip(group.intermediates, group.grads)]
    try:
        with backward_part(BackwardPart.WEIGHT):  # ... and their input gradient and its all-reduce here
            torch.autograd.backward(roots, grads, inputs=weights)
    finally:
        for h in handles:
            h.remove()
    group.intermediates, group.grads = [], []
