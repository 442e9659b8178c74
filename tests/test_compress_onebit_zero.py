"""1-bit Adam with ZeRO 1 and 2 (hybrid/compress/reduction.py: OneBitAdamReduction, onebit.py: OneBitAdam).

The design makes the ZeRO runs the same math as ZeRO 0's: the engine pads each unit to a multiple of 8 n, the
padding the compressed all-reduce uses, so server chunk k *is* ZeRO shard k; every worker keeps its whole momentum
(error-fed, compressed whole); the server residual, the frozen variance, the master weights and the Adam update live
on the shard; ZeRO's all-gather of the parameters follows. So the tests demand equality bit for bit, not a
tolerance:

* pp 2 x dp 2 (tiny-llama, 2 micro-batches, freeze after step 3 of 5): ZeRO 1 and ZeRO 2 equal ZeRO 0 in every
  loss, every final weight and every moment; the DP ledger of each step equals the formula from the parameter
  counts (warm-up: ZeRO's reduce-scatter and all-gather; the freeze step: + one all-gather of the momentum; after:
  the compressed all-reduce's signs and scales + the parameter all-gather, no gradient traffic).
* train.py at dp 2, ZeRO 1, bf16: saved after step 4 (compressing since step 3), resumed: losses and every saved tensor
  equal the uninterrupted run's; the same checkpoint resumed at ZeRO 0 gives the same losses (the state is
  layout-free across stages), and it reshards to pp 2 x dp 2 at ZeRO 2 and back, every tensor bit for bit but the
  padding residuals, as ZeRO 0's does (tests/test_compress_reshard.py).
"""

from __future__ import annotations

import pytest
import torch

from hybrid.compress.onebit import ledger_bytes, padded_length
from hybrid.testing import run_distributed

STEPS, FREEZE = 5, 3


def _train(rank, world, tp, pp, stages):
    from hybrid.compress.reduction import OneBitAdamReduction
    from hybrid.data import BatchSpec, load_corpus, micro_batches
    from hybrid.mesh import Mesh, ParallelDims
    from hybrid.tp import TPContext
    from hybrid.train_step import OptimizerConfig, train_step
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    from models import build_pipeline_chunks, load_config
    from tests.test_compress_engine import GLOBAL, MICRO, SEQ, _runner
    torch.set_num_threads(1)
    mesh = Mesh.build(ParallelDims.from_world(world, tp=tp, pp=pp))
    dp = mesh.dims.dp
    cfg = OptimizerConfig(lr=3e-3, eps=1e-8, weight_decay=0.01, decay_style="constant")
    spec, corpus, out = BatchSpec(GLOBAL, MICRO, SEQ, dp), load_corpus(), {}
    for stage in stages:
        chunks = build_pipeline_chunks(load_config("tiny-llama"), TPContext(mesh.tp), mesh.coords.pp, pp, 1, seed=7)
        numels = [p.numel() for p in chunks.parameters()]
        opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=stage), cfg, OneBitAdamReduction(FREEZE, (dp, tp, pp)))
        losses, sent = [], []
        for it in range(STEPS):
            mesh.ledger.reset()
            losses.append(train_step(chunks, micro_batches(corpus, spec, 3, it, mesh.coords.dp), opt, mesh, None,
                                     runner=_runner(mesh, chunks, load_config("tiny-llama"))))
            sent.append({k: v["bytes"] for k, v in mesh.ledger.summary().items() if k.endswith("@dp")})
        opt.wait_params()  # ZeRO 1-2: the last step's parameter all-gathers are in flight until the next forward
        names = {id(p): n for n, p in chunks.named_parameters()}
        out[stage] = {"losses": losses, "sent": sent, "numel": sum(numels), "dp": dp,
                      "weights": {n: p.detach().clone() for n, p in chunks.named_parameters()},
                      "units": [sorted(names[id(p)] for p in u.params) for u in opt.units],
                      "moments": _moments(opt, names), "held": _held(opt)}
    return out


def _held(opt) -> dict[str, int]:
    """Elements of each optimizer-side buffer this rank holds, summed over units."""
    red, flat = opt.reduction, opt.optimizer.flat
    return {"momentum": sum(st["exp_avg"].numel() for st in flat), "variance": sum(st["exp_avg_sq"].numel()
                                                                                  for st in flat),
            "master": sum(u.master.numel() for u in opt.units), "worker": sum(t.numel() for t in red.worker.values()),
            "server": sum(t.numel() for t in red.server.values()),
            "grad": sum(u.flat_grad.numel() if u.flat_grad is not None else u.grad_shard.numel() for u in opt.units)}


def _moments(opt, names) -> dict[str, torch.Tensor]:
    """Each parameter's m and v, gathered from the shards over DP (ZeRO 1-2; ZeRO 0 holds them whole)."""
    out = {}
    for u in opt.units:
        for kind in ("exp_avg", "exp_avg_sq"):
            full = torch.zeros(u.padded)
            a, _ = u.shard_range
            for j, s in enumerate(u.segments):
                full[a + s.lo:a + s.hi] = opt.moment(opt.units.index(u), j, kind)
            if opt.cfg.sharded:
                opt.dp.all_reduce(full)
            for p, off in zip(u.params, u.offsets):
                out[f"{kind}/{names[id(p)]}"] = full[off:off + p.numel()].clone()
    return out


@pytest.fixture(scope="module")
def runs():
    return run_distributed(_train, 4, args=(1, 2, (0, 1, 2)), timeout=900)


def test_onebit_adam_at_zero_1_and_2_equals_zero_0_bit_for_bit_across_the_freeze_pp2(runs):
    for r in runs:
        for stage in (1, 2):
            assert r[stage]["losses"] == r[0]["losses"], stage
            for n, w in r[0]["weights"].items():
                assert torch.equal(r[stage]["weights"][n], w), (stage, n)
            for k, v in r[0]["moments"].items():
                assert torch.equal(r[stage]["moments"][k], v), (stage, k)
        assert any(v.abs().max() > 0 for v in r[0]["moments"].values())
        assert r[0]["losses"][-1] < r[0]["losses"][0]


def test_onebit_adam_zero_1_2_shard_variance_and_master_not_momentum_worker_error_or_grads(runs):
    """What ZeRO saves under 1-bit Adam (docs/comm-efficient.md): the frozen variance and the master weights are
    L / n per unit; the momentum and the worker residual stay whole (L) on every worker, and ZeRO 2 keeps a whole
    gradient buffer (the momentum needs the whole local gradient). ZeRO 0 holds the variance and master whole."""
    for r in runs:
        n = r[0]["dp"]
        total = sum(padded_length(sum(r[0]["weights"][name].numel() for name in u), n) for u in r[1]["units"])
        assert r[0]["held"]["variance"] == r[0]["held"]["master"] == r[0]["numel"]
        for stage in (1, 2):
            held = r[stage]["held"]
            assert held["variance"] == held["master"] == held["server"] == total // n, (stage, held)
            assert held["momentum"] == held["worker"] == held["grad"] == total, (stage, held)


def test_onebit_adam_zero_dp_bytes_equal_the_formula(runs):
    """Per unit of N parameters (L = N padded to a multiple of 8 n = 16, fp32): warm-up 4 L reduce-scatter +
    4 L all-gather; from the freeze: L/8 + 4n all-to-all-ish sign and scale traffic twice (ledger_bytes) + 4 L
    parameter all-gather, and once, at the freeze step, 4 L to make each worker's momentum whole."""
    for r in runs:
        for stage in (1, 2):
            run = r[stage]
            n = run["dp"]
            units = [sum(r[0]["weights"][name].numel() for name in u) for u in run["units"]]
            assert sum(units) == run["numel"]
            lengths = [padded_length(numel, n) for numel in units]
            for it, step in enumerate(run["sent"]):
                if it < FREEZE:
                    assert step == {"reduce_scatter@dp": 4 * sum(lengths), "all_gather@dp": 4 * sum(lengths)}, it
                    continue
                signs = sum(ledger_bytes(numel, n) for numel in units)
                gathers = 4 * sum(lengths) * (2 if it == FREEZE else 1)
                assert "reduce_scatter@dp" not in step and "all_reduce@dp" not in step, (it, step)
                assert step["all_to_all@dp"] == sum(length // 8 for length in lengths), (it, step)
                assert step["all_to_all@dp"] + step["all_gather@dp"] == signs + gathers, (it, step)


# --- train.py: refusals, and checkpoints mid-run after the freeze ---------------------------------------------------
BF16 = ["--bf16"]  # mixed precision: the fp32 master is a shard of its own at ZeRO 1-2
ONEBIT_Z1 = ["--powersgd-rank", "0", "--zero-stage", "1", "--optimizer", "onebit-adam", "--onebit-freeze-iters", "2",
             "--clip-grad", "0"]


@pytest.mark.parametrize("argv,message", [
    (["--optimizer", "onebit-adam", "--zero-stage", "2"], "--clip-grad does not run with --optimizer onebit-adam at "
                                                          "--zero-stage 1 or 2"),
    (["--optimizer", "onebit-adam", "--zero-stage", "3", "--clip-grad", "0"],
     "--optimizer onebit-adam does not run with --zero-stage 3"),
])
def test_onebit_adam_refuses_zero_3_and_clipping_at_zero_1_2_by_name(argv, message, monkeypatch):
    """The default --clip-grad 1.0 is refused at ZeRO 1-2 (not silently dropped after the freeze)."""
    import re
    from tests.test_compress_train import train_script
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit, match=re.escape(message)) as e:
        train_script.main(argv)
    assert "\n" not in str(e.value)
    assert not torch.distributed.is_initialized()


def _reshard_onebit(rank: int, world: int, flags: list[str], load: str, save: str) -> None:
    from tests import test_compress_reshard
    test_compress_reshard._reshard(rank, world, flags, load, save)


@pytest.mark.slow
def test_onebit_adam_zero1_checkpoint_resumes_bit_for_bit_at_zero1_and_zero0_and_reshards_over_pp(tmp_path):
    """bf16, dp 2, ZeRO 1, freeze 2, saved after step 4 (momentum compressed since step 3: residuals non-zero). Resumed
    at ZeRO 1: losses 5-6 and every tensor saved after step 6 equal the uninterrupted run's. Resumed at ZeRO 0:
    the same losses (the same math; the momentum's shards loaded by ZeRO 1 are made whole before its first
    compressed step, `_whole`). Loaded at pp 2 x dp 2, ZeRO 2, saved, then at tp 2 x dp 2, ZeRO 1, and back at
    pp 1 x dp 2, ZeRO 1, each saved: every tensor equals the original but the padding residuals (`onebit.rest/`,
    layout-specific). Loaded at dp 1: refused by name, as at ZeRO 0."""
    from tests.test_compress_reshard import _tensors
    from tests.test_compress_train import COMMON, _losses, runnable
    from hybrid import testing
    root = str(tmp_path)

    def run(flags, tag):
        out = testing.torchrun(runnable(COMMON + flags) + ["--metrics-file", f"{root}/{tag}.jsonl"], 2,
                               env={"HYBRID_FAULT": None, "OMP_NUM_THREADS": "1"}, cwd=_root(), timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return _losses(f"{root}/{tag}.jsonl")

    want = run(ONEBIT_Z1 + BF16 + ["--save-interval", "4", "--save", f"{root}/straight"], "straight")
    resume = ["--load", f"{root}/straight", "--ckpt-step", "4"]
    got = run(ONEBIT_Z1 + BF16 + resume + ["--save", f"{root}/resumed"], "resumed")
    assert sorted(got) == [5, 6] and all(got[i] == want[i] for i in (5, 6)), (got, want)
    a, b = _tensors(f"{root}/straight", 6), _tensors(f"{root}/resumed", 6)
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    zero0 = [f if f != "1" else "0" for f in ONEBIT_Z1]
    got = run(zero0 + BF16 + resume, "zero0")
    assert all(got[i] == want[i] for i in (5, 6)), (got, want)
    saved = _tensors(f"{root}/straight", 4)
    assert any(k.startswith("compress/onebit.server_error/") and v.abs().max() > 0 for k, v in saved.items())
    src = f"{root}/straight"
    zero2 = [f if f != "1" else "2" for f in ONEBIT_Z1] + BF16
    for flags, world, tag in ((zero2 + ["--pipeline-model-parallel-size", "2"], 4, "pp2"),
                              (ONEBIT_Z1 + BF16 + ["--tensor-model-parallel-size", "2"], 4, "tp2"),
                              (ONEBIT_Z1 + BF16, 2, "pp1")):
        testing.run_distributed(_reshard_onebit, world, args=(flags, src, f"{root}/{tag}"), timeout=300)
        src, got_t = f"{root}/{tag}", _tensors(f"{root}/{tag}", 4)
        kept = [k for k in saved if not k.startswith("compress/onebit.rest/")]
        assert len(kept) > len(saved) // 2
        for k in kept:
            assert torch.equal(got_t[k], saved[k]), (tag, k)
    out = testing.torchrun(runnable(COMMON + ONEBIT_Z1) + BF16 + ["--load", f"{root}/straight", "--ckpt-step", "4"], 1,
                           env={"HYBRID_FAULT": None, "OMP_NUM_THREADS": "1"}, cwd=_root(), timeout=600)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "saved at dp 2, this run has dp 1 (sign compression does not reshard across DP sizes); resume at dp 2" \
        in out.stderr, out.stderr[-2000:]


def _root() -> str:
    import os
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- ZeRO 0 keeps clipping each rank's own gradient after the freeze (train.py's default --clip-grad 1.0) -----------
CLIP = 0.5


def _clipped(rank, world):
    """dp 2, ZeRO 0, --clip-grad 0.5: the engine against DeepSpeed's update written out (test_compress_onebit's
    reference) whose gradient is clipped first as the engine clips: by this rank's norm -- after the freeze this
    rank's own gradient's -- summed in fp64 over the parameters, scale max / (norm + 1e-6) when below 1."""
    import math
    from hybrid.compress.reduction import OneBitAdamReduction
    from hybrid.data import BatchSpec, load_corpus, micro_batches
    from hybrid.dp import GradAverager
    from hybrid.mesh import Mesh, ParallelDims
    from hybrid.tp import TPContext
    from hybrid.train_step import OptimizerConfig, train_step
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    from models import build_pipeline_chunks, load_config
    from tests import test_compress_onebit as ref
    from tests.test_compress_engine import _runner
    torch.set_num_threads(1)
    mesh = Mesh.build(ParallelDims.from_world(world))
    cfg = OptimizerConfig(lr=3e-3, eps=1e-8, weight_decay=0.01, decay_style="constant", clip_grad=CLIP)
    spec, corpus, out = BatchSpec(8, 2, 32, 2), load_corpus(), {}

    class Clipped(ref.RefOneBitAdam):
        def step(self, closure=None):
            grads = [p.grad for p in self.param_groups[0]["params"] + self.param_groups[1]["params"]]
            norm = math.sqrt(torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float64)).square().sum().item())
            if CLIP / (norm + 1e-6) < 1.0:
                for g in grads:
                    g.mul_(CLIP / (norm + 1e-6))
            self.norms.append(norm)
            super().step()

    for kind in ("ref", "engine"):
        chunks = build_pipeline_chunks(load_config("tiny-llama"), TPContext(mesh.tp), 0, 1, 1, seed=7)
        if kind == "ref":
            opt = Clipped(chunks, cfg, 2, mesh.dp)
            opt.norms = []

            class Sync(GradAverager):
                def __call__(self):
                    if opt.steps < ref.FREEZE:
                        super().__call__()
            sync = Sync(chunks.parameters(), mesh.dp)
        else:
            opt, sync = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=0), cfg, OneBitAdamReduction(ref.FREEZE,
                                                                                                 (2, 1, 1))), None
        losses, norms = [], []
        for it in range(ref.FREEZE + 2):
            losses.append(train_step(chunks, micro_batches(corpus, spec, 3, it, mesh.coords.dp), opt, mesh, sync,
                                     runner=_runner(mesh, chunks, load_config("tiny-llama"))))
            norms.append(opt.last_report.grad_norm if kind == "engine" else opt.norms[-1])
        out[kind] = {"losses": losses, "norms": norms,
                     "weights": {n: p.detach().clone() for n, p in chunks.named_parameters()}}
    return out


def test_onebit_adam_zero0_clips_each_ranks_own_gradient_after_the_freeze():
    from tests.test_compress_onebit import FREEZE
    runs = run_distributed(_clipped, 2, timeout=600)
    for r in runs:
        assert all(n > CLIP for n in r["engine"]["norms"])  # clipping acted at every step, before and after
        # the fp64 sums of squares run in another order (the engine's buckets): ~20 terms, each rounding 2^-53
        assert r["engine"]["norms"] == pytest.approx(r["ref"]["norms"], rel=1e-13, abs=0)
        assert r["engine"]["losses"] == r["ref"]["losses"]  # the scale rounds to fp32: the same float
        for n, w in r["ref"]["weights"].items():
            assert torch.equal(r["engine"]["weights"][n], w), n
    assert runs[0]["engine"]["norms"][FREEZE:] != runs[1]["engine"]["norms"][FREEZE:]  # after: each rank's own
