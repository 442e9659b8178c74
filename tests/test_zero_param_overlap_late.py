"""ZeRO 1-2's overlapped post-step all-gather when the gathers complete as late as they can.

With real asynchronous gathers, a reader that forgot to wait only races them, and on two idle CPU cores the
gather mostly wins, so a missing wait can pass test_zero_param_overlap.py. Here the DP group's
`all_gather_into` and `all_gather_in_place` are replaced by ones that move nothing until their work is waited for
(`Late`): a forward hook, checkpoint save or load, or `gathered()` that did not wait reads the other rank's half
of the previous step, deterministically. The runs must still equal the blocking runs (`--no-overlap-param-gather`) bit for bit, and a
control with the forward's waits removed must not (the harness sees a missing wait).

Checkpoints: saved right after a step (every gather in flight), then loaded both into a fresh run and into the
same run while the next step's gathers are in flight; training on from either gives the blocking run's losses
and weights.
"""

from __future__ import annotations

import os

import pytest
import torch

from hybrid.checkpoint import core, store
from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.mesh import Mesh, ParallelDims
from hybrid.testing import run_distributed
from hybrid.tp import TPContext
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import Precision, ZeroConfig, ZeroOptimizer
from models import build_pipeline_chunks, load_config

STEPS, GLOBAL, MICRO, SEQ, SAVE_AT = 4, 8, 2, 32, 2
OPT = OptimizerConfig(lr=1e-3, eps=1e-5, weight_decay=0.01, decay_style="constant")
CASES = [(1, Precision.FP32), (2, Precision.BF16)]


class _LateWork:
    def __init__(self, post) -> None:
        self.post = post  # the real collective, posted only when waited for

    def wait(self) -> None:
        self.post().wait()


class Late:
    """The DP group with every all-gather (out of place or in place) run at its wait instead of its post;
    everything else unchanged."""

    def __init__(self, group) -> None:
        self._group = group

    def __getattr__(self, name: str):
        return getattr(self._group, name)

    def all_gather_into(self, out: torch.Tensor, shard: torch.Tensor) -> _LateWork:
        return _LateWork(lambda: self._group.all_gather_into(out, shard))

    def all_gather_in_place(self, flat: torch.Tensor) -> _LateWork:  # the write-back's gather (engine._write_back)
        return _LateWork(lambda: self._group.all_gather_in_place(flat))


class Run:
    def __init__(self, mesh: Mesh, stage: int, precision: Precision, overlap: bool, late: bool) -> None:
        self.mesh = mesh
        self.chunks = build_pipeline_chunks(load_config("tiny-llama"), TPContext(mesh.tp), 0, 1, 1, seed=5)
        self.spec = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp)
        self.runner = LocalForwardBackward(self.chunks[0], mesh.device)
        z = ZeroConfig(stage=stage, precision=precision, overlap_param_gather=overlap, bucket_bytes=2**14)
        self.opt = ZeroOptimizer(self.chunks, mesh, z, OPT)
        if late:
            self.opt.dp = Late(self.opt.dp)
        self.names = core.param_names(self.chunks)
        self.corpus = load_corpus()
        self.stage = stage

    def step(self, it: int) -> float:
        batches = micro_batches(self.corpus, self.spec, 3, it, self.mesh.coords.dp)
        return train_step(self.chunks, batches, self.opt, self.mesh, runner=self.runner)

    def in_flight(self) -> int:
        return len(self.opt._param_gathers)

    def weights(self) -> dict[str, torch.Tensor]:
        with self.opt.gathered():
            return {n: p.detach().float().clone() for c in self.chunks for n, p in c.named_parameters()}

    def save(self, root: str, iteration: int) -> str:
        state = {"model": "tiny-llama", "layout": {"tp": 1, "pp": 1, "dp": self.mesh.dims.dp, "zero": self.stage},
                 "iteration": iteration, "consumed_samples": iteration * GLOBAL}
        core.start_save(self.opt, self.names, None, root, iteration, state).finish()
        return store.final_path(root, iteration)

    def load(self, directory: str) -> None:
        core.load(self.opt, self.names, None, directory, rng_too=False)


def _without_forward_waits(opt: ZeroOptimizer) -> None:
    """The control: the forward hooks skip their wait; the next step's write-back still waits (late)."""
    wait = opt._wait_gathers
    opt.wait_params = lambda: wait(opt.units)
    opt._wait_gathers = lambda units: None


def _train(mesh: Mesh, stage: int, precision: Precision, overlap: bool, late: bool, control: bool = False) -> dict:
    run = Run(mesh, stage, precision, overlap, late)
    if control:
        _without_forward_waits(run.opt)
    losses = [run.step(it) for it in range(STEPS)]
    return {"losses": losses, "weights": run.weights()}


def _checkpoints(mesh: Mesh, root: str, stage: int, precision: Precision) -> dict:
    """Late overlapped run: SAVE_AT steps, save (gathers in flight), STEPS - SAVE_AT more, one more step, then
    load the checkpoint with that step's gathers in flight and train the same steps again. A fresh late run
    loads it too and trains them."""
    run = Run(mesh, stage, precision, True, True)
    for it in range(SAVE_AT):
        run.step(it)
    out = {"in_flight_at_save": run.in_flight()}
    path = run.save(os.path.join(root, f"{stage}-{precision.value}"), SAVE_AT)
    out["continued"] = [run.step(it) for it in range(SAVE_AT, STEPS)]
    out["continued_weights"] = run.weights()
    run.step(STEPS)
    out["in_flight_at_load"] = run.in_flight()
    run.load(path)
    out["reloaded"] = [run.step(it) for it in range(SAVE_AT, STEPS)]
    out["reloaded_weights"] = run.weights()
    fresh = Run(mesh, stage, precision, True, True)
    fresh.load(path)
    out["fresh"] = [fresh.step(it) for it in range(SAVE_AT, STEPS)]
    out["fresh_weights"] = fresh.weights()
    return out


def _dp2(rank, world, root):
    mesh = Mesh.build(ParallelDims(dp=world))
    out = {}
    for stage, p in CASES:
        key = (stage, p.value)
        out[key] = {"blocking": _train(mesh, stage, p, overlap=False, late=False),
                    "late": _train(mesh, stage, p, overlap=True, late=True),
                    "control": _train(mesh, stage, p, overlap=True, late=True, control=True),
                    "ckpt": _checkpoints(mesh, root, stage, p)}
    return out


@pytest.fixture(scope="module")
def dp2(tmp_path_factory):
    return run_distributed(_dp2, 2, args=(str(tmp_path_factory.mktemp("late")),), timeout=300)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    assert a.keys() == b.keys()
    return [n for n in a if not torch.equal(a[n], b[n])]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"stage{c[0]}-{c[1].value}")
def test_gathers_completing_at_their_wait_give_the_blocking_run_bit_for_bit(dp2, case):
    for rank, res in enumerate(dp2):
        r = res[(case[0], case[1].value)]
        assert r["late"]["losses"] == r["blocking"]["losses"], rank
        assert not _same(r["late"]["weights"], r["blocking"]["weights"]), rank


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"stage{c[0]}-{c[1].value}")
def test_the_harness_sees_a_forward_that_does_not_wait(dp2, case):
    """Step 0 has nothing in flight, so its loss agrees; from step 1 the forward reads stale halves."""
    for rank, res in enumerate(dp2):
        r = res[(case[0], case[1].value)]
        assert r["control"]["losses"][0] == r["blocking"]["losses"][0], rank
        assert r["control"]["losses"][1:] != r["blocking"]["losses"][1:], rank
        assert _same(r["control"]["weights"], r["blocking"]["weights"]), rank


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"stage{c[0]}-{c[1].value}")
def test_checkpoint_saved_and_loaded_while_gathers_are_in_flight(dp2, case):
    for rank, res in enumerate(dp2):
        r = res[(case[0], case[1].value)]
        c, want = r["ckpt"], r["blocking"]
        assert c["in_flight_at_save"] > 2 and c["in_flight_at_load"] > 2, rank
        assert c["continued"] == want["losses"][SAVE_AT:], rank
        assert not _same(c["continued_weights"], want["weights"]), rank
        for run in ("reloaded", "fresh"):
            assert c[run] == want["losses"][SAVE_AT:], (rank, run)
            assert not _same(c[f"{run}_weights"], want["weights"]), (rank, run)
