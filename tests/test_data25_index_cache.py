"""The sample-index cache (hybrid/data/cache.py, --data-cache-path): the document, shuffle and blend indices built
once, loaded after, bit-identical to a fresh build; a damaged cache file never trusted; one build for two processes
racing on the lock; the progress line of a long build; blend_indices against its plain greedy definition."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os

import numpy as np
import pytest

from hybrid import fault_hook
from hybrid.data import cache
from hybrid.data.gpt import Blend, GPTSamples, blend_indices
from hybrid.data.indexed import InMemoryDocuments, IndexedDataset, IndexedDatasetWriter
from hybrid.data.source import DataSource, SplitSizes

ARRAYS = ("document_index", "shuffle_index", "_ends")


def _docs(n: int = 300, seed: int = 0) -> InMemoryDocuments:
    lengths = np.random.default_rng(seed).integers(0, 40, n).astype(np.int32)  # empty documents included
    return InMemoryDocuments(np.zeros(int(lengths.sum()), np.uint8), lengths, "synthetic")


def _samples(folder, docs=None, num_samples: int = 2000, seed: int = 3) -> GPTSamples:
    """A split of three epochs with a separate final one (exercises both shuffles)."""
    return GPTSamples(docs or _docs(), np.arange(10, 290), 8, num_samples, seed, folder)


def _same(a: GPTSamples, b: GPTSamples) -> None:
    for name in ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name


def _builds() -> int:
    return cache.BUILDS["count"]


def test_cached_equals_fresh_and_the_second_run_loads(tmp_path):
    fresh = _samples(None)
    before = _builds()
    first = _samples(str(tmp_path))
    second = _samples(str(tmp_path))
    assert _builds() == before + 1  # built once, loaded the second time
    _same(fresh, first)
    _same(fresh, second)
    assert fresh.epochs > 1
    assert [fresh[i].tolist() for i in range(len(fresh))] == [second[i].tolist() for i in range(len(second))]
    # another seed, sample count or seq length is another key: built, not served the first one's arrays
    _samples(str(tmp_path), seed=4)
    _samples(str(tmp_path), num_samples=2001)
    assert _builds() == before + 3


def test_the_key_is_the_data_not_the_name(tmp_path):
    """A dataset of other lengths under the same name gets its own index."""
    a = _samples(str(tmp_path), docs=_docs(seed=0))
    b = _samples(str(tmp_path), docs=_docs(seed=1))
    _same(b, _samples(None, docs=_docs(seed=1)))
    assert not np.array_equal(a._ends, b._ends)


def _files(folder, suffix: str) -> list[str]:
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(suffix))


@pytest.mark.parametrize("damage", ["truncate", "overwrite", "description"])
def test_a_damaged_cache_file_is_rebuilt(tmp_path, capsys, damage):
    fresh = _samples(str(tmp_path))
    target = _files(tmp_path, "-shuffle_index.npy")[0]
    if damage == "truncate":
        with open(target, "r+b") as f:
            f.truncate(os.path.getsize(target) // 2)
    elif damage == "overwrite":  # same size, other values: only the sha256 tells
        arr = np.load(target)
        np.save(target, arr[::-1].copy())
    else:
        with open(_files(tmp_path, "-description.json")[0], "w") as f:
            f.write("{not json")
    capsys.readouterr()
    before = _builds()
    again = _samples(str(tmp_path))
    assert _builds() == before + 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not trusted, rebuilding it" in err[0] and "-description.json" in err[0]
    _same(fresh, again)
    before = _builds()
    _samples(str(tmp_path))  # the rebuilt files are whole: loaded
    assert _builds() == before


def test_a_crash_before_the_description_leaves_nothing_trusted(tmp_path, monkeypatch):
    """The fault hook's crash point between the arrays' rename and the description's: the next run rebuilds."""
    monkeypatch.setenv(fault_hook.ENV, "crash:point=index_cache_written")
    with pytest.raises(fault_hook.SimulatedCrash):
        _samples(str(tmp_path))
    assert _files(tmp_path, "-description.json") == [] and _files(tmp_path, "-shuffle_index.npy")
    monkeypatch.delenv(fault_hook.ENV)
    before = _builds()
    _same(_samples(None), _samples(str(tmp_path)))
    assert _builds() == before + 1
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def _race(folder: str, start, out) -> None:
    start.wait()
    before = _builds()
    s = _samples(folder, num_samples=20000)
    out.put((_builds() - before, int(s.shuffle_index[:50].sum())))


def test_two_processes_build_once(tmp_path):
    """Two ranks starting together: one builds under the lock, the other waits and loads (fork: ~0.5 s)."""
    ctx = mp.get_context("fork")
    start, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_path), start, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sorted(r[0] for r in results) == [0, 1]
    assert results[0][1] == results[1][1]


def test_the_progress_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cache, "PROGRESS_MIN_SAMPLES", 1000)
    _samples(str(tmp_path))
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "data: building the sample index of 2,000 samples of synthetic ..."
    assert lines[1].startswith("data: building the sample index of 2,000 samples of synthetic ... done (")
    assert lines[1].endswith(" s)") and len(lines) == 2
    _samples(str(tmp_path))
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith(f"data: loaded the sample index of 2,000 samples of synthetic from {tmp_path} (")
    _samples(None, num_samples=999)  # a small build says nothing
    assert capsys.readouterr().out == ""


def _plain_greedy(weights, size):
    """megatron-core's build_blending_indices as written: argmax_d w_d max(i, 1) - n_d, first on ties."""
    counts = [0] * len(weights)
    which, within = [], []
    for i in range(size):
        err = [w * max(i, 1) - c for w, c in zip(weights, counts)]
        d = err.index(max(err))
        which.append(d)
        within.append(counts[d])
        counts[d] += 1
    return which, within


@pytest.mark.parametrize("weights", [[0.5, 0.5], [1 / 3] * 3, [0.3, 0.7], [0.1, 0.2, 0.3, 0.4],
                                     list(np.random.default_rng(5).dirichlet(np.ones(7)))])
def test_blend_indices_is_the_greedy(weights):
    which, within = blend_indices(weights, 3000)
    ref_which, ref_within = _plain_greedy(weights, 3000)
    assert which.dtype == np.int16 and within.dtype == np.int64
    assert which.tolist() == ref_which and within.tolist() == ref_within


def test_a_blend_is_cached(tmp_path):
    part = _samples(None)
    fresh = Blend([part, part], [0.3, 0.7], 5000)
    before = _builds()
    Blend([part, part], [0.3, 0.7], 5000, str(tmp_path))
    loaded = Blend([part, part], [0.3, 0.7], 5000, str(tmp_path))
    assert _builds() == before + 1
    assert np.array_equal(fresh.which, loaded.which) and loaded.which.dtype == np.int16
    assert np.array_equal(fresh.within, loaded.within)


def _indexed(tmp_path) -> str:
    prefix = str(tmp_path / "corpus_text_document")
    w = IndexedDatasetWriter(prefix, np.uint16)
    rng = np.random.default_rng(0)
    for _ in range(200):
        w.add_document(rng.integers(1, 500, int(rng.integers(1, 60))))
    w.finalize()
    return prefix


def test_the_default_place_and_its_threshold(tmp_path, monkeypatch, capsys):
    """Megatron's default beside the data (PREFIX/cache/GPTDataset_indices) for an index of CACHE_MIN_ENTRIES
    samples or more; none for a smaller one; a folder that cannot be written: one line, built in memory."""
    prefix = _indexed(tmp_path)
    docs = [IndexedDataset(prefix)]
    sizes = SplitSizes(train=600, valid=0, test=0)
    DataSource(docs, [1.0], (1.0, 0.0, 0.0), 8, 1, sizes)
    assert not os.path.exists(cache.default_dir(prefix))  # under the threshold: nothing written beside the data
    monkeypatch.setattr(cache, "CACHE_MIN_ENTRIES", 500)
    before = _builds()
    a = DataSource(docs, [1.0], (1.0, 0.0, 0.0), 8, 1, sizes)
    assert _builds() == before + 1 and _files(cache.default_dir(prefix), "-description.json")
    b = DataSource(docs, [1.0], (1.0, 0.0, 0.0), 8, 1, sizes)
    assert _builds() == before + 1
    assert np.array_equal(a.samples(0, 0, 600).numpy(), b.samples(0, 0, 600).numpy())
    monkeypatch.setattr(cache, "usable", lambda folder: False)
    capsys.readouterr()
    DataSource(docs, [1.0], (1.0, 0.0, 0.0), 8, 2, sizes)
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith(f"data cache: {cache.default_dir(prefix)} cannot be made or written;")


def test_data_cache_path_flag(tmp_path):
    from hybrid.data import args as data_args
    p = argparse.ArgumentParser()
    data_args.add_arguments(p)
    ns = p.parse_args(["--data-cache-path", str(tmp_path / "c")])
    assert data_args.check(ns).cache_path == str(tmp_path / "c")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="--data-cache-path .* is not a folder"):
        data_args.check(p.parse_args(["--data-cache-path", str(tmp_path / "file")]))


def test_train_flags_reach_the_cache(tmp_path):
    """train.py's data flags as given (hybrid/data/args.py check + build): --data-cache-path DIR holds the run's
    indices after the first build, and a second run's build loads them."""
    from hybrid.data import args as data_args
    from hybrid.data.text import BatchSpec
    prefix = _indexed(tmp_path)
    p = argparse.ArgumentParser()
    data_args.add_arguments(p)
    ns = p.parse_args(["--data-path", prefix, "--data-cache-path", str(tmp_path / "c"), "--eval-iters", "2"])
    ns.train_iters, ns.seq_length, ns.seed = 50, 8, 1
    batch = BatchSpec(micro_batch=2, global_batch=4, dp=1, seq_length=8)
    before = _builds()
    first = data_args.build(ns, data_args.check(ns), batch, 512)
    built = _builds() - before
    # train and valid (the test split's 0.1 % of 200 documents holds none)
    assert built == 2 and len(_files(tmp_path / "c", "-description.json")) == 2 and first.has(2) is False
    second = data_args.build(ns, data_args.check(ns), batch, 512)
    assert _builds() - before == built
    assert np.array_equal(first.samples(0, 0, 200).numpy(), second.samples(0, 0, 200).numpy())
