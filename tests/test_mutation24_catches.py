"""Round 24's outside mutation review of round 23's new code: one-line bugs planted on purpose in `hybrid plan`'s
gradient dtype and its --scan-gpus CP table, the DGXC rows' FP8 weights / DP overlap and the DP what-if, calibrate's
every-rank probes, the pipeline simulation's speed-up, polish23's refusals and resumed split, newuser23's fixes and
the loop's start-up lines; the area's fast tier run on each. Each test here kills a mutant that tier let live, shown
failing on the mutant and passing on HEAD. In-process, no process group.

The mutant ids (G2-bf16-fp32-plan-accepted, ...) are those of branch mutation24's report and of
docs/architecture.md's tally."""

from __future__ import annotations

import pytest

from hybrid.cli import main as hybrid_main

GPT2 = ["plan", "--model", "gpt2-medium", "--gpus", "8", "--global-batch-size", "32", "--seq-length", "1024"]


# --- G: `hybrid plan`'s gradient dtype (hybrid/planner/cli.py grads_in_fp32) ---------------------------------------
@pytest.mark.parametrize("flags, line", [
    (["--gpu", "cpu", "--grad-reduce-in-bf16"], "--grad-reduce-in-bf16 needs --precision mixed"),
    (["--precision", "fp32", "--grad-reduce-in-bf16"], "--grad-reduce-in-bf16 needs --precision mixed"),
    (["--gpu", "cpu", "--accumulate-allreduce-grads-in-fp32"],
     "--accumulate-allreduce-grads-in-fp32 needs --precision mixed"),
])
def test_a_gradient_dtype_flag_on_an_fp32_plan_is_one_line(flags, line, one_line):
    """An fp32 plan (--precision fp32, or the cpu preset's default) has fp32 gradients, as train.py's fp32 runs:
    --grad-reduce-in-bf16 cannot apply, --accumulate-allreduce-grads-in-fp32 says nothing. Both are one line, as
    train.py's check_grad_dtype_flags. G2-bf16-fp32-plan-accepted and G3-accum-fp32-plan-accepted (either check
    dropped: the plan ran, fp32 gradients, the flag silently ignored) lived through the plan's round-23 files."""
    got = one_line(lambda: hybrid_main(GPT2 + flags))
    assert line in got, got


def _gpt_work(**kw):
    from hybrid.planner.layout import Workload
    from hybrid.planner.reference import gpt_model
    return Workload(gpt_model(2, 512, 8, 32000, 1024), global_batch=8, seq_length=1024, **kw)


def test_an_fp32_plan_says_fp32_gradients_and_emits_no_bf16_opt_out():
    """An fp32 plan's gradients are fp32 (Workload.grad_bytes 4) though Workload.fp32_grads, the mixed-precision
    choice, is False: --json's grad_dtype says "fp32", --explain's gradients line "fp32, 4 bytes", and --emit-args
    gives no --grad-reduce-in-bf16 (train.py refuses it without --bf16). G4-grad-dtype-from-fp32-grads (grad_dtype
    read from fp32_grads: "bf16" for every fp32 plan) lived through the plan's round-23 files: their --json plans
    are all mixed. (G6-emit-bf16-flag-fp32-plan, the opt-out emitted for any plan without fp32_grads, dies here too;
    test_cpviews22's cpu --emit-args case kills it already.)"""
    from hybrid.planner.cli import grad_dtype, grads_line
    from hybrid.planner.model import Precision
    from hybrid.planner.train_flags import workload_flags
    fp32, mixed = _gpt_work(precision=Precision.FP32), _gpt_work(precision=Precision.MIXED, fp32_grads=True)
    assert (grad_dtype(fp32), grad_dtype(mixed), grad_dtype(_gpt_work(precision=Precision.MIXED, fp32_grads=False))) == (
        "fp32", "fp32", "bf16")
    assert grads_line(fp32) == "  gradients: fp32, 4 bytes a parameter in memory and in the DP reductions (fp32 training)"
    assert workload_flags(fp32)["grad_reduce_in_bf16"] is False and workload_flags(fp32)["bf16"] is False
    assert workload_flags(_gpt_work(precision=Precision.MIXED, fp32_grads=False))["grad_reduce_in_bf16"] is True


# --- G: `hybrid plan --scan-gpus` with --context-parallel-size (cli._scan_cp) --------------------------------------
@pytest.mark.parametrize("comm", ["p2p", "a2a", "allgather"])
def test_the_cp_scan_keeps_a_pinned_comm_type(capsys, comm):
    """`--scan-gpus 4 --context-parallel-size 2 --cp-comm-type C`: the count's best plan exchanges K, V by C, as
    `--gpus 4` ranks it (cli._cp_comms). G9-scan-cp-ignores-comm-pin (the scan searching every comm type whatever
    was pinned) lived through test_planner23_scan_cp, which pins none: at most one of the three pins can name the
    unpinned winner."""
    import json
    from hybrid.planner.cli import main
    argv = ["--model", "tiny-llama", "--gpu", "cpu", "--global-batch-size", "8", "--seq-length", "128",
            "--context-parallel-size", "2", "--cp-comm-type", comm, "--scan-gpus", "4", "--json"]
    assert main(argv) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["best"]["layout"]["context_parallel_size"] == 2 and row["best"]["layout"]["cp_comm_type"] == comm


# --- D: the DGXC rows' DP what-if (hybrid/planner/published23_dp.py latency_what_if) -------------------------------
def _what_if(tp: int, gpus: int, cp: int, zero: int = 1, fp8: bool = False) -> tuple[float, float, float]:
    """latency_what_if of a Megatron-core row of `gpus` H100s at tp x pp 1 x cp, GBS 64, micro-batch 1, on a
    hardware of 5 us intra-node and 30 us inter-node latency."""
    from types import SimpleNamespace as NS
    from hybrid.planner import published23_dp as dp_study
    from hybrid.planner.ops import Fp8Scaling, Stack
    hw = NS(intra_latency_s=5e-6, inter_latency_s=30e-6)
    work = NS(stack=Stack.MEGATRON, global_batch=64, fp8=fp8, fp8_scaling=Fp8Scaling.DELAYED)
    run = NS(gpus=gpus, cp=cp, workload=work, hardware=lambda: hw)
    result = NS(plan=NS(layout=NS(tp=tp, pp=1, zero=zero, micro_batch=1, v=1)))
    return dp_study.latency_what_if(run, result)


def test_the_dp_what_if_prices_from_the_rows_groups():
    """NCCL's terms from the row's groups, by tuning.cc's formulas worked by hand (us):
    * tp 2 on 8 GPUs: DP 4, one node (4 a node): one ring 8.4 + 3 x 3.4 = 18.6 against the planner's intra-node
      5 -> 2 calls x 13.6 = 27.2; no CP, no FP8: the loss's tree over 4 in a node, 6.8 + 2 (3 x 0.6) = 10.4, x 64 / 4 = 16
      micro-batches;
    * tp 1, cp 2 on 64 GPUs: the gradients over DP x CP = 64 (8 nodes), the micro-batches over DP = 32: 64 / 32 = 2 a
      step; the loss's tree over DP 32 at 4 a node (a node's 8 GPUs hold 4 DP ranks of 2 CP ranks each):
      6.8 + 2 (3 x 0.6 + 3 x 5.0) = 40.4, x 2; delayed-scaling FP8: 2 amax all-reduces a micro-batch over tp x DP x CP
      = 64 at 8 a node, 6.8 + 2 (7 x 0.6 + 3 x 5.0) = 45.2, x 2 x 2;
    * ZeRO 3: not the distributed optimizer, nothing priced.
    D5-flat-latency-comparison (a one-node DP charged the inter-node latency: ring 0), D7-loss-over-dp-cp (the loss
    averaged over DP x CP), D9-applies-any-zero and D11-shape-ga-uses-dp-cp (micro-batches from DP x CP) lived
    through the round-23 planner files: their rows are ZeRO 1, multi-node, and cp 1 in the what-if's doc table.
    (D6-amax-one-a-microbatch dies here too; test_planner23_fp8_dp's doc-table test kills it already.)"""
    ring, amax, loss = _what_if(tp=2, gpus=8, cp=1)
    assert (ring, amax, loss) == (pytest.approx(27.2e-6), 0.0, pytest.approx(16 * 10.4e-6))
    ring, amax, loss = _what_if(tp=1, gpus=64, cp=2, fp8=True)
    assert (amax, loss) == (pytest.approx(4 * 45.2e-6), pytest.approx(2 * 40.4e-6))
    assert ring == pytest.approx(2 * ((8.4 + 56 * 3.4 + 7 * 14.0) - 30) * 1e-6)
    assert _what_if(tp=1, gpus=64, cp=2, zero=3, fp8=True) == (0.0, 0.0, 0.0)


# --- U: the loop's resumed split and start-up lines (hybrid/train/loop.py), inspect's sequence note -----------------
def test_the_loop_builds_a_resume_past_train_iters_its_final_evaluations_valid_block():
    """--train-iters 20, evaluated every 10 iterations, 1 iteration of 4 samples: the valid split holds Megatron's
    (20 // 10 + 1) x 4 = 12. Resumed at iteration 30 (a checkpoint past --train-iters: nothing to train), the run
    evaluates at its own iteration, block 30 // 10 = 3, samples 12-15: the loop's split is built to 16, not wrapped
    onto an earlier evaluation's. U11-resumed-valid-no-start (the loop's valid_samples without the resume's
    iteration) lived through the data / polish / DiLoCo round-23 files' fast tier: test_data23_final_eval_valid's
    fast tests call valid_samples and covering, not the loop (its slow train.py resume kills it)."""
    import numpy as np

    from hybrid.data.indexed import InMemoryDocuments
    from hybrid.data.source import DataSource, SplitSizes
    from hybrid.train.args import parse_args, run_config
    from hybrid.train.loop import resumed_data
    run = run_config(parse_args(["--train-iters", "20", "--global-batch-size", "4", "--micro-batch-size", "4",
                                 "--eval-interval", "10", "--eval-iters", "1"]), 1)
    tokens = np.random.default_rng(0).integers(0, 256, 100 * 500).astype(np.uint8)
    data = DataSource([InMemoryDocuments(tokens, np.full(100, 500), "corpus.txt")], [1.0], (0.8, 0.15, 0.05), 16,
                      1234, SplitSizes.for_run(20, 4, 10, 1))
    assert data.sizes.valid == 12
    assert resumed_data(run, data, 30, 120).sizes.valid == 16
    assert resumed_data(run, data, 20, 80).sizes.valid == 12  # resumed at its end: the block it was sized for


def test_under_diloco_the_loop_prints_one_line_with_the_simulated_link():
    """DiLoCo with --simulated-dp-bandwidth: the link is the cross-replica one, named on the `diloco:` line, and the
    `compress:` line (no scheme, only the link) is not printed. U12-feature-compress-link-diloco-false (the loop's
    compress line built as if without DiLoCo: a second line naming a "simulated DP link" the DP ranks never use)
    lived through the round-23 files: mutation23's feature_lines test has no link, mutation22's calls describe."""
    from types import SimpleNamespace

    from hybrid.diloco.run import LocalUpdates
    from hybrid.train.args import parse_args, run_config
    from hybrid.train.loop import feature_lines
    run = run_config(parse_args(["--diloco-inner-steps", "4", "--simulated-dp-bandwidth", "0.5",
                                 "--global-batch-size", "16"]), 4)
    lines = feature_lines(run, LocalUpdates(run.diloco, SimpleNamespace(dp=SimpleNamespace(size=1)),
                                            SimpleNamespace(replicas=4)))
    assert len(lines) == 1 and lines[0].startswith("diloco: 4 replicas | H 4 inner steps"), lines
    assert lines[0].endswith(" | simulated cross-replica link 0.5 GB/s"), lines


def test_inspect_says_when_the_saved_sequence_does_not_split_at_cp_2():
    """A saved --seq-length 30 at cp 2: 2 x 2 = 4 load-balanced chunks do not divide it, which inspect notes (as
    at cp 3). U13-inspect-cp-gt-2 (the note from cp 3 on) lived through test_newuser23_cp: it asks at cp 3 and 4."""
    from hybrid.checkpoint.inspect import Target, loadable_at
    state = {"model": "tiny-mixtral", "args": {"global_batch_size": 4, "micro_batch_size": 2, "seq_length": 30}}
    ok, why = loadable_at(state, Target(tp=1, pp=1, world=2, cp=2))
    assert ok and "the saved sequence does not split at cp 2 (--seq-length 30 is not divisible by 2 x " \
                  "--context-parallel-size 2 = 4" in why, why


# --- N: the MoE hot expert's rank (hybrid/moe/runtime.py step_statistics) ------------------------------------------
def test_the_hot_experts_stage_is_the_ranks_own_pp_rank_plus_one():
    """pp 2 at dp 1 (a stage is one rank, ep 1: each rank holds every expert of its layers): rank 1's stage column
    is its own pp rank + 1 = 2 (summed over a stage of 1), so its layer 3's hot expert is on rank 1. With the column
    pp rank alone, stage 1 read as stage 0 (and stage 0 as -1: no rank). N2-stage-column-pp-rank lived through
    test_newuser23_moe: its stand-in DP partner adds a hard-coded 2.0 to the column (2 x (1 + 1) with rank 2's own),
    and round(3 / 2) - 1 is stage 1 as well. Rank 1's statistics with stand-in groups, no process group."""
    import torch
    from types import SimpleNamespace

    from hybrid.mesh import ParallelDims
    from hybrid.moe.parallel import ExpertLayout
    from hybrid.moe.runtime import step_statistics
    from test_newuser23_moe import E, _Group, _stage_one
    stage = _stage_one()  # layers 2 and 3 of 4
    for lid, block in stage.layers.items():
        block.mlp.stat_counts = torch.zeros(E)
        block.mlp.stat_counts[3] = 100.0 if lid == "3" else 0.0
    other_stage = torch.zeros(4, E + 3, dtype=torch.float64)  # stage 0 (rank 0): its layers 0-1, its column 1
    other_stage[:2, :E], other_stage[:2, E + 2] = 10.0, 1.0
    mesh = SimpleNamespace(tp=_Group(size=1), cp=_Group(size=1), dp=_Group(size=1), pp=_Group(other_stage, rank=1),
                           device=torch.device("cpu"))
    layout = ExpertLayout(ParallelDims(pp=2, dp=1), ep=1)
    assert step_statistics(stage, mesh, micro_batches=1, layout=layout).hot_expert == (3, 3, 1)


def test_a_checkpoint_with_the_expert_bias_resumes_with_the_flag():
    """check_resume refuses a checkpoint whose DCP keys hold no `moe/` entry (no expert bias saved) and passes one
    that holds the bias beside the model's keys. N3-bias-any-to-all (every key must be a `moe/` one) lived through
    test_newuser23_moe: it resumes only a checkpoint without the bias -- the mutant refused every real one."""
    from hybrid.moe.args import check_resume
    check_resume(("ckpt/iter_0000004", frozenset({"model/layers.1.mlp.router.weight",
                                                  "moe/layers.1.mlp.gate.expert_bias", "optim/state"})))
    check_resume(None)  # no resume
    with pytest.raises(ValueError, match="holds no expert bias"):
        check_resume(("ckpt/iter_0000004", frozenset({"model/layers.1.mlp.router.weight", "optim/state"})))


def test_a_dp_series_counts_dp_sizes_not_rows():
    """published23_dp.series keeps a model / layout series with at least 3 DP sizes: two rows at dp 8 (GBS 128 and
    256: one series, series_key drops the GBS) and one at dp 16 are 2 sizes, no trend to fit; a third size makes
    one. D10-series-min-sizes (rows counted, not sizes) lived through the round-23 planner files: no series there has
    two rows at one dp."""
    from types import SimpleNamespace as NS
    from hybrid.planner import published23_dp as dp_study

    def row(gbs: int, dp: int):
        return NS(family="DGXC (H100)", name=f"DGXC 25.04.01 X-1B BF16, {dp * 2} H100, t2 p1, b1, GBS {gbs}", tp=2,
                  pp=1, cp=1, dp=dp, error=0.01 * dp)
    rows = [row(128, 8), row(256, 8), row(256, 16)]
    assert dp_study.series(rows) == {}
    ((_, got),) = dp_study.series(rows + [row(512, 32)]).items()
    assert [r.dp for r in got] == [8, 8, 16, 32]


# --- C: calibrate's probe layers (hybrid/planner/calibrate.py) -----------------------------------------------------
def test_the_probe_layer_means_are_per_pass_both_ways():
    """layer_seconds' forward and backward are means over the same passes: on a clock that advances 1 s a reading,
    each timed forward and each timed backward reads 1 s, so the means are (1, 1). C6-layer-fwd-per-round (the
    backward's sum over rounds, not passes: IN_FLIGHT x too slow) lived through the calibrate round-23 files: they
    ask for positive times only."""
    import itertools

    import torch

    from hybrid.planner import calibrate as cal
    ticks = itertools.count()
    assert cal.layer_seconds(cal.PASS_SHAPE, 0.0, torch.device("cpu"), clock=lambda: float(next(ticks))) == (1.0, 1.0)


def test_a_gpus_one_rank_probe_layers_keep_no_per_rank_record():
    """The per-rank record of the probe layers is kept where more than one rank timed them (a CPU, every rank at
    once); on a GPU rank 0 alone times them (the others None): no record, a single rank is no spread.
    C9-ranks-record-one-rank (the record from one rank on) lived through the calibrate round-23 files."""
    from hybrid.planner import calibrate as cal
    assert cal._layer_ranks_record([{"layer_seconds": [(1.0, 2.0)]}, {"layer_seconds": [None]}]) == {}
    two = cal._layer_ranks_record([{"layer_seconds": [(1.0, 2.0)]}, {"layer_seconds": [(1.5, 2.5)]}])
    assert two["layer_probe_ranks_at_once"] == 2


def test_the_expert_bias_check_reads_the_checkpoint_ckpt_step_names(monkeypatch):
    """resume_keys reads the checkpoint the run will load: --ckpt-step's when given (an older iteration, saved
    perhaps before the bias was turned on), else the newest intact one. N5-resume-keys-latest (always the newest)
    lived through test_newuser23_moe: its folder holds one iteration. _resume_candidate stands in (it is the resume's
    own lookup, tested with the resume)."""
    from types import SimpleNamespace as NS

    from hybrid.checkpoint import args as ckpt_args
    asked = []

    def candidate(load, step):
        asked.append(step)
        return f"{load}/iter_{step or 8:07d}", {}, NS(state_dict_metadata={"model/w": 0})
    monkeypatch.setattr(ckpt_args, "_resume_candidate", candidate)
    assert ckpt_args.resume_keys(NS(load="ck", ckpt_step=4)) == ("ck/iter_0000004", frozenset({"model/w"}))
    assert ckpt_args.resume_keys(NS(load="ck", ckpt_step=None))[0] == "ck/iter_0000008"
    assert ckpt_args.resume_keys(NS(load=None, ckpt_step=None)) is None and asked == [4, None]


def test_hybrid_layout_names_a_range_of_two_experts_as_a_range(capsys):
    """8 experts over ep 4: two a rank, "experts 0-1"; one a rank (8 over ep 8) "expert 0". N6-one-expert-len-le-2
    (a range of two called one expert, "expert 0") lived through test_newuser23_moe: it asks for 1 and 4 a rank."""
    hybrid_main(["layout", "--world", "8", "--expert-model-parallel-size", "4", "--num-experts", "8"])
    out = capsys.readouterr().out
    assert "  rank 0: experts 0-1\n" in out and "  rank 3: experts 6-7\n" in out, out


def test_one_rank_diloco_with_zero_gets_no_unsharded_zero_warning():
    """unsharded_zero_warning at dp 1 with the default replicas (R = dp = 1): one replica, nothing to say (the
    single-replica warning says DiLoCo has no peer); at dp 4 (4 replicas of one rank) the line. N12-zero-warning-
    replicas-default (`cfg.replicas == 1` for the replica count: the default None read as several) lived through the
    DiLoCo new-user files: they warn at dp 4 and 8 only."""
    from types import SimpleNamespace as NS

    from hybrid.diloco.args import DiLoCoConfig, unsharded_zero_warning
    assert unsharded_zero_warning(DiLoCoConfig(inner_steps=4), NS(dp=1, cp=1), 1) == ()
    (line,) = unsharded_zero_warning(DiLoCoConfig(inner_steps=4), NS(dp=4, cp=1), 1)
    assert line.startswith("--zero-stage 1 with --diloco-inner-steps: ZeRO shards inside each replica, and each of "
                           "the 4 replicas is one rank"), line


# --- S: the pipeline simulation (hybrid/pipeline/simulate.py _match_messages) --------------------------------------
@pytest.mark.parametrize("peer", [0, 2, None])
def test_a_message_to_its_own_rank_or_none_is_refused_by_name(peer):
    """A send whose peer is the sending rank itself, outside [0, pp) or missing is a broken list: ValueError naming
    the action, before any matching. S6-peer-check-self (the inlined pre-check without `peer == rank`, so
    _check_peer never ran for a send to itself: a deadlock report, or a message matched to itself) lived through
    the pipeline files' fast tier (179 tests): none hands the simulator a message to its own rank."""
    from hybrid.pipeline.schedules import Action, Op
    from hybrid.pipeline.simulate import simulate
    lists = [[Action(Op.FORWARD, 0), Action(Op.SEND_ACT, 0, peer=peer)], []]
    with pytest.raises(ValueError, match=r"rank 0: SEND_ACT\(mb=0,c=0\).* needs a peer pipeline rank in \[0, 2\) "
                                         r"other than itself"):
        simulate(lists)


def test_the_tape_stops_a_compute_whose_input_has_no_sender_and_names_it():
    """Rank 1 receives an activation rank 0 never sends: the compiled tape (LazyTape, the planner's makespans)
    stops at the forward that needs it and says so, as simulate does. S7-tape-no-partner-runs (a receive without a
    partner let its compute run: the report named only the unmatched receive's end-of-step wait, not the stuck
    forward) lived through the pipeline files' fast tier (179 tests)."""
    from hybrid.pipeline.schedules import Action, Op
    from hybrid.pipeline.simulate import DeadlockError, LazyTape, simulate
    lists = [[], [Action(Op.RECV_ACT, 0, peer=0), Action(Op.FORWARD, 0)]]
    stuck = r"rank 1 stuck at FORWARD\(mb=0,c=0\): its input RECV_ACT\(mb=0,c=0\)@0 waits for no matching message"
    for build in (lambda: simulate(lists), lambda: LazyTape(lists)):
        with pytest.raises(DeadlockError, match=stuck):
            build()
