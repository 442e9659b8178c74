"""Issue 26, round 22 (planner22): MLPerf Training's GPT-3 175B submissions on H100 as CHECK rows.

    python -m hybrid.planner.published22_mlperf              # docs/planner/round22-mlperf.md, its tables
    python -m hybrid.planner.published22_mlperf --what-if    # and FP8 parameter gathers on the NeMo 2.0 rows

Round 21 found the planner optimistic on GPT-3-architecture rows of the Megatron stack (the DGXC GPT-3 175B tables,
+12 % BF16 / +10 % FP8; docs/planner/round21-gpt-arch.md). MLPerf Training's GPT-3 175B benchmark (v3.0, June 2023,
to v4.1, Nov 2024; v5.0 replaced it with Llama 3.1 405B) holds the largest public set of GPT-3 runs on that stack
with STATED layouts: each submission's config_DGXH100_*.sh (TENSOR_MODEL_PARALLEL, PIPELINE_MODEL_PARALLEL,
INTERLEAVED_PIPELINE, MICRO_BATCH_SIZE, MINIBS, DGXNNODES) and its result logs (mllog lines). Every row here is a
Role.CHECK row: nothing is fitted to it, and no model code was changed for it.

Source: mlcommons/training_results_v3.0 / v3.1 / v4.0 / v4.1, read from their newest stored snapshots (MLPERF_COMMITS),
NVIDIA's own submissions and the partner submissions that ran NVIDIA's code (NVIDIA_CoreWeave v3.0, Azure+NVIDIA
v3.1, Supermicro v4.0, Oracle v4.1). What each row compares, and how it was read, is in `mlperf_run`'s docstring
and each row's tuple (MLPERF_ROWS).

Nothing in the shipped model reads this module; families.all_published_runs adds its rows to the report.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hybrid.planner.hardware import AttentionKernel
from hybrid.planner.layout import Offload, PipelineP2P, Recompute, Workload, ZeroStage
from hybrid.planner.model import ActivationProfile
from hybrid.planner.ops import Fp8Scaling, KernelProfile, Stack
from hybrid.planner.published import Metric, PublishedRun, Role
from hybrid.planner.reference import gpt_model
from hybrid.planner.search import SearchSpace

MLPERF_SOURCE = "mlcommons/training_results_v"  # families.FAMILY_OF_SOURCE's prefix for these rows
MLPERF_FAMILY = "MLPerf Training GPT-3 (NeMo / Megatron)"
# the snapshot each round was read at (the `fetch` tool's newest stored commit of each repository)
MLPERF_COMMITS = {"3.0": "63e326c4", "3.1": "d06288b2", "4.0": "6fe95437", "4.1": "b87b9e39"}
# the stack each round's Dockerfile builds (what the rows ran; read, not planned apart)
MLPERF_STACKS = {
    "3.0": "nvcr.io/nvidia/pytorch:23.04-py3, NeMo v1.17.0_pt_23.04, TE release_v0.8 (Dockerfile ARGs)",
    "3.1": "nvcr.io/nvidia/pytorch:23.09-py3, NeMo bd0b818a (r1.20.0 base), TE 09ba8427, Megatron-core df727128, "
           "flash-attn 2.0.8 (Dockerfile ARGs)",
    "4.0": "nvcr.io/nvidia/pytorch:24.04-py3, NeMo v2.0.0.rc0.beta, TE v1.6rc1, Megatron-core core_v0.7.0.beta "
           "(Dockerfile ARGs)",
    "4.1": "nvcr.io/nvidia/pytorch:24.09-py3, NeMo 24.09-alpha.rc0, Megatron-core 24.09-alpha.rc0 (Dockerfile ARGs)",
}


@dataclass(frozen=True)
class MlperfRow:
    """One MLPerf GPT-3 submission (one results directory: three or more seeds of one configuration).

    Attributes:
        round: the MLPerf Training round ("3.0" ... "4.1"; MLPERF_COMMITS gives the snapshot read).
        results: the results directory under the repository ("<submitter>/results/<system>/gpt3").
        config: the config script the run sourced, with the lines read (file:line, ...).
        gpus: DGXNNODES x 8 (the mllog's `submission_platform` says "<nodes>x<system>").
        gbs: the mllog's `global_batch_size` (sequences of 2048 tokens; = MINIBS x d).
        accum: the mllog's `gradient_accumulation_steps` (= gbs / (d x micro-batch): checks t x p and b).
        tp, pp, vp, mbs: TENSOR_MODEL_PARALLEL, PIPELINE_MODEL_PARALLEL, INTERLEAVED_PIPELINE (model chunks a
            rank), MICRO_BATCH_SIZE.
        step_s: the published step time, seconds (`how` says how it was read).
        how: "train_step_timing": the median of every `tracked_stats` {"train_step_timing": s} line of the
            result files (NeMo's step timer: the forward and backward of every micro-batch and the optimizer
            step); "block": the median over the result files' training blocks of (block_stop.time_ms -
            block_start.time_ms) / (block's epoch_count tokens / (gbs x 2048)), where no per-step line is logged
            (v4.x). On v3.1's logs, which have both, the block figure is 1.1-2.3 % above train_step_timing (the
            steps' between-step work: logging, callbacks).
        samples: how many step times (train_step_timing lines or blocks) the median is over.
        cuda_graphs: LAYER_CUDA_GRAPH=1 (per-layer CUDA graphs; not a planner term).
        fp8_params: FP8_PARAMS=True (v4.x's config_common.sh: NeMo's `fp8_params`, the weights held in FP8, so
            the distributed optimizer all-gathers 1 byte a parameter: Workload.fp8_param_gather).
    """

    round: str
    results: str
    config: str
    gpus: int
    gbs: int
    accum: int
    tp: int
    pp: int
    vp: int
    mbs: int
    step_s: float
    how: str
    samples: int
    cuda_graphs: bool = False
    fp8_params: bool = False


_V30 = "NVIDIA/benchmarks/gpt3/implementations/pytorch/"
_V30CW = "NVIDIA_CoreWeave/benchmarks/gpt3/implementations/pytorch/"
_V31 = "NVIDIA/benchmarks/gpt3/implementations/pytorch/"
_V40 = "NVIDIA/benchmarks/gpt3/implementations/nemo/"
_V41 = "NVIDIA/benchmarks/gpt3/implementations/"
_VP30 = "config_common.sh:25 (INTERLEAVED_PIPELINE=12)"
_VP31 = "conf/custom.yaml:62 (INTERLEAVED_PIPELINE unset: 12)"
_L31 = ":4-7 (MINIBS, t, p, nodes), :19 (b 1), :21 (TP_COMM_OVERLAP=True); "
_FP8P40 = "config_common.sh:74 (FP8_PARAMS=True), conf/custom.yaml:81 (fp8_params)"
_ORACLE = "Oracle/benchmarks/gpt3/DGXH100_128x8x64x4x8_mbs2/config_DGXH100_"
_ORACLE_LINES = (":4-7, :23 (b 2), :25, :38 (INTERLEAVED_PIPELINE=4); config_common.sh:66 (FP8_PARAMS=True); the "
                 "logs' config dump: virtual_pipeline_model_parallel_size: 4, micro_batch_size: 2, fp8_params: true, "
                 "enable_cuda_graph: false")

MLPERF_ROWS = (
    # v3.0 (June 2023): the 23.04 stack. Its mllog's blocks are whole-run intervals, so train_step_timing
    MlperfRow("3.0", "NVIDIA/results/dgxh100_n64_nemo/gpt3",
              _V30 + "config_DGXH100_64x8x128x4x8_mbs1.sh:2-5, :16 (b 1); " + _VP30,
              512, 2048, 128, 4, 8, 12, 1, 12.0769, "train_step_timing", 864),
    MlperfRow("3.0", "NVIDIA/results/dgxh100_n96_nemo/gpt3",
              _V30 + "config_DGXH100_96x8x128x4x8_mbs1.sh:2-5, :16 (b 1); " + _VP30,
              768, 3072, 128, 4, 8, 12, 1, 12.1261, "train_step_timing", 592),
    MlperfRow("3.0", "NVIDIA_CoreWeave/results/coreweave_hgxh100_n96_ngc23.04_pytorch/gpt3",
              _V30CW + "config_DGXH100_96x8x128x4x8_mbs1.sh:2-5, :16 (b 1); " + _VP30,
              768, 3072, 128, 4, 8, 12, 1, 12.2993, "train_step_timing", 600),
    MlperfRow("3.0", "NVIDIA_CoreWeave/results/coreweave_hgxh100_n192_ngc23.04_pytorch/gpt3",
              _V30CW + "config_DGXH100_192x8x64x4x8_mbs1.sh:2-5, :16 (b 1); " + _VP30,
              1536, 3072, 64, 4, 8, 12, 1, 6.3376, "train_step_timing", 616),
    MlperfRow("3.0", "NVIDIA_CoreWeave/results/coreweave_hgxh100_n448_ngc23.04_pytorch/gpt3",
              _V30CW + "config_DGXH100_448x8x24x4x8_mbs1.sh:2-5, :16 (b 1); " + _VP30,
              3584, 2688, 24, 4, 8, 12, 1, 2.5976, "train_step_timing", 660),
    # v3.1 (Nov 2023): the 23.09 stack, Eos. The 64-node run's logged GBS 2048 = MINIBS 128 x d 16: the
    # 96x8x128 script with DGXNNODES=64 (its `${DGXNNODES:-96}`); the 64x8x192 "dryrun large" script gives 3072
    MlperfRow("3.1", "NVIDIA/results/eos_n64_ngc23.09_nemo/gpt3",
              _V31 + "config_DGXH100_96x8x128x4x8_mbs1.sh:2-5 (DGXNNODES=64 assumed), :23 (b 1); " + _VP31,
              512, 2048, 128, 4, 8, 12, 1, 11.0520, "train_step_timing", 864),
    MlperfRow("3.1", "NVIDIA/results/eos_n96_ngc23.09_nemo/gpt3",
              _V31 + "config_DGXH100_96x8x128x4x8_mbs1.sh:2-5, :23 (b 1); " + _VP31,
              768, 3072, 128, 4, 8, 12, 1, 11.0751, "train_step_timing", 600),
    MlperfRow("3.1", "NVIDIA/results/eos-dfw_n512_ngc23.09_nemo/gpt3",
              _V31 + "config_DGXH100_512x8x16x4x8_mbs1.sh" + _L31 + _VP31,
              4096, 2048, 16, 4, 8, 12, 1, 1.6088, "train_step_timing", 864),
    MlperfRow("3.1", "NVIDIA/results/eos-dfw_n768_ngc23.09_nemo/gpt3",
              _V31 + "config_DGXH100_768x8x16x4x8_mbs1.sh" + _L31 + _VP31,
              6144, 3072, 16, 4, 8, 12, 1, 1.6153, "train_step_timing", 600),
    MlperfRow("3.1", "NVIDIA/results/eos-dfw_n1024_ngc23.09_nemo/gpt3",
              _V31 + "config_DGXH100_1024x8x16x4x8_mbs1.sh" + _L31 + _VP31,
              8192, 4096, 16, 4, 8, 12, 1, 1.6193, "train_step_timing", 474),
    MlperfRow("3.1", "NVIDIA/results/eos-dfw_n1280_ngc23.09_nemo/gpt3",
              _V31 + "config_DGXH100_1280x8x8x4x8_mbs1.sh" + _L31 + _VP31,
              10240, 2560, 8, 4, 8, 12, 1, 0.9256, "train_step_timing", 690),
    MlperfRow("3.1", "NVIDIA/results/eos-dfw_n1344_ngc23.09_nemo/gpt3",
              _V31 + "config_DGXH100_1344x8x8x4x8_mbs1.sh" + _L31 + _VP31,
              10752, 2688, 8, 4, 8, 12, 1, 0.9296, "train_step_timing", 660),
    MlperfRow("3.1", "Azure+NVIDIA/results/ND_H100_v5_n1344_pytorch/gpt3",
              "Azure+NVIDIA/benchmarks/gpt3/implementations/pytorch/config_DGXH100_1344x8x8x4x8_mbs1.sh:1-4, "
              ":10 (b 1), :11 (TP_COMM_OVERLAP=True); conf/custom.yaml:62 (INTERLEAVED_PIPELINE unset: 12)",
              10752, 2688, 8, 4, 8, 12, 1, 0.9473, "train_step_timing", 660),
    # v4.0 (June 2024): the 24.04 stack, Megatron-core's GPT with TE's whole layer, FP8 parameters. The
    # 64-node run's logged GBS 2304 = MINIBS 144 x d 16 (the script's `${MINIBS:=128}` overridden)
    MlperfRow("4.0", "NVIDIA/results/eos_n64_ngc24.04_nemo/gpt3",
              _V40 + "config_DGXH100_64x8x128x4x8_mbs2.sh:4-7 (MINIBS=144 assumed), :23 (b 2), :25, "
              ":38 (INTERLEAVED_PIPELINE=4); " + _FP8P40,
              512, 2304, 72, 4, 8, 4, 2, 10.9800, "block", 70, fp8_params=True),
    MlperfRow("4.0", "NVIDIA/results/eos-dfw_n1344_ngc24.04_nemo/gpt3",
              _V40 + "config_DGXH100_1344x8x6x4x6_mbs1_cg.sh:4-7, :23 (b 1), :25, :26 (LAYER_CUDA_GRAPH=1), "
              ":36 (INTERLEAVED_PIPELINE=8); " + _FP8P40,
              10752, 2688, 6, 4, 6, 8, 1, 0.9207, "block", 66, cuda_graphs=True, fp8_params=True),
    MlperfRow("4.0", "NVIDIA/results/eos-dfw_n1452_ngc24.04_nemo/gpt3",
              _V40 + "config_DGXH100_1452x8x6x4x6_mbs1_cg.sh:4-7, :23 (b 1), :25, :26 (LAYER_CUDA_GRAPH=1), "
              ":36 (INTERLEAVED_PIPELINE=8); " + _FP8P40,
              11616, 2904, 6, 4, 6, 8, 1, 0.9217, "block", 69, cuda_graphs=True, fp8_params=True),
    # v4.0, Supermicro (closed division, NVIDIA's v4.0 code on the 24.04 stack; its smc-ac-power / smc-dc-power
    # directories hold the same three logs): the logs' config dump states the layout (VP 12: the script sets none)
    MlperfRow("4.0", "smc/results/64xSMC-H100-SXM-80GB/gpt3",
              "smc/benchmarks/gpt3/implementations/nemo/config_SMCH100_64x8x128x4x8.sh:2-5, :17; config_common.sh:21 "
              "(b 2), :74 (FP8_PARAMS=True); the logs' config dump: virtual_pipeline_model_parallel_size: 12, "
              "micro_batch_size: 2, fp8_params: true",
              512, 2048, 64, 4, 8, 12, 2, 10.7626, "block", 72, fp8_params=True),
    # v4.1 (Nov 2024): the 24.09 stack. (Its eos-dfw_n1452_ngc24.04_nemo logs carry v4.0's step times: one row)
    MlperfRow("4.1", "NVIDIA/results/eos_n32_ngc24.09_nemo/gpt3",
              _V41 + "eos_n32_ngc24.09_nemo/config_DGXH100_32x8x256x4x8_mbs2.sh:4-7, :23 (b 2), :25, "
              ":38 (INTERLEAVED_PIPELINE=6); config_common.sh:66 (FP8_PARAMS=True)",
              256, 2048, 128, 4, 8, 6, 2, 18.4103, "block", 73, fp8_params=True),
    MlperfRow("4.1", "NVIDIA/results/eos_n64_ngc24.09_nemo/gpt3",
              _V41 + "eos_n64_ngc24.09_nemo/config_DGXH100_64x8x128x4x8_mbs2.sh:4-7, :23 (b 2), :25, "
              ":38 (INTERLEAVED_PIPELINE=6); config_common.sh:66 (FP8_PARAMS=True)",
              512, 2048, 64, 4, 8, 6, 2, 9.5418, "block", 73, fp8_params=True),
    # v4.1, Oracle (BM.GPU.H100.8: eight H100 and eight 400 Gb/s RoCE links a node; the 24.09 stack); the logs'
    # config dump states every setting read here
    MlperfRow("4.1", "Oracle/results/1536xBM.GPU.H100.8/gpt3", _ORACLE + "192x8x64x4x8_mbs2.sh" + _ORACLE_LINES,
              1536, 3072, 32, 4, 8, 4, 2, 5.2343, "block", 77, fp8_params=True),
    MlperfRow("4.1", "Oracle/results/3072xBM.GPU.H100.8/gpt3", _ORACLE + "384x8x32x4x8_mbs2.sh" + _ORACLE_LINES,
              3072, 3072, 16, 4, 8, 4, 2, 3.3319, "block", 77, fp8_params=True),
)

GPT3_LAYERS, GPT3_HIDDEN, GPT3_HEADS, GPT3_SEQ = 96, 12288, 96, 2048
# the rounds whose attention ran flash-attn 1.x, and where that is read: v3.0's requirements.txt:5 pins
# flash_attn==1.0.5, and its TE (Dockerfile:47, TE_REVISION=release_v0.8) imports flash_attn_unpadded_func, the
# 1.x name (2.0 renamed it flash_attn_varlen_func), for every causal bf16 attention on sm >= 8.0
# (transformer_engine/pytorch/transformer.py:16, 461-465 at release_v0.8, read with fetch). v3.1 on installs flash-attn
# 2.0.8 (its Dockerfile) and later stacks flash-attn 2 or cuDNN: FLASH2, the default.
FLASH1_ROUNDS = {"3.0": "requirements.txt:5 (flash_attn==1.0.5), TE release_v0.8 (Dockerfile:47)"}
MLPERF_VOCAB = 50257  # the C4 SentencePiece tokenizer's size, as GPT-2's (assumed: the .model file is not stored)


def padded_vocab(tp: int) -> int:
    """NeMo's padding: make_vocab_size_divisible_by 128 (megatron_gpt_config.yaml), times t."""
    return -(-MLPERF_VOCAB // (128 * tp)) * 128 * tp


def mlperf_run(row: MlperfRow) -> PublishedRun:
    """One submission as a PublishedRun (Metric.STEP_S), planned with what its files state:

    * the model (conf/custom.yaml, v3.0's conf/megatron_gpt_config.yaml): 96 layers, h 12288, 96 heads, FFN 4h,
      s 2048 (`encoder_seq_length`), `hidden_dropout: 0.0`, `attention_dropout: 0.0`, `normalization:
      layernorm1p` (a LayerNorm), biases, GELU, learned positions, tied embeddings (NeMo's defaults, GPT-3);
    * the layout: the config's t, p, VP (model chunks a rank), micro-batch; d = gpus / (t p); SP on
      (`sequence_parallel: True`); no recomputation (`activations_checkpoint_granularity` null); Megatron's
      interleaved 1F1B with `overlap_p2p_comm: True` (OVERLAPPED messages);
    * `optim: distributed_fused_adam` (USE_DIST_OPTIMIZER=True: the optimizer states sharded, ZeRO 1) with
      `grad_sync_dtype: bf16` (bf16 gradients) and `overlap_grad_sync: True`;
    * FP8 (config_fp8.sh: FP8=True, FP8_HYBRID=True, FP8_AMAX_HISTORY=1024, "max": TE's DelayedScaling);
    * the layer: Transformer Engine's whole TransformerLayer (v3.x: NeMo's AutocastTransformerLayer, a TE
      TransformerLayer, with `transformer_engine: True` and no Megatron-core GPT; v4.x: `mcore_gpt: True` with
      `name: megatron_gpt_full_te_layer_autocast`): Workload.te_full_layer (fc1's bias gradient inside TE);
      Megatron's fused kernels and flash attention (KernelProfile.FUSED, Stack.MEGATRON, BF16_FLASH);
    * the card: DGX H100 (Eos, CoreWeave's HGX H100, Azure's ND H100 v5: eight H100 SXM5 80GB and eight 400 Gb/s
      NDR links a node; Supermicro's SYS H100 SXM; Oracle's BM.GPU.H100.8, eight 400 Gb/s RoCE links), the
      h100-80g preset, as the DGXC rows.

    * v4.x's FP8 parameters (FP8_PARAMS=True): Workload.fp8_param_gather, the distributed optimizer's parameter
      all-gather at 1 byte a parameter (round 22's term; v3.x states no FP8 parameters);
    * the attention kernel: flash-attn 1.0.5 on v3.0 (FLASH1_ROUNDS: AttentionKernel.FLASH1 at its published H100
      rates), flash-attn 2 after (FLASH2).

    Stated and not planned (the planner has no term, or round 11 / 21 left it out): userbuffers' TP overlap
    (TP_COMM_OVERLAP=True; planned synchronous as the DGXC rows, published_recipes.tp_overlap_what_if), the SM
    margins of the LayerNorm kernels (NVTE_*_LAYERNORM_SM_MARGIN 4 or 8), v4.0's per-layer CUDA graphs
    (LAYER_CUDA_GRAPH=1), v4.1's deferred embedding wgrad (DEFER_EMBEDDING_WGRAD_COMPUTE=True). Assumed: the
    vocabulary (MLPERF_VOCAB), padded as NeMo pads."""
    model = replace(gpt_model(GPT3_LAYERS, GPT3_HIDDEN, GPT3_HEADS, padded_vocab(row.tp), GPT3_SEQ),
                    dropout=0.0, attention_dropout=0.0)
    work = Workload(model, global_batch=row.gbs, seq_length=GPT3_SEQ, activations=ActivationProfile.BF16_FLASH,
                    kernels=KernelProfile.FUSED, stack=Stack.MEGATRON, fp32_grads=False, fp8=True,
                    fp8_scaling=Fp8Scaling.DELAYED, overlap_grad_reduce=True, p2p=PipelineP2P.OVERLAPPED,
                    te_full_layer=True, fp8_param_gather=row.fp8_params,
                    attention_kernel=AttentionKernel.FLASH1 if row.round in FLASH1_ROUNDS else AttentionKernel.FLASH2)
    space = SearchSpace(tp=(row.tp,), pp=(row.pp,), v=(row.vp,), micro_batch=(row.mbs,), zero=(ZeroStage.OPTIMIZER,),
                        offload=(Offload.NONE,), recompute=(Recompute.NONE,), sequence_parallel=(True,),
                        zero_bubble=(False,))
    submitter = row.results.split("/")[0]
    graphs = ", CUDA graphs" if row.cuda_graphs else ""
    name = (f"MLPerf v{row.round} {submitter} GPT-3 175B FP8, {row.gpus} H100, t{row.tp} p{row.pp} v{row.vp}, "
            f"b{row.mbs}, GBS {row.gbs}{graphs}")
    source = (f"{MLPERF_SOURCE}{row.round} at {MLPERF_COMMITS[row.round]}: {row.results}/result_*.txt "
              f"(mllog {row.how}, median of {row.samples}); {row.config}")
    if row.round in FLASH1_ROUNDS:
        source += f"; flash-attn 1: {FLASH1_ROUNDS[row.round]}"
    return PublishedRun(name, source, work, "h100-80g", row.gpus, space, Metric.STEP_S, row.step_s)


def mlperf_runs() -> list[PublishedRun]:
    """Every MLPerf GPT-3 check row (families.all_published_runs). Compared on the step time (Metric.STEP_S: no FLOP
    formula enters); each row's d x micro-batch x accumulation equals its logged global batch (checked)."""
    runs = []
    for row in MLPERF_ROWS:
        dp = row.gpus // (row.tp * row.pp)
        if dp * row.tp * row.pp != row.gpus or dp * row.mbs * row.accum != row.gbs:
            raise ValueError(f"MLPERF_ROWS {row.results}: d {dp} x b {row.mbs} x {row.accum} != GBS {row.gbs}")
        runs.append(mlperf_run(row))
    assert all(r.role is Role.CHECK for r in runs)
    return runs


def _results() -> list:
    from hybrid.planner.published_more import evaluate
    return [evaluate(r) for r in mlperf_runs()]


def _scale(gpus: int) -> str:
    return "256-768 GPUs" if gpus <= 768 else ("1,536-4,096 GPUs" if gpus <= 4096 else "6,144-11,616 GPUs")


def split_table(results: list) -> str:
    """The rows' error by round, by VP x micro-batch and by GPU count (signed mean, median |error|, spread)."""
    from hybrid.planner.published import summary
    keyed = [(key, res.error) for row, res in zip(MLPERF_ROWS, results) if res.error is not None
             for key in (f"round v{row.round}", f"VP {row.vp} ({96 // (row.pp * row.vp)} a chunk), b{row.mbs}",
                         _scale(row.gpus), "all")]
    order = sorted(dict.fromkeys(k for k, _ in keyed), key=lambda k: (k.startswith("VP"), k[0].isdigit(),
                                                                      k == "all"))
    lines = ["| rows | n | signed mean | median abs. error | spread | within ±15 % |", "|---|---|---|---|---|---|"]
    for key in order:
        s = summary([e for k, e in keyed if k == key])
        lines.append(f"| {key} | {s.rows} | {100 * s.signed_mean:+.1f} % | {100 * s.median_abs:.1f} % | "
                     f"{100 * s.low:+.1f} % to {100 * s.high:+.1f} % | {s.within_15} of {s.rows} |")
    return "\n".join(lines)


# the DGXC GPT-3 175B FP8 rows (published_recipes) that share MLPerf's model, t 4, p 8 and micro-batch 1
DGXC_GPT3_FP8 = ("DGXC 24.11.1 GPT3-175B FP8", "DGXC 25.04.01 GPT3-175B FP8")


def per_microbatch_table() -> str:
    """GPT-3 175B FP8 at t 4, p 8 on DGX H100, two NVIDIA sources: the DGXC recipes (round 11's rows) and MLPerf's
    submissions at 256-768 GPUs (d <= 24, so the DP tail is small), each row's published and planned step per
    micro-batch slot (step / accumulation), the planner's bubble and DP shares and its error."""
    from hybrid.planner.families import all_published_runs
    from hybrid.planner.layout import Cluster
    from hybrid.planner.published_more import evaluate
    from hybrid.planner.time import step_time
    runs = [r for r in all_published_runs() if r.name.startswith(DGXC_GPT3_FP8)]
    runs += [r for row, r in zip(MLPERF_ROWS, mlperf_runs()) if row.gpus <= 768]
    lines = ["| row | dropout | accumulation | published ms a micro-batch | planned ms | bubble | dp_exposed | error |",
             "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        res = evaluate(run)
        lay = res.plan.layout
        st = step_time(run.workload, Cluster(gpus=run.gpus, hw=run.hardware()), lay)
        accum = run.workload.num_microbatches(lay)
        lines.append(f"| {run.name} | {run.workload.model.dropout:g} | {accum} | "
                     f"{1000 * run.published / accum:.1f} | {1000 * st.total / accum:.1f} | "
                     f"{100 * st.term('bubble') / st.total:.1f} % | {100 * st.term('dp_exposed') / st.total:.1f} % | "
                     f"{100 * res.error:+.1f} % |")
    return "\n".join(lines)


def fp8_params_table() -> str:
    """The rows that state FP8 parameters (v4.x), planned without and with Workload.fp8_param_gather, and the
    v3.1 rows at the same scale (no FP8 parameters) for comparison."""
    from hybrid.planner.published_more import evaluate
    lines = ["| row | FP8 parameters | error, 2-byte gather | error, as stated |", "|---|---|---|---|"]
    for row, run in zip(MLPERF_ROWS, mlperf_runs()):
        if not (row.fp8_params or row.gpus >= 10240):
            continue
        stated = evaluate(run).error
        two = evaluate(replace(run, workload=replace(run.workload, fp8_param_gather=False))).error
        lines.append(f"| {run.name} | {'yes' if row.fp8_params else 'no'} | {100 * two:+.1f} % | "
                     f"{100 * stated:+.1f} % |")
    return "\n".join(lines)


def nemo2_fp8_rows(name: str) -> bool:
    """The check rows the repository plans as "FP8 through NeMo 2.0's bf16_with_fp8_mixed()" (published_recipes.
    stated's v25.04.01 Llama 3.1 and Nemotron4, published14's v25.05.05), whose plugin holds the weights in FP8
    (NeMo v2.0-v2.2 MegatronMixedPrecision: `fp8_params` -> FP8_PARAMETERS and `fp8_param_gather = True`;
    bf16_with_fp8_mixed sets `fp8_params = True` since 3e251a04, 2024-09-19). Round 22's what-if, landed in round 23
    (published_recipes.Stated.fp8_params, NEMO2_FP8_PARAMS): these rows now plan Workload.fp8_param_gather."""
    return name.startswith(("DGXC 25.04.01 Llama", "DGXC 25.04.01 Nemotron", "DGXC 25.05.05")) and " FP8" in name


def nemo2_what_if() -> str:
    """The NeMo 2.0 bf16_with_fp8_mixed rows (nemo2_fp8_rows) with 2-byte parameter gathers (round 22's plan) and
    as stated (Workload.fp8_param_gather, landed in round 23): each row."""
    from hybrid.planner.families import all_published_runs
    from hybrid.planner.published_more import evaluate
    lines = ["| row | error, 2-byte gather | error, as stated (FP8 parameter gathers) |", "|---|---|---|"]
    for run in all_published_runs():
        if nemo2_fp8_rows(run.name):
            two = evaluate(replace(run, workload=replace(run.workload, fp8_param_gather=False)))
            lines.append(f"| {run.name} | {100 * two.error:+.1f} % | {100 * evaluate(run).error:+.1f} % |")
    return "\n".join(lines)


def report(what_if: bool = False) -> str:
    """The rows' table, their split, families.py's tables of these rows alone, the per-micro-batch comparison with
    the DGXC GPT-3 rows and the FP8-parameter table (`what_if`: also the NeMo 2.0 rows' what-if)."""
    from hybrid.planner.families import family_table, plan_row, slice_table
    from hybrid.planner.published_more import table
    results = _results()
    rows = [plan_row(r.run, lambda run, res=r: res) for r in results]
    parts = [table(results), split_table(results), family_table(rows), slice_table(rows), per_microbatch_table(),
             fp8_params_table()]
    return "\n\n".join(parts + ([nemo2_what_if()] if what_if else []))


def main() -> None:
    from hybrid.cliutil import HelpFormatter, OneLineParser
    parser = OneLineParser(prog="python -m hybrid.planner.published22_mlperf", description=__doc__.split("\n\n")[0],
                           formatter_class=HelpFormatter)
    parser.add_argument("--what-if", action="store_true",
                        help="also print the NeMo 2.0 FP8 rows with 2-byte and FP8 parameter gathers (round 23)")
    print(report(parser.parse_args().what_if))


if __name__ == "__main__":
    main()
