"""--reset-attention-mask / --reset-position-ids on data with no end-of-document token say so (compose20b, round 20:
ByteLevel's eod, id 0, never occurs in the default corpus, so the flags silently changed nothing)."""

import torch

from hybrid.cp.data import TokenSharding


def _batches(*rows):
    x = torch.tensor(rows)
    return [(x, x.roll(-1, 1))]


def test_a_reset_flag_with_no_eod_in_the_step_is_one_line_naming_the_flag_and_the_fix():
    s = TokenSharding(reset_attention_mask=True, reset_position_ids=True, eod=0)
    line = s.no_documents_line(_batches([5, 6, 7, 8], [9, 10, 11, 12]))
    assert line.startswith("warning: --reset-attention-mask and --reset-position-ids: no end-of-document token (id 0)")
    assert "--append-eod" in line and "\n" not in line


def test_no_line_when_a_sample_holds_the_eod_or_no_reset_flag_is_on():
    assert TokenSharding(reset_attention_mask=True, eod=0).no_documents_line(_batches([5, 0, 7, 8], [1, 2, 3, 4])) \
        is None
    assert TokenSharding(cp=2, eod=0).no_documents_line(_batches([5, 6, 7, 8])) is None


# The wiring in train.py (rank 0, the first iteration of this process, once): the first launch of
# tests/test_mutation21_catches.py::test_a_resumed_two_rank_run_warns_once_at_its_first_iteration is this file's
# former slow test (one rank, the default corpus, ByteLevel, from iteration 0) and its second launch a resumed
# 2-rank run (mutation21: D5 / D6 lived through the one-rank launch alone), so that one test carries both.
