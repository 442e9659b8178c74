"""The GPT dataset: samples equal megatron-core 0.16's (its own index builders, when installed), the split is
by document and disjoint, a blend follows its weights within the greedy interleaving's bound, and a step's batch
is a pure function of (seed, consumed samples) whatever the data-parallel and micro-batch sizes."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from hybrid.data.args import parse_blend
from hybrid.data.gpt import GPTSamples, blend_indices, parse_split, split_ranges
from hybrid.data.indexed import IndexedDataset, IndexedDatasetWriter
from hybrid.data.source import DataSource, Split, SplitSizes
from hybrid.data.text import BatchSpec


def make(prefix: str, lengths, value=None) -> IndexedDataset:
    """Documents whose tokens are their global positions (or `value` everywhere), as int32."""
    w, pos = IndexedDatasetWriter(prefix, np.int32), 0
    for n in lengths:
        w.add_document(np.full(n, value) if value is not None else np.arange(pos, pos + n))
        pos += n
    w.finalize()
    return IndexedDataset(prefix)


def megatron_samples(ds: IndexedDataset, doc_ids, seq: int, num_samples: int, seed: int) -> list[list[int]]:
    """megatron-core's GPTDataset sample list, from its own builders (gpt_dataset._build_document_index,
    helpers.build_sample_idx, _build_shuffle_index) and its __getitem__'s slicing."""
    try:
        from megatron.core.datasets import gpt_dataset, helpers_cpp
    except ImportError as e:  # only a missing package skips; any other failure of megatron-core is a failure
        pytest.skip(f"megatron-core not importable ({e}); scripts/setup.sh installs it (pip install -e '.[bench]')")
    tpe = int(ds.sequence_lengths[doc_ids].sum())
    epochs, tokens = 1, tpe
    while tokens < num_samples * seq + 1:  # GPTDataset._get_num_epochs
        epochs, tokens = epochs + 1, tokens + tpe
    separate = False
    if epochs > 1:
        before = ((epochs - 1) * tpe - 1) // seq
        separate = num_samples - before < int(0.80 * ((tpe - 1) // seq))
    rng = np.random.RandomState(seed)
    doc_index = gpt_dataset._build_document_index(np.asarray(doc_ids), epochs, rng, separate)
    sample_index = helpers_cpp.build_sample_idx_int32(ds.sequence_lengths.copy(), doc_index, seq, epochs, tpe,
                                                      True, 1)
    n = sample_index.shape[0] - 1
    shuffle = gpt_dataset._build_shuffle_index(before if separate else n, n, rng)
    out = []
    for idx in shuffle:
        (b, bo), (e, eo) = sample_index[idx], sample_index[idx + 1]
        if b == e:
            parts = [ds.get(doc_index[b], int(bo), int(eo - bo + 1))]
        else:
            parts = [ds.get(doc_index[i], int(bo) if i == b else 0, None if i < e else int(eo) + 1)
                     for i in range(b, e + 1)]
        out.append(np.concatenate(parts).tolist())
    return out


@pytest.mark.parametrize("num_samples", [5, 40, 55, 85])  # 1 epoch; 2 (final one shuffled alone); 2, 3 (not)
def test_samples_equal_megatron_cores(tmp_path, num_samples):
    lengths = np.random.RandomState(0).randint(0, 40, size=30).tolist()  # empty documents included
    ds = make(str(tmp_path / "d"), lengths)
    doc_ids = np.arange(3, 27)
    ours = GPTSamples(ds, doc_ids, 16, num_samples, seed=7)
    ref = megatron_samples(ds, doc_ids, 16, num_samples, 7)
    assert len(ours) == len(ref) >= num_samples
    assert [ours[i].tolist() for i in range(len(ours))] == ref


def test_samples_are_windows_of_the_packed_documents(tmp_path):
    """Independent of Megatron: over one epoch the samples, put back in unshuffled order, are the windows
    [j s, j s + s + 1) of the documents concatenated in the document index's order."""
    ds = make(str(tmp_path / "d"), [7, 30, 1, 12, 50, 3])
    g = GPTSamples(ds, np.arange(6), 10, 3, seed=1)
    stream = np.concatenate([ds.get(int(d)) for d in g.document_index])
    by_position = {int(g.shuffle_index[i]): g[i] for i in range(len(g))}
    assert len(g) == (stream.size - 1) // 10
    for j, sample in by_position.items():
        assert sample.tolist() == stream[j * 10:j * 10 + 11].tolist()


def test_split_is_megatrons_rounding_by_document_and_disjoint(tmp_path):
    assert split_ranges(parse_split("969,30,1"), 1000) == [(0, 969), (969, 999), (999, 1000)]
    assert split_ranges(parse_split("98,2,0"), 10) == [(0, 10), (10, 10), None]
    lengths = [20] * 200
    ds = make(str(tmp_path / "d"), lengths)
    src = DataSource([ds], [1.0], parse_split("80,15,5"), 16, 3, SplitSizes(200, 50, 20))
    docs = {}
    for s in Split:  # which documents each split's samples touch (token id // 20 is its document)
        rows = src.samples(s, 0, len(src.splits[s]))
        docs[s] = set((rows // 20).unique().tolist())
    assert docs[Split.TRAIN] <= set(range(160)) and docs[Split.VALID] <= set(range(160, 190))
    assert docs[Split.TEST] <= set(range(190, 200)) and len(docs[Split.TRAIN]) > 150


@pytest.mark.parametrize("text", ["", "a,b,c", "1,2,3,4", "-1,2,3", "0,0,0", "0,0"])
def test_bad_split_is_one_clear_error(text):
    with pytest.raises(ValueError, match="--split"):
        parse_split(text)


def test_blend_counts_stay_within_one_sample_of_the_weights():
    """The greedy interleaving always draws from the dataset lagging its share most, so no dataset's count
    n_d(i) after i samples strays more than 1 from w_d i (it is drawn again as soon as it lags)."""
    for weights in ([0.3, 0.7], [0.5, 0.25, 0.25], [0.01, 0.99]):
        which, within = blend_indices(weights, 2000)
        counts = np.stack([np.cumsum(which == d) for d in range(len(weights))], 1)
        i = np.arange(1, 2001)[:, None]
        assert np.abs(counts - np.asarray(weights) * i).max() <= 1.0 + 1e-9
        for d in range(len(weights)):  # each dataset's samples are taken in order 0, 1, 2, ...
            assert within[which == d].tolist() == list(range(int((which == d).sum())))


def test_blend_order_equals_megatron_cores_build_blending_indices():
    try:
        from megatron.core.datasets import helpers_cpp
    except ImportError as e:  # only a missing package skips; any other failure of megatron-core is a failure
        pytest.skip(f"megatron-core not importable ({e}); scripts/setup.sh installs it (pip install -e '.[bench]')")
    for weights in ([0.3, 0.7], [0.5, 0.25, 0.25], [0.1, 0.2, 0.3, 0.4]):
        which, within = np.zeros(3000, np.int16), np.zeros(3000, np.int64)
        helpers_cpp.build_blending_indices(which, within, np.array(weights), len(weights), 3000, False)
        ours = blend_indices(weights, 3000)
        assert np.array_equal(ours[0], which) and np.array_equal(ours[1], within)


def test_data_path_blend_realizes_the_weights_end_to_end(tmp_path):
    a = make(str(tmp_path / "a"), [50] * 40, value=1)
    b = make(str(tmp_path / "b"), [50] * 40, value=2)
    paths, weights = parse_blend(["0.3", str(tmp_path / "a"), "0.7", str(tmp_path / "b")])
    assert paths == [str(tmp_path / "a"), str(tmp_path / "b")] and weights == pytest.approx([0.3, 0.7])
    n = 500
    src = DataSource([a, b], weights, parse_split("969,30,1"), 16, 5, SplitSizes(n, 0, 0))
    rows = src.samples(Split.TRAIN, 0, n)
    from_a = int((rows[:, 0] == 1).sum())
    assert abs(from_a - 0.3 * n) <= 1  # the bound of the test above, at i = n


@pytest.mark.parametrize("values", [["0.3", "a", "x", "b"], ["0.3", "a", "0.7"], ["-1", "a", "2", "b"], [" "]])
def test_bad_blend_is_one_clear_error(values):
    with pytest.raises(ValueError, match="--data-path"):
        parse_blend(values)


def test_batches_are_a_pure_function_of_seed_and_consumed_samples(tmp_path):
    """A global batch is the same rows whatever dp and micro-batch size cut it, and a fresh DataSource (a
    resumed run) gives the same batch at the same consumed-sample count; another seed gives another order."""
    ds = make(str(tmp_path / "d"), np.random.RandomState(1).randint(5, 60, size=120).tolist())

    def global_rows(seed, consumed, dp, micro):
        src = DataSource([ds], [1.0], parse_split("969,30,1"), 16, seed, SplitSizes(8 * 10, 0, 0))
        spec = BatchSpec(global_batch=8, micro_batch=micro, seq_length=16, dp=dp)
        rows = []
        for r in range(dp):
            for inputs, labels in src.batches(consumed, spec, r):
                assert torch.equal(inputs[:, 1:], labels[:, :-1]) and inputs.shape == (micro, 16)
                rows.append(torch.cat([inputs, labels[:, -1:]], 1))
        return torch.cat(rows)

    reference = global_rows(3, 24, 1, 8)
    for dp, micro in ((2, 2), (4, 1), (8, 1), (2, 4)):
        assert torch.equal(global_rows(3, 24, dp, micro), reference)
    assert not torch.equal(global_rows(3, 32, 1, 8), reference)
    assert not torch.equal(global_rows(4, 24, 1, 8), reference)


def test_too_few_tokens_for_one_sequence_is_one_clear_error(tmp_path):
    ds = make(str(tmp_path / "d"), [3, 4])
    with pytest.raises(ValueError, match="fewer than one sample of --seq-length 16"):
        DataSource([ds], [1.0], parse_split("1,0,0"), 16, 0, SplitSizes(4, 0, 0))
