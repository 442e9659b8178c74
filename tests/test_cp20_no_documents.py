"""--reset-attention-mask / --reset-position-ids on data with no end-of-document token say so (compose20b, round 20:
ByteLevel's eod, id 0, never occurs in the default corpus, so the flags silently changed nothing)."""

import os
import subprocess
import sys

import pytest
import torch

from hybrid.cp.data import TokenSharding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


@pytest.mark.slow
def test_train_py_on_the_default_corpus_with_bytelevel_warns_once():
    """The wiring (hybrid/train/loop.py, rank 0, the first step): one rank, one step on the default corpus."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                          "scripts/train.py", "--model", "tiny-llama", "--seq-length", "32", "--micro-batch-size", "1",
                          "--global-batch-size", "1", "--train-iters", "2", "--log-interval", "1",
                          "--tokenizer-type", "ByteLevel", "--reset-attention-mask"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("warning: --reset-attention-mask: no end-of-document token (id 0)") == 1, out.stdout[-2000:]
