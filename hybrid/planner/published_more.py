"""More published runs, CHECK rows but MosaicML's H100 fit rows (issue 26, seventh round): where does the planner
miss on runs nobody fitted?

    python -m hybrid.planner.published_more     # the table of docs/planner/rounds.md "More check rows, round 7"
    python -m hybrid.planner.published_more --misses   # each miss taken apart (the same section)

Every row here is a `Role.CHECK` row of published.py's `PublishedRun` type -- nothing in the planner was fitted to
it, and nothing may be (tests/test_planner_morerows.py asserts the role) -- but, since round 18, MosaicML's H100
rows that published.mpt_fits names: the ">= 128 GPUs" table's FlashAttention-2 rows fit H100_EAGER_CLOCK and the
bf16 Triton rows at s >= 8192 fit TRITON_FLASH2_SHARE (docs/planner/rounds.md "Round 18"). Each row gives its layout as published;
what the source leaves out the planner picks (micro-batch, chunks per rank, ZeRO stage, recomputation), and the
docstrings say which. Sources, each read at the commit named:

* Megatron-Core r0.8.0 weak scaling (MCORE_SOURCE): NVIDIA/Megatron-LM README.md "Performance Benchmarking" and
  images/model_table.png (commit f2e5db4, 2024-07-15; still the README's table at d98e8a6): nine GPT models,
  1.7B-462B, on 48-6144 H100s, t 1-8 x p 1-16 x d 48, vocabulary 131072, sequence 4096, batch 192-3072 sequences;
  per-GPU TFLOP/s (model FLOPs, Megatron-core's count: full s^2 attention, logits, no recomputation -- the
  planner's FlopsFormula.EXACT counts the same for a GELU MLP of 4h). Stated: DP / TP / PP communication overlap
  (`--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap`: the distributed optimizer, ZeRO 1, and
  sequence parallelism with TP). Not stated, assumed: bf16 (the MFU column is TFLOP/s over the 989 bf16 peak),
  untied embeddings (the parameter counts need them: 1.7B = 12 L h^2 + 2 V h), Megatron's default dropout 0.1,
  Transformer Engine's flash attention; micro-batch, chunks per rank and recomputation are the planner's.
* NeMo 24.07 (NEMO_2407_SOURCE): NVIDIA/NeMo docs/source/performance/performance_summary.md at commit 0b8a80e
  (2024-12-11), "Pretraining" table: DGX-H100, FP8, GPT-3 5B / 20B / 175B, Llama 2 7B / 13B / 70B, Nemotron 8B /
  22B / 340B, Llama 3 8B / 70B (these two with context parallelism 2), every layout (GPUs, GBS, MBS, s, TP, PP,
  CP, VP) stated; tokens/s a GPU. Shapes from NeMo's own configs (nemo/collections/llm/gpt/model/base.py
  GPTConfig5B / 20B / 175B, nemotron.py Nemotron3Config8B / 22B, Nemotron4Config340B; GPT-2's vocabulary 50257,
  Nemotron's 256000). Recomputation and the distributed optimizer are not stated: the planner picks.
* NeMo long sequences (NEMO_LONG_SOURCE): NVIDIA/NeMo docs/source/performance/performance_long_sequence.md at
  commit 19fadb6 (2025-05-09), section "LLAMA2-7B (FP8) - H100" (NeMo 24.03.01, DGX-H100): s 4K-1M on 4-1024
  GPUs, 4M tokens a step, TP / PP / DP / CP stated, TFLOP/s a GPU (NeMo's 2024 count, full s^2 attention).
* Megatron-Bridge (BRIDGE_SOURCE): NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md at commit
  067f987 (2026-08-22), DGX-H100 FP8 rows not in published.py: Llama 3.1 405B on 1024 GPUs (t 8 x p 8 x cp 2 x
  v 8; 25.09's GBS 512 and 26.04.01's GBS 1536) and Llama 3 70B at GBS 256 (26.04.01).
* torchtitan (TORCHTITAN_SOURCE): pytorch/torchtitan docs/performance.md at commit d4c86e3 (2025-01-30; the
  December 2024 benchmark, 500 W 96 GB H100s: the h100-96g-500w preset): Table 3's Float8 row, Table 2 (Llama 3.1
  8B, 8 GPUs, FSDP x CP, s 32k-262k, local batch 1, full AC, compile + Float8) and Table 6 (405B, 512 GPUs, TP 8
  x PP 8 1F1B x FSDP x CP, s 32k-262k, local batch 8, full AC, compile + Float8 + AsyncTP).
* MosaicML A100 (MPT_A100_SOURCE): mosaicml/llm-foundry scripts/train/benchmarking/README.md at commit c90b9b3,
  table "A100 80GB with 1600 Gbps node-node interconnect (RoCE)": every row published.py does not already hold
  (35 of them; MPT 125M-70B, s 512-65536, 8-32 GPUs), and likewise the 39 rows of its two H100 80GB BF16
  tables published.py leaves out (MPT 760M-70B, s 512-65536, 8-512 GPUs; MPT_H100_SOURCE), planned exactly as
  published.mpt_runs plans its rows.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from hybrid.planner.layout import Cluster, Offload, Recompute, RingSchedule, Workload, ZeroStage
from hybrid.planner.model import ActivationProfile
from hybrid.planner.ops import KernelProfile, Stack
from hybrid.planner.published import (LLAMA2_7B, LLAMA2_13B, LLAMA2_70B, LLAMA3_8B, LLAMA3_70B, Metric,
                                      PublishedRun, Role, llama3_405b, llama_model, mpt_attention_kernel, mpt_fits,
                                      shown)
from hybrid.planner.reference import gpt_model
from hybrid.planner.search import SearchSpace
from models.config import ARCH_GPT2, ModelConfig

MCORE_SOURCE = ("NVIDIA/Megatron-LM README.md 'Performance Benchmarking' + images/model_table.png (Megatron-Core "
                "r0.8.0 weak scaling, H100; commit f2e5db4, 2024-07-15), per-GPU teraFLOP/s")
NEMO_2407_SOURCE = ("NVIDIA/NeMo docs/source/performance/performance_summary.md at 0b8a80e (NeMo 24.07, DGX-H100, "
                    "FP8, 'Pretraining' table), tokens/s a GPU")
NEMO_LONG_SOURCE = ("NVIDIA/NeMo docs/source/performance/performance_long_sequence.md at 19fadb6 (section 'LLAMA2-7B "
                    "(FP8) - H100', NeMo 24.03.01, DGX-H100; the 'With CP' columns), TFLOP/s a GPU")
BRIDGE_SOURCE = ("NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md at 067f987 (DGX-H100 FP8; "
                 "containers 25.09 and 26.04.01), tokens/s a GPU")
TORCHTITAN_SOURCE = ("pytorch/torchtitan docs/performance.md at d4c86e3 (Dec 2024 benchmark, Grand Teton H100 "
                     "96GB 500 W; Tables 2, 3, 6), TPS a GPU")
MPT_A100_SOURCE = ("mosaicml/llm-foundry scripts/train/benchmarking/README.md at c90b9b3, table 'A100 80GB with 1600 "
                   "Gbps node-node interconnect (RoCE)', Throughput (T/s/GPU)")
MPT_H100_SOURCE = ("mosaicml/llm-foundry scripts/train/benchmarking/README.md at c90b9b3, tables 'H100 80GB BF16 "
                   "(Large Scale, >= 128 GPUs)' and 'H100 80GB BF16', Throughput (T/s/GPU)")


@dataclass(frozen=True)
class ContextRun(PublishedRun):
    """A published run with context parallelism: planned by hybrid/planner/context.py's search at the row's CP
    size (ring attention, p2p), whose plan has the same `layout`, `tokens_per_s`, `mfu` and `memory_gb`."""

    cp: int = 1

    def predict(self):
        from hybrid.planner.context import search_cp
        plans = search_cp(self.workload, Cluster(gpus=self.gpus, hw=self.hardware()), self.space, cps=(self.cp,),
                          top=1)
        if not plans:
            raise ValueError(f"{self.name}: the published layout does not fit at cp {self.cp}")
        return plans[0]


# ---- Megatron-Core r0.8.0 weak scaling (H100) -------------------------------------------------------------------
# (billions, heads, hidden, layers, t, p, GPUs, batch, TFLOP/s a GPU, MFU %): images/model_table.png, all nine rows
MCORE_WEAK = ((1.7, 16, 2048, 24, 1, 1, 48, 192, 408.8, 41),
              (7.1, 32, 4096, 30, 2, 1, 96, 192, 465.9, 47),
              (16, 48, 6144, 32, 4, 1, 192, 192, 489.1, 49),
              (32, 56, 7168, 48, 8, 1, 384, 192, 459.6, 46),
              (70, 64, 8192, 84, 8, 2, 768, 384, 419.7, 42),
              (119, 80, 10240, 92, 8, 4, 1536, 768, 420.5, 43),
              (177, 96, 12288, 96, 8, 6, 2304, 1152, 432.8, 44),
              (314, 128, 16384, 96, 8, 8, 3072, 1536, 474.4, 48),
              (462, 144, 18432, 112, 8, 16, 6144, 3072, 459.9, 47))
MCORE_VOCAB, MCORE_SEQ = 131072, 4096


def mcore_model(layers: int, hidden: int, heads: int) -> ModelConfig:
    """Megatron's GPT (GELU MLP of 4h, LayerNorm, biases, learned positions) with untied embeddings."""
    return replace(gpt_model(layers, hidden, heads, MCORE_VOCAB, MCORE_SEQ), tie_embeddings=False)


def mcore_weak_runs() -> list[PublishedRun]:
    """The nine weak-scaling rows: Megatron-core (fused kernels, flash attention, overlapped p2p), the row's t and
    p, d 48, the distributed optimizer (ZeRO 1) and SP with TP as stated; b, v and recomputation the planner's."""
    runs = []
    for billions, heads, hidden, layers, tp, pp, gpus, batch, tflops, _ in MCORE_WEAK:
        work = Workload(mcore_model(layers, hidden, heads), global_batch=batch, seq_length=MCORE_SEQ,
                        activations=ActivationProfile.BF16_FLASH, kernels=KernelProfile.FUSED, stack=Stack.MEGATRON,
                        fp32_grads=True,  # --bf16: fp32 main gradients (Megatron's default)
                        overlap_grad_reduce=True,  # stated: --overlap-grad-reduce --overlap-param-gather
                        # f2e5db4's argparse leaves --cross-entropy-loss-fusion off and the README states only the
                        # overlap flags: the unfused vocab-parallel loss with its in-place softmax pass (round 25)
                        megatron_unfused_loss=True)
        space = SearchSpace(tp=(tp,), pp=(pp,), zero=(ZeroStage.OPTIMIZER,), offload=(Offload.NONE,),
                            sequence_parallel=(tp > 1,), v=None if pp > 1 else (1,))
        runs.append(PublishedRun(f"Megatron-Core {billions}B, {gpus} H100, t{tp} p{pp} d{gpus // (tp * pp)}",
                                 MCORE_SOURCE, work, "h100-80g", gpus, space, Metric.MODEL_TFLOPS, tflops))
    return runs


# ---- NeMo 24.07 (DGX-H100, FP8) ------------------------------------------------------------------------------------
GPT2_VOCAB, NEMOTRON_VOCAB = 50257, 256000


def nemotron_model(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, seq: int) -> ModelConfig:
    """NeMo's Nemotron: a non-gated MLP (squared ReLU; planned as the GELU MLP's two matrices, relu2 a one-kernel
    activation under fused kernels), LayerNorm, RoPE, no linear biases, untied head, GQA where stated. Planned as
    the GPT-2 arch for its two-matrix MLP and LayerNorm; the learned-position table that arch carries (s h) is
    0.1-0.4 % of the parameters."""
    return ModelConfig(arch=ARCH_GPT2, vocab_size=NEMOTRON_VOCAB, hidden_size=hidden, num_layers=layers,
                       num_heads=heads, num_kv_heads=kv_heads, head_dim=hidden // heads, ffn_hidden_size=ffn,
                       max_position_embeddings=seq, norm_eps=1e-5, tie_embeddings=False, qkv_bias=False,
                       mlp_bias=False, out_bias=False, activation="relu", dropout=0.0)


def _nemo_models() -> dict[str, ModelConfig]:
    return {"GPT3-5B": gpt_model(24, 4096, 32, GPT2_VOCAB, 2048),
            "GPT3-20B": gpt_model(44, 6144, 48, GPT2_VOCAB, 2048),
            "GPT3-175B": replace(gpt_model(96, 12288, 96, GPT2_VOCAB, 2048), dropout=0.0,  # GPTConfig175B: 0.0
                                 attention_dropout=0.0),
            "LLAMA2-7B": llama_model(*LLAMA2_7B, 4096), "LLAMA2-13B": llama_model(*LLAMA2_13B, 4096),
            "LLAMA2-70B": llama_model(*LLAMA2_70B, 4096),
            "Nemotron-8B": nemotron_model(32, 4096, 32, 32, 16384, 4096),
            "Nemotron-22B": nemotron_model(40, 6144, 48, 48, 24576, 4096),
            "Nemotron-340B": nemotron_model(96, 18432, 96, 8, 73728, 4096),
            "LLAMA3-8B": llama_model(*LLAMA3_8B, 8192), "LLAMA3-70B": llama_model(*LLAMA3_70B, 8192),
            "LLAMA3.1-405B": llama3_405b()}


# (model, GPUs, GBS, MBS, s, TP, PP, CP, VP, tokens/s a GPU): the 24.07 table's twelve rows, as printed
NEMO_2407_ROWS = (("GPT3-5B", 64, 2048, 4, 2048, 1, 1, 1, 1, 23406),
                  ("GPT3-20B", 64, 256, 2, 2048, 2, 1, 1, 1, 5851),
                  ("GPT3-175B", 128, 256, 1, 2048, 4, 8, 1, 6, 716),
                  ("GPT3-175B", 512, 2048, 2, 2048, 4, 8, 1, 6, 825),
                  ("LLAMA2-7B", 8, 128, 1, 4096, 1, 1, 1, 1, 16934),
                  ("LLAMA2-13B", 16, 128, 1, 4096, 1, 4, 1, 10, 8715),
                  ("LLAMA2-70B", 64, 128, 1, 4096, 4, 4, 1, 20, 1728),
                  ("Nemotron-8B", 64, 256, 4, 4096, 2, 1, 1, 1, 12507),
                  ("Nemotron-22B", 64, 256, 2, 4096, 2, 4, 1, 10, 4312),
                  ("Nemotron-340B", 128, 32, 1, 4096, 8, 8, 1, 12, 326),
                  ("LLAMA3-8B", 8, 128, 1, 8192, 1, 1, 2, 1, 12273),
                  ("LLAMA3-70B", 64, 128, 1, 8192, 4, 4, 2, 5, 1524))
# Megatron-Bridge's archive, DGX-H100 FP8 rows published.py does not hold (container, model, GPUs, GBS, MBS, s,
# TP, PP, CP, VP, tokens/s a GPU)
BRIDGE_ROWS = (("25.09", "LLAMA3.1-405B", 1024, 512, 1, 8192, 8, 8, 2, 8, 302),
               ("26.04.01", "LLAMA3.1-405B", 1024, 1536, 1, 8192, 8, 8, 2, 8, 328),
               ("26.04.01", "LLAMA3-70B", 64, 256, 1, 8192, 4, 8, 1, 5, 1664))


def _nemo(name: str, source: str, cfg: ModelConfig, gpus: int, gbs: int, mbs: int, seq: int, tp: int, pp: int,
          cp: int, vp: int, tokens: float, te_full_layer: bool = False) -> PublishedRun:
    """A NeMo / Megatron-Bridge run: Megatron-core with Transformer Engine (fused kernels, flash attention, the
    Megatron stack, overlapped p2p), FP8 linears, the stated layout; ZeRO 0 or 1 (distributed optimizer) and
    recomputation the planner's (not stated). `te_full_layer`: Workload.te_full_layer (NeMo 2.0's GPT configs from
    November 2024 on; no row here runs them)."""
    work = Workload(replace(cfg, max_position_embeddings=max(seq, cfg.max_position_embeddings)), global_batch=gbs,
                    seq_length=seq, activations=ActivationProfile.BF16_FLASH, kernels=KernelProfile.FUSED,
                    stack=Stack.MEGATRON, fp8=True, te_full_layer=te_full_layer, fp32_grads=False)
    space = SearchSpace(tp=(tp,), pp=(pp,), v=(vp,), micro_batch=(mbs,), zero=(ZeroStage.NONE, ZeroStage.OPTIMIZER),
                        offload=(Offload.NONE,), sequence_parallel=(tp > 1,))
    if cp > 1:
        return ContextRun(name, source, work, "h100-80g", gpus, space, Metric.TOKENS_PER_GPU, tokens, cp=cp)
    return PublishedRun(name, source, work, "h100-80g", gpus, space, Metric.TOKENS_PER_GPU, tokens)


def _layout_name(gpus: int, tp: int, pp: int, cp: int, vp: int, mbs: int, gbs: int) -> str:
    parts = [f"t{tp}", f"p{pp}"] + ([f"cp{cp}"] if cp > 1 else []) + ([f"v{vp}"] if vp > 1 else [])
    return f"{gpus} H100, {' '.join(parts)}, b{mbs}, GBS {gbs}"


def nemo_runs() -> list[PublishedRun]:
    """NeMo 24.07's twelve pre-training rows and Megatron-Bridge's three newer H100 rows."""
    models = _nemo_models()
    # Megatron's own layer (Workload.te_full_layer False): NeMo 2.0's GPTConfig5B / 20B / 175B set
    # `use_transformer_engine_full_layer_spec: True` only from NVIDIA/NeMo 5b7daa00 (#11119, 2024-11-01); the 24.07
    # container's NeMo (r2.0.0rc1, 2024-08-15; the table landed 2024-08-14..09-09) has no such field, and both its
    # paths build Megatron-core's get_gpt_layer_with_transformer_engine_spec (NeMo 1.0's get_specs: "te_gpt"; NeMo
    # 2.0's default_layer_spec), whose MLP leaves fc1's bias gradient to autograd (round 21 review)
    runs = [_nemo(f"NeMo 24.07 {m} FP8, {_layout_name(g, t, p, c, v, b, gbs)}", NEMO_2407_SOURCE, models[m], g, gbs,
                  b, s, t, p, c, v, tok) for m, g, gbs, b, s, t, p, c, v, tok in NEMO_2407_ROWS]
    # round 24: the 340B with its own config's settings (published24b_pipelines.as_stated: bf16 optimizer states,
    # selective recomputation, blocking p2p, ...), which the same layout's DGXC YAML states line for line
    from hybrid.planner.published24b_pipelines import as_stated
    runs = [as_stated(r) if r.name.startswith("NeMo 24.07 Nemotron-340B") else r for r in runs]
    runs += [_nemo(f"Megatron-Bridge {ver} {m} FP8, {_layout_name(g, t, p, c, v, b, gbs)}", BRIDGE_SOURCE,
                   models[m], g, gbs, b, s, t, p, c, v, tok) for ver, m, g, gbs, b, s, t, p, c, v, tok in BRIDGE_ROWS]
    return runs


# NeMo's long-sequence table, Llama 2 7B FP8 on H100 with CP: (s in K = 1024 tokens, GPUs, global batch, TP, PP,
# DP, CP, TFLOP/s a GPU); 4M tokens a step at every length
NEMO_LONG_ROWS = ((4, 4, 1024, 1, 1, 4, 1, 768), (8, 8, 512, 1, 2, 4, 1, 730), (16, 16, 256, 2, 1, 8, 1, 660),
                  (32, 32, 128, 2, 1, 8, 2, 610), (64, 64, 64, 4, 1, 8, 2, 574), (128, 128, 32, 4, 1, 8, 4, 555),
                  (256, 256, 16, 4, 1, 8, 8, 549), (512, 512, 8, 8, 1, 4, 16, 549), (1024, 1024, 4, 8, 1, 4, 32, 536))


def nemo_long_runs() -> list[PublishedRun]:
    """NeMo 24.03's Llama 2 7B FP8 at s 4K-1M on 4-1024 H100s with TP, PP, DP and CP as stated, compared on model
    TFLOP/s a GPU. Assumed: NeMo's 2024 count, full s^2 attention (its causal discount came in August 2025, NeMo
    PR 14424, after this table), which is what FlopsFormula.EXACT counts; micro-batch, chunks per rank,
    recomputation and ZeRO 0 / 1 are the planner's. Megatron-core + Transformer Engine as the other NeMo rows."""
    cfg = llama_model(*LLAMA2_7B, 4096)
    runs = []
    for k, gpus, batch, tp, pp, dp, cp, tflops in NEMO_LONG_ROWS:
        seq = 1024 * k
        work = Workload(replace(cfg, max_position_embeddings=seq), global_batch=batch, seq_length=seq,
                        activations=ActivationProfile.BF16_FLASH, kernels=KernelProfile.FUSED, stack=Stack.MEGATRON,
                        fp8=True, fp32_grads=False)
        space = SearchSpace(tp=(tp,), pp=(pp,), zero=(ZeroStage.NONE, ZeroStage.OPTIMIZER), offload=(Offload.NONE,),
                            sequence_parallel=(tp > 1,), zero_bubble=(False,))  # 1F1B: NeMo 24.03 had no ZB
        runs.append(ContextRun(f"NeMo 24.03 LLAMA2-7B FP8, s {k}K, {gpus} H100, t{tp} p{pp} d{dp} cp{cp}",
                               NEMO_LONG_SOURCE, work, "h100-80g", gpus, space, Metric.MODEL_TFLOPS, tflops, cp=cp))
    return runs

# ---- torchtitan, December 2024 (500 W H100 96 GB) -------------------------------------------------------------------
# Table 2: (FSDP, CP, s, TPS a GPU, GiB); Table 6: the same for 405B at TP 8 x PP 8
TORCHTITAN_T2 = ((8, 1, 32768, 3890, 83.9), (4, 2, 65536, 2540, 84.2), (2, 4, 131072, 1071, 84.0),
                 (1, 8, 262144, 548, 84.5))
TORCHTITAN_T6 = ((8, 1, 32768, 76, 75.3), (4, 2, 65536, 47, 75.9), (2, 4, 131072, 31, 77.1),
                 (1, 8, 262144, 16, 84.9))


def _titan_work(cfg: ModelConfig, seq: int, global_batch: int) -> Workload:
    """torchtitan: PyTorch FSDP2 (ZeRO 3), torch.compile (fused), Float8 linears (torchao), SDPA flash; context
    parallelism by torch's experimental context_parallel (RingSchedule.TORCH_ALLGATHER: its default all-gather
    rotation, fp32 merges) over K, V that torchtitan's Llama has already repeated to the query heads (`repeat_kv`
    before scaled_dot_product_attention, torchtitan models/llama/model.py): round 9, docs/planner/rounds.md. Float8's TP
    all-gathers (Table 6's TP 8) move float8 (Workload.float8_tp_gathers); Table 6 ran AsyncTP, so no DTensor
    copies are priced (Workload.sp_copies off)."""
    return Workload(replace(cfg, max_position_embeddings=seq), global_batch=global_batch, seq_length=seq,
                    activations=ActivationProfile.BF16_FLASH, kernels=KernelProfile.FUSED, stack=Stack.PYTORCH,
                    fp8=True, cp_ring=RingSchedule.TORCH_ALLGATHER, kv_repeated=True, float8_tp_gathers=True,
                    fp32_grads=False)


def torchtitan_runs() -> list[PublishedRun]:
    """Table 3's Float8 row (8B, 128 GPUs, b 2, selective-op: its SAC, as published.py's Table 3 rows), Table 2
    (8B on 8 GPUs, local batch 1 = one sequence a DP rank, full AC, FSDP x CP) and Table 6 (405B on 512 GPUs, TP 8
    x PP 8 1F1B x FSDP x CP, local batch 8 sequences a DP rank, full AC). Assumed for Table 6, as published.py
    assumes for Table 5: as many micro-batches as stages (8: micro-batch 1), SP with TP; AsyncTP not modelled."""
    runs = [PublishedRun("torchtitan Llama 3.1 8B, 128 H100 500W, FSDP + compile + Float8, b2, selective-op",
                         TORCHTITAN_SOURCE, _titan_work(llama_model(*LLAMA3_8B, 8192), 8192, 256), "h100-96g-500w",
                         128, SearchSpace(tp=(1,), pp=(1,), v=(1,), micro_batch=(2,), zero=(ZeroStage.PARAMETERS,),
                                          offload=(Offload.NONE,), recompute=(Recompute.SELECTIVE_OP,),
                                          sequence_parallel=(False,)),
                         Metric.TOKENS_PER_GPU, 8380, memory_gib=61.8)]
    full = (Recompute.FULL,)
    for fsdp, cp, seq, tps, gib in TORCHTITAN_T2:
        space = SearchSpace(tp=(1,), pp=(1,), v=(1,), micro_batch=(1,), zero=(ZeroStage.PARAMETERS,),
                            offload=(Offload.NONE,), recompute=full, sequence_parallel=(False,))
        runs.append(ContextRun(f"torchtitan Llama 3.1 8B, 8 H100 500W, FSDP {fsdp} x CP {cp}, s {seq}, b1, full",
                               TORCHTITAN_SOURCE, _titan_work(llama_model(*LLAMA3_8B, seq), seq, fsdp),
                               "h100-96g-500w", 8, space, Metric.TOKENS_PER_GPU, tps, memory_gib=gib, cp=cp))
    for fsdp, cp, seq, tps, gib in TORCHTITAN_T6:
        space = SearchSpace(tp=(8,), pp=(8,), v=(1,), micro_batch=(1,), zero=(ZeroStage.PARAMETERS,),
                            offload=(Offload.NONE,), recompute=full, sequence_parallel=(True,))
        runs.append(ContextRun(f"torchtitan Llama 3.1 405B, 512 H100 500W, TP 8 x PP 8 x FSDP {fsdp} x CP {cp}, "
                               f"s {seq}, b1 x 8, full", TORCHTITAN_SOURCE,
                               _titan_work(llama3_405b(), seq, 8 * fsdp), "h100-96g-500w", 512, space,
                               Metric.TOKENS_PER_GPU, tps, memory_gib=gib, cp=cp))
    return runs


# ---- MosaicML's A100 80GB table: the rows published.py does not hold -------------------------------------------------
# (model, s, GPUs, micro-batch, grad accumulation, T/s/GPU, FSDP sharding as a ZeRO stage (FULL_SHARD 3,
#  SHARD_GRAD_OP 2), activation checkpointing, fp32 reduce (amp_bf16 DEFAULT; PURE: bf16), NumParams), in the
#  table's order
MPT_MORE_SIZES = {"125m": (12, 768, 12), "350m": (24, 1024, 16), "760m": (24, 1536, 12), "1b": (24, 2048, 16),
                  "3b": (32, 2560, 20), "7b": (32, 4096, 32), "13b": (40, 5120, 40), "30b": (48, 7168, 64),
                  "70b": (80, 8192, 64)}
# (model, s, GPUs, micro-batch, grad accumulation, T/s/GPU, activation checkpointing, fp32 reduce (amp_bf16
#  DEFAULT; PURE: bf16), NumParams), in the table's order; all FULL_SHARD (ZeRO 3)
MPT_A100_MORE = (("70b", 2048, 32, 2, 16, 373, 3, True, False, 64862437376),
                 ("30b", 8192, 8, 1, 21, 574, 3, True, True, 30019254272),
                 ("30b", 4096, 8, 1, 21, 814, 3, True, True, 29989894144),
                 ("30b", 1024, 8, 6, 21, 946, 3, True, True, 29967874048),
                 ("30b", 512, 8, 12, 21, 967, 3, True, True, 29964204032),
                 ("13b", 32768, 8, 1, 3, 1016, 3, True, True, 13011240960),
                 ("13b", 16384, 8, 3, 3, 1431, 3, True, True, 12927354880),
                 ("13b", 8192, 8, 5, 3, 1795, 3, True, True, 12885411840),
                 ("13b", 1024, 8, 40, 3, 2330, 3, True, True, 12848711680),
                 ("7b", 65536, 8, 1, 2, 1013, 3, True, True, 6918905856),
                 ("7b", 32768, 8, 2, 2, 1672, 3, True, True, 6784688128),
                 ("7b", 16384, 8, 4, 2, 2453, 3, True, True, 6717579264),
                 ("7b", 4096, 8, 16, 2, 3684, 3, True, True, 6667247616),
                 ("7b", 1024, 8, 64, 2, 4357, 3, True, True, 6654664704),
                 ("3b", 65536, 8, 1, 2, 1767, 3, True, True, 2814366720),
                 ("3b", 32768, 8, 3, 6, 3029, 3, True, True, 2730480640),
                 ("3b", 16384, 8, 1, 6, 5529, 3, False, True, 2688537600),
                 ("3b", 8192, 8, 3, 6, 7695, 3, False, True, 2667566080),
                 ("3b", 4096, 8, 5, 6, 9457, 3, False, True, 2657080320),
                 ("3b", 1024, 8, 20, 6, 11580, 3, False, True, 2649216000),
                 ("3b", 512, 8, 40, 6, 12127, 3, False, True, 2647905280),
                 ("1b", 65536, 8, 1, 2, 3044, 3, True, True, 1445974016),
                 ("1b", 32768, 8, 1, 4, 6275, 3, False, True, 1378865152),
                 ("1b", 16384, 8, 2, 4, 9956, 3, False, True, 1345310720),
                 ("1b", 8192, 8, 3, 4, 13814, 3, False, True, 1328533504),
                 ("1b", 4096, 8, 7, 4, 17807, 3, False, True, 1320144896),
                 ("1b", 1024, 8, 18, 4, 22112, 3, False, True, 1313853440),
                 ("1b", 512, 8, 56, 4, 23148, 3, False, True, 1312804864),
                 ("760m", 8192, 8, 6, 2, 20933, 3, False, True, 769907712),
                 ("760m", 2048, 8, 24, 2, 32434, 3, False, True, 760470528),
                 ("350m", 8192, 8, 8, 2, 36569, 3, False, True, 362276864),
                 ("350m", 2048, 8, 32, 2, 58782, 3, False, True, 355985408),
                 ("125m", 8192, 8, 8, 2, 90392, 3, False, True, 130030080),
                 ("125m", 2048, 8, 40, 2, 142830, 3, False, True, 125311488),
                 ("125m", 512, 8, 128, 2, 165681, 3, False, True, 124131840))

# the H100 80GB BF16 tables' rows (both: '>= 128 GPUs' and the 8-32 GPU one) that published.py does not hold
MPT_H100_MORE = (("30b", 1024, 8, 6, 21, 2084, 3, True, True, 29967874048),
                 ("13b", 32768, 8, 1, 3, 1976, 3, True, True, 13011240960),
                 ("13b", 2048, 32, 2, 1, 4811, 3, False, True, 12853954560),
                 ("13b", 1024, 8, 40, 3, 5502, 3, True, True, 12848711680),
                 ("7b", 65536, 8, 1, 2, 1956, 3, True, True, 6918905856),
                 ("7b", 32768, 8, 2, 2, 3318, 3, True, True, 6784688128),
                 ("7b", 1024, 8, 64, 2, 10203, 3, True, True, 6654664704),
                 ("3b", 65536, 8, 1, 2, 3262, 3, True, True, 2814366720),
                 ("3b", 32768, 8, 3, 6, 5873, 3, True, True, 2730480640),
                 ("3b", 16384, 8, 1, 6, 11152, 3, False, True, 2688537600),
                 ("3b", 2048, 32, 6, 3, 23021, 3, False, True, 2651837440),
                 ("3b", 1024, 8, 20, 6, 27046, 3, False, True, 2649216000),
                 ("3b", 512, 8, 40, 6, 27965, 3, False, True, 2647905280),
                 ("1b", 65536, 8, 1, 2, 5506, 3, True, True, 1445974016),
                 ("1b", 32768, 8, 1, 4, 12025, 3, False, True, 1378865152),
                 ("1b", 16384, 8, 2, 4, 19649, 3, False, True, 1345310720),
                 ("1b", 8192, 8, 3, 4, 29157, 3, False, True, 1328533504),
                 ("1b", 2048, 32, 20, 1, 45130, 3, False, True, 1315950592),
                 ("1b", 1024, 8, 18, 4, 48910, 3, False, True, 1313853440),
                 ("1b", 512, 8, 56, 4, 52275, 3, False, True, 1312804864),
                 ("760m", 32768, 8, 1, 2, 16291, 3, False, True, 807656448),
                 ("760m", 16384, 8, 3, 2, 27815, 3, False, True, 782490624),
                 ("760m", 8192, 8, 6, 2, 41825, 3, False, True, 769907712),
                 ("760m", 4096, 8, 12, 2, 55459, 3, False, True, 763616256),
                 ("760m", 2048, 32, 24, 1, 67971, 3, False, True, 760470528),
                 ("760m", 2048, 16, 24, 1, 68551, 3, False, True, 760470528),
                 ("760m", 2048, 8, 24, 2, 63147, 3, False, True, 760470528),
                 ("760m", 1024, 8, 48, 2, 78581, 3, False, True, 758897664),
                 ("760m", 512, 8, 96, 2, 83749, 3, False, True, 758111232),
                 ("70b", 2048, 256, 8, 1, 1035, 3, True, True, 64862437376),
                 ("30b", 2048, 512, 8, 1, 2115, 3, True, True, 29975214080),
                 ("30b", 2048, 128, 8, 1, 2199, 3, True, True, 29975214080),
                 ("13b", 2048, 256, 16, 1, 4989, 3, True, True, 12853954560),
                 ("13b", 2048, 128, 16, 1, 5080, 3, True, True, 12853954560),
                 ("7b", 2048, 256, 6, 1, 10119, 3, False, True, 6658859008),
                 ("3b", 2048, 512, 8, 1, 21664, 2, False, True, 2651837440),
                 ("3b", 2048, 128, 8, 1, 23422, 2, False, True, 2651837440),
                 ("1b", 2048, 512, 12, 1, 39837, 2, False, True, 1315950592),
                 ("1b", 2048, 256, 12, 1, 42555, 2, False, True, 1315950592))


def mpt_more_model(size: str, seq: int) -> ModelConfig:
    layers, d, heads = MPT_MORE_SIZES[size]
    return replace(gpt_model(layers, d, heads, 50368, seq), dropout=0.0, attention_dropout=0.0)


def _mpt_runs(rows: tuple, gpu: str, source: str) -> list[PublishedRun]:
    """MosaicML rows planned exactly as published.mpt_runs plans its rows: Composer + PyTorch FSDP (FULL_SHARD as
    ZeRO 3, SHARD_GRAD_OP as ZeRO 2), the stated micro-batch and accumulation, activation checkpointing as full
    recomputation, flash attention, eager kernels (the PyTorch stack, and on h100-80g its clock), fp32 gradient
    reduction under amp_bf16 DEFAULT (bf16 under PURE), flash-attn's fused cross-entropy."""
    runs = []
    card = "H100" if gpu.startswith("h100") else "A100"
    for size, seq, gpus, mb, accum, tokens, zero, checkpointing, fp32_reduce, _ in rows:
        work = Workload(mpt_more_model(size, seq), global_batch=mb * accum * gpus, seq_length=seq,
                        activations=ActivationProfile.BF16_FLASH, fp32_grads=fp32_reduce, fused_cross_entropy=True,
                        attention_kernel=mpt_attention_kernel(gpu, size, gpus))
        space = SearchSpace(tp=(1,), pp=(1,), v=(1,), micro_batch=(mb,), zero=(ZeroStage(zero),),
                            offload=(Offload.NONE,), sequence_parallel=(False,),
                            recompute=(Recompute.FULL if checkpointing else Recompute.NONE,))
        ac = ", AC" if checkpointing else ""
        fits = mpt_fits(gpu, size, seq, gpus, False, False)
        runs.append(PublishedRun(f"MPT-{size}, s {seq}, {gpus} {card}, FSDP z{zero}, b{mb} x {accum}{ac}", source,
                                 work, gpu, gpus, space, Metric.TOKENS_PER_GPU, tokens,
                                 role=Role.FIT if fits else Role.CHECK, fits=fits))
    return runs


def mpt_a100_runs() -> list[PublishedRun]:
    """The A100 80GB table's rows published.py does not hold."""
    return _mpt_runs(MPT_A100_MORE, "a100-80g", MPT_A100_SOURCE)


def mpt_h100_runs() -> list[PublishedRun]:
    """The H100 80GB BF16 tables' rows published.py does not hold."""
    return _mpt_runs(MPT_H100_MORE, "h100-80g", MPT_H100_SOURCE)


def more_runs() -> list[PublishedRun]:
    """Every round-7 check row."""
    return (mcore_weak_runs() + nemo_runs() + nemo_long_runs() + torchtitan_runs() + mpt_a100_runs()
            + mpt_h100_runs())


# ---- report ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """One row's outcome: the plan's layout and memory, the prediction in the source's unit and the throughput
    error (predicted / published - 1; for a step time published / predicted - 1; + optimistic), or why the
    planner rejected the published layout (`rejected`, and no error)."""

    run: PublishedRun
    layout: str = ""
    memory_gb: float = 0.0
    predicted: float = 0.0
    error: float | None = None
    rejected: str = ""
    plan: object = None  # the Plan (or context.ContextPlan) predicted, None when rejected


def evaluate(run: PublishedRun) -> Result:
    try:
        plan = run.predict()
    except ValueError as exc:
        return Result(run, rejected=str(exc).split(": ", 1)[-1][:160])
    short = plan.short() if hasattr(plan, "cp") else plan.layout.short()
    return Result(run, short, plan.memory_gb, run.value(plan), run.throughput_error(plan), plan=plan)


def table(results: list[Result]) -> str:
    lines = ["| run | compared | layout (planner's picks where unpublished) | memory | predicted | published | "
             "error |", "|---|---|---|---|---|---|---|"]
    for r in results:
        measured = f" ({r.run.memory_gib * 2**30 / 1e9:.1f})" if r.run.memory_gib else ""
        if r.error is None:
            lines.append(f"| {r.run.name} | {r.run.metric.value} | rejected: {r.rejected} | -{measured} | - | "
                         f"{r.run.published:g} | - |")
        else:
            lines.append(f"| {r.run.name} | {r.run.metric.value} | {r.layout} | {r.memory_gb:.1f} GB{measured} | "
                         f"{shown(r.predicted)} | {r.run.published:g} | {100 * r.error:+.1f} % |")
    return "\n".join(lines)


def summary_line(what: str, results: list[Result]) -> str:
    errors = [r.error for r in results if r.error is not None]
    rejected = sum(r.error is None for r in results)
    if not errors:
        return f"{what}: {len(results)} rows, {rejected} rejected"
    return (f"{what}: {len(errors)} rows predicted, signed mean {100 * statistics.fmean(errors):+.1f} %, median "
            f"|error| {100 * statistics.median(abs(e) for e in errors):.1f} %, spread {100 * min(errors):+.1f} % to "
            f"{100 * max(errors):+.1f} %, {sum(abs(e) <= 0.15 for e in errors)} within 15 %; {rejected} rejected")


def role_summaries(what: str, results: list[Result]) -> list[str]:
    """summary_line of the check rows, and of the fit rows apart where there are any (round 18: MosaicML's H100 rows
    that fit H100_EAGER_CLOCK or TRITON_FLASH2_SHARE)."""
    fit = [r for r in results if r.run.role is Role.FIT]
    lines = [summary_line(what, [r for r in results if r.run.role is Role.CHECK])]
    return lines + [summary_line(f"{what}, the fit rows among them (not checks)", fit)] if fit else lines


MISS = 0.15  # |error| beyond which a row is a miss (issue 26's acceptance band)
TERMS = ("gemm", "attention", "memory_bound", "launches", "tp", "pp_p2p", "bubble", "overlap", "dp_exposed",
         "optimizer")


def flash_rate_to_match(run: PublishedRun) -> float:
    """The flash-attention rate, TFLOP/s, at which the row's prediction is exact: the preset's flash share scaled
    alone (GEMM asymptote and stack clock kept) by bisection, for a PyTorch-stack row. A what-if that reads a miss,
    never a fit: nothing uses it."""
    from hybrid.planner.fit import solve
    from hybrid.planner.published import _plan_on
    hw = run.hardware()
    share = hw.flash_efficiency

    def error(k: float) -> float:
        return run.throughput_error(_plan_on(run, hw.with_overrides(flash_efficiency=min(1.0, k * share),
                                                                    eager_clock=hw.eager_clock)))
    k = solve(error, 0.0, 0.2, 1.0 / share, iters=16)
    kernel = run.workload.attention_kernel.efficiency(hw, run.workload.model.head_dim, run.workload.seq_length) / share
    # the kernel's rate at the row's head width and length over FlashAttention-2's at 16k (FLASH_FWD_BWD_TFLOPS)
    return k * share * kernel * hw.eager_clock * hw.peak_tflops  # the PyTorch stack runs flash at share x its clock


def miss_table(results: list[Result]) -> str:
    """Each miss (|error| > 15 %) taken apart: its planned step in --explain's terms (% of the step; CP's added
    attention and ring transfers as `cp`), the error if the exposed DP term were hidden (what Megatron's
    --overlap-grad-reduce / --overlap-param-gather claim), and for the MosaicML rows (PyTorch stack, one flash
    rate a card) the flash rate that would make the row exact (docs/planner/rounds.md "More check rows, round 7")."""
    lines = ["| miss | error | " + " | ".join(TERMS) + " | cp | error, DP hidden | flash rate to match |",
             "|---|---|" + "---|" * len(TERMS) + "---|---|---|"]
    for r in results:
        if r.error is None or abs(r.error) <= MISS:
            continue
        plan = r.plan
        base = getattr(plan, "base", plan)
        total = plan.total_s if hasattr(plan, "cp") else base.time.total
        terms = dict(base.time.terms)
        cp = plan.extra_s / total if hasattr(plan, "cp") else 0.0
        hidden = (1 + r.error) * total / (total - terms["dp_exposed"]) - 1
        rate = f"{flash_rate_to_match(r.run):.0f}" if r.run.name.startswith("MPT-") and \
            r.run.workload.seq_length >= 16384 else "-"
        shares = " | ".join(f"{round(100 * terms[t] / total) + 0}" for t in TERMS)  # round: no "-0"
        lines.append(f"| {r.run.name} | {100 * r.error:+.1f} % | {shares} | {100 * cp:.0f} | {100 * hidden:+.1f} % | "
                     f"{rate} |")
    return "\n".join(lines)


GROUPS = (("Megatron-Core weak scaling", mcore_weak_runs), ("NeMo / Megatron-Bridge FP8", nemo_runs),
          ("NeMo long sequences (CP)", nemo_long_runs),
          ("torchtitan Dec 2024", torchtitan_runs), ("MosaicML A100 80GB", mpt_a100_runs),
          ("MosaicML H100 80GB BF16", mpt_h100_runs))


def main() -> None:
    import sys
    if sys.argv[1:] == ["--misses"]:
        print(miss_table([evaluate(run) for run in more_runs()]))
        return
    everything = []
    for what, rows in GROUPS:
        results = [evaluate(r) for r in rows()]
        everything += results
        summaries = "\n".join(role_summaries(what, results))
        print(f"### {what}\n\n{table(results)}\n\n{summaries}\n")
    print("\n".join(role_summaries("all round-7 check rows", everything)))


if __name__ == "__main__":
    main()
