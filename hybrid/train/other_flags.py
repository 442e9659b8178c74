"""Megatron-LM flags train.py does not take, with where their setting lives here: the one line an unknown flag gets
(hybrid.cliutil.OneLineParser's `hints`) names it instead of a near spelling that would mislead (--num-layers is
not --num-layers-per-virtual-pipeline-stage, --merge-file not --metrics-file, --ep not --help)."""

from __future__ import annotations

from hybrid.cliutil import parallel_hints
from hybrid.data.tokenizer import tokenizer_hints

MODEL = "the model's shape comes from --model (a preset, or a transformers config.json: write {field} there)"

# Megatron's model-shape flags -> the config.json field that sets the same thing (transformers' names)
SHAPE_FIELDS = {
    "--num-layers": "num_hidden_layers",
    "--hidden-size": "hidden_size",
    "--ffn-hidden-size": "intermediate_size",
    "--num-attention-heads": "num_attention_heads",
    "--num-query-groups": "num_key_value_heads",
    "--group-query-attention": "num_key_value_heads",
    "--max-position-embeddings": "max_position_embeddings",
    "--vocab-size": "vocab_size",
    "--rotary-base": "rope_theta",
    "--untie-embeddings-and-output-weights": "tie_word_embeddings: false",
    "--num-experts": "num_local_experts (Mixtral) or num_experts (Qwen2-MoE)",
    "--moe-router-topk": "num_experts_per_tok",
    "--moe-ffn-hidden-size": "moe_intermediate_size (Qwen2-MoE; Mixtral's experts are intermediate_size wide)",
    "--moe-shared-expert-intermediate-size": "shared_expert_intermediate_size (Qwen2-MoE)",
}

# Megatron's (and torchtitan's) short and other names of flags train.py has
RENAMED = {
    "--tp": "--tensor-model-parallel-size", "--pp": "--pipeline-model-parallel-size",
    "--cp": "--context-parallel-size", "--ep": "--expert-model-parallel-size",
    "--etp": "--expert-tensor-parallel-size", "--expert-parallel-size": "--expert-model-parallel-size",
    "--use-distributed-optimizer": "--zero-stage 1 (Megatron's distributed optimizer shards the optimizer state: "
                                   "ZeRO stage 1)",
    "--moe-grouped-gemm": "--moe-experts-impl grouped",
    # Megatron-DeepSpeed's and DeepSpeed's names for EP (round 15: "did you mean --context-parallel-size?")
    "--moe-expert-parallel-size": "--expert-model-parallel-size", "--ep-size": "--expert-model-parallel-size",
    "--recompute-activations": "--recompute-granularity selective (Megatron's --recompute-activations is the same "
                               "switch)",
    # round 22: Megatron's older and Megatron-DeepSpeed's names
    "--encoder-seq-length": "--seq-length (Megatron's other name of it)",
    "--checkpoint-activations": "--recompute-granularity full (Megatron's older name)",
    "--checkpoint-num-layers": "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
                               "(Megatron's older name; units of one layer)",
    "--ddp-bucket-size": "--zero-bucket-bytes (in bytes: Megatron's bucket counts parameters, x 4 for fp32 "
                         "gradients, x 2 for bf16)",
    "--use-torch-fsdp2": "--zero-stage 3 (parameters, gradients and optimizer state sharded over dp, as FSDP2)",
}

POSITIONS = "model_type llama for rotary embeddings (rope_theta), gpt2 for learned positions"
# Megatron's flags for an architecture choice: a model's architecture is its config's model_type here
ARCH_FIELDS = {
    "--swiglu": "model_type llama (or mistral, qwen2): a gated SiLU MLP, hidden_act silu",
    "--normalization": "model_type llama for RMSNorm (rms_norm_eps), gpt2 for LayerNorm (layer_norm_epsilon)",
    "--norm-epsilon": "rms_norm_eps (llama family) or layer_norm_epsilon (gpt2)",
    "--position-embedding-type": POSITIONS,
    "--disable-bias-linear": "model_type llama (no linear biases; gpt2 has them)",
    "--use-rotary-position-embeddings": POSITIONS,
    "--no-position-embedding": POSITIONS,
}

# Megatron-core's explicit pipeline splits: the planner prices them (layout.PipelineSplit), the runtime does not run
# a stage holding only the embedding or only the loss
SPLIT_ONLY = ("not implemented: every pipeline stage here holds a transformer layer; give each stage's layers with "
              "--pipeline-layers-per-stage (the embedding stays on the first stage, the loss on the last)")
SPLIT_BY_HAND = "give each stage's layers with --pipeline-layers-per-stage (e.g. 7,8,8,7); drop the flag"

# Megatron's fp16 loss-scale flags: the scale here is dynamic, its knobs DeepSpeed's JSON keys (hybrid/zero/ds_config.py)
LOSS_SCALE = ("the fp16 loss scale is dynamic (from 2^16, halved on an overflow, doubled after 1000 clean steps); "
              "set {key} in a --deepspeed-config JSON")
STATIC_SCALE = ("a static loss scale is not implemented: the fp16 loss scale is dynamic; its start is "
                "fp16.initial_scale_power in a --deepspeed-config JSON; drop the flag")
HYSTERESIS = ("not implemented: the fp16 loss scale halves at the first overflow (as DeepSpeed's at hysteresis 1); "
              "drop the flag")

TIMERS = ("per-rank step times and the time split print every --timing-log-interval log intervals "
          "(docs/operations.md); drop the flag")
GRAD_NORM_ONLY = "not implemented; the log line has the gradient norm"
# Megatron flags with nothing to set here, or not implemented: what to do instead
INSTEAD = {
    "--use-flash-attn": "attention is torch's scaled_dot_product_attention, which picks its flash kernel where the "
                        "device has one (context parallelism: its own ring, docs/context-parallel.md); drop the flag",
    "--use-mcore-models": "hybrid has one implementation of each model (models/); drop the flag",
    "--transformer-impl": "hybrid has one implementation of each model (models/); drop the flag",
    "--attention-softmax-in-fp32": "there is no such switch: attention is torch's scaled_dot_product_attention (its "
                                   "flash and memory-efficient kernels keep the softmax statistics in fp32); drop "
                                   "the flag",
    "--no-masked-softmax-fusion": "there is no fused masked softmax (scaled_dot_product_attention); drop the flag",
    "--distributed-backend": "NCCL on CUDA, gloo on CPU, chosen by the device; drop the flag",
    "--init-method-std": "weights are initialised with std 0.02 (a config.json's initializer_range must say 0.02); "
                         "drop the flag",
    "--account-for-embedding-in-pipeline-split": SPLIT_ONLY,
    "--account-for-loss-in-pipeline-split": SPLIT_ONLY,
    "--decoder-first-pipeline-num-layers": SPLIT_BY_HAND,
    "--decoder-last-pipeline-num-layers": SPLIT_BY_HAND,
    "--pipeline-model-parallel-layout": SPLIT_BY_HAND,
    "--loss-scale": STATIC_SCALE,
    "--initial-loss-scale": LOSS_SCALE.format(key="fp16.initial_scale_power (the power of two it starts at)"),
    "--loss-scale-window": LOSS_SCALE.format(key="fp16.loss_scale_window"),
    "--min-loss-scale": LOSS_SCALE.format(key="fp16.min_loss_scale"),
    "--hysteresis": HYSTERESIS,
    "--train-samples": "give --train-iters (samples / --global-batch-size)",
    "--lr-decay-samples": "give --lr-decay-iters (samples / --global-batch-size)",
    "--lr-warmup-samples": "give --lr-warmup-iters (samples / --global-batch-size)",
    "--exit-duration-in-mins": "not implemented; --exit-interval N stops after N iterations, --exit-signal-handler "
                               "saves and exits on SIGTERM",
    "--rampup-batch-size": "a batch-size ramp is not implemented; --global-batch-size is constant",
    "--start-weight-decay": "a weight-decay schedule is not implemented; --weight-decay is constant",
    "--weight-decay-incr-style": "a weight-decay schedule is not implemented; --weight-decay is constant",
    "--mock-data": "omit --data-path for the built-in corpus (docs/data.md)",
    # on in every run, nothing to switch: the flags of Megatron-LM's example scripts (examples/gpt3/*.sh)
    "--overlap-grad-reduce": "gradient reductions always overlap backward (each bucket of --zero-bucket-bytes is "
                             "posted from autograd's hooks as soon as backward has produced it); drop the flag",
    "--no-gradient-accumulation-fusion": "there is no fused gradient-accumulation kernel (apex's) to turn off; drop "
                                         "the flag",
    "--log-throughput": "tokens/s and TFLOP/s/device are on every log line (--log-interval); drop the flag",
    "--log-timers-to-tensorboard": TIMERS,
    "--timing-log-level": TIMERS,
    "--log-params-norm": GRAD_NORM_ONLY,
    "--log-num-zeros-in-grad": GRAD_NORM_ONLY,
    "--adam-eps": "Adam's eps is 1e-8 (Megatron's default), no flag sets it; drop the flag",
    "--ckpt-format": "checkpoints have one format, torch's DCP with a manifest (docs/checkpoint.md); drop the flag",
    # round 14's new-user pass: Megatron flags whose near spelling misled ("did you mean --context-parallel-size?")
    # or that said only "see --help"
    "--hierarchical-context-parallel-sizes": "hierarchical context parallelism (a2a+p2p) is not implemented: give "
                                             "--context-parallel-size N with --cp-comm-type a2a or p2p "
                                             "(docs/context-parallel.md)",
    "--align-param-gather": "not implemented (Megatron's launches every pipeline stage's parameter all-gathers at "
                            "once); each stage posts its own as its optimizer step ends (--overlap-param-gather, on "
                            "by default); drop the flag",
    "--tp-comm-overlap": "Transformer Engine's userbuffer overlap is not implemented; without SP the input "
                         "gradient's all-reduce always overlaps the weight gradients (Megatron-core's "
                         "allreduce_dgrad, docs/tensor-parallel.md); drop the flag",
    "--kv-channels": MODEL.format(field="head_dim (the llama family)"),
    "--make-vocab-size-divisible-by": "the vocabulary is padded to a multiple of --tensor-model-parallel-size "
                                      "(no more); `hybrid plan --make-vocab-size-divisible-by` prices Megatron's "
                                      "padding; drop the flag",
    "--fp8": "not implemented in training (`hybrid plan --fp8` prices it): train in --bf16; drop the flag",
    "--fp8-format": "not implemented in training (`hybrid plan --fp8` prices it): train in --bf16; drop the flag",
}

# round 22's new-user pass: the flags of Megatron-LM's own example scripts (examples/gpt3/*.sh, examples/llama/*.sh)
# and of Megatron-DeepSpeed's that said "see --help" or a misleading near spelling (--fp8-param-gather "did you mean
# --overlap-param-gather?", --lr-warmup-init "--lr-warmup-iters?", --save-retain-interval "--save-interval?")
FUSION = "there is no fused kernel to turn off (--compile fuses each block's elementwise ops); drop the flag"
FP8 = "not implemented in training (`hybrid plan --fp8` prices it): train in --bf16; drop the flag"
PROFILE = ("torch.profiler is not wired in: --timeline FILE.json writes the last step's per-rank Chrome trace "
           "(Perfetto), and the time split prints every --timing-log-interval log intervals; drop the flag")
TB_ALWAYS = ("--tensorboard-dir gets the loss, learning rate, grad norm, loss scale, throughput, memory and the "
             "validation loss and ppl at every --log-interval; drop the flag")
PER_SPLIT = ("separate datasets per split are not implemented: give --data-path (one dataset or a weighted blend) "
             "and --split train,valid,test")
SAVE_KEEP = ("not implemented: every --save-interval checkpoint is persistent; --save-keep N keeps the N newest "
             "(docs/checkpoint.md)")
SCHEDULE_FROM_FLAGS = ("the schedule always comes from the flags given now (Megatron's --override-opt_param-"
                       "scheduler); a resume names any schedule flag that changed since the checkpoint")
INSTEAD.update({
    "--attention-backend": "attention is torch's scaled_dot_product_attention, which picks its kernel (flash, "
                           "memory-efficient or math) for the device and dtype; drop the flag",
    "--use-flash-attn-v2": INSTEAD["--use-flash-attn"],
    "--use-flash-attn-triton": INSTEAD["--use-flash-attn"],
    "--use-legacy-models": INSTEAD["--use-mcore-models"],
    "--rotary-percent": "rotary embeddings turn the whole head dimension (Megatron's 1.0); a fraction is not "
                        "implemented; drop the flag",
    "--apply-layernorm-1p": "not implemented (a norm's weight is its scale, not 1 + weight); drop the flag",
    "--qk-layernorm": "not implemented in these models (no norm on queries and keys); drop the flag",
    "--squared-relu": MODEL.format(field="activation_function relu2 (gpt2)"),
    "--init-method-xavier-uniform": INSTEAD["--init-method-std"],
    "--decoupled-lr": "a separate rate for the embedding and output layer is not implemented: every parameter "
                      "follows --lr and --min-lr; drop the flag",
    "--decoupled-min-lr": "a separate rate for the embedding and output layer is not implemented: every parameter "
                          "follows --lr and --min-lr; drop the flag",
    "--lr-warmup-init": "the warm-up starts from 0 (Megatron's default --lr-warmup-init 0.0); another start is not "
                        "implemented; drop the flag",
    "--calculate-per-token-loss": "every micro-batch has the same number of loss tokens (no loss mask), so the "
                                  "per-token mean is the mean over micro-batches this runs; drop the flag",
    "--eod-mask-loss": "not implemented: the end-of-document token's loss counts as any token's; drop the flag",
    "--cross-entropy-loss-fusion": "there is no fused cross-entropy to switch on (the loss is the vocab-parallel "
                                   "cross-entropy in fp32); drop the flag",
    "--fp16-lm-cross-entropy": "not implemented: the cross-entropy runs in fp32 (the logits upcast); drop the flag",
    "--no-bias-gelu-fusion": FUSION, "--no-bias-dropout-fusion": FUSION, "--no-bias-swiglu-fusion": FUSION,
    "--no-rope-fusion": FUSION, "--no-persist-layer-norm": FUSION,
    "--no-async-tensor-model-parallel-allreduce": "without SP the input gradient's all-reduce always overlaps the "
                                                  "weight gradients (docs/tensor-parallel.md); drop the flag",
    "--manual-gc": "not implemented: Python's garbage collector runs as usual; drop the flag",
    "--empty-unused-memory-level": "not implemented (torch's caching allocator keeps freed blocks); drop the flag",
    "--use-cpu-initialization": "what it is for -- the same initial weights at every --tensor-model-parallel-size "
                                "-- is how weights are initialised here (each shard cut from its full tensor drawn "
                                "from --seed: hybrid/tp/sharding.init_parameters); drop the flag",
    "--deterministic-mode": "not implemented as a switch; drop the flag",
    "--fp8-amax-history-len": FP8, "--fp8-amax-compute-algo": FP8, "--fp8-param-gather": FP8, "--fp8-recipe": FP8,
    "--profile": PROFILE, "--profile-step-start": PROFILE, "--profile-step-end": PROFILE,
    "--profile-ranks": PROFILE, "--use-pytorch-profiler": PROFILE,
    "--log-validation-ppl-to-tensorboard": TB_ALWAYS, "--log-memory-to-tensorboard": TB_ALWAYS,
    "--log-loss-scale-to-tensorboard": TB_ALWAYS, "--tensorboard-log-interval": TB_ALWAYS,
    "--log-world-size-to-tensorboard": "not implemented (the start-up line gives the layout); drop the flag",
    "--log-progress": "not implemented (each log line has the consumed samples and an ETA); drop the flag",
    "--no-mmap-bin-files": "the .bin / .idx files are always memory-mapped (a batch reads its samples' pages); drop "
                           "the flag",
    "--data-impl": "the indexed dataset is always memory-mapped (Megatron's mmap); drop the flag",
    "--num-workers": "batches are read in the training process from the memory-mapped dataset (no loader "
                     "workers); drop the flag",
    "--no-create-attention-mask-in-dataloader": "no attention mask is built (causal attention in the kernel; "
                                                "documents apart only with --reset-attention-mask); drop the flag",
    "--tiktoken-pattern": "the tokenizer is one tokenizer.json here (--tokenizer-type HuggingFaceTokenizer "
                          "--tokenizer-model); drop the flag",
    "--train-data-path": PER_SPLIT, "--valid-data-path": PER_SPLIT, "--test-data-path": PER_SPLIT,
    "--data-args-path": PER_SPLIT, "--per-split-data-args-path": PER_SPLIT,
    "--save-retain-interval": SAVE_KEEP, "--non-persistent-save-interval": SAVE_KEEP,
    "--override-opt_param-scheduler": SCHEDULE_FROM_FLAGS + "; drop the flag",
    "--use-checkpoint-opt_param-scheduler": "not implemented: " + SCHEDULE_FROM_FLAGS + ": give the saved run's "
                                            "--lr, --min-lr, --lr-warmup-iters, --lr-decay-style, --lr-decay-iters",
    "--finetune": "not implemented as one flag: a checkpoint's weights as a new run's start are `hybrid convert "
                  "CKPT HF/` then --load HF/ (initial weights, iteration 0; docs/convert.md)",
    "--skip-train": "--load CKPT --train-iters N with N the checkpoint's iteration trains nothing and prints the "
                    "validation and test losses (--eval-iters > 0), as Megatron's --skip-train; drop the flag",
    "--DDP-impl": "data parallelism is hybrid's own bucketed reduction or ZeRO engine (--zero-stage); drop the flag",
    "--ddp-average-in-collective": "gradients are averaged over the data-parallel ranks already; drop the flag",
    "--distribute-saved-activations": "not implemented (--sequence-parallel splits the norms' and dropout's saved "
                                      "activations over tp); drop the flag",
    "--distribute-checkpointed-activations": "not implemented (--sequence-parallel splits the norms' and dropout's "
                                             "saved activations over tp); drop the flag",
    "--deepspeed": "DeepSpeed's switch (Megatron-DeepSpeed): here --deepspeed-config ds.json alone reads the JSON; "
                   "drop --deepspeed",
    "--deepspeed-activation-checkpointing": "activations are checkpointed with torch's checkpoint: "
                                            "--recompute-granularity full or selective; drop the flag",
    "--no-pipeline-parallel": "there is no pipeline unless --pipeline-model-parallel-size N > 1; drop the flag",
})

# round 15's new-user pass: DeepSpeed-Ulysses' sequence-parallel degree is context parallelism with heads split
# (--sequence-parallel-size got "did you mean --sequence-parallel?", Megatron's TP sequence parallelism, another
# thing); Megatron-core's MoE router flags that said only "see --help"
ULYSSES = ("DeepSpeed-Ulysses' sequence parallelism is --context-parallel-size N --cp-comm-type a2a here (each "
           "rank all-to-alls the heads for attention; --sequence-parallel is Megatron's TP sequence parallelism, "
           "another thing) (docs/context-parallel.md)")
INSTEAD.update({
    "--sequence-parallel-size": ULYSSES,
    "--ds-sequence-parallel-size": ULYSSES,
    "--ulysses-degree": ULYSSES,
    "--moe-layer-freq": MODEL.format(field="decoder_sparse_step / mlp_only_layers (Qwen2-MoE; Mixtral's layers are "
                                           "all MoE)"),
    "--moe-router-pre-softmax": "the router's softmax order is the model's (Mixtral, Qwen2-MoE: softmax over all "
                                "experts, then top-k, as --moe-router-pre-softmax); drop the flag",
    "--moe-router-dtype": "the routing math already runs in fp32 (the router's logits are cast before softmax and "
                          "top-k, whatever --bf16 / --fp16); drop the flag",
    "--moe-router-topk-scaling-factor": "not implemented: the top-k weights are the router's probabilities, "
                                        "renormalised where the model's norm_topk_prob says; drop the flag",
    "--moe-input-jitter-eps": "router input jitter is not implemented (a config's router_jitter_noise > 0 is "
                              "refused too); drop the flag",
    "--moe-token-drop-policy": "with --moe-expert-capacity-factor an expert's overflow is dropped by lowest "
                               "probability (Megatron's default policy, probs); position is not implemented; drop "
                               "the flag",
    "--moe-router-num-groups": "group-limited routing (DeepSeek-V3's node groups) is not implemented; drop the flag",
    "--moe-router-group-topk": "group-limited routing (DeepSeek-V3's node groups) is not implemented; drop the flag",
})

# round 23: docs/comm-efficient.md's diagnostics, flags of scripts/bench_comm_efficient.py only ("see --help")
BENCH_ONLY = "a diagnostic of scripts/bench_comm_efficient.py (docs/comm-efficient.md); train.py runs "
INSTEAD.update({
    "--powersgd-min-compression-rate": BENCH_ONLY + "torch's rate 2 (a matrix is compressed when n m > 2 r (n + m), "
                                                    "else sent whole); drop the flag",
    "--powersgd-variant": BENCH_ONLY + "torch's powerSGD_hook (one power iteration a step); drop the flag",
    "--powersgd-no-error-feedback": BENCH_ONLY + "PowerSGD with error feedback, as torch's hook; drop the flag",
})

# round 16's new-user pass: the flags of transformers' Trainer (TrainingArguments, accelerate) and of the launchers,
# which said "see --help" or a misleading near spelling (--max_steps -> --max-skipped-steps, --eval_steps ->
# --eval-iters). Trainer's own spelling is underscored: hints() adds it beside the dashed one
TRAINER = {
    "--per-device-train-batch-size": "train.py's flag is --micro-batch-size (the samples of one forward on one "
                                     "data-parallel rank; --global-batch-size is the step's total)",
    "--learning-rate": "train.py's flag is --lr",
    "--output-dir": "checkpoints go to --save DIR, the log lines' numbers to --metrics-file FILE",
    "--num-train-epochs": "a run counts iterations, not epochs: give --train-iters N (N x --global-batch-size "
                          "samples of --seq-length tokens)",
    "--epochs": "a run counts iterations, not epochs: give --train-iters N (N x --global-batch-size samples of "
                "--seq-length tokens)",
    "--max-steps": "train.py's flag is --train-iters",
    "--gradient-accumulation-steps": "accumulation follows from the batch sizes, as in Megatron: --global-batch-size "
                                     "= --micro-batch-size x dp x the accumulation steps; give --global-batch-size",
    "--lr-scheduler-type": "train.py's flag is --lr-decay-style (constant, linear, cosine; warm-up: "
                           "--lr-warmup-iters)",
    "--warmup-steps": "train.py's flag is --lr-warmup-iters",
    "--max-grad-norm": "train.py's flag is --clip-grad (0: off)",
    "--logging-steps": "train.py's flag is --log-interval",
    "--save-steps": "train.py's flag is --save-interval (with --save DIR)",
    "--eval-steps": "train.py's flag is --eval-interval (--eval-iters is how many batches each evaluation takes)",
    "--gradient-checkpointing": "train.py's flag is --recompute-granularity full (or selective: the attention core "
                              "only)",
    "--resume-from-checkpoint": "give --load DIR (an earlier run's --save; --ckpt-step N for an older iteration)",
    "--model-name-or-path": "give --model (a preset, or a transformers model folder) and --load with the same "
                            "folder for its weights",
    "--fsdp": "FSDP's full sharding is --zero-stage 3 (parameters, gradients and optimizer state sharded over dp)",
    "--report-to": "not implemented: the log lines go to --tensorboard-dir DIR and --metrics-file FILE; drop the flag",
    "--wandb-project": "not implemented: the log lines go to --tensorboard-dir DIR and --metrics-file FILE; drop the "
                       "flag",
    "--mixed-precision": "give --bf16 or --fp16 (fp32 master weights; neither: fp32)",
    "--dtype": "give --bf16 or --fp16 (fp32 master weights; neither: fp32)",
    "--torch-dtype": "give --bf16 or --fp16 (fp32 master weights; neither: fp32)",
}
LAUNCHED = "train.py reads its rank and world from the environment torchrun sets"
# a launcher's own flags, given after the script or passed to it by an older launcher
LAUNCHER = {
    "--local-rank": f"the flag torch.distributed.launch and the deepspeed launcher pass; {LAUNCHED} (LOCAL_RANK): "
                    f"launch with torchrun --nproc-per-node N scripts/train.py ...",
    **{flag: f"torchrun's flag, given after the script: put it before, torchrun {flag} ... scripts/train.py ..."
       for flag in ("--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
                    "--rdzv-endpoint", "--rdzv-backend", "--rdzv-id", "--standalone", "--max-restarts")},
}


# Megatron's choices of a flag train.py has, that train.py does not implement ("--flag=value": the invalid-choice line)
CHOICES = {
    "--tokenizer-type=NullTokenizer": "Megatron's NullTokenizer (with --mock-data) is the built-in corpus here: omit "
                                      "--data-path and --tokenizer-type (bytes, vocabulary 256: the tiny-* presets)",
    "--cp-comm-type=a2a+p2p": "Megatron's hierarchical a2a+p2p is not implemented: use a2a (Ulysses, heads split "
                              "inside the CP group) or p2p (the ring) (docs/context-parallel.md)",
}


def hints() -> dict[str, str]:
    """{unknown flag: the one-line hint}, for train.py's parser."""
    out = {flag: f"{flag}: " + MODEL.format(field=field) for flag, field in SHAPE_FIELDS.items()}
    out.update({flag: f"{flag}: train.py's flag is {name}" for flag, name in RENAMED.items()})
    out.update({flag: f"{flag}: " + MODEL.format(field=field) for flag, field in ARCH_FIELDS.items()})
    out.update({flag: f"{flag}: {what}" for flag, what in INSTEAD.items()})
    out.update(tokenizer_hints())
    out.update(CHOICES)
    for flag, text in parallel_hints("the processes launched (torchrun --nproc-per-node x --nnodes)",
                                     short=False).items():
        out.setdefault(flag, text)
    for flag, what in {**TRAINER, **LAUNCHER}.items():  # both spellings: torchrun takes either, Trainer's is "_"
        for spelling in (flag, "--" + flag[2:].replace("-", "_")):
            out.setdefault(spelling, f"{spelling}: {what}")
    return out
