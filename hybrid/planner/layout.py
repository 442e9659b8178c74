"""What the planner decides and what it plans for: the layout (a point of the search space), the workload
and the cluster, the checks that make a layout possible, and where each process group lands on the nodes.

Rank order is the runtime's (hybrid/mesh.py, Megatron's "tp-dp-pp"): rank = tp + t (dp + d pp), so a TP
group is t consecutive ranks, a DP group strides by t, pipeline neighbours are t d ranks apart.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from functools import lru_cache

from hybrid.cliutil import check_number
from hybrid.partition import PartitionMethod, partition_layers, stage_costs_from_config
from hybrid.pipeline import Placement, ScheduleKind
from hybrid.planner.hardware import AttentionKernel, GroupPlacement, Hardware
from hybrid.planner.model import ActivationProfile, Precision, Shard
from hybrid.planner.ops import Fp8Scaling, KernelProfile, Stack
from models.recompute import Recompute  # noqa: F401  (re-exported: the runtime's enum is the planner's)
from models.config import ModelConfig


class ZeroStage(enum.IntEnum):
    """ZeRO stage (`--zero-stage`): what the data-parallel ranks partition (Rajbhandari et al. 2020)."""

    NONE = 0  # nothing: every DP rank holds parameters, gradients and optimizer states
    OPTIMIZER = 1  # P_os: optimizer states
    GRADIENTS = 2  # P_os+g: optimizer states and gradients
    PARAMETERS = 3  # P_os+g+p: optimizer states, gradients and parameters


class Offload(enum.Enum):
    """What lives in host memory (`--offload-optimizer`, `--offload-params`; ZeRO-Offload / ZeRO-Infinity)."""

    NONE = "none"
    OPTIMIZER = "optimizer"  # fp32 master weights + Adam moments on the host; the CPU runs Adam
    OPTIMIZER_AND_PARAMS = "optimizer+params"  # also the fp16 parameters (ZeRO-3 only), fetched per use


def recompute_at_most(a: Recompute, b: Recompute) -> bool:
    """Does `a` recompute no more than `b` (so a fitting `a` is never slower)? NONE recomputes least and FULL
    most; SELECTIVE (the attention core) and SELECTIVE_OP (cheap ops + every second matmul) are not comparable:
    which costs more depends on the sequence length."""
    order = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.SELECTIVE_OP: 1, Recompute.FULL: 2}
    return a is b or order[a] < order[b]


class TpPlan(enum.Enum):
    """How the runtime's tensor parallelism feeds a layer's column-parallel projections (`Workload.tp_plan`;
    predicted_comm.tp_gathers): how many collectives a layer's TP inputs take.

    BLOCK: one collective per block input -- under SP one all-gather of the attention's input and one of the
        MLP's, feeding every column-parallel projection of that block (Megatron's fused QKV / FC1 linears, this
        runtime's hybrid.tp, torchtitan's `PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=
        Replicate())` on `attention` and `feed_forward`); in the backward one reduce-scatter (without SP one
        all-reduce) of each block input's gradient. The default.
    PROJECTION: one per column-parallel projection -- torch DTensor's `ColwiseParallel(input_layouts=Shard(1))` on
        each of q, k, v and the MLP's gate and up projections (KempnerForge kempnerforge/distributed/
        tensor_parallel.py `_build_block_tp_plan`, at 01b461a, 6a9a08a and 3ad9d9a alike): each redistributes the
        same sequence-sharded input to Replicate on its own, so a Llama layer all-gathers its input 3 + 2 times
        in the forward (and in the recomputed forward) and reduce-scatters 3 + 2 input gradients in the
        backward. KempnerForge's own profile of a 13B TP 4 run (benchmarks/profiling/13b_24gpu_profiling.md at
        a7f8346: 5 steps of 4 micro-batches x 40 layers, 800 attention backwards) counts 9,679 TP all-gathers
        and 6,420 bf16 reduce-scatters: 12.1 and 8.0 a layer and micro-batch, as this plan under full
        recomputation gives (5 + 2 + 5 and 2 + 5 + 1) where BLOCK gives 6 and 5."""

    BLOCK = "block"
    PROJECTION = "projection"


class Zero3Runtime(enum.Enum):
    """Which runtime shards the parameters at ZeRO 3 (`Workload.zero3_runtime`; None there: no copies priced, the
    default): what it copies through HBM on the compute stream around its gathers and reduce-scatters
    (time.zero3_copy_bytes; docs/planner/rounds.md "Round 16: the ZeRO 3 runtimes' copies").

    HYBRID: this runtime's ZeroOptimizer (hybrid/zero): a unit's all-gather lands in its flat buffer, of which every
        parameter is a view (units.FlatUnit.bind: no copy-out), and the post-accumulate-grad hook copies each
        parameter's gradient into the unit's full-gradient buffer (FlatUnit.add_grad: read the parameter-dtype
        gradient, write the gradient dtype) on the compute stream, every micro-batch (stage 3 reduce-scatters each).
    FSDP2: torch's per-parameter `fully_shard` (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, torch
        2.13): `foreach_all_gather_copy_out` copies every gathered parameter out of the all-gather buffer
        (split_with_sizes_copy: read + write) on the compute stream at each unshard -- the forward's and, resharded
        after forward, the backward's (the root group, embedding and head, is not resharded after forward: once);
        `foreach_reduce_scatter_copy_in` (chunk_cat: read the gradient, write the reduce dtype) on the compute
        stream before each reduce-scatter. torchtitan, KempnerForge, OLMo-core, the float8 blog.
    FSDP1: torch's FullyShardedDataParallel (FlatParameter: gathered in place, the original parameters are views
        of it, autograd accumulates into the flat gradient): no copy on the compute stream (its cast to a wider
        reduce dtype runs on the post-backward stream). MosaicML's Composer (MPT), IBM fms-fsdp.
    MEGATRON_FSDP: Megatron-core's FSDP (Megatron-FSDP / nvFSDP, NeMo's and Megatron-Bridge's FSDP rows): its
        ParamAndGradBuffer holds parameters and main gradients in the communication buffers ("zero copy
        communication", its README), gradients accumulated there by the weight-gradient GEMM: no copy.
    DeepSpeed's ZeRO 3 is not here: no published row the planner checks runs it."""

    HYBRID = "hybrid"
    FSDP2 = "fsdp2"
    FSDP1 = "fsdp1"
    MEGATRON_FSDP = "megatron-fsdp"


class PipelineP2P(enum.Enum):
    """How a pipeline's point-to-point messages meet the compute (`--pipeline-p2p`)."""

    OVERLAPPED = "overlapped"  # posted without blocking; a compute waits only for its own input (this runtime,
    #                            Megatron-core's overlapped p2p): the simulation places each message
    BLOCKING = "blocking"  # each send and receive completes before the rank computes on (DeepSpeed's pipeline
    #                        engine): every pass pays latency + bytes for each message it exchanges
    BLOCKING_SCATTER = "blocking-scatter"  # blocking as above, with Megatron-LM's scatter-gather (Narayanan et
    #                        al. 2021 Sec. 4.1): each of the t TP ranks sends 1/t of the message on its own link,
    #                        an all-gather over NVLink rebuilds it (Megatron-LM 2021-22's schedules)

    @property
    def blocking(self) -> bool:
        return self is not PipelineP2P.OVERLAPPED


class RingSchedule(enum.Enum):
    """How a context-parallel ring implementation moves K, V and the gradients dK, dV (hybrid/planner/context.py
    prices each; `Workload.cp_ring` names one, else the stack picks: context.ring_schedule).

    ACCUMULATOR: this runtime's ring (hybrid/cp/ring.py RingAttention.backward): K, V sent to the next rank before
        each step's compute, and an fp32 dK, dV accumulator per block going round beside them, each sent after the
        step that adds to it, so the last one reaches its owner after the loop, exposed.
    TRAVELLING: Transformer Engine (Megatron-core, NeMo; AttnFuncWithCPAndKVP2P.backward): dK, dV in the compute
        dtype travel in the same buffer as the next K, V -- step 0 sends K, V, steps 1 .. c - 2 K, V and dK, dV,
        step c - 1 dK, dV only -- each transfer posted before its step's compute (the causal diagonal block runs
        last, "in reversed order of fwd"), so every transfer has a step to hide under.
    TORCH_ALLGATHER: torch's experimental context_parallel as torchtitan runs it
        (torch/distributed/tensor/experimental/_attention.py: `_ContextParallelOptions.rotate_method` defaults to
        `_RotateMethod.ALL_GATHER`, read at pytorch/pytorch f2127dbd and 0123248a): `_AllGatherRotater` gathers
        every rank's K, V in ONE all-gather, posted before the diagonal step (i = 0) and waited before step 1, so
        the whole gather hides under one step, not c - 1; the backward gathers K, V again the same way and sends
        the fp32 dK, dV accumulator by an all-to-all permute (`dkv_rotater`, ALL_TO_ALL) after each of its c steps,
        waited after the next step's compute, the last after the loop (exposed)."""

    ACCUMULATOR = "accumulator"
    TRAVELLING = "travelling"
    TORCH_ALLGATHER = "torch-allgather"


@dataclass(frozen=True)
class Layout:
    """One candidate layout: the sizes and switches `scripts/train.py` takes.

    Attributes:
        tp: tensor-parallel size (`--tensor-model-parallel-size`).
        pp: pipeline-parallel size (`--pipeline-model-parallel-size`).
        dp: data-parallel size (world / (tp pp)).
        v: model chunks per pipeline rank (interleaved schedule when > 1; set through
            `--num-layers-per-virtual-pipeline-stage` = layers / (pp v)).
        micro_batch: sequences per micro-batch (`--micro-batch-size`).
        zero: ZeRO stage (`--zero-stage`).
        offload: what lives in host memory.
        recompute: activation recomputation (`--recompute-granularity`).
        sequence_parallel: split norms / dropout along the sequence over TP (`--sequence-parallel`).
        zero_bubble: a zero-bubble schedule (Qi et al. 2024): each backward split into B (input gradient) and a
            deferred W (weight gradients) filling 1F1B's bubble; pp >= 2. With v = 1 ZB-H1
            (`--pipeline-schedule zbh1`); with v = 2 ZBV (`--pipeline-schedule zbv`): two chunks a rank placed in
            a V, rank r holding stages r and 2 pp - 1 - r (`Placement.V`), so rank 0 holds the embedding and the
            LM head.
        dp_replicate: hybrid-sharded data parallelism (HSDP) at ZeRO 3: the dp ranks form dp_replicate replicas of
            dp_shard = dp / dp_replicate ranks each; ZeRO 3 runs inside a shard group (its states sharded over
            dp_shard ranks, its all-gathers and reduce-scatters over them) and each reduced gradient shard is
            all-reduced over the dp_replicate ranks holding the same shard (FSDP1's HYBRID_SHARD: a shard group
            is a node's GPUs, torch/distributed/fsdp/_init_utils.py `_init_intra_and_inter_node_groups`, the
            all-reduce on its own stream after each reduce-scatter, _runtime_utils.py `_reduce_grad`; torchtitan's
            `--parallelism.data_parallel_replicate_degree`, FSDP2 on a 2-D mesh). A shard group is dp_shard
            consecutive DP ranks (t apart), a replica group dp_replicate ranks t dp_shard apart
            (`shard_placement`, `replicate_placement`). 1: ZeRO over all dp ranks. The planner only: train.py
            shards over all of them.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    v: int = 1
    micro_batch: int = 1
    zero: ZeroStage = ZeroStage.NONE
    offload: Offload = Offload.NONE
    recompute: Recompute = Recompute.NONE
    sequence_parallel: bool = False
    zero_bubble: bool = False
    dp_replicate: int = 1

    def __post_init__(self) -> None:
        for flag, value in (("--tensor-model-parallel-size", self.tp), ("--pipeline-model-parallel-size", self.pp),
                            ("data-parallel size", self.dp), ("virtual pipeline size v", self.v),
                            ("--micro-batch-size", self.micro_batch),
                            ("--data-parallel-replicate-degree", self.dp_replicate)):
            check_number(flag, value, 1, integer=True)
        if not isinstance(self.zero, ZeroStage):
            object.__setattr__(self, "zero", ZeroStage(self.zero))
        for name, kind in (("offload", Offload), ("recompute", Recompute)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"Layout.{name} must be a {kind.__name__}, got {getattr(self, name)!r}")
        if self.zero_bubble and (self.v > 2 or self.pp < 2):
            raise ValueError(f"--pipeline-schedule zbh1 (v 1) / zbv (v 2) need pp >= 2, got v {self.v}, pp {self.pp}")

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def dp_shard(self) -> int:
        """The ranks ZeRO shards the states over: dp, or under HSDP a shard group's dp / dp_replicate."""
        return self.dp // self.dp_replicate

    @property
    def schedule(self) -> ScheduleKind:
        """1F1B with one chunk per rank, interleaved 1F1B with several (Narayanan et al. 2021); with
        `zero_bubble` ZB-H1 (v = 1) or ZBV (v = 2)."""
        if self.zero_bubble:
            return ScheduleKind.ZB_H1 if self.v == 1 else ScheduleKind.ZBV
        return ScheduleKind.ONE_F_ONE_B if self.v == 1 else ScheduleKind.INTERLEAVED

    def rank_stages(self, rank: int) -> tuple[int, ...]:
        """The global stages pipeline rank `rank` holds, chunk by chunk: c pp + r (Megatron's loop), or r and
        2 pp - 1 - r under ZBV's V."""
        return rank_stages(self.pp, self.v, self.schedule.placement)[rank]

    def stage_rank(self, stage: int) -> int:
        """The pipeline rank holding global stage `stage` (the LM head's, pp v - 1: rank pp - 1, rank 0 in a V)."""
        return self.schedule.placement.rank_chunk(stage, self.pp)[0]

    def short(self) -> str:
        """Compact one-line description, e.g. 'tp8 pp2 dp32 v1 b1 z1 sp full'."""
        bits = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}", f"v{self.v}", f"b{self.micro_batch}",
                f"z{int(self.zero)}"]
        if self.dp_replicate > 1:  # HSDP: shard group x replicas
            bits.append(f"hsdp{self.dp_shard}x{self.dp_replicate}")
        if self.offload is not Offload.NONE:
            bits.append(f"off:{self.offload.value}")
        if self.sequence_parallel:
            bits.append("sp")
        bits.append(self.recompute.value)
        if self.zero_bubble:
            bits.append(self.schedule.value)
        return " ".join(bits)


@dataclass(frozen=True)
class Workload:
    """What is trained.

    Attributes:
        model: the architecture (models/config.py).
        global_batch: sequences per optimizer step (`--global-batch-size`).
        seq_length: tokens per sequence (`--seq-length`).
        pad_vocab_to: the vocabulary is padded to a multiple of pad_vocab_to x tp (Megatron's
            `--make-vocab-size-divisible-by`; 1 = pad to a multiple of tp only, as the runtime does).
        precision: number formats of parameters, gradients and optimizer states (`--precision`; mixed for
            GPU runs, fp32 for this runtime on CPU).
        activations: which tensors a layer keeps for backward (`--activation-profile`; Korthikanti et al.'s
            Megatron-on-GPU count by default, bf16-flash for the same with flash attention, fp32-flash for
            this runtime on CPU).
        fp32_grads: mixed precision only: gradients accumulate and are reduced over DP in fp32 "main grads"
            (train.py's and Megatron's default with --bf16, and `hybrid plan`'s with --precision mixed since round
            23, off with `--grad-reduce-in-bf16` there as in train.py): 4 gradient bytes a parameter instead of 2
            (ZeRO 0: 2 + 4 + 12 = 18), twice the DP gradient traffic, and no separate fp32 master-gradient copy in
            the step. None (the default): the precision's own choice, what train.py runs -- True under MIXED
            (train.py's --bf16, `hybrid plan --precision mixed`), False otherwise (fp32 gradients are already 4
            bytes; True there is refused) -- resolved at construction, so the field reads a bool. Before round 24
            the default was False (bf16 gradients) while the CLI's and train.py's were fp32: every published
            row's builder now states its gradient dtype (fp32_grads=False where its source states none, as they
            were planned), `hybrid plan` (cli.grads_in_fp32) and `train.py --auto-parallel` pass the flags'.
        kernels: how the non-matmul ops are implemented (`--kernels`; hybrid/planner/ops.py): FUSED
            (Megatron-LM / Megatron-core, apex, Transformer Engine) or EAGER (plain PyTorch: this runtime,
            torchtitan without torch.compile); None: FUSED for the korthikanti profile, EAGER for the flash
            profiles (`kernel_profile`). torch.compile counts as FUSED. Which ops are fused only: the tensor-core
            clock is `stack`'s.
        stack: the software stack (`--stack`; ops.Stack), which sets the tensor-core clock: PYTORCH runs at the
            device's Hardware.eager_clock (h100-80g: H100_EAGER_CLOCK, fitted on MosaicML's six single-node MPT
            rows; eager or compiled alike), MEGATRON at the curve's rate. None (`--stack auto`): decided per layout
            by `pytorch_native`.
        fp8: the linear layers' GEMMs in FP8 (`--fp8`; Transformer Engine / torchao float8): at the device's FP8
            peak, their saved inputs 1 byte, casts and amax reductions added to the memory-bound work, the FP8
            casts of the computing layer's weights (and transposes) and the per-tensor scales in memory. The LM
            head and the attention stay bf16. The planner only: the runtime's FP8 waits for a GPU.
        fp8_scaling: how the FP8 casts find their scale (`--fp8-scaling`; ops.Fp8Scaling, priced in
            ops.fp8_casts): CURRENT (torchao float8, TE's current scaling: an amax pass before each cast) or
            DELAYED (TE's DelayedScaling: the cast records the amax). Only with --fp8.
        p2p: how the pipeline's messages block (`--pipeline-p2p`): OVERLAPPED (this runtime, Megatron-core),
            BLOCKING (DeepSpeed's pipeline engine: each pass also pays its messages, latency + bytes) or
            BLOCKING_SCATTER (Megatron-LM 2021-22: blocking, each TP rank sending 1/t, NVLink all-gather).
        grad_accumulation_fusion: does the weight-gradient GEMM add into the accumulated gradient
            (`--gradient-accumulation-fusion`; Megatron-LM's apex kernel, Transformer Engine)? False: autograd's
            AccumulateGrad (or a gradient hook) adds each micro-batch's new gradient in a memory pass of its own
            (eager PyTorch; DeepSpeed's pipeline engine, whose .grad buffers autograd fills); None: True for FUSED
            kernels, False for EAGER (`fused_grad_accumulation`).
        overlap_param_gather: ZeRO 1-2: does the all-gather of the updated parameters run under the next step's
            forward (`--overlap-param-gather`, this runtime's default)? False (`--no-overlap-param-gather`): it
            runs after the optimizer step, before the next step computes (DeepSpeed's ZeRO 1 under its
            pipeline engine), exposed in full.
        overlap_grad_reduce: ZeRO 0-1: is the DP gradient all-reduce / reduce-scatter issued bucket by bucket as the
            last micro-batch's backward fills them (Megatron-core's `--overlap-grad-reduce`, stated by its weak-scaling
            benchmark)? False (the default): it runs after the last backward, exposed in full (time._dp_step_seconds).
            The planner only (the API; no flag).
        fused_cross_entropy: the loss is one fused kernel over the bf16 logits (`--fused-cross-entropy`;
            flash-attn's CrossEntropyLoss, llm-foundry's default `loss_fn: fused_crossentropy`): the last stage
            keeps the bf16 logits and a fp32 logsumexp a token, and the backward writes one bf16 gradient over
            them -- 2 + 2 bytes a logit where torch's cross-entropy on fp32-upcast logits (this runtime,
            torchtitan, transformers) keeps 6 and briefly needs 8 more. Memory only: the head's memory-bound
            time is still torch's. The bf16-flash profile only; the planner only.
        megatron_unfused_loss: the loss is Megatron-core's unfused `_VocabParallelCrossEntropy`
            (megatron/core/tensor_parallel/cross_entropy.py, run when `--cross-entropy-loss-fusion` is off, the
            argparse default): its forward also divides the exponentials in place into the softmax it saves
            (`exp_logits.div_(sum_exp_logits)`), a sixth pass over the fp32 logits -- e + 36 bytes a logit in six
            kernels where the FUSED profile's loss prices e + 24 in five (ops.head_ops; round 25, planner25b). FUSED
            kernels only (the EAGER loss is torch's); the planner only (the API; no flag).
        attention_kernel: which flash-attention kernel times the attention core (hardware.AttentionKernel):
            FLASH2 (FlashAttention-2 / SDPA, the default), FLASH1 (flash-attn 1.x) or TRITON (llm-foundry's
            `attn_impl: triton`, as MosaicML's published MPT runs used: docs/planner/rounds.md "Attention kernels of the
            published runs", "Round 18"); its rate and its padded head width. The planner only (the API; no flag).
        cp_ring: which ring implementation runs context parallelism (RingSchedule): None picks by stack
            (context.ring_schedule: Megatron's Transformer Engine ring, or this runtime's on the PyTorch stack);
            TORCH_ALLGATHER for torch's experimental context_parallel (torchtitan). The planner only (the API).
        kv_repeated: the model expands K and V to the query heads before attention (torchtitan's Llama:
            `repeat_kv` ahead of scaled_dot_product_attention), so what context parallelism moves is K, V at the
            query width, a / g x the bytes of the kv heads. CP traffic only (not the saved activations). The
            planner only (the API).
        tp_comm_overlap: Megatron-core's `--tp-comm-overlap` (Transformer Engine userbuffers, NeMo's
            `ub_tp_comm_overlap`): with sequence parallelism, each layer's TP all-gathers and reduce-scatters run
            chunk by chunk under the GEMMs they feed or drain (time._tp_overlapped); on the PyTorch stack torch's
            async TP (torchtitan's `enable_async_tensor_parallel`: inductor's micro-pipeline pass, each fused
            collective under the matmuls it feeds or drains, the backward's input-gradient reduce-scatters unfused;
            hybrid/planner/async_tp.py); False: synchronous, as NCCL runs them. The planner only (the API; no
            flag): this runtime has neither.
        optimizer_dtype_bytes: mixed precision only: bytes of each of Adam's three per-parameter states (master
            weights, momentum, variance): 4 (fp32, the default: K = 12 bytes a parameter) or 2 (apex
            DistributedFusedAdam's `dtype: bf16` -- "datatype for optimizer state", which holds the master copy
            (`store_params`) and both moments in it -- as NeMo's `optim.dtype: bf16` sets it: K = 6). The
            planner only (the API; no flag): this runtime keeps fp32 states.
        zero3_runtime: the ZeRO 3 runtime whose copies on the compute stream are priced (Zero3Runtime;
            `--zero3-runtime`; time.zero3_copy_bytes): None (the default) prices none, as every round before 16 did
            -- round 16 measured the what-if (FSDP2's copies on the published rows, H100_500W_CLOCK refitted with
            them) and it did not improve the check rows without a family getting worse, so the model's default is
            unchanged (docs/planner/rounds.md "Round 16: the ZeRO 3 runtimes' copies";
            hybrid/planner/published16_zero3.py
            classifies each published ZeRO 3 row's runtime from its source). Only ZeRO 3 with dp > 1 reads it.
        tp_plan: how the runtime's TP feeds the column-parallel projections (TpPlan): BLOCK (the default: one
            all-gather of each block's input under SP, Megatron, this runtime, torchtitan) or PROJECTION (one per
            projection, KempnerForge's DTensor plan). The planner only (the API; no flag).
        sp_copies: sequence parallelism through torch DTensor on (batch, sequence, hidden) activations
            (torchtitan, KempnerForge): torch's functional collectives gather and scatter on dim 0
            (torch/distributed/_functional_collectives.py: `all_gather_tensor(..., gather_dim=1)` all-gathers, then
            `torch.cat(torch.chunk(out, t), dim=1)`; `reduce_scatter_tensor(..., scatter_dim=1)` first
            `torch.cat(torch.chunk(x, t, dim=1))`), so each SP all-gather and reduce-scatter also reads and writes
            its whole b s h tensor on the compute stream (time.tp_copy_bytes). Megatron's and this runtime's
            sequence-first activations need no such copy: False, the default. Not under tp_comm_overlap (async
            TP's fused all-gather-matmul; not priced). The planner only (the API; no flag).
        float8_tp_gathers: torchao's Float8 tensorwise TP (Float8ColwiseParallel, Float8RowwiseParallel,
            PrepareFloat8ModuleInput: torchtitan with Float8 and TP, `enable_float8_tensorwise_tp`): a layer's
            inputs are cast to float8 before their forward all-gather and its row-parallel outputs' gradients
            before their backward all-gather (torchao float8/float8_tensor_parallel.py), so a layer's all-gathers
            move 1 byte an element; reduce-scatters, and the embedding's and head's collectives (not float8
            linears), keep the activation dtype (predicted_comm.tp_ledger `gather_bytes`). The planner only.
        gathered_logits: the TP output head gathers the whole logits to every TP rank and each rank runs the loss
            over the whole vocabulary (KempnerForge kempnerforge/distributed/tensor_parallel.py: `ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Replicate())` on the head's projection): one more all-gather of
            b s V_p activations a micro-batch (with DTensor's copy under sp_copies: it gathers the last dim) in
            place of the vocab-parallel loss's three statistics all-reduces, and the loss's memory-bound passes
            over V_p logits a token, not V_p / t (predicted_comm.tp_ledger, ops.head_ops). Its backward slices the
            replicated gradient (no collective). False (the default): Megatron's vocab-parallel loss, torchtitan's
            `loss_parallel`, this runtime's. Memory too since round 24 (planner24d): the last stage keeps and the
            loss's backward makes the t = 1 loss's tensors over all V_p logits, not V_p / t (model.Shard
            .head_activation_bytes). The planner only (the API; no flag).
        bf16_cross_entropy: the loss is torch's `F.cross_entropy` called on the bf16 logits, no upcast
            (KempnerForge kempnerforge/training/loss.py `cross_entropy_loss`, `ce_chunk_size=0`): the last stage
            keeps the bf16 logits (the trainer's `logits` stays referenced through the backward) and the bf16
            log-softmax nll_loss saves, 2 + 2 bytes a logit, and the backward writes the log-softmax's and the
            logits' bf16 gradients, 2 + 2 more -- where torch's cross-entropy on fp32-upcast logits (this runtime,
            torchtitan) keeps 6 and briefly needs 8 more. Memory only (the loss's passes are still timed as
            torch's). The bf16-flash profile only; the planner only (the API; no flag).
        unsharded_grad_accumulation: under ZeRO 3 with more than one micro-batch, the runtime skips the
            gradients' reduce-scatter on all but the last micro-batch (FSDP2's `set_requires_gradient_sync(False)`:
            KempnerForge's `maybe_no_sync`, kempnerforge/training/grad.py), so every rank keeps the whole
            unsharded gradient of its parameters from the first micro-batch's backward to the last's
            reduce-scatter -- in the reduce dtype (fp32_grads: 4 bytes) when it differs from the parameters',
            as FSDP2 upcasts it to accumulate (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
            `to_accumulated_grad_if_needed`), else 2 -- while no sharded gradient exists (the optimizer's
            `zero_grad()` freed them; the last micro-batch's reduce-scatters make them as they free the
            unsharded ones): grads Psi x grad bytes, not / Nd (predicted_memory.grads_unsharded). Memory only:
            the reduce-scatters are still timed a micro-batch each. The planner only (the API; no flag);
            round 24, docs/planner/round24-kempner-memory.md.
        adam_master_copy: mixed precision's optimizer keeps a master copy of the weights beside its two moments
            (True, the default: Megatron, apex, this runtime). False: the optimizer steps the bf16 parameters
            themselves, its states the two moments in optimizer_dtype_bytes (torch's AdamW built on a model
            cast to bf16: KempnerForge's `model.to(dtype=param_dtype)` before `build_optimizer`), K = 2 x
            optimizer_dtype_bytes. Memory only (the step's passes are still timed with the master's). The
            planner only (the API; no flag); round 24.
        te_full_layer: the layer is Transformer Engine's whole TransformerLayer (NeMo 2.0's GPT configs,
            `use_transformer_engine_full_layer_spec: True`): its LayerNormMLP adds fc1's bias and reduces its
            gradient inside TE's kernels. False (the default): Megatron-core's / Megatron-LM's own layer, whose
            MLP adds fc1's bias in Megatron's bias-GELU and leaves the bias gradient to an autograd reduction
            (ops._bias_grad_ops; docs/planner/round21-gpt-arch.md). Time only, FUSED kernels only. The planner
            only (the API; no flag).
        fp8_param_gather: the model's weights are held in FP8 (Megatron-core's `--fp8-param-gather`, NeMo's
            `fp8_params: True` / MLPerf's FP8_PARAMS=True: TE's `fp8_model_init`), so ZeRO 1-2's all-gather of the
            updated parameters after the optimizer step moves 1 byte a parameter, not the 2 of bf16
            (param_gather_bytes: time._dp_step_seconds, predicted_comm.step_ledger; the gradients' reduce-scatter
            keeps grad_bytes). Needs fp8. Time only (the weights' memory is still planned at 2 bytes:
            conservative). The planner only (the API; no flag); round 22, docs/planner/round22-mlperf.md.
        pipeline_split: Megatron-core's explicit layer split (PipelineSplit: the embedding / the loss counted as a
            layer, or the first / last rank's layer counts), which may leave a stage with only the embedding or
            only the loss; None: the planner's split (stage_layers). `hybrid plan` takes Megatron's flags; the
            runtime does not run a stage without a layer: `--emit-args` refuses such a plan (train_flags; a split with
            a layer on every stage is emitted as `--pipeline-layers-per-stage`) and
            train.py refuses the flags by name (hybrid/train/other_flags.py).
    """

    model: ModelConfig
    global_batch: int
    seq_length: int
    pad_vocab_to: int = 1
    precision: Precision = Precision.MIXED
    activations: ActivationProfile = ActivationProfile.KORTHIKANTI
    fp32_grads: bool | None = None
    kernels: KernelProfile | None = None
    stack: Stack | None = None
    fp8: bool = False
    fp8_scaling: Fp8Scaling = Fp8Scaling.CURRENT
    p2p: PipelineP2P = PipelineP2P.OVERLAPPED
    grad_accumulation_fusion: bool | None = None
    overlap_param_gather: bool = True
    overlap_grad_reduce: bool = False
    fused_cross_entropy: bool = False
    megatron_unfused_loss: bool = False
    attention_kernel: AttentionKernel = AttentionKernel.FLASH2
    cp_ring: RingSchedule | None = None
    kv_repeated: bool = False
    tp_comm_overlap: bool = False
    optimizer_dtype_bytes: int = 4
    pipeline_split: PipelineSplit | None = None
    zero3_runtime: Zero3Runtime | None = None
    tp_plan: TpPlan = TpPlan.BLOCK
    sp_copies: bool = False
    float8_tp_gathers: bool = False
    gathered_logits: bool = False
    te_full_layer: bool = False
    fp8_param_gather: bool = False
    bf16_cross_entropy: bool = False
    unsharded_grad_accumulation: bool = False
    adam_master_copy: bool = True

    @property
    def param_gather_bytes(self) -> int:
        """Bytes a parameter in ZeRO 1-2's all-gather of the updated parameters after the optimizer step: the
        precision's (2 in mixed precision), 1 under fp8_param_gather (the distributed optimizer all-gathers the
        FP8 bytes its step cast the master weights to; round 22). ZeRO 3's per-micro-batch gathers keep the
        precision's bytes (no published ZeRO 3 row states FP8 weights)."""
        return 1 if self.fp8_param_gather else self.precision.param_bytes

    @property
    def fc1_bias_grad_in_kernel(self) -> bool:
        """fc1's bias gradient is reduced inside a fused kernel, so ops._bias_grad_ops prices no separate pass:
        TE's whole layer (te_full_layer), or a PyTorch-native trainer's fused MLP -- flash-attn's
        FusedDenseGeluDense (`fused_dense_gelu_dense`, flash_attn/ops/fused_dense.py), whose backward returns both
        bias gradients from its cuBLASLt GEMMs' epilogues (linear_gelu_linear_backward / linear_bias_backward), not
        from an autograd reduction (round 21's review: its five rows paid Megatron's bias-GELU pass)."""
        return self.te_full_layer or self.stack is Stack.PYTORCH

    def __post_init__(self) -> None:
        for flag, value in (("--global-batch-size", self.global_batch), ("--seq-length", self.seq_length),
                            ("--make-vocab-size-divisible-by", self.pad_vocab_to)):
            check_number(flag, value, 1, integer=True)
        for name, kind in (("precision", Precision), ("activations", ActivationProfile)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"Workload.{name} must be a {kind.__name__}, got {getattr(self, name)!r}")
        if self.fp32_grads is None:  # the precision's own: what train.py runs (see the field)
            object.__setattr__(self, "fp32_grads", self.precision is Precision.MIXED)
        if self.fp32_grads and self.precision is not Precision.MIXED:
            raise ValueError("--accumulate-allreduce-grads-in-fp32 needs --precision mixed (fp32 gradients are "
                             "already 4 bytes); drop the flag or plan mixed precision")
        if self.fused_cross_entropy and self.activations is not ActivationProfile.BF16_FLASH:
            raise ValueError(f"--fused-cross-entropy models a fused loss over bf16 logits: use it with "
                             f"--activation-profile bf16-flash, not {self.activations.value}")
        if self.bf16_cross_entropy and (self.fused_cross_entropy
                                        or self.activations is not ActivationProfile.BF16_FLASH):
            raise ValueError("Workload.bf16_cross_entropy models torch's cross-entropy on bf16 logits: use it with "
                             "the bf16-flash profile and without fused_cross_entropy (one loss at a time)")
        if self.megatron_unfused_loss and (self.fused_cross_entropy or self.bf16_cross_entropy):
            raise ValueError("Workload.megatron_unfused_loss models Megatron-core's unfused vocab-parallel loss: "
                             "drop fused_cross_entropy / bf16_cross_entropy (one loss at a time)")
        if self.cp_ring is not None and not isinstance(self.cp_ring, RingSchedule):
            raise ValueError(f"Workload.cp_ring must be a RingSchedule or None, got {self.cp_ring!r}")
        if not isinstance(self.attention_kernel, AttentionKernel):
            raise ValueError(f"Workload.attention_kernel must be an AttentionKernel, got {self.attention_kernel!r}")
        if self.kernels is not None and not isinstance(self.kernels, KernelProfile):
            raise ValueError(f"Workload.kernels must be a KernelProfile, got {self.kernels!r}")
        if self.stack is not None and not isinstance(self.stack, Stack):
            raise ValueError(f"Workload.stack must be a Stack, got {self.stack!r}")
        if not isinstance(self.fp8_scaling, Fp8Scaling):
            raise ValueError(f"Workload.fp8_scaling must be an Fp8Scaling, got {self.fp8_scaling!r}")
        if self.fp8_scaling is not Fp8Scaling.CURRENT and not self.fp8:
            raise ValueError("--fp8-scaling prices FP8 casts: add --fp8 or drop --fp8-scaling")
        if self.pipeline_split is not None and not isinstance(self.pipeline_split, PipelineSplit):
            raise ValueError(f"Workload.pipeline_split must be a PipelineSplit or None, got {self.pipeline_split!r}")
        if self.zero3_runtime is not None and not isinstance(self.zero3_runtime, Zero3Runtime):
            raise ValueError(f"Workload.zero3_runtime must be a Zero3Runtime "
                             f"({', '.join(r.value for r in Zero3Runtime)}), got {self.zero3_runtime!r}")
        if not isinstance(self.tp_plan, TpPlan):
            raise ValueError(f"Workload.tp_plan must be a TpPlan ({', '.join(p.value for p in TpPlan)}), "
                             f"got {self.tp_plan!r}")
        if self.fp8_param_gather and not self.fp8:
            raise ValueError("Workload.fp8_param_gather all-gathers FP8 weights: it needs fp8 (--fp8)")
        if self.float8_tp_gathers and not self.fp8:
            raise ValueError("Workload.float8_tp_gathers prices Float8 TP all-gathers: it needs fp8 (--fp8)")
        if self.optimizer_dtype_bytes not in (2, 4) or (self.optimizer_dtype_bytes != 4
                                                         and self.precision is not Precision.MIXED):
            raise ValueError(f"Workload.optimizer_dtype_bytes must be 4 (fp32 states) or, in mixed precision, 2 "
                             f"(bf16 states), got {self.optimizer_dtype_bytes!r}")
        if self.fp8 and self.precision is not Precision.MIXED:
            raise ValueError("--fp8 needs --precision mixed (FP8 GEMMs keep bf16 parameters and fp32 master "
                             "weights); drop --fp8 or plan mixed precision")
        self.shard(1)  # ValueError now if the activation profile cannot describe the model

    @property
    def kernel_profile(self) -> KernelProfile:
        """`kernels`, or its default by activation profile: FUSED for korthikanti (Megatron's runs, with their
        fused kernels), EAGER for the flash profiles (this runtime on CPU and GPU, PyTorch-native trainers such as
        torchtitan); a fused flash stack (Megatron-core with Transformer Engine) says --kernels fused."""
        if self.kernels is not None:
            return self.kernels
        return KernelProfile.FUSED if self.activations is ActivationProfile.KORTHIKANTI else KernelProfile.EAGER

    def pytorch_native(self, layout: "Layout") -> bool:
        """Does `layout` run on the PyTorch-native stack (Hardware.eager_clock applies)? `stack` when given;
        `--stack auto` (None): PyTorch-native when the kernels are eager (no Megatron run is); Megatron for the
        korthikanti profile (Megatron's own activations, materialised softmax); else PyTorch-native when the
        layout shards parameters (ZeRO 3: PyTorch FSDP, with or without TP / PP, as every published torchtitan,
        MPT, OLMo-core and fms-fsdp run in docs/planner/validation.md), Megatron otherwise (ZeRO 0-2: its distributed
        optimizer).
        Each layout of a search is priced as the stack that runs it. The one published row this rule gets wrong
        states its stack (NeMo's Megatron FSDP 8B: megatron)."""
        if self.stack is not None:
            return self.stack is Stack.PYTORCH
        if self.kernel_profile is KernelProfile.EAGER:
            return True
        return self.activations is not ActivationProfile.KORTHIKANTI and layout.zero is ZeroStage.PARAMETERS

    def device(self, hw, layout: "Layout"):
        """`hw` (a Hardware) as this workload sees it at `layout`: its stack's tensor-core clock applied
        (Hardware.for_stack; to the flash rate if its kernel is AttentionKernel.stack_clocked; already-clocked
        hardware is returned as it is)."""
        return hw.for_stack(self.pytorch_native(layout), self.attention_kernel.stack_clocked)

    @property
    def fused_grad_accumulation(self) -> bool:
        """`grad_accumulation_fusion`, or its default by kernel profile: fused stacks accumulate inside the
        weight-gradient GEMM, eager PyTorch in AccumulateGrad's pass."""
        if self.grad_accumulation_fusion is not None:
            return self.grad_accumulation_fusion
        return self.kernel_profile is KernelProfile.FUSED

    @property
    def optimizer_bytes(self) -> int:
        """K, the optimizer-state bytes a parameter: the precision's (12 mixed, 8 fp32), or 3 x
        optimizer_dtype_bytes in mixed precision (6 with bf16 states; 2 x without a master copy, 4 with
        bf16 states: adam_master_copy)."""
        if self.precision is Precision.MIXED:
            return (3 if self.adam_master_copy else 2) * self.optimizer_dtype_bytes
        return self.precision.optimizer_bytes

    @property
    def grad_bytes(self) -> int:
        """Bytes of one gradient element, in memory and in the DP (and TP partial, tied-embedding) reductions:
        4 with fp32_grads, else the precision's (2 mixed, 4 fp32)."""
        return 4 if self.fp32_grads else self.precision.grad_bytes

    @property
    def tp_gather_bytes(self) -> int | None:
        """Bytes an element of a layer's TP all-gathers: 1 under float8_tp_gathers (float8), else None (the
        activation dtype's; predicted_comm.tp_ledger)."""
        return 1 if self.float8_tp_gathers else None

    def shard(self, tp: int) -> Shard:
        """The model seen from one TP rank at size tp, with this workload's vocabulary padding and profile."""
        return Shard(self.model, tp, self.padded_vocab(tp), self.activations, self.fp8, self.fused_cross_entropy,
                     self.gathered_logits and tp > 1, self.bf16_cross_entropy)

    def padded_vocab(self, tp: int) -> int:
        """Vocabulary rows after padding to a multiple of pad_vocab_to x tp (hybrid/tp/layers.vocab_spec)."""
        multiple = self.pad_vocab_to * tp
        return math.ceil(self.model.vocab_size / multiple) * multiple

    def num_microbatches(self, layout: Layout) -> int:
        """m = global batch / (dp x micro-batch); check_layout guarantees it divides."""
        return self.global_batch // (layout.dp * layout.micro_batch)


@dataclass(frozen=True)
class Cluster:
    """The machines.

    Attributes:
        gpus: devices in the job (`--gpus`).
        hw: one device and its links (hybrid/planner/hardware.py).
        allow_cross_node_tp: let a TP group span nodes (`--allow-cross-node-tp`); off by default because TP
            moves four b s h all-reduces per layer per micro-batch.
    """

    gpus: int
    hw: Hardware
    allow_cross_node_tp: bool = False

    def __post_init__(self) -> None:
        check_number("--gpus", self.gpus, 1, integer=True)

    @property
    def nodes(self) -> int:
        return math.ceil(self.gpus / self.hw.gpus_per_node)


def layout_problems(work: Workload, cluster: Cluster, layout: Layout) -> list[str]:
    """Why `layout` cannot run `work` on `cluster`, one reason per line; empty when it can. Each reason says
    what to change ("tp 3 does not divide 32 heads")."""
    cfg, t, p, v = work.model, layout.tp, layout.pp, layout.v
    out = []
    if layout.world != cluster.gpus:
        out.append(f"tp {t} x pp {p} x dp {layout.dp} = {layout.world} ranks, not the {cluster.gpus} GPUs")
    out += tp_problems(cfg, cluster, t)
    out += pp_problems(cfg, p, v, work.pipeline_split)
    out += _batch_problems(work, layout)
    out += _switch_problems(layout)
    if layout.dp_replicate > 1 and cfg.num_experts:
        out.append(f"--data-parallel-replicate-degree {layout.dp_replicate}: HSDP is not planned for an MoE model "
                   f"(its expert groups are priced over the whole DP group); give 1")
    return out


def tp_problems(cfg: ModelConfig, cluster: Cluster, t: int) -> list[str]:
    """Why tensor-parallel size t cannot split `cfg` on `cluster` (empty when it can)."""
    out = []
    if cfg.num_heads % t:
        out.append(f"tp {t} does not divide {cfg.num_heads} heads")
    if cfg.num_kv_heads % t and t % cfg.num_kv_heads:
        out.append(f"tp {t} and {cfg.num_kv_heads} kv-heads do not divide one another")
    if cfg.ffn_hidden_size % t:
        out.append(f"tp {t} does not divide the MLP width {cfg.ffn_hidden_size}")
    g = cluster.hw.gpus_per_node
    if not cluster.allow_cross_node_tp and (t > g or g % t):
        out.append(f"tp {t} would span nodes of {g} GPUs (pass --allow-cross-node-tp to allow)")
    return out


def pp_problems(cfg: ModelConfig, p: int, v: int, split: PipelineSplit | None = None) -> list[str]:
    """Why pp ranks with v chunks each cannot split the layers of `cfg` (empty when they can). With Megatron's
    stated `split` a stage may hold only the embedding or the loss: megatron_split's own problem instead."""
    L = cfg.num_layers
    if split is not None and p > 1:
        try:
            megatron_split(L, p, v, split)
        except ValueError as exc:
            return [str(exc)]
        return []
    if p * v > L:
        return [f"pp {p} x v {v} = {p * v} stages exceed the {L} layers"]
    if v > 1 and p == 1:
        return [f"v {v} needs pp > 1 (interleaving chunks on one rank only adds hand-offs)"]
    return []  # stages that do not divide the layers are balanced by FLOPs (stage_layers), interleaved or not


def _batch_problems(work: Workload, layout: Layout) -> list[str]:
    per_replica, rem = divmod(work.global_batch, layout.dp)
    if rem:
        return [f"global batch {work.global_batch} is not divisible by dp {layout.dp}"]
    if per_replica % layout.micro_batch:
        return [f"micro-batch {layout.micro_batch} does not divide the {per_replica} sequences per DP replica"]
    m = per_replica // layout.micro_batch
    if layout.v > 1 and not layout.zero_bubble and m % layout.pp:  # ZBV runs any m
        return [f"interleaving needs the {m} micro-batches to be a multiple of pp {layout.pp}"]
    return []


def _switch_problems(layout: Layout) -> list[str]:
    out = []
    if layout.sequence_parallel and layout.tp == 1:
        out.append("sequence parallelism needs tp > 1")
    if layout.zero is not ZeroStage.NONE and layout.dp == 1:
        out.append(f"ZeRO {int(layout.zero)} with dp 1 partitions nothing (use ZeRO 0)")
    if layout.offload is Offload.OPTIMIZER and layout.zero is ZeroStage.NONE:
        out.append("optimizer offload needs ZeRO >= 1 (the CPU updates this rank's partition)")
    if layout.offload is Offload.OPTIMIZER_AND_PARAMS and layout.zero is not ZeroStage.PARAMETERS:
        out.append("parameter offload needs ZeRO 3")
    return out + hsdp_problems(layout)


def hsdp_problems(layout: Layout) -> list[str]:
    """Why layout.dp_replicate cannot split its DP ranks (empty when it can, or at 1): HSDP is ZeRO 3 inside a
    shard group, so it needs ZeRO 3, replicas dividing dp, and a shard group of at least 2 ranks (1 is ZeRO 0)."""
    r, d = layout.dp_replicate, layout.dp
    if r == 1:
        return []
    if layout.zero is not ZeroStage.PARAMETERS:
        return [f"--data-parallel-replicate-degree {r} (HSDP) shards ZeRO 3's states inside each replica: it needs "
                f"--zero-stage 3, not {int(layout.zero)}"]
    if d % r or d == r:
        return [f"--data-parallel-replicate-degree {r} must divide the data-parallel size {d} and leave a shard "
                f"group of 2 or more ranks (e.g. {d // 2 if d % 2 == 0 and d > 2 else 1}; 1: shard over all)"]
    return []


def check_layout(work: Workload, cluster: Cluster, layout: Layout) -> None:
    """ValueError naming every problem of `layout_problems`."""
    problems = layout_problems(work, cluster, layout)
    if problems:
        raise ValueError(f"layout {layout.short()} cannot run: " + "; ".join(problems))


# --- where the groups sit -------------------------------------------------------------------------

def tp_placement(cluster: Cluster, layout: Layout) -> GroupPlacement:
    """TP group = t consecutive ranks: inside a node when t divides the node size."""
    t, g = layout.tp, cluster.hw.gpus_per_node
    return GroupPlacement(size=t, per_node=t if g % t == 0 else math.gcd(t, g))


def dp_placement(cluster: Cluster, layout: Layout) -> GroupPlacement:
    """DP group = d ranks t apart inside a block of t d consecutive ranks (one pipeline stage)."""
    t, d, g = layout.tp, layout.dp, cluster.hw.gpus_per_node
    block = t * d
    if g % block == 0:
        return GroupPlacement(size=d, per_node=d)
    return GroupPlacement(size=d, per_node=max(1, math.gcd(block, g) // t))


def shard_placement(cluster: Cluster, layout: Layout) -> GroupPlacement:
    """The ZeRO shard group: all the DP group (dp_placement), or under HSDP dp_shard consecutive DP ranks, t apart
    in a block of t dp_shard ranks: a node's GPUs when t dp_shard is the node size (FSDP1's HYBRID_SHARD)."""
    if layout.dp_replicate == 1:
        return dp_placement(cluster, layout)
    t, s, g = layout.tp, layout.dp_shard, cluster.hw.gpus_per_node
    if g % (t * s) == 0:
        return GroupPlacement(size=s, per_node=s)
    return GroupPlacement(size=s, per_node=max(1, math.gcd(t * s, g) // t))


def replicate_placement(cluster: Cluster, layout: Layout) -> GroupPlacement:
    """HSDP's replica group: the dp_replicate ranks holding the same shard, t dp_shard apart (one a node when a
    shard group fills a node); a group of one without HSDP."""
    r, stride, g = layout.dp_replicate, layout.tp * layout.dp_shard, cluster.hw.gpus_per_node
    if r == 1:
        return GroupPlacement(size=1, per_node=1)
    return GroupPlacement(size=r, per_node=max(1, min(r, g // stride)) if g % stride == 0 else 1)


def pipeline_crosses_nodes(cluster: Cluster, layout: Layout) -> bool:
    """Do some pipeline neighbours (t d ranks apart) sit in different nodes?"""
    return layout.pp > 1 and layout.tp * layout.dp * layout.pp > cluster.hw.gpus_per_node


# --- which layers each stage holds ----------------------------------------------------------------

@lru_cache(maxsize=256)
def rank_stages(pp: int, v: int, placement: Placement = Placement.LOOP) -> tuple[tuple[int, ...], ...]:
    """Per pipeline rank, the global stages of its chunks (chunk order): `Placement.stage` for every (r, c)."""
    return tuple(tuple(placement.stage(r, c, pp) for c in range(v)) for r in range(pp))


@dataclass(frozen=True)
class PipelineSplit:
    """Megatron-core's explicit pipeline split (Workload.pipeline_split), in its flags' terms.

    Attributes:
        embedding: `--account-for-embedding-in-pipeline-split`: the embedding counts as one layer, so the first
            stage (chunk 0 of rank 0) holds one transformer layer fewer -- none when a stage is one layer.
        loss: `--account-for-loss-in-pipeline-split`: the LM head and loss count as one layer on the last stage.
        first: `--decoder-first-pipeline-num-layers N`: pipeline rank 0 holds N layers (N / v a chunk).
        last: `--decoder-last-pipeline-num-layers N`: the last pipeline rank holds N layers; the middle ranks
            split the rest evenly. Exclusive with `embedding` / `loss`, as in Megatron-core.
    """

    embedding: bool = False
    loss: bool = False
    first: int | None = None
    last: int | None = None

    def flags(self) -> dict[str, object]:
        """{Megatron-core's argparse dest: value} of the flags this split states."""
        out: dict[str, object] = {}
        if self.embedding:
            out["account_for_embedding_in_pipeline_split"] = True
        if self.loss:
            out["account_for_loss_in_pipeline_split"] = True
        if self.first is not None:
            out["decoder_first_pipeline_num_layers"] = self.first
        if self.last is not None:
            out["decoder_last_pipeline_num_layers"] = self.last
        return out

    def check(self, num_layers: int) -> None:
        """What no pipeline size can split, before a search: otherwise every pp > 1 layout is rejected on it and
        the search answers pp 1 (which ignores a split) without a word. ValueError naming the flags: the
        accounting flags beside a layer count (exclusive in Megatron-core), first + last above the model's
        layers."""
        named = " and ".join("--" + k.replace("_", "-") for k in self.flags())
        if (self.embedding or self.loss) and (self.first is not None or self.last is not None):
            raise ValueError(f"{named}: the accounting flags and the first / last layer counts are exclusive (as "
                             f"in Megatron-core); give one kind")
        if (self.first or 0) + (self.last or 0) > num_layers:
            raise ValueError(f"{named}: {(self.first or 0) + (self.last or 0)} layers on the first / last pipeline "
                             f"rank, more than the model's {num_layers}; give at most {num_layers} in all")


def megatron_split(num_layers: int, pp: int, v: int, split: PipelineSplit) -> tuple[int, ...]:
    """Layers of each of the pp v global stages (stage = chunk pp + rank) as Megatron-core builds them
    (transformer_block.get_num_layers_to_build): with the accounting flags L + e + l "layers" (e, l = 1 for the
    embedding / loss) split evenly over pp v stages, the first stage's share less e, the last's less l; with
    first / last counts, ranks 0 and pp - 1 hold them and the pp - 2 middle ranks the rest evenly, each rank's
    layers split evenly over its v chunks. ValueError naming the flag when the layers do not split so."""
    stages, named = pp * v, " and ".join("--" + k.replace("_", "-") for k in split.flags())
    if (split.embedding or split.loss) and (split.first is not None or split.last is not None):
        raise ValueError(f"{named}: the accounting flags and the first / last layer counts are exclusive (as in "
                         f"Megatron-core); give one kind")
    if split.embedding or split.loss:
        total = num_layers + split.embedding + split.loss
        counts = [total // stages] * stages
        counts[0] -= split.embedding
        counts[-1] -= split.loss
        if total % stages or min(counts) < 0:
            raise ValueError(f"{named}: {num_layers} layers + {split.embedding + split.loss} do not split evenly "
                             f"over pp {pp} x v {v} stages of at least one; pick pp x v dividing {total}")
        return tuple(counts)
    first, last = split.first, split.last
    middle = pp - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    if pp < 2 or any(n is not None and (n < 0 or n % v) for n in (first, last)) or rest < 0 \
            or (middle == 0 and rest) or (middle and rest % (middle * v)):
        ends = ((first, "first"), (last, "last"))
        held = " and ".join(f"{n} on the {end} rank" for n, end in ends if n is not None)
        raise ValueError(f"{named}: pp {pp} x v {v} cannot hold {held} and the other {rest} layers evenly on "
                         f"{middle} middle ranks (each rank's layers a multiple of v)")
    per_rank = [rest // middle if middle else 0] * pp
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    return tuple(per_rank[r] // v for c in range(v) for r in range(pp))


def stage_layers(cfg: ModelConfig, pp: int, v: int, seq: int = 2048,
                 split: PipelineSplit | None = None) -> tuple[int, ...]:
    """Layer count of each of the pp v global stages (stage = chunk pp + rank), via hybrid.partition:
    UNIFORM when pp v divides the layers (Megatron's default split), else BALANCED by FLOPs with the embedding
    on stage 0 and the LM head on the last stage (hybrid.partition.stage_costs_from_config), which gives the
    first and the last stage fewer layers (Llama 3 405B: 126 layers on 16 stages as 7, 8 x 14, 7), with or
    without interleaving (v > 1: every chunk is a stage of its own). train.py runs such a split from
    `--pipeline-layers-per-stage` (cli.train_args emits the counts). With a stated `split` (Megatron-core's
    flags, Workload.pipeline_split) the split is Megatron's (megatron_split): a stage may then hold no layer,
    only the embedding or only the LM head and loss."""
    if split is not None and pp > 1:  # one pipeline stage holds everything whatever the split says
        return megatron_split(cfg.num_layers, pp, v, split)
    return _stage_layers(cfg.num_layers, pp, v, _balance_key(cfg, seq) if cfg.num_layers % (pp * v) else None)


def _balance_key(cfg: ModelConfig, seq: int) -> tuple[float, float, float]:
    costs = stage_costs_from_config(cfg, seq, 1)
    return costs.layer_cost, costs.embedding_cost, costs.head_cost


@lru_cache(maxsize=1024)
def _stage_layers(num_layers: int, pp: int, v: int, costs: tuple[float, float, float] | None) -> tuple[int, ...]:
    if costs is None:
        parts = partition_layers(num_layers, pp, v, PartitionMethod.UNIFORM)
    else:
        layer, embedding, head = costs
        parts = partition_layers(num_layers, pp, v, PartitionMethod.BALANCED, layer_cost=layer,
                                 embedding_cost=embedding, head_cost=head)
    return tuple(len(p) for p in parts)
