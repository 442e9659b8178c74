"""Round 12's mutation pass (round 11's prepared queue, mutation6's .mut/): each test here kills a mutant that the
fast tier let live, shown failing on the mutant and passing on HEAD. In-process, no process group, < 1 s each.

The mutation ids (K9, ...) are those of the queue's modules; the report of branch quality12 lists them all."""

from __future__ import annotations

import os

from hybrid.checkpoint import store


def _complete_dirs(root: str, iterations: list[int], latest: int) -> None:
    """Complete checkpoints as store.complete_iterations and read_latest see them: iter_* with a manifest.json,
    `latest` naming one (their contents are not read by retention)."""
    for i in iterations:
        os.makedirs(store.final_path(root, i))
        with open(os.path.join(store.final_path(root, i), store.MANIFEST), "w") as f:
            f.write("{}")
    with open(os.path.join(root, store.LATEST), "w") as f:
        f.write(store.iter_name(latest) + "\n")


# --- K9: --save-keep N keeps the N newest complete checkpoints, not N - 1 ------------------------------------------
def test_save_keep_removes_exactly_the_checkpoints_beyond_the_newest_n(tmp_path):
    """store.retain(root, keep) deletes all but the `keep` newest (and never the one `latest` names). The mutant
    `len(done) - keep + 1` kept one fewer -- --save-keep 2 left a single checkpoint; the only test of --save-keep
    trains under torchrun (slow tier)."""
    root = str(tmp_path)
    _complete_dirs(root, [2, 4, 6, 8], latest=8)
    assert store.retain(root, 2) == [2, 4]
    assert store.complete_iterations(root) == [6, 8]
    assert store.retain(root, 2) == []  # already at the limit: nothing more goes
    _complete_dirs(str(tmp_path / "rolled"), [2, 4, 6], latest=2)  # a rollback: `latest` on the oldest
    assert store.retain(str(tmp_path / "rolled"), 1) == [4]  # the newest kept, and the one `latest` names


# --- T12: an index whose document index does not end at the sequence count is refused at open ------------------------
def test_a_document_index_not_ending_at_the_sequence_count_is_refused_by_name(tmp_path):
    """megatron-core's document index runs 0 .. N (documents + 1 entries). One ending short of N (a sequence in
    no document) or past it is a corrupt or foreign index, refused at open with the file named; the mutant that
    dropped `document_indices[-1] != n` opened both (only the first-entry and rising checks were left, and no test
    had an index ending wrong). Nothing downstream reads the document index, so only the check can tell."""
    import numpy as np
    import pytest

    from hybrid.data.indexed import IndexedDataset, bin_path, idx_path, write_index
    prefix = str(tmp_path / "corpus")
    np.arange(6, dtype=np.int32).tofile(bin_path(prefix))  # 3 sequences of 2 tokens
    for docs in ([0, 1, 2], [0, 1, 2, 3, 4]):
        write_index(idx_path(prefix), np.int32, [2, 2, 2], docs)
        with pytest.raises(ValueError) as e:
            IndexedDataset(prefix)
        assert str(e.value) == (f"--data-path {idx_path(prefix)}: the document index must rise from 0 to the 3 "
                                f"sequences")
    write_index(idx_path(prefix), np.int32, [2, 2, 2], [0, 1, 3])  # two documents: the good index opens
    assert len(IndexedDataset(prefix)) == 3


# --- K15: verify spreads the manifest's files over the ranks -- each file checked by exactly one ---------------------
def _with_data_files(root: str, iteration: int, data: dict[str, bytes]) -> str:
    """A complete checkpoint (no tensors: DCP's metadata of an empty state dict) whose manifest also lists `data`."""
    import pickle

    from torch.distributed.checkpoint.metadata import Metadata
    tmp = store.tmp_path(root, iteration)
    os.makedirs(tmp)
    with open(os.path.join(tmp, ".metadata"), "wb") as f:
        pickle.dump(Metadata(state_dict_metadata={}, storage_data={}), f)
    for name, content in data.items():
        with open(os.path.join(tmp, name), "wb") as f:
            f.write(content)
    state = {"iteration": iteration, "consumed_samples": 0, "model": "tiny-gpt2", "adam_step": 0,
             "scaler": {"loss_scale": 1.0, "good_steps": 0, "skipped_steps": 0},
             "layout": {"tp": 1, "pp": 1, "dp": 1, "zero": 0}}
    return store.finalize(root, iteration, {n: store.describe(os.path.join(tmp, n)) for n in data}, state)


def test_verify_checks_every_listed_file_once_over_the_ranks(tmp_path, monkeypatch):
    """core.verify gives rank r the files r, r + size, ... of the sorted manifest. The mutant striding by size + 1
    left files unchecked -- on one rank every other one: an altered __0_1.distcp loaded as sound -- and no fast test
    verifies a checkpoint with more than one data file (the resume tests that do are slow)."""
    from types import SimpleNamespace

    from hybrid.checkpoint import core
    from hybrid.comm import Group
    data = {f"__0_{i}.distcp": bytes([i]) * 16 for i in range(4)}
    path = _with_data_files(str(tmp_path), 2, data)
    assert core.verify(path, Group.solo("ckpt")) is None
    with open(os.path.join(path, "__0_1.distcp"), "r+b") as f:  # altered at its size: only the checksum tells
        f.write(b"\xff")
    assert core.verify(path, Group.solo("ckpt")) == (f"{os.path.join(path, '__0_1.distcp')}: sha256 differs from the "
                                                     f"manifest (corrupted)")
    listed = sorted(store.read_manifest(path)["files"])
    for size in (2, 3):  # the split over ranks: disjoint, and together the whole manifest
        seen = []
        monkeypatch.setattr(store, "verify_file", lambda d, name, want, checksum=True: seen.append(name))
        for rank in range(size):
            core.verify(path, SimpleNamespace(rank=rank, size=size, all_gather_object=lambda e: [e]))
        assert sorted(seen) == listed, (size, seen)



# --- L14: the planner pads a unit to a multiple of dp from ZeRO-1 on, as the engine does --------------------------
def test_planned_zero_collectives_carry_the_engines_padded_unit_at_every_sharded_stage():
    """hybrid/zero/units.py pads each flat unit to a multiple of the DP size whenever the optimizer state is
    sharded (ZeRO 1, 2 and 3), and the reduce-scatter / all-gather move the padded buffer. The mutant that padded
    from ZeRO-2 on priced ZeRO-1's collectives on the unpadded unit; the runtime-ledger tests' units all divide by
    their dp, so only an odd-sized unit tells."""
    import torch
    from torch import nn

    from hybrid.planner import ZeroStage
    from hybrid.planner.predicted_comm import ZeroUnit, zero_ledger
    from hybrid.zero.units import FlatUnit
    dp, numel = 2, 7
    padded = FlatUnit("u", [nn.Parameter(torch.zeros(numel))], parts=dp, part=0).padded  # the engine's: 8
    assert padded == 8
    for zero in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS, ZeroStage.PARAMETERS):
        book = zero_ledger([ZeroUnit(numel)], zero, dp, t=1, m=1, grad_bytes=4, param_bytes=2)
        assert book["reduce_scatter@dp"]["bytes"] == padded * 4, zero
        assert book["all_gather@dp"]["bytes"] == padded * 2 * book["all_gather@dp"]["calls"], zero
    assert zero_ledger([ZeroUnit(numel)], ZeroStage.NONE, dp, 1, 1, 4, 2)["all_reduce@dp"]["bytes"] == numel * 4
