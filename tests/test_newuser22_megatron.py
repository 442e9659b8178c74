"""Round 22's new-user pass: Megatron-LM's own example scripts (examples/gpt3/train_gpt3_175b_distributed.sh,
examples/llama/train_llama3_8b_h100_fp8.sh) and a DeepSpeed user's ds_config.json, ported flag for flag to train.py.
What a migrating user met, each fixed here:

1. --lr-warmup-fraction (the GPT-3 example's warm-up) was refused; it is Megatron's W = fraction x the decay iterations.
2. --recompute-method uniform --recompute-num-layers 1, which megatron-core requires beside --recompute-granularity
   full, was refused as "a subset of layers" -- it is every layer on its own, what full runs here.
3. The llama example's flags said "see --help" (--attention-backend, --manual-gc, --profile, ...) or a misleading
   near spelling (--fp8-param-gather "did you mean --overlap-param-gather?").
4. The llama example's --split '99,1,0' (its bash array passes the quotes) was refused; megatron-core reads it.
5. --bf16 accumulates gradients in bf16 here, Megatron's --bf16 in fp32: the start-up line now says which.
6. A DeepSpeed config's wall_clock_breakdown / steps_per_print / tensorboard were "ignored" with no word of what
   does their job here; its optimizer section without a scheduler (DeepSpeed: a constant rate) ran train.py's
   default warm-up and cosine decay with no word of why.

In this process, one rank, no process group (conftest's `one_line`)."""

from __future__ import annotations

import json
import types

import pytest
import torch

from hybrid.train.main import validate
from models import Recompute

pytestmark = pytest.mark.usefixtures("one_process")  # tests/conftest.py: python, not torchrun: world 1


def _world(monkeypatch, n: int) -> None:
    """torchrun's environment for rank 0 of `n` on one node."""
    for name, value in (("WORLD_SIZE", str(n)), ("RANK", "0"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", str(n)),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)


# --- 1. --lr-warmup-fraction: Megatron's warm-up of fraction x the decay iterations --------------------------------
@pytest.mark.parametrize("extra, decay", [([], 20), (["--lr-decay-iters", "16"], 16)])
def test_warmup_fraction_warms_up_over_that_fraction_of_the_decay(extra, decay):
    """Megatron's get_optimizer_param_scheduler: lr_warmup_steps = fraction x lr_decay_steps (lr_decay_iters, unset:
    train_iters, times the global batch, as its increments). So the run's rate at every step is the one of
    --lr-warmup-iters W = fraction x D, whose schedule tests/test_explain.py checks against megatron-core's
    scheduler step by step -- and not the default warm-up's."""
    argv = ["--train-iters", "20", "--lr", "1e-3", "--min-lr", "1e-4"] + extra
    run = validate(argv + ["--lr-warmup-fraction", "0.25"])[0]
    w = round(0.25 * decay)  # 5 or 4: whole
    explicit = validate(argv + ["--lr-warmup-iters", str(w)])[0]
    default = validate(argv)[0]
    assert run.optimizer.warmup_iters == w and run.flag_values["lr_warmup_iters"] == w  # what a checkpoint records
    rates = [run.optimizer.lr_at(k) for k in range(25)]
    assert rates == [explicit.optimizer.lr_at(k) for k in range(25)]
    assert rates[1] == pytest.approx(1e-3 / w, rel=1e-15)  # k / W of the peak, not the default's k / 10
    assert rates != [default.optimizer.lr_at(k) for k in range(25)]


def test_warmup_fraction_of_the_gpt3_example_gives_its_iterations():
    """examples/gpt3/train_gpt3_175b_distributed.sh: --lr-warmup-fraction .001 --lr-decay-iters 430000 -> 430
    (0.001 x 430000 is 430.00000000000006 in floats: a whole number of iterations)."""
    run = validate(["--train-iters", "8", "--lr-warmup-fraction", ".001", "--lr-decay-iters", "430000"])[0]
    assert run.optimizer.warmup_iters == 430
    assert run.optimizer.lr_at(43) == pytest.approx(run.optimizer.lr * 0.1, rel=1e-12)


@pytest.mark.parametrize("argv, line", [
    (["--lr-warmup-fraction", ".001"],  # x --train-iters 100: 0.1 of an iteration
     "train.py: error: --lr-warmup-fraction 0.001 x --train-iters 100 = 0.1 iterations of warm-up, not a whole "
     "number; the warm-up here counts iterations: give --lr-warmup-iters 0 (or a fraction that gives whole "
     "iterations)"),
    (["--lr-warmup-fraction", ".01", "--lr-warmup-iters", "5"],
     "train.py: error: --lr-warmup-fraction 0.01 and --lr-warmup-iters 5 both set the warm-up (Megatron-LM refuses "
     "both too); give one of them"),
    (["--lr-warmup-fraction", "1"],
     "train.py: error: --lr-warmup-fraction must be in [0, 1) (the warm-up must end before the decay does), got 1"),
    (["--lr-warmup-fraction", "-0.5"], "train.py: error: --lr-warmup-fraction must be >= 0.0, got -0.5"),
])
def test_warmup_fraction_that_cannot_run_is_one_line(argv, line, one_line):
    assert one_line(lambda: validate(argv)) == line


def test_warmup_fraction_with_iterations_of_zero_or_the_same_is_accepted():
    """Megatron refuses both flags unless --lr-warmup-iters is 0 (its default); the same W twice is no conflict."""
    for iters in ("0", "1"):
        run = validate(["--lr-warmup-fraction", ".01", "--lr-warmup-iters", iters])[0]
        assert run.optimizer.warmup_iters == 1  # 0.01 x --train-iters 100


# --- 2. --recompute-method / --recompute-num-layers: megatron-core's pair beside full ---------------------------------
@pytest.mark.parametrize("method, n", [("uniform", "1"), ("block", "2"), ("block", "3")])
def test_recompute_method_that_is_every_layer_runs_full(method, n, monkeypatch):
    """tp 1 x pp 2 of tiny-gpt2's 4 layers: chunks of 2. uniform with 1-layer units and block with N >= 2 checkpoint
    every layer alone (megatron-core's TransformerBlock._checkpointed_forward) -- full here; without the flags the
    run keeps every activation."""
    _world(monkeypatch, 2)
    base = ["--pipeline-model-parallel-size", "2", "--global-batch-size", "8"]
    run = validate(base + ["--recompute-granularity", "full", "--recompute-method", method,
                           "--recompute-num-layers", n])[0]
    assert run.model.recompute is Recompute.FULL
    assert validate(base)[0].model.recompute is Recompute.NONE


@pytest.mark.parametrize("argv, line", [
    (["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"],
     "train.py: error: --recompute-method uniform --recompute-num-layers 2 checkpoints units of 2 layers (one saved "
     "input a unit), which is not implemented: full recomputes each layer on its own; give --recompute-num-layers 1 "
     "(or drop both flags: the same)"),
    (["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"],
     "train.py: error: --recompute-method block --recompute-num-layers 1 recomputes 1 layers of each model chunk "
     "(up to 4 layers here), and recomputing a subset is not implemented: give --recompute-num-layers 4 (every "
     "layer, as --recompute-granularity full alone), or --recompute-granularity selective (the attention core of "
     "every layer)"),
    (["--recompute-method", "uniform", "--recompute-num-layers", "1"],
     "train.py: error: --recompute-method and --recompute-num-layers choose which layers --recompute-granularity "
     "full recomputes, and the run has no --recompute-granularity (megatron-core refuses it too); add "
     "--recompute-granularity full or drop --recompute-method and --recompute-num-layers"),
    (["--recompute-granularity", "selective", "--recompute-num-layers", "1"],
     "train.py: error: --recompute-num-layers chooses which layers --recompute-granularity full recomputes, and the "
     "run has --recompute-granularity selective (megatron-core refuses it too); add --recompute-granularity full or "
     "drop --recompute-num-layers"),
    (["--recompute-granularity", "full", "--recompute-method", "uniform"],
     "train.py: error: --recompute-method uniform needs --recompute-num-layers too (megatron-core's pair: "
     "Megatron-LM's --recompute-num-layers defaults to None since 2023, and TransformerConfig refuses full without "
     "it); give --recompute-num-layers 1 (every layer recomputed alone), or drop --recompute-method: "
     "--recompute-granularity full alone is the same run"),
])
def test_recompute_method_that_is_not_every_layer_is_one_line(argv, line, one_line):
    """Units of several layers and a subset of a chunk's layers are not implemented; the pair without full is
    refused as megatron-core's TransformerConfig refuses it -- never a run that recomputes something else."""
    assert one_line(lambda: validate(argv)) == line


# --- 3. the example scripts' other flags: one line naming each, with where its setting lives --------------------------
LLAMA3_8B = ("--use-mcore-models --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
             "--group-query-attention --num-query-groups 8 --kv-channels 128 --max-position-embeddings 8192 "
             "--position-embedding-type rope --rotary-base 1000000 --rotary-percent 1.0 --swiglu "
             "--init-method-std 0.0134 --attention-backend fused --apply-layernorm-1p "
             "--untie-embeddings-and-output-weights --disable-bias-linear --train-samples 1953125000 "
             "--lr-decay-samples 1949218748 --lr-warmup-samples 3906252 --decoupled-lr 5.0e-4 --decoupled-min-lr "
             "4.5e-5 --cross-entropy-loss-fusion --calculate-per-token-loss --manual-gc "
             "--empty-unused-memory-level 1 --exit-duration-in-mins 235 --fp8-format hybrid --fp8-amax-history-len "
             "1024 --fp8-amax-compute-algo max --fp8-param-gather --use-distributed-optimizer --overlap-grad-reduce "
             "--mock-data --vocab-size 128256 --tiktoken-pattern v2 "
             "--no-create-attention-mask-in-dataloader --no-mmap-bin-files --num-workers 1 --log-throughput "
             "--profile --profile-step-start 4 --profile-step-end 6 --ckpt-format torch_dist").split()
# the script's --data-cache-path cache is a flag train.py takes since round 25 (the sample-index cache, docs/data.md)
# the script's --grad-reduce-in-bf16 is a flag train.py takes since round 22 (Megatron's meaning: bf16 gradients;
# tests/test_zero22_bf16_grads.py), so it is not among the refused flags here
GPT3_175B = ("--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --max-position-embeddings 2048 "
             "--attention-backend auto --rampup-batch-size 16 16 5859375 --init-method-std 0.006 --vocab-file "
             "gpt2-vocab.json --merge-file gpt2-merges.txt").split()
OLDER = ("--checkpoint-activations --checkpoint-num-layers 1 --encoder-seq-length 2048 --no-bias-gelu-fusion "
         "--no-bias-dropout-fusion --fp16-lm-cross-entropy --DDP-impl torch --data-impl mmap --lr-warmup-init 0 "
         "--save-retain-interval 100 --train-data-path a --deepspeed --deepspeed-activation-checkpointing "
         "--no-pipeline-parallel --use-flash-attn-v2 --ddp-bucket-size 40000000 --use-torch-fsdp2 --finetune "
         "--log-validation-ppl-to-tensorboard --log-memory-to-tensorboard --eod-mask-loss --qk-layernorm "
         "--squared-relu --no-async-tensor-model-parallel-allreduce --override-opt_param-scheduler").split()


@pytest.mark.parametrize("script", [LLAMA3_8B, GPT3_175B, OLDER], ids=["llama3_8b", "gpt3_175b", "older"])
def test_example_scripts_flags_are_each_named_with_where_their_setting_lives(script, one_line):
    """Every flag train.py does not take is named in the one line with its hint: none said "see --help" and none
    points at a near spelling that is another thing (--fp8-param-gather was "did you mean --overlap-param-gather?")."""
    line = one_line(lambda: validate(script))
    unknown = [w for w in script if w.startswith("--")]
    assert line.startswith("train.py: error: unrecognized arguments: "), line
    assert "see --help" not in line and "did you mean" not in line, line
    missing = [flag for flag in unknown if f"; {flag}: " not in line]
    assert missing == [], missing


def test_megatron_null_tokenizer_names_the_built_in_corpus(one_line):
    line = one_line(lambda: validate(["--tokenizer-type", "NullTokenizer"]))
    assert line.endswith("Megatron's NullTokenizer (with --mock-data) is the built-in corpus here: omit --data-path "
                         "and --tokenizer-type (bytes, vocabulary 256: the tiny-* presets)"), line


# --- 4. --split with the quotes Megatron's llama scripts pass -----------------------------------------------------
@pytest.mark.parametrize("text", ["'99,1,0'", '"99,1,0"', " '99,1,0' "])
def test_split_in_quotes_is_megatrons_split(text):
    """examples/llama/train_llama3_8b_h100_fp8.sh: DATA_ARGS_LIST+=("--split '99,1,0'") expanded unquoted passes
    the quotes; megatron-core's parse_and_normalize_split finds the numbers (re.findall), so did it run there."""
    from hybrid.data.gpt import parse_split
    assert parse_split(text) == (0.99, 0.01, 0.0)
    assert validate(["--split", text])[0].data.split == (0.99, 0.01, 0.0)


@pytest.mark.parametrize("text", ["'", "''", "'a,b'", "'-1,2,3'"])
def test_split_in_quotes_with_no_numbers_stays_refused(text):
    from hybrid.data.gpt import parse_split
    with pytest.raises(ValueError, match="^--split "):
        parse_split(text)


# --- 5. the gradients' dtype under --bf16 / --fp16, said at start-up --------------------------------------------------
@pytest.mark.parametrize("argv, part", [
    (["--bf16"], "zero: stage 0 | bf16 | fp32 grads | clip-grad 1.0"),
    (["--bf16", "--grad-reduce-in-bf16"], "zero: stage 0 | bf16 | bf16 grads (--grad-reduce-in-bf16) | clip-grad 1.0"),
    (["--fp16"], " | fp16 grads (fp32: --accumulate-allreduce-grads-in-fp32) | clip-grad 1.0"),
    (["--bf16", "--accumulate-allreduce-grads-in-fp32"], "zero: stage 0 | bf16 | fp32 grads | clip-grad 1.0"),
    ([], "zero: stage 0 | fp32 | clip-grad 1.0"),
])
def test_start_up_line_says_the_gradient_dtype(argv, part):
    """Megatron-LM's --bf16 accumulates and reduces gradients in fp32 unless --grad-reduce-in-bf16, and so does
    hybrid's since round 22 (it ran bf16 gradients unless --accumulate-allreduce-grads-in-fp32 before); --fp16 keeps
    fp16 gradients unless that flag, as Megatron's. The zero line says which, and the flag that changes it."""
    from hybrid.train.loop import _header
    run = validate(argv)[0]
    text = _header(run, torch.nn.Linear(2, 2), types.SimpleNamespace(optimizer_kind="-"), torch.device("cpu"))
    zero = text.splitlines()[1]
    assert zero.endswith(part), zero


# --- 6. a DeepSpeed config's ignored keys, with what does their job here ---------------------------------------------
def test_deepspeed_ignored_keys_name_what_does_their_job(tmp_path, capsys):
    """A DeepSpeed user's config (its ZeRO, batch, clipping, precision and optimizer keys are read and set the run);
    wall_clock_breakdown, steps_per_print and tensorboard were listed as "ignored" only."""
    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
          "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "overlap_comm": True,
                                "stage3_gather_16bit_weights_on_model_save": True},
          "bf16": {"enabled": True}, "steps_per_print": 10, "wall_clock_breakdown": True,
          "tensorboard": {"enabled": True, "output_path": "tb"},
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}}}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    capsys.readouterr()
    run = validate(["--deepspeed-config", str(tmp_path / "ds.json")])[0]
    z, o, b = run.zero, run.optimizer, run.training.batch
    assert (z.stage, z.offload_optimizer, z.precision.value, o.clip_grad, o.lr, o.weight_decay) == \
        (2, True, "bf16", 0.5, 3e-4, 0.1)
    assert (b.micro_batch, b.global_batch) == (2, 4)
    ignored = ("train.py: warning: --deepspeed-config keys not supported, ignored: steps_per_print (the log line "
               "every --log-interval steps), wall_clock_breakdown (per-rank step times and the time split every "
               "--timing-log-interval log intervals), tensorboard (--tensorboard-dir DIR), "
               "zero_optimization.overlap_comm, zero_optimization.stage3_gather_16bit_weights_on_model_save "
               "(`hybrid convert CKPT OUT` writes a checkpoint's whole weights (docs/convert.md))")
    assert capsys.readouterr().err.splitlines() == [
        "train.py: warning: --deepspeed-config has an optimizer section and no scheduler, which DeepSpeed runs at its "
        "lr 0.0003 throughout; this run has train.py's default schedule, a warm-up over 10 iterations, cosine decay "
        "to --min-lr 0.0001: for DeepSpeed's, pass --lr-decay-style constant --lr-warmup-iters 0", ignored]
    assert run.optimizer.lr_at(1) == pytest.approx(3e-5, rel=1e-12)  # what the warning says: 1 / 10 of the peak
    run = validate(["--deepspeed-config", str(tmp_path / "ds.json"), "--lr-decay-style", "constant",
                    "--lr-warmup-iters", "0"])[0]
    assert {run.optimizer.lr_at(k) for k in range(100)} == {3e-4}  # DeepSpeed's constant rate, as the warning says
    assert capsys.readouterr().err.splitlines() == [ignored]  # a schedule flag given: the user chose


# --- 7. Megatron's gpt2-vocab.json + gpt2-merges.txt: the hint's one line makes the tokenizer.json ------------------
def test_vocab_and_merge_files_hint_gives_a_command_that_keeps_the_ids(tmp_path, monkeypatch, one_line):
    """--vocab-file / --merge-file said only "a tokenizer.json here (AutoTokenizer.save_pretrained writes it)"; a
    Megatron user holds the two GPT-2 files. The hint's command, run as given on a BPE's vocab.json and merges.txt,
    writes a folder whose ids are the BPE's own for every text and whose end of document is <|endoftext|>."""
    from tokenizers import ByteLevelBPETokenizer

    from hybrid.data.tokenizer import FROM_VOCAB_MERGES, build_tokenizer
    texts = ["def f(x):\n    return x + 1\n", "The quick brown fox jumps over the lazy dog.", "naïve café über"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts * 20, vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False)
    bpe.save_model(str(tmp_path))  # vocab.json, merges.txt: the format of Megatron's gpt2-vocab.json / -merges.txt
    (tmp_path / "vocab.json").rename(tmp_path / "gpt2-vocab.json")
    (tmp_path / "merges.txt").rename(tmp_path / "gpt2-merges.txt")
    line = one_line(lambda: validate(["--vocab-file", "gpt2-vocab.json"]))
    assert FROM_VOCAB_MERGES in line, line
    code = FROM_VOCAB_MERGES.split('python -c "', 1)[1].split('"', 1)[0]
    monkeypatch.chdir(tmp_path)
    exec(code, {})  # the command the line gives, as written
    tok = build_tokenizer("HuggingFaceTokenizer", "tok/")
    assert [tok.encode(t) for t in texts + ["unseen wordsmith"]] == \
        [bpe.encode(t).ids for t in texts + ["unseen wordsmith"]]
    assert tok.eod == bpe.token_to_id("<|endoftext|>") == 0
