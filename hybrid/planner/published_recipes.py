"""More published runs, CHECK rows only (issue 26, round 11): NVIDIA's DGX Cloud performance recipes on H100.

    python -m hybrid.planner.published_recipes     # the tables of docs/planner/rounds.md "Check rows, round 11"
    python -m hybrid.planner.published_recipes --readme-only   # the first pass (the README tables alone)
    python -m hybrid.planner.published_recipes --tp-overlap    # the --tp-comm-overlap what-if

Every row is a `Role.CHECK` row of published.py's `PublishedRun` type: nothing in the planner was fitted to it, and
nothing may be (tests/test_planner_recipes.py asserts the role). The rows were entered and planned before any model
code changed (round 11), and none is dropped for missing.

Source (DGXC_SOURCE): NVIDIA/dgxc-benchmarking, the "Expected Performance" tables of each pre-training recipe's
README, at two releases:

* v24.11.1 (commit 35a9aec): llama3.1/README_8b.md, README_70b.md, README_405b.md (NeMo 24.09), nemotron/
  README_15b.md, README_340b.md and nemo_megatron/README_175b.md (NeMo 24.11). Each table's header states the
  layout (TP, PP, CP, VP, MBS, GA); the 405B table states per column the layers, GBS, PP and VP (the 32-192 GPU
  columns are shortened 7 / 21 / 42-layer "proxy" models).
* v25.04.01 (commit 85380ff): llama3.1/README.md, nemotron/README.md, nemo_megatron/README_175b.md, whose layout
  tables state per row GPUs, sequence, layers, TP, PP, CP, DP, VP, MBS, GBS, GA. Two entries are read as the
  throughput row implies: GPT-3 175B at 512 GPUs has GBS "1204" in the layout table where its tokens/s (249068 =
  GBS x 2048 / 8.42 s) gives 1024; Nemotron4 340B's VP is "NA" (planner's pick).

Each table gives "Training step time (seconds per step)" on DGX H100 (80 GB) for BF16 and for FP8 at 8-2304 GPUs;
the row compares that step time (Metric.STEP_S: no FLOP formula enters). The tables are weak scaling (GBS grows with
the GPUs, the layout stays), so the rows of one table differ only in DP: a table is one configuration at up to eight
DP sizes, and the summaries say so (per table and per precision, not only in all).

Planned as published.py / published_more.py plan NeMo rows: Megatron-core with Transformer Engine (FUSED kernels,
flash attention, the Megatron stack, overlapped p2p), SP with TP, FP8 rows with Workload.fp8; and with what each
recipe's own files state (`stated`: ZeRO 1, bf16 gradients, overlapped gradient reduction, recomputation, dropout,
delayed FP8 scaling -- read at the release's commit, or for v25.04.01's gradients and optimizer measured from its
READMEs' logged memory, LOGGED_MEMORY). `--readme-only` plans the first pass: the README tables alone, the rest the
planner's picks (ZeRO 0 / 1, recomputation, fp32 gradients, current scaling). Stated but not planned: TP
communication overlap (`Stated.tp_comm_overlap`; Workload.tp_comm_overlap moves these rows away: `--tp-overlap`
prints the what-if, docs/planner/rounds.md "Round 11: causes of the misses").
Models (NeMo's configs): Llama 3.1 8B / 70B / 405B (published.py's shapes, vocabulary 128256), Nemotron-4 15B
(32 layers, h 6144, 48 heads, 8 KV heads, FFN 24576, squared ReLU, vocabulary 256000; the README's "model flops for
GBS=1 is 3.85e14" at 25.04.01 is Megatron's count of exactly these shapes) and 340B (published_more's), GPT-3 175B
(vocabulary 50257, dropout 0).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hybrid.planner.layout import Offload, PipelineP2P, PipelineSplit, Recompute, Workload, ZeroStage
from hybrid.planner.model import ActivationProfile
from hybrid.planner.ops import Fp8Scaling, KernelProfile, Stack
from hybrid.planner.published import LLAMA3_70B, LLAMA3_8B, Metric, PublishedRun, llama3_405b, llama_model
from hybrid.planner.published_more import (GPT2_VOCAB, ContextRun, Result, evaluate, nemotron_model, summary_line,
                                           table)
from hybrid.planner.reference import gpt_model
from hybrid.planner.search import SearchSpace
from models.config import ModelConfig

DGXC_SOURCE = "NVIDIA/dgxc-benchmarking recipe READMEs, 'Expected Performance' (DGX H100), training step time"
RELEASES = {"24.11.1": "35a9aec", "25.04.01": "85380ff"}  # release -> commit the rows were read at


def _models() -> dict[str, ModelConfig]:
    return {"Llama3.1-8B": llama_model(*LLAMA3_8B, 8192), "Llama3.1-70B": llama_model(*LLAMA3_70B, 8192),
            "Llama3.1-405B": llama3_405b(),
            "Nemotron4-15B": nemotron_model(32, 6144, 48, 8, 24576, 4096),
            "Nemotron4-340B": nemotron_model(96, 18432, 96, 8, 73728, 4096),
            "GPT3-175B": replace(gpt_model(96, 12288, 96, GPT2_VOCAB, 2048), dropout=0.0, attention_dropout=0.0)}


@dataclass(frozen=True)
class Stated:
    """What a recipe's own configuration states beyond the README table (None: not stated, the planner picks).

    Attributes:
        zero: ZeRO stages to try (apex / Megatron distributed_fused_adam: the optimizer states sharded, ZeRO 1).
        recompute: `activations_checkpoint_granularity` (null: none; selective: Megatron's selective).
        fp32_grads: gradients reduced in fp32 (`grad_reduce_in_fp32`; `grad_sync_dtype: bf16` is False).
        overlap_grad_reduce: `overlap_grad_sync: true` (the NeMo 1.0 YAMLs), or NeMo 2.0's Megatron-core DDP config
            `overlap_grad_reduce=True` (the v25.04.01 / v25.05.05 recipes and their comm-overlap callback at dp > 1:
            NEMO2_DDP_OVERLAP, round 23b). Workload.overlap_param_gather is the planner's default (True) on every
            table, as every recipe here states it (`overlap_param_sync: true`, `overlap_param_gather=True`).
        dropout: `hidden_dropout` (and `attention_dropout`, equal in every recipe here).
        kv_heads: `num_query_groups` where it differs from the model's.
        vp: chunks per rank where the README says NA and the launch script sets it.
        fp8_scaling: TE's recipe for FP8 rows (fp8_hybrid with an amax history of 1024: DelayedScaling).
        optimizer_dtype_bytes: apex DistributedFusedAdam's `optim.dtype` (the master copy and both moments;
            Workload.optimizer_dtype_bytes): 2 where the YAML says `dtype: bf16` (only the 340B's), else 4.
        pipeline_split: Megatron-core's split flags the layout implies (Workload.pipeline_split): v25.04.01's
            Llama 3.1 405B columns hold L + 2 = pp x v x n layers (8 + 2 at pp 1 aside: 30 + 2 = 4 x 8, 62 + 2 =
            4 x 8 x 2, 126 + 2 = 8 x 8 x 2), which Megatron-core's interleaved split only builds with
            `account_for_embedding_in_pipeline_split` and `account_for_loss_in_pipeline_split` (without them it
            needs pp v to divide L: 30 on 32 stages cannot run).
        p2p: how the pipeline's messages block: `overlap_p2p_comm: false` with `batch_p2p_comm: true` (the
            v24.11.1 Nemotron YAMLs) makes Megatron's interleaved schedule wait on each chunk's batched send / receive
            (BLOCKING); `overlap_p2p_comm: true` (the Llama 3.1 and GPT-3 YAMLs) is OVERLAPPED.
        fp8_params: the weights held in FP8, so the distributed optimizer all-gathers 1 byte a parameter
            (Workload.fp8_param_gather, round 22's term): v25.04.01's Llama 3.1 and Nemotron4 FP8 rows, whose
            bf16_with_fp8_mixed() states it (NEMO2_FP8_PARAMS, round 23), and both releases' GPT-3 175B FP8 rows,
            whose hydra YAML states `fp8_params: true` (GPT3_FP8_PARAMS, round 23b). Off on every other table (its
            recipe does not state it); FP8 rows only (a BF16 run holds no FP8 weights).
        tp_comm_overlap: `ub_tp_comm_overlap` (v24.11.1's YAMLs, the GPT-3 hydra YAML) or the NeMo 2.0 script
            setting the comm-overlap callback's `tp_comm_overlap_cfg` (v25.04.01's Llama 70B / 405B and Nemotron).
            Recorded, not planned: with Workload.tp_comm_overlap these rows move away (tp_overlap_what_if,
            docs/planner/rounds.md "Round 11: causes of the misses").
        where: the file each setting was read from.
    """

    zero: tuple = (ZeroStage.NONE, ZeroStage.OPTIMIZER)
    recompute: tuple | None = None
    fp32_grads: bool = True
    overlap_grad_reduce: bool = False
    dropout: float | None = None
    kv_heads: int | None = None
    vp: int | None = None
    fp8_scaling: Fp8Scaling = Fp8Scaling.CURRENT
    optimizer_dtype_bytes: int = 4
    pipeline_split: PipelineSplit | None = None
    p2p: PipelineP2P = PipelineP2P.OVERLAPPED
    tp_comm_overlap: bool = False
    fp8_params: bool = False
    where: str = ""


@dataclass(frozen=True)
class Table:
    """One README table: a model at one layout and precision, weak-scaled over `columns`.

    Attributes:
        release: the dgxc-benchmarking release (RELEASES) and `file` the README it was read from.
        container: the NeMo container the table names (or the release's).
        model: a key of _models(); precision "BF16" or "FP8".
        seq, tp, pp, cp, vp, mbs: the stated layout (vp 0: not stated, the planner picks).
        columns: (GPUs, GBS, step s[, layers, pp, vp]) as published; the optional three override the header's
            (the 405B tables' proxy columns).
    """

    release: str
    file: str
    container: str
    model: str
    precision: str
    seq: int
    tp: int
    pp: int
    cp: int
    vp: int
    mbs: int
    columns: tuple


# fmt: the tables as printed (GPUs, GBS, step s); for the 405B (GPUs, GBS, step s, layers, PP, VP)
_L8 = ((8, 128), (16, 256), (32, 512), (64, 1024), (128, 2048))
_L70 = ((64, 128), (128, 256), (256, 512), (512, 1024), (1024, 2048), (2048, 4096))
_N15 = ((16, 64), (32, 128), (64, 256), (128, 512), (256, 1024), (512, 2048), (1024, 4096), (2048, 8192))
_N340 = ((128, 32), (256, 64), (512, 128), (1024, 256), (2048, 512))
_G175 = ((128, 256), (256, 512), (512, 1024), (1024, 2048), (2048, 4096))


def _cols(shape: tuple, steps: tuple) -> tuple:
    return tuple((g, b, s) for (g, b), s in zip(shape, steps, strict=True))


_L405_2411 = ((32, 126, 7, 1, 1), (96, 126, 21, 3, 7), (192, 252, 42, 3, 7), (576, 252, 126, 9, 7),
              (1152, 504, 126, 9, 7), (2304, 1008, 126, 9, 7))
_L405_2504 = ((32, 64, 8, 1, 1), (64, 64, 30, 4, 8), (128, 128, 62, 4, 8), (512, 256, 126, 8, 8),
              (1024, 512, 126, 8, 8), (2048, 1024, 126, 8, 8))


def _cols405(shape: tuple, steps: tuple) -> tuple:
    return tuple((g, b, s, layers, pp, vp) for (g, b, layers, pp, vp), s in zip(shape, steps, strict=True))


TABLES = (
    Table("24.11.1", "llama3.1/README_8b.md", "24.09", "Llama3.1-8B", "BF16", 8192, 1, 1, 2, 1, 1,
          _cols(_L8, (12.91, 13.00, 13.05, 13.08, 13.10))),
    Table("24.11.1", "llama3.1/README_8b.md", "24.09", "Llama3.1-8B", "FP8", 8192, 1, 1, 2, 1, 1,
          _cols(_L8, (9.67, 9.73, 9.75, 9.80, 9.82))),
    Table("24.11.1", "llama3.1/README_70b.md", "24.09", "Llama3.1-70B", "BF16", 8192, 4, 4, 2, 5, 1,
          _cols(_L70, (14.72, 14.73, 14.8, 14.89, 14.92, 14.98))),
    Table("24.11.1", "llama3.1/README_70b.md", "24.09", "Llama3.1-70B", "FP8", 8192, 4, 4, 2, 5, 1,
          _cols(_L70, (11.01, 10.93, 11.16, 11.18, 11.28, 11.39))),
    Table("24.11.1", "llama3.1/README_405b.md", "24.09", "Llama3.1-405B", "BF16", 8192, 8, 9, 2, 7, 1,
          _cols405(_L405_2411, (8.85, 8.75, 16.93, 17.20, 17.52, 17.62))),  # 96 GPUs printed "8.7  5"
    Table("24.11.1", "llama3.1/README_405b.md", "24.09", "Llama3.1-405B", "FP8", 8192, 8, 9, 2, 7, 1,
          _cols405(_L405_2411, (5.80, 5.71, 11.00, 11.24, 11.31, 12.35))),
    Table("24.11.1", "nemotron/README_15b.md", "24.11", "Nemotron4-15B", "BF16", 4096, 4, 1, 1, 1, 4,
          _cols(_N15, (2.83, 2.86, 2.86, 2.89, 2.88, 2.92, 2.92, 2.96))),
    Table("24.11.1", "nemotron/README_15b.md", "24.11", "Nemotron4-15B", "FP8", 4096, 4, 1, 1, 1, 4,
          _cols(_N15, (2.08, 2.07, 2.09, 2.08, 2.1, 2.12, 2.12, 2.18))),
    Table("24.11.1", "nemotron/README_340b.md", "24.11", "Nemotron4-340B", "BF16", 4096, 8, 8, 1, 12, 1,
          _cols(_N340, (4.61, 4.67, 4.7, 4.73, 4.84))),
    Table("24.11.1", "nemotron/README_340b.md", "24.11", "Nemotron4-340B", "FP8", 4096, 8, 8, 1, 12, 1,
          _cols(_N340, (3.16, 3.21, 3.26, 3.34, 3.49))),
    Table("24.11.1", "nemo_megatron/README_175b.md", "24.11", "GPT3-175B", "BF16", 2048, 4, 8, 1, 12, 1,
          _cols(_G175, (8.91, 8.95, 9.09, 9.01, 9.02))),
    Table("24.11.1", "nemo_megatron/README_175b.md", "24.11", "GPT3-175B", "FP8", 2048, 4, 8, 1, 12, 1,
          _cols(_G175, (5.92, 5.96, 6.44, 6.72, 6.24))),
    Table("25.04.01", "llama3.1/README.md", "25.04.01", "Llama3.1-8B", "BF16", 8192, 1, 1, 2, 1, 1,
          _cols(_L8, (12.27, 12.3, 12.32, 12.33, 12.33))),
    Table("25.04.01", "llama3.1/README.md", "25.04.01", "Llama3.1-8B", "FP8", 8192, 1, 1, 2, 1, 1,
          _cols(_L8, (9.33, 9.36, 9.43, 9.48, 9.54))),
    Table("25.04.01", "llama3.1/README.md", "25.04.01", "Llama3.1-70B", "BF16", 8192, 4, 4, 2, 5, 1,
          _cols(_L70, (14.66, 14.67, 14.68, 14.67, 14.65, 14.66))),
    Table("25.04.01", "llama3.1/README.md", "25.04.01", "Llama3.1-70B", "FP8", 8192, 4, 8, 1, 5, 1,
          _cols(_L70, (9.86, 9.95, 10, 10.07, 10.08, 10.15))),
    Table("25.04.01", "llama3.1/README.md", "25.04.01", "Llama3.1-405B", "BF16", 8192, 8, 8, 2, 8, 1,
          _cols405(_L405_2504, (5.4, 10.1, 19.62, 19.78, 19.84, 19.87))),
    Table("25.04.01", "llama3.1/README.md", "25.04.01", "Llama3.1-405B", "FP8", 8192, 8, 8, 2, 8, 1,
          _cols405(_L405_2504, (3.53, 6.32, 12.18, 12.37, 12.42, 12.56))),
    Table("25.04.01", "nemotron/README.md", "25.04.01", "Nemotron4-15B", "BF16", 4096, 2, 1, 1, 1, 2,
          _cols(_N15, (2.66, 2.66, 2.67, 2.67, 2.68, 2.71, 2.74, 2.78))),
    Table("25.04.01", "nemotron/README.md", "25.04.01", "Nemotron4-15B", "FP8", 4096, 2, 1, 1, 1, 2,
          _cols(_N15, (1.98, 1.98, 1.98, 1.99, 2, 2.02, 2.03, 2.09))),
    Table("25.04.01", "nemotron/README.md", "25.04.01", "Nemotron4-340B", "BF16", 4096, 8, 8, 1, 0, 1,
          _cols(_N340[1:], (4.36, 4.39, 4.41, 4.43))),
    Table("25.04.01", "nemotron/README.md", "25.04.01", "Nemotron4-340B", "FP8", 4096, 8, 8, 1, 0, 1,
          _cols(_N340[1:], (2.93, 2.97, 3, 3.05))),
    Table("25.04.01", "nemo_megatron/README_175b.md", "25.04.01", "GPT3-175B", "BF16", 2048, 4, 8, 1, 6, 1,
          _cols(_G175, (8.309, 8.408, 8.42, 8.453, 8.49))),
    Table("25.04.01", "nemo_megatron/README_175b.md", "25.04.01", "GPT3-175B", "FP8", 2048, 4, 8, 1, 6, 1,
          _cols(_G175, (5.626, 5.725, 5.774, 5.82, 5.96))),
)


# Round 23: which FP8 rows hold their weights in FP8 (Workload.fp8_param_gather), each row's NeMo read at the commit
# it ran. v25.04.01's llama3.1/ and nemotron/ setup.sh pin NEMO_COMMIT d2b21556 (2025-03-20), shipped into the
# nemo:25.02.01 container (NeMo 2.2.x) by nemo-run's GitArchivePackager (scripts/performance/utils.py:102); their
# scripts (pretrain_llama31.py:129-131, scripts/performance/llm/pretrain_nemotron4_*.py) set
# `recipe.trainer.plugins = bf16_with_fp8_mixed()` for FP8. At d2b21556, bf16_with_fp8_mixed sets
# `cfg.fp8_params = True` (nemo/collections/llm/recipes/precision/mixed_precision.py:53, since 3e251a04,
# 2024-09-19), and MegatronMixedPrecision turns it into TE's FP8GlobalStateManager.FP8_PARAMETERS = True (the
# weights built as Float8Tensors) and `fp8_param_gather = True` (nemo/lightning/pytorch/plugins/
# mixed_precision.py:121-131), copied onto Megatron-core's DDP config (update_config_with_dtype_overrides, :266):
# its parameter buffer holds the FP8 weights as uint8, so the all-gather after each step moves 1 byte a parameter.
# v25.05.05 (published14) runs NeMo 6f2c6fd (Llama) / b4148d2 (Nemotron), June 2025, containers 25.04.01 / 25.04.00
# (NeMo 2.3): bf16_with_fp8_mixed sets `cfg.fp8_param_gather = True` directly (mixed_precision.py:70, 9d4e41e5's
# form, 2025-04-10), the default `--fp8_recipe ds` (scripts/performance/utils.py:427-430). Every one of these rows
# ran code newer than 3e251a04. NVIDIA/NeMo and NVIDIA/dgxc-benchmarking read with `fetch`.
NEMO2_FP8_PARAMS = ("v25.04.01 setup.sh NEMO_COMMIT d2b21556: bf16_with_fp8_mixed `fp8_params = True` "
                    "(recipes/precision/mixed_precision.py:53, 3e251a04 2024-09-19) -> FP8_PARAMETERS and "
                    "`fp8_param_gather = True` (lightning/pytorch/plugins/mixed_precision.py:121-131)")
# Set (round 23b: a published row is planned as it ran): the GPT-3 175B hydra YAML (v24.11.1 nemo_megatron/
# gpt3_175b_hydra.yaml:221 at 35a9aec, v25.04.01 nemo_megatron/cfg/gpt3_175b_hydra.yaml:221 at 85380ff) states
# `fp8_params: true`; launch.sh overrides only `model.fp8=${FP8_ENABLED}` (35a9aec launch.sh:67, 85380ff
# configure.sh:83), so the FP8 rows run it. NeMo 1.0's megatron_gpt_model builds the model under TE's fp8_model_init
# when fp8 and fp8_params (containers 24.05 / 24.12: NeMo v2.0.0rc0 megatron_gpt_model.py:339-340, v2.1.0 :396-397)
# and distributed_adam.py all-gathers the Float8Tensor buckets as uint8 (v2.0.0rc0 :217-229, v2.1.0 :283-295), the
# MLPerf v4.x path of round 22. It moves the 10 FP8 rows 1.1-1.4 points further optimistic (round23-fp8-dp.md).
GPT3_FP8_PARAMS = ("gpt3_175b_hydra.yaml:221 `fp8_params: true` -> NeMo 1.0 megatron_gpt_model.py fp8_model_init "
                   "(v2.0.0rc0 :339-340, v2.1.0 :396-397), distributed_adam.py uint8 parameter buckets")
# Round 23b: every NeMo 2.0 row (v25.04.01: NeMo d2b21556; v25.05.05: 6f2c6fd / b4148d2) builds Megatron-core's DDP
# with `overlap_grad_reduce=True, overlap_param_gather=True` (nemo/collections/llm/recipes/llama3_8b.py:115-122,
# llama3_70b.py:115-122, llama31_405b.py:123-130, nemotron.py:128-135 at d2b21556; llama31_405b.py:123-130 at
# 6f2c6fd, nemotron.py:128-135 at b4148d2), the recipes the DGXC scripts call with performance_mode=True
# (dgxc-benchmarking 85380ff llama3.1/pretrain_llama31.py:73,76,89; NeMo's scripts/performance/llm/
# pretrain_nemotron4_15b.py:54 and _340b.py:56 at d2b21556, :58 and :62 at b4148d2; pretrain_llama31_405b.py:65 at
# 6f2c6fd). performance_mode adds MegatronCommOverlapCallback, which at dp > 1 with the distributed optimizer sets
# the same two flags again, `bucket_size = 128 * 1024 * 1024` parameters and, at pp > 1 with vp > 1,
# `align_param_gather` (nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py:185-192, applied :272-283 at
# d2b21556, :274-285 at 6f2c6fd; _get_optimizer_overlap_cfgs is the same at d2b21556, 6f2c6fd, b4148d2 and NeMo
# v2.2.0-v2.3.1, the containers' NeMo -- the launchers ship no code: llama31_utils.py:109 and
# scripts/performance/utils.py:137 `packager=run.Packager()`). No DGXC script, patch or launch.sh overrides them.
# NeMo's scripts/performance/utils.py also sets the callback's `overlap_param_gather_with_optimizer_step` at dp > 1,
# pp > 1, vp > 1 (d2b21556 :229-233, 6f2c6fd :365-371; unset only when checkpointing, which these runs do not).
# Planned: Workload.overlap_grad_reduce (the last bucket and what does not fit under the last backward exposed:
# time._dp_step_seconds) and overlap_param_gather (already the default). Not planned (no planner term, no constant
# changed): the 128 Mi-parameter buckets (the planner's are 25 MiB, predicted_comm.BUCKET_BYTES), align_param_gather
# and the gather's overlap with the optimizer step.
NEMO2_DDP_OVERLAP = ("NeMo 2.0 recipe DistributedDataParallelConfig(overlap_grad_reduce=True, overlap_param_gather="
                     "True) (llama3_8b.py:115-122, llama3_70b.py:115-122, llama31_405b.py:123-130, nemotron.py:128-135 "
                     "at d2b21556) and MegatronCommOverlapCallback at dp > 1 (megatron_comm_overlap.py:185-192)")


README_ONLY = Stated(fp32_grads=True)  # the first pass (round 11): the README's table alone, the rest picked
_YAML_2411 = {"Llama3.1-8B": "llama3.1/llama3.1_8b.yaml", "Llama3.1-70B": "llama3.1/llama3.1_70b.yaml",
              "Llama3.1-405B": "llama3.1/llama3.1_405b.yaml", "Nemotron4-15B": "nemotron/nemotron4-15b-synth.yaml",
              "Nemotron4-340B": "nemotron/nemotron4-340b-synth.yaml",
              "GPT3-175B": "nemo_megatron/gpt3_175b_hydra.yaml"}


def stated(t: Table) -> Stated:
    """What the recipe's own files state for a table (read at the release's commit):

    * the v24.11.1 YAMLs (NeMo 1.0 hydra configs, _YAML_2411) and v25.04.01's nemo_megatron/cfg/gpt3_175b_hydra.yaml:
      `optim: distributed_fused_adam` (ZeRO 1), `grad_sync_dtype: bf16`, `overlap_grad_sync: true`,
      `activations_checkpoint_granularity` null (selective for Nemotron4 340B), `hidden_dropout` / `attention_dropout`
      0.0 (0.1 for GPT-3 175B), `num_query_groups: 16` in the 405B's file, `optim.dtype: bf16` in the 340B's
      (apex DistributedFusedAdam's optimizer-state dtype: bf16 master copy and moments), `overlap_p2p_comm:
      False` with `batch_p2p_comm: True` in the Nemotron files (blocking pipeline messages), `fp8_hybrid` with
      `fp8_amax_history_len: 1024` (TE's DelayedScaling);
    * v25.04.01's Llama 3.1 (NeMo 2.0 scripts, llama3.1/pretrain_llama31.py): FP8 through NeMo's
      bf16_with_fp8_mixed() (hybrid, amax history 1024: delayed) with `grad_reduce_in_fp32 = False`; bf16 gradients
      and the distributed optimizer in BF16 too, by the README's logged memory (LOGGED_MEMORY); v25.04.01's
      Nemotron4: its launch.sh sets VP 12 for the 340B (the README says NA), FP8 through the same
      bf16_with_fp8_mixed(), bf16 gradients and the distributed optimizer by its README's logged memory; nothing
      else of NeMo's recipe defaults was read (recomputation, dropout 0 assumed as NeMo's Llama / Nemotron configs):
      the planner picks.
    """
    delayed = Fp8Scaling.DELAYED
    if t.release == "24.11.1" or t.model == "GPT3-175B":
        where = (f"{_YAML_2411[t.model]} at {RELEASES[t.release]}" if t.release == "24.11.1"
                 else f"nemo_megatron/cfg/gpt3_175b_hydra.yaml at {RELEASES[t.release]}")
        return Stated(zero=(ZeroStage.OPTIMIZER,), fp32_grads=False, overlap_grad_reduce=True,
                      recompute=(Recompute.SELECTIVE if t.model == "Nemotron4-340B" else Recompute.NONE,),
                      dropout=0.1 if t.model == "GPT3-175B" else 0.0,
                      kv_heads=16 if t.model == "Llama3.1-405B" else None, fp8_scaling=delayed,
                      optimizer_dtype_bytes=2 if t.model == "Nemotron4-340B" else 4,
                      p2p=PipelineP2P.BLOCKING if t.model.startswith("Nemotron") else PipelineP2P.OVERLAPPED,
                      tp_comm_overlap=t.model not in ("Nemotron4-340B", "Llama3.1-8B"),
                      fp8_params=t.model == "GPT3-175B",
                      where=f"{where}; {GPT3_FP8_PARAMS}" if t.model == "GPT3-175B" else where)
    # v25.04.01: bf16 gradients and the distributed optimizer, by the READMEs' own log lines (LOGGED_MEMORY)
    if t.model.startswith("Llama"):
        split = PipelineSplit(embedding=True, loss=True) if t.model == "Llama3.1-405B" else None
        return Stated(zero=(ZeroStage.OPTIMIZER,), fp32_grads=False, overlap_grad_reduce=True, fp8_scaling=delayed,
                      pipeline_split=split, tp_comm_overlap=t.model != "Llama3.1-8B", fp8_params=True,
                      where=f"llama3.1/pretrain_llama31.py, README.md's log line at {RELEASES[t.release]}; "
                            f"{NEMO2_FP8_PARAMS}; {NEMO2_DDP_OVERLAP}")
    return Stated(zero=(ZeroStage.OPTIMIZER,), fp32_grads=False, overlap_grad_reduce=True,
                  vp=12 if t.model == "Nemotron4-340B" else None, fp8_scaling=delayed, tp_comm_overlap=True,
                  fp8_params=True,
                  where=f"nemotron/launch.sh, gsw_nemo.patch, README.md's log line at {RELEASES[t.release]}; "
                        f"{NEMO2_FP8_PARAMS}; {NEMO2_DDP_OVERLAP}")


# The v25.04.01 READMEs' example log lines (BF16: their step times are the 8-GPU 8B's and the 64-GPU 15B's):
# (model, GPUs, GBS, step s logged, memory_allocated bytes, peak_memory_usage bytes). memory_allocated after a step
# is what stays -- weights, gradients, optimizer states: (2 + 2 + 12 / (dp x cp)) x the rank's parameters is
# 44.2 GB for the 8B (8.03e9 parameters, dp x cp 8) and 34.1 GB for the 15B (7.8e9 a TP rank, dp 32), where fp32
# gradients would give 60.3 and 49.7 GB and an unsharded optimizer 112 and 125: so bf16 gradients and the
# distributed optimizer, whatever NeMo's bf16_mixed() default says (grad_reduce_in_fp32=True).
LOGGED_MEMORY = (("Llama3.1-8B", 8, 128, 12.39, 44271689728, 70833405952),
                 ("Nemotron4-15B", 64, 256, 2.693, 34466545664, 72972500992))


def _run(t: Table, column: tuple, readme_only: bool = False) -> PublishedRun:
    """One column of a table as a PublishedRun (a ContextRun where CP > 1), with what its recipe states (Stated) or,
    `readme_only`, the README's table alone (README_ONLY: the first pass)."""
    gpus, gbs, step = column[:3]
    layers, pp, vp = column[3:] if len(column) > 3 else (None, t.pp, t.vp)
    known = README_ONLY if readme_only else stated(t)
    vp = known.vp or vp
    cfg = _models()[t.model]
    if layers is not None:
        cfg = replace(cfg, num_layers=layers)
    if known.dropout is not None:
        cfg = replace(cfg, dropout=known.dropout, attention_dropout=known.dropout)
    if known.kv_heads is not None:
        cfg = replace(cfg, num_kv_heads=known.kv_heads)
    cfg = replace(cfg, max_position_embeddings=max(t.seq, cfg.max_position_embeddings))
    fp8 = t.precision == "FP8"
    work = Workload(cfg, global_batch=gbs, seq_length=t.seq, activations=ActivationProfile.BF16_FLASH,
                    kernels=KernelProfile.FUSED, stack=Stack.MEGATRON, fp32_grads=known.fp32_grads, fp8=fp8,
                    fp8_scaling=known.fp8_scaling if fp8 else Fp8Scaling.CURRENT,
                    overlap_grad_reduce=known.overlap_grad_reduce,
                    optimizer_dtype_bytes=known.optimizer_dtype_bytes,
                    pipeline_split=known.pipeline_split if pp > 1 else None, p2p=known.p2p,
                    fp8_param_gather=fp8 and known.fp8_params)
    # tp_comm_overlap: a what-if (tp_overlap_what_if)
    space = SearchSpace(tp=(t.tp,), pp=(pp,), v=(vp,) if vp else None, micro_batch=(t.mbs,), zero=known.zero,
                        offload=(Offload.NONE,), recompute=known.recompute, sequence_parallel=(t.tp > 1,),
                        zero_bubble=(False,))
    parts = [f"t{t.tp}", f"p{pp}"] + ([f"cp{t.cp}"] if t.cp > 1 else []) + ([f"v{vp}"] if vp > 1 else [])
    proxy = f" ({layers} layers)" if layers is not None and layers != 126 else ""
    name = (f"DGXC {t.release} {t.model}{proxy} {t.precision}, {gpus} H100, {' '.join(parts)}, b{t.mbs}, "
            f"GBS {gbs}")
    source = f"{DGXC_SOURCE}: {t.file} at {RELEASES[t.release]} (release v{t.release}, NeMo {t.container})"
    if t.cp > 1:
        return ContextRun(name, source, work, "h100-80g", gpus, space, Metric.STEP_S, step, cp=t.cp)
    return PublishedRun(name, source, work, "h100-80g", gpus, space, Metric.STEP_S, step)


def table_runs(t: Table, readme_only: bool = False) -> list[PublishedRun]:
    return [_run(t, c, readme_only) for c in t.columns]


def recipe_runs(readme_only: bool = False) -> list[PublishedRun]:
    """Every round-11 check row, table by table."""
    return [run for t in TABLES for run in table_runs(t, readme_only)]


def _label(t: Table) -> str:
    return f"DGXC {t.release} {t.model} {t.precision}"


def report(results_by_table: list[tuple[Table, list[Result]]]) -> str:
    """Each table's rows and summary line, then one line per precision, per release and for all."""
    out = []
    for t, results in results_by_table:
        out.append(f"#### {_label(t)} (t{t.tp} p{t.pp} cp{t.cp}, {t.file})\n\n{table(results)}\n\n"
                   f"{summary_line(_label(t), results)}\n")
    every = [r for _, rs in results_by_table for r in rs]
    for what, keep in (("BF16", lambda t: t.precision == "BF16"), ("FP8", lambda t: t.precision == "FP8"),
                       ("release 24.11.1", lambda t: t.release == "24.11.1"),
                       ("release 25.04.01", lambda t: t.release == "25.04.01")):
        out.append(summary_line(f"round-11 {what} rows", [r for t, rs in results_by_table if keep(t) for r in rs]))
    out.append(summary_line("all round-11 check rows", every))
    # one number a table (its smallest-GPU column): the configurations, not the DP sizes, counted once
    firsts = [rs[0] for _, rs in results_by_table]
    out.append(summary_line("round-11 tables, smallest-GPU column of each", firsts))
    return "\n".join(out)


def tp_overlap_what_if() -> str:
    """The rows whose recipes state TP communication overlap (Stated.tp_comm_overlap) and Megatron-Core's weak
    scaling (`--tp-comm-overlap` stated), planned with and without Workload.tp_comm_overlap (time._tp_overlapped):
    each group's summary line both ways. A what-if that reads the model, never a fit."""
    from hybrid.planner.published_more import mcore_weak_runs

    def both(what: str, runs: list[PublishedRun]) -> list[str]:
        on = [replace(r, workload=replace(r.workload, tp_comm_overlap=True)) for r in runs]
        return [summary_line(f"{what}, TP synchronous", [evaluate(r) for r in runs]),
                summary_line(f"{what}, --tp-comm-overlap", [evaluate(r) for r in on])]
    stating = [r for t in TABLES if stated(t).tp_comm_overlap and t.tp > 1 for r in table_runs(t)]
    return "\n".join(both("round-11 rows stating TP overlap", stating)
                     + both("Megatron-Core weak scaling (t > 1)", [r for r in mcore_weak_runs()
                                                                    if r.space.tp != (1,)]))


def evaluate_all(readme_only: bool = False) -> list[tuple[Table, list[Result]]]:
    return [(t, [evaluate(run) for run in table_runs(t, readme_only)]) for t in TABLES]


def main() -> None:
    import sys
    if sys.argv[1:] == ["--tp-overlap"]:
        print(tp_overlap_what_if())
        return
    print(report(evaluate_all(readme_only=sys.argv[1:] == ["--readme-only"])))


if __name__ == "__main__":
    main()
