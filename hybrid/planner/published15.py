"""Issue 26, round 15: the PyTorch-native (FSDP / torchtitan) family -- new CHECK rows and the candidate mechanisms.

    python -m hybrid.planner.published15               # the new rows (docs/planner/rounds.md "Round 15")
    python -m hybrid.planner.published15 --family      # every PyTorch-native row the repository holds, by table
    python -m hybrid.planner.published15 --mechanisms  # each candidate mechanism priced on those rows
    python -m hybrid.planner.published15 --tp-missing  # the KempnerForge TP rows' missing time, per layer

The model is unchanged this round: every row below is a `Role.CHECK` row, entered from its source and planned
before its error was read; nothing was fitted to it, and the mechanisms are what-ifs (nothing in the planner reads
them). docs/planner/rounds.md "Round 15" says why no mechanism was landed.

Source of the new rows, read at the commit named:

* KempnerInstitute/KempnerForge benchmarks/mfu_scaling/mfu_scaling_2026-04-05.md (at 9f3f03a; the runs at the
  framework's git 01b461a) and the script that ran them, benchmarks/mfu_scaling/mfu_bench.sh (same commit): 14
  Llama-3-shaped runs on 1-32 H200 141 GB, 4 a node (NVLink in a node, InfiniBand between: the link rate is not
  stated; the h200 preset's 47 GB/s a GPU is kept), s 4096, bf16, full activation checkpointing, fused AdamW, the
  "Full Results Table"'s tok/s (all GPUs; tok/s x step time = micro-batch x accumulation x 4096 x DP on every
  row, tests/test_planner_published15.py) over the GPUs. The layout of each run is the script's command line:
  `--distributed.tp`, `--distributed.dp_shard` (FSDP2 over it; none at 1), `--train.batch_size` (micro-batch),
  `--train.grad_accum_steps`, `--train.compile_model` (true but for experiment 08). Settings read in the code at
  01b461a: kempnerforge/distributed/parallel.py -- FSDP2 `fully_shard` per block and the root, reshard after
  forward, `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32)` (fp32 gradient reduction:
  Workload.fp32_grads where DP > 1), `checkpoint_wrapper(CheckpointImpl.NO_REENTRANT)` per TransformerBlock (full
  AC, torch's non-reentrant early stop), the model cast to bf16 before the optimizer is built (`model.to(dtype=
  param_dtype)`: bf16 parameters and AdamW states, planned as optimizer_dtype_bytes=2 and, since round 24, no master
  copy: adam_master_copy=False, K = 4); tensor_parallel.py --
  DTensor Colwise / Rowwise with SequenceParallel norms (SP with TP), `ColwiseParallel(input_layouts=Shard(1))` on
  each of q, k, v, gate and up, so each all-gathers the layer's input on its own (Workload.tp_plan PROJECTION:
  round 17; rounds 15-16 planned one all-gather a block); scripts/train.py -- `maybe_no_sync` on all
  but the last micro-batch. The models: "7B" is Llama 3 8B's shape (8.03B: h 4096, 32 layers, 32 / 8 heads, ffn
  14336), "13B" h 5120, 40 layers, 40 / 8 heads, ffn 17920 (ffn_dim_multiplier 1.3 rounded up to 256: 14.84B as
  the report's table says), "70B" Llama 3 70B's; vocabulary 128256, untied. Attention: SDPA (flash). The cluster
  has 4 GPUs a node: PublishedRun's hardware with gpus_per_node 4.

* KempnerForge benchmarks/weak_scaling_160gpu/README.md (at e9f9189; runs at git 3ad9d9a, 2026-06-30) and its
  driver weak_scaling_160gpu_bench.sh: 13B and 70B at TP 4 x FSDP on 8-160 H200 with mfu_bench.sh's flags (13B b4
  x 4, 70B b2 x 4, compile); the code at 3ad9d9a is not re-read (the settings above are assumed to hold).
* KempnerForge benchmarks/config_validation/config_validation_2026-04-06.md (at 5d3e723; runs at 6a9a08a plus
  uncommitted fixes; it states the link: InfiniBand NDR 400 Gb/s) and configs/train/7b.toml, 7b_12gpu_tp4.toml,
  7b_32gpu_fsdp.toml at 5d3e723: the three 7B configs (FSDP 4 at b8 x 4, TP 4 x FSDP 3 at b4 x 8, FSDP 32 at b4 x
  4), compiled, full AC; the last 5 of 10 steps. Left out: its 70B TP 4 x FSDP 8 (the configuration of mfu exp 14
  and the weak-scaling 32-GPU row) and its PP configs (uncompiled, loss logging broken by its own account).

  The TP output head gathers the full logits (`ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())`
  on `output_head.proj`, tensor_parallel.py as read at 0c4eba1): b s V bf16 a micro-batch all-gathered on the TP
  group and the loss over the whole vocabulary on every rank -- planned since round 20 (Workload.gathered_logits).
  Not planned as the code runs it (the planner has no switch for it): FSDP2 skips the reduce-scatter of all but
  the last micro-batch (`maybe_no_sync`), the planner reduce-scatters each one (pessimistic, hidden traffic on the
  2-4 accumulation rows).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, replace

from hybrid.planner.layout import Offload, Recompute, TpPlan, Workload, ZeroStage
from hybrid.planner.model import ActivationProfile
from hybrid.planner.ops import KernelProfile, Stack
from hybrid.planner.published import (LLAMA3_8B, LLAMA3_70B, Metric, PublishedRun, Role, _plan_on, all_runs,
                                      llama_model)
from hybrid.planner.published_more import Result, evaluate, more_runs, summary_line, table
from hybrid.planner.search import SearchSpace

KEMPNER_SOURCE = ("KempnerInstitute/KempnerForge benchmarks/mfu_scaling/mfu_scaling_2026-04-05.md at 9f3f03a (runs "
                  "at git 01b461a; 8 nodes of 4 H200 141 GB), 'Full Results Table' tok/s over the GPUs; layout from "
                  "benchmarks/mfu_scaling/mfu_bench.sh")
KEMPNER_13B = (40, 5120, 40, 8, 17920, 128256)
KEMPNER_MODELS = {"7B": LLAMA3_8B, "13B": KEMPNER_13B, "70B": LLAMA3_70B}
KEMPNER_SEQ = 4096
KEMPNER_GPUS_PER_NODE = 4
# (experiment, GPUs, model, TP, micro-batch, accumulation, torch.compile, tok/s all GPUs, Mem/GPU GB, step s)
KEMPNER_ROWS = ((1, 1, "7B", 1, 2, 4, True, 10471, 80.7, 3.13),
                (2, 2, "7B", 1, 2, 4, True, 18728, 62.4, 3.50),
                (3, 2, "7B", 2, 4, 2, True, 13163, 57.8, 2.49),
                (4, 4, "7B", 1, 4, 2, True, 38983, 61.1, 3.36),
                (5, 4, "7B", 4, 4, 2, True, 25135, 39.4, 1.30),
                (6, 4, "7B", 2, 4, 2, True, 25980, 45.9, 2.52),
                (7, 8, "7B", 4, 4, 2, True, 44299, 32.7, 1.48),
                (8, 8, "13B", 1, 4, 4, False, 35405, 88.5, 14.81),
                (9, 8, "13B", 4, 4, 4, True, 27345, 45.1, 4.79),
                (10, 16, "7B", 4, 4, 2, True, 82988, 29.4, 1.58),
                (11, 16, "13B", 4, 4, 4, True, 53814, 39.2, 4.87),
                (12, 32, "7B", 4, 4, 2, True, 155917, 27.6, 1.68),
                (13, 32, "13B", 4, 4, 4, True, 104309, 36.3, 5.03),
                (14, 32, "70B", 4, 2, 4, True, 17657, 93.2, 14.85))


KEMPNER_WEAK_SOURCE = ("KempnerInstitute/KempnerForge benchmarks/weak_scaling_160gpu/README.md at e9f9189 (runs at git "
                       "3ad9d9a, 2026-06-30; 4 H200 a node), 'Results' tok/s over the GPUs; layout from "
                       "weak_scaling_160gpu_bench.sh")
# (model, GPUs, tok/s all GPUs, Mem/GPU GB, step s): TP 4 x FSDP gpus / 4, compile, the models' micro-batch and
# accumulation (13B: 4 x 4, 70B: 2 x 4) as the script's B13 / B70; the 160-GPU rows are the mean of two runs
KEMPNER_WEAK_ROWS = (("13B", 8, 29860, 45.0, 4.39), ("13B", 32, 110373, 36.2, 4.75), ("13B", 64, 216507, 34.8, 4.84),
                     ("13B", 128, 423306, 34.0, 4.95), ("13B", 160, 534644, 33.9, 4.91),
                     ("70B", 8, 3623, 128.5, 18.09), ("70B", 32, 18688, 93.2, 14.03), ("70B", 64, 35824, 86.8, 14.63),
                     ("70B", 96, 52190, 84.6, 15.07), ("70B", 128, 69985, 83.6, 14.98),
                     ("70B", 160, 85571, 82.9, 15.32))
KEMPNER_WEAK_BATCH = {"13B": (4, 4), "70B": (2, 4)}
# Rows whose own log records settings other than the driver's (round 24, planner24c): the README's 8-GPU points
# "came from a 2-node pre-flight" (weak_scaling_160gpu_bench.sh), and the 70B pre-flight's log
# (results/preflight_70b_008gpu_tp4_fsdp2.log at 17248f8, SLURM job 26365020 "kf-mfu-preflight") prints its
# JobConfig as `batch_size=1 ... grad_accum_steps=8 ... compile_model=False`, has no "Compiling model with
# torch.compile..." line (the 32-GPU 70B log, and the 13B pre-flight of the same job, have it and print b2 x 4 /
# b4 x 4, compile_model=True), and ends "30 steps, 1,966,080 tokens" = 30 x 1 x 8 x 4096 x DP 2. The README's
# 3,623 tok/s and 18.09 s are the median of that log's steps 16-30. (model, GPUs) -> (micro-batch, accumulation,
# compiled, the log).
KEMPNER_WEAK_AS_LOGGED = {("70B", 8): (1, 8, False, "results/preflight_70b_008gpu_tp4_fsdp2.log at 17248f8")}


def kempner_weak_setting(size: str, gpus: int) -> tuple[int, int, bool]:
    """(micro-batch, accumulation, torch.compile) a weak-scaling row ran: its log's where it differs from the
    driver's B13 / B70 (KEMPNER_WEAK_AS_LOGGED), else the driver's."""
    return KEMPNER_WEAK_AS_LOGGED.get((size, gpus), (*KEMPNER_WEAK_BATCH[size], True, None))[:3]


KEMPNER_VALIDATION_SOURCE = ("KempnerInstitute/KempnerForge benchmarks/config_validation/"
                             "config_validation_2026-04-06.md at 5d3e723 (runs at git 6a9a08a + uncommitted fixes; "
                             "4 H200 a node, InfiniBand NDR 400 Gb/s), 'Summary' tok/s over the GPUs (the last 5 of 10 "
                             "steps); layout from the config at 5d3e723")
# (config, GPUs, TP, micro-batch, accumulation, tok/s all GPUs, Mem/GPU GB, step s): the 7B configs, all compiled,
# full AC; the 70B TP 4 x FSDP 8 config repeats mfu exp 14 and the weak-scaling 32-GPU row (left out), the PP configs
# run KempnerForge's pipeline schedule uncompiled with its loss logging broken (left out)
KEMPNER_VALIDATION_ROWS = (("7b.toml", 4, 1, 8, 4, 38858, 81.0, 13.49),
                           ("7b_12gpu_tp4.toml", 12, 4, 4, 8, 67045, 30.4, 5.86),
                           ("7b_32gpu_fsdp.toml", 32, 1, 4, 4, 297384, 51.3, 7.05))


@dataclass(frozen=True)
class NodeRun(PublishedRun):
    """A PublishedRun on nodes of `gpus_per_node` GPUs (KempnerForge's 4-GPU H200 nodes)."""

    gpus_per_node: int = 8

    def hardware(self):
        return super().hardware().with_overrides(gpus_per_node=self.gpus_per_node)


def _kempner_name(exp: int, gpus: int, size: str, tp: int, b: int, accum: int, compiled: bool) -> str:
    dp = gpus // tp
    parts = ([f"TP {tp}"] if tp > 1 else []) + ([f"FSDP {dp}"] if dp > 1 else [])
    layout = " x ".join(parts) if parts else "one GPU"
    return (f"KempnerForge {size} (exp {exp:02d}), {gpus} H200, {layout}{' + compile' if compiled else ', eager'}, "
            f"b{b} x {accum}, full")


def _kempner_run(name: str, source: str, gpus: int, size: str, tp: int, b: int, accum: int, compiled: bool,
                 tok: float) -> PublishedRun:
    """One KempnerForge run (module docstring): FSDP2 = ZeRO 3 over dp_shard (ZeRO 0 without it), TP with SP,
    torch.compile = FUSED, PyTorch stack, full AC, fp32 reduction where DP > 1, bf16 AdamW states, 4 GPUs a node,
    and its TP plan's one all-gather per column-parallel projection (TpPlan.PROJECTION, round 17), each DTensor
    SP collective with its torch.cat on the batch-first activations (Workload.sp_copies, round 18), and its TP head's
    gathered logits with the loss over the whole vocabulary on every TP rank (Workload.gathered_logits, round 20).
    Its memory (round 24, published24d_kempner_memory): FSDP2's unsharded fp32 gradients under `maybe_no_sync`
    (unsharded_grad_accumulation), AdamW's two bf16 moments on the bf16 model (adam_master_copy=False), the loss on
    the bf16 logits (bf16_cross_entropy) and the gathered logits' bytes on every TP rank."""
    dp = gpus // tp
    work = Workload(llama_model(*KEMPNER_MODELS[size], KEMPNER_SEQ), global_batch=b * accum * dp,
                    seq_length=KEMPNER_SEQ, activations=ActivationProfile.BF16_FLASH,
                    kernels=KernelProfile.FUSED if compiled else KernelProfile.EAGER, stack=Stack.PYTORCH,
                    fp32_grads=dp > 1, optimizer_dtype_bytes=2, tp_plan=TpPlan.PROJECTION,
                    sp_copies=True, gathered_logits=tp > 1, bf16_cross_entropy=True,
                    unsharded_grad_accumulation=True, adam_master_copy=False)
    space = SearchSpace(tp=(tp,), pp=(1,), v=(1,), micro_batch=(b,),
                        zero=(ZeroStage.PARAMETERS if dp > 1 else ZeroStage.NONE,), offload=(Offload.NONE,),
                        recompute=(Recompute.FULL,), sequence_parallel=(tp > 1,))
    return NodeRun(name, source, work, "h200", gpus, space, Metric.TOKENS_PER_GPU, tok / gpus,
                   gpus_per_node=KEMPNER_GPUS_PER_NODE)


def kempner_runs() -> list[PublishedRun]:
    """KempnerForge's 14 H200 runs of the 1-32 GPU sweep (2026-04)."""
    return [_kempner_run(_kempner_name(exp, gpus, size, tp, b, accum, compiled), f"{KEMPNER_SOURCE}, exp {exp:02d}",
                         gpus, size, tp, b, accum, compiled, tok)
            for exp, gpus, size, tp, b, accum, compiled, tok, _mem, _step in KEMPNER_ROWS]


def kempner_weak_runs() -> list[PublishedRun]:
    """KempnerForge's weak-scaling runs (2026-06): TP 4 x FSDP on 8-160 H200, the 1-32 GPU sweep's settings (the
    code at 3ad9d9a not re-read: the driver's flags are the same ones), but the 70B at 8 GPUs, planned as its log
    ran it (b1 x 8, eager: KEMPNER_WEAK_AS_LOGGED)."""
    runs = []
    for size, gpus, tok, _mem, _step in KEMPNER_WEAK_ROWS:
        b, accum, compiled = kempner_weak_setting(size, gpus)
        name = (f"KempnerForge {size} weak scaling, {gpus} H200, TP 4 x FSDP {gpus // 4}"
                f"{' + compile' if compiled else ', eager'}, b{b} x {accum}, full")
        logged = KEMPNER_WEAK_AS_LOGGED.get((size, gpus))
        source = KEMPNER_WEAK_SOURCE + (f"; settings as its log ran them, {logged[3]}" if logged else "")
        runs.append(_kempner_run(name, source, gpus, size, 4, b, accum, compiled, tok))
    return runs


def kempner_validation_runs() -> list[PublishedRun]:
    """KempnerForge's config-validation runs of the 7B configs (2026-04-06): FSDP 4 and FSDP 32, TP 4 x FSDP 3."""
    runs = []
    for config, gpus, tp, b, accum, tok, _mem, _step in KEMPNER_VALIDATION_ROWS:
        dp = gpus // tp
        layout = (f"TP {tp} x FSDP {dp}" if tp > 1 else f"FSDP {dp}")
        name = f"KempnerForge 7B {config}, {gpus} H200, {layout} + compile, b{b} x {accum}, full"
        runs.append(_kempner_run(name, f"{KEMPNER_VALIDATION_SOURCE}, {config}", gpus, "7B", tp, b, accum, True, tok))
    return runs


def runs15() -> list[PublishedRun]:
    """Every round-15 check row."""
    return kempner_runs() + kempner_weak_runs() + kempner_validation_runs()


# ---- the PyTorch-native family ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Family:
    """A table of the PyTorch-native family: `runs()` yields its rows (all PyTorch-stack, ZeRO 3 / FSDP)."""

    name: str
    runs: object


def _native(runs: list[PublishedRun]) -> list[PublishedRun]:
    return [r for r in runs if r.workload.stack is Stack.PYTORCH
            or (r.workload.stack is None and r.workload.kernels is KernelProfile.EAGER)]


def _titan(runs: list[PublishedRun]) -> list[PublishedRun]:
    return [r for r in runs if r.name.startswith("torchtitan")]


def _round14() -> list[PublishedRun]:
    from hybrid.planner.published14 import runs14
    return runs14()


FAMILIES = (Family("torchtitan, published.py (A100 2024, H100 Dec 2024)", lambda: _titan(all_runs())),
            Family("torchtitan, published_more.py (Float8 8B, CP rows)", lambda: _titan(more_runs())),
            Family("torchtitan, published14.py (H200, 2025-06 TP / async TP)", lambda: _titan(_round14())),
            Family("MosaicML MPT (Composer, FSDP1), published.py", lambda: [r for r in all_runs()
                                                                           if r.name.startswith("MPT")]),
            Family("MosaicML MPT (Composer, FSDP1), published_more.py", lambda: [r for r in more_runs()
                                                                                if r.name.startswith("MPT")]),
            Family("OLMo-core / fms-fsdp / float8 blog (held-out H100)",
                   lambda: [r for r in _native(all_runs()) if r.name.split()[0] in ("OLMo-core", "fms-fsdp",
                                                                                   "float8")]),
            Family("KempnerForge H200 (round 15, new)", runs15))


def family_results() -> list[tuple[Family, list[Result]]]:
    return [(f, [evaluate(r) for r in f.runs()]) for f in FAMILIES]


def family_report(by_family: list[tuple[Family, list[Result]]]) -> str:
    lines = [summary_line(f.name, results) for f, results in by_family]
    checks = [r for _, results in by_family for r in results if r.run.role is Role.CHECK]
    fits = [r for _, results in by_family for r in results if r.run.role is Role.FIT]
    lines.append(summary_line("PyTorch-native check rows, all tables", checks))
    lines.append(summary_line("PyTorch-native fit rows (MPT single-node, torchtitan Table 1)", fits))
    return "\n".join(lines)


# ---- the candidate mechanisms, priced -----------------------------------------------------------------------------

def fsdp2_copy_bytes(run: PublishedRun, plan) -> tuple[float, float]:
    """(copy-out, reduce-scatter copy-in) bytes one rank moves through HBM on its compute stream in one step, from
    torch's FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, torch 2.13):
    `foreach_all_gather_copy_out` waits for the all-gather on the current stream, then `split_with_sizes_copy`
    reads the gathered buffer and writes each parameter's unsharded tensor (2 x 2 bytes a bf16 parameter), at each
    unshard -- the forward's and, resharded after forward, the backward's again; `foreach_reduce` runs
    `foreach_reduce_scatter_copy_in` (chunk_cat: read the bf16 gradient, write the reduce-dtype input) on the
    current stream before it switches to the reduce-scatter stream. psi is the rank's parameters before sharding
    (the model over TP). How often: two unshards and one reduce-scatter a micro-batch (FSDP2's defaults); one
    unshard and one reduce-scatter a step under a pipeline (torchtitan keeps the stage's parameters unsharded
    across micro-batches, reshard_after_forward off); one reduce-scatter a step where the trainer skips the others
    (KempnerForge's `maybe_no_sync`). The reduce dtype: fp32 where the workload says so and for torchtitan, whose
    `mixed_precision_reduce` defaults to "float32" (its job config; the planner's torchtitan rows reduce bf16).
    FSDP1 (MosaicML, fms-fsdp) gathers into its flat parameter in place: none of this."""
    lay = plan.layout
    if lay.zero is not ZeroStage.PARAMETERS or lay.dp == 1:
        return 0.0, 0.0
    psi = run.workload.model.num_parameters / (lay.tp * lay.pp)
    micro = run.workload.global_batch // (lay.dp * lay.micro_batch)
    unshards = 1 if lay.pp > 1 else 2 * micro
    reductions = 1 if lay.pp > 1 or run.name.startswith("KempnerForge") else micro
    reduce_bytes = 4 if run.workload.fp32_grads or run.name.startswith("torchtitan") else 2
    return unshards * (2 * 2) * psi, reductions * (2 + reduce_bytes) * psi


@dataclass(frozen=True)
class Mechanisms:
    """One row's numbers: its error today, the step's shares, and each what-if's error."""

    result: Result
    shares: dict
    copy_out_s: float
    copy_in_s: float
    with_copies: float
    h200_clock: float | None
    logits_s: float = 0.0
    tp_rate: float | None = None
    fp32_reduce: float | None = None


def price(result: Result) -> Mechanisms:
    """The row's planned step taken apart, and the FSDP2 copies added to it on the compute stream (exposed, at the
    preset's streaming rate); for an H200 row also the H100's PyTorch stack clock on the h200 preset."""
    from hybrid.planner.fit import solve
    from hybrid.planner.hardware import H100_EAGER_CLOCK
    run, plan = result.run, result.plan
    time = plan.time
    shares = {k: v / time.total for k, v in dict(time.terms).items()}
    hw = run.hardware()
    out_b, in_b = fsdp2_copy_bytes(run, plan)
    rate = hw.streaming_bytes_per_s
    out_s, in_s = out_b / rate, in_b / rate
    with_copies = (1 + result.error) * time.total / (time.total + out_s + in_s) - 1
    clock = None
    if hw.name == "h200":
        clock = run.throughput_error(_plan_on(run, hw.with_overrides(eager_clock=H100_EAGER_CLOCK)))
    logits_s, rate = 0.0, None
    if run.name.startswith("KempnerForge") and plan.layout.tp > 1:
        logits_s = replicated_logits_seconds(run, plan)
        rate = solve(lambda x: run.throughput_error(_plan_on(run, hw.with_overrides(intra_node_gbps=x))), 0.0, 5.0,
                     2000.0, iters=14)
    fp32_reduce = None
    if run.name.startswith("torchtitan") and not run.workload.fp32_grads:
        fp32_reduce = evaluate(replace(run, workload=replace(run.workload, fp32_grads=True))).error
    return Mechanisms(result, shares, out_s, in_s, with_copies, clock, logits_s, rate, fp32_reduce)


def replicated_logits_seconds(run: PublishedRun, plan) -> float:
    """KempnerForge's TP output head, `ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())`
    (tensor_parallel.py): each micro-batch all-gathers the b s V bf16 logits over the TP group in the forward and
    reduce-scatters their gradient in the backward, (t - 1) / t of them a rank at the NVLink rate, and every rank's
    loss then reads and writes the whole vocabulary where the planner's vocab-parallel loss touches V / t: the
    gathered logits written, read by the loss forward and backward, their gradient written (4 passes x 2 bytes),
    (t - 1) / t of it extra, at the streaming rate. Seconds a step beyond the plan."""
    lay, work, hw = plan.layout, run.workload, run.hardware()
    micro = work.global_batch // (lay.dp * lay.micro_batch)
    logits = lay.micro_batch * work.seq_length * work.model.vocab_size * 2
    extra = (lay.tp - 1) / lay.tp * logits
    return micro * (2 * extra / (hw.intra_node_gbps * 1e9) + 4 * extra / hw.streaming_bytes_per_s)


def _fsdp2(run: PublishedRun) -> bool:
    """FSDP2 (per-parameter `fully_shard`): torchtitan (2024 on), KempnerForge, OLMo-core, the float8 blog."""
    return run.name.split()[0] in ("torchtitan", "KempnerForge", "OLMo-core", "float8")


def mechanism_rows() -> list[Mechanisms]:
    """The PyTorch-native FSDP2 rows the repository holds (torchtitan's, round 14's, this round's; not the CP rows,
    whose step is the CP planner's), each priced."""
    runs = [r for f in FAMILIES for r in f.runs() if _fsdp2(r) and " CP " not in r.name]
    return [price(res) for res in (evaluate(r) for r in runs) if res.error is not None]


SHARE_TERMS = ("gemm", "attention", "memory_bound", "launches", "tp", "overlap", "dp_exposed")


def mechanism_table(rows: list[Mechanisms]) -> str:
    lines = ["| row | error | " + " | ".join(SHARE_TERMS) + " | FSDP2 copy-out ms | RS copy-in ms | error with the "
             "copies | H200 at the H100 stack clock | replicated logits ms | NVLink GB/s for 0 error | fp32 "
             "reduction |", "|---|---|" + "---|" * (len(SHARE_TERMS) + 7)]
    for m in rows:
        clock = "-" if m.h200_clock is None else f"{100 * m.h200_clock:+.1f} %"
        lines.append(f"| {m.result.run.name} | {100 * m.result.error:+.1f} % | "
                     + " | ".join(f"{100 * m.shares.get(k, 0.0):.1f}" for k in SHARE_TERMS)
                     + f" | {1e3 * m.copy_out_s:.0f} | {1e3 * m.copy_in_s:.0f} | {100 * m.with_copies:+.1f} % | "
                       f"{clock} | {1e3 * m.logits_s:.0f} | {'-' if m.tp_rate is None else f'{m.tp_rate:.0f}'} | "
                       f"{'-' if m.fp32_reduce is None else f'{100 * m.fp32_reduce:+.1f} %'} |")
    return "\n".join(lines)


def _line(what: str, errors: list[float]) -> str:
    if not errors:
        return f"{what}: no rows"
    return (f"{what}: {len(errors)} rows, signed mean {100 * statistics.fmean(errors):+.1f} %, median |error| "
            f"{100 * statistics.median(abs(e) for e in errors):.1f} %, spread {100 * min(errors):+.1f} % to "
            f"{100 * max(errors):+.1f} %, {sum(abs(e) <= 0.15 for e in errors)} within 15 %")


MECHANISM_GROUPS = (("torchtitan, FSDP only (no TP)", lambda r: r.name.startswith("torchtitan") and "TP" not in r.name),
                    ("torchtitan, FSDP x TP", lambda r: r.name.startswith("torchtitan") and "TP" in r.name),
                    ("KempnerForge H200, FSDP only or one GPU", lambda r: r.name.startswith("KempnerForge")
                     and "TP" not in r.name),
                    ("KempnerForge H200, with TP", lambda r: r.name.startswith("KempnerForge") and "TP" in r.name),
                    ("H200 rows (torchtitan + KempnerForge)", lambda r: r.hardware().name == "h200"))


def mechanism_summary(rows: list[Mechanisms]) -> str:
    out = []
    for name, keep in MECHANISM_GROUPS:
        sel = [m for m in rows if keep(m.result.run)]
        out.append(_line(f"{name}, today", [m.result.error for m in sel]))
        out.append(_line(f"{name}, with the FSDP2 copies", [m.with_copies for m in sel]))
        clocked = [m.h200_clock for m in sel if m.h200_clock is not None]
        if clocked:
            out.append(_line(f"{name}, H200 at the H100 stack clock", clocked))
        reduced = [m.fp32_reduce for m in sel if m.fp32_reduce is not None]
        if reduced:
            out.append(_line(f"{name}, torchtitan's fp32 reduction", reduced))
    return "\n".join(out)


def tp_missing(results: list[Result]) -> str:
    """The KempnerForge TP rows' missing time: published step - planned step, a step and per layer and micro-batch,
    and as a share of the planned step. A per-op cost (DTensor dispatch, a kernel launch) is the same at TP 2 and 4
    for the same model and micro-batch; a collective's bytes a rank grow with t; a compute slowdown shrinks with the
    rank's compute. Arithmetic on the plans: nothing reaches one."""
    lines = ["| row | t | h | planned step s | published step s | missing ms a layer and micro-batch | missing / "
             "planned |", "|---|---|---|---|---|---|---|"]
    for r in results:
        if not r.run.name.startswith("KempnerForge") or r.plan.layout.tp == 1:
            continue
        lay, w = r.plan.layout, r.run.workload
        published = w.global_batch * w.seq_length / (r.run.published * r.run.gpus)
        planned = published / (1 + r.error)  # the error is predicted / published tokens/s - 1
        micro = w.global_batch // (lay.dp * lay.micro_batch)
        missing = published - planned
        lines.append(f"| {r.run.name} | {lay.tp} | {w.model.hidden_size} | {planned:.2f} | {published:.2f} | "
                     f"{1e3 * missing / (micro * w.model.num_layers):.1f} | {100 * missing / planned:.0f} % |")
    return "\n".join(lines)


def evaluate_all() -> list[Result]:
    return [evaluate(r) for r in runs15()]


def report(results: list[Result]) -> str:
    out = [table(results), ""]
    for name, keep in MECHANISM_GROUPS[2:4]:
        out.append(summary_line(name, [r for r in results if keep(r.run)]))
    out.append(summary_line("all round-15 check rows", results))
    return "\n".join(out)


def main() -> None:
    if sys.argv[1:] == ["--family"]:
        print(family_report(family_results()))
        return
    if sys.argv[1:] == ["--tp-missing"]:
        print(tp_missing(evaluate_all()))
        return
    if sys.argv[1:] == ["--mechanisms"]:
        rows = mechanism_rows()
        print(mechanism_table(rows) + "\n\n" + mechanism_summary(rows))
        return
    print(report(evaluate_all()))


if __name__ == "__main__":
    main()
