"""Validation: the mean lm loss over `--eval-iters` global batches of the valid (or test) split, forward only,
on any layout, printed as Megatron prints it.

Evaluation e (0, 1, ...) reads split samples [e K G, (e + 1) K G) (K = eval iters, G = global batch): Megatron's
valid iterator continues from one evaluation to the next, and here that position is a function of e alone, so a
resumed run evaluates on the same samples. The periodic evaluation after iteration N is e = N / interval - 1;
the one at the end of training (iteration N, the last) is e = ceil(N / interval) - 1: the periodic one's when N
is a multiple of the interval, the next block otherwise. So "validation loss at iteration N" has one value, and
it is printed once: when the last iteration is a periodic one, the periodic evaluation is left to the final one
(labelled "on validation set"), and a run stopped early (--exit-interval, SIGTERM) at a periodic iteration does
not evaluate it again at the end. (Megatron prints both, on different samples: its iterator has moved on.)

Through a pipeline every micro-batch walks the global stages 0, 1, ..., pp v - 1 in order: the rank holding stage
s (pp rank s mod pp, its chunk s // pp; under zbv's V rank min(s, 2 pp - 1 - s)) receives the activation from stage s - 1, runs the chunk under no_grad and
sends the result on; the last stage's loss is summed over pp and dp. Slower than a schedule but exact and
deadlock-free, and evaluation is a small share of a run.
"""

from __future__ import annotations

import math

import torch

from hybrid.cp.data import TokenSharding, seq_kwargs
from hybrid.data import BatchSpec, DataSource, Split
from hybrid.data.args import DataConfig
from hybrid.mesh import Mesh
from hybrid.pipeline.schedules import Placement


@torch.no_grad()
def forward_loss(chunks, mesh: Mesh, inputs: torch.Tensor, labels: torch.Tensor, io, *info,
                 placement: Placement = Placement.LOOP) -> torch.Tensor:
    """The micro-batch's mean loss on the rank holding the last stage (0 elsewhere); `info`: its SequenceInfo,
    with packed documents; `placement`: which stage each (rank, chunk) holds (the V under zbv)."""
    pp, v = mesh.dims.pp, len(chunks)
    x, loss = None, torch.zeros((), device=mesh.device)
    for s in range(pp * v):
        owner, c = placement.rank_chunk(s, pp)
        if owner != mesh.coords.pp:
            continue
        chunk = chunks[c]
        prev = placement.rank_chunk(s - 1, pp)[0] if s > 0 else owner
        if s == 0:
            x = inputs.to(mesh.device)
        elif prev != owner:  # from another rank
            x = torch.empty(io.shape, dtype=io.dtype, device=mesh.device)
            mesh.pp.batch_p2p([], [(x, prev)], labels=("eval-recv",))
        y = chunk(x, labels.to(mesh.device) if s == pp * v - 1 else None, **seq_kwargs(info, mesh.device))
        if s == pp * v - 1:
            loss = y.float()
        elif (nxt := placement.rank_chunk(s + 1, pp)[0]) != owner:
            mesh.pp.batch_p2p([(y.contiguous(), nxt)], [], labels=("eval-send",))
        else:
            x = y
    return loss


def evaluate(model, mesh: Mesh, data: DataSource, batch: BatchSpec, split: Split, index: int, iters: int,
             io=None, loss_scale: float = 1.0, sharding: TokenSharding = TokenSharding(),
             placement: Placement = Placement.LOOP) -> float:
    """Mean lm loss over `iters` global batches of `split`, evaluation number `index` (same on every rank);
    `sharding` cuts each micro-batch for this CP rank (and packed documents), as training does."""
    chunks = list(model)
    for c in chunks:
        c.eval()
    total = torch.zeros((), device=mesh.device)
    start = index * iters * batch.global_batch
    for k in range(iters):
        for mb in sharding.batches(data.batches(start + k * batch.global_batch, batch, mesh.coords.dp, split)):
            total += forward_loss(chunks, mesh, *mb[:2], io, *mb[2:], placement=placement) / loss_scale  # fp16
    for c in chunks:
        c.train()
    mesh.pp.all_reduce(total, tag="metrics")
    mesh.dp_cp.all_reduce(total, tag="metrics")  # CP: each rank's loss is CP x its share (hybrid/cp/loss.py)
    return total.item() / (mesh.dp_cp.size * iters * batch.num_micro_batches)


def validation_line(loss: float, where: str) -> str:
    """Megatron's block: ' validation loss at iteration N | lm loss value: X | lm loss PPL: Y | ' between dashes;
    PPL = exp(min(20, loss)) as Megatron caps it."""
    text = f" validation loss at {where} | lm loss value: {loss:.6E} | lm loss PPL: {math.exp(min(20.0, loss)):.6E} | "
    rule = "-" * len(text)
    return f"{rule}\n{text}\n{rule}"


def run_evaluations(cfg: DataConfig, model, runner, mesh: Mesh, data: DataSource, batch: BatchSpec, optimizer,
                    iteration: int, final: bool = False, sharding: TokenSharding = TokenSharding(),
                    train_iters: int | None = None) -> dict[str, float]:
    """After `iteration`: the periodic validation when it is a multiple of --eval-interval; with `final`, the
    end-of-training validation and test losses. Rank 0 prints Megatron's lines; returns {name: loss}. `sharding`:
    this CP rank's cut of each micro-batch (hybrid/cp/data.py). `train_iters` (--train-iters) lets the last
    iteration's validation be printed once (module docstring); None: every evaluation runs."""
    last = train_iters is not None and iteration == train_iters
    if cfg.eval_iters == 0 or (not final and (iteration % cfg.eval_interval or last)):
        return {}  # the last iteration's validation is the final one's
    io, scale = getattr(runner, "io", None), getattr(optimizer, "loss_scale", 1.0)
    out = {}
    splits = ((Split.VALID, "validation set"), (Split.TEST, "test set")) if final else ((Split.VALID, None),)
    for split, name in splits:
        if not data.has(split):
            continue
        early = train_iters is not None and iteration < train_iters
        if split is Split.VALID and final and early and iteration % cfg.eval_interval == 0:
            continue  # stopped early right after a periodic evaluation: printed already, same samples
        index = 0 if split is Split.TEST else -(-iteration // cfg.eval_interval) - 1
        loss = evaluate(model, mesh, data, batch, split, index, cfg.eval_iters, io, scale, sharding,
                        getattr(runner, "placement", Placement.LOOP))
        out[name or "validation"] = loss
        if mesh.rank == 0:
            where = f"iteration {iteration}" + (f" on {name}" if name else "")
            print(validation_line(loss, where), flush=True)
    return out
