"""Op-level selective recomputation (`--recompute-granularity selective-op`) of an MoE model at ZeRO 3 with expert
parallelism: it trains, and trains right.

Until round 19 every rank died in its first backward with torch's "aten.split.Tensor invocation index 2 encountered
during backward but not found in storage": ZeRO 3 gathers an experts module's parameters in that module's own hooks,
inside the block torch's selective checkpoint records op by op, and the recomputation ran other gathers than the
forward had (the unit was prefetched in forward, gathered in full in backward; with two micro-batches a rank the
counts no longer lined up). The gathers now run under no dispatch mode, and in the recomputation the experts' hooks
gather only their own unit and keep it for the backward (hybrid/zero/engine.py `_gather`, `_before_block`).

One 2-rank launch: tiny-mixtral (2 layers, 8 experts top-2, the auxiliary loss on), dp 2 x ep 2 (expert-DP 1), ZeRO 3,
two micro-batches a rank (one micro-batch a rank did not crash), one train_step per recomputation mode:

* selective-op's loss and the reduced gradient of every parameter -- every expert, on the rank that holds it -- equal
  the run without recomputation on the same ranks bit for bit (the same float operations, rerun), and equal the
  unsharded single-process model (every expert on one rank, the 4 micro-batches in turn) within GRAD_RTOL below
  (measured 4.9e-7, an expert's weight); a dispatch mode sees no operator of a ZeRO 3 gather;
* every unit is gathered twice a micro-batch, as without recomputation (before: 3 times for each experts unit, and
  the next block's unit once more);
* what the policy stores is on the saved-activation ledger, to the byte: selective-op's forward peak exceeds full
  recomputation's (which keeps only the blocks' inputs, as selective-op does) by the outputs the policy keeps --
  counted apart from the policy, by a dispatch mode over the no-recomputation run's blocks (the attention kernel's
  outputs and every second matmul of a block, forward order, its experts' included; rows routed to this rank).

Tolerance (fp32, relative to each tensor's largest reference gradient entry, as tests/test_zero.py's GRAD_RTOL_FP32).
The reference sums the 4 micro-batches in one order; the ranks sum 2 each, then the 2 ranks (k = 4 terms regrouped,
<= 3 eps_32 of the sum of |terms|, eps_32 = 2^-24), and an expert's weight gradient is one matmul over the rows both
ranks routed to it (up to b s = 32 rows a rank, 64 in one sum: the per-token terms regrouped too, <= 63 eps_32 of
the sum of their |terms|). Input gradients carry such regroupings back through the 2 layers, each adding its own to
first order. With the sums of |terms| up to 4 |g|max, as test_zero's: (3 + 63) x 4 eps_32 x 2 layers = 528 eps_32,
under 2^-14 = 1024 eps_32; the loss (a mean of the same 4 micro-batch losses) within the same bound. The scalings
1/m and 1/dp are powers of two (exact). A wrong expert-gradient average (x 2) errs by 1; a stale gathered expert
weight by the step's relative update, ~lr / |w| = 1e-3 / 0.02 = 5e-2.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from contextlib import nullcontext

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hybrid.comm import Group
from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.measured_memory import SavedActivationLedger
from hybrid.mesh import ParallelDims
from hybrid.moe.config import MoEConfig
from hybrid.moe.layer import ExpertContext
from hybrid.moe.parallel import build_mesh
from hybrid.moe.runtime import set_aux_grad_scale
from hybrid.testing import run_distributed
from hybrid.tp import TPContext
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from models import Recompute, build_model, build_pipeline_chunks, load_config
from models.common import _ATTENTION, _MATMULS

WORLD, EP, GLOBAL, MICRO, SEQ, SEED, COEFF = 2, 2, 4, 1, 32, 3, 0.01
GRAD_RTOL = 2.0**-14
OPT = OptimizerConfig(lr=1e-3, eps=1e-5, decay_style="constant")
MODES = (Recompute.SELECTIVE_OP, Recompute.NONE, Recompute.FULL)


def _cfg():
    return dataclasses.replace(load_config("tiny-mixtral"), num_layers=2, moe_layers=(0, 1))


def _spec() -> BatchSpec:
    return BatchSpec(GLOBAL, MICRO, SEQ, WORLD)  # dp = the world (tp = pp = 1)


class _PolicyCount(TorchDispatchMode):
    """Bytes the op-level policy should keep for one forward, counted apart from it: inside each block's forward
    (`inside`), the outputs of the attention kernel and of every second matmul from the block's first; one total a
    model forward (a micro-batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.inside, self.matmuls, self.per_forward = False, 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.inside and (func in _ATTENTION or func in _MATMULS):
            self.matmuls += func in _MATMULS
            if func in _ATTENTION or self.matmuls % 2 == 1:
                outs = out if isinstance(out, (tuple, list)) else (out,)
                self.per_forward[-1] += sum(t.untyped_storage().nbytes() for t in outs
                                            if isinstance(t, torch.Tensor) and t.numel() > 0)
        return out

    def watch(self, model: torch.nn.Module) -> None:
        def enter(m, a):
            self.inside, self.matmuls = True, 0

        def leave(m, a, o):
            self.inside = False
        model.register_forward_pre_hook(lambda m, a: self.per_forward.append(0))
        for block in model.layers.values():
            block.register_forward_pre_hook(enter)
            block.register_forward_hook(leave)


def _step(mesh, moe, batches, recompute: Recompute) -> dict:
    """One train_step at ZeRO 3: the loss, every parameter's reduced gradient (the DP mean, by name, this rank's
    experts), the ledger's peak, and (no recomputation) the policy's bytes counted apart."""
    chunks = build_pipeline_chunks(_cfg(), TPContext(mesh.tp), 0, 1, 1, seed=SEED, recompute=recompute, moe=moe)
    opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=3), OPT)
    names = {id(p): n for n, p in chunks[0].named_parameters()}
    grads, step = {}, opt.step

    def recording_step():
        for u in opt.units:
            group = opt._group(u)
            full = group.all_gather(u.grad_shard.clone(), dim=0) / mesh.dims.dp
            for p, off in zip(u.params, u.offsets):
                grads[names[id(p)]] = full[off:off + p.numel()].view(p.shape).clone()
        return step()
    opt.step = recording_step
    gathers = _count_gathers(opt)
    count = _PolicyCount()
    count.watch(chunks[0])
    ledger = SavedActivationLedger(params=chunks.parameters())
    with ledger, (count if recompute is Recompute.NONE else nullcontext()):
        loss = train_step(chunks, batches, opt, mesh, runner=LocalForwardBackward(chunks[0], mesh.device))
    return {"loss": loss, "grads": grads, "peak": ledger.peak_bytes, "kept": count.per_forward,
            "gathers": dict(gathers), "ops_seen": _ops_a_gather_shows(opt)}


def _ops_a_gather_shows(opt: ZeroOptimizer) -> int:
    """Operators a dispatch mode (as torch's selective-checkpoint modes) sees while ZeRO 3 gathers a freed unit
    and prefetches another, as a hook inside a checkpointed block does."""
    first, second = (u for u in opt.units if u.name.endswith(("block0", "block1")))
    opt._drop_stale_gathers()
    assert not (first.gathered or second.gathered or first.gather_work or second.gather_work)
    log = _OpLog()
    with log:
        opt._gather([first], [second])
    opt._gather([second], [])
    opt._free([first, second])
    return log.ops


class _OpLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _count_gathers(opt: ZeroOptimizer) -> dict[str, int]:
    """Gathers each unit runs from now on (by name): a call that finds it neither gathered nor in flight."""
    gathers = defaultdict(int)
    for u in opt.units:
        def start(group, device, u=u, original=u.start_gather):
            gathers[u.name] += not u.gathered and u.gather_work is None
            return original(group, device)
        u.start_gather = start
    return gathers


def _ranks(rank: int, world: int) -> dict:
    mesh = build_mesh(ParallelDims.from_world(world), EP)
    moe = ExpertContext(MoEConfig(expert_parallel=EP, aux_loss_coeff=COEFF), mesh.ep)
    batches = micro_batches(load_corpus(), _spec(), SEED, 0, mesh.coords.dp)
    return {mode: _step(mesh, moe, batches, mode) for mode in MODES}


def _reference() -> tuple[float, dict]:
    """The unsharded model in this process: every expert, the global batch's 4 micro-batches in turn, each loss
    (and its auxiliary loss's gradient) scaled by 1 / 4 -- the DP mean of the ranks' 1 / m."""
    model = build_model(_cfg(), TPContext(Group.solo("tp")), seed=SEED,
                        moe=ExpertContext(MoEConfig(aux_loss_coeff=COEFF))).train()
    batches = [mb for dp in range(WORLD) for mb in micro_batches(load_corpus(), _spec(), SEED, 0, dp)]
    set_aux_grad_scale(model, 1 / len(batches))
    total = 0.0
    for x, y in batches:
        loss = model(x, y) / len(batches)
        loss.backward()
        total += loss.item()
    return total, {n: p.grad for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def runs():
    return run_distributed(_ranks, WORLD, timeout=600), _reference()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


def test_selective_op_at_zero3_with_ep_trains_as_without_it_and_as_one_process(runs):
    ranks, (ref_loss, ref_grads) = runs
    seen, worst = set(), 0.0
    for rank, got in enumerate(ranks):
        sop, none = got[Recompute.SELECTIVE_OP], got[Recompute.NONE]
        assert sop["ops_seen"] == 0  # ZeRO 3's gathers are not the model's operators: no mode records them
        assert sop["loss"] == none["loss"], rank
        assert sop["grads"].keys() == none["grads"].keys()
        for name, g in sop["grads"].items():  # the same float operations, rerun: bit for bit
            assert torch.equal(g, none["grads"][name]), (rank, name)
        assert abs(sop["loss"] - ref_loss) <= GRAD_RTOL * abs(ref_loss), (sop["loss"], ref_loss)
        for name, g in sop["grads"].items():
            worst = max(worst, _rel(g, ref_grads[name]))
            seen.add(name)
    assert seen == set(ref_grads), sorted(set(ref_grads) - seen)[:4]  # every expert, on one rank or the other
    assert sum(".experts." in n for n in seen) == 2 * 8 * 3
    assert worst <= GRAD_RTOL, worst


def test_the_recomputation_gathers_no_unit_again(runs):
    """Every block's and experts module's unit is gathered twice a micro-batch, forward and backward, as without
    recomputation (selective-op and full alike): the experts' hooks, which run again in the recomputation, gather
    their unit there for the backward that follows and prefetch nothing (they had freed it after the rerun, so the
    backward gathered it a third time, and prefetched the next block's unit, whose backward was over)."""
    ranks, _ = runs
    m = GLOBAL // WORLD // MICRO
    for got in ranks:
        sop, none = got[Recompute.SELECTIVE_OP]["gathers"], got[Recompute.NONE]["gathers"]
        assert sop == none == got[Recompute.FULL]["gathers"]
        blocks = {n: c for n, c in sop.items() if ".block" in n}
        assert len(blocks) == 2 * 2 and set(blocks.values()) == {2 * m}, blocks


def test_what_selective_op_keeps_is_on_the_activation_ledger(runs):
    ranks, _ = runs
    for rank, got in enumerate(ranks):
        sop, full, none = (got[m]["peak"] for m in (Recompute.SELECTIVE_OP, Recompute.FULL, Recompute.NONE))
        kept = got[Recompute.NONE]["kept"]
        assert len(kept) == GLOBAL // WORLD // MICRO and min(kept) > 0
        # each micro-batch's forward holds the same inputs and more or less of its routed rows: the peak is the
        # forward that keeps the most
        assert sop - full == max(kept), (rank, sop, full, kept)
        assert full < sop < none
