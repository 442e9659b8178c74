"""The planner with CP x EP (hybrid/planner/context.py on an MoE model): `hybrid plan --context-parallel-size` and
train.py --auto-parallel --context-parallel-size plan MoE models, EP folded over the stage's tp x cp x dp ranks,
and a CP plan's step and memory carry the experts' terms priced at the CP rank's s / cp tokens.

In this process, no process group. The expected numbers are hand-derived from the model's sizes (the all-to-all:
4 N k h b (ep - 1) / ep bytes a rank sends per MoE layer and micro-batch, N = b s / (cp t) the tokens a CP rank
routes -- the bytes the runtime's ledger counts for a routing that spreads evenly, tests/test_moe_parallel.py)."""

from __future__ import annotations

import pytest
import torch

import hybrid.cli
from hybrid.cp.attention import CommType
from hybrid.planner import Cluster, Layout, SearchSpace, Workload, context, hardware
from hybrid.planner.layout import ZeroStage
from models import load_config

CP = 2


def _work(seq: int = 1024, gbs: int = 16) -> Workload:
    return Workload(load_config("tiny-mixtral"), global_batch=gbs, seq_length=seq, fp32_grads=False)


def test_cp_plan_of_an_moe_model_prices_the_experts_at_s_over_cp_tokens():
    """tiny-mixtral (top-2 of 8 experts) at tp 1 pp 1 dp 2 x cp 2, b 2, ep 2 pinned: the experts' all-to-all is
    the hand formula at N = b s / cp tokens a rank -- half of what a rank of the same dp at cp 1 routes with the whole
    sequence -- and the step and memory the CP plan reports include the experts' seconds and bytes beside the
    dense part and CP's own terms."""
    work, cluster = _work(), Cluster(gpus=4, hw=hardware("h100-80g"))
    cfg = work.model
    layout = Layout(tp=1, pp=1, dp=2, micro_batch=2, zero=ZeroStage.OPTIMIZER)
    plan = context.evaluate_cp(work, cluster, layout, CP, space=SearchSpace(expert_parallel=(2,)))
    experts = plan.base.experts
    assert experts is not None and experts.ep == 2 and experts.edp == 2  # stage = tp cp dp = 4 ranks
    tokens = 2 * work.seq_length // CP  # b s / cp (tp 1)
    m = work.global_batch // (2 * 2)  # micro-batches a rank: G / (dp b)
    layers = sum(cfg.is_moe_layer(i) for i in range(cfg.num_layers))
    want = 4 * tokens * cfg.moe_top_k * cfg.hidden_size * 2 * (2 - 1) / 2 * layers * m  # b = 2: mixed precision
    assert experts.alltoall_bytes == pytest.approx(want, rel=1e-12)
    assert plan.total_s == pytest.approx(plan.base.time.total + experts.seconds + plan.extra_s, rel=1e-12)
    assert experts.seconds > 0 and plan.extra_s > 0
    assert plan.memory_gb * 1e9 > plan.base.memory.peak.total + experts.extra_bytes  # + the ring's buffers
    assert plan.short().endswith("cp2 p2p ep2")


def test_hybrid_plan_ranks_cp_layouts_of_an_moe_model(capsys):
    """`hybrid plan --context-parallel-size 1,2` on tiny-mixtral (it was refused: train.py did not run CP with
    experts until round 16): every row names its EP, and at a long sequence CP 2 layouts are ranked."""
    hybrid.cli.main(["plan", "--model", "tiny-mixtral", "--gpus", "8", "--global-batch-size", "8", "--seq-length",
                     "8192", "--gpu", "h100-80g", "--context-parallel-size", "2", "--top", "3"])
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln[:2].strip().isdigit()]
    assert len(rows) == 3 and all(" cp2 p2p ep" in r for r in rows), rows


def test_auto_parallel_plans_an_moe_model_around_the_given_cp(monkeypatch, capsys):
    """train.py --auto-parallel --context-parallel-size 2 --expert-model-parallel-size 4 on 4 ranks: the planner's
    layout leaves dp 2, so EP 4 spans the CP and DP ranks (expert-DP 1), and train.py's own checks accept the flags
    it set (no process group)."""
    from hybrid.train import args as train_args
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    args = train_args.parse_args(["--model", "tiny-mixtral", "--auto-parallel", "--context-parallel-size", "2",
                                  "--expert-model-parallel-size", "4", "--global-batch-size", "8",
                                  "--seq-length", "64"])
    train_args.apply_auto_parallel(args, 4)
    line = capsys.readouterr().out
    run = train_args.run_config(args, 4)
    dims = run.parallel.dims
    assert dims.cp == 2 and dims.tp * dims.pp * dims.dp * dims.cp == 4, dims
    assert run.moe is not None and run.moe.expert_parallel == 4 and ", ep 4" in line and " x cp 2 (p2p)," in line
    assert not torch.distributed.is_initialized()


def test_auto_parallel_cp_chooses_the_ep_of_the_best_cp_plan(monkeypatch, capsys):
    """EP not pinned: --auto-parallel takes the EP of search_cp's best layout at CP 2 (the same search by hand)."""
    from hybrid.precision import Precision
    from hybrid.planner.ops import KernelProfile
    from models import Recompute
    from hybrid.train import args as train_args
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    args = train_args.parse_args(["--model", "tiny-mixtral", "--auto-parallel", "--context-parallel-size", "2",
                                  "--global-batch-size", "8", "--seq-length", "64"])
    train_args.apply_auto_parallel(args, 4)
    capsys.readouterr()
    hw, profile = train_args._planning_device(args, 4, Precision.FP32)
    work = Workload(load_config("tiny-mixtral"), global_batch=8, seq_length=64, precision=Precision.FP32,
                    activations=profile, kernels=KernelProfile.EAGER)
    best = context.search_cp(work, Cluster(gpus=4, hw=hw), SearchSpace(recompute=(Recompute.NONE,)), cps=(2,),
                             comms=(CommType.P2P,), top=1)[0]
    assert best.base.experts is not None
    assert args.expert_model_parallel_size == best.base.experts.ep
    assert args.tensor_model_parallel_size == best.layout.tp and args.context_parallel_size == 2
