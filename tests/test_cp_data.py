"""The data side of context parallelism and packed documents, with no processes: document ids and reset
positions equal megatron-core's `_get_ltor_masks_and_position_ids` (the reference implementation of
`--reset-attention-mask` / `--reset-position-ids`); each CP rank's inputs, labels and positions are exactly the
load-balanced slices of the whole sequence's; the flags are checked by name."""

from __future__ import annotations

import argparse

import pytest
import torch

from hybrid.cp import args as cp_args
from hybrid.cp.balance import unshard
from hybrid.cp.data import TokenSharding, document_ids, reset_positions
from models import load_config

EOD = 0


def _packed(B=3, T=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (B, T + 1), generator=gen)
    ids[0, [4, 5, 17, 31]] = EOD  # two EODs in a row (an empty document), one at the sample's end
    ids[1, [0, 12]] = EOD  # an EOD first
    return ids  # row 2: no EOD, one document


def test_documents_and_positions_equal_megatron_core():
    ltor = pytest.importorskip("megatron.core.datasets.gpt_dataset")._get_ltor_masks_and_position_ids
    ids = _packed()[:, :-1]
    docs = document_ids(ids, EOD)
    T = ids.shape[1]
    for b in range(ids.shape[0]):
        masked, _, positions = ltor(ids[b], EOD, True, True, False, True)
        visible = torch.ones(T, T, dtype=torch.bool).tril() & (docs[b][:, None] == docs[b][None, :])
        assert torch.equal(visible, ~masked[0])
        assert torch.equal(reset_positions(docs[b:b + 1])[0], positions)


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("reset", [False, True])
def test_each_cp_rank_gets_its_load_balanced_slice(cp, reset):
    rows = _packed()
    inputs, labels = rows[:, :-1], rows[:, 1:]
    parts = [TokenSharding(cp, r, reset, reset, EOD).micro_batch(inputs, labels) for r in range(cp)]
    assert torch.equal(unshard([p[0] for p in parts]), inputs)
    assert torch.equal(unshard([p[1] for p in parts]), labels)  # labels shifted over the whole sequence first
    if reset:
        docs = document_ids(inputs, EOD)
        assert all(torch.equal(p[2].segments, docs) for p in parts)  # every rank sees all document ids
        assert torch.equal(unshard([p[2].positions for p in parts]), reset_positions(docs))
    else:
        assert all(len(p) == 2 for p in parts)  # no SequenceInfo: positions follow from the CP rank


def _args(**kw):
    base = dict(context_parallel_size=1, cp_comm_type="p2p", reset_attention_mask=False, reset_position_ids=False,
                tokenizer_type=None, tokenizer_model=None)
    return argparse.Namespace(**{**base, **kw})


def test_cp_flags_are_checked_by_name():
    with pytest.raises(ValueError, match="--context-parallel-size must be a positive integer"):
        cp_args.check(_args(context_parallel_size=0))
    with pytest.raises(ValueError, match="--reset-attention-mask .* --tokenizer-type"):
        cp_args.check(_args(reset_attention_mask=True))
    assert cp_args.check(_args(reset_position_ids=True, tokenizer_type="ByteLevel")).eod == 0
    cfg = load_config("tiny-llama")  # 4 heads, 2 kv-heads
    cp4 = cp_args.check(_args(context_parallel_size=4))
    with pytest.raises(ValueError, match="--seq-length 36 is not divisible by 2 x --context-parallel-size"):
        cp_args.check_model(cp4, cfg, 1, 36, False)
    with pytest.raises(ValueError, match="--sequence-parallel needs each CP rank's 8 tokens"):
        cp_args.check_model(cp4, cfg, 3, 32, True)
    a2a = cp_args.check(_args(context_parallel_size=4, cp_comm_type="a2a"))
    with pytest.raises(ValueError, match="--cp-comm-type a2a .* 2 key/value heads"):
        cp_args.check_model(a2a, cfg, 1, 32, False)
    with pytest.raises(ValueError, match="--cp-comm-type a2a .* 1 attention head; use --cp-comm-type p2p"):
        cp_args.check_model(a2a, cfg, 4, 32, False)
    cp_args.check_model(cp4, cfg, 1, 32, False)
    import dataclasses
    with pytest.raises(ValueError, match="attention dropout .* --attention-dropout 0"):
        cp_args.check_model(cp4, dataclasses.replace(cfg, attention_dropout=0.1), 1, 32, False)


@pytest.mark.parametrize("argv,world,message", [
    (["--context-parallel-size", "3"], 4, "--context-parallel-size (3)"),
    (["--context-parallel-size", "0"], 1, "--context-parallel-size must be"),
    (["--context-parallel-size", "4", "--seq-length", "36"], 4, "--seq-length 36 is not divisible by 2 x "
                                                                "--context-parallel-size 4 = 8"),
    (["--model", "tiny-llama", "--context-parallel-size", "4", "--cp-comm-type", "a2a", "--seq-length", "32"], 4,
     "--cp-comm-type a2a splits heads over --context-parallel-size 4"),
    (["--context-parallel-size", "2", "--attention-dropout", "0.1"], 2, "--attention-dropout 0"),
    (["--reset-attention-mask"], 1, "--reset-attention-mask finds documents by the end-of-document token"),
    (["--cp-comm-type", "ring"], 1, "--cp-comm-type: invalid choice"),
    (["--context-parallel-size", "3", "--auto-parallel", "--global-batch-size", "8"], 4,
     "--auto-parallel with --context-parallel-size 3: it must divide the 4 ranks"),
])
def test_bad_cp_flags_are_one_line_before_any_process_group(argv, world, message, monkeypatch, capsys):
    import torch.distributed as dist
    from hybrid.train.main import main
    monkeypatch.setenv("WORLD_SIZE", str(world))
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code not in (0, None)
    lines = [ln for ln in (str(e.value.code) + "\n" + capsys.readouterr().err).splitlines() if "error:" in ln]
    assert len(lines) == 1 and message in lines[0], lines
    assert not dist.is_initialized()
