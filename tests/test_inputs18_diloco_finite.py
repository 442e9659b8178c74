"""DiLoCo's outer state read back from a checkpoint must be finite (checkpoint.core._check_finite, CHECKED_FINITE's
"diloco." prefix): theta (the anchor), the outer momentum b and the delta in flight are each added into every later
outer step as they are, so a NaN or inf in any of them could only make the resumed run diverge. Round 17 wrote the
check and tested it through the compression state only; this test fails when "diloco." is dropped from it.

On one gloo rank, train.py's own objects (LocalUpdates around a ZeroOptimizer of tiny-gpt2; H 2, mu 0.9 and tau 1,
so all three kinds are stored) save through checkpoint.core.save_state with one element of one kind poisoned, and a
fresh LocalUpdates loads it: one line naming the .distcp file and the key; a clean checkpoint loads equal.
"""

from __future__ import annotations

import pytest
import torch

from hybrid import testing
from hybrid.checkpoint import store
from tests.test_trust17_compress_state import STATE

KINDS = ("anchor", "momentum", "pending")


def _outer():
    """A DiLoCo outer loop on this one-rank job (hybrid/diloco/run.py's hooks, as train.py calls them)."""
    from hybrid.diloco.args import DiLoCoConfig
    from hybrid.diloco.run import LocalUpdates
    from hybrid.mesh import Mesh, ParallelDims
    from hybrid.tp import TPContext
    from hybrid.train_step import OptimizerConfig
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    from models import build_pipeline_chunks, load_config
    mesh = Mesh.build(ParallelDims.from_world(1))
    chunks = build_pipeline_chunks(load_config("tiny-gpt2"), TPContext(mesh.tp), 0, 1, 1, seed=7)
    local = LocalUpdates.build(DiLoCoConfig(inner_steps=2, outer_momentum=0.9, fragment_sync_delay=1), mesh)
    local.checkpointed(ZeroOptimizer(chunks, local.mesh, ZeroConfig(), OptimizerConfig(lr=1e-3, train_iters=4)))
    return local.outer


def _tensor(outer, kind: str, i: int) -> torch.Tensor:
    return outer.anchors[i] if kind == "anchor" else outer.momentum(i) if kind == "momentum" else outer.pending[i]


def _cases(rank: int, world: int, root: str) -> dict[str, str]:
    """For each kind (and none): saved with element 3 of segment 0 NaN (inf for the momentum), loaded fresh."""
    from hybrid.checkpoint import core
    out = {}
    for poison in ("", *KINDS):
        saved = _outer()
        for kind in KINDS:  # values unlike the fresh owner's (theta = the init weights, b = 0, pending = 0)
            for i in range(len(saved.views)):
                _tensor(saved, kind, i).normal_(generator=torch.Generator().manual_seed(i))
        if poison:
            _tensor(saved, poison, 0).view(-1)[3] = float("inf" if poison == "momentum" else "nan")
        folder = f"{root}/{poison or 'clean'}"
        core.save_state({"diloco.": saved}, folder, 5, dict(STATE)).finish()
        fresh = _outer()
        try:
            core.load_state({"diloco.": fresh}, store.final_path(folder, 5))
        except store.CorruptCheckpoint as e:
            out[poison] = str(e)
            continue
        equal = all(torch.equal(_tensor(fresh, k, i), _tensor(saved, k, i))
                    for k in KINDS for i in range(len(saved.views)))
        out[poison] = "loaded, equal" if equal else "loaded, differs"
    return out


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("diloco_finite")
    out, = testing.run_distributed(_cases, 1, (str(root),))
    return {k: v.replace(str(root), "ROOT") for k, v in out.items()}


def test_a_clean_outer_state_loads_equal(cases):
    assert cases[""] == "loaded, equal"


@pytest.mark.parametrize("kind", KINDS)
def test_a_non_finite_outer_state_is_one_line_naming_the_file_and_key(kind, cases):
    line = cases[kind]
    head = f"ROOT/{kind}/iter_0000005/__0_0.distcp: diloco.{kind}/"
    assert line.startswith(head) and "\n" not in line, line
    key = line[len(head) - len(f"diloco.{kind}/"):].split(" ", 1)[0]
    assert line.endswith(f"{key} holds NaN or inf, which every later step would add in; not loaded (forged, "
                         f"corrupted, or saved from a diverged run): resume from an earlier checkpoint"), line
