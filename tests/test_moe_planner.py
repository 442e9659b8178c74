"""The planner's expert parallelism (hybrid/planner/moe.py) against the runtime and train.py:

* the all-to-all bytes it predicts for a layout equal what the runtime's ledger counts on the ep group
  (all_to_all_v) over one step of the real model at that layout -- 4 gloo ranks, TP 2 + SP x EP 4 and PP 2 x EP 2 --
  for a routing that gives every EP rank N k / ep slots (the planner's assumption; the router is made to route
  slot j = t k + i to expert j mod E, so every expert gets N k / E of each rank's slots), and its expert
  parameters per rank equal what the runtime's ranks hold;
* the experts' DP / ZeRO collectives it prices (over expert-DP) equal the runtime ledger's bytes on the edp group
  at ZeRO 0-3 (tp 1 x dp 4, EP 2);
* the layout `hybrid plan --emit-args` picks for an MoE model (EP included) runs through train.py;
* EP is chosen by memory when the experts do not fit at EP 1 (Mixtral 8x7B's published config.json on 32 H100),
  rejected by name when pinned too small, and layouts train.py refuses for MoE (TP without SP) are not planned.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

from hybrid.planner import Cluster, SearchSpace, Workload, hardware, search
from hybrid.planner.cli import main as plan_main
from hybrid.planner.layout import Layout, Offload, Recompute, ZeroStage
from hybrid.planner.model import Precision
from hybrid.planner.moe import expert_plan, layout_problems, sync_ledger
from hybrid.testing import launch, run_distributed
from models.config import load_config

SEQ, MICRO, M = 16, 2, 2  # tokens a sequence, sequences a micro-batch, micro-batches a DP rank
WORLD = 4
# name: (tp, pp, ep, etp); dp = WORLD / (tp pp)
CASES = {"tp2sp-dp2-ep4": (2, 1, 4, 1), "pp2-dp2-ep2": (1, 2, 2, 1), "dp4-ep2-etp2": (1, 1, 2, 2)}
MIXTRAL_8X7B = os.path.join(os.path.dirname(__file__), "data", "configs", "mixtral-8x7b-v0.1.json")


def _uniform_routing():
    """Make every MoE layer route slot j = t k + i of its N tokens to expert j mod E (its weights still from its
    own logits): N k / E slots to every expert from every rank."""
    import hybrid.moe.layer as layer

    route = layer.route

    def uniform(logits, k, *args, chosen=None, **kwargs):
        slots = torch.arange(logits.shape[0])[:, None] * k + torch.arange(k)
        return route(logits, k, *args, chosen=slots % logits.shape[1], **kwargs)

    layer.route = uniform


def _step_ledger(rank, world):
    from hybrid.mesh import ParallelDims
    from hybrid.moe.config import MoEConfig
    from hybrid.moe.layer import ExpertContext
    from hybrid.moe.parallel import build_mesh
    from hybrid.moe.runtime import set_aux_grad_scale
    from hybrid.pipeline import ScheduleKind, build_schedule
    from hybrid.pipeline.executor import PipelineExecutor, StageIO
    from hybrid.tp import TPContext
    from hybrid.train_step import LocalForwardBackward
    from models import build_pipeline_chunks

    _uniform_routing()
    cfg = load_config("tiny-mixtral")
    out = {}
    for name, (tp, pp, ep, etp) in CASES.items():
        mesh = build_mesh(ParallelDims.from_world(world, tp=tp, pp=pp), ep, etp)
        moe = ExpertContext(MoEConfig(expert_parallel=ep, expert_tensor_parallel=etp), mesh.ep, mesh.etp)
        chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp, sequence_parallel=tp > 1), mesh.coords.pp, pp,
                                       seed=0, moe=moe)
        g = torch.Generator().manual_seed(mesh.coords.dp)
        batches = [(ids[:, :-1], ids[:, 1:]) for ids in
                   (torch.randint(0, cfg.vocab_size, (MICRO, SEQ + 1), generator=g) for _ in range(M))]
        if pp == 1:
            runner = LocalForwardBackward(chunks[0], mesh.device)
        else:
            schedule = build_schedule(ScheduleKind.ONE_F_ONE_B, pp, M)[mesh.coords.pp]
            runner = PipelineExecutor(chunks, schedule, mesh.pp, StageIO((MICRO, SEQ // tp, cfg.hidden_size)),
                                      mesh.device)
        set_aux_grad_scale(chunks, 1.0 / M)
        mesh.ledger.reset()
        runner.forward_backward(batches)
        held = sum(p.numel() for n, p in chunks.named_parameters() if ".experts." in n)
        out[name] = (mesh.ledger.bytes("all_to_all_v", "ep"), held, mesh.ledger.bytes("all_to_all_v", "etp"))
    return out


@pytest.fixture(scope="module")
def measured():
    return run_distributed(_step_ledger, WORLD, timeout=600)


def _expert_dp_ledger(rank, world):
    """One train_step at tp 1 x dp 4, EP 2 (expert-DP 2), ZeRO 0-3: the ledger's collectives on the edp group."""
    from hybrid.moe.config import MoEConfig
    from hybrid.moe.layer import ExpertContext
    from hybrid.moe.parallel import build_mesh
    from hybrid.mesh import ParallelDims
    from hybrid.tp import TPContext
    from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    from models import build_pipeline_chunks

    cfg, out = load_config("tiny-mixtral"), {}
    for zero in ZeroStage:
        mesh = build_mesh(ParallelDims.from_world(world), 2)
        chunks = build_pipeline_chunks(cfg, TPContext(mesh.tp), 0, 1, seed=0,
                                       moe=ExpertContext(MoEConfig(expert_parallel=2), mesh.ep))
        opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=int(zero)), OptimizerConfig(lr=1e-3))
        ids = torch.randint(0, cfg.vocab_size, (MICRO, SEQ + 1), generator=torch.Generator().manual_seed(rank))
        mesh.ledger.reset()
        runner = LocalForwardBackward(chunks[0], mesh.device)
        train_step(chunks, [(ids[:, :-1], ids[:, 1:])] * M, opt, mesh, runner=runner)
        out[int(zero)] = {k.split("@")[0]: v["bytes"] for k, v in mesh.ledger.summary().items() if k.endswith("@edp")}
    return out


@pytest.fixture(scope="module")
def edp_ledgers():
    return run_distributed(_expert_dp_ledger, WORLD, timeout=600)


@pytest.mark.parametrize("zero", list(ZeroStage))
def test_predicted_expert_dp_bytes_equal_the_runtime_ledger(edp_ledgers, zero):
    """The experts' DP / ZeRO collectives the planner prices (moe.sync_ledger of Psi_e over expert-DP: all-reduce
    at ZeRO 0; reduce-scatter + all-gather at 1; the reduce-scatter per micro-batch at 2; and the forward and
    backward all-gathers per micro-batch at 3) = the runtime ledger's bytes on the edp group, op by op."""
    work = Workload(load_config("tiny-mixtral"), global_batch=WORLD * MICRO * M, seq_length=SEQ,
                    precision=Precision.FP32)
    layout = Layout(dp=WORLD, micro_batch=MICRO, zero=zero)
    plan = expert_plan(work, Cluster(gpus=WORLD, hw=hardware("cpu")), layout, 2)
    book = sync_ledger(work, layout, plan.expert_params, plan.edp)
    predicted = {k.split("@")[0]: v["bytes"] for k, v in book.items()}
    assert predicted and all(rank[int(zero)] == predicted for rank in edp_ledgers), (predicted, edp_ledgers[0])


def _predicted(tp, pp, ep, etp):
    work = Workload(load_config("tiny-mixtral"), global_batch=WORLD // (tp * pp) * MICRO * M, seq_length=SEQ,
                    precision=Precision.FP32)
    layout = Layout(tp=tp, pp=pp, dp=WORLD // (tp * pp), micro_batch=MICRO, sequence_parallel=tp > 1)
    return expert_plan(work, Cluster(gpus=WORLD, hw=hardware("cpu")), layout, ep, etp=etp)


@pytest.mark.parametrize("case", list(CASES))
def test_predicted_alltoall_bytes_equal_the_runtime_ledger(measured, case):
    """4 N k h b (ep - 1) / ep per MoE layer and micro-batch (dispatch + combine, forward and backward), summed
    over the step, = the ledger's all_to_all_v bytes on the ep group on every rank; the planner's step has
    M micro-batches of MICRO x SEQ / tp tokens a rank and the fullest stage's MoE layers. With expert-TP also
    4 N k h b (etp - 1) on the etp group (all-gather-v + reduce-scatter-v, forward and backward)."""
    plan = _predicted(*CASES[case])
    assert plan.alltoall_bytes > 0 and (plan.etp_bytes > 0) == (CASES[case][3] > 1)
    for rank in measured:
        assert rank[case][0] == plan.alltoall_bytes
        assert rank[case][2] == plan.etp_bytes


@pytest.mark.parametrize("case", list(CASES))
def test_predicted_expert_parameters_equal_what_a_rank_holds(measured, case):
    plan = _predicted(*CASES[case])
    for rank in measured:
        assert rank[case][1] == plan.expert_params


@pytest.mark.slow
def test_the_layout_the_planner_picks_runs(capsys):
    """`hybrid plan --emit-args` for tiny-mixtral on 4 CPU ranks with EP pinned to 2: the flags it prints (EP
    among them) train two iterations through train.py on 4 ranks."""
    code = plan_main(["--model", "tiny-mixtral", "--gpus", str(WORLD), "--gpu", "cpu", "--precision", "fp32",
                      "--activation-profile", "fp32-flash", "--global-batch-size", "8", "--seq-length", "32",
                      "--expert-model-parallel-size", "2", "--emit-args"])
    flags = capsys.readouterr().out.split()
    assert code == 0 and flags[flags.index("--expert-model-parallel-size") + 1] == "2", flags
    runs = launch([*flags, "--train-iters", "2", "--log-interval", "1", "--eval-iters", "0"], WORLD, timeout=600)
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    lines = [ln for ln in runs[0].stdout.splitlines() if ln.startswith(" iteration")]
    assert len(lines) == 2 and all(re.search(r"moe tokens/expert", ln) for ln in lines), runs[0].stdout[-2000:]


def _mixtral_8x7b(space: SearchSpace):
    work = Workload(load_config(MIXTRAL_8X7B), global_batch=256, seq_length=4096, fp32_grads=False)
    return search(work, Cluster(gpus=32, hw=hardware("h100-80g")), space, top=1)


PINNED = dict(tp=(2,), pp=(4,), v=(1,), micro_batch=(1,), zero=(ZeroStage.OPTIMIZER,), sequence_parallel=(True,))


def test_ep_is_chosen_when_the_experts_do_not_fit_at_ep_1():
    """Mixtral 8x7B on 32 H100 at tp 2 sp x pp 4 x dp 4, ZeRO 1, no recomputation: 8 experts a layer do not fit
    beside the rest at EP 1 (states of 45.1B / 4 stages expert parameters, sharded over dp 4 only for the
    optimizer); EP 2 halves them and fits. Pinned to EP 1 the layout is rejected, naming the experts. (Expert-TP
    pinned to 1 here: free, the planner splits the experts' width instead -- the next test.)"""
    free = _mixtral_8x7b(SearchSpace(**PINNED, recompute=(Recompute.NONE,), offload=(Offload.NONE,),
                                     expert_tensor_parallel=(1,)))
    best = free.plans[0]
    assert best.experts.ep == 2
    assert best.memory.peak.total + best.experts.extra_bytes <= hardware("h100-80g").capacity_bytes
    pinned = _mixtral_8x7b(SearchSpace(**PINNED, recompute=(Recompute.NONE,), offload=(Offload.NONE,),
                                       expert_parallel=(1,), expert_tensor_parallel=(1,)))
    assert not pinned.plans
    assert any("OOM on the experts: even ep 1" in r.reason for r in pinned.rejected), pinned.rejected


def test_expert_tp_is_chosen_when_ep_cannot_split_the_experts_further():
    """The same layout with EP pinned to 1: the experts do not fit whole, so the planner splits each expert's width
    instead (expert parameters 1 / etp of EP 1's, and the expert-TP all-gather / reduce-scatter priced);
    --explain names the chosen (ep, etp), --emit-args the flag."""
    from hybrid.planner.moe import train_argv, why

    res = _mixtral_8x7b(SearchSpace(**PINNED, recompute=(Recompute.NONE,), offload=(Offload.NONE,),
                                    expert_parallel=(1,)))
    best = res.plans[0]
    assert best.experts.ep == 1 and best.experts.etp >= 2, best.experts
    assert best.memory.peak.total + best.experts.extra_bytes <= hardware("h100-80g").capacity_bytes
    work = Workload(load_config(MIXTRAL_8X7B), global_batch=256, seq_length=4096, fp32_grads=False)
    whole = expert_plan(work, Cluster(gpus=32, hw=hardware("h100-80g")), best.layout, 1)
    assert best.experts.expert_params * best.experts.etp == whole.expert_params
    assert best.experts.etp_bytes > 0 and best.experts.etp_s > 0
    lines = why(work, Cluster(gpus=32, hw=hardware("h100-80g")), best.layout, best.memory.peak.total, best.experts)
    assert f"ep 1 x expert-tp {best.experts.etp} chosen" in lines[0]
    assert train_argv(best.experts) == ["--expert-model-parallel-size", "1", "--expert-tensor-parallel-size",
                                        str(best.experts.etp)]


def test_moe_layouts_train_py_refuses_are_not_planned():
    work = Workload(load_config("tiny-mixtral"), global_batch=8, seq_length=32, fp32_grads=False)
    assert layout_problems(work, Layout(tp=2, dp=2, sequence_parallel=False)) == [
        "MoE with tp > 1 needs sequence parallelism (each TP rank routes its own tokens)"]
    assert layout_problems(work, Layout(tp=2, dp=2, sequence_parallel=True)) == []
    assert "no ep of [3]" in layout_problems(work, Layout(dp=4), pinned=(3,))[0]
    assert "no expert-tp of [3]" in layout_problems(work, Layout(dp=4), pinned_etp=(3,))[0]
    assert layout_problems(Workload(load_config("tiny-llama"), global_batch=8, seq_length=32,
                                    fp32_grads=False), Layout(tp=2)) == []


def test_ep_flag_with_a_dense_model_is_refused(capsys):
    code = plan_main(["--model", "tiny-llama", "--gpus", "4", "--global-batch-size", "8",
                      "--expert-model-parallel-size", "2"])
    assert code == 2
    assert "--expert-model-parallel-size: the model has no experts" in capsys.readouterr().err


@pytest.mark.parametrize("given", [None, 4])
def test_auto_parallel_runs_the_planners_ep_or_the_given_one(capsys, given):
    """train.py --auto-parallel on an MoE model: the run's EP is the planner's choice (printed on the
    auto-parallel line), or the --expert-model-parallel-size given, which the planner then plans around."""
    from hybrid.train.args import configure, parse_args

    argv = ["--model", "tiny-mixtral", "--auto-parallel", "--global-batch-size", "8", "--seq-length", "32"]
    run, _ = configure(parse_args(argv + ([] if given is None else ["--expert-model-parallel-size", str(given)])),
                       world=WORLD)
    line = capsys.readouterr().out
    # '(predicted ... s/step' on a GPU or --hardware; '(ranked on the cpu preset's placeholder rates' on a CPU
    ep = int(re.search(r", ep (\d+) \((predicted|ranked)", line).group(1))
    assert run.moe.expert_parallel == ep and (given is None or ep == given), line


def test_the_runs_planner_line_prices_the_runs_own_ep():
    """train.py's start-up prediction (hybrid/train/explain.predict) of an MoE run counts the experts at the run's
    --expert-model-parallel-size: the memory differs between EP 1 and EP 2 by exactly the planner's expert terms
    at those sizes (ZeRO 1 over dp 2: EP 2 holds half the experts)."""
    from hybrid.train.args import configure, parse_args
    from hybrid.train.explain import predict, run_experts

    memory, extra = {}, {}
    for ep in (1, 2):
        run, _ = configure(parse_args(["--model", "tiny-mixtral", "--global-batch-size", "8", "--seq-length", "32",
                                       "--micro-batch-size", "2", "--zero-stage", "1",
                                       "--expert-model-parallel-size", str(ep)]), world=2)
        p = predict(run, torch.device("cpu"), 0.0)
        assert p.error is None, p.error
        memory[ep] = p.tensors_bytes
        work = Workload(load_config("tiny-mixtral"), global_batch=8, seq_length=32, precision=Precision.FP32)
        extra[ep] = expert_plan(work, Cluster(gpus=2, hw=hardware("cpu")),
                                Layout(dp=2, micro_batch=2, zero=ZeroStage.OPTIMIZER), ep).extra_bytes
    assert memory[1] - memory[2] == pytest.approx(extra[1] - extra[2]) and extra[1] > extra[2]


def test_the_runs_planner_line_prices_the_runs_own_expert_tp():
    """The same start-up prediction at --expert-tensor-parallel-size 1 and 2 (2 ranks, EP 1): the memory differs by
    exactly the planner's expert terms at those sizes (expert-TP 2 holds half of every expert)."""
    from hybrid.train.args import configure, parse_args
    from hybrid.train.explain import predict

    memory, extra = {}, {}
    for etp in (1, 2):
        run, _ = configure(parse_args(["--model", "tiny-mixtral", "--global-batch-size", "8", "--seq-length", "32",
                                       "--micro-batch-size", "2", "--zero-stage", "1",
                                       "--expert-tensor-parallel-size", str(etp)]), world=2)
        p = predict(run, torch.device("cpu"), 0.0)
        assert p.error is None, p.error
        memory[etp] = p.tensors_bytes
        work = Workload(load_config("tiny-mixtral"), global_batch=8, seq_length=32, precision=Precision.FP32)
        plan = expert_plan(work, Cluster(gpus=2, hw=hardware("cpu")),
                           Layout(dp=2, micro_batch=2, zero=ZeroStage.OPTIMIZER), 1, etp=etp)
        extra[etp] = plan.extra_bytes
    assert memory[1] - memory[2] == pytest.approx(extra[1] - extra[2]) and extra[1] > extra[2]
