"""train.py --auto-parallel with --context-parallel-size (issue 29): the CP size and --cp-comm-type are the user's,
the planner lays the rest out around them (hybrid/planner/context.py's search_cp on the reduced problem).

* in-process, no process group: for each comm type the flags set are search_cp's best CP layout (its true dp =
  reduced dp / CP), and train.py's own checks accept them; the auto-parallel line names the CP size and comm type;
* bad input is one line before any process group (tests/test_cp_data.py: a CP size that does not divide the ranks);
* end to end: --auto-parallel --context-parallel-size 2 on 4 ranks trains, and its losses equal the same layout's
  flags given by hand, bit for bit (same flags, same run).
"""

from __future__ import annotations

import json

import pytest
import torch

from hybrid.cp.attention import CommType
from hybrid.planner import Cluster, Layout, SearchSpace, Workload, context
from hybrid.planner.ops import KernelProfile
from hybrid.planner.train_flags import layout_flags
from hybrid.precision import Precision
from hybrid.testing import launch
from hybrid.train.config import to_argv
from models import Recompute, load_config

WORLD, CP = 4, 2
ARGV = ["--auto-parallel", "--context-parallel-size", str(CP), "--global-batch-size", "8", "--seq-length", "64"]


def _planned(monkeypatch, capsys, extra: list[str]):
    from hybrid.train import args as train_args
    monkeypatch.setenv("WORLD_SIZE", str(WORLD))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(WORLD))
    args = train_args.parse_args([*ARGV, *extra])
    train_args.apply_auto_parallel(args, WORLD)
    line = capsys.readouterr().out
    return args, line, train_args.check_args(args, WORLD)


@pytest.mark.parametrize("comm", [c.value for c in CommType])
def test_auto_parallel_lays_out_the_rest_around_the_given_cp(monkeypatch, capsys, comm):
    from hybrid.train import args as train_args
    args, line, (_, dims, batch, plan) = _planned(monkeypatch, capsys, ["--cp-comm-type", comm])
    assert dims.cp == CP and dims.tp * dims.pp * dims.dp * dims.cp == WORLD and batch.global_batch == 8
    assert f" x cp {CP} ({comm})," in line and "auto-parallel: tp" in line, line
    # the same search by hand: search_cp's best layout at this CP and comm type, with the true dp
    hw, profile = train_args._planning_device(args, WORLD, Precision.FP32)
    work = Workload(load_config(args.model), global_batch=8, seq_length=64, precision=Precision.FP32,
                    activations=profile, kernels=KernelProfile.EAGER)
    best = context.search_cp(work, Cluster(gpus=WORLD, hw=hw), SearchSpace(recompute=(Recompute.NONE,)),
                             cps=(CP,), comms=(CommType(comm),), top=1)[0]
    lay = best.base.layout
    assert (dims.tp, dims.pp, dims.dp) == (lay.tp, lay.pp, lay.dp // CP)
    assert (batch.micro_batch, args.zero_stage, plan.kind) == (lay.micro_batch, int(lay.zero), lay.schedule)
    assert not torch.distributed.is_initialized()


def _losses(path) -> list[str]:
    """The metrics file's lm_loss per iteration, as repr (every bit of the float)."""
    with open(path) as f:
        return [repr(rec["lm_loss"]) for rec in map(json.loads, f) if "lm_loss" in rec]


@pytest.mark.slow
def test_auto_parallel_cp_run_equals_its_flags_given_by_hand(monkeypatch, capsys, tmp_path):
    """4 ranks, 3 iterations: --auto-parallel --context-parallel-size 2, and the flags it chose written out (tp,
    pp, micro-batch, ZeRO, schedule ... and the CP size): the same losses, bit for bit."""
    args, line, _ = _planned(monkeypatch, capsys, [])
    chosen = layout_flags(Workload(load_config(args.model), global_batch=8, seq_length=64, fp32_grads=False), Layout())
    by_hand = to_argv({dest: getattr(args, dest) for dest in chosen})  # the flags --auto-parallel set
    common = ["--train-iters", "3", "--log-interval", "1", "--eval-iters", "0"]
    metrics = {name: str(tmp_path / f"{name}.jsonl") for name in ("auto", "hand")}
    auto = launch([*ARGV, *common, "--metrics-file", metrics["auto"]], WORLD, timeout=600)
    hand = launch(["--context-parallel-size", str(CP), "--global-batch-size", "8", "--seq-length", "64", *by_hand,
                   *common, "--metrics-file", metrics["hand"]], WORLD, timeout=600)
    for runs in (auto, hand):
        assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    assert f"x cp {CP} (p2p)" in auto[0].stdout, auto[0].stdout[-2000:]
    losses = _losses(metrics["auto"])
    assert len(losses) == 3 and losses == _losses(metrics["hand"]), by_hand
