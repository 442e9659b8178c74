"""PowerSGD's state reshards (hybrid/compress/state.py): keyed by parameter, not by bucket.

* DP: loading at another DP size gives each rank the saved ranks' mean error; the next compressed step's
  all-reduced factors then equal those of the saved DP size (PowerSGD is linear in M_i = g_i + e_i up to each
  all-reduce) -- checked on reduce_bucket itself at dp 2 against dp 1, float64.
* PP: a run saved at pp2 x dp2 mid-run (error feedback and Q non-zero) resumes at pp1 x dp2 with the losses of the
  uninterrupted pp2 run, bit for bit (the per-parameter math does not depend on the buckets).
* Round trip: pp2 x dp2 -> pp1 x dp2 -> tp2 x dp2 -> pp2 x dp2, each loaded by train.py's own objects and saved
  at once: every tensor equal to the original checkpoint bit for bit -- except the warm-start Q of TP-split
  matrices after the TP change, which is drawn afresh (another matrix shape: another power iteration), said so
  in docs/comm-efficient.md. Loaded at pp1 x dp1 (and --powersgd-rank 3), the one rank's error is the two saved
  rows' mean.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from hybrid import testing
from hybrid.checkpoint import store
from tests.test_compress_train import runnable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ["--global-batch-size", "8", "--seq-length", "32", "--micro-batch-size", "2", "--log-interval", "1",
          "--lr", "3e-3", "--powersgd-rank", "2", "--powersgd-start-iter", "2", "--zero-stage", "1",
          "--eval-iters", "1"]  # end-of-run validation and test: one batch each (none read)
PP2, TP2 = ["--pipeline-model-parallel-size", "2"], ["--tensor-model-parallel-size", "2"]


# --- DP: the factors depend on the errors only through their mean ------------------------------------------------
def _factors(rank: int, world: int):
    """reduce_bucket on the same global gradient over dp 2 (rank i: g_i, e_i) and over dp 1 (one rank: the mean
    gradient and, as a load at dp 1 gives it, the mean error): the all-reduced orthonormal P, the mean Q and the
    output. And dp 1 with a rank's own error instead of the mean, which must differ."""
    from hybrid.comm import Group
    from hybrid.compress.powersgd import PowerSGDConfig, PowerSGDState, reduce_bucket
    from hybrid.mesh import Mesh, ParallelDims
    torch.set_num_threads(1)
    mesh = Mesh.build(ParallelDims.from_world(world))
    shapes = [(24, 40), (40,), (16, 24), (24, 40)]  # two compressed shapes (r = 3: Householder QR), a 1-D tensor
    numel = sum(torch.Size(s).numel() for s in shapes)
    g, e = ([torch.randn(numel, generator=torch.Generator().manual_seed(seed + i), dtype=torch.float64)
             for i in range(2)] for seed in (10, 20))
    out = {}
    for kind, group, grad, err in (("dp2", mesh.dp, g[rank], e[rank]),
                                   ("dp1", Group.solo("dp1"), (g[0] + g[1]) / 2, (e[0] + e[1]) / 2),
                                   ("dp1, own error", Group.solo("dp1"), (g[0] + g[1]) / 2, e[rank])):
        state = PowerSGDState(PowerSGDConfig(rank=3, start_iter=0))
        state.error[0] = err.clone()
        buf, views, at = grad.clone(), [], 0
        for s in shapes:
            views.append(buf[at:at + torch.Size(s).numel()].view(s))
            at += torch.Size(s).numel()
        reduce_bucket(state, 0, buf, views, group)
        out[kind] = (state.p[0].clone(), state.q[0].clone(), buf.clone())
    return out


def test_powersgd_factors_at_another_dp_equal_given_the_mean_error():
    """P, Q and the output at dp 1 (the mean error) equal dp 2's to float64 rounding: the two differ only in where
    the mean over ranks is taken (before the products at dp 1, after them in the all-reduce at dp 2), so each
    element differs by a few roundings of sums of <= 40 products: |diff| <= ~40 x 2^-52 x its terms' size.
    rtol = atol / max = 1e-12 covers that with room and is ~10^9 below the own-error case's difference."""
    for r in testing.run_distributed(_factors, 2, timeout=300):
        for a, b in zip(r["dp2"], r["dp1"]):
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-12 * b.abs().max().item()), (a - b).abs().max()
        # the check has teeth: a rank's own error (not the mean) gives other factors
        assert not torch.allclose(r["dp2"][1], r["dp1, own error"][1], rtol=1e-3)


# --- PP and TP: train.py -----------------------------------------------------------------------------------------
def _run(flags: list[str], world: int):
    out = testing.torchrun(runnable(COMMON + flags), world, env={"HYBRID_FAULT": None, "OMP_NUM_THREADS": "1"},
                           cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _tensors(root: str, iteration: int) -> dict[str, torch.Tensor]:
    path = store.final_path(root, iteration)
    meta = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    sd = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items()
          if isinstance(m, TensorStorageMetadata) and not k.startswith("rng/")}
    dcp.load(sd, storage_reader=dcp.FileSystemReader(path), no_dist=True)
    return sd


def _losses(path: str) -> dict[int, str]:
    with open(path) as f:
        return {r["iteration"]: repr(r["lm_loss"]) for r in map(json.loads, f) if "lm_loss" in r}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """pp2 x dp2, 6 steps, saved after 4 (compressing since step 3)."""
    d = tmp_path_factory.mktemp("powersgd_pp2")
    _run(PP2 + ["--train-iters", "6", "--save-interval", "4", "--save", str(d / "ckpt"),
                "--metrics-file", str(d / "m.jsonl")], 4)
    return d


@pytest.mark.slow
def test_powersgd_saved_at_pp2_resumes_at_pp1_with_the_uninterrupted_losses(straight, tmp_path):
    _run(["--train-iters", "6", "--load", str(straight / "ckpt"), "--ckpt-step", "4",
          "--metrics-file", str(tmp_path / "m.jsonl")], 2)
    want, got = _losses(str(straight / "m.jsonl")), _losses(str(tmp_path / "m.jsonl"))
    assert sorted(got) == [5, 6] and [got[i] for i in (5, 6)] == [want[i] for i in (5, 6)], (got, want)


def _reshard(rank: int, world: int, flags: list[str], load: str, save: str) -> None:
    """train.py's start-up at `flags`' layout up to the resume (hybrid/train/loop.py), then a save of what it
    loaded."""
    from hybrid.checkpoint.run import RunCheckpoints
    from hybrid.compress.reduction import build, owners
    from hybrid.mesh import Mesh
    from hybrid.tp import ParallelRNG, TPContext
    from hybrid.train.args import parse_args, run_config
    from hybrid.train.loop import build_runner, run_info
    from hybrid.zero import ZeroOptimizer
    run = run_config(parse_args(runnable(COMMON + flags) + ["--train-iters", "6", "--load", load, "--ckpt-step", "4",
                                                  "--save", save]), world)
    mesh = Mesh.build(run.parallel.dims)
    tp = TPContext(mesh.tp, rng=ParallelRNG(run.training.seed, mesh.coords.tp, mesh.coords.pp, mesh.device))
    model, _ = build_runner(run, mesh, tp)
    reduction = build(run.compress, mesh, run.zero)
    opt = ZeroOptimizer(model, mesh, run.zero, run.optimizer, reduction)
    ckpt = RunCheckpoints(run.checkpoint, mesh, model, opt, tp.rng, run_info(run), owners=owners(reduction))
    ckpt.save(*ckpt.resume())


@pytest.mark.slow
def test_powersgd_state_round_trips_through_pp1_and_tp2_bit_for_bit(straight, tmp_path):
    want = _tensors(str(straight / "ckpt"), 4)
    errors = [k for k in want if k.startswith("compress/powersgd.error/")]
    assert errors and all(want[k].shape[0] == 2 for k in errors)  # a row per DP rank
    assert any(want[k].abs().max() > 0 for k in errors) and any(k.startswith("compress/powersgd.q/") for k in want)
    chain = [(["--pipeline-model-parallel-size", "1"], 2, "pp1"), (TP2, 4, "tp2"), (PP2, 4, "pp2")]
    src = str(straight / "ckpt")
    got = {}
    for flags, world, tag in chain:
        testing.run_distributed(_reshard, world, args=(flags, src, str(tmp_path / tag)), timeout=300)
        src, got[tag] = str(tmp_path / tag), _tensors(str(tmp_path / tag), 4)
    for k, v in want.items():  # pp1: everything maps
        assert torch.equal(got["pp1"][k], v), k
    for tag in ("tp2", "pp2"):  # after the TP change: everything but the Q of TP-split matrices
        split = {k for k in want if k.startswith("compress/powersgd.q/") and got["tp2"][k].shape[0] == 2}
        assert split  # the test model has TP-split matrices
        for k, v in want.items():
            if k not in split:
                assert torch.equal(got[tag][k], v), (tag, k)


@pytest.mark.slow
def test_powersgd_state_loaded_at_dp1_and_another_rank_is_the_saved_ranks_mean_error(straight, tmp_path):
    """The DP change: the one rank of pp1 x dp1 holds (e_0 + e_1) / 2 of every parameter. Loaded with
    --powersgd-rank 3 (saved at 2): the error feedback still maps, every Q is drawn afresh at the new width."""
    flags = ["--pipeline-model-parallel-size", "1", "--powersgd-rank", "3"]
    testing.run_distributed(_reshard, 1, args=(flags, str(straight / "ckpt"), str(tmp_path / "dp1")), timeout=300)
    want, got = _tensors(str(straight / "ckpt"), 4), _tensors(str(tmp_path / "dp1"), 4)
    assert want.keys() == got.keys()
    for k, v in want.items():
        if k.startswith("compress/powersgd.error/"):
            assert got[k].shape == (1, *v.shape[1:]) and torch.equal(got[k][0], v.sum(0) / 2), k
        elif k.startswith("compress/powersgd.q/"):
            assert v.shape[-1] == 2 and got[k].shape[-1] == 3 and got[k].abs().max() > 0, k
        else:
            assert torch.equal(got[k], v), k


# --- 1-bit Adam: reshards over TP and PP, a DP change refused by name ---------------------------------------------
ONEBIT = ["--powersgd-rank", "0", "--zero-stage", "0", "--optimizer", "onebit-adam", "--onebit-freeze-iters", "2"]


@pytest.mark.slow
def test_onebit_adam_error_feedback_round_trips_through_pp1_and_a_dp_change_is_refused(tmp_path):
    """Saved at pp2 x dp2 after step 4 (compressing since step 3), loaded at pp1 x dp2 and saved, loaded back at
    pp2 x dp2 and saved: the worker and server residuals of every parameter (and the weights and moments) equal
    the original bit for bit; only the residuals of the padding (`onebit.rest/`, zeros appended to each bucket) are
    layout-specific and restart at zero. Loading at dp 1 is one line naming the flag and the fix."""
    _run(ONEBIT + PP2 + ["--train-iters", "4", "--save", str(tmp_path / "ckpt")], 4)
    want = _tensors(str(tmp_path / "ckpt"), 4)
    for kind in ("compress/onebit.worker_error/", "compress/onebit.server_error/"):
        assert any(k.startswith(kind) and want[k].abs().max() > 0 for k in want), kind
    src = str(tmp_path / "ckpt")
    for flags, world, tag in ((ONEBIT + ["--pipeline-model-parallel-size", "1"], 2, "pp1"), (ONEBIT + PP2, 4, "pp2")):
        testing.run_distributed(_reshard, world, args=(flags, src, str(tmp_path / tag)), timeout=300)
        src, got = str(tmp_path / tag), _tensors(str(tmp_path / tag), 4)
        kept = [k for k in want if not k.startswith("compress/onebit.rest/")]
        assert len(kept) > len(want) // 2
        for k in kept:
            assert torch.equal(got[k], want[k]), (tag, k)
    out = testing.torchrun(runnable(COMMON + ONEBIT) + ["--train-iters", "6", "--load", str(tmp_path / "ckpt")], 1,
                           env={"HYBRID_FAULT": None, "OMP_NUM_THREADS": "1"}, cwd=ROOT, timeout=600)
    assert out.returncode != 0
    assert "saved at dp 2, this run has dp 1 (sign compression does not reshard across DP sizes); resume at dp 2" \
        in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
