"""The fp32 ZeRO optimizer step makes one pass over the flat shards (issue 27): the parameter shard is the master,
the reduced gradient shard is the master gradient, and the mean over DP (the sum's / n) enters backward as the
loss gradient's seed 1 / n (`ZeroOptimizer._seed_mean`) -- so the step runs torch's fused AdamW over views and
nothing else touches a shard: no division pass, no `grad_scale` (whose CPU kernel writes the divided gradient back,
32 bytes a parameter for AdamW's 28), no copy into the model's parameters. Seeding changes no value: the weights
and moments after several steps equal, bit for bit, those of the run that divides in the kernel and of the run
whose backward did not pass through the model's loss output (then the step divides, as before). The equivalence
with the unsharded reference: tests/test_zero.py, test_fp32_grads.py."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.mesh import Mesh, ParallelDims
from hybrid.testing import run_distributed
from hybrid.tp import TPContext
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import Precision, ZeroConfig, ZeroOptimizer
from models import build_pipeline_chunks, load_config

STEPS, GLOBAL, MICRO, SEQ = 3, 8, 2, 32  # 2 micro-batches a rank at dp 2
OPT = OptimizerConfig(lr=1e-3, eps=1e-5, weight_decay=0.01, decay_style="constant")
SMALL = 64  # elements: a tensor at most this big is a step counter or a scalar, not a pass over a shard


class OpLog(TorchDispatchMode):
    """Every aten op that reads or writes more than SMALL elements of data (views and collectives aside)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = torch.utils._pytree.tree_leaves((args, kwargs))
        big = max((t.numel() for t in flat if isinstance(t, torch.Tensor)), default=0)
        if big > SMALL and not func.is_view and func.namespace == "aten":
            self.ops.append(str(func))
        return func(*args, **kwargs)


class BypassHooks:
    """A runner whose backward does not start from the model's hooked loss output (forward called directly)."""

    def __init__(self, model, first_hooked: bool = False) -> None:
        self.model, self.first_hooked = model, first_hooked

    def forward_backward(self, batches):
        total = torch.zeros(())
        for i, (x, y) in enumerate(batches):
            fwd = self.model if self.first_hooked and i == 0 else self.model.forward
            loss = fwd(x, y) / len(batches)
            loss.backward()
            total += loss.detach()
        return total


def _train(mesh: Mesh, stage: int, seed: bool = True, bypass: bool = False, precision=Precision.FP32) -> dict:
    chunks = build_pipeline_chunks(load_config("tiny-llama"), TPContext(mesh.tp), 0, 1, 1, seed=3)
    spec = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp)
    z = ZeroConfig(stage=stage, precision=precision, overlap_param_gather=not bypass)
    opt = ZeroOptimizer(chunks, mesh, z, OPT)
    out = {"seeds_mean": opt.seeds_mean}
    opt.seeds_mean = opt.seeds_mean and seed
    runner = BypassHooks(chunks[0]) if bypass else LocalForwardBackward(chunks[0], mesh.device)
    log, inner = OpLog(), opt.step

    def step():
        out["seeded"] = opt._seeded
        with log:
            report = inner()
        out["grad_scale"] = opt.optimizer.grad_scale
        return report
    opt.step = step
    corpus = load_corpus()
    for it in range(STEPS):
        train_step(chunks, micro_batches(corpus, spec, 3, it, mesh.coords.dp), opt, mesh, runner=runner)
        log.ops.clear() if it < STEPS - 1 else None
    out["ops"] = sorted(set(log.ops))
    # the master is the parameter buffer's shard, its gradient the reduced shard
    out["views"] = precision is Precision.FP32 and all(
        u.master.untyped_storage().data_ptr() == (u.flat if stage < 3 else u.shard).untyped_storage().data_ptr()
        and u.master_grad.data_ptr() == u.grad_shard.data_ptr() for u in opt.units)
    with opt.gathered():
        out["weights"] = {n: p.detach().clone() for n, p in chunks.named_parameters()}
    out["moments"] = [opt.moment(i, j, k).clone() for i, u in enumerate(opt.units) for j in range(len(u.views))
                      for k in ("exp_avg", "exp_avg_sq")]
    return out


def _mismatch(mesh: Mesh) -> str:
    """One micro-batch's backward from the hooked output, the other's not: the step refuses to guess."""
    chunks = build_pipeline_chunks(load_config("tiny-llama"), TPContext(mesh.tp), 0, 1, 1, seed=3)
    opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=1, overlap_param_gather=False), OPT)
    spec = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp)
    try:
        train_step(chunks, micro_batches(load_corpus(), spec, 3, 0, mesh.coords.dp), opt, mesh,
                   runner=BypassHooks(chunks[0], first_hooked=True))
    except RuntimeError as e:
        return str(e)
    return ""


def _run(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    mesh = Mesh.build(ParallelDims(dp=world))
    out = {f"stage{s}": _train(mesh, s) for s in (1, 2, 3)}
    out.update(kernel_divides=_train(mesh, 2, seed=False), bypass=_train(mesh, 1, bypass=True),
               bf16=_train(mesh, 1, precision=Precision.BF16),
               mismatch=_mismatch(mesh))
    return out


@pytest.fixture(scope="module")
def dp2():
    return run_distributed(_run, 2)[0]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_fp32_step_is_one_fused_adamw_pass_over_views(dp2, stage):
    got = dp2[f"stage{stage}"]
    assert got["seeds_mean"] and got["seeded"] == GLOBAL // MICRO // 2  # every micro-batch's backward seeded
    assert got["ops"] == ["aten._fused_adamw_.default"], got["ops"]  # no division, copy, cast or write-back
    assert got["grad_scale"] is None and got["views"]


def test_seeding_the_mean_changes_no_value(dp2):
    """Seeded (default) vs the division folded into the kernel: the same weights and moments, bit for bit."""
    seeded, divided = dp2["stage2"], dp2["kernel_divides"]
    assert divided["seeded"] == 0 and divided["grad_scale"] is not None
    assert "aten._fused_adamw_.default" in divided["ops"]
    for n, w in seeded["weights"].items():
        assert torch.equal(w, divided["weights"][n]), n
    assert all(torch.equal(a, b) for a, b in zip(seeded["moments"], divided["moments"]))


def test_backward_not_from_the_hooked_loss_is_divided_in_the_step(dp2):
    """A runner that bypasses the model's forward hooks seeds nothing: the step divides, with the same result."""
    plain, seeded = dp2["bypass"], dp2["stage1"]  # stage 1 as bypass runs it (overlap changes no value)
    assert plain["seeded"] == 0 and seeded["seeded"] == 2
    for n, w in seeded["weights"].items():
        assert torch.equal(w, plain["weights"][n]), n
    assert all(torch.equal(a, b) for a, b in zip(seeded["moments"], plain["moments"]))
    assert "1 of this step's 2 backward passes were seeded" in dp2["mismatch"]


def test_mixed_precision_keeps_its_copies_and_divides_nothing(dp2):
    """bf16: the fp32 master gradient is a cast copy of the reduced shard and the updated master is cast back into
    the parameters -- the copies stay where the dtypes differ; the seed took the division out of the step."""
    got = dp2["bf16"]
    assert got["seeds_mean"] and got["seeded"] == GLOBAL // MICRO // 2 and got["grad_scale"] is None
    assert "aten._fused_adamw_.default" in got["ops"] and not any("div" in op for op in got["ops"]), got["ops"]
    assert any("copy" in op for op in got["ops"]), got["ops"]
