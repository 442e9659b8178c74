"""Published runs new to the repository, CHECK rows only (issue 26, round 14): the model as it stood, unchanged.

    python -m hybrid.planner.published14        # the tables of docs/planner/rounds.md "Round 14: new check rows"
    python -m hybrid.planner.published14 --explain   # each miss's step in --explain's terms (the same section)
    python -m hybrid.planner.published14 --causes    # the what-ifs that read the misses (the same section)

Every row is a `Role.CHECK` row of published.py's `PublishedRun` type, entered and planned before anything was
read off its error; nothing in the planner was fitted to it and nothing may be (tests/test_planner_published14.py
asserts the role and holds the table as a ratchet). None repeats a row of published.py, published_more.py or
published_recipes.py: where a release reprints a table the repository already holds with the same step times
(v25.02.02's Nemotron4 340B = v24.11.1's, its GPT-3 175B = v25.04.01's) the table is left out.

Sources, each read at the commit named:

* NVIDIA/dgxc-benchmarking release v25.02.02 (commit 5f23b67, GSW 25.02; the NeMo 24.12 container for Llama 3.1
  and Nemotron4 15B: llama3.1/launch.sh and nemotron/launch.sh `FW_VERSION=24.12`): llama3.1/README_8b.md,
  README_70b.md, README_405b.md and nemotron/README_15b.md "Expected Performance" tables, DGX H100, BF16 and FP8,
  the layout in each table's header (the 405B's per column: layers, GBS, PP, VP). Training step time.
  Settings: llama3.1/llama3.1_{8b,70b,405b}.yaml are byte-identical to v24.11.1's (`git diff v24.11.1 v25.02.02`
  shows no change), so published_recipes.stated's v24.11.1 reading holds for them (distributed_fused_adam: ZeRO 1,
  `grad_sync_dtype: bf16`, `overlap_grad_sync`, no recomputation, dropout 0, 16 query groups for the 405B, FP8
  `fp8_hybrid` with amax history 1024: delayed). nemotron/nemotron4-15b-synth.yaml changed: `optim.name:
  mcore_distributed_optim` (ZeRO 1) and no `grad_sync_dtype`, which NeMo's megatron_base_model.py
  (setup_mcore_distributed_parallel: `grad_reduce_in_fp32=(cfg.optim.get('grad_sync_dtype', 'fp32') == 'fp32')`)
  makes fp32 gradient reduction; `overlap_grad_sync: True`, `activations_checkpoint_granularity: null`, dropout 0,
  `ub_tp_comm_overlap: True` (recorded, planned synchronous as round 11 plans it).
* NVIDIA/dgxc-benchmarking release v25.05.05 (commit c5c765f; NeMo containers 25.04.01 for Llama 3.1 and 25.04.00
  for Nemotron4, each launch.sh's `FW_VERSION`, where v25.04.01's rows ran 25.02.01): llama3.1/README.md and
  nemotron/README.md "H100 Performance", one column each -- Llama 3.1 405B on 512 GPUs (t8 p8 cp2 v8, MBS 1, GBS
  256), Nemotron4 15B on 16 (t2 p1, MBS 2, GBS 64), Nemotron4 340B on 256 (t8 p8 v12, MBS 1, GBS 64), BF16 and FP8,
  the mean step of iterations 11-44. Both launch NeMo's scripts/performance recipes (`python3 -m
  scripts.performance.llm.pretrain_llama31_405b ...`), as v25.04.01 does: published_recipes.stated's v25.04.01
  reading is planned (bf16 gradients -- the recipes' set_primary_perf_configs sets `grad_reduce_in_fp32 = False  #
  bf16 grad dtype` -- ZeRO 1, FP8 through bf16_with_fp8_mixed(), delayed; Megatron-core's embedding / loss pipeline
  split for the 405B; VP 12 for the 340B, now in the README's own table). Not re-read file by file at this
  release's containers, but for the FP8 weights (round 23, NEMO2505_FP8_PARAMS): the FP8 rows hold them and
  all-gather 1 byte a parameter (Workload.fp8_param_gather), as v25.04.01's do (published_recipes.NEMO2_FP8_PARAMS);
  and the DP overlap (round 23b, NEMO2505_DDP_OVERLAP): Megatron-core's DDP overlaps the gradient reduce-scatter
  with the last backward (Workload.overlap_grad_reduce), as v25.04.01's does (published_recipes.NEMO2_DDP_OVERLAP).
* pytorch/torchtitan benchmarks/llama3_8b_h200_2025-06_torchtitan.md (commit bcdeaa3; the same table in
  llama3_8b_h200_2025-06_torchtitan_trainy_whitefiber.md at b3eec1e): Trainy's Llama 3.1 8B on 4 and 8 hosts of
  8 H200 (400 Gb/s a GPU), torchtitan e7c0cae's llama3_8b.toml (s 8192, FSDP over every rank, selective
  activation checkpointing by op) with `--training.local_batch_size=2 --training.compile --model.converters=float8
  --float8.enable_fsdp_float8_all_gather --float8.precompute_float8_dynamic_scale_for_fsdp`; TPS a GPU and memory
  at iteration 100. Planned as published.py plans torchtitan's H100 rows (FSDP2 = ZeRO 3, --stack pytorch,
  torch.compile = FUSED, Float8 = --fp8) on the h200 preset, and the loss compiled (round 19): at e7c0cae
  `--training.compile` also compiles the loss (torchtitan/components/loss.py, build_cross_entropy_loss:
  `torch.compile(cross_entropy_loss)`, the fp32 upcast inside it), which keeps the bf16 logits and a logsumexp a
  token rather than fp32 copies -- Workload.fused_cross_entropy, memory only (Dec 2024's 9dec370 ran it eager:
  train.py, "compiling loss function causes CUDA errors, turning off for now"). Not modelled: the float8
  all-gather (FSDP moves 1-byte weights, the planner 2-byte ones) and `force_recompute_fp8_weight_in_bwd`
  (deprecated in the run's torchao 0afa4c1: its config warns, the linear does not read it).

* pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (commit 2887250, June 2025) and the
  table it shows, assets/images/async-tp-perf-06-14-2025.png (added at 5ecb74e; read off the image): the PyTorch
  team's Llama 3.1 70B on 256 and 8B on 64 of Grand Teton's 500 W 96 GB H100s (the h100-96g-500w preset, as the
  Dec 2024 rows), torchtitan 820504e with torch 38410cf9. 70B: FSDP 32 x TP 8, local batch 16, full AC; 8B: FSDP 8
  x TP 8, local batch 12, per-op SAC; both torch.compile, s 8192 (the tomls'), "Average TPS" a GPU, vanilla and async
  TP, bf16 and float8 tensorwise (the float8 rowwise rows are left out: the page calls their vanilla baseline's
  low number a bug under repair, pytorch/torchtitan issue 1207, and the planner has no rowwise scaling). Async TP
  (`--parallelism.enable_async_tensor_parallel`) is planned with Workload.tp_comm_overlap, the planner's TP
  collectives under their pass's GEMMs; its rows are summarised apart from the vanilla ones.
* pytorch/torchtitan docs/performance.md at d4c86e3 (Dec 2024), Table 4's "2D + AsyncTP" row (876 TPS a GPU, 67.6
  GiB): the configuration of published.py's 829-TPS row with async TP, which published.py left out while async TP
  had no model; planned as the June 2025 async rows.
* NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md at 067f987 (the file round 7 read three rows
  from, BRIDGE_ROWS): the DGX-H100 dense pre-training rows of the containers round 7 left out -- 25.11 (lines
  589-591: Llama 3 8B on 8 GPUs with FSDP, Llama 3 70B t4 p8 v5 GBS 128, Llama 3.1 405B t8 p8 cp2 v8 GBS 512;
  "FP8-CS", current scaling), 26.02 (lines 489, 501), 26.02.01 (405), 26.04 (308) and 26.06 (106): Llama 3 70B t4
  p8 v5 GBS 256 and Llama 3.1 405B t8 p8 cp2 v8 GBS 1536 ("FP8", its recipe not named: planned as round 7 plans
  26.04.01's, current scaling). Tokens/s a GPU. Planned exactly as published.py (the 8B's FSDP as ZeRO 3) and
  published_more._nemo plan the same tables' other containers: Megatron-core + TE, ZeRO 0 / 1 and recomputation
  the planner's (not stated).

Looked at and not added (docs/planner/rounds.md "Round 14: new check rows" says why): later dgxc-benchmarking releases
(v25.07 on) print no H100 tables; its MoE (Grok 1, DeepSeek V3, Llama 4), Nemotron-H and JAX (MaxText, PAXML)
recipes; NeMo's performance_summary.md at 070a0bb
(the 24.07 table published_more.py holds); Megatron-Bridge's H100 MoE rows (GPT-OSS, Qwen3) and its SFT / LoRA
tables; Megatron-LM's strong-scaling figure (no layout stated); BigScience's 176B topology search
(train/tr11-176B-ml/chronicles-prequel.md: single second-iteration timings, vocabulary and recomputation not
stated).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

from hybrid.planner.layout import Offload, Recompute, Workload, ZeroStage
from hybrid.planner.model import ActivationProfile
from hybrid.planner.ops import Fp8Scaling, KernelProfile, Stack
from hybrid.planner.published import LLAMA3_8B, LLAMA3_70B, Metric, PublishedRun, _torchtitan
from hybrid.planner.published_more import (ContextRun, Result, _layout_name, _nemo, _nemo_models, evaluate,
                                           summary_line, table)
from hybrid.planner.published_recipes import _L8, _L70, _L405_2411, _N15, Stated, Table, _cols, _cols405, _models
from hybrid.planner.published_recipes import stated as stated_round11
from hybrid.planner.search import SearchSpace

DGXC_SOURCE = "NVIDIA/dgxc-benchmarking recipe READMEs, 'Expected Performance' (DGX H100), training step time"
RELEASES = {"25.02.02": "5f23b67", "25.05.05": "c5c765f"}  # release -> commit the rows were read at
H200_SOURCE = ("pytorch/torchtitan benchmarks/llama3_8b_h200_2025-06_torchtitan.md at bcdeaa3 (Trainy, June 2025, "
               "8 H200 a host, 400 Gb/s a GPU; torchtitan e7c0cae), TPS a GPU at iteration 100")

TABLES = (
    Table("25.02.02", "llama3.1/README_8b.md", "24.12", "Llama3.1-8B", "BF16", 8192, 1, 1, 2, 1, 1,
          _cols(_L8, (12.78, 12.99, 13.00, 13.00, 13.16))),
    Table("25.02.02", "llama3.1/README_8b.md", "24.12", "Llama3.1-8B", "FP8", 8192, 1, 1, 2, 1, 1,
          _cols(_L8, (9.44, 9.47, 9.60, 9.64, 9.73))),
    Table("25.02.02", "llama3.1/README_70b.md", "24.12", "Llama3.1-70B", "BF16", 8192, 4, 4, 2, 5, 1,
          _cols(_L70, (14.61, 14.70, 14.72, 14.80, 14.86, 14.84))),
    Table("25.02.02", "llama3.1/README_70b.md", "24.12", "Llama3.1-70B", "FP8", 8192, 4, 4, 2, 5, 1,
          _cols(_L70, (10.46, 10.52, 10.75, 10.76, 10.83, 10.99))),
    Table("25.02.02", "llama3.1/README_405b.md", "24.12", "Llama3.1-405B", "BF16", 8192, 8, 9, 2, 7, 1,
          _cols405(_L405_2411, (9.00, 8.87, 17.30, 17.50, 17.60, 17.70))),
    Table("25.02.02", "llama3.1/README_405b.md", "24.12", "Llama3.1-405B", "FP8", 8192, 8, 9, 2, 7, 1,
          _cols405(_L405_2411, (5.75, 5.63, 10.8, 11.00, 11.10, 11.20))),
    Table("25.02.02", "nemotron/README_15b.md", "24.12", "Nemotron4-15B", "BF16", 4096, 4, 1, 1, 1, 4,
          _cols(_N15, (2.812, 2.824, 2.845, 2.859, 2.852, 2.875, 2.895, 2.887))),
    Table("25.02.02", "nemotron/README_15b.md", "24.12", "Nemotron4-15B", "FP8", 4096, 4, 1, 1, 1, 4,
          _cols(_N15, (2.039, 2.046, 2.048, 2.059, 2.075, 2.12, 2.094, 2.12))),
    Table("25.05.05", "llama3.1/README.md", "25.04.01", "Llama3.1-405B", "BF16", 8192, 8, 8, 2, 8, 1,
          ((512, 256, 19.810),)),
    Table("25.05.05", "llama3.1/README.md", "25.04.01", "Llama3.1-405B", "FP8", 8192, 8, 8, 2, 8, 1,
          ((512, 256, 13.020),)),
    Table("25.05.05", "nemotron/README.md", "25.04.00", "Nemotron4-15B", "BF16", 4096, 2, 1, 1, 1, 2,
          ((16, 64, 2.746),)),
    Table("25.05.05", "nemotron/README.md", "25.04.00", "Nemotron4-15B", "FP8", 4096, 2, 1, 1, 1, 2,
          ((16, 64, 1.988),)),
    Table("25.05.05", "nemotron/README.md", "25.04.00", "Nemotron4-340B", "BF16", 4096, 8, 8, 1, 12, 1,
          ((256, 64, 4.606),)),
    Table("25.05.05", "nemotron/README.md", "25.04.00", "Nemotron4-340B", "FP8", 4096, 8, 8, 1, 12, 1,
          ((256, 64, 3.107),)),
)

# Round 23: v25.05.05's setup.sh pin NEMO_COMMIT 6f2c6fd (llama3.1/, 2025-06-16) and b4148d2 (nemotron/, 2025-06-06),
# NeMo 2.3's form of the recipe: bf16_with_fp8_mixed sets `cfg.fp8_param_gather = True` (nemo/collections/llm/
# recipes/precision/mixed_precision.py:70, the field 9d4e41e5 introduced on 2025-04-10), chosen by the default
# `--fp8_recipe ds` (scripts/performance/utils.py:427-430); MegatronMixedPrecision passes it as Megatron-core's
# `fp8_param` and `fp8_param_gather` (lightning/pytorch/plugins/mixed_precision.py:148-149). Read with `fetch`.
NEMO2505_FP8_PARAMS = ("v25.05.05 setup.sh NEMO_COMMIT 6f2c6fd / b4148d2: bf16_with_fp8_mixed `fp8_param_gather = "
                       "True` (recipes/precision/mixed_precision.py:70; 9d4e41e5's form, 2025-04-10)")
# Round 23b: and Megatron-core's DDP with `overlap_grad_reduce=True, overlap_param_gather=True` (nemo/collections/llm/
# recipes/llama31_405b.py:123-130 at 6f2c6fd, nemotron.py:128-135 at b4148d2; MegatronCommOverlapCallback sets them
# again at dp > 1, megatron_comm_overlap.py:185-192; no override in scripts/performance/utils.py's
# set_primary_perf_configs or the launch.sh at c5c765f): published_recipes.NEMO2_DDP_OVERLAP has the whole reading.
NEMO2505_DDP_OVERLAP = ("NeMo 2.0 recipe DistributedDataParallelConfig(overlap_grad_reduce=True, overlap_param_gather="
                        "True) (llama31_405b.py:123-130 at 6f2c6fd, nemotron.py:128-135 at b4148d2) and "
                        "MegatronCommOverlapCallback at dp > 1 (megatron_comm_overlap.py:185-192)")

# v25.02.02's nemotron4-15b-synth.yaml (see the module docstring): what differs from v24.11.1's reading
NEMOTRON15_2502 = Stated(zero=(ZeroStage.OPTIMIZER,), recompute=(Recompute.NONE,), fp32_grads=True,
                         overlap_grad_reduce=True, dropout=0.0, fp8_scaling=Fp8Scaling.DELAYED, tp_comm_overlap=True,
                         where="nemotron/nemotron4-15b-synth.yaml at 5f23b67; NeMo megatron_base_model.py's "
                               "grad_sync_dtype default (fp32)")


def stated(t: Table) -> Stated:
    """What each release's files state (module docstring): v25.02.02's Llama YAMLs are v24.11.1's, its Nemotron4
    15B YAML NEMOTRON15_2502; v25.05.05 launches the NeMo performance recipes v25.04.01 does, read as round 11 read
    them."""
    if t.release == "25.02.02":
        if t.model == "Nemotron4-15B":
            return NEMOTRON15_2502
        return replace(stated_round11(replace(t, release="24.11.1")), where=f"llama3.1 YAMLs at {RELEASES[t.release]} "
                                                                           "(identical to v24.11.1's)")
    known = stated_round11(replace(t, release="25.04.01"))
    return replace(known, where=f"{t.file} at {RELEASES[t.release]}, launched as v25.04.01's; {NEMO2505_FP8_PARAMS}; "
                                f"{NEMO2505_DDP_OVERLAP}")


def _run(t: Table, column: tuple) -> PublishedRun:
    """One column as a PublishedRun (a ContextRun where CP > 1), planned as published_recipes._run plans round 11's
    columns with the settings `stated(t)`."""
    gpus, gbs, step = column[:3]
    layers, pp, vp = column[3:] if len(column) > 3 else (None, t.pp, t.vp)
    known = stated(t)
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
                    overlap_grad_reduce=known.overlap_grad_reduce, optimizer_dtype_bytes=known.optimizer_dtype_bytes,
                    pipeline_split=known.pipeline_split if pp > 1 else None, p2p=known.p2p,
                    fp8_param_gather=fp8 and known.fp8_params)
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


def table_runs(t: Table) -> list[PublishedRun]:
    return [_run(t, c) for c in t.columns]


# (hosts of 8 H200, TPS a GPU, memory GiB) at iteration 100, as the benchmark's table prints them
H200_ROWS = ((4, 10938, 47.96), (8, 10753, 46.97))


def h200_runs() -> list[PublishedRun]:
    """Trainy's torchtitan Llama 3.1 8B on H200: FSDP over 32 / 64 ranks, local batch 2, s 8192, selective AC by
    op (the toml's), torch.compile -- the loss's too (the module doc: Workload.fused_cross_entropy) --, Float8."""
    runs = [_torchtitan(f"torchtitan Llama 3.1 8B, {8 * hosts} H200, FSDP + compile + Float8, b2, selective-op",
                        H200_SOURCE, LLAMA3_8B, 8192, 8 * hosts, 2, Recompute.SELECTIVE_OP, float(tps), "h200",
                        kernels=KernelProfile.FUSED, fp8=True, memory_gib=memory)
            for hosts, tps, memory in H200_ROWS]
    return [replace(run, workload=replace(run.workload, fused_cross_entropy=True)) for run in runs]


BRIDGE_SOURCE = ("NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md at 067f987 (DGX-H100, FP8), "
                 "tokens/s a GPU")
# (container, model, GPUs, GBS, MBS, s, TP, PP, CP, VP, tokens/s a GPU, archive line); the 8B's FSDP stated
BRIDGE_ROWS = (("25.11", "LLAMA3-8B", 8, 128, 1, 8192, 1, 1, 1, 1, 14451, 589),
               ("25.11", "LLAMA3-70B", 64, 128, 1, 8192, 4, 8, 1, 5, 1602, 590),
               ("25.11", "LLAMA3.1-405B", 1024, 512, 1, 8192, 8, 8, 2, 8, 292, 591),
               ("26.02", "LLAMA3-70B", 64, 256, 1, 8192, 4, 8, 1, 5, 1621, 489),
               ("26.02", "LLAMA3.1-405B", 1024, 1536, 1, 8192, 8, 8, 2, 8, 311, 501),
               ("26.02.01", "LLAMA3-70B", 64, 256, 1, 8192, 4, 8, 1, 5, 1639, 405),
               ("26.04", "LLAMA3-70B", 64, 256, 1, 8192, 4, 8, 1, 5, 1633, 308),
               ("26.06", "LLAMA3.1-405B", 1024, 1536, 1, 8192, 8, 8, 2, 8, 326, 106))


def bridge_runs() -> list[PublishedRun]:
    """The Megatron-Bridge rows: published_more._nemo's planning (ZeRO 0 / 1, fused kernels, FP8 current scaling),
    the 8B's FSDP as ZeRO 3 (published.nemo_runs plans 25.09's 8B row so)."""
    models = _nemo_models()
    runs = []
    for ver, m, g, gbs, b, s, t, p, c, v, tok, line in BRIDGE_ROWS:
        fsdp = m == "LLAMA3-8B"
        name = f"Megatron-Bridge {ver} {m} FP8, {_layout_name(g, t, p, c, v, b, gbs)}" + (", FSDP" if fsdp else "")
        run = _nemo(name, f"{BRIDGE_SOURCE}, line {line} ({ver} container)", models[m], g, gbs, b, s, t, p, c, v,
                    float(tok))
        if fsdp:
            run = replace(run, space=replace(run.space, zero=(ZeroStage.PARAMETERS,)))
        runs.append(run)
    return runs


ASYNC_TP_SOURCE = ("pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md at 2887250 and its table "
                   "assets/images/async-tp-perf-06-14-2025.png (Grand Teton H100 96GB 500 W, June 2025), average TPS "
                   "a GPU")
# (model, GPUs, local batch, AC, float8 tensorwise, async TP, average TPS a GPU), TP 8 and FSDP over the rest
ASYNC_TP_ROWS = (("70B", 256, 16, Recompute.FULL, False, False, 597.3),
                 ("70B", 256, 16, Recompute.FULL, False, True, 652.4),
                 ("70B", 256, 16, Recompute.FULL, True, False, 809.8),
                 ("70B", 256, 16, Recompute.FULL, True, True, 942.4),
                 ("8B", 64, 12, Recompute.SELECTIVE_OP, False, False, 4378.0),
                 ("8B", 64, 12, Recompute.SELECTIVE_OP, False, True, 4809.4),
                 ("8B", 64, 12, Recompute.SELECTIVE_OP, True, False, 5078.1),
                 ("8B", 64, 12, Recompute.SELECTIVE_OP, True, True, 5570.1))


def async_tp_runs() -> list[PublishedRun]:
    """The async-TP benchmark's vanilla and async rows, planned as published.py plans torchtitan's Dec 2024 70B
    row (FSDP2 = ZeRO 3 over gpus / 8, TP 8 with SP, compile = FUSED, Float8 = --fp8), async TP as
    Workload.tp_comm_overlap."""
    runs = []
    for size, gpus, local, ac, fp8, overlap, tps in ASYNC_TP_ROWS:
        arch = LLAMA3_70B if size == "70B" else LLAMA3_8B
        ac_name = "full" if ac is Recompute.FULL else "selective-op"
        name = (f"torchtitan Llama 3.1 {size}, {gpus} H100 500W, FSDP {gpus // 8} x {'async ' if overlap else ''}TP 8"
                f" + compile{' + Float8' if fp8 else ''}, b{local}, {ac_name} (2025-06)")
        run = _torchtitan(name, ASYNC_TP_SOURCE, arch, 8192, gpus, local, ac, tps, "h100-96g-500w",
                          kernels=KernelProfile.FUSED, fp8=fp8, tp=8)
        runs.append(replace(run, workload=replace(run.workload, tp_comm_overlap=overlap)))
    return runs


DEC2024_SOURCE = ("pytorch/torchtitan docs/performance.md at d4c86e3 (Dec 2024, Grand Teton H100 96GB 500 W), Table 4's "
                  "'2D + AsyncTP' row, TPS a GPU at iteration 90")


def dec2024_async_tp_run() -> PublishedRun:
    """torchtitan's Dec 2024 Table 4 second row -- the 70B of published.py's 829-TPS row (FSDP 32 x TP 8, local
    batch 16, full AC, compile, Float8) with AsyncTP, 876 TPS a GPU -- which published.py left out while async TP
    had no model; planned with Workload.tp_comm_overlap as this round plans the June 2025 async rows."""
    run = _torchtitan("torchtitan Llama 3.1 70B, 256 H100 500W, FSDP 32 x async TP 8 + compile + Float8, b16, full "
                      "(2024-12)", DEC2024_SOURCE, LLAMA3_70B, 8192, 256, 16, Recompute.FULL, 876.0, "h100-96g-500w",
                      kernels=KernelProfile.FUSED, fp8=True, tp=8, memory_gib=67.6)
    return replace(run, workload=replace(run.workload, tp_comm_overlap=True))


def runs14() -> list[PublishedRun]:
    """Every round-14 check row: the DGXC tables, the H200 rows, the Megatron-Bridge rows, the async-TP rows."""
    return ([r for t in TABLES for r in table_runs(t)] + h200_runs() + bridge_runs() + async_tp_runs()
            + [dec2024_async_tp_run()])


@dataclass(frozen=True)
class Group:
    """A summary line's rows: `keep(run)` picks them from runs14()."""

    name: str
    keep: object


GROUPS = (Group("v25.02.02 (NeMo 24.12), Llama 3.1", lambda r: "25.02.02 Llama" in r.name),
          Group("v25.02.02 (NeMo 24.12), Nemotron4 15B", lambda r: "25.02.02 Nemotron" in r.name),
          Group("v25.05.05 (NeMo 25.04.01)", lambda r: "25.05.05" in r.name),
          Group("torchtitan on H200", lambda r: "H200" in r.name),
          Group("Megatron-Bridge 25.11-26.06", lambda r: r.name.startswith("Megatron-Bridge")),
          Group("torchtitan 2025-06, vanilla TP", lambda r: "(2025-06)" in r.name and "async" not in r.name),
          Group("torchtitan async TP (tp_comm_overlap; 2025-06 and 2024-12)", lambda r: "async TP" in r.name),
          Group("Megatron-core / NeMo rows (DGXC, Megatron-Bridge)", lambda r: r.workload.stack is Stack.MEGATRON),
          Group("PyTorch-native rows (torchtitan)", lambda r: r.workload.stack is Stack.PYTORCH),
          Group("BF16 rows", lambda r: not r.workload.fp8),
          Group("FP8 rows (FP8 / Float8)", lambda r: r.workload.fp8))


def evaluate_all() -> list[Result]:
    return [evaluate(r) for r in runs14()]


def report(results: list[Result]) -> str:
    """The rows' table, one summary line a group, one for all, and one for the smallest-GPU column of each table
    (a configuration counted once, not once per DP size)."""
    out = [table(results), ""]
    for g in GROUPS:
        out.append(summary_line(g.name, [r for r in results if g.keep(r.run)]))
    out.append(summary_line("all round-14 check rows", results))
    firsts, seen = [], set()
    for r in results:
        key = r.run.name.split(",")[0] if r.run.name.startswith("DGXC") else r.run.name
        if key not in seen:
            seen.add(key)
            firsts.append(r)
    out.append(summary_line("round-14 tables, first column of each", firsts))
    return "\n".join(out)


EXPLAIN_TERMS = ("gemm", "attention", "memory_bound", "launches", "tp", "pp_p2p", "bubble", "overlap", "dp_exposed",
                 "optimizer")


def explain(results: list[Result], band: float = 0.10) -> str:
    """Rows beyond `band` taken apart: the planned step's terms (% of the step) as `hybrid plan --explain` prints
    them; CP's added work shows as the remainder."""
    lines = ["| row | error | step s | " + " | ".join(EXPLAIN_TERMS) + " | other |",
             "|---|---|---|" + "---|" * (len(EXPLAIN_TERMS) + 1)]
    for r in results:
        if r.error is None or abs(r.error) <= band:
            continue
        time = r.plan.time
        terms = dict(time.terms)
        shares = [100 * terms.get(k, 0.0) / time.total for k in EXPLAIN_TERMS]
        other = 100 - sum(shares)
        lines.append(f"| {r.run.name} | {100 * r.error:+.1f} % | {time.total:.3f} | "
                     + " | ".join(f"{s:.1f}" for s in shares) + f" | {other:.1f} |")
    return "\n".join(lines)


def causes() -> str:
    """What-ifs that read the misses (docs/planner/rounds.md "Round 14: new check rows"), never fits: nothing uses them.

    * torchtitan on H200: the h200 preset carries no PyTorch stack clock (Hardware.eager_clock 1.0) where both H100
      presets carry H100_EAGER_CLOCK; the row with that clock on GEMMs and flash, on each alone, and the clock
      that would zero the row.
    * torchtitan's TP 8 rows (this round's vanilla ones and published.py's Dec 2024 70B row): the NVLink rate
      (Hardware.intra_node_gbps, the TP collectives' bus rate) that would zero each row.
    * async TP: the published async / vanilla speed-up against the planned one (Workload.tp_comm_overlap)."""
    from hybrid.planner.fit import solve
    from hybrid.planner.hardware import H100_EAGER_CLOCK
    from hybrid.planner.published import _plan_on, torchtitan_runs
    lines = ["| H200 row | today | stack clock 0.708 | on flash only | on GEMMs only | clock for 0 error |",
             "|---|---|---|---|---|---|"]
    for run in h200_runs():
        hw = run.hardware()

        def err(h) -> str:
            return f"{100 * run.throughput_error(_plan_on(run, h)):+.1f} %"
        clock = solve(lambda c: run.throughput_error(_plan_on(run, hw.with_overrides(eager_clock=c))), 0.0, 0.5, 1.0,
                      iters=20)
        lines.append(f"| {run.name} | {err(hw)} | {err(hw.with_overrides(eager_clock=H100_EAGER_CLOCK))} | "
                     f"{err(hw.with_overrides(flash_efficiency=hw.flash_efficiency * H100_EAGER_CLOCK))} | "
                     f"{err(hw.with_overrides(compute_efficiency=hw.compute_efficiency * H100_EAGER_CLOCK))} | "
                     f"{clock:.3f} |")
    lines += ["", "| torchtitan TP 8 row | today | TP share of the step | NVLink GB/s for 0 error (preset) |",
              "|---|---|---|---|"]
    vanilla = [r for r in async_tp_runs() if not r.workload.tp_comm_overlap]
    older = [r for r in torchtitan_runs() if "TP 8" in r.name and "PP" not in r.name]
    for run in vanilla + older:
        hw = run.hardware()
        plan = _plan_on(run, hw)
        share = dict(plan.time.terms)["tp"] / plan.time.total
        rate = solve(lambda x: run.throughput_error(_plan_on(run, hw.with_overrides(intra_node_gbps=x))), 0.0, 20.0,
                     2000.0, iters=30)
        lines.append(f"| {run.name} | {100 * run.throughput_error(plan):+.1f} % | {100 * share:.1f} % | {rate:.0f} "
                     f"({hw.intra_node_gbps:.0f}) |")
    lines += ["", "| async TP pair | published async / vanilla | planned async / vanilla |", "|---|---|---|"]
    runs = async_tp_runs()
    dec2024 = next(r for r in older if "Float8" in r.name)  # Table 4's synchronous row, published.py's
    for off, on in list(zip(runs[0::2], runs[1::2])) + [(dec2024, dec2024_async_tp_run())]:
        planned = on.value(on.predict()) / off.value(off.predict())
        lines.append(f"| {on.name} | {on.published / off.published:.3f} | {planned:.3f} |")
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:] == ["--causes"]:
        print(causes())
        return
    results = evaluate_all()
    if sys.argv[1:] == ["--explain"]:
        print(explain(results))
        return
    print(report(results))


if __name__ == "__main__":
    main()
