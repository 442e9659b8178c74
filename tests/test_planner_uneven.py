"""Uneven pipeline stages: the first and the last stage hold fewer layers (they also run the embedding and the
LM head), with or without interleaving, in the planner, in the flags it emits, and in train.py.

Reference: Llama 3 (Dubey et al. 2024, Sec. 3.3.2) trains its 126 layers on 16 stages by taking one layer each
off the first and the last stage: 7, 8 x 14, 7."""

from __future__ import annotations

import os

import pytest

from hybrid import testing
from hybrid.partition import rank_chunks
from hybrid.planner import Cluster, Layout, SearchSpace, Workload, evaluate, hardware, search
from hybrid.planner.cli import train_args
from hybrid.planner.layout import pp_problems, stage_layers
from hybrid.train.args import check_args, parse_args
from models import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA_405B_16 = (7,) + (8,) * 14 + (7,)


def test_llama3_405b_on_16_stages_is_the_published_split():
    cfg = load_config("llama-3-405b")
    assert cfg.num_layers == 126
    assert stage_layers(cfg, 16, 1, 8192) == LLAMA_405B_16
    assert stage_layers(cfg, 8, 2, 8192) == LLAMA_405B_16  # interleaved: 16 chunks, the same cut
    assert pp_problems(cfg, 8, 2) == []  # interleaving no longer needs equal chunks


def test_the_planner_chooses_uneven_stages_interleaved_or_not():
    work = Workload(load_config("llama-3-405b"), global_batch=2048, seq_length=8192, fp32_grads=False)
    cluster = Cluster(gpus=16384, hw=hardware("h100-80g"))
    for pp, v in ((16, 1), (8, 2)):
        found = search(work, cluster, SearchSpace(tp=(8,), pp=(pp,), v=(v,)), top=1)
        assert found.plans, found.rejected[:3]
        lay = found.plans[0].layout
        assert (lay.pp, lay.v) == (pp, v)
        assert stage_layers(work.model, lay.pp, lay.v, work.seq_length) == LLAMA_405B_16


def test_emitted_flags_give_train_py_the_planners_split():
    """tiny-gpt2 (4 layers) on pp 3: balanced 1, 2, 1; the flags train.py gets reproduce that split."""
    work = Workload(load_config("tiny-gpt2"), global_batch=6, seq_length=32, fp32_grads=False)
    layout = Layout(tp=1, pp=3, dp=1, micro_batch=2)
    counts = stage_layers(work.model, 3, 1, 32)
    assert counts == (1, 2, 1)
    flags = train_args(work, evaluate(work, Cluster(gpus=3, hw=hardware("a100-80g")), layout), "tiny-gpt2")
    assert flags[flags.index("--pipeline-layers-per-stage") + 1] == "1,2,1"
    plan = check_args(parse_args(flags), world=3)[3]
    assert [len(s) for s in plan.stages] == list(counts)


def _losses(argv: list[str], ranks: int) -> list[float]:
    """`torchrun --nproc-per-node RANKS scripts/train.py ...` (or `python scripts/train.py ...` for one rank), its
    processes forked from hybrid.testing's forkserver."""
    common = ["--micro-batch-size", "2", "--global-batch-size", "8", "--seq-length", "32", "--train-iters", "3",
              "--log-interval", "1", "--eval-iters", "1"]  # the end's validation and test: one batch each
    env = {"OMP_NUM_THREADS": "1"}
    if ranks > 1:
        out = testing.torchrun(common + argv, ranks, env=env, cwd=ROOT, timeout=300)
    else:
        out = testing.run([os.path.join(ROOT, "scripts", "train.py"), *common, *argv], env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return [float(line.split("lm loss")[1].split("|")[0]) for line in out.stdout.splitlines()
            if line.lstrip().startswith("iteration")]


@pytest.mark.slow
def test_train_py_runs_uneven_interleaved_stages_and_matches_one_process():
    """pp 2 x v 2 with the embedding and the head stages holding no layers (0, 2, 2, 0): rank 0 runs the
    embedding and layers 2-3, rank 1 layers 0-1 and the head; the losses equal one process's (printed to 4
    decimals)."""
    argv = ["--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size", "2",
            "--pipeline-layers-per-stage", "0,2,2,0"]
    plan = check_args(parse_args(argv + ["--micro-batch-size", "2", "--global-batch-size", "8"]), world=2)[3]
    assert [list(c) for c in rank_chunks(plan.stages, 2, 0)] == [[], [2, 3]]
    reference = _losses([], 1)
    assert _losses(argv, 2) == reference and len(reference) == 3
