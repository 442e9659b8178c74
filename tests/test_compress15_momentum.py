"""1-bit Adam's scheme with PowerSGD on the momentum (hybrid/compress/momentum.py; `--optimizer onebit-adam
--onebit-compressor powersgd --powersgd-rank R`).

The reference is written out from two external definitions: DeepSpeed's OnebitAdam.step (the RefOneBitAdam of
tests/test_compress_onebit.py: no bias correction, weight decay in the update, variance frozen at the freeze) with its
compressed all-reduce replaced by torch's own `powerSGD_hook` applied to the momentum (through the FakeBucket of
tests/test_compress_powersgd.py). The engine's run must equal it bit for bit -- losses and weights -- and its DP
ledger must hold the fp32 gradient all-reduce before the freeze and exactly 4 (r (n + m) per compressed matrix + the
other elements) bytes after it. A train.py run saved after the freeze resumes bit for bit.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys

import pytest
import torch

from hybrid.testing import run_distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, FREEZE, RANK = 6, 3, 2


def _expected_after(shapes: list[tuple[int, ...]], r: int) -> dict[str, int]:
    """Numbers all-reduced per step after the freeze, from the shapes alone (not the code's formula), by tag: P r n
    and Q r m per matrix with n m > 2 r (n + m) (torch's min_compression_rate), every element of the others."""
    out = {"powersgd.p": 0, "powersgd.q": 0, "powersgd.uncompressed": 0}
    for s in shapes:
        n, m = s[0], math.prod(s[1:])
        rr = min(n, m, r)
        if 2 * rr * (n + m) < n * m:
            out["powersgd.p"] += rr * n
            out["powersgd.q"] += rr * m
        else:
            out["powersgd.uncompressed"] += n * m
    return out


def _momentum(rank, world):
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState as TorchState
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

    import tests.test_compress_onebit as onebit_test
    from hybrid.compress.momentum import MomentumPowerSGDReduction
    from hybrid.compress.powersgd import PowerSGDConfig
    from hybrid.data import BatchSpec, load_corpus, micro_batches
    from hybrid.dp import GradAverager
    from hybrid.mesh import Mesh, ParallelDims
    from hybrid.tp import TPContext
    from hybrid.train_step import OptimizerConfig, train_step
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    from models import build_pipeline_chunks, load_config
    from tests.test_compress_engine import _runner
    from tests.test_compress_powersgd import FakeBucket
    torch.set_num_threads(1)
    mesh = Mesh.build(ParallelDims.from_world(world))
    cfg = OptimizerConfig(lr=3e-3, eps=1e-8, weight_decay=0.01, decay_style="constant")
    spec, corpus, out = BatchSpec(8, 2, 32, world), load_corpus(), {}
    hook_state = TorchState(process_group=mesh.dp.pg, matrix_approximation_rank=RANK, start_powerSGD_iter=2)
    hook_state.iter = 2  # compress from the first call: the hook is only called after the freeze

    def hook_all_reduce(m, we, se, group):  # torch's hook on the momentum, in place of the signs
        shapes = [tuple(p.shape) for p in bucket]
        buf = m.clone()
        return powerSGD_hook(hook_state, FakeBucket(0, buf, shapes, True)).wait()

    for kind in ("ref", "zero0", "zero1"):
        chunks = build_pipeline_chunks(load_config("tiny-llama"), TPContext(mesh.tp), 0, 1, 1, seed=7)
        if kind == "ref":
            opt = onebit_test.RefOneBitAdam(chunks, cfg, world, mesh.dp)
            assert len(opt.buckets) == 1  # tiny-llama: one unit, as the engine's
            bucket = opt.buckets[0]

            class Sync(GradAverager):
                def __call__(self):
                    if opt.steps < FREEZE:  # warm-up: the mean; after: each rank's own gradient
                        super().__call__()
            sync = Sync(chunks.parameters(), mesh.dp)
            saved, onebit_test.ds_compressed_allreduce = onebit_test.ds_compressed_allreduce, hook_all_reduce
            assert onebit_test.FREEZE == FREEZE  # RefOneBitAdam's freeze step
        else:
            red = MomentumPowerSGDReduction(FREEZE, PowerSGDConfig(rank=RANK), (world, 1, 1))
            opt, sync = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=int(kind[-1])), cfg, red), None
        losses, sent = [], []
        try:
            for it in range(STEPS):
                mesh.ledger.reset()
                losses.append(train_step(chunks, micro_batches(corpus, spec, 3, it, mesh.coords.dp), opt, mesh,
                                         sync, runner=_runner(mesh, chunks, load_config("tiny-llama"))))
                sent.append({k: v["bytes"] for k, v in mesh.ledger.summary().items()  # DP gradient traffic: not
                             if "@dp" in k and not k.endswith(":metrics")})  # the loss's metric all-reduce
        finally:
            if kind == "ref":
                onebit_test.ds_compressed_allreduce = saved
        if kind == "zero1":
            opt.wait_params()  # ZeRO 1: the last step's parameter all-gathers are in flight until the next forward
        out[kind] = {"losses": losses, "weights": {n: p.detach().clone() for n, p in chunks.named_parameters()},
                     "sent": sent, "shapes": [tuple(p.shape) for p in chunks.parameters()],
                     "error": None if kind == "ref" else red.state.error[0].clone()}
    return out


@pytest.fixture(scope="module")
def runs():
    return run_distributed(_momentum, 2, timeout=900)


@pytest.mark.slow
def test_momentum_powersgd_equals_one_bit_adam_with_torchs_hook_on_the_momentum_bit_for_bit(runs):
    for r in runs:
        for kind in ("zero0", "zero1"):  # ZeRO 1: the server chunk is the shard; the same math
            assert r[kind]["losses"] == r["ref"]["losses"], kind
            for n, w in r["ref"]["weights"].items():
                assert torch.equal(r[kind]["weights"][n], w), (kind, n)
        assert r["zero0"]["error"].abs().max() > 0  # the momentum's residual is carried: compression did something
    assert runs[0]["ref"]["losses"] == runs[1]["ref"]["losses"]
    assert runs[0]["ref"]["losses"][-1] < runs[0]["ref"]["losses"][0]
    assert not torch.equal(runs[0]["zero0"]["error"], runs[1]["zero0"]["error"])  # each worker's own residual


@pytest.mark.slow
def test_momentum_powersgd_dp_bytes_are_r_n_plus_m_per_matrix_plus_the_1d_tensors(runs):
    for r in runs:
        run = r["zero0"]
        numel = sum(math.prod(s) for s in run["shapes"])
        after = _expected_after(run["shapes"], RANK)
        assert 0 < after["powersgd.uncompressed"] and sum(after.values()) < numel / 5  # a real compression
        for step in run["sent"][:FREEZE]:  # warm-up: the fp32 gradient all-reduce, nothing else
            assert step == {"all_reduce@dp": 4 * numel}
        for step in run["sent"][FREEZE:]:  # after: P, Q and the uncompressed (1-D) elements, fp32, nothing else
            assert step == {f"all_reduce@dp:{tag}": 4 * k for tag, k in after.items()}


# --- the flags: checked in-process, before any process group ----------------------------------------------------
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import train as train_script  # noqa: E402

BASE = ["--global-batch-size", "8", "--seq-length", "32", "--micro-batch-size", "2", "--train-iters", "6"]


@pytest.mark.parametrize("argv,message", [
    (["--onebit-compressor", "powersgd", "--powersgd-rank", "4"],
     "--onebit-compressor powersgd is 1-bit Adam's momentum compressor; the run's optimizer is adam"),
    (["--optimizer", "onebit-adam", "--onebit-freeze-iters", "2", "--onebit-compressor", "powersgd"],
     "--onebit-compressor powersgd needs --powersgd-rank R >= 1"),
    (["--optimizer", "onebit-adam", "--onebit-freeze-iters", "2", "--onebit-compressor", "powersgd",
      "--powersgd-rank", "4", "--powersgd-start-iter", "3"], "--powersgd-start-iter 3 does nothing with"),
    (["--optimizer", "onebit-adam", "--onebit-freeze-iters", "2", "--powersgd-rank", "4"],
     "--optimizer onebit-adam and --powersgd-rank are exclusive"),  # the sign compressor: unchanged
])
def test_bad_momentum_compressor_flags_are_refused_in_one_line_before_any_process_group(argv, message,
                                                                                       monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit, match=re.escape(message)) as e:
        train_script.main(BASE + argv)
    assert "\n" not in str(e.value)
    assert not torch.distributed.is_initialized()


def test_momentum_compressor_flags_build_the_momentum_reduction_and_leave_gradient_powersgd_off():
    from hybrid.compress.momentum import MomentumPowerSGDReduction
    from hybrid.compress.reduction import OneBitAdamReduction, build
    from hybrid.train.args import run_config
    run = run_config(train_script.parse_args(BASE + ["--optimizer", "onebit-adam", "--onebit-freeze-iters", "2",
                                                     "--onebit-compressor", "powersgd", "--powersgd-rank", "4",
                                                     "--clip-grad", "0"]), world=2)
    c = run.compress
    assert (c.onebit_freeze_iters, c.onebit_powersgd.rank, c.onebit_powersgd.start_iter) == (2, 4, 2)
    assert not c.powersgd.enabled  # the rank is the momentum's, not the gradient's
    mesh = argparse.Namespace(ledger=None, dp_cp=argparse.Namespace(size=2, name="dp"), tp=argparse.Namespace(size=1),
                              pp=argparse.Namespace(size=1))
    assert isinstance(build(c, mesh, run.zero), MomentumPowerSGDReduction)
    sign = run_config(train_script.parse_args(BASE + ["--optimizer", "onebit-adam", "--onebit-freeze-iters", "2"]),
                      world=2).compress  # the default compressor is still DeepSpeed's signs
    assert not sign.onebit_powersgd.enabled and type(build(sign, mesh, run.zero)) is OneBitAdamReduction


@pytest.mark.parametrize("other", ["powersgd", "onebit"])
def test_another_compressors_checkpoint_is_refused_by_name_not_read_as_fresh(other):
    from hybrid.compress.momentum import MomentumCheckpoint
    with pytest.raises(SystemExit, match="--onebit-compressor powersgd: the checkpoint holds the state of") as e:
        MomentumCheckpoint(None).before_load({other: {"iter": 5, "dp": 2, "tp": 1, "pp": 1}})
    assert "\n" not in str(e.value)


# --- a train.py run saved after the freeze resumes bit for bit ----------------------------------------------------
MOMENTUM = ["--powersgd-rank", "2", "--zero-stage", "0", "--optimizer", "onebit-adam", "--onebit-freeze-iters", "2",
            "--onebit-compressor", "powersgd"]


@pytest.mark.slow
def test_momentum_powersgd_run_saved_after_the_freeze_resumes_bit_for_bit_dp2(tmp_path):
    """Saved after step 4 (compressed since step 3: residual and Q non-zero), resumed for steps 5-6: the losses and
    every saved tensor (weights, moments, the momentum's residual and Q) equal the uninterrupted run's."""
    from tests.test_compress_train import COMMON, assert_resume_bit_for_bit, runnable

    from hybrid import testing

    def run(flags):
        argv = [w for w in runnable(COMMON + MOMENTUM + flags)]
        i = argv.index("--powersgd-start-iter")  # COMMON's gradient start: refused with the momentum compressor
        argv = argv[:i] + argv[i + 2:]
        out = testing.torchrun(argv, 2, env={"OMP_NUM_THREADS": "1"}, cwd=ROOT, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]

    a = assert_resume_bit_for_bit(run, tmp_path)
    errors = [k for k in a if k.startswith("compress/momentum_powersgd.error/")]
    qs = [k for k in a if k.startswith("compress/momentum_powersgd.q/")]
    assert errors and qs and any(a[k].abs().max() > 0 for k in errors), sorted(a)[:20]
