"""Runs one pipeline rank's action list (from `build_schedule`) on real chunks of a model.

The executor knows no schedule: it walks the list. Compute actions run one chunk's forward or
backward for one micro-batch; each maximal run of communication actions is posted as one
`batch_isend_irecv` over the pipeline group and NOT waited for as a whole (lazy waits, Megatron's
overlap_p2p_comm): a receive is waited for just before the compute that reads it, a send at the end of
the step (or earlier, once it has completed, to free its buffer). A compute therefore waits only for its
own input, and a rank never blocks on a neighbour that has not yet posted a receive it will need later:
this is what lets the interleaved schedule reach its (p - 1)/v bubble when the backward costs more than
the forward, and removes GPipe's send waits (`simulate(..., Transfer.LAZY)` models exactly this).
It cannot deadlock where the blocking execution would not: every wait here is a subset of what a
blocking batch waits for, at the same point of the list or later. Payload shapes are fixed -- one
micro-batch's hidden states, (b, s, h) or (b, s/t, h) under sequence parallelism -- so receives
allocate their buffers with no shape handshake.

Memory: once a chunk's output activation has been sent, the executor drops it (Megatron's
deallocate_output_tensor): backward needs only the autograd graph behind it, not its values. The
storage lives on in the pending send until the receiver has taken it; `peak_held_output_bytes` counts
unsent outputs, `peak_sending_bytes` outputs whose send was still in flight. Backward through a freed
output goes straight to the autograd engine, which -- unlike `torch.autograd.backward` -- does not check
that the gradient's shape matches the (now empty) output.

Gradients accumulate over micro-batches in `.grad`; the last stage scales each micro-batch's loss by
1/m, so the result is the gradient of the mean loss, as a single process with accumulation computes.

Zero-bubble lists split a backward into BACKWARD_INPUT (B: the input gradient, sent at once) and a later
BACKWARD_WEIGHT (W: the weight gradients, accumulated into `.grad` through autograd, so post-accumulate-grad
hooks fire in W); `hybrid.pipeline.split_backward` holds the method. Between B and W the executor keeps the
`WeightWork` of that (micro-batch, chunk); `on_weight_hold(tensor, owner, microbatch, chunk)`, when given, is told
of each output gradient kept for W, `owner` being freed once W has run (the memory ledger counts them).

Hand-offs in memory. When the next (or previous) stage of a chunk is on this rank -- pp = 1 with v chunks, or
the turn of the V (`Placement.V`: stages pp - 1 and pp both on rank pp - 1) -- the payload is handed over in
memory, and the lists hold no message for it.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn as nn
from torch.autograd.variable import Variable

from hybrid.comm import Group
from hybrid.cp.data import seq_kwargs
from hybrid.trail import TRAIL
from hybrid.pipeline.schedules import Action, Op, Placement
from hybrid.pipeline.split_backward import WeightWork, backward_input, backward_weight

Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, labels) of one micro-batch (+ a SequenceInfo with packed documents)


@dataclass(frozen=True)
class StageIO:
    """What crosses a stage boundary: one micro-batch's hidden states."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32


@dataclass
class TimelineEvent:
    """One action as it ran on this rank (wall-clock seconds, so ranks line up), for timelines."""

    name: str
    microbatch: int
    chunk: int
    start: float
    end: float


@dataclass
class _StepState:
    inputs: dict = field(default_factory=dict)     # (mb, chunk) -> chunk input (requires grad)
    outputs: dict = field(default_factory=dict)    # (mb, chunk) -> chunk output, or scaled loss
    received: dict = field(default_factory=dict)   # (op, mb, chunk) -> payload (pp = 1: handed over in memory)
    incoming: dict = field(default_factory=dict)   # (op, mb, chunk) -> (buffer, Work): posted, not yet waited
    sending: list = field(default_factory=list)    # (Work, payload) of sends posted, not yet waited
    grads: dict = field(default_factory=dict)      # (mb, chunk) -> d loss / d input, to send
    weight_work: dict = field(default_factory=dict)  # (mb, chunk) -> WeightWork: B has run, W has not
    loss: torch.Tensor | None = None


def _runs(actions: Sequence[Action]) -> list[list[Action]]:
    """Split a list into single compute actions and maximal runs of communication actions."""
    out: list[list[Action]] = []
    for a in actions:
        if not a.op.is_compute and out and not out[-1][0].op.is_compute:
            out[-1].append(a)
        else:
            out.append([a])
    return out


def _phase(run: list[Action]) -> tuple[str, int]:
    """(phase, micro-batch) of a run, for the op trail: a p2p batch goes by its first send."""
    if run[0].op.is_compute:  # B and W are backward work
        return ("forward" if run[0].op is Op.FORWARD else "backward"), run[0].microbatch
    return "p2p", next((a.microbatch for a in run if a.op.is_send), run[0].microbatch)


def _labels(run: list[Action]) -> tuple[str, ...]:
    """Each send, then each receive of a run, named for the op trail: "send_act of micro-batch 1"."""
    ordered = [a for a in run if a.op.is_send] + [a for a in run if not a.op.is_send]
    return tuple(f"{a.op.value} of micro-batch {a.microbatch}" for a in ordered)


def _free(t: torch.Tensor) -> None:
    """Drop a sent output's storage; its grad_fn (what backward needs) stays."""
    t.data = torch.empty((1,), dtype=t.dtype, device=t.device)


def _held_bytes(st: _StepState) -> int:
    """Bytes of chunk outputs whose data is still held (a freed output keeps a 1-element stub)."""
    return sum(y.numel() * y.element_size() for y in st.outputs.values() if y.numel() > 1)


def _sending_bytes(st: _StepState) -> int:
    """Bytes of sent payloads whose send has not completed (the receiver has not taken them yet)."""
    return sum(t.numel() * t.element_size() for _, t in st.sending)


def _backward(output: torch.Tensor, grad: torch.Tensor | None) -> None:
    """Backward from `output` with incoming gradient `grad`, bypassing the shape check so a freed
    output works (Megatron's custom_backward)."""
    if grad is None:  # the loss
        grad = torch.ones_like(output)
    Variable._execution_engine.run_backward(
        tensors=(output,), grad_tensors=(grad,), keep_graph=False, create_graph=False, inputs=(),
        allow_unreachable=True, accumulate_grad=True)


class PipelineExecutor:
    """Runs `schedule` (this rank's action list) over `chunks` (this rank's model chunks).

    Each chunk is a model built with a `StageLayout`: `chunk.stage.first` holds the embedding (reads
    token ids), `chunk.stage.last` the head and loss. `forward_backward(batches)` returns this rank's
    share of the mean loss (sum over micro-batches of loss/m on the last stage, zero elsewhere).
    """

    def __init__(self, chunks: Sequence[nn.Module], schedule: Sequence[Action], pp: Group, io: StageIO,
                 device: torch.device, on_forward: Callable[[int, int], object] | None = None,
                 record_timeline: bool = False, placement: Placement = Placement.LOOP,
                 on_weight_hold: Callable[[torch.Tensor, object, int, int], None] | None = None):
        self.chunks, self.schedule, self.pp, self.io, self.device = list(chunks), list(schedule), pp, io, device
        self.placement = placement  # which global stage each chunk is: where payloads are handed over in memory
        self.on_forward = on_forward  # context factory (mb, chunk) wrapping each forward, e.g. a memory tag
        self.on_weight_hold = on_weight_hold  # told of each output gradient B keeps for W (see the module doc)
        # called with a chunk before its W runs: ZeRO-3 gathers the chunk's parameters (ZeroOptimizer.gather_chunk)
        self.before_weight: Callable[[nn.Module], None] | None = None
        self.record_timeline = record_timeline
        self.events: list[TimelineEvent] = []
        self.peak_held_output_bytes = 0  # most bytes of unsent chunk outputs held at once, last step
        self.peak_sending_bytes = 0  # most bytes of sent payloads still in flight at once, last step
        self._runs = _runs(self.schedule)

    def forward_backward(self, batches: Sequence[Batch]) -> torch.Tensor:
        st = _StepState(loss=torch.zeros((), device=self.device))
        self.peak_held_output_bytes = self.peak_sending_bytes = 0
        self.events = []  # the timeline of the latest step
        for run in self._runs:
            TRAIL.enter(*_phase(run))  # observed by the hang watchdog and the straggler report
            if run[0].op.is_compute:
                self._compute[run[0].op](run[0], batches, st)
            else:
                t0 = time.time()
                self._communicate(run, st)
                self._record(run, t0)
            self.peak_held_output_bytes = max(self.peak_held_output_bytes, _held_bytes(st))
            self.peak_sending_bytes = max(self.peak_sending_bytes, _sending_bytes(st))
        self._finish_sends(st)
        if st.inputs or st.outputs or st.received or st.incoming or st.grads or st.weight_work:
            raise RuntimeError("pipeline schedule left work undone: "
                               f"{list(st.inputs)} {list(st.outputs)} {list(st.received)} {list(st.incoming)} "
                               f"{list(st.grads)} {list(st.weight_work)}")
        return st.loss

    @property
    def _compute(self) -> dict[Op, Callable]:
        return {Op.FORWARD: self._forward, Op.BACKWARD: self._backward_step,
                Op.BACKWARD_INPUT: self._backward_input, Op.BACKWARD_WEIGHT: self._backward_weight}

    def _local_neighbour(self, chunk: int, step: int) -> int | None:
        """The local chunk holding the stage `step` (+1 / -1) away from `chunk`, when it is on this rank."""
        pp = max(self.pp.size, 1)
        rank = self.pp.rank
        target = self.placement.stage(rank, chunk, pp) + step
        peer, peer_chunk = self.placement.rank_chunk(target, pp)
        return peer_chunk if peer == rank else None

    def _record(self, run: list[Action], t0: float, name: str | None = None) -> None:
        if self.record_timeline:
            end = time.time()
            for a in run:
                self.events.append(TimelineEvent(name or a.op.value, a.microbatch, a.chunk, t0, end))

    def _take(self, a: Action, op: Op, st: _StepState) -> torch.Tensor:
        """The payload `a` consumes: handed over in memory (pp = 1) or received -- waited for only now.
        The wait shows on the timeline as a "wait" event of the consuming action."""
        key = (op, a.microbatch, a.chunk)
        if key in st.received:
            return st.received.pop(key)
        buf, work = st.incoming.pop(key)
        t0 = time.time()
        work.wait()
        self._record([a], t0, name="wait")
        return buf

    def _finish_sends(self, st: _StepState) -> None:
        """End of the step: wait for every send still in flight (its receiver has posted by now or will)."""
        t0 = time.time()
        for work, _ in st.sending:
            work.wait()
        if st.sending:
            self._record([Action(Op.SEND_ACT, -1)], t0, name="wait")
        st.sending.clear()

    def _reap_sends(self, st: _StepState) -> None:
        """Drop sends that have completed, so their payloads are freed before the end of the step."""
        if st.sending:
            still = [(w, t) for w, t in st.sending if not w.done()]
            for w, _ in st.sending:
                if w.done():
                    w.wait()  # returns at once; closes its op-trail record
            st.sending[:] = still

    def _forward(self, a: Action, batches: Sequence[Batch], st: _StepState) -> None:
        chunk, key = self.chunks[a.chunk], (a.microbatch, a.chunk)
        inputs, labels, *info = batches[a.microbatch]  # info: the micro-batch's SequenceInfo (hybrid/cp/data.py)
        x = inputs.to(self.device) if chunk.stage.first else self._take(a, Op.RECV_ACT, st).requires_grad_()
        t0 = time.time()
        with self.on_forward(*key) if self.on_forward else nullcontext():
            y = chunk(x, labels.to(self.device) if chunk.stage.last else None, **seq_kwargs(info, self.device))
        if chunk.stage.last:
            y = y / len(batches)
            st.loss += y.detach()
        elif (nxt := self._local_neighbour(a.chunk, +1)) is not None:  # next stage on this rank: in memory
            st.received[(Op.RECV_ACT, a.microbatch, nxt)] = y.detach()
        st.inputs[key], st.outputs[key] = x, y
        self._record([a], t0)

    def _backward_step(self, a: Action, batches: Sequence[Batch], st: _StepState) -> None:
        chunk, key = self.chunks[a.chunk], (a.microbatch, a.chunk)
        x, y = st.inputs.pop(key), st.outputs.pop(key)
        grad = None if chunk.stage.last else self._take(a, Op.RECV_GRAD, st)
        t0 = time.time()
        _backward(y, grad)
        self._record([a], t0)
        if not chunk.stage.first:
            self._pass_back(a, x.grad, st)

    def _pass_back(self, a: Action, dx: torch.Tensor, st: _StepState) -> None:
        """d loss / d input of (mb, chunk): to the previous stage's chunk in memory, or kept for SEND_GRAD."""
        prev = self._local_neighbour(a.chunk, -1)
        if prev is not None:
            st.received[(Op.RECV_GRAD, a.microbatch, prev)] = dx
        else:
            st.grads[(a.microbatch, a.chunk)] = dx

    def _backward_input(self, a: Action, batches: Sequence[Batch], st: _StepState) -> None:
        """B: the input gradient now (sent or handed over); what W needs is kept (first stage: everything)."""
        chunk, key = self.chunks[a.chunk], (a.microbatch, a.chunk)
        x = st.inputs.pop(key)
        grad = None if chunk.stage.last else self._take(a, Op.RECV_GRAD, st)
        t0 = time.time()
        # no local reference to the output: once B returns, the graph above W's nodes (e.g. the loss's) is freed
        dx, work = backward_input(st.outputs.pop(key), grad, None if chunk.stage.first else x,
                                  list(chunk.parameters()), _backward)
        self._record([a], t0)
        st.weight_work[key] = work
        if self.on_weight_hold is not None:
            for g in work.held_grads():
                self.on_weight_hold(g, work, a.microbatch, a.chunk)
        if not chunk.stage.first:
            self._pass_back(a, dx, st)

    def _backward_weight(self, a: Action, batches: Sequence[Batch], st: _StepState) -> None:
        """W: the weight gradients of (mb, chunk), accumulated into .grad; then its graph is released."""
        work: WeightWork = st.weight_work.pop((a.microbatch, a.chunk))
        t0 = time.time()
        if self.before_weight is not None:
            self.before_weight(self.chunks[a.chunk])
        backward_weight(work, _backward)
        self._record([a], t0)

    def _communicate(self, run: list[Action], st: _StepState) -> None:
        """Post the run's sends and receives as one batch; wait for none of them here (see the module doc)."""
        self._reap_sends(st)
        sends, recvs, keys, sent_outputs = [], [], [], []
        for a in run:
            key = (a.microbatch, a.chunk)
            if a.op is Op.SEND_ACT:
                sends.append((st.outputs[key].detach().contiguous(), a.peer))  # SP outputs are strided views
                sent_outputs.append(st.outputs[key])
            elif a.op is Op.SEND_GRAD:
                sends.append((st.grads.pop(key).contiguous(), a.peer))
            else:
                recvs.append((torch.empty(self.io.shape, dtype=self.io.dtype, device=self.device), a.peer))
                keys.append((a.op, *key))
        works = self.pp.batch_p2p_async(sends, recvs, labels=_labels(run))
        st.sending.extend(zip(works[:len(sends)], (t for t, _ in sends)))
        st.incoming.update((k, (buf, w)) for k, (buf, _), w in zip(keys, recvs, works[len(sends):]))
        for y in sent_outputs:
            _free(y)  # the pending send keeps the payload's storage until it completes
