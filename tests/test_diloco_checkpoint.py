"""DiLoCo's state in checkpoints, through train.py (4 ranks, tp2 x dp2: 2 replicas, H = 2, outer momentum 0.9).

* The straight run saves at iteration 3 -- mid-round: the replicas' weights and Adam moments apart, one step
  after their last sync (at 2, which made the outer momentum nonzero) -- and at 4. A run resumed from its
  iteration-3 checkpoint logs the same loss for iteration 4 and ends, after the sync at 4 (an outer Nesterov step
  on the restored theta with the restored momentum), with every tensor of its checkpoint equal, bit for bit: both
  replicas' master weights and moments, theta and the outer momentum. H = 2 is the fewest steps that puts a sync
  on each side of a mid-round save (H = 4 ran 8 + 2 steps for the same three events; a 4-rank step is ~0.25 s
  of CPU).
* The iteration-3 checkpoint loaded at another layout (pp2 x dp2: other TP and PP shards of every tensor) by
  train.py's own objects (the loop's build_runner, LocalUpdates, RunCheckpoints) and saved again at once holds the
  same tensors, bit for bit (the RNG streams aside: per rank, not restored at another layout): DiLoCo's state
  reshards with the rest.
* Mid-overlap (Streaming DiLoCo, 2 ranks: H = 4, K = 2, tau = 1, alpha 0.5): at iteration 6 fragment 0's
  all-reduce is in flight (posted after step 6, applied after 7). The save waits for it and stores its average;
  the run resumed from there applies it after step 7 as the straight run did: the same losses for 7 and 8, every
  tensor equal.
* DiLoCo starting from a checkpoint saved without it (a synchronous run's at iteration 2, the paper's start from a
  pretrained model): every replica takes its weights and Adam state, theta its weights -- the first loss after the
  resume is the synchronous run's own next loss, bit for bit -- and a checkpoint of another number of replicas is
  one line.
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
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)

pytestmark = pytest.mark.slow  # end-to-end train.py launches (conftest.py: the fast tier leaves them out)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# --eval-iters 1: the end's validation and test passes on one global batch each, not the default 10 (no check here
# reads them; they ran 20 forward batches in each of the file's train.py launches)
COMMON = ["--global-batch-size", "8", "--micro-batch-size", "2", "--seq-length", "32", "--log-interval", "1",
          "--lr", "3e-3", "--eval-iters", "1", "--diloco-inner-steps", "2", "--diloco-outer-lr", "0.7", "--diloco-outer-momentum", "0.9"]
TP2 = ["--tensor-model-parallel-size", "2"]
PP2 = ["--pipeline-model-parallel-size", "2"]


def _run(flags: list[str], common: list[str] = COMMON, ok: bool = True, world: int = 4):
    out = testing.torchrun(common + flags, world, env={"HYBRID_FAULT": None, "OMP_NUM_THREADS": "1"}, cwd=ROOT,
                           timeout=600)
    assert (out.returncode == 0) == ok, out.stderr[-3000:]
    return out


def _tensors(root: str, iteration: int) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, each read whole by DCP in this one process."""
    path = store.final_path(root, iteration)
    meta = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    sd = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items()
          if isinstance(m, TensorStorageMetadata)}
    dcp.load(sd, storage_reader=dcp.FileSystemReader(path), no_dist=True)
    return sd


def _losses(path: str) -> dict[int, str]:
    with open(path) as f:
        return {r["iteration"]: repr(r["lm_loss"]) for r in map(json.loads, f) if "lm_loss" in r}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    d = tmp_path_factory.mktemp("diloco_straight")
    _run(TP2 + ["--train-iters", "4", "--save-interval", "3", "--save", str(d / "ckpt"),
                "--metrics-file", str(d / "m.jsonl")])
    return d


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k}: off by {(a[k] - b[k]).abs().max().item():.3g}"


def test_checkpoint_holds_the_outer_state_and_every_replica(straight):
    t = _tensors(str(straight / "ckpt"), 3)
    for kind in ("diloco.anchor/", "diloco.momentum/", "diloco.replica1/model/", "diloco.replica1/optim."):
        assert any(k.startswith(kind) for k in t), kind
    # mid-round the replicas are apart: replica 1's weights are not replica 0's
    assert not torch.equal(t["model/wte.weight"], t["diloco.replica1/model/wte.weight"])


def test_diloco_resumes_mid_round_bit_for_bit(straight, tmp_path):
    _run(TP2 + ["--train-iters", "4", "--load", str(straight / "ckpt"), "--ckpt-step", "3",
                "--save", str(tmp_path / "ckpt"), "--metrics-file", str(tmp_path / "m.jsonl")])
    want, got = _losses(str(straight / "m.jsonl")), _losses(str(tmp_path / "m.jsonl"))
    assert sorted(got) == [4] and got[4] == want[4]
    _same(_tensors(str(tmp_path / "ckpt"), 4), _tensors(str(straight / "ckpt"), 4))


def _reshard(rank: int, world: int, load: str, save: str) -> None:
    """train.py's start-up at pp2 x dp2 up to the resume (hybrid/train/loop.py), then a save of what it loaded."""
    from hybrid.checkpoint.run import RunCheckpoints
    from hybrid.diloco.run import LocalUpdates
    from hybrid.mesh import Mesh
    from hybrid.tp import ParallelRNG, TPContext
    from hybrid.train.args import parse_args, run_config
    from hybrid.train.loop import build_runner, run_info
    from hybrid.zero import ZeroOptimizer
    run = run_config(parse_args(COMMON + PP2 + ["--train-iters", "4", "--load", load, "--ckpt-step", "3",
                                                "--save", save]), world)
    mesh = Mesh.build(run.parallel.dims)
    tp = TPContext(mesh.tp, rng=ParallelRNG(run.training.seed, mesh.coords.tp, mesh.coords.pp, mesh.device))
    model, _ = build_runner(run, mesh, tp)
    local = LocalUpdates.build(run.diloco, mesh)
    saved = local.checkpointed(ZeroOptimizer(model, local.mesh, run.zero, run.optimizer))
    ckpt = RunCheckpoints(run.checkpoint, mesh, model, saved, tp.rng, run_info(run), owners=local.owners())
    ckpt.save(*ckpt.resume())


def test_diloco_state_reshards_to_another_tp_pp_layout(straight, tmp_path):
    testing.run_distributed(_reshard, 4, args=(str(straight / "ckpt"), str(tmp_path / "ckpt")), timeout=300)
    got, want = _tensors(str(tmp_path / "ckpt"), 3), _tensors(str(straight / "ckpt"), 3)
    _same(*({k: v for k, v in t.items() if not k.startswith("rng/")} for t in (got, want)))


SYNC = COMMON[:COMMON.index("--diloco-inner-steps")]  # the same run without DiLoCo


def test_diloco_starts_from_a_synchronous_checkpoint(tmp_path):
    _run(TP2 + ["--train-iters", "4", "--save-interval", "2", "--save", str(tmp_path / "sync"),
                "--metrics-file", str(tmp_path / "sync.jsonl")], common=SYNC)
    _run(TP2 + ["--train-iters", "4", "--load", str(tmp_path / "sync"), "--ckpt-step", "2",
                "--save", str(tmp_path / "diloco"), "--metrics-file", str(tmp_path / "diloco.jsonl")])
    sync, diloco = _losses(str(tmp_path / "sync.jsonl")), _losses(str(tmp_path / "diloco.jsonl"))
    assert diloco[3] == sync[3]  # step 3's loss: the loaded weights, on every replica
    assert diloco[4] != sync[4]  # then the replicas go their own ways
    t = _tensors(str(tmp_path / "diloco"), 4)  # after the sync at 4: theta is every replica's weights
    assert torch.equal(t["diloco.anchor/wte.weight"], t["model/wte.weight"])
    assert torch.equal(t["diloco.replica1/model/wte.weight"], t["model/wte.weight"])


def test_another_number_of_replicas_is_one_line(straight):
    out = _run(TP2 + ["--train-iters", "4", "--load", str(straight / "ckpt"), "--diloco-replicas", "1"], ok=False)
    assert "holds DiLoCo state of 2 replicas, this run has 1; resume with --diloco-replicas 2" in out.stderr
    assert "Traceback" not in out.stderr


# H = 4 here (COMMON's 2 overridden: the last flag wins): K = 2 fragments sync in turn every H / K = 2 steps
OVERLAP = ["--diloco-inner-steps", "4", "--diloco-fragments", "2", "--diloco-fragment-sync-delay", "1",
           "--diloco-fragment-update-alpha", "0.5", "--train-iters", "8"]


def test_overlapped_diloco_resumes_mid_flight_bit_for_bit(tmp_path):
    _run(OVERLAP + ["--save-interval", "6", "--save", str(tmp_path / "a"), "--metrics-file", str(tmp_path / "a.jsonl")],
         world=2)
    state = store.read_state(store.final_path(str(tmp_path / "a"), 6))
    assert state["diloco.inflight"] == 0  # fragment 0 posted after step 6, applied after step 7
    saved = _tensors(str(tmp_path / "a"), 6)
    pending = {k: v for k, v in saved.items() if k.startswith("diloco.pending/")}
    assert any(v.abs().max() > 0 for v in pending.values())  # fragment 0's averaged delta ...
    assert any(not v.any() for v in pending.values())  # ... and 0 for fragment 1's parameters
    _run(OVERLAP + ["--load", str(tmp_path / "a"), "--ckpt-step", "6", "--save", str(tmp_path / "b"),
                    "--metrics-file", str(tmp_path / "b.jsonl")], world=2)
    want, got = _losses(str(tmp_path / "a.jsonl")), _losses(str(tmp_path / "b.jsonl"))
    assert [got[i] for i in (7, 8)] == [want[i] for i in (7, 8)]
    _same(_tensors(str(tmp_path / "b"), 8), _tensors(str(tmp_path / "a"), 8))
    out = _run(["--diloco-inner-steps", "4", "--diloco-fragments", "2", "--train-iters", "8", "--load",
                str(tmp_path / "a"), "--ckpt-step", "6"], ok=False, world=2)  # tau 0 cannot take the delta in flight
    assert "was saved with --diloco-fragment-sync-delay 1, this run has 0" in out.stderr
    assert "Traceback" not in out.stderr
