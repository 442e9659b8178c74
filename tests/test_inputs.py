"""Every bad input is one error line, before any work: train.py flags, the DeepSpeed JSON, the --model config.json,
--load / --data-path contents, output paths, `hybrid plan`, `hybrid layout` and `hybrid calibrate`.

Each case runs the real entry point in-process (train: hybrid.train.main.main; the others: hybrid.cli.main) with
init_process_group and calibrate's process spawner replaced by functions that fail the test, and asserts: a non-zero
exit, exactly one line on stderr, starting "<prog>: error:" and naming the flag/key/file, no traceback, no file left
behind in the working directory, and that it came quickly (before any rendezvous or search of note)."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time

import pytest
import torch
import torch.distributed as dist

import hybrid.cli
import hybrid.testing
from hybrid.testing_inputs import python_environment
from command_flags import foreign

train_main = importlib.import_module("hybrid.train.main")  # the module (hybrid.train.main the attribute is main())
FAST_S = 20.0  # generous on a loaded 2-core machine; a rendezvous would wait minutes, a calibrate run ~30 s

GOOD_PROFILE = {"format": "hybrid-hardware-profile/1",
                "hardware": {"name": "test", "peak_tflops": 1.0, "memory_gb": 8.0, "hbm_tbps": 0.01,
                             "gpus_per_node": 2, "intra_node_gbps": 1.0, "inter_node_gbps": 1.0, "pcie_gbps": 1.0,
                             "host_memory_gb": 16.0, "cpu_adam_params_per_s": 1e8},
                "matmul_tflops": {"fp32": 0.5}}


def _profile(**hardware) -> dict:
    prof = json.loads(json.dumps(GOOD_PROFILE))
    for k, v in hardware.items():
        if v is _DROP:
            del prof["hardware"][k]
        else:
            prof["hardware"][k] = v
    return prof


_DROP = object()
FIFO = object()  # in a case's files: a named pipe there (an output path that is not a regular file)


class Symlink(str):
    """In a case's files: a symbolic link to this target."""
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 128}
GPT2_JSON = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 256, "n_positions": 128}
PLAN = ["--model", "tiny-gpt2", "--gpus", "2", "--global-batch-size", "8", "--seq-length", "32"]


def _cfg(**kw) -> dict:
    return {**LLAMA, **kw}


def _gpt2(**kw) -> dict:
    return {**GPT2_JSON, **kw}


# (id, command, argv, files to create {name: str | bytes | JSON-able}, env, fragment the error line must hold)
# "{d}" in argv is the working directory of the case.
CASES = [
    # --- train.py: numbers -----------------------------------------------------------------------------
    ("lr-inf", "train", ["--lr", "inf"], {}, {}, "--lr"),
    ("lr-nan", "train", ["--lr", "nan"], {}, {}, "--lr"),
    ("lr-zero", "train", ["--lr", "0"], {}, {}, "--lr"),
    ("lr-negative", "train", ["--lr", "-1"], {}, {}, "--lr"),
    ("lr-text", "train", ["--lr", "fast"], {}, {}, "--lr"),
    ("min-lr-nan", "train", ["--min-lr", "nan"], {}, {}, "--min-lr"),
    ("min-lr-negative", "train", ["--min-lr", "-1e-4"], {}, {}, "--min-lr"),
    ("min-lr-above-lr", "train", ["--min-lr", "0.1"], {}, {}, "--min-lr"),
    ("clip-grad-nan", "train", ["--clip-grad", "nan"], {}, {}, "--clip-grad"),
    ("clip-grad-negative", "train", ["--clip-grad", "-1"], {}, {}, "--clip-grad"),
    ("clip-grad-inf", "train", ["--clip-grad", "inf"], {}, {}, "--clip-grad"),
    ("weight-decay-negative", "train", ["--weight-decay", "-5"], {}, {}, "--weight-decay"),
    ("weight-decay-nan", "train", ["--weight-decay", "nan"], {}, {}, "--weight-decay"),
    ("beta1-above-one", "train", ["--adam-beta1", "1.5"], {}, {}, "--adam-beta1"),
    ("beta1-negative", "train", ["--adam-beta1", "-0.1"], {}, {}, "--adam-beta1"),
    ("beta2-one", "train", ["--adam-beta2", "1"], {}, {}, "--adam-beta2"),
    ("beta2-nan", "train", ["--adam-beta2", "nan"], {}, {}, "--adam-beta2"),
    ("global-batch-zero", "train", ["--global-batch-size", "0"], {}, {}, "--global-batch-size"),
    ("global-batch-negative", "train", ["--global-batch-size", "-2"], {}, {}, "--global-batch-size"),
    ("micro-batch-zero", "train", ["--micro-batch-size", "0"], {}, {}, "--micro-batch-size"),
    ("micro-batch-negative", "train", ["--micro-batch-size", "-1"], {}, {}, "--micro-batch-size"),
    ("tp-zero", "train", ["--tensor-model-parallel-size", "0"], {}, {}, "--tensor-model-parallel-size"),
    ("pp-zero", "train", ["--pipeline-model-parallel-size", "0"], {}, {}, "--pipeline-model-parallel-size"),
    ("pp-negative", "train", ["--pipeline-model-parallel-size", "-1"], {}, {}, "--pipeline-model-parallel-size"),
    ("vpp-zero", "train", ["--num-layers-per-virtual-pipeline-stage", "0"], {}, {},
     "--num-layers-per-virtual-pipeline-stage"),
    ("seed-float", "train", ["--seed", "1e20"], {}, {}, "--seed"),
    ("seed-huge", "train", ["--seed", "99999999999999999999999"], {}, {}, "--seed"),
    ("seed-negative", "train", ["--seed", "-1"], {}, {}, "--seed"),
    ("seq-length-zero", "train", ["--seq-length", "0"], {}, {}, "--seq-length"),
    ("seq-length-negative", "train", ["--seq-length", "-5"], {}, {}, "--seq-length"),
    ("train-iters-zero", "train", ["--train-iters", "0"], {}, {}, "--train-iters"),
    ("log-interval-zero", "train", ["--log-interval", "0"], {}, {}, "--log-interval"),
    ("warmup-negative", "train", ["--lr-warmup-iters", "-1"], {}, {}, "--lr-warmup-iters"),
    ("bucket-zero", "train", ["--zero-bucket-bytes", "0"], {}, {}, "--zero-bucket-bytes"),
    ("timeout-zero", "train", ["--distributed-timeout-minutes", "0"], {}, {}, "--distributed-timeout-minutes"),
    ("timeout-nan", "train", ["--distributed-timeout-minutes", "nan"], {}, {}, "--distributed-timeout-minutes"),
    ("timeout-huge", "train", ["--distributed-timeout-minutes", "1e12"], {}, {}, "--distributed-timeout-minutes"),
    ("zero-stage-4", "train", ["--zero-stage", "4"], {}, {}, "--zero-stage"),
    ("zero-stage-negative", "train", ["--zero-stage", "-1"], {}, {}, "--zero-stage"),
    ("micro-batch-beyond-memory", "train", ["--micro-batch-size", str(10**15)], {}, {}, "--global-batch-size"),
    ("model-beyond-host-memory", "train", ["--model", "llama-3-405b", "--seq-length", "64"], {}, {}, "--model"),
    ("timeline-empty", "train", ["--timeline", ""], {}, {}, "--timeline"),
    ("load-empty", "train", ["--load", ""], {}, {}, "--load"),
    ("data-path-empty-string", "train", ["--data-path", " "], {}, {}, "--data-path"),
    ("micro-batch-400-digits", "train", ["--micro-batch-size", "1" + "0" * 400], {}, {},
     "--micro-batch-size must be at most"),
    ("train-iters-huge", "train", ["--train-iters", str(10**30)], {}, {}, "--train-iters must be at most"),
    ("watchdog-nan", "train", ["--watchdog-timeout", "nan"], {}, {}, "--watchdog-timeout"),
    ("watchdog-inf", "train", ["--watchdog-timeout", "inf"], {}, {}, "--watchdog-timeout"),
    ("watchdog-negative", "train", ["--watchdog-timeout", "-1"], {}, {}, "--watchdog-timeout"),
    ("straggler-nan", "train", ["--straggler-factor", "nan"], {}, {}, "--straggler-factor"),
    ("straggler-inf", "train", ["--straggler-factor", "inf"], {}, {}, "--straggler-factor"),
    ("peak-tflops-inf", "train", ["--peak-tflops", "inf"], {}, {}, "--peak-tflops must be a finite number"),
    ("auto-batch-huge", "train", ["--auto-parallel", "--global-batch-size", str(10**18)], {}, {},
     "--global-batch-size"),
    # --- train.py: flags, layout, environment -----------------------------------------------------------
    ("typo-suggests", "train", ["--lrr", "1"], {}, {}, "did you mean --lr?"),
    ("typo-words-suggest", "train", ["--tensor-parallel", "2"], {}, {}, "--tensor-model-parallel-size"),
    ("prefix-not-expanded", "train", ["--lr-warm", "5"], {}, {}, "--lr-warmup-iters"),
    ("bad-choice", "train", ["--pipeline-schedule", "zigzag"], {}, {}, "--pipeline-schedule"),
    ("bf16-and-fp16", "train", ["--bf16", "--fp16"], {}, {}, "--bf16 and --fp16"),
    ("fp32-grads-in-fp32", "train", ["--accumulate-allreduce-grads-in-fp32"], {}, {},
     "--accumulate-allreduce-grads-in-fp32 needs --bf16 or --fp16"),
    ("bf16-grads-without-bf16", "train", ["--fp16", "--grad-reduce-in-bf16"], {}, {},
     "--grad-reduce-in-bf16 needs --bf16"),
    ("bf16-grads-and-fp32-grads", "train", ["--bf16", "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"],
     {}, {}, "--grad-reduce-in-bf16 and --accumulate-allreduce-grads-in-fp32 contradict each other"),
    ("cpu-adam-without-offload", "train", ["--cpu-adam", "deepspeed"], {}, {}, "--cpu-adam deepspeed picks the offloaded"),
    ("no-overlap-param-gather-stage-3", "train", ["--zero-stage", "3", "--no-overlap-param-gather"], {}, {},
     "--no-overlap-param-gather applies to --zero-stage 1 or 2"),
    ("compile-selective-op-dropout", "train", ["--compile", "--recompute-granularity", "selective-op",
                                                "--hidden-dropout", "0.1"], {}, {},
     "--compile with --recompute-granularity selective-op needs --hidden-dropout 0"),
    ("compile-selective-op-tp", "train", ["--compile", "--recompute-granularity", "selective-op",
                                          "--tensor-model-parallel-size", "2"], {}, {"WORLD_SIZE": "2"},
     "--compile with --recompute-granularity selective-op runs at --tensor-model-parallel-size 1"),
    ("compile-selective-op-moe", "train", ["--compile", "--recompute-granularity", "selective-op", "--model",
                                           "tiny-mixtral"], {}, {},
     "--compile with --recompute-granularity selective-op does not run on an MoE model"),
    ("overlap-param-gather-stage-0", "train", ["--overlap-param-gather"], {}, {},
     "--overlap-param-gather applies to --zero-stage 1 or 2"),
    # a flag whose feature is off does nothing, its default value written out included (round 25)
    ("onebit-compressor-without-onebit-adam", "train", ["--onebit-compressor", "sign"], {}, {},
     "--onebit-compressor sign is 1-bit Adam's momentum compressor; the run's optimizer is adam"),
    ("moe-bias-rate-default-without-bias", "train", ["--model", "tiny-mixtral", "--moe-router-bias-update-rate",
                                                     "1e-3"], {}, {}, "add --moe-router-enable-expert-bias"),
    ("layers-per-stage-text", "train", ["--pipeline-model-parallel-size", "2", "--pipeline-layers-per-stage", "a,b"],
     {}, {"WORLD_SIZE": "2"}, "--pipeline-layers-per-stage"),
    ("lr-decay-iters-zero", "train", ["--lr-decay-iters", "0"], {}, {}, "--lr-decay-iters must be >= 1"),
    ("timing-log-interval-zero", "train", ["--timing-log-interval", "0"], {}, {}, "--timing-log-interval must be"),
    ("pp-uneven-layers", "train", ["--pipeline-model-parallel-size", "3"], {}, {"WORLD_SIZE": "3"},
     "use --pipeline-partition balanced, or --pipeline-layers-per-stage 1,1,2"),
    ("layers-per-stage-sum", "train", ["--pipeline-model-parallel-size", "2", "--pipeline-layers-per-stage", "2,3"],
     {}, {"WORLD_SIZE": "2"}, "sums to 5, not the model's 4 layers"),
    ("tp-not-dividing-world", "train", ["--tensor-model-parallel-size", "3"], {}, {"WORLD_SIZE": "4"},
     "--tensor-model-parallel-size"),
    ("tp-without-torchrun", "train", ["--tensor-model-parallel-size", "2"], {}, {}, "torchrun"),
    ("world-without-rank", "train", [], {}, {"WORLD_SIZE": "2"}, "RANK"),
    ("world-size-text", "train", [], {}, {"WORLD_SIZE": "two"}, "WORLD_SIZE"),
    ("rank-without-master-addr", "train", [], {}, {"RANK": "0", "WORLD_SIZE": "1"}, "MASTER_ADDR is not"),
    ("rank-without-master-port", "train", [], {}, {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost"},
     "MASTER_PORT is not"),
    # a RANK outside the world is set by hand, not by torchrun: no rank 0 prints for it, so it prints at once (it
    # waited 60 s for one, then printed; round 25)
    ("rank-outside-world", "train", [], {}, {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "localhost",
                                             "MASTER_PORT": "29500"}, "RANK '2' is not an integer in [0, WORLD_SIZE 2)"),
    ("rank-not-a-number", "train", [], {}, {"RANK": "-1", "WORLD_SIZE": "2", "MASTER_ADDR": "localhost",
                                            "MASTER_PORT": "29500"}, "RANK '-1' is not an integer in [0, WORLD_SIZE 2)"),
    ("master-port-text", "train", [], {}, {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost",
                                           "MASTER_PORT": "http"}, "MASTER_PORT 'http'"),
    ("local-world-text", "train", [], {}, {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost",
                                           "MASTER_PORT": "29500", "LOCAL_WORLD_SIZE": "all"}, "LOCAL_WORLD_SIZE 'all'"),
    ("auto-local-world-text", "train", ["--auto-parallel", "--global-batch-size", "8"], {},
     {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500", "LOCAL_WORLD_SIZE": "all"},
     "LOCAL_WORLD_SIZE 'all'"),
    # --hardware without --auto-parallel gives MFU's peak (hybrid/metrics/args.py): checked all the same
    ("hardware-and-peak-tflops", "train", ["--hardware", "{d}/hw.json", "--peak-tflops", "1"],
     {"hw.json": GOOD_PROFILE}, {}, "--peak-tflops and --hardware both set MFU's peak"),
    ("hardware-missing", "train", ["--hardware", "{d}/nope.json"], {}, {}, "--hardware"),
    ("hardware-profile-missing-field", "train", ["--hardware", "{d}/hw.json"],
     {"hw.json": _profile(peak_tflops=_DROP)}, {}, "hardware.peak_tflops"),
    ("auto-without-batch", "train", ["--auto-parallel"], {}, {}, "--global-batch-size"),
    ("auto-profile-missing-field", "train", ["--auto-parallel", "--global-batch-size", "8", "--hardware",
                                             "{d}/hw.json"], {"hw.json": _profile(peak_tflops=_DROP)}, {},
     "hardware.peak_tflops"),
    ("auto-with-tp", "train", ["--auto-parallel", "--global-batch-size", "8", "--tensor-model-parallel-size", "2"],
     {}, {}, "--auto-parallel chooses tp, but --tensor-model-parallel-size was given"),
    ("auto-with-pp", "train", ["--auto-parallel", "--global-batch-size", "8", "--pipeline-model-parallel-size", "1"],
     {}, {}, "--auto-parallel chooses pp, but --pipeline-model-parallel-size was given"),
    ("auto-with-vpp", "train", ["--auto-parallel", "--global-batch-size", "8",
                                "--num-layers-per-virtual-pipeline-stage", "1"], {}, {},
     "but --num-layers-per-virtual-pipeline-stage was given"),
    ("auto-with-schedule", "train", ["--auto-parallel", "--global-batch-size", "8", "--pipeline-schedule", "gpipe"],
     {}, {}, "but --pipeline-schedule was given"),
    ("auto-with-stage-layers", "train", ["--auto-parallel", "--global-batch-size", "8",
                                         "--pipeline-layers-per-stage", "4"], {}, {},
     "but --pipeline-layers-per-stage was given"),
    ("auto-with-micro-batch", "train", ["--auto-parallel", "--global-batch-size", "8", "--micro-batch-size", "2"],
     {}, {}, "--auto-parallel chooses the micro-batch, but --micro-batch-size was given"),
    ("auto-with-zero-stage", "train", ["--auto-parallel", "--global-batch-size", "8", "--zero-stage", "0"], {}, {},
     "--auto-parallel chooses the ZeRO stage, but --zero-stage was given"),
    ("auto-with-sp", "train", ["--auto-parallel", "--global-batch-size", "8", "--sequence-parallel"], {}, {},
     "but --sequence-parallel was given"),
    ("auto-with-offload", "train", ["--auto-parallel", "--global-batch-size", "8", "--offload-optimizer"], {}, {},
     "but --offload-optimizer was given"),
    ("auto-with-ds-stage", "train", ["--auto-parallel", "--global-batch-size", "8", "--deepspeed-config",
                                     "{d}/ds.json"], {"ds.json": {"zero_optimization": {"stage": 2}}}, {},
     "--auto-parallel chooses the ZeRO stage, but --deepspeed-config sets zero_optimization.stage"),
    ("auto-with-ds-micro", "train", ["--auto-parallel", "--global-batch-size", "8", "--deepspeed-config",
                                     "{d}/ds.json"], {"ds.json": {"train_micro_batch_size_per_gpu": 2}}, {},
     "--deepspeed-config sets train_micro_batch_size_per_gpu"),
    # --- train.py: files -----------------------------------------------------------------------------------
    ("timeline-is-dir", "train", ["--timeline", "{d}"], {}, {}, "--timeline"),
    ("timeline-no-dir", "train", ["--timeline", "{d}/no/such/t.json"], {}, {}, "--timeline"),
    ("timeline-dev-null", "train", ["--timeline", "/dev/null"], {}, {}, "--timeline '/dev/null' is not a regular file"),
    ("timeline-fifo", "train", ["--timeline", "{d}/pipe"], {"pipe": FIFO}, {}, "is not a regular file"),
    ("timeline-proc", "train", ["--timeline", "/proc/self/timeline.json"], {}, {}, "--timeline '/proc/self/timeline"),
    ("timeline-proc-file", "train", ["--timeline", "/proc/self/status"], {}, {}, "--timeline '/proc/self/status'"),
    ("timeline-symlink-dev-null", "train", ["--timeline", "{d}/link"], {"link": Symlink("/dev/null")}, {},
     "is not a regular file"),
    ("save-symlink-loop", "train", ["--save", "{d}/loop"], {"loop": Symlink("loop")}, {},
     "is a symbolic link that does not resolve"),
    ("save-under-symlink-loop", "train", ["--save", "{d}/loop/ckpt"], {"loop": Symlink("loop")}, {},
     "is a symbolic link that does not resolve"),
    ("save-dangling-symlink", "train", ["--save", "{d}/gone"], {"gone": Symlink("/nonexistent/ckpt")}, {},
     "is a symbolic link that does not resolve"),
    ("save-over-another-run", "train", ["--save", "{d}/ckpt"], {"ckpt/iter_0000002/manifest.json": "{}",
                                                               "ckpt/latest": "iter_0000002"}, {},
     "--save '{d}/ckpt' holds another run's checkpoints (1, latest iteration 2); resume it with --load"),
    ("save-over-another-run-loading-elsewhere", "train", ["--save", "{d}/ckpt", "--load", "{d}/hf"],
     {"ckpt/iter_0000002/manifest.json": "{}"}, {}, "or pass --overwrite-save"),
    ("overwrite-save-without-save", "train", ["--overwrite-save"], {}, {}, "--overwrite-save needs --save DIR"),
    ("load-checkpoint-manifest-empty", "train", ["--load", "{d}/ckpt"], {"ckpt/iter_0000002/manifest.json": "{}"}, {},
     "manifest.json: format None"),
    ("load-checkpoint-manifest-list", "train", ["--load", "{d}/ckpt", "--ckpt-step", "2"],
     {"ckpt/iter_0000002/manifest.json": "[]"}, {}, "--ckpt-step 2: {d}/ckpt/iter_0000002/manifest.json: a JSON list"),
    ("data-missing", "train", ["--data-path", "{d}/missing.txt"], {}, {}, "--data-path"),
    ("data-is-dir", "train", ["--data-path", "{d}"], {}, {}, "--data-path"),
    ("data-empty", "train", ["--data-path", "{d}/empty.txt"], {"empty.txt": ""}, {}, "--data-path"),
    ("data-binary", "train", ["--data-path", "{d}/data.bin"], {"data.bin": b"\xff\xfe\x00\x81" * 100}, {},
     "--data-path"),
    ("data-too-short", "train", ["--data-path", "{d}/short.txt", "--seq-length", "64"], {"short.txt": "hello"}, {},
     "--data-path"),
    ("load-missing", "train", ["--load", "{d}/nope"], {}, {}, "--load"),
    ("load-no-weights", "train", ["--load", "{d}/ckpt"], {"ckpt/readme.txt": "x"}, {}, "--load"),
    ("load-corrupt", "train", ["--load", "{d}/ckpt"], {"ckpt/model.safetensors": b"not a safetensors file"}, {},
     "--load"),
    ("load-index-missing-shard", "train", ["--load", "{d}/ckpt"],
     {"ckpt/model.safetensors.index.json": {"weight_map": {"wte.weight": "model-1.safetensors"}}}, {}, "--load"),
    ("load-index-traversal", "train", ["--load", "{d}/ckpt"],
     {"ckpt/model.safetensors.index.json": {"weight_map": {"wte.weight": "../outside.safetensors"}}}, {},
     "maps 'wte.weight' to '../outside.safetensors', not a file of the folder"),
    ("load-index-absolute", "train", ["--load", "{d}/ckpt"],
     {"ckpt/model.safetensors.index.json": {"weight_map": {"wte.weight": "/etc/passwd"}}}, {},
     "to '/etc/passwd', not a file of the folder"),
    ("load-other-model", "train", ["--load", "{d}/ckpt"],
     {"ckpt/config.json": LLAMA, "ckpt/model.safetensors.index.json": {"weight_map": {}}}, {}, "--load"),
    # --- train.py: the --model config.json -----------------------------------------------------------------
    ("model-unknown", "train", ["--model", "no-such-model"], {}, {}, "--model"),
    ("model-near-preset", "train", ["--model", "tiny-gpt3"], {}, {}, "did you mean 'tiny-gpt2'"),
    ("metrics-file-of-another-run", "train", ["--metrics-file", "run.jsonl"],  # newuser24: appended after it
     {"run.jsonl": '{"iteration": 20, "lm_loss": 4.28}\n'}, {}, "--metrics-file 'run.jsonl' holds another run's"),
    ("tensorboard-dir-of-another-run", "train", ["--tensorboard-dir", "tb"],  # newuser24: merged with it
     {"tb/events.out.tfevents.1796687085.vm.1.0": b"x"}, {}, "--tensorboard-dir 'tb' holds another run's"),
    ("model-hub-id", "train", ["--model", "meta-llama/Meta-Llama-3-8B"], {}, {}, "hf download"),  # newuser24
    ("model-size-suffix", "train", ["--model", "gpt2-small"], {}, {}, "did you mean 'gpt2'?"),  # not gpt2-xl
    ("model-dir-no-config", "train", ["--model", "{d}/m"], {"m/readme.txt": "x"}, {}, "config.json"),
    ("config-malformed", "train", ["--model", "{d}/m"], {"m/config.json": "{\"model_type\": "}, {}, "config.json"),
    ("config-not-utf8", "train", ["--model", "{d}/m"], {"m/config.json": b"{\"model_type\": \"\xff\"}"}, {},
     "config.json"),
    ("config-no-model-type", "train", ["--model", "{d}/m"], {"m/config.json": {"hidden_size": 64}}, {},
     "model_type"),
    ("config-unsupported-arch", "train", ["--model", "{d}/m"], {"m/config.json": {"model_type": "bert"}}, {},
     "unsupported model_type 'bert'"),
    ("config-heads-not-dividing", "train", ["--model", "{d}/m"], {"m/config.json": _cfg(num_attention_heads=3)}, {},
     "not divisible"),
    ("config-kv-not-dividing", "train", ["--model", "{d}/m"], {"m/config.json": _cfg(num_key_value_heads=3)}, {},
     "num_key_value_heads"),
    ("config-zero-heads", "train", ["--model", "{d}/m"], {"m/config.json": {"model_type": "gpt2", "n_head": 0}}, {},
     "n_head"),
    ("config-size-text", "train", ["--model", "{d}/m"], {"m/config.json": _cfg(vocab_size="big")}, {},
     "vocab_size"),
    ("config-rms-eps-nan", "train", ["--model", "{d}/m"], {"m/config.json": _cfg(rms_norm_eps=float("nan"))}, {},
     "m/config.json: llama config field rms_norm_eps=nan"),
    ("config-rms-eps-inf", "train", ["--model", "{d}/m"], {"m/config.json": _cfg(rms_norm_eps=float("inf"))}, {},
     "rms_norm_eps=inf"),
    ("config-rms-eps-negative", "train", ["--model", "{d}/m"], {"m/config.json": _cfg(rms_norm_eps=-1e-5)}, {},
     "rms_norm_eps=-1e-05"),
    ("config-rms-eps-string", "train", ["--model", "{d}/m"], {"m/config.json": _cfg(rms_norm_eps="small")}, {},
     "rms_norm_eps"),
    ("config-ln-eps-negative", "train", ["--model", "{d}/m"], {"m/config.json": _gpt2(layer_norm_epsilon=-1e-5)}, {},
     "m/config.json: gpt2 config field layer_norm_epsilon=-1e-05"),
    ("config-ln-eps-nan", "train", ["--model", "{d}/m"], {"m/config.json": _gpt2(layer_norm_epsilon=float("nan"))},
     {}, "layer_norm_epsilon=nan"),
    ("config-rope-theta-zero", "train", ["--model", "{d}/m"], {"m/config.json": _cfg(rope_theta=0)}, {},
     "m/config.json: llama config field rope_parameters.rope_theta=0"),
    ("config-rope-theta-negative", "train", ["--model", "{d}/m"],
     {"m/config.json": _cfg(rope_parameters={"rope_type": "default", "rope_theta": -1.0})}, {}, "rope_theta=-1.0"),
    ("config-rope-theta-nan", "train", ["--model", "{d}/m"], {"m/config.json": _cfg(rope_theta=float("nan"))}, {},
     "rope_theta=nan"),
    ("config-rope-factor-zero", "train", ["--model", "{d}/m"],
     {"m/config.json": _cfg(rope_scaling={"rope_type": "linear", "factor": 0})}, {}, "rope_scaling.factor"),
    ("config-attn-pdrop-one", "train", ["--model", "{d}/m"], {"m/config.json": _gpt2(attn_pdrop=1.0)}, {},
     "gpt2 config field attn_pdrop=1.0"),
    ("config-resid-pdrop-negative", "train", ["--model", "{d}/m"], {"m/config.json": _gpt2(resid_pdrop=-0.1)}, {},
     "resid_pdrop=-0.1"),
    ("config-embd-pdrop-nan", "train", ["--model", "{d}/m"], {"m/config.json": _gpt2(embd_pdrop=float("nan"))}, {},
     "embd_pdrop=nan"),
    ("config-attention-dropout-above-one", "train", ["--model", "{d}/m"],
     {"m/config.json": _cfg(attention_dropout=1.5)}, {}, "m/config.json: llama config field attention_dropout=1.5"),
    ("config-qwen2-attention-dropout-one", "train", ["--model", "{d}/m"],
     {"m/config.json": _cfg(model_type="qwen2", attention_dropout=1.0)}, {}, "qwen2 config field attention_dropout"),
    ("config-vocab-zero", "train", ["--model", "{d}/m"], {"m/config.json": _cfg(vocab_size=0)}, {}, "vocab_size"),
    ("config-hidden-negative", "train", ["--model", "{d}/m"], {"m/config.json": _cfg(hidden_size=-64)}, {},
     "hidden_size"),
    ("config-heads-zero", "train", ["--model", "{d}/m"], {"m/config.json": _cfg(num_attention_heads=0)}, {},
     "num_attention_heads"),
    ("config-head-dim-float", "train", ["--model", "{d}/m"], {"m/config.json": _cfg(head_dim=16.5)}, {}, "head_dim"),
    ("config-bias-string", "train", ["--model", "{d}/m"], {"m/config.json": _cfg(attention_bias="yes")}, {},
     "attention_bias"),
    ("config-top-level-list", "train", ["--model", "{d}/c.json"], {"c.json": [1, 2]}, {}, "c.json"),
    ("config-deep-nesting", "train", ["--model", "{d}/m"], {"m/config.json": "[" * 100000 + "]" * 100000}, {},
     "m/config.json: not a config.json hybrid reads (RecursionError)"),
    ("config-5000-digit-number", "train", ["--model", "{d}/m"],
     {"m/config.json": '{"model_type": "llama", "hidden_size": 1' + "0" * 5000 + "}"}, {},
     "m/config.json: not a config.json hybrid reads"),
    ("hardware-deep-nesting", "train", ["--hardware", "{d}/hw.json"], {"hw.json": "[" * 100000 + "]" * 100000}, {},
     "--hardware {d}/hw.json: not a JSON file hybrid reads"),
    ("qwen2-moe-mlp-only-layer-outside", "train", ["--model", "{d}/c.json"],
     {"c.json": _cfg(model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                     shared_expert_intermediate_size=64, mlp_only_layers=[2])}, {},
     "mlp_only_layers [2] names no layer of the model's 2 (indices 0 to 1)"),
    # --- train.py: the DeepSpeed JSON ----------------------------------------------------------------------
    ("ds-bf16-string", "ds", {"bf16": {"enabled": "false"}}, {}, {}, "bf16.enabled"),
    ("ds-fp16-string", "ds", {"fp16": {"enabled": "true"}}, {}, {}, "fp16.enabled"),
    ("ds-micro-null", "ds", {"train_micro_batch_size_per_gpu": None}, {}, {}, "train_micro_batch_size_per_gpu"),
    ("ds-micro-string", "ds", {"train_micro_batch_size_per_gpu": "4"}, {}, {}, "train_micro_batch_size_per_gpu"),
    ("ds-accumulation-zero", "ds", {"gradient_accumulation_steps": 0}, {}, {}, "gradient_accumulation_steps"),
    ("ds-train-batch-zero", "ds", {"train_batch_size": 0}, {}, {}, "train_batch_size"),
    ("ds-scale-power-high", "ds", {"fp16": {"enabled": True, "initial_scale_power": 200}}, {}, {},
     "fp16.initial_scale_power"),
    ("ds-scale-power-negative", "ds", {"fp16": {"initial_scale_power": -1}}, {}, {}, "fp16.initial_scale_power"),
    ("ds-window-zero", "ds", {"fp16": {"loss_scale_window": 0}}, {}, {}, "fp16.loss_scale_window"),
    ("ds-min-scale-zero", "ds", {"fp16": {"min_loss_scale": 0}}, {}, {}, "fp16.min_loss_scale"),
    ("ds-clipping-string", "ds", {"gradient_clipping": "1.0"}, {}, {}, "gradient_clipping"),
    ("ds-clipping-negative", "ds", {"gradient_clipping": -1}, {}, {}, "gradient_clipping"),
    ("ds-stage-5", "ds", {"zero_optimization": {"stage": 5}}, {}, {}, "zero_optimization.stage"),
    ("ds-zero-null", "ds", {"zero_optimization": None}, {}, {}, "zero_optimization"),
    ("ds-bucket-negative", "ds", {"zero_optimization": {"reduce_bucket_size": -1}}, {}, {},
     "zero_optimization.reduce_bucket_size"),
    ("ds-offload-nvme", "ds", {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}, {}, {},
     "offload_param.device"),
    ("ds-pin-memory-string", "ds", {"zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memory": "yes"}}},
     {}, {}, "pin_memory"),
    ("ds-nan-literal", "train", ["--deepspeed-config", "{d}/ds.json"], {"ds.json": "{\"gradient_clipping\": NaN}"},
     {}, "NaN"),
    ("ds-not-json", "train", ["--deepspeed-config", "{d}/ds.json"], {"ds.json": "stage: 3"}, {}, "ds.json"),
    ("ds-deep-nesting", "train", ["--deepspeed-config", "{d}/ds.json"], {"ds.json": "[" * 100000 + "]" * 100000},
     {}, "ds.json: not a JSON file hybrid reads (RecursionError"),
    ("ds-5000-digit-number", "train", ["--deepspeed-config", "{d}/ds.json"],
     {"ds.json": '{"gradient_clipping": 1' + "0" * 5000 + "}"}, {}, "ds.json: not a JSON file hybrid reads"),
    ("ds-not-utf8", "train", ["--deepspeed-config", "{d}/ds.json"], {"ds.json": b"{\"a\": \"\xff\"}"}, {}, "ds.json"),
    ("ds-top-level-list", "ds", [1], {}, {}, "top level"),
    ("ds-missing", "train", ["--deepspeed-config", "{d}/nope.json"], {}, {}, "--deepspeed-config"),
    ("ds-conflicts-stage-flag", "ds+", ({"zero_optimization": {"stage": 2}}, ["--zero-stage", "1"]), {}, {},
     "--zero-stage"),
    ("ds-conflicts-micro-flag", "ds+", ({"train_micro_batch_size_per_gpu": 4}, ["--micro-batch-size", "2"]), {}, {},
     "--micro-batch-size"),
    ("ds-conflicts-batch-flag", "ds+", ({"gradient_accumulation_steps": 2}, ["--global-batch-size", "16"]), {}, {},
     "--global-batch-size"),
    ("ds-conflicts-bf16-flag", "ds+", ({"bf16": {"enabled": False}}, ["--bf16"]), {}, {}, "--bf16"),
    # (issue 24) a DeepSpeed value is named by its JSON key, also when a later check refuses it
    ("ds-clipping-1e999", "train", ["--deepspeed-config", "{d}/ds.json"], {"ds.json": '{"gradient_clipping": 1e999}'},
     {}, "--deepspeed-config: gradient_clipping must be a finite number"),
    ("ds-clipping-400-digits", "train", ["--deepspeed-config", "{d}/ds.json"],
     {"ds.json": '{"gradient_clipping": 1' + "0" * 400 + "}"}, {}, "gradient_clipping must be a finite number"),
    ("ds-min-scale-1e999", "train", ["--deepspeed-config", "{d}/ds.json"],
     {"ds.json": '{"fp16": {"enabled": true, "min_loss_scale": 1e999}}'}, {}, "fp16.min_loss_scale must be a finite"),
    ("ds-micro-400-digits", "train", ["--deepspeed-config", "{d}/ds.json"],
     {"ds.json": '{"train_micro_batch_size_per_gpu": 1' + "0" * 400 + "}"}, {},
     "train_micro_batch_size_per_gpu must be in [1, 9007199254740992], got an integer of 401 digits"),
    ("ds-bucket-huge", "ds", {"zero_optimization": {"reduce_bucket_size": 10**30}}, {}, {},
     "zero_optimization.reduce_bucket_size must be in"),
    ("ds-window-huge", "ds", {"fp16": {"loss_scale_window": 10**30}}, {}, {}, "fp16.loss_scale_window must be in"),
    ("ds-micro-beyond-memory", "ds", {"train_micro_batch_size_per_gpu": 10**15}, {}, {},
     "--deepspeed-config train_micro_batch_size_per_gpu"),
    ("ds-train-batch-beyond-memory", "ds", {"train_batch_size": 10**15}, {}, {}, "--deepspeed-config train_batch_size "),
    ("ds-accumulation-beyond-memory", "ds", {"gradient_accumulation_steps": 10**15}, {}, {},
     "--deepspeed-config train_micro_batch_size_per_gpu x gradient_accumulation_steps"),
    ("ds-train-batch-not-multiple", "ds", {"train_micro_batch_size_per_gpu": 3, "train_batch_size": 8}, {}, {},
     "--deepspeed-config train_batch_size 8 must be a multiple of --deepspeed-config train_micro_batch_size_per_gpu"),
    ("ds-grad-accum-dtype-unknown", "ds", {"data_types": {"grad_accum_dtype": "fp8"}}, {}, {},
     "data_types.grad_accum_dtype must be one of"),
    ("ds-grad-accum-dtype-other-16-bit", "ds", {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp16"}},
     {}, {}, "data_types.grad_accum_dtype = 'fp16' but the compute dtype is bf16"),
    ("ds-grad-accum-fp32-conflicts-flag", "ds+",
     ({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "bf16"}},
      ["--accumulate-allreduce-grads-in-fp32"]),
     {}, {}, "--accumulate-allreduce-grads-in-fp32 was given"),
    ("ds-grad-accum-fp32-conflicts-bf16-grads", "ds+",
     ({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}}, ["--grad-reduce-in-bf16"]),
     {}, {}, "data_types.grad_accum_dtype = 'fp32' but --grad-reduce-in-bf16 was given"),
    # --- hybrid plan ----------------------------------------------------------------------------------------
    ("plan-fp32-grads-in-fp32", "plan", PLAN + ["--precision", "fp32", "--accumulate-allreduce-grads-in-fp32"], {},
     {}, "--accumulate-allreduce-grads-in-fp32 needs --precision mixed"),
    ("plan-bf16-grads-in-fp32", "plan", PLAN + ["--gpu", "cpu", "--grad-reduce-in-bf16"], {}, {},
     "--grad-reduce-in-bf16 needs --precision mixed"),  # the cpu preset plans fp32 (round 23's flag)
    ("plan-bf16-and-fp32-grads", "plan", PLAN + ["--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"], {},
     {}, "--grad-reduce-in-bf16 and --accumulate-allreduce-grads-in-fp32 contradict each other"),
    ("plan-gpus-zero", "plan", PLAN[:2] + ["--gpus", "0"] + PLAN[4:], {}, {}, "--gpus"),
    ("plan-gpus-negative", "plan", PLAN[:2] + ["--gpus", "-8"] + PLAN[4:], {}, {}, "--gpus"),
    ("plan-gpus-huge", "plan", PLAN[:2] + ["--gpus", str(10**12)] + PLAN[4:], {}, {}, "--gpus"),
    ("plan-batch-zero", "plan", PLAN[:4] + ["--global-batch-size", "0"], {}, {}, "--global-batch-size"),
    ("plan-batch-huge", "plan", PLAN[:4] + ["--global-batch-size", str(10**18)], {}, {}, "--global-batch-size"),
    ("plan-virtual-stages-huge", "plan", PLAN + ["--max-virtual-stages", str(10**9)], {}, {}, "--max-virtual-stages"),
    ("plan-batch-missing", "plan", PLAN[:4], {}, {}, "--global-batch-size"),
    ("plan-gpus-missing", "plan", PLAN[:2] + PLAN[4:], {}, {}, "--gpus"),
    ("plan-seq-zero", "plan", PLAN[:6] + ["--seq-length", "0"], {}, {}, "--seq-length"),
    ("plan-memory-nan", "plan", PLAN + ["--gpu-memory", "nan"], {}, {}, "--gpu-memory"),
    ("plan-memory-negative", "plan", PLAN + ["--gpu-memory", "-1"], {}, {}, "--gpu-memory"),
    ("plan-tflops-inf", "plan", PLAN + ["--gpu-tflops", "inf"], {}, {}, "--gpu-tflops"),
    ("plan-efficiency-zero", "plan", PLAN + ["--compute-efficiency", "0"], {}, {}, "--compute-efficiency"),
    ("plan-efficiency-above-one", "plan", PLAN + ["--compute-efficiency", "1.5"], {}, {}, "--compute-efficiency"),
    ("plan-bandwidth-negative", "plan", PLAN + ["--inter-node-bandwidth", "-3"], {}, {}, "--inter-node-bandwidth"),
    ("plan-top-zero", "plan", PLAN + ["--top", "0"], {}, {}, "--top"),
    ("plan-tp-zero", "plan", PLAN + ["--tensor-model-parallel-size", "0"], {}, {}, "--tensor-model-parallel-size"),
    ("plan-micro-negative", "plan", PLAN + ["--micro-batch-size", "-1"], {}, {}, "--micro-batch-size"),
    ("plan-sim-budget-zero", "plan", PLAN + ["--sim-budget", "0"], {}, {}, "--sim-budget"),
    ("plan-sim-budget-too-small", "plan", ["--model", "tiny-gpt2", "--gpus", "2", "--global-batch-size", "64",
                                           "--seq-length", "32", "--pipeline-model-parallel-size", "2",
                                           "--sim-budget", "10"], {}, {}, "rerun with --sim-budget"),
    ("plan-model-hub-id", "plan", ["--model", "Qwen/Qwen2-7B", "--gpus", "8", "--global-batch-size", "8"], {}, {},
     "hf download"),  # newuser24: no --load suggested to a command without it
    ("plan-layers-zero", "plan", ["--num-layers", "0", "--hidden-size", "64", "--num-attention-heads", "4", "--gpus",
                                  "2", "--global-batch-size", "8"], {}, {}, "--num-layers"),
    ("plan-layers-100000", "plan", ["--num-layers", "100000", "--hidden-size", "64", "--num-attention-heads", "4",
                                    "--gpus", "8", "--global-batch-size", "8"], {}, {},
     "--num-layers 100000: the planner splits at most 2048 layers"),  # was a 75 GiB table (issue 24)
    ("plan-model-100000-layers", "plan", ["--model", "{d}/m", "--gpus", "8", "--global-batch-size", "8"],
     {"m/config.json": _cfg(num_hidden_layers=100000)}, {}, "100000 layers; the planner splits at most 2048"),
    ("plan-heads-not-dividing", "plan", ["--num-layers", "2", "--hidden-size", "100", "--num-attention-heads", "3",
                                         "--gpus", "2", "--global-batch-size", "8"], {}, {}, "--num-attention-heads"),
    ("plan-groups-not-dividing", "plan", ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                          "--num-query-groups", "3", "--gpus", "2", "--global-batch-size", "8"], {}, {},
     "--num-query-groups"),
    ("plan-scan-zero", "plan", PLAN[:2] + PLAN[4:] + ["--scan-gpus", "8,0"], {}, {}, "--scan-gpus"),
    ("plan-scan-text", "plan", PLAN[:2] + PLAN[4:] + ["--scan-gpus", "a,b"], {}, {}, "--scan-gpus"),
    ("plan-plot-no-matplotlib", "plan-nompl", PLAN + ["--plot", "{d}/mem.png"], {}, {}, "pip install matplotlib"),
    ("plan-plot-is-dir", "plan", PLAN + ["--plot", "{d}"], {}, {}, "--plot"),
    ("plan-plot-dev-null", "plan", PLAN + ["--plot", "/dev/null"], {}, {}, "--plot '/dev/null' is not a regular file"),
    ("plan-plot-fifo", "plan", PLAN + ["--plot", "{d}/pipe.png"], {"pipe.png": FIFO}, {}, "is not a regular file"),
    ("plan-plot-proc", "plan", PLAN + ["--plot", "/proc/self/mem.png"], {}, {}, "--plot '/proc/self/mem.png'"),
    ("plan-emit-args-sizes", "plan", ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                      "--gpus", "2", "--global-batch-size", "8", "--emit-args"], {}, {}, "--emit-args"),
    ("plan-emit-args-train-rejects", "plan", ["--model", "tiny-llama", "--gpus", "2", "--global-batch-size", "8",
                                              "--seq-length", "1000", "--emit-args"], {}, {}, "--seq-length 1000"),
    ("plan-hardware-missing", "plan", PLAN + ["--hardware", "{d}/nope.json"], {}, {}, "--hardware"),
    ("plan-hardware-missing-field", "plan", PLAN + ["--hardware", "{d}/hw.json"],
     {"hw.json": _profile(memory_gb=_DROP)}, {}, "hardware.memory_gb"),
    ("plan-hardware-string-field", "plan", PLAN + ["--hardware", "{d}/hw.json"],
     {"hw.json": _profile(hbm_tbps="fast")}, {}, "hardware.hbm_tbps"),
    ("plan-hardware-matmul-string", "plan", PLAN + ["--precision", "fp32", "--hardware", "{d}/hw.json"],
     {"hw.json": {**GOOD_PROFILE, "matmul_tflops": "fast"}}, {}, "matmul_tflops must be an object"),
    ("plan-hardware-matmul-bf16-nan", "plan", PLAN + ["--hardware", "{d}/hw.json"],
     {"hw.json": {**GOOD_PROFILE, "matmul_tflops": {"fp32": 0.5, "bf16": float("nan")}}}, {},
     "matmul_tflops.bf16"),
    ("plan-hardware-wrong-format", "plan", PLAN + ["--hardware", "{d}/hw.json"], {"hw.json": {"format": "x"}}, {},
     "--hardware"),
    ("plan-hardware-not-json", "plan", PLAN + ["--hardware", "{d}/hw.json"], {"hw.json": "peak: 1"}, {},
     "--hardware"),
    ("plan-model-bad-config", "plan", ["--model", "{d}/m", "--gpus", "2", "--global-batch-size", "8"],
     {"m/config.json": {"model_type": "t5"}}, {}, "model_type"),
    ("plan-typo", "plan", PLAN + ["--gpus-per-nod", "8"], {}, {}, "did you mean --gpus-per-node?"),
    # --- hybrid layout --------------------------------------------------------------------------------------
    ("layout-world-zero", "layout", ["--world", "0"], {}, {}, "--world"),
    ("layout-world-negative", "layout", ["--world", "-4"], {}, {}, "--world"),
    ("layout-world-huge", "layout", ["--world", str(10**9)], {}, {}, "--world"),
    ("layout-world-text", "layout", ["--world", "eight"], {}, {}, "--world"),
    ("layout-tp-zero", "layout", ["--world", "8", "--tensor-model-parallel-size", "0"], {}, {},
     "--tensor-model-parallel-size"),
    ("layout-tp-not-dividing", "layout", ["--world", "8", "--tensor-model-parallel-size", "3"], {}, {},
     "--tensor-model-parallel-size"),
    ("layout-typo", "layout", ["--wrld", "8"], {}, {}, "did you mean --world?"),
    ("layout-unrelated-flag", "layout", ["--world", "8", "--order", "tp-dp"], {}, {},
     "unrecognized arguments: --order; see --help"),
    # --- hybrid calibrate ----------------------------------------------------------------------------------
    ("calibrate-out-dir", "calibrate", ["--out", "{d}"], {}, {}, "--out"),
    ("calibrate-out-no-dir", "calibrate", ["--out", "{d}/no/such/hw.json"], {}, {}, "--out"),
    ("calibrate-out-dev-null", "calibrate", ["--out", "/dev/null"], {}, {}, "--out '/dev/null' is not a regular file"),
    ("calibrate-out-fifo", "calibrate", ["--out", "{d}/pipe"], {"pipe": FIFO}, {}, "is not a regular file"),
    ("calibrate-out-proc", "calibrate", ["--out", "/proc/self/hw.json"], {}, {}, "--out '/proc/self/hw.json'"),
    ("calibrate-ranks-zero", "calibrate", ["--ranks", "0"], {}, {}, "--ranks"),
    ("calibrate-seconds-inf", "calibrate", ["--seconds", "inf"], {}, {}, "--seconds"),
    ("calibrate-seconds-zero", "calibrate", ["--seconds", "0"], {}, {}, "--seconds"),
    ("calibrate-matmul-zero", "calibrate", ["--matmul-size", "0"], {}, {}, "--matmul-size"),
    ("calibrate-copy-negative", "calibrate", ["--copy-bytes", "-1"], {}, {}, "--copy-bytes"),
    ("calibrate-sizes-text", "calibrate", ["--sizes", "8,abc"], {}, {}, "--sizes"),
    ("calibrate-sizes-tiny", "calibrate", ["--sizes", "2"], {}, {}, "--sizes"),
    ("calibrate-base-unknown", "calibrate", ["--base", "tpu"], {}, {}, "--base"),
]
if not torch.cuda.is_available():
    CASES.append(("calibrate-nccl-without-cuda", "calibrate", ["--backend", "nccl"], {}, {}, "--backend nccl"))

PROG = {"train": "train.py", "ds": "train.py", "ds+": "train.py", "plan": "hybrid plan", "plan-nompl": "hybrid plan",
        "layout": "hybrid layout", "calibrate": "hybrid calibrate"}


def _write_files(root, files: dict) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is FIFO:
            os.mkfifo(path)
        elif isinstance(content, Symlink):
            os.symlink(content, path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        elif isinstance(content, str):
            path.write_text(content)
        else:
            path.write_text(json.dumps(content))


def _argv(command: str, argv, root) -> tuple:
    """The entry point and its argv; a DeepSpeed case's JSON is written to ds.json first."""
    if command in ("ds", "ds+"):
        cfg, extra = (argv, []) if command == "ds" else argv
        (root / "ds.json").write_text(json.dumps(cfg))
        return train_main.main, ["--deepspeed-config", str(root / "ds.json")] + extra
    argv = [a.replace("{d}", str(root)) for a in argv]
    if command == "train":
        return train_main.main, argv
    return hybrid.cli.main, [command.split("-")[0]] + argv


def _no_process_group(*a, **k):
    raise AssertionError("a process group was started for a bad input")




def _all_files(root) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_error_line_before_any_work(case, tmp_path, monkeypatch, one_line):
    name, command, argv, files, env, fragment = case
    monkeypatch.chdir(tmp_path)
    python_environment(monkeypatch)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(dist, "init_process_group", _no_process_group)
    monkeypatch.setattr(hybrid.testing, "run_distributed", _no_process_group)  # calibrate's rank spawner
    if command == "plan-nompl":
        monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    _write_files(tmp_path, files)
    fn, full_argv = _argv(command, argv, tmp_path)
    before = _all_files(tmp_path)

    start = time.perf_counter()
    line = one_line(lambda: fn(full_argv))  # non-zero, one line, no traceback, no process group
    elapsed = time.perf_counter() - start

    assert line.startswith(f"{PROG[command]}: error: "), line
    fragment = fragment.replace("{d}", str(tmp_path))
    assert fragment in line, f"{fragment!r} not in {line!r}"
    # every flag it suggests is one the command (or the command it quotes) accepts
    assert foreign(line, PROG[command], full_argv) == [], line
    assert _all_files(tmp_path) == before, "nothing may be left behind"
    assert elapsed < FAST_S, f"took {elapsed:.1f} s: the check is not before the work"


def test_the_table_covers_at_least_80_bad_inputs_of_every_command():
    kinds = {c[1].split("-")[0].rstrip("+") for c in CASES}
    assert len(CASES) >= 80 and kinds == {"train", "ds", "plan", "layout", "calibrate"}


def test_deepspeed_booleans_and_flags_that_agree_are_accepted(tmp_path, monkeypatch):
    """The other side of the conflict checks: JSON false leaves bf16 off, and a value equal to the flag is fine."""
    from hybrid.train.args import parse_args, run_config
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"bf16": {"enabled": False}, "zero_optimization": {"stage": 1},
                                "gradient_accumulation_steps": 2}))
    args = parse_args(["--deepspeed-config", str(path), "--zero-stage", "1", "--micro-batch-size", "2",
                       "--global-batch-size", "8"])
    run = run_config(args, world=2)
    assert run.zero.precision.value == "fp32" and run.zero.stage == 1 and run.training.batch.global_batch == 8


def test_error_under_torchrun_is_printed_by_rank_zero_only_and_recorded(tmp_path, monkeypatch, capsys):
    """Rank 1 of a torchrun job exits non-zero silently, after waiting for the launcher to stop it (so it cannot kill
    a slower rank 0 before rank 0 prints); both ranks write the line to their elastic error file."""
    waited = []
    monkeypatch.setattr(train_main, "outlive_rank_zero", lambda e: waited.append(e.message))
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / f"error{rank}.json"))
        with pytest.raises(SystemExit) as e:
            train_main.main(["--lr", "inf"])
        printed = (capsys.readouterr().err + (e.value.code if isinstance(e.value.code, str) else "")).strip()
        assert printed == ("train.py: error: --lr must be a finite number, got inf" if rank == "0" else "")
        assert e.value.code not in (0, None)
        recorded = json.loads((tmp_path / f"error{rank}.json").read_text())["message"]
        assert recorded["message"] == "train.py: error: --lr must be a finite number, got inf"
    monkeypatch.setenv("RANK", "1")  # argparse errors too
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error_parse.json"))
    with pytest.raises(SystemExit):
        train_main.main(["--lrr", "1"])
    assert capsys.readouterr().err == ""
    assert "did you mean --lr?" in (tmp_path / "error_parse.json").read_text()
    assert waited == ["train.py: error: --lr must be a finite number, got inf",
                      "train.py: error: unrecognized arguments: --lrr; did you mean --lr?"]


def test_a_rank_that_outlives_rank_zero_prints_the_line_itself(monkeypatch, capsys):
    """If torchrun has not stopped rank 1 within the grace period, rank 0 did not report: rank 1 says it."""
    from hybrid.cliutil import fail, outlive_rank_zero
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")  # torchrun's rank 1 of 2 (RANK 1 of a world of 1 prints at once)
    error = fail("train.py: error: --lr must be a finite number, got inf")
    assert error.code == 1
    outlive_rank_zero(error, grace_s=0.1)
    assert capsys.readouterr().err == "train.py: error: --lr must be a finite number, got inf (rank 1)\n"


def test_help_shows_every_option_with_help_and_default_and_the_launch_example(capsys):
    from hybrid.train.args import build_parser
    parser = build_parser()
    text = parser.format_help()
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help, f"{action.option_strings[0]} has no help"
    assert text.count("(default:") == len([a for a in parser._actions if a.option_strings]) - 1
    assert "torchrun --nproc-per-node 8 -m hybrid.train --tensor-model-parallel-size 2" in text
    assert "python -m hybrid.train" in text


def test_plan_help_has_no_developer_notes_and_marks_required_flags(capsys):
    with pytest.raises(SystemExit):
        hybrid.cli.main(["plan", "--help"])
    text = capsys.readouterr().out
    assert "add_parser" not in text and "args.func" not in text and "hybrid/cli.py" not in text
    assert "Required: --global-batch-size" in text and "(required, unless --scan-gpus)" in text
    assert " --global-batch-size N [" in text.replace("\n", " ")  # argparse shows required flags unbracketed


@pytest.mark.parametrize("plan_argv", [
    ["--model", "gpt2-medium", "--gpus", "8", "--global-batch-size", "32", "--seq-length", "1024"],
    ["--model", "tiny-llama", "--gpus", "4", "--global-batch-size", "16", "--seq-length", "64", "--precision", "fp32",
     "--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size", "2"],
    ["--model", "llama-3-8b", "--gpus", "64", "--gpu", "h100-80g", "--global-batch-size", "512",
     "--seq-length", "4096"],
], ids=["gpt2-medium-8", "tiny-llama-interleaved-4", "llama-3-8b-64"])
def test_emit_args_are_accepted_by_train_py(plan_argv, capsys):
    """`hybrid plan --emit-args` prints flags that train.py's own parse and checks accept at that world size."""
    from hybrid.planner.cli import main as plan_main
    from hybrid.train.args import check_args, parse_args
    assert plan_main(plan_argv + ["--emit-args"]) == 0
    flags = capsys.readouterr().out.split()
    world = int(plan_argv[plan_argv.index("--gpus") + 1])
    cfg, dims, batch, plan = check_args(parse_args(flags), world=world)
    assert dims.world == world
    assert ("--bf16" in flags) == ("--precision" not in plan_argv), "mixed-precision plans train in bf16"


def test_atomic_output_leaves_nothing_on_failure_and_replaces_on_success(tmp_path):
    from hybrid.cliutil import atomic_output
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError):
        with atomic_output(str(target)) as tmp:
            open(tmp, "w").write("half")
            raise RuntimeError("the work failed")
    assert not os.listdir(tmp_path)
    with atomic_output(str(target), suffix=".json") as tmp:
        assert tmp.endswith(".json") and os.path.dirname(tmp) == str(tmp_path)
        open(tmp, "w").write("done")
    assert os.listdir(tmp_path) == ["out.json"] and target.read_text() == "done"
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask, "an ordinary file's mode, not mkstemp's 0600"


def test_output_directory_checks(tmp_path):
    from hybrid.cliutil import check_output_dir
    check_output_dir("--save", str(tmp_path / "new" / "dir"))  # creatable
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="--save .* exists and is not a directory"):
        check_output_dir("--save", str(tmp_path / "file"))
    with pytest.raises(ValueError, match="--save .* is not writable"):
        check_output_dir("--save", str(tmp_path / "file" / "sub"))
    with pytest.raises(ValueError, match="--save '/proc/self/ckpt'"):
        check_output_dir("--save", "/proc/self/ckpt")
    assert sorted(os.listdir(tmp_path)) == ["file"], "the probe leaves nothing behind"


def test_output_file_probe_refuses_a_file_system_that_refuses_creation(tmp_path, monkeypatch):
    """os.access answers yes for root even where a create fails (/proc, read-only mounts); the probe create is
    what atomic_output will do, so its failure is the error -- here a read-only file system, simulated."""
    import errno
    import tempfile

    from hybrid.cliutil import check_output_file

    def read_only(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    check_output_file("--out", str(tmp_path / "ok.json"))
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(ValueError, match=r"--out '.*ro.json': cannot create a file in .* \(Read-only file system\)"):
        check_output_file("--out", str(tmp_path / "ro.json"))


def _script(name: str):
    """scripts/<name>.py as a module (the scripts are not a package)."""
    import importlib.util
    path = os.path.join(os.path.dirname(__file__), "..", "scripts", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# (script, argv, files, fragment): the benchmark and plotting scripts' flags, checked before any spawn
SCRIPT_CASES = [
    ("bench_zero", ["--dp", "0"], {}, "--dp"),
    ("bench_zero", ["--steps", "-1"], {}, "--steps"),
    ("bench_zero", ["--hidden", "100"], {}, "--hidden 100"),
    ("bench_zero", ["--out", "/dev/null"], {}, "--out '/dev/null' is not a regular file"),
    ("bench_zero", ["--out", "{d}"], {}, "is a directory"),
    ("bench_zero", ["--opt-numel", "0"], {}, "--opt-numel"),
    ("bench_layer_fit", ["--reps", "1"], {}, "--reps"),
    ("bench_layer_fit", ["--seconds", "0"], {}, "--seconds"),
    ("bench_layer_fit", ["--out", "{d}"], {}, "is a directory"),
    ("bench_layer_fit", ["--profile", "{d}/nope.json"], {}, "--profile"),
    ("bench_planner", ["--ranks", "0"], {}, "--ranks"),
    ("bench_planner", ["--ranks", "1"], {}, "--ranks"),
    ("bench_planner", ["--heads", "3"], {}, "--heads 3"),
    ("bench_planner", ["--global-batch", "6", "--micro-batch", "4"], {}, "--micro-batch 4"),
    ("bench_planner", ["--hardware", "{d}/nope.json"], {}, "--hardware"),
    ("bench_planner", ["--hardware", "{d}/hw.json"], {"hw.json": _profile(peak_tflops=_DROP)},
     "hardware.peak_tflops"),
    ("bench_planner", ["--out", "/dev/null"], {}, "--out '/dev/null' is not a regular file"),
    ("bench_planner", ["--save-hardware", "{d}/pipe"], {"pipe": FIFO}, "--save-hardware"),
    ("bench_planner", ["--stepz", "3"], {}, "did you mean --steps?"),
    ("bench_interleaved", ["--layers", "6"], {}, "--layers 6 must be a multiple of 8"),
    ("bench_interleaved", ["--micro-batches", "3"], {}, "--micro-batches 3 must be a multiple of pp = 2"),
    ("bench_interleaved", ["--hardware", "{d}/nope.json"], {}, "--hardware"),
    ("bench_interleaved", ["--out", "{d}"], {}, "is a directory"),
    ("bench_planner_ranking", ["--hidden", "100"], {}, "--hidden 100"),
    ("bench_planner_ranking", ["--out", "/dev/null"], {}, "--out '/dev/null' is not a regular file"),
    ("bench_tp", ["--out", "/dev/null"], {}, "--out '/dev/null' is not a regular file"),
    ("bench_tp", ["--out", "{d}/pipe"], {"pipe": FIFO}, "is not a regular file"),
    ("bench_pipeline", ["--out", "/dev/null"], {}, "--out '/dev/null' is not a regular file"),
    ("bench_pipeline", ["--out", "{d}"], {}, "is a directory"),
    ("plot_schedule", ["--out", "{d}/pipe.png"], {"pipe.png": FIFO}, "is not a regular file"),
    ("plot_schedule", ["--out", "{d}/no/such/x.png"], {}, "does not exist"),
    ("plot_schedule", ["--out", "{d}/x.png", "--no-matplotlib"], {}, "pip install matplotlib"),
]


@pytest.mark.parametrize("case", SCRIPT_CASES, ids=[f"{c[0]}:{' '.join(c[1])}" for c in SCRIPT_CASES])
def test_script_bad_flag_is_one_error_line_before_any_work(case, tmp_path, monkeypatch, capsys):
    name, argv, files, fragment = case
    monkeypatch.chdir(tmp_path)
    _write_files(tmp_path, files)
    module = _script(name)
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    if "--no-matplotlib" in argv:
        argv.remove("--no-matplotlib")
        monkeypatch.setattr(module, "matplotlib", None)
    elif name == "plot_schedule" and module.matplotlib is None:
        monkeypatch.setattr(module, "matplotlib", object())  # the path checks come first either way
    before = _all_files(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exit_info.value.code not in (0, None)
    assert len(lines) == 1 and lines[0].startswith(f"{name}.py: error: ") and fragment in lines[0], lines
    assert _all_files(tmp_path) == before, "nothing may be left behind"


@pytest.mark.parametrize("rank", ["0x", "2", "-1"])
def test_a_rank_outside_the_world_is_an_error_not_a_rendezvous_that_never_completes(rank, monkeypatch):
    """(The check alone; the rows rank-outside-world and rank-not-a-number run it through train.py: such a RANK is
    set by hand, so the process prints its line at once rather than wait for a rank 0, as a torchrun worker does.)"""
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(ValueError, match=f"RANK '{rank}' is not an integer in \\[0, WORLD_SIZE 2\\)"):
        train_main.check_launcher_env(2)
