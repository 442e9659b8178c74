"""`hybrid plan`: rank the layouts of a model on a cluster.

    hybrid plan --model llama-3-70b --gpus 256 --gpu h100-80g --global-batch-size 1024 --seq-length 4096
    hybrid plan --num-layers 96 --hidden-size 12288 --num-attention-heads 96 --vocab-size 51200 \\
                --gpus 1024 --global-batch-size 1536 --seq-length 2048 --top 10
    hybrid plan --model gpt2-xl --gpus 8 --global-batch-size 64 --emit-args     # flags for scripts/train.py
    hybrid plan --model llama-3-8b --global-batch-size 512 --scan-gpus 8,64,512  # best layout per GPU count
    hybrid plan --model llama-3-70b --gpus 64 --gpu h100-80g --global-batch-size 512 --seq-length 4096 \\
                --plot mem.png                                     # memory breakdown of the top layouts
    hybrid plan --model llama-3-8b --gpus 64 --gpu h100-80g --global-batch-size 16 --seq-length 131072 \\
                --activation-profile bf16-flash --context-parallel-size 1,2,4,8   # CP and its comm type too
                                           # (with --scan-gpus 16,64 instead of --gpus: the best CP layout per count)
    hybrid calibrate --ranks 4 --out cpu.json                     # measure this machine, then
    hybrid plan --hardware cpu.json --activation-profile fp32-flash ...  # fp32: a CPU profile's default

Any search dimension is pinned with the flag train.py takes (--tensor-model-parallel-size,
--pipeline-model-parallel-size, --micro-batch-size, --zero-stage, --num-layers-per-virtual-pipeline-stage,
--sequence-parallel / --no-sequence-parallel, --recompute-granularity, --offload-optimizer, --offload-params,
--context-parallel-size, --cp-comm-type, and for an MoE model --expert-model-parallel-size).
Required: --global-batch-size; --gpus (or --scan-gpus); --model or all of --num-layers, --hidden-size and
--num-attention-heads.
"""

# Module layout: `hybrid/cli.py` calls `add_parser(subparsers)` -- which registers `plan` and `calibrate`
# (calibrate.py) -- and then `args.func(args)`; `main(argv)` runs `plan` alone. --help shows USAGE.

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import asdict

from hybrid.cliutil import (HelpFormatter, OneLineParser, atomic_output, check_not_link, check_number,
                            check_output_file, check_replaces_an_image, divisors, float_in, int_in, nearest_multiples,
                            nonnegative_int, one_of, parallel_hints, positive_float, positive_int, warn_repeated)
from hybrid.cp.comm_type import CommType
from hybrid.planner import context, moe, profile, slowlink
from hybrid.planner.hardware import GB, GpuKind, hardware
from hybrid.planner.layout import (Cluster, Offload, PipelineP2P, PipelineSplit, Recompute, TpPlan, Workload,
                                   Zero3Runtime, ZeroStage, pp_problems, tp_problems)
from hybrid.planner.model import ActivationProfile, Precision
from hybrid.planner.predicted_memory import demand_text
from hybrid.planner.ops import Fp8Scaling, KernelProfile, Stack
from hybrid.planner.schedule import SIM_BUDGET
from hybrid.planner.search import (MAX_MICRO_BATCH, MAX_V, Plan, Rejection, SearchResult, SearchSpace, evaluate,
                                   search, summarize_rejections)
from hybrid.planner.time import TERMS, FlopsFormula, hsdp_traffic, recompute_stops_early, step_flops
from hybrid.planner.train_flags import MAX_GLOBAL_BATCH, plan_flags
from models.config import ARCH_GPT2, ARCH_LLAMA, ModelConfig, load_config


MAX_GPUS = 2**20  # a million devices: beyond any cluster, and the search stays seconds long
DEFAULT_GPU = GpuKind.A100_80G.value  # --gpu without --hardware
TOP = 5  # --top's default; None when not given, so --scan-gpus (the best layout per count) can refuse an explicit one
# the slow-link table's method flags and their values when not given (None on the parser: given or not is known)
SLOW_LINK_DEFAULTS = {"powersgd_rank": 4, "diloco_inner_steps": 100, "diloco_fragments": 4,
                      "diloco_fragment_sync_delay": 0}


# round 16's new-user pass: train.py's and other tools' flags for what plan names otherwise ("see --help", or
# --num-gpus -> "did you mean --scan-gpus?")
_MIXED = ("plan prices bf16 and fp16 alike: --precision mixed, the default on GPUs (2-byte parameters, fp32 "
          "gradients as train.py's --bf16 runs them -- --grad-reduce-in-bf16 for bf16 ones --, fp32 master)")
PLAN_HINTS = {**parallel_hints("--gpus"),
              **{flag: f"{flag}: {_MIXED}" for flag in ("--bf16", "--fp16")},
              **{flag: f"{flag}: give --gpus N (all GPUs of the job; --gpus-per-node N for a node's)"
                 for flag in ("--num-gpus", "--world", "--world-size")},
              # round 23: train.py's flags that plan searches or does not price ("did you mean
              # --expert-model-parallel-size?" for expert-TP, "see --help" for the schedule)
              "--expert-tensor-parallel-size": "--expert-tensor-parallel-size: plan searches expert-TP with EP and "
                                               "has no flag to pin it (train.py --auto-parallel "
                                               "--expert-tensor-parallel-size N plans around one)",
              "--pipeline-schedule": "--pipeline-schedule: plan searches the schedule (1f1b, interleaved, zbh1, zbv) "
                                     "with the layout; the table's layout cell names it and --emit-args gives the "
                                     "flag; drop it",
              "--moe-token-dispatcher-type": "--moe-token-dispatcher-type: plan prices the alltoall dispatcher "
                                             "(train.py's default); drop the flag"}


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `plan` and `calibrate` on the `hybrid` command's subparsers; returns plan's parser."""
    p = subparsers.add_parser("plan", help="rank TP x PP x DP layouts by predicted throughput",
                              description=__doc__, formatter_class=HelpFormatter, hints=PLAN_HINTS)
    add_arguments(p)
    p.set_defaults(func=run)
    profile.add_parser(subparsers)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (a preset / config.json directory, or the sizes)")
    g.add_argument("--model", help="preset name (hybrid models) or a directory holding config.json")
    g.add_argument("--num-layers", type=positive_int, metavar="N", help="Transformer blocks")
    g.add_argument("--hidden-size", type=positive_int, metavar="N", help="model width")
    g.add_argument("--num-attention-heads", type=positive_int, metavar="N", help="query heads")
    g.add_argument("--num-query-groups", type=positive_int, metavar="N",
                   help="key/value heads (None: the attention heads)")
    g.add_argument("--ffn-hidden-size", type=positive_int, metavar="N", help="MLP width (None: 4 x hidden)")
    g.add_argument("--vocab-size", type=positive_int, metavar="N", default=50257, help="vocabulary")
    g.add_argument("--swiglu", action="store_true", help="Llama-style block: SwiGLU MLP, RMSNorm, RoPE, no biases")
    g.add_argument("--untie-embeddings-and-output-weights", action="store_true", help="separate LM head")
    g.add_argument("--make-vocab-size-divisible-by", type=positive_int, metavar="N", default=1,
                   help="pad the vocabulary to a multiple of this x tp (default 1: of tp)")
    g = p.add_argument_group("cluster")
    g.add_argument("--gpus", type=int_in(1, MAX_GPUS), metavar="N",
                   help="GPUs in the job (required, unless --scan-gpus)")
    g.add_argument("--gpus-per-node", type=positive_int, metavar="N", help="None: the preset's")
    g.add_argument("--gpu", default=None, choices=[k.value for k in GpuKind],
                   help="device preset: a100-80g, h100-80g (SXM, 700 W), h100-96g-500w (torchtitan's Grand Teton "
                        "H100: HBM2e, 500 W), h200, cpu (docs/planner.md 'Hardware'); None: a100-80g, or the "
                        "--hardware profile's device")
    g.add_argument("--gpu-memory", type=positive_float, metavar="GB", help="GB per device (None: the preset's)")
    g.add_argument("--gpu-tflops", type=positive_float, metavar="X",
                   help="dense bf16 peak, TFLOP/s (None: the preset's)")
    g.add_argument("--intra-node-bandwidth", type=positive_float, metavar="GBPS",
                   help="NVLink bus bandwidth, GB/s (nccl-tests busbw)")
    g.add_argument("--inter-node-bandwidth", type=positive_float, metavar="GBPS",
                   help="network bandwidth per GPU, GB/s per direction")
    g.add_argument("--compute-efficiency", type=float_in(0.0, 1.0, low_open=True), metavar="X",
                   help="fraction of peak a large matmul sustains, in (0, 1] (None: the preset's GEMM curve: "
                        "a100 0.768, h100 0.789, h200 0.796)")
    g.add_argument("--gemm-overhead", type=float_in(0.0, 1.0), metavar="S",
                   help="fixed seconds of one matmul kernel, the GEMM curve's t0 (None: the preset's, 6.4e-6)")
    g.add_argument("--allow-cross-node-tp", action="store_true", help="let a TP group span nodes")
    g.add_argument("--hardware", metavar="FILE", help="a profile written by `hybrid calibrate` (replaces --gpu)")
    g = p.add_argument_group("training")
    g.add_argument("--global-batch-size", type=int_in(1, MAX_GLOBAL_BATCH), metavar="N", required=True,
                   help="sequences per optimizer step (required)")
    g.add_argument("--seq-length", type=positive_int, metavar="N", help="None: min(2048, the model's positions)")
    g.add_argument("--precision", default=None, choices=[Precision.MIXED.value, Precision.FP32.value],
                   help="mixed: bf16 params, fp32 grads (bf16: --grad-reduce-in-bf16), fp32 master and Adam "
                        "(2+4+12 bytes; 2+2+12); fp32: 4+4+8 (this "
                        "runtime on CPU); None: fp32 on a CPU (a --hardware profile calibrated over gloo, --gpu "
                        "cpu), mixed on GPUs")
    g.add_argument("--grad-reduce-in-bf16", action="store_true",
                   help="--precision mixed: bf16 gradients, accumulated and reduced over DP in bf16 (2+2+12 bytes), "
                        "train.py's and Megatron's opt-out of the same name, which --emit-args then gives; "
                        "without it a mixed plan counts fp32 gradients (2+4+12 bytes, twice the DP gradient "
                        "traffic), as train.py's --bf16 runs by default")
    g.add_argument("--accumulate-allreduce-grads-in-fp32", action="store_true",
                   help="--precision mixed: fp32 gradients, the default (train.py's flag, accepted as it accepts "
                        "it with --bf16)")
    g.add_argument("--activation-profile", default=ActivationProfile.KORTHIKANTI.value,
                   choices=[x.value for x in ActivationProfile],
                   help="korthikanti: Megatron on GPU (bf16, dropout, materialised softmax); bf16-flash: the "
                        "same with flash attention (no s x s tensors); fp32-flash: this runtime on CPU (fp32, "
                        "flash attention, no dropout)")
    g.add_argument("--kernels", choices=[k.value for k in KernelProfile], default=None,
                   help="how the non-matmul ops run: fused (Megatron-LM / Transformer Engine) or eager (plain "
                        "PyTorch: this runtime, torchtitan without compile); None: fused for korthikanti, eager for "
                        "the flash profiles; torch.compile counts as fused. Which ops are fused only: --stack sets "
                        "the tensor-core clock")
    g.add_argument("--stack", choices=["auto"] + [x.value for x in Stack], default="auto",
                   help="the software stack, which sets the tensor-core clock: pytorch (PyTorch-native, eager or "
                        "torch.compile'd: torchtitan, Composer, OLMo-core, FSDP; h100-80g's eager clock 0.708) or "
                        "megatron (Megatron-LM / NeMo / Transformer Engine: the curve's rate); auto (default): "
                        "pytorch for eager kernels, megatron for --activation-profile korthikanti, else pytorch "
                        "for ZeRO 3 (FSDP) layouts and megatron for ZeRO 0-2")
    g.add_argument("--zero3-runtime", choices=[r.value for r in Zero3Runtime], default=None,
                   help="price a ZeRO 3 runtime's copies on the compute stream (round 16's what-if, not priced by "
                        "default): hybrid (this runtime: each gradient copied into its unit's buffer), fsdp2 "
                        "(torch's fully_shard: copy-out at each unshard, copy-in before each reduce-scatter), fsdp1 / "
                        "megatron-fsdp (in place: none); the planner only (--emit-args takes none or hybrid)")
    g.add_argument("--tp-plan", choices=[p.value for p in TpPlan], default=TpPlan.BLOCK.value,
                   help="how the runtime feeds TP's column-parallel projections: block (default: one all-gather of "
                        "each block's input under SP, as Megatron, torchtitan and this runtime) or projection (one "
                        "per q, k, v, gate and up projection, as DTensor's ColwiseParallel(input_layouts=Shard(1)) "
                        "on each, KempnerForge); the planner only (--emit-args takes block)")
    g.add_argument("--fused-cross-entropy", action="store_true",
                   help="bf16-flash: the loss is one fused kernel over the bf16 logits (flash-attn's "
                        "CrossEntropyLoss, llm-foundry's default): 2 + 2 bytes a logit kept and in its backward, "
                        "not torch's fp32-upcast 6 + 8 (memory only; the planner only)")
    g.add_argument("--fp8", action="store_true",
                   help="the linear layers' GEMMs in FP8 (Transformer Engine / torchao float8): the FP8 peak, "
                        "1-byte saved inputs, casts and scales (h100 / h200; the planner only)")
    g.add_argument("--fp8-scaling", choices=[x.value for x in Fp8Scaling], default=None,
                   help="with --fp8: current (default; torchao float8, TE current scaling: an amax pass before "
                        "each cast) or delayed (TE's DelayedScaling, Composer's amp_fp8: the cast records the amax)")
    g.add_argument("--pipeline-p2p", choices=[x.value for x in PipelineP2P], default=PipelineP2P.OVERLAPPED.value,
                   help="overlapped (this runtime, Megatron-core) or blocking pipeline messages (DeepSpeed's "
                        "pipeline engine; blocking-scatter: Megatron-LM 2021-22 with its scatter-gather)")
    g.add_argument("--account-for-embedding-in-pipeline-split", action="store_true",
                   help="Megatron-core's split: the embedding counts as a layer (the first stage holds one layer "
                        "fewer, none when a stage is one layer); planned only, train.py refuses it")
    g.add_argument("--account-for-loss-in-pipeline-split", action="store_true",
                   help="Megatron-core's split: the LM head and loss count as a layer on the last stage; planned "
                        "only, train.py refuses it")
    g.add_argument("--decoder-first-pipeline-num-layers", type=nonnegative_int, metavar="N", default=None,
                   help="Megatron-core's split: layers of the first pipeline rank (the middle ranks split the rest "
                        "evenly); planned only, train.py refuses it")
    g.add_argument("--decoder-last-pipeline-num-layers", type=nonnegative_int, metavar="N", default=None,
                   help="Megatron-core's split: layers of the last pipeline rank; planned only, train.py refuses it")
    g.add_argument("--gradient-accumulation-fusion", action=argparse.BooleanOptionalAction, default=None,
                   help="the weight-gradient GEMM adds into the accumulated gradient (Megatron / Transformer "
                        "Engine); --no-...: a memory pass per micro-batch adds it (eager PyTorch, DeepSpeed's "
                        "pipeline engine); default: on for fused kernels, off for eager")
    g.add_argument("--overlap-param-gather", action=argparse.BooleanOptionalAction, default=True,
                   help="ZeRO 1-2: the post-step parameter all-gather runs under the next forward (this runtime's "
                        "default, train.py's flag); --no-...: exposed after the optimizer step (DeepSpeed's ZeRO 1)")
    g = p.add_argument_group("pin a search dimension (scripts/train.py flags)")
    g.add_argument("--tensor-model-parallel-size", type=positive_int, metavar="N", help="pin tp")
    g.add_argument("--pipeline-model-parallel-size", type=positive_int, metavar="N", help="pin pp")
    g.add_argument("--num-layers-per-virtual-pipeline-stage", type=positive_int, metavar="N",
                   help="pin the layers per model chunk")
    g.add_argument("--virtual-pipeline-model-parallel-size", type=positive_int, metavar="N",
                   help="pin the chunks per pipeline rank (v)")
    g.add_argument("--micro-batch-size", type=positive_int, metavar="N", help="pin the micro-batch")
    g.add_argument("--zero-stage", type=int, choices=[int(z) for z in ZeroStage], help="pin the ZeRO stage")
    g.add_argument("--data-parallel-replicate-degree", type=positive_int, metavar="N", default=None,
                   help="pin HSDP's replicas (torchtitan's --parallelism.data_parallel_replicate_degree; FSDP1's "
                        "HYBRID_SHARD: the nodes): ZeRO 3 sharded over dp / N ranks, the reduced gradient shards "
                        "all-reduced over the N replicas; 1: ZeRO 3 over all dp; needs ZeRO 3 (implied). None: 1, "
                        "and a node-sized shard group tried where the ZeRO stage is searched; the planner only "
                        "(train.py shards over all dp: --emit-args skips HSDP plans)")
    g.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None, help="pin SP")
    g.add_argument("--recompute-granularity", choices=[r.value for r in Recompute], help="pin recomputation")
    g.add_argument("--context-parallel-size", metavar="N[,N...]",
                   help="context-parallel sizes to search with the rest, with the comm type (one pins it; "
                        "hybrid/planner/context.py; --explain adds the ring's terms, --emit-args the CP flags); "
                        "None: no CP")
    g.add_argument("--cp-comm-type", choices=[c.value for c in CommType],
                   help="pin CP's comm type (None: search p2p, a2a and allgather)")
    g.add_argument("--offload-optimizer", action=argparse.BooleanOptionalAction, default=None,
                   help="pin optimizer offload")
    g.add_argument("--offload-params", action=argparse.BooleanOptionalAction, default=None,
                   help="pin parameter offload")
    g.add_argument("--expert-model-parallel-size", type=positive_int, metavar="N",
                   help="an MoE model: pin EP (None: every size dividing the stage's tp x cp x dp ranks and the "
                        "experts)")
    g.add_argument("--moe-imbalance", type=float_in(1.0), metavar="X", default=moe.IMBALANCE,
                   help="an MoE model: max / mean tokens per expert, the busiest EP rank's pace (train.py's log "
                        "line prints the run's as 'imbalance'); the default is a planning margin")
    g.add_argument("--max-micro-batch-size", type=positive_int, metavar="N", default=MAX_MICRO_BATCH,
                   help="largest micro-batch tried")
    g.add_argument("--max-virtual-stages", type=int_in(1, 1024), metavar="N", default=MAX_V,
                   help="most chunks per rank tried")
    g = p.add_argument_group("a slow link between sites (hybrid/planner/slowlink.py): each method's step time")
    g.add_argument("--inter-dc-bandwidth", type=float_in(0.0, low_open=True), metavar="GBPS",
                   help="GB/s per direction between two sites the DP replicas are split over (1 Gbit/s = 0.125): "
                        "prints synchronous, PowerSGD, 1-bit Adam, DiLoCo and Streaming DiLoCo for the best layout; "
                        "None: the --hardware profile's inter_dc_gbps, else no such table")
    g.add_argument("--inter-dc-latency", type=float_in(0.0), metavar="MS",
                   help="one-way latency of that link, milliseconds (None: the profile's, else 0)")
    g.add_argument("--powersgd-rank", type=positive_int, default=None, metavar="R",
                   help=f"the table's PowerSGD rank (None: {SLOW_LINK_DEFAULTS['powersgd_rank']})")
    g.add_argument("--diloco-inner-steps", type=positive_int, default=None, metavar="H",
                   help=f"the table's DiLoCo H (None: {SLOW_LINK_DEFAULTS['diloco_inner_steps']})")
    g.add_argument("--diloco-fragments", type=positive_int, default=None, metavar="K",
                   help=f"the table's Streaming DiLoCo fragments (K divides H; None: "
                        f"{SLOW_LINK_DEFAULTS['diloco_fragments']})")
    g.add_argument("--diloco-fragment-sync-delay", type=int, default=None, metavar="TAU",
                   help="the table's Streaming DiLoCo overlap: each fragment's sync runs under TAU inner steps (0 <= "
                        "TAU < H/K; 0: it blocks)")
    g = p.add_argument_group("output")
    g.add_argument("--top", type=positive_int, metavar="N", default=None,
                   help=f"layouts to show; None: {TOP} (with --scan-gpus: refused, one row per count)")
    g.add_argument("--json", action="store_true", help="machine-readable output (each plan's step terms included)")
    g.add_argument("--explain", action="store_true",
                   help="after the table, the best layout's step taken apart: compute, memory-bound ops, launches, "
                        "TP, PP p2p, bubble, DP exposed, optimizer -- each term's seconds and share")
    g.add_argument("--emit-args", action="store_true",
                   help="print the train.py flags of the best layout train.py accepts (needs --model)")
    g.add_argument("--scan-gpus", metavar="N,N,...", help="comma-separated GPU counts: the best layout of each")
    g.add_argument("--flops-formula", default=FlopsFormula.EXACT.value, choices=[f.value for f in FlopsFormula],
                   help="FLOP count for TFLOP/s: the model's shapes, or Narayanan et al. eq. (3)")
    g.add_argument("--sim-budget", type=positive_float, metavar="X", default=SIM_BUDGET,
                   help="largest pipeline schedule simulated, pp (m v)^2")
    g.add_argument("--show-rejected", type=nonnegative_int, metavar="N", default=6, help="rejection reasons to list")
    g.add_argument("--plot", metavar="FILE.png", help="stacked bars of the top layouts' memory (worst stage)")


def main(argv: list[str] | None = None) -> int:
    """`hybrid plan` on its own: 0 on success, 2 with a one-line explanation for an impossible request."""
    parser = OneLineParser(prog="hybrid plan", description=__doc__, formatter_class=HelpFormatter,
                           warn_repeated=False)  # printed once the plan is made: an error stays one line
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        run(args)
    except ValueError as e:
        print(f"hybrid plan: error: {e}", file=sys.stderr)
        return 2
    warn_repeated("hybrid plan", parser.repeated)
    return 0


def run(args: argparse.Namespace) -> None:
    """Search and print; ValueError (shown without a traceback by the caller) when nothing can run."""
    check_outputs(args)
    model = model_from_args(args)
    check_replicate_degree(args, model)
    work = workload_from_args(args, model)
    space = space_from_args(args)
    formula = FlopsFormula(args.flops_formula)
    _check_cp(args)
    _warn_older_profile(args.hardware)
    if args.scan_gpus:
        link_flags = [f"--{d.replace('_', '-')}" for d in ("inter_dc_bandwidth", "inter_dc_latency",
                                                           *SLOW_LINK_DEFAULTS) if getattr(args, d) is not None]
        if link_flags:
            raise ValueError(f"{link_flags[0]} (the slow-link table) does not run with --scan-gpus yet; drop one of "
                             f"them")
        _scan(args, work, space, formula)
        return
    if args.gpus is None:
        raise ValueError("--gpus is required (or --scan-gpus 8,64,512 for a scaling table)")
    cluster = cluster_from_args(args, args.gpus)
    link, methods = slow_link_from_args(args, cluster.hw)
    if work.fp8 and cluster.hw.fp8_tflops is None:
        raise ValueError(f"--fp8: {cluster.hw.name} has no FP8 tensor cores (plan bf16, or --gpu h100-80g / h200)")
    if args.context_parallel_size is not None:
        _plan_cp(args, work, cluster, space)
        return
    result = search(work, cluster, space, top=args.top or TOP, formula=formula, budget=args.sim_budget)
    if not result.plans:
        raise ValueError(_nothing_fits(work, cluster, result, args.show_rejected, space))
    emitted = accepted_train_args(work, result.plans, args) if args.emit_args else None
    baseline = _baseline(cluster.hw)  # one measure for the table and the plot: their MiB agree
    if args.plot:
        _write_plot(args.plot, result.plans, work, cluster, baseline)
    if args.json:
        print(json.dumps(_json(work, cluster, result, args.show_rejected), indent=2))
    elif args.emit_args:
        print(" ".join(emitted))
    else:
        print(_report(work, cluster, result, args.show_rejected, baseline))
        if args.explain:
            print(explain(work, cluster, result.plans[0], baseline))  # the table's RSS baseline on a CPU
        if link is not None:
            rows = slowlink.predict(work, cluster, [p.layout for p in result.plans], methods, link, evaluate)
            print(slowlink.table(rows, link))


def _warn_older_profile(path: str | None) -> None:
    """One warning line when a CPU profile predates costs `hybrid calibrate` measures now (priced 0 otherwise, with
    nothing said). Not an error: the repository keeps such profiles as records of their rounds' runs."""
    missing = profile.missing_cpu_costs(path) if path else []
    if missing:
        print(f"hybrid plan: warning: --hardware {path} was written by an older hybrid calibrate: it lacks "
              f"{', '.join(missing)}, priced 0 (the step comes out faster than this machine runs it); re-run "
              f"`hybrid calibrate --out {path}` for this hybrid's CPU costs", file=sys.stderr, flush=True)


def slow_link_from_args(args: argparse.Namespace, hw) -> tuple[slowlink.SlowLink | None, list]:
    """The inter-DC link (the flags over the --hardware profile's fields) and the table's methods; (None, [])
    without one. Checked before the search; what the table does not combine with is refused by name, and so is a
    method flag without a link: it sets a row of the slow-link table, which is printed only with one."""
    gbps = args.inter_dc_bandwidth if args.inter_dc_bandwidth is not None else hw.inter_dc_gbps
    if gbps is None:
        if args.inter_dc_latency is not None:
            raise ValueError("--inter-dc-latency needs --inter-dc-bandwidth (or a profile's inter_dc_gbps)")
        given = [dest for dest in SLOW_LINK_DEFAULTS if getattr(args, dest) is not None]
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')} sets a row of the slow-link table, printed with "
                             f"--inter-dc-bandwidth GBPS (or a --hardware profile's inter_dc_gbps); add it or drop "
                             f"--{given[0].replace('_', '-')} (the layout search prices synchronous DP)")
        return None, []
    for flag, on in (("--json", args.json), ("--emit-args", args.emit_args), ("--scan-gpus", args.scan_gpus),
                     ("--context-parallel-size", args.context_parallel_size)):
        if on:
            raise ValueError(f"--inter-dc-bandwidth does not run with {flag} yet; drop one of them")
    latency_ms = args.inter_dc_latency if args.inter_dc_latency is not None else (hw.inter_dc_latency_s or 0.0) * 1e3
    check_number("--inter-dc-latency", latency_ms, 0, note=" (milliseconds)")
    link = slowlink.SlowLink(gbps, latency_ms / 1e3)
    given = {dest: default if getattr(args, dest) is None else getattr(args, dest)
             for dest, default in SLOW_LINK_DEFAULTS.items()}
    check_streaming_row(args, given)
    return link, slowlink.methods_from(given["powersgd_rank"], given["diloco_inner_steps"],
                                       given["diloco_fragments"], given["diloco_fragment_sync_delay"])


def check_streaming_row(args: argparse.Namespace, given: dict) -> None:
    """The Streaming DiLoCo row's K must divide its H (MethodConfig's rule), each named as the user gave it or as
    the table's default: "--diloco-fragments 4 must divide --diloco-inner-steps 6" was said of a K nobody gave."""
    def said(dest: str) -> str:
        flag = f"--{dest.replace('_', '-')} {given[dest]}"
        return flag if getattr(args, dest) is not None else f"the default {flag} (not given)"
    h, k = given["diloco_inner_steps"], given["diloco_fragments"]
    if h % k:
        fits = ", ".join(str(d) for d in range(2, min(h, 8) + 1) if h % d == 0) or "1"
        raise ValueError(f"{said('diloco_fragments')} must divide {said('diloco_inner_steps')} (the Streaming "
                         f"DiLoCo row syncs 1/K of the model every H/K steps): give --diloco-fragments K dividing "
                         f"{h} (e.g. {fits})")


def _check_cp(args: argparse.Namespace) -> None:
    """--context-parallel-size / --cp-comm-type: the sizes parse, and no output the CP search does not make."""
    if args.cp_comm_type is not None and args.context_parallel_size is None:
        raise ValueError("--cp-comm-type needs --context-parallel-size (the CP sizes to search)")
    if args.context_parallel_size is None:
        return
    sizes = context.parse_sizes(args.context_parallel_size)
    odd = [c for c in sizes if args.gpus is not None and args.gpus % c]
    if odd:  # was "no layout fits at --context-parallel-size 3 (a size must divide --gpus ...)" after the search
        fits = ", ".join(str(d) for d in divisors(args.gpus)[1:7]) or "1"
        raise ValueError(f"--context-parallel-size {args.context_parallel_size}: {odd[0]} does not divide --gpus "
                         f"{args.gpus} (the GPUs split into CP groups of that size); give sizes that divide it, e.g. "
                         f"{fits}")
    _check_cp_pins(args, sizes)


def _check_cp_pins(args: argparse.Namespace, sizes: tuple[int, ...]) -> None:
    """Round 23: with tp / pp pinned, a CP size must also divide --gpus / (tp x pp); when none does, the search's
    "no layout fits at --context-parallel-size 2 (a size must divide --gpus ...)" blamed a size that divides --gpus
    (tp 8 x cp 2 on 8 GPUs). Likewise every size against the sequence's 2 CP load-balanced chunks."""
    tp, pp = args.tensor_model_parallel_size or 1, args.pipeline_model_parallel_size or 1
    if args.gpus is not None and all(args.gpus % (tp * pp * c) for c in sizes):
        free = args.gpus // (tp * pp) if args.gpus % (tp * pp) == 0 else 0
        fits = (f"give CP sizes dividing {free}" if free > 1 else "give a smaller --tensor-model-parallel-size or "
                f"--pipeline-model-parallel-size")
        raise ValueError(f"--context-parallel-size {args.context_parallel_size} with --tensor-model-parallel-size "
                         f"{tp} and --pipeline-model-parallel-size {pp}: tp x cp x pp divides --gpus {args.gpus} at "
                         f"none of the sizes; {fits}")
    seq = args.seq_length
    if seq is not None and all(seq % (2 * c) for c in sizes):  # train.py's rule (hybrid/cp/balance.py), torch-free
        step = 2 * sizes[0]
        raise ValueError(f"--seq-length {seq} is not divisible by 2 x --context-parallel-size {sizes[0]} = {step}"
                         + (" (nor at the other sizes)" if len(sizes) > 1 else "") + "; causal load balancing splits "
                         f"each sequence into {step} equal chunks: use a multiple of {step} "
                         f"({one_of(nearest_multiples(seq, step))})")


def _plan_cp(args: argparse.Namespace, work: Workload, cluster: Cluster, space: SearchSpace) -> None:
    """The CP search (hybrid/planner/context.py's search_cp) over the sizes and comm types asked for, printed as
    the plain search is: the table (+ --explain), --json, --emit-args, and --plot written beside them."""
    plans = context.search_cp(work, cluster, space, cps=context.parse_sizes(args.context_parallel_size),
                              comms=_cp_comms(args), top=args.top or TOP)
    if not plans:
        raise ValueError(f"no layout fits at --context-parallel-size {args.context_parallel_size} (a size must "
                         f"divide --gpus and half the --seq-length; a2a the kv-heads of a TP rank); try other sizes "
                         f"or more GPUs")
    emitted = accepted_train_args(work, plans, args) if args.emit_args else None
    baseline = _baseline(cluster.hw)  # one measure for the table, --explain and the plot: their MiB agree
    if args.plot:
        _write_plot(args.plot, plans, work, cluster, baseline)
    if args.json:
        print(json.dumps({"gpus": cluster.gpus, "gpu": cluster.hw.name, "global_batch": work.global_batch,
                          "seq_length": work.seq_length, "plans": [cp_plan_json(work, cluster, p) for p in plans]},
                         indent=2))
    elif args.emit_args:
        print(" ".join(emitted))
    else:
        print(context.report(work, cluster, plans, baseline))
        if args.explain:
            print(explain_cp(work, cluster, plans[0], baseline))


def _cp_comms(args: argparse.Namespace) -> tuple[CommType, ...]:
    """The CP comm types searched: the pinned --cp-comm-type, else all three."""
    return (CommType(args.cp_comm_type),) if args.cp_comm_type else tuple(CommType)


def _check_plot_format(path: str, formats: dict[str, str]) -> None:
    """savefig picks the format by the name's extension; the file is written under a temporary name (atomic_output)
    whose extension is the same, so a name without one (or with one matplotlib does not write) would fail after
    the search, naming the temporary's random suffix as the format."""
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext not in formats:
        got = f"extension .{ext}" if ext else "no extension"
        raise ValueError(f"--plot {path!r} has {got}: matplotlib picks the image format by it; give e.g. "
                         f"FILE.png (or .{', .'.join(sorted(f for f in formats if f in ('pdf', 'svg')))})")


def check_outputs(args: argparse.Namespace) -> None:
    """Before the search: --plot can be written and matplotlib is there; --emit-args has a model train.py can
    build; the output flags asked for are ones that print together."""
    for flag, value in (("--model", args.model), ("--hardware", args.hardware), ("--scan-gpus", args.scan_gpus),
                        ("--plot", args.plot)):  # `--hardware $HW` with HW unset: was planned on the a100 preset
        if value is not None and not value.strip():
            raise ValueError(f"{flag} is empty; give a value or omit the flag")  # train.py's words (check_files)
    _check_output_modes(args)
    if args.plot:
        check_not_link(f"--plot {args.plot!r}", args.plot)  # round 18: the rename replaced the link, after the search
        check_output_file("--plot", args.plot)
        try:
            import matplotlib  # noqa: F401  (first: the package itself missing is the ImportError named below)
            from matplotlib.backend_bases import FigureCanvasBase
        except ImportError:
            raise ValueError("--plot needs matplotlib, which is not installed: pip install matplotlib") from None
        _check_plot_format(args.plot, FigureCanvasBase.get_supported_filetypes())
        check_replaces_an_image(args.plot)
    if args.emit_args and args.gradient_accumulation_fusion:
        raise ValueError("--gradient-accumulation-fusion: train.py's eager runtime adds each micro-batch's gradients "
                         "in a pass of its own; drop the flag with --emit-args")
    if args.emit_args and args.fused_cross_entropy:
        raise ValueError("--fused-cross-entropy: train.py's loss upcasts the logits to fp32 (torch's cross-entropy); "
                         "drop the flag with --emit-args")
    if args.emit_args and not args.model:
        raise ValueError("--emit-args needs --model (a preset or config.json directory): train.py builds the model "
                         "from it, not from the size flags")
    if args.hardware and not os.path.isfile(args.hardware):
        preset = [k.value for k in GpuKind if args.hardware.lower() in (k.value, k.value.split("-")[0])]
        hint = f" (for the device preset: --gpu {preset[0]})" if preset else ""
        raise ValueError(f"--hardware {args.hardware!r} is not a file; write one with `hybrid calibrate --out FILE`"
                         f"{hint}")
    if args.hardware and args.gpu:  # the profile holds the device (hybrid calibrate --base names its preset)
        raise ValueError(f"--gpu {args.gpu} and --hardware {args.hardware} both name the device; give one of them "
                         f"(--hardware: a measured profile, --gpu: a preset)")


def _check_output_modes(args: argparse.Namespace) -> None:
    """--emit-args prints train.py's flags alone (read by $(...)), --json one JSON document (with each plan's step
    terms), --scan-gpus one row per GPU count: an output flag one of them would not print is refused by name."""
    if args.emit_args and args.json:
        raise ValueError("--emit-args prints train.py's flags and --json the plans as JSON; give one of them")
    if args.emit_args and args.zero3_runtime not in (None, Zero3Runtime.HYBRID.value):
        raise ValueError(f"--zero3-runtime {args.zero3_runtime} prices another runtime's ZeRO 3, and --emit-args "
                         f"emits this runtime's train.py flags; drop --zero3-runtime or --emit-args")
    if args.emit_args and args.tp_plan != TpPlan.BLOCK.value:
        raise ValueError(f"--tp-plan {args.tp_plan} prices another runtime's TP collectives, and --emit-args emits "
                         f"this runtime's train.py flags (its TP gathers once per block); drop --tp-plan or --emit-args")
    if args.explain and (args.emit_args or args.json):
        which = "--emit-args prints the flags alone" if args.emit_args else "--json holds each plan's step terms"
        raise ValueError(f"--explain takes the table's best layout apart, and {which}; drop --explain or "
                         f"{'--emit-args' if args.emit_args else '--json'}")
    if args.scan_gpus:
        for flag, on in (("--gpus", args.gpus is not None), ("--emit-args", args.emit_args),
                         ("--explain", args.explain), ("--plot", args.plot), ("--top", args.top is not None)):
            if on:
                raise ValueError(f"{flag} does not run with --scan-gpus (one row, the best layout, per GPU count); "
                                 f"drop one of them")


def accepted_train_args(work: Workload, plans: list, args: argparse.Namespace) -> list[str]:
    """The train.py flags of the fastest plan (a Plan, or a CP plan: context.ContextPlan) that train.py's own
    checks accept (hybrid.train.args, the code train.py runs before any process group); ValueError with train.py's
    reason when none passes."""
    from hybrid.train.args import check_args, parse_args

    reasons = []
    for plan in plans:
        if plan.layout.dp_replicate > 1:  # the planner only: train.py shards ZeRO 3 over all dp
            reasons.append(f"{plan.short()}: HSDP (--data-parallel-replicate-degree), which train.py does not run")
            continue
        flags = train_args(work, plan, args.model)
        world = plan.world if isinstance(plan, context.ContextPlan) else plan.layout.world  # CP: tp pp dp cp
        try:
            check_args(parse_args(flags), world=world)
            return flags
        except (ValueError, SystemExit) as e:
            reasons.append(f"{plan.short()}: {e}")
    raise ValueError(f"--emit-args: train.py rejects the {len(plans)} best layouts (first: {reasons[0]}); "
                     f"raise --top, or unpin dimensions")


# --- arguments -> objects -----------------------------------------------------------------------------

def model_from_args(args: argparse.Namespace) -> ModelConfig:
    """--model, or a model built from the size flags (GPT-style unless --swiglu)."""
    sizes = (args.num_layers, args.hidden_size, args.num_attention_heads)
    if args.model:
        if any(x is not None for x in sizes):
            raise ValueError("give either --model or the size flags (--num-layers ...), not both")
        cfg = load_config(args.model)
        from hybrid.partition import MAX_BALANCED_LAYERS
        if cfg.num_layers > MAX_BALANCED_LAYERS:
            raise ValueError(f"--model {args.model}: {cfg.num_layers} layers; the planner splits at most "
                             f"{MAX_BALANCED_LAYERS} over pipeline stages (published models have ~100)")
        return cfg
    if any(x is None for x in sizes):
        raise ValueError("give --model (a preset or config.json directory) or all of --num-layers, --hidden-size "
                         "and --num-attention-heads")
    layers, hidden, heads = sizes
    from hybrid.partition import MAX_BALANCED_LAYERS
    if layers > MAX_BALANCED_LAYERS:  # the planner tries pp that do not divide them: the balanced split's tables
        raise ValueError(f"--num-layers {layers}: the planner splits at most {MAX_BALANCED_LAYERS} layers over "
                         f"pipeline stages (published models have ~100)")
    if hidden % heads:  # the nearest widths the heads divide, and the head counts that divide this width
        widths = one_of(nearest_multiples(hidden, heads))
        counts = [d for d in divisors(hidden) if d > 1][:4] or [1]
        raise ValueError(f"--hidden-size {hidden} is not divisible by --num-attention-heads {heads}; give "
                         f"--hidden-size {widths}, or --num-attention-heads {one_of(counts)}")
    kv = args.num_query_groups or heads
    if heads % kv:
        raise ValueError(f"--num-query-groups {kv} must divide --num-attention-heads {heads}")
    swiglu = args.swiglu
    return ModelConfig(arch=ARCH_LLAMA if swiglu else ARCH_GPT2, vocab_size=args.vocab_size, hidden_size=hidden,
                       num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=hidden // heads,
                       ffn_hidden_size=args.ffn_hidden_size or 4 * hidden,
                       max_position_embeddings=args.seq_length or 2048, norm_eps=1e-5,
                       tie_embeddings=not args.untie_embeddings_and_output_weights, qkv_bias=not swiglu,
                       mlp_bias=not swiglu, out_bias=not swiglu, activation="silu" if swiglu else "gelu",
                       dropout=0.0 if swiglu else 0.1)


def workload_from_args(args: argparse.Namespace, model: ModelConfig) -> Workload:
    if args.global_batch_size is None:
        raise ValueError("--global-batch-size is required (sequences per optimizer step)")
    seq = args.seq_length or min(2048, model.max_position_embeddings)
    if not model.num_experts and args.expert_model_parallel_size is not None:
        raise ValueError("--expert-model-parallel-size: the model has no experts (a dense model); drop the flag")
    _check_pinned_ep(args.expert_model_parallel_size, model.num_experts, args.gpus)
    if model.arch == ARCH_GPT2 and seq > model.max_position_embeddings:
        raise ValueError(f"--seq-length {seq} exceeds the model's {model.max_position_embeddings} learned "
                         f"positions; use at most {model.max_position_embeddings}")
    return Workload(model, global_batch=args.global_batch_size, seq_length=seq,
                    pad_vocab_to=args.make_vocab_size_divisible_by, precision=precision_of(args),
                    activations=ActivationProfile(args.activation_profile),
                    fp32_grads=grads_in_fp32(args),
                    kernels=KernelProfile(args.kernels) if args.kernels else None,
                    stack=None if args.stack == "auto" else Stack(args.stack), fp8=args.fp8,
                    fp8_scaling=Fp8Scaling(args.fp8_scaling or Fp8Scaling.CURRENT.value),
                    p2p=PipelineP2P(args.pipeline_p2p), grad_accumulation_fusion=args.gradient_accumulation_fusion,
                    overlap_param_gather=args.overlap_param_gather,
                    fused_cross_entropy=args.fused_cross_entropy, pipeline_split=_pipeline_split(args, model),
                    zero3_runtime=Zero3Runtime(args.zero3_runtime) if args.zero3_runtime else None,
                    tp_plan=TpPlan(args.tp_plan))


def _check_pinned_ep(ep: int | None, experts: int, gpus: int | None) -> None:
    """A pinned EP splits the experts and folds over a stage's tp x cp x dp ranks (a divisor of --gpus): one that
    divides neither is one line naming the sizes that do, not "no layout runs" over every layout the search tried."""
    if ep is None:
        return
    fits = [n for n in divisors(experts) if gpus is None or gpus % n == 0]
    if experts % ep:
        raise ValueError(f"--expert-model-parallel-size {ep} does not divide the model's {experts} experts; give "
                         f"{one_of(fits)}, or drop it (EP is searched)")
    if gpus is not None and gpus % ep:
        raise ValueError(f"--expert-model-parallel-size {ep} does not divide --gpus {gpus} (an EP group is ranks of "
                         f"one pipeline stage); give {one_of(fits)}, or drop it (EP is searched)")


def _pipeline_split(args: argparse.Namespace, model: ModelConfig) -> PipelineSplit | None:
    """Megatron-core's split flags as a PipelineSplit (None when none is given), checked against the model."""
    split = PipelineSplit(embedding=args.account_for_embedding_in_pipeline_split,
                          loss=args.account_for_loss_in_pipeline_split,
                          first=args.decoder_first_pipeline_num_layers, last=args.decoder_last_pipeline_num_layers)
    if split == PipelineSplit():
        return None
    split.check(model.num_layers)
    return split


def grads_in_fp32(args: argparse.Namespace) -> bool:
    """The planned gradient dtype (Workload.fp32_grads), by train.py's rule (hybrid/train/args.py grads_in_fp32, the
    flags --emit-args gives it: --bf16, with --grad-reduce-in-bf16 when it was given here): a mixed-precision plan
    accumulates and reduces gradients in fp32 unless --grad-reduce-in-bf16, as train.py's --bf16 and Megatron-LM's
    do; an fp32 plan has nothing to choose. The flags that contradict, or that an fp32 plan cannot take, are one
    line naming them, as train.py's (check_grad_dtype_flags)."""
    mixed = precision_of(args) is Precision.MIXED
    if args.grad_reduce_in_bf16 and args.accumulate_allreduce_grads_in_fp32:
        raise ValueError("--grad-reduce-in-bf16 and --accumulate-allreduce-grads-in-fp32 contradict each other (bf16 "
                         "or fp32 gradients); choose one (fp32 is the default with --precision mixed)")
    if args.grad_reduce_in_bf16 and not mixed:
        raise ValueError("--grad-reduce-in-bf16 needs --precision mixed (an fp32 plan's gradients are fp32, as "
                         "train.py's fp32 runs); drop the flag or plan mixed precision")
    if args.accumulate_allreduce_grads_in_fp32 and not mixed:
        raise ValueError("--accumulate-allreduce-grads-in-fp32 needs --precision mixed (fp32 gradients are already "
                         "4 bytes); drop the flag or plan mixed precision")
    return mixed and not args.grad_reduce_in_bf16


def precision_of(args: argparse.Namespace) -> Precision:
    """--precision, or what the hardware runs: fp32 on a CPU -- a profile `hybrid calibrate` measured over gloo
    (its compute_units, the cores its ranks share) or the cpu preset -- since train.py's gloo ranks train in fp32
    there (a CPU profile's mixed plan would price the bf16 rate and emit --bf16); mixed on GPUs."""
    if args.precision is not None:
        return Precision(args.precision)
    on_host = profile.load_hardware(args.hardware).on_host if args.hardware else args.gpu == "cpu"
    return Precision.FP32 if on_host else Precision.MIXED


def cluster_from_args(args: argparse.Namespace, gpus: int) -> Cluster:
    base = (profile.load_hardware(args.hardware, precision_of(args)) if args.hardware
            else hardware(args.gpu or DEFAULT_GPU))
    hw = base.with_overrides(
        memory_gb=args.gpu_memory, peak_tflops=args.gpu_tflops, gpus_per_node=args.gpus_per_node,
        intra_node_gbps=args.intra_node_bandwidth, inter_node_gbps=args.inter_node_bandwidth,
        compute_efficiency=args.compute_efficiency, gemm_overhead_s=args.gemm_overhead)
    return Cluster(gpus=gpus, hw=hw, allow_cross_node_tp=args.allow_cross_node_tp)


def space_from_args(args: argparse.Namespace) -> SearchSpace:
    """Pinned flags become one-value dimensions; the rest are searched."""
    one = (lambda x: None if x is None else (x,))
    return SearchSpace(
        tp=one(args.tensor_model_parallel_size), pp=one(args.pipeline_model_parallel_size),
        v=one(args.virtual_pipeline_model_parallel_size), micro_batch=one(args.micro_batch_size),
        zero=_zero_stages(args),
        offload=_offloads(args.offload_optimizer, args.offload_params),
        recompute=None if args.recompute_granularity is None else (Recompute(args.recompute_granularity),),
        sequence_parallel=one(args.sequence_parallel),
        layers_per_chunk=args.num_layers_per_virtual_pipeline_stage,
        max_micro_batch=args.max_micro_batch_size, max_v=args.max_virtual_stages,
        expert_parallel=one(args.expert_model_parallel_size), moe_imbalance=args.moe_imbalance,
        dp_replicate=one(args.data_parallel_replicate_degree))


def check_replicate_degree(args: argparse.Namespace, model: ModelConfig) -> None:
    """--data-parallel-replicate-degree N (HSDP) before the search, one line each: ZeRO 3 only (implied when the stage
    is not pinned), N dividing the data-parallel ranks --gpus leaves after tp x pp (when pinned), no MoE model, and
    no --emit-args (train.py runs no HSDP)."""
    r = args.data_parallel_replicate_degree
    if r is None or r == 1:
        return
    flag = f"--data-parallel-replicate-degree {r}"
    if args.zero_stage is not None and args.zero_stage != int(ZeroStage.PARAMETERS):
        raise ValueError(f"{flag} (HSDP) shards ZeRO 3's states inside each replica: give --zero-stage 3 (or drop "
                         f"--zero-stage), or drop {flag}")
    if model.num_experts:
        raise ValueError(f"{flag}: HSDP is not planned for an MoE model; drop it")
    if args.emit_args:
        raise ValueError(f"{flag}: train.py shards ZeRO 3 over all the data-parallel ranks (no HSDP), so --emit-args "
                         f"has no flags for it; drop one of them")
    tp, pp = args.tensor_model_parallel_size or 1, args.pipeline_model_parallel_size or 1
    for n in ([args.gpus] if args.gpus else []):
        dp = n // (tp * pp) if n % (tp * pp) == 0 else 0
        if dp and (dp % r or dp == r):
            fits = ", ".join(str(d) for d in divisors(dp)[:-1][:6]) or "1"
            raise ValueError(f"{flag} must divide the {dp} data-parallel ranks of --gpus {n} (/ tp {tp} x pp {pp}) "
                             f"and leave a shard group of 2 or more: give one of {fits}")


def _zero_stages(args: argparse.Namespace) -> tuple[ZeroStage, ...] | None:
    """--zero-stage pinned, or ZeRO 3 implied by --data-parallel-replicate-degree N > 1 (HSDP is ZeRO 3)."""
    if args.zero_stage is not None:
        return (ZeroStage(args.zero_stage),)
    return (ZeroStage.PARAMETERS,) if (args.data_parallel_replicate_degree or 1) > 1 else None


def _offloads(optimizer: bool | None, params: bool | None) -> tuple[Offload, ...] | None:
    if params:
        if optimizer is False:
            raise ValueError("--offload-params needs the optimizer offloaded too; drop --no-offload-optimizer")
        return (Offload.OPTIMIZER_AND_PARAMS,)
    if optimizer is None:
        return None if params is None else (Offload.NONE, Offload.OPTIMIZER)
    return (Offload.OPTIMIZER,) if optimizer else (Offload.NONE,)


# --- output -------------------------------------------------------------------------------------------

def _header(width: int, host: bool = False) -> str:
    mem = "RSS MiB" if host else "mem GB"
    return (f"{'#':>2}  {'layout':<{width}} {mem:>7} {'step s':>8} {'tokens/s':>10} {'TFLOP/s':>8} "
            f"{'MFU':>6} {'bubble':>7}")


def _rate(tflops: float) -> str:
    """TFLOP/s to 3 significant digits below 10 (a CPU's 0.0191, not 0.0), as train.py's log line prints it."""
    return f"{tflops:.1f}" if tflops >= 10 else f"{tflops:.3g}"


def _memory(plan: Plan, baseline: float | None) -> str:
    """GB of the fullest device's demand; on a host (baseline: this process's resident bytes) the peak RSS a
    rank reaches, as train.py's log measures it: the rank's tensors, without the GPU reserve, plus the process.
    Both count an MoE model's experts (Plan.memory_gb; round 21: the RSS left them out)."""
    if baseline is None:
        return f"{plan.memory_gb:>7.1f}"
    return f"{(plan.memory_gb * GB - plan.memory.peak.workspace + baseline) / 2**20:>7,.0f}"


def _units_line(host: bool, baseline: float | None) -> str:
    """What the columns are, in the terms of train.py's iteration lines."""
    if host:
        return (f"units as train.py's log lines measure them: RSS MiB = the fullest rank's peak resident memory: "
                f"its tensors (model states, activations) + {baseline / 2**20:,.0f} MiB, this process's size now "
                f"(Python, torch: what a rank holds before its model); step s = ms/iter / 1000; tokens/s over all "
                f"ranks; TFLOP/s = model FLOPs per rank per second (the log's TFLOP/s/device)")
    return ("units: mem GB = the fullest GPU's demand with the planner's 2 GB CUDA/NCCL reserve (train.py's "
            "'max allocated' counts tensors only: about this less 2 GB); step s = ms/iter / 1000; TFLOP/s = model "
            "FLOPs per GPU per second (the log's TFLOP/s/device)")


def _experts_legend(work: Workload) -> str:
    """The layout cell's ep / etp of an MoE model, in train.py's flags ('' for a dense model)."""
    if not work.model.num_experts:
        return ""
    return ("ep: the experts' expert-parallel size (--expert-model-parallel-size), etp: their expert-TP size, "
            "shown when > 1 (--expert-tensor-parallel-size; docs/moe.md \"The planner\"); ")


def _width(plans: list[Plan]) -> int:
    return max([len("layout")] + [len(p.short()) for p in plans])


def _count(n: float) -> str:
    """1.56B, 232.8M."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _row(i: int, plan: Plan, width: int, baseline: float | None = None) -> str:
    return (f"{i:>2}  {plan.short():<{width}} {_memory(plan, baseline)} {plan.seconds:>8.4g} "
            f"{plan.tokens_per_s:>10,.0f} {_rate(plan.tflops_per_gpu):>8} {100 * plan.mfu:>5.1f}% "
            f"{100 * plan.bubble_fraction:>6.1f}%")


def _baseline(hw) -> float | None:
    """This process's resident bytes on host hardware (None on GPUs)."""
    if not hw.on_host:
        return None
    from hybrid.metrics.peak_memory import current_rss_bytes
    return float(current_rss_bytes())


def _report(work: Workload, cluster: Cluster, result: SearchResult, show: int,
            baseline: float | None = None) -> str:
    """The table; baseline: this process's resident bytes on host hardware (_baseline; measured here if None)."""
    hw, cfg = cluster.hw, work.model
    pytorch = bool(result.plans) and work.pytorch_native(result.plans[0].layout) and hw.eager_clock != 1.0
    clock = f" x PyTorch-stack clock {hw.eager_clock:.3g}" if pytorch else ""
    lines = [f"{cfg.arch} {_count(cfg.num_parameters)} params, {cfg.num_layers} layers, h {cfg.hidden_size}, "
             f"{cfg.num_heads} heads ({cfg.num_kv_heads} kv) | {cluster.gpus} x {hw.name} "
             f"({hw.capacity_bytes / GB:.4g} GB, {hw.peak_tflops:g} TFLOP/s, efficiency {hw.compute_efficiency:.3g}"
             f"{clock}) | "
             f"global batch {work.global_batch} x {work.seq_length} tokens",
             "layout: tp pp dp v(chunks/rank) b(micro-batch) z(ZeRO) [offload] [sp] recompute; "
             + _experts_legend(work) + "TFLOP/s per GPU incl. recomputation; MFU without",
             _header(_width(result.plans), hw.on_host)]
    baseline = _baseline(hw) if baseline is None else baseline
    lines += [_row(i + 1, p, _width(result.plans), baseline) for i, p in enumerate(result.plans)]
    lines.append(_units_line(hw.on_host, baseline))
    best = result.plans[0]
    t = best.time
    lines.append(f"best: step {best.seconds:.4g} s = pipeline {t.pipeline:.4g} (compute {t.compute:.4g}, TP comm "
                 f"{t.tp_comm:.4g}, bubble {100 * best.bubble_fraction:.1f}%) + DP sync {t.dp_comm:.4g} + "
                 f"optimizer {t.optimizer:.4g} + other {t.other:.4g}"
                 + (f" + experts {best.experts.seconds:.4g}" if best.experts else ""))
    if best.layout.short() in result.notes:  # a zero-bubble schedule chosen: why (hybrid/planner/search.py)
        lines.append(f"schedule: {result.notes[best.layout.short()]}")
    lines.append(f"searched {result.considered} layouts: {len(result.rejected)} rejected, {result.dominated} "
                 f"dominated (a variant with less recomputation/offload fits), {result.timed} simulated")
    lines += [f"  {_rejection_line(n, r)}" for n, r in summarize_rejections(result.rejected, show)]
    return "\n".join(lines)


def explain(work: Workload, cluster: Cluster, plan: Plan, baseline: float | None = None) -> str:
    """The step of `plan` taken apart (time.TERMS): each term's seconds, its share, what it is, and the numbers
    the compute terms rest on. baseline: this process's resident bytes on CPU hardware (_baseline), where the
    memory figures are the table's RSS MiB (the demand less the GPU reserve, plus the process), not GB."""
    t = plan.time
    lines = [_why(work, plan, plan.short(), t.total, "")]
    lines += _term_lines(t.terms, t.total, TERMS)
    return "\n".join(lines + _device_lines(work, cluster, plan, baseline))


def _why(work: Workload, plan: Plan, name: str, seconds: float, per_rank: str) -> str:
    """--explain's first line: the layout, the step its terms add up to, and how the plan was priced."""
    moe_s = f" + the experts' {plan.experts.seconds:.4g} s (last lines)" if plan.experts else ""
    return (f"why {name} takes {seconds:.4g} s{moe_s} a step ({per_rank}{work.kernel_profile.value} kernels, "
            f"pipeline p2p {work.p2p.value}{', fp8' if work.fp8 else ''}, gradient accumulation "
            f"{'fused' if work.fused_grad_accumulation else 'a pass a micro-batch'}, parameter all-gather "
            f"{'overlapped' if work.overlap_param_gather else 'exposed'}{_rerun_note(work, plan.layout)}"
            f"{_zero3_note(work, plan.layout)}):")


def _term_lines(terms: tuple[tuple[str, float], ...], total: float, described: tuple) -> list[str]:
    """One line per term: its seconds, its share of `total` (the terms' sum), what it is (`described`)."""
    what = dict(described)
    return [f"  {name:<13} {seconds:>10.4g} s {100 * seconds / total:>6.1f} %  {what[name]}" for name, seconds in terms]


def _device_lines(work: Workload, cluster: Cluster, plan: Plan, baseline: float | None) -> list[str]:
    """The rates the compute terms rest on, and an MoE model's EP choice."""
    t, hw = plan.time, work.device(cluster.hw, plan.layout)  # as the plan timed it
    kernel, d, s = work.attention_kernel, work.model.head_dim, work.seq_length  # its published rate at this d, s
    flash = (f"flash attention ({kernel.value}, head {d}, s {s}) at "
             f"{kernel.efficiency(hw, d, s) * hw.peak_tflops:.3g} TFLOP/s" if hw.flash_efficiency else
             "attention as GEMMs")
    ceiling = (f" (x {hw.large_gemm_ratio:g} beyond {hw.large_gemm_flops:.3g} FLOPs, past the measured table)"
               if hw.large_gemm_flops is not None else "")  # Hardware.large_gemm_ratio
    lines = [grads_line(work), *hsdp_lines(work, cluster, plan.layout),
             f"  on {hw.name}: GEMMs at up to {hw.compute_efficiency:g} x {hw.peak_tflops:g} TFLOP/s + "
             f"{hw.gemm_overhead_s * 1e6:.3g} us each{ceiling}; {flash}; memory-bound ops at "
             f"{hw.elementwise_bytes_per_s / 1e12:.3g} TB/s + {hw.kernel_overhead_s * 1e6:.3g} us a kernel; "
             f"one pipeline message {t.pp_comm * 1e3:.3g} ms; bubble {100 * t.bubble_fraction:.1f} % "
             f"(docs/planner.md \"Time\")"]
    if plan.experts is not None:  # MoE: the EP choice (hybrid/planner/moe.py)
        peak = plan.memory.peak
        offset = None if baseline is None else baseline - peak.workspace  # _memory's RSS, as the table's column
        lines.append(f"  + {plan.experts.explain(host=baseline is not None)}")
        lines += ["  " + line for line in moe.why(work, cluster, plan.layout, peak.total, plan.experts, offset)]
    return lines


def hsdp_lines(work: Workload, cluster: Cluster, layout) -> list[str]:
    """--explain's HSDP line (time.hsdp_traffic; none without HSDP): each group's ranks, link and traffic a step."""
    groups = hsdp_traffic(work, cluster, layout)
    if groups is None:
        return []
    sh, rep = groups["shard"], groups["replicate"]
    return [f"  HSDP {layout.dp_shard} x {layout.dp_replicate}: ZeRO 3 over shard groups of {sh['ranks']} ({sh['link']}): "
            f"{sh['calls']} all-gathers / reduce-scatters, {sh['bytes'] / GB:.4g} GB a step, {sh['seconds']:.4g} s "
            f"on its link; the reduced shards all-reduced over {rep['ranks']} replicas ({rep['link']}, "
            f"{rep['per_node']} a node): {rep['calls']} calls, {rep['bytes'] / GB:.4g} GB, {rep['seconds']:.4g} s "
            f"(alone; both run under the passes: dp_in_passes is what they leave exposed)"]


def grad_dtype(work: Workload) -> str:
    """The dtype the plan's gradients accumulate and reduce over DP in (Workload.grad_bytes: 4 -> 'fp32', 2 ->
    'bf16': a mixed plan runs as --bf16), --json's "grad_dtype"."""
    return "fp32" if work.grad_bytes == 4 else "bf16"


def zero_line_grads(work: Workload) -> str:
    """The gradient part of the `zero:` start-up line train.py prints for the plan's flags (hybrid/train/loop.py
    _grads_part, `--emit-args`' --bf16 with or without --grad-reduce-in-bf16): '' in fp32 training."""
    if not work.precision.mixed:
        return ""
    return " | fp32 grads" if work.fp32_grads else " | bf16 grads (--grad-reduce-in-bf16)"


def grads_line(work: Workload) -> str:
    """--explain's gradient line: their dtype and bytes a parameter (memory and DP reductions), why, and what
    train.py's `zero:` line says for the plan's flags."""
    dtype, why = grad_dtype(work), "fp32 training"
    if work.precision.mixed:
        why = ("train.py's --bf16 default, as Megatron-LM's; --grad-reduce-in-bf16 plans bf16" if work.fp32_grads
               else "--grad-reduce-in-bf16, which --emit-args gives; without it fp32, train.py's --bf16 default")
    said = f"; train.py's `zero:` line says '{zero_line_grads(work)[3:]}'" if work.precision.mixed else ""
    return (f"  gradients: {dtype}, {work.grad_bytes} bytes a parameter in memory and in the DP reductions "
            f"({why}{said})")


def _amount(n: float, hw) -> str:
    """Bytes in the table's unit (predicted_memory.demand_text's) to 3 digits below 100: a ring's 0.0336 GB, not
    0.0 GB; 1,918 MiB."""
    x, unit = (n / 2**20, "MiB") if hw.on_host else (n / GB, "GB")
    return f"{x:,.0f} {unit}" if x >= 100 else f"{x:.3g} {unit}"


def explain_cp(work: Workload, cluster: Cluster, plan: context.ContextPlan, baseline: float | None = None) -> str:
    """A CP plan's step taken apart as `explain` does a plain one: per rank it is the reduced plan (context.reduce:
    s/c tokens a sequence at dp x c, its time.TERMS) plus CP's terms after its attention (context.CP_TERMS: the
    other ranks' key blocks, the exposed exchange, torch's ring merges); they add up to the step, an MoE model's
    experts aside as for a plain plan. Then the exchange (how much of it is hidden) and the fullest rank's memory,
    in the table's unit (GB; on CPU hardware, baseline given, RSS MiB)."""
    reduced, _ = context.reduce(work, plan.layout, plan.cp)
    base, step = plan.base, plan.base.time.total + plan.extra_s
    per_rank = f"per rank {base.short()} at {reduced.seq_length} tokens a sequence + CP's terms; " if plan.cp > 1 else ""
    lines = [_why(reduced, base, plan.short(), step, per_rank)]
    lines += _term_lines(plan.terms(), step, TERMS + context.CP_TERMS)
    lines += _cp_lines(work, cluster, plan, baseline)
    return "\n".join(lines + _device_lines(reduced, cluster, base, baseline))


def _cp_lines(work: Workload, cluster: Cluster, plan: context.ContextPlan, baseline: float | None) -> list[str]:
    """What CP adds, per layer and micro-batch and over the step, and the fullest rank's memory (context.report's
    column: GB, or RSS MiB on a CPU = the tensors without the GPU reserve + this process)."""
    lines = []
    c = plan.cost
    if c is not None:
        lay = plan.base.layout
        ring = (f" ({context.ring_schedule(work, lay).value} ring)" if plan.comm is CommType.P2P else "")
        where = "across nodes" if context.cp_placement(cluster, lay.tp, plan.cp).spans_nodes else "inside a node"
        lines.append(f"  CP: {plan.cp} ranks {lay.tp} apart {where}, {plan.comm.value}{ring}; a layer and micro-batch: "
                     f"{c.attention * 1e3:.3g} ms more attention, {c.transfer * 1e3:.3g} ms of transfers of which "
                     f"{c.exposed * 1e3:.3g} exposed, {c.merge * 1e3:.3g} ms of merges; x {plan.passes:.4g} passes ((m + "
                     f"(pp - 1)/v) x the rank's layers): the step's transfers take {plan.passes * c.transfer:.4g} s, "
                     f"{plan.hidden_s:.4g} s of them hidden under the ring steps, the rest cp_exchange "
                     f"(docs/context-parallel.md)")
    peak = plan.base.memory.peak
    tensors = plan.memory_gb * GB - peak.workspace  # the rank's tensors, the ring's buffers and experts included
    parts = (f"its reduced plan's {_amount(tensors - plan.ring_bytes, cluster.hw)} of tensors + the ring's "
             f"buffers {_amount(plan.ring_bytes, cluster.hw)}")
    if baseline is None:
        lines.append(f"  memory: the fullest rank (stage {peak.rank}) {plan.memory_gb:.1f} GB = {parts} + the "
                     f"{demand_text(peak.workspace, cluster.hw)} workspace (CUDA/NCCL reserve)")
    else:
        lines.append(f"  memory: the fullest rank (stage {peak.rank}) {(tensors + baseline) / 2**20:,.0f} RSS MiB = "
                     f"{parts} + {baseline / 2**20:,.0f} MiB, this process's size now")
    return lines


def _zero3_note(work: Workload, layout) -> str:
    """Which ZeRO 3 runtime the zero3_copies term prices (Workload.zero3_runtime), for --explain's first line."""
    if layout.zero is not ZeroStage.PARAMETERS or layout.dp == 1 or work.zero3_runtime is None:
        return ""
    return f", ZeRO 3 runtime {work.zero3_runtime.value}"


def _rerun_note(work: Workload, layout) -> str:
    """What full recomputation reruns (time.recompute_stops_early), for --explain's first line."""
    if layout.recompute is not Recompute.FULL:
        return ""
    if recompute_stops_early(work, layout):
        return ", full recomputation reruns all but the down projection (torch's checkpoint stops early)"
    return ", full recomputation reruns the whole layer"


def _rejection_line(count: int, example: Rejection) -> str:
    """One group of rejections (same reason up to numbers), worded for what it is: a count and, for OOM, the
    layout that came closest to fitting -- '5551 layouts rejected for OOM (closest: tp8 pp4 dp2 ... needs
    80.006 GB of 80 on stage 0)' -- else one example: '3 rejected for the same reason, e.g. tp 16: ...'."""
    if count == 1:
        return f"{example}"
    match = re.match(r"OOM on stage (\d+): (.*)", example.reason)
    if match:
        return f"{count} layouts rejected for OOM (closest: {example.what}, {match.group(2)} on stage {match.group(1)})"
    return f"{count} rejected for the same reason, e.g. {example}"


def _nothing_fits(work: Workload, cluster: Cluster, result: SearchResult, show: int,
                  space: SearchSpace | None = None) -> str:
    groups = summarize_rejections(result.rejected, show)
    reasons = "; ".join(_rejection_line(n, r) for n, r in groups)
    return (f"no layout of the {_count(work.model.num_parameters)}-parameter model runs on {cluster.gpus} x "
            f"{cluster.hw.name} with global batch {work.global_batch} x {work.seq_length}: {reasons or 'none'}. "
            f"{_fix(work, cluster, groups, result.rejected, space)}")


def _fix(work: Workload, cluster: Cluster, groups: list, rejected: list[Rejection], space: SearchSpace | None) -> str:
    """The fix follows the reasons: a batch no layout divides wants another batch; a pinned TP size that splits
    neither the model nor the GPUs wants one that does (named: the sizes tp_problems and the GPU count pass; a
    pinned PP size likewise, by pp_problems);
    more memory only where a layout ran out of it (round 18: a pinned tp 5 of a 12-head model was told "Try
    more GPUs, a GPU with more memory")."""
    if groups and all("not divisible by" in r.reason for _, r in groups):
        return "Use a --global-batch-size that the data-parallel size divides (a multiple of it), or unpin dimensions."
    n = cluster.gpus
    if space is not None and space.tp and all(tp_problems(work.model, cluster, t) or n % t for t in space.tp):
        fits = [t for t in divisors(n) if not tp_problems(work.model, cluster, t)]
        if fits:
            return f"Give --tensor-model-parallel-size {one_of(fits)} (the sizes that split the model on {n} GPUs)."
    if space is not None and space.pp and all(pp_problems(work.model, p, 1) or n % p for p in space.pp):
        fits = [p for p in divisors(n) if not pp_problems(work.model, p, 1)]
        return f"Give --pipeline-model-parallel-size {one_of(fits)} (the sizes that split the layers on {n} GPUs)."
    if any("OOM" in r.reason for r in rejected):  # a stage's, the host's (offload), the experts'
        return "Try more GPUs, a GPU with more memory, or unpin dimensions."
    return "Change the sizes the reasons name, or unpin dimensions."


def _write_plot(path: str, plans: list, work: Workload, cluster: Cluster, baseline: float | None) -> None:
    """--plot: the plans' memory bars (hybrid/planner/plot.py), written whole or not at all (atomic_output)."""
    from hybrid.planner.plot import plot_memory
    with atomic_output(path, suffix=os.path.splitext(path)[1]) as tmp:
        plot_memory(plans, tmp, title=_plot_title(work, cluster), device_bytes=cluster.hw.capacity_bytes,
                    host_baseline=baseline)


def _plot_title(work: Workload, cluster: Cluster) -> str:
    cfg = work.model
    return (f"{cfg.arch} {_count(cfg.num_parameters)} on {cluster.gpus} x {cluster.hw.name}, global batch "
            f"{work.global_batch} x {work.seq_length}")


def train_args(work: Workload, plan: Plan | context.ContextPlan, model: str | None = None) -> list[str]:
    """scripts/train.py flags that run `plan` (Megatron names): the planner's mapping (train_flags.py) written with
    train.py's own flag table (hybrid/train/config.py); a CP plan's (context.ContextPlan) at its true dp, with
    --context-parallel-size and --cp-comm-type after the pipeline size (hybrid/cp/args.py's flags; as
    train.py --auto-parallel sets them)."""
    from hybrid.train.config import to_argv
    argv = to_argv(plan_flags(work, plan.layout, model))
    base = plan.base if isinstance(plan, context.ContextPlan) else plan
    if base is not plan and plan.cp > 1:
        at = argv.index("--pipeline-model-parallel-size") + 2
        argv[at:at] = ["--context-parallel-size", str(plan.cp), "--cp-comm-type", plan.comm.value]
    argv += moe.train_argv(base.experts)
    if not work.overlap_param_gather and plan.layout.zero in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS):
        argv.append("--no-overlap-param-gather")  # planned exposed: run it so (to_argv writes no default-off)
    return argv


def plan_json(work: Workload, plan: Plan, cluster: Cluster | None = None) -> dict:
    """One plan as plain data (a CP plan's: cp_plan_json); with `cluster`, an HSDP plan's "dp_groups"
    (time.hsdp_traffic: each group's ranks, link, calls, bytes and seconds a step; None otherwise)."""
    lay, t = plan.layout, plan.time
    return {
        "layout": {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "v": lay.v, "micro_batch": lay.micro_batch,
                   "zero_stage": int(lay.zero), "offload": lay.offload.value, "recompute": lay.recompute.value,
                   "sequence_parallel": lay.sequence_parallel, "schedule": lay.schedule.value,
                   "dp_replicate": lay.dp_replicate},
        "memory_gb": plan.memory_gb,
        "memory_per_stage_gb": [{"rank": r.rank, "parameters": r.parameters,
                                 "params": r.states.params / GB, "grads": r.states.grads / GB,
                                 "optimizer": r.states.optimizer / GB, "activations": r.activations / GB,
                                 "buffers": r.buffers / GB, "workspace": r.workspace / GB, "total": r.total / GB,
                                 "host": r.states.host / GB} for r in plan.memory.ranks],
        "in_flight": list(plan.memory.in_flight.chunks),
        "step_seconds": plan.seconds,
        "time": {k: v for k, v in asdict(t).items() if k not in ("run", "terms")},
        "terms": dict(t.terms),
        "simulated_m": list(t.run.simulated_m),
        "extrapolated": t.run.extrapolated,
        "tokens_per_s": plan.tokens_per_s,
        "tflops_per_gpu": plan.tflops_per_gpu,
        "flops_formula": plan.flops_formula.value,
        "mfu": plan.mfu,
        "bubble_fraction": plan.bubble_fraction,
        "grad_dtype": grad_dtype(work),
        "train_args": train_args(work, plan),
        "experts": None if plan.experts is None else asdict(plan.experts),
        "dp_groups": hsdp_traffic(work, cluster, lay) if cluster is not None else None,
    }


def cp_plan_json(work: Workload, cluster: Cluster, plan: context.ContextPlan) -> dict:
    """One CP plan as plain data: plan_json's keys for the whole step -- the layout at its true dp with the CP
    size and comm type, the fullest rank's memory (the ring's buffers in), the terms (the reduced plan's and
    context.CP_TERMS: they add up to step_seconds less an MoE model's experts, as plan_json's), train.py's flags
    -- and under "context_parallel" what CP adds; "time" and memory_per_stage_gb are the reduced plan's (a rank
    at s/c tokens, dp x c: context.reduce)."""
    reduced, _ = context.reduce(work, plan.layout, plan.cp)
    out = plan_json(reduced, plan.base, cluster)
    lay, c = plan.layout, plan.cost
    out["layout"] = {**out["layout"], "dp": lay.dp, "context_parallel_size": plan.cp,
                     "cp_comm_type": plan.comm.value if plan.cp > 1 else None}  # cp 1: no exchange
    out.update(memory_gb=plan.memory_gb, step_seconds=plan.total_s, terms=dict(plan.terms()),
               tokens_per_s=plan.tokens_per_s, mfu=plan.mfu, train_args=train_args(work, plan),
               tflops_per_gpu=step_flops(work, lay, plan.base.flops_formula) / (cluster.gpus * plan.total_s) / 1e12)
    out["context_parallel"] = {
        "size": plan.cp, "comm_type": out["layout"]["cp_comm_type"], "extra_seconds": plan.extra_s, "passes": plan.passes,
        "ring": context.ring_schedule(work, plan.base.layout).value if plan.comm is CommType.P2P else None,
        "layer_seconds": None if c is None else {"attention": c.attention, "transfer": c.transfer,
                                                 "exposed": c.exposed, "merge": c.merge},
        "transfer_seconds": 0.0 if c is None else plan.passes * c.transfer, "hidden_seconds": plan.hidden_s,
        "ring_buffers_gb": plan.ring_bytes / GB, "reduced_layout": plan.base.short(),
        "reduced_seq_length": reduced.seq_length}
    return out


def _json(work: Workload, cluster: Cluster, result: SearchResult, show: int) -> dict:
    return {"gpus": cluster.gpus, "gpu": cluster.hw.name, "global_batch": work.global_batch,
            "seq_length": work.seq_length, "plans": [plan_json(work, p, cluster) for p in result.plans],
            "considered": result.considered, "dominated": result.dominated, "timed": result.timed,
            "rejected": [{"count": n, "example": r.what, "reason": r.reason}
                         for n, r in summarize_rejections(result.rejected, show)]}


def _scan(args: argparse.Namespace, work: Workload, space: SearchSpace, formula: FlopsFormula) -> None:
    """The best layout at each GPU count: how the model scales (with --context-parallel-size: over the CP sizes
    and comm types too, _scan_cp)."""
    try:
        counts = [int(x) for x in args.scan_gpus.split(",")]
    except ValueError:
        counts = []
    if not counts or not all(1 <= n <= MAX_GPUS for n in counts):
        raise ValueError(f"--scan-gpus {args.scan_gpus!r}: give comma-separated GPU counts in [1, {MAX_GPUS}], "
                         f"e.g. 8,64,512")
    if args.context_parallel_size is not None:
        _scan_cp(args, work, space, counts)
        return
    rows = []
    for n in counts:
        cluster = cluster_from_args(args, n)
        result = search(work, cluster, space, top=1, formula=formula, budget=args.sim_budget)
        rows.append((n, result))
    if args.json:
        print(json.dumps([{"gpus": n, "best": plan_json(work, r.plans[0], cluster_from_args(args, n)) if r.plans
                           else None, "rejected": [str(x) for _, x in summarize_rejections(r.rejected, 3)]}
                          for n, r in rows], indent=2))
        return
    width = _width([r.plans[0] for _, r in rows if r.plans])
    hw = cluster_from_args(args, counts[0]).hw
    baseline = _baseline(hw)
    print(f"{'GPUs':>6}  " + _header(width, hw.on_host)[4:])
    for n, r in rows:
        if r.plans:
            print(f"{n:>6}  " + _row(1, r.plans[0], width, baseline)[4:])
        else:
            print(f"{n:>6}  {_none_fits(r.rejected)}")


def _none_fits(rejected: list[Rejection]) -> str:
    """A scan row where nothing fits: the largest group of reasons."""
    first = summarize_rejections(rejected, 1)
    return f"none fits: {_rejection_line(*first[0]) if first else 'no layout'}"


def _scan_cp(args: argparse.Namespace, work: Workload, space: SearchSpace, counts: list[int]) -> None:
    """--scan-gpus with --context-parallel-size: at each GPU count the fastest CP layout (context.search_cp over
    the sizes that divide the count and the comm types), printed as the CP table's row (context.row: its CP s
    column, the step CP adds) after the count, or why none fits; --json: each count's cp_plan_json."""
    sizes = context.parse_sizes(args.context_parallel_size)
    rows = []
    for n in counts:
        cluster, rejected = cluster_from_args(args, n), []
        plans = context.search_cp(work, cluster, space, cps=sizes, comms=_cp_comms(args), top=1, rejected=rejected)
        rows.append((n, cluster, plans[0] if plans else None, rejected))
    if args.json:
        print(json.dumps([{"gpus": n, "best": cp_plan_json(work, cluster, p) if p else None,
                           "rejected": [str(x) for _, x in summarize_rejections(rejected, 3)]}
                          for n, cluster, p, rejected in rows], indent=2))
        return
    width = max([len("layout")] + [len(p.short()) for _, _, p, _ in rows if p])
    baseline = _baseline(rows[0][1].hw)
    print(f"{'GPUs':>6}  " + context.header(width, baseline is not None)[4:])
    for n, _, p, rejected in rows:
        print(f"{n:>6}  " + (context.row(1, p, width, baseline)[4:] if p else _none_fits(rejected)))
    print(context.legend(baseline))
