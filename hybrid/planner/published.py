"""The planner on published runs that are not in shared/reference: other models, GPUs, frameworks, schedules.

    python -m hybrid.planner.published        # prints the table of docs/planner.md "Published runs"

Each run gives its layout as published. Whatever the source leaves out the planner picks (micro-batch, chunks per
rank, ZeRO stage, recomputation, sequence parallelism). Each prediction is compared with the one number the source
states, in the source's own unit:

* BLOOM-176B (BigScience, Megatron-DeepSpeed on 384 A100 80GB). Source: bigscience-workshop/bigscience,
  train/tr11-176B-ml/README.md and tr11-176B-ml.slurm. Layout: TP 4, PP 12, DP 8, micro-batch 2, global batch
  2048 x 2048 tokens, full activation checkpointing, bf16, DeepSpeed's BF16_Optimizer (the README: it "implements
  its own ZeRO Stage 1" and "accumulates grads in fp32", unsharded: planned with fp32 gradients), DeepSpeed's
  pipeline engine (1F1B, no interleaving), 70 layers, h 14336, 112 heads,
  vocabulary padded to 250880, GeLU, ALiBi. Stages as the README lists them: embedding + 5, 6 x 10, 5 + head.
  Network: 4 Omni-Path 100 Gb/s links per 8-GPU node = 6.25 GB/s per GPU, the nominal rate (not measured).
  Published: "elapsed time per iteration (s): 104.70" at iteration 85376, GBS 2048 (the README's log line). We
  compare step time, which needs no FLOP formula.
* Llama 3 405B (Meta, 16K H100 80GB). Source: Llama Team, "The Llama 3 Herd of Models" (arXiv 2407.21783)
  Table 4, as reproduced at https://stevengong.co/notes/Model-FLOPs-Utilization. Two rows: 8,192 GPUs at TP 8,
  CP 1, PP 16, DP 64, and 16,384 GPUs at DP 128; sequence 8192, 16M tokens per batch (2048 sequences). Published
  430 and 400 TFLOP/s per GPU (BF16 MFU 43 % and 41 % of 989). We compare model FLOPs (no recomputation) per GPU,
  counted with the model's own shapes (FlopsFormula.EXACT); the paper's own count is not in that source. The third
  row (CP 16, sequence 131072) is left out: the planner has no context parallelism. 126 layers, h 16384, 128 heads,
  8 kv-heads, FFN 53248, vocabulary 128256, untied head (the Hugging Face config). Activations: the bf16-flash
  profile (flash attention), our assumption; the source does not say.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hybrid.planner.hardware import hardware
from hybrid.planner.layout import Cluster, Offload, Recompute, Workload, ZeroStage
from hybrid.planner.model import ActivationProfile
from hybrid.planner.schedule import SIM_BUDGET
from hybrid.planner.reference import gpt_model
from hybrid.planner.search import Plan, SearchSpace, search
from hybrid.planner.time import FlopsFormula
from models.config import ARCH_LLAMA, ModelConfig


class Metric(enum.Enum):
    """The number a source states."""

    STEP_S = "step time, s"
    MODEL_TFLOPS = "model TFLOP/s per GPU"


@dataclass(frozen=True)
class PublishedRun:
    """One published run: its workload, its GPUs, the layout choices it states, and its one number."""

    name: str
    source: str
    workload: Workload
    gpu: str
    gpus: int
    space: SearchSpace
    metric: Metric
    published: float
    inter_node_gbps: float | None = None
    sim_budget: float = SIM_BUDGET

    def predict(self) -> Plan:
        hw = hardware(self.gpu)
        if self.inter_node_gbps is not None:
            hw = hw.with_overrides(inter_node_gbps=self.inter_node_gbps)
        result = search(self.workload, Cluster(gpus=self.gpus, hw=hw), self.space, top=1,
                        formula=FlopsFormula.EXACT, budget=self.sim_budget)
        if not result.plans:
            raise ValueError(f"{self.name}: the published layout does not fit: {result.rejected[:3]}")
        return result.plans[0]

    def value(self, plan: Plan) -> float:
        """The prediction in the source's unit."""
        if self.metric is Metric.STEP_S:
            return self.workload.global_batch * self.workload.seq_length / plan.tokens_per_s
        return plan.mfu * hardware(self.gpu).peak_tflops


def llama3_405b() -> ModelConfig:
    return ModelConfig(arch=ARCH_LLAMA, vocab_size=128256, hidden_size=16384, num_layers=126, num_heads=128,
                       num_kv_heads=8, head_dim=128, ffn_hidden_size=53248, max_position_embeddings=8192,
                       norm_eps=1e-5, tie_embeddings=False, qkv_bias=False, mlp_bias=False, out_bias=False,
                       activation="silu", dropout=0.0)


KORTHIKANTI_SOURCE = "Korthikanti et al. 2022 (arXiv 2205.05198) Tables 3 and 5"
# Table 3 (model, heads, hidden, layers, pp, GPUs, global batch, micro-batch), Sec. 6 (v = 3 for 175B and
# 530B), Table 5 (iteration s: full recomputation, selective recomputation + sequence parallelism); t = 8, d = 1,
# s = 2048, V = 51200 for every row
KORTHIKANTI_TABLE5 = (("22B", 64, 6144, 48, 1, 8, 4, 4, 1, 1.42, 1.10),
                      ("175B", 96, 12288, 96, 8, 64, 64, 1, 3, 18.13, 13.75),
                      ("530B", 128, 20480, 105, 35, 280, 280, 1, 3, 49.05, 37.83),
                      ("1T", 160, 25600, 128, 64, 512, 512, 1, 1, 94.42, 71.49))


def korthikanti_runs() -> list[PublishedRun]:
    """Korthikanti Table 5: each model twice, full recomputation without SP and selective with SP (the two
    recomputation modes the paper times end to end), on the layout of its Table 3, compared on step time."""
    runs = []
    for name, a, h, layers, pp, gpus, batch, b, v, full_s, selective_s in KORTHIKANTI_TABLE5:
        # 2-byte gradients, as the Narayanan rows (reference.py): the paper does not state fp16 or bf16, and only
        # Megatron's --bf16 defaults to fp32 main grads
        work = Workload(gpt_model(layers, h, a, 51200, 2048), global_batch=batch, seq_length=2048)
        for recompute, sp, seconds in ((Recompute.FULL, False, full_s), (Recompute.SELECTIVE, True, selective_s)):
            space = SearchSpace(tp=(8,), pp=(pp,), v=(v,), micro_batch=(b,), zero=(ZeroStage.NONE,),
                                offload=(Offload.NONE,), recompute=(recompute,), sequence_parallel=(sp,))
            mode = "selective + SP" if sp else "full recompute"
            runs.append(PublishedRun(f"{name}, {gpus} A100 80GB, t8 p{pp} d1 v{v}, {mode}", KORTHIKANTI_SOURCE,
                                     work, "a100-80g", gpus, space, Metric.STEP_S, seconds,
                                     sim_budget=pp * (batch // b * v) ** 2))  # the whole step, simulated
    return runs


BLOOM_SOURCE = "bigscience-workshop/bigscience train/tr11-176B-ml/README.md (iteration 85376 log line)"
LLAMA_SOURCE = "Llama 3 Herd of Models (arXiv 2407.21783) Table 4, via stevengong.co/notes/Model-FLOPs-Utilization"


def published_runs() -> list[PublishedRun]:
    # fp32 gradients: the source README says the BF16_Optimizer "accumulates grads in fp32" in a static fp32 buffer
    # it does not shard ("4 bytes * params of additional memory"): ZeRO 1 with a 4-byte unsharded gradient
    bloom = Workload(gpt_model(70, 14336, 112, 250880, 2048), global_batch=2048, seq_length=2048, fp32_grads=True)
    bloom_space = SearchSpace(tp=(4,), pp=(12,), v=(1,), micro_batch=(2,), zero=(ZeroStage.OPTIMIZER,),
                              offload=(Offload.NONE,), recompute=(Recompute.FULL,), sequence_parallel=(False,))
    # assumed, not stated in our source: flash attention, as every 2024 stack training at s 8192 uses.
    # Korthikanti's materialised softmax, 16 heads a rank x 8192^2 x 2 bytes = 2.1 GB a layer and
    # micro-batch, would force full recomputation
    # 2-byte gradients: our source for these rows (Table 4, via a third-party page) does not state the gradient dtype
    llama = Workload(llama3_405b(), global_batch=2048, seq_length=8192, activations=ActivationProfile.BF16_FLASH)
    llama_space = SearchSpace(tp=(8,), pp=(16,), offload=(Offload.NONE,))
    return [PublishedRun("BLOOM-176B, 384 A100 80GB, t4 p12 d8", BLOOM_SOURCE, bloom, "a100-80g", 384, bloom_space,
                         Metric.STEP_S, 104.70, inter_node_gbps=4 * 100 / 8 / 8),
            PublishedRun("Llama 3 405B, 8192 H100, t8 p16 d64", LLAMA_SOURCE, llama, "h100-80g", 8192, llama_space,
                         Metric.MODEL_TFLOPS, 430.0),
            PublishedRun("Llama 3 405B, 16384 H100, t8 p16 d128", LLAMA_SOURCE, llama, "h100-80g", 16384,
                         llama_space, Metric.MODEL_TFLOPS, 400.0)]


def all_runs() -> list[PublishedRun]:
    """Every published run the planner is checked on outside shared/reference."""
    return published_runs() + korthikanti_runs()


def check(run: PublishedRun) -> tuple[Plan, float, float]:
    """(the plan, its prediction in the source's unit, predicted / published - 1)."""
    plan = run.predict()
    got = run.value(plan)
    return plan, got, got / run.published - 1


def shown(value: float) -> str:
    """A prediction as the table prints it: 3 significant digits below 10, one decimal above."""
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def table(runs: list[PublishedRun]) -> str:
    lines = ["| run | compared | layout (planner's picks where unpublished) | bubble | memory | predicted | "
             "published | error |", "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        plan, got, err = check(run)
        lines.append(f"| {run.name} | {run.metric.value} | {plan.layout.short()} | "
                     f"{100 * plan.bubble_fraction:.1f} % | {plan.memory_gb:.1f} GB | {shown(got)} | "
                     f"{run.published:g} | {100 * err:+.1f} % |")
    return "\n".join(lines)


def main() -> None:
    print(table(all_runs()))


if __name__ == "__main__":
    main()
