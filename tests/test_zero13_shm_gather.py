"""ZeRO 1-2's post-step all-gather through shared memory (`ZeroConfig.shm_gather`, hybrid/zero/shm.py) against
gloo's gather it replaces, on a 2-rank pair: losses and weights after several steps equal gloo's bit for bit (stage 1
and 2, one micro-batch and two, fp32 and bf16 -- the master apart from the shard --, the step in gather order and
round 11's one call then the gathers), the ledger records the same all-gather bytes, and the shared path did run; the
gather alone equals gloo's with several gathers in flight; where the ranks do not see each other's file (another
/dev/shm: another host) or there is no room, both fall back to gloo; set-up leaves no file behind. The default since
round 14; its writers' waits and stale files: tests/test_zero14_shm_writers.py. The unsharded
reference for ZeRO 1-2 is tests/test_zero.py's."""

from __future__ import annotations

import os

import pytest
import torch

from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.mesh import Mesh, ParallelDims
from hybrid.testing import run_distributed
from hybrid.tp import TPContext
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from hybrid.zero.config import Precision
from models import build_pipeline_chunks, load_config

STEPS, MICRO, SEQ = 3, 2, 16
OPT = OptimizerConfig(lr=1e-3, eps=1e-5, decay_style="constant")
# (stage, micro-batches a step, precision, step in gather order)
CASES = [(1, 1, Precision.FP32, True), (2, 2, Precision.FP32, False), (1, 2, Precision.BF16, True)]


def _train(mesh: Mesh, stage: int, m: int, precision: Precision, in_order: bool, shm: bool) -> dict:
    chunks = build_pipeline_chunks(load_config("tiny-llama"), TPContext(mesh.tp), 0, 1, 1, seed=3)
    spec = BatchSpec(MICRO * m * mesh.dims.dp, MICRO, SEQ, mesh.dims.dp)
    cfg = ZeroConfig(stage=stage, precision=precision, bucket_bytes=2**14, step_in_gather_order=in_order,
                     shm_gather=shm)
    opt = ZeroOptimizer(chunks, mesh, cfg, OPT)
    runner, corpus, losses, gathered = LocalForwardBackward(chunks[0], mesh.device), load_corpus(), [], []
    for it in range(STEPS):
        mesh.ledger.reset()
        losses.append(train_step(chunks, micro_batches(corpus, spec, 3, it, mesh.coords.dp), opt, mesh,
                                 runner=runner))
        gathered.append(mesh.ledger.bytes("all_gather", "dp"))
    with opt.gathered():
        weights = {n: p.detach().float().clone() for n, p in chunks[0].named_parameters()}
    return {"losses": losses, "weights": weights, "gathered": gathered, "active": opt.shm_gather_active,
            "posted": opt._shared.posted if opt._shared is not None else 0, "units": len(opt.units)}


def _gather_alone(mesh: Mesh) -> bool:
    """Three units of odd sizes posted at once, waited in order, twice: each equals gloo's in-place gather."""
    from hybrid.zero.shm import SharedFlats
    dp, numels = mesh.dp, [6, 2, 1026]
    shared = SharedFlats.open(dp, numels, torch.float32)
    ok = True
    for rnd in range(2):
        gen = torch.Generator().manual_seed(100 * rnd + dp.rank)
        want = []
        for i, k in enumerate(numels):
            half = k // 2
            mine = torch.randn(half, generator=gen)
            shared.flat(i)[dp.rank * half:(dp.rank + 1) * half] = mine
            ref = torch.zeros(k)
            ref[dp.rank * half:(dp.rank + 1) * half] = mine
            dp.all_gather_in_place(ref).wait()
            want.append(ref)
        works = [shared.all_gather(i) for i in range(len(numels))]
        for w in works:
            w.wait()
        ok &= all(torch.equal(shared.flat(i), want[i]) for i in range(len(numels)))
        shared.wait_taken(list(range(len(numels))))
    return ok


def _fallbacks(mesh: Mesh, own_dir: str, empty_dir: str) -> list:
    from hybrid.zero import shm
    other_host = shm.SharedFlats.open(mesh.dp, [4], torch.float32, shm_dir=os.path.join(own_dir, str(mesh.dp.rank)))
    missing = shm.SharedFlats.open(mesh.dp, [4], torch.float32, shm_dir=os.path.join(own_dir, "absent"))
    kept = shm.SharedFlats.open(mesh.dp, [4], torch.float32, shm_dir=empty_dir)
    mesh.dp.barrier()  # both ranks past their unlink
    left = os.listdir(empty_dir)
    return [other_host is None, missing is None, kept is not None, left]


def _run_training(rank, world, tmp):
    from hybrid.zero import shm
    shm.SHM_DIR = tmp  # this test's own directory
    mesh = Mesh.build(ParallelDims(dp=world))
    return {case + (on,): _train(mesh, *case, on) for case in CASES for on in (False, True)}


def _run(rank, world, tmp):
    from hybrid.zero import shm
    shm.SHM_DIR = os.path.join(tmp, "shm")  # this test's own directory: its files are the only ones there
    mesh = Mesh.build(ParallelDims(dp=world))
    out = {"alone": _gather_alone(mesh)}
    os.makedirs(os.path.join(tmp, "own", str(rank)), exist_ok=True)
    mesh.dp.barrier()
    out["fallbacks"] = _fallbacks(mesh, os.path.join(tmp, "own"), shm.SHM_DIR)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("shm"))
    os.makedirs(os.path.join(tmp, "shm"))
    return run_distributed(_run, 2, args=(tmp,))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return run_distributed(_run_training, 2, args=(str(tmp_path_factory.mktemp("shm_train")),))


@pytest.mark.slow  # six short trainings (~15 s on a loaded 2-core machine); the gather alone is in the fast tier
@pytest.mark.parametrize("case", CASES)
def test_shared_memory_gather_gives_gloos_losses_and_weights_bit_for_bit(trained, case):
    for r in trained:
        gloo, shm = r[case + (False,)], r[case + (True,)]
        assert shm["losses"] == gloo["losses"]
        assert gloo["losses"][-1] != gloo["losses"][0]  # it trained
        for name, w in gloo["weights"].items():
            assert torch.equal(shm["weights"][name], w), name


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_shared_memory_gather_records_gloos_all_gather_bytes_and_runs(trained, case):
    """The same all-gather bytes on the ledger every step; every unit gathered through shared memory every step
    when asked for, never otherwise."""
    for r in trained:
        gloo, shm = r[case + (False,)], r[case + (True,)]
        assert shm["gathered"] == gloo["gathered"] and gloo["gathered"][0] > 0
        assert shm["active"] and shm["posted"] == shm["units"] * STEPS
        assert not gloo["active"] and gloo["posted"] == 0


def test_the_gather_alone_equals_gloos_with_several_in_flight(runs):
    assert all(r["alone"] for r in runs)


def test_another_hosts_files_or_no_dir_fall_back_on_both_ranks_and_set_up_leaves_no_file(runs):
    """Each rank in its own directory (as two hosts' /dev/shm): neither sees the other's file, both fall back; a
    directory that does not exist: both fall back; a shared one: set up, and the files are unlinked."""
    for r in runs:
        assert r["fallbacks"] == [True, True, True, []]


def test_shm_gather_is_accepted_at_every_stage_since_it_became_the_default():
    """Round 14 made it the default "where it applies" (stages 1-2, a 2-rank gloo pair on one x86-64 host), so a
    stage-0 or stage-3 config carries it without error; that it then gathers through gloo is
    tests/test_zero14_shm_writers.py::test_the_default_gathers_through_shared_memory_at_stages_1_and_2_only..."""
    for stage in (0, 3):
        assert ZeroConfig(stage=stage, shm_gather=True).shm_gather
