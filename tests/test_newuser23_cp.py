"""Round 23's new-user pass over docs/context-parallel.md and the CP x EP checkpoint line of docs/moe.md ("a CP x
EP checkpoint loads at any CP and EP that fit (`hybrid checkpoint inspect --context-parallel-size C
--expert-model-parallel-size E --world-size N` says so)"). In-process, no process group.

1. `--seq-length 250 --context-parallel-size 2` said "is not divisible by 2 x --context-parallel-size (4)": the
   "(4)" reads as the flag's value -- the world-size line writes "--context-parallel-size (3)" for cp 3 -- while
   cp was 2. Now "2 x --context-parallel-size 2 = 4", and "4 equal chunks" for "2 CP equal chunks".
2. `hybrid checkpoint inspect` of a seq-32 run at --context-parallel-size 3 said "loadable" with no word that the
   saved --seq-length cannot run at cp 3 (32 is not a multiple of 6); the saved batch gets such a note at a dp it
   does not split over, the sequence now does too.
3. `hybrid checkpoint inspect --expert-tensor-parallel-size 2` said "did you mean --expert-model-parallel-size?".
"""

from __future__ import annotations

import pytest

from hybrid.checkpoint.inspect import Target, loadable_at
from hybrid.cli import main as hybrid_main
from hybrid.train.main import validate

pytestmark = pytest.mark.usefixtures("one_process")  # tests/conftest.py: python, not torchrun: world 1


def test_a_sequence_cp_cannot_split_names_cp_and_the_chunk_count_apart(monkeypatch, one_line):
    monkeypatch.setenv("WORLD_SIZE", "2")
    line = one_line(lambda: validate(["--model", "tiny-llama", "--context-parallel-size", "2", "--seq-length", "250"]))
    assert line == ("train.py: error: --seq-length 250 is not divisible by 2 x --context-parallel-size 2 = 4; causal "
                    "load balancing splits each sequence into 4 equal chunks: use a multiple of 4 (248 or 252)")


STATE = {"model": "tiny-mixtral", "args": {"global_batch_size": 4, "micro_batch_size": 2, "seq_length": 32}}


def test_inspect_says_when_the_saved_sequence_does_not_split_at_the_cp_asked():
    ok, why = loadable_at(STATE, Target(tp=1, pp=1, world=6, cp=3, ep=2))
    assert ok and why.endswith("; the saved sequence does not split at cp 3 (--seq-length 32 is not divisible by 2 "
                               "x --context-parallel-size 3 = 6; causal load balancing splits each sequence into 6 "
                               "equal chunks: use a multiple of 6 (30 or 36))"), why
    ok, why = loadable_at(STATE, Target(tp=1, pp=1, world=4, cp=4))
    assert ok and "sequence" not in why, why  # 32 splits into 8 chunks


def test_inspect_names_what_it_does_with_expert_tp(one_line, tmp_path):
    line = one_line(lambda: hybrid_main(["checkpoint", "inspect", str(tmp_path), "--expert-tensor-parallel-size", "2",
                                         "--world-size", "4"]))
    assert "--expert-tensor-parallel-size: inspect does not take it: a checkpoint stores every expert whole" in line
    assert "did you mean" not in line, line
