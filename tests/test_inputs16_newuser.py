"""Round 16's new-user pass, what it found beyond the five known findings (tests/test_inputs16_known.py): each bad
input now ends in one line naming the flag or key and the fix, before any process group.

1. train.py: transformers Trainer's flags (--learning_rate, --per_device_train_batch_size, --num_train_epochs,
   --gradient_accumulation_steps, --output_dir, ...) said "see --help"; --max_steps said "did you mean
   --max-skipped-steps?" and --eval_steps "--eval-iters?" (both another thing). Each names train.py's flag.
2. train.py: the flag torch.distributed.launch and the deepspeed launcher pass (--local-rank / --local_rank) and
   torchrun's own flags given after the script (--nproc_per_node 2) said "see --help".
3. dp is not a flag anywhere: --data-parallel-size got "did you mean --context-parallel-size?" (train.py, plan,
   layout), --dp "--simulated-dp-bandwidth?"; `hybrid plan --tp 2` got "--allow-cross-node-tp?", --num-gpus
   "--scan-gpus?", --bf16 "see --help"; `hybrid layout --world-size` (inspect's name for it) "see --help";
   `hybrid calibrate --nproc-per-node` "see --help".
4. A config.json key misspelt (num_attention_head) was ignored by transformers, and the model silently got the
   field's default (32 heads): now refused, naming both keys and the default.
5. `hybrid layout ... | head` ended in BrokenPipeError's traceback.
6. hybrid generate: --bf16, --device, --eos-token-id, --stream said "see --help", --prompt-file "did you mean
   --prompt-ids?": each says what generate does instead.
7. train.py --load HF --save HF (the same transformers model folder, "fine-tune in place") was read as Megatron's
   resume convention: no checkpoint there, so the run started from scratch and the weights --load named were never
   read, with one start-up note. Refused; another model folder as --save is refused without --overwrite-save.
8. train.py --exit-interval N above --train-iters would never stop the run: refused, as other flags that would do
   nothing are.
9. A tokenizer that does not match the data: --tokenizer-type HuggingFaceTokenizer with a text --data-path (or the
   default corpus), read a byte per token whatever the flag says, and --tokenizer-type ByteLevel with an indexed
   dataset holding ids >= 256 both ran, recording a tokenizer the model never saw (hybrid generate then decodes
   with it). Refused, naming the fix.
10. scripts/train_tokenizer.py --output-prefix / --tokenizer-type (preprocess_data.py's flags) said "see --help".
11. A switch given a value, transformers' `--bf16 True` (or `--sequence-parallel 1`), said "unrecognized arguments:
   True; see --help": now names the switch.
12. hybrid convert: --torch_dtype, --dtype bfloat16 (torch's names), --ckpt-step (train.py's), --safe-serialization,
   --push-to-hub (save_pretrained's) said "see --help" or "invalid choice" alone.

In this process (conftest's `one_line`), but for one pipe (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hybrid.cli import main as hybrid_main
from hybrid.train.main import validate

pytestmark = pytest.mark.usefixtures("one_process")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- 1. transformers' Trainer flags --------------------------------------------------------------------------------
@pytest.mark.parametrize("flag, value, hint", [
    ("--learning_rate", "1e-4", "train.py's flag is --lr"),
    ("--learning-rate", "1e-4", "train.py's flag is --lr"),
    ("--per_device_train_batch_size", "4", "train.py's flag is --micro-batch-size"),
    ("--num_train_epochs", "1", "a run counts iterations, not epochs: give --train-iters N"),
    ("--epochs", "1", "a run counts iterations, not epochs: give --train-iters N"),
    ("--gradient_accumulation_steps", "4", "--global-batch-size = --micro-batch-size x dp x the accumulation steps"),
    ("--gradient-accumulation-steps", "4", "--global-batch-size = --micro-batch-size x dp x the accumulation steps"),
    ("--output_dir", "out", "checkpoints go to --save DIR, the log lines' numbers to --metrics-file FILE"),
    ("--max_steps", "10", "train.py's flag is --train-iters"),
    ("--max-steps", "10", "train.py's flag is --train-iters"),
    ("--eval_steps", "5", "train.py's flag is --eval-interval"),
    ("--warmup_steps", "5", "train.py's flag is --lr-warmup-iters"),
    ("--lr_scheduler_type", "cosine", "train.py's flag is --lr-decay-style"),
    ("--max_grad_norm", "1", "train.py's flag is --clip-grad"),
    ("--logging_steps", "1", "train.py's flag is --log-interval"),
    ("--save_steps", "1", "train.py's flag is --save-interval"),
    ("--gradient_checkpointing", None, "--recompute-granularity full"),
    ("--resume_from_checkpoint", "x", "give --load DIR"),
    ("--model_name_or_path", "gpt2", "give --model"),
    ("--fsdp", "full_shard", "--zero-stage 3"),
    ("--report_to", "wandb", "not implemented: the log lines go to --tensorboard-dir DIR and --metrics-file FILE"),
    ("--wandb-project", "x", "not implemented: the log lines go to --tensorboard-dir DIR and --metrics-file FILE"),
    ("--mixed-precision", "bf16", "give --bf16 or --fp16"),
    ("--dtype", "bf16", "give --bf16 or --fp16"),
])
def test_trainer_flags_name_train_pys(flag, value, hint, one_line):
    line = one_line(lambda: validate(["--model", "tiny-gpt2", flag] + ([value] if value else [])))
    assert line.startswith(f"train.py: error: unrecognized arguments: {flag}; {flag}: ") and hint in line, line
    assert "see --help" not in line and "did you mean" not in line


def test_every_trainer_hint_names_a_flag_train_py_has():
    """A hint that names a flag train.py does not take would send the user on to the next error."""
    import re

    from hybrid.train.args import build_parser
    from hybrid.train.other_flags import LAUNCHER, TRAINER
    flags = {s for a in build_parser()._actions for s in a.option_strings}
    for flag, hint in {**TRAINER, **LAUNCHER}.items():
        named = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", hint)) - {flag, "--nproc-per-node"}  # torchrun's
        assert flag not in flags and named <= flags, (flag, named - flags)


# --- 2. the launchers' flags -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["--local-rank", "--local_rank"])
def test_local_rank_of_older_launchers_says_use_torchrun(flag, one_line):
    line = one_line(lambda: validate(["--model", "tiny-gpt2", f"{flag}=0"]))
    assert line.endswith(f"{flag}: the flag torch.distributed.launch and the deepspeed launcher pass; train.py reads "
                         f"its rank and world from the environment torchrun sets (LOCAL_RANK): launch with torchrun "
                         f"--nproc-per-node N scripts/train.py ..."), line


@pytest.mark.parametrize("flag, dashed", [("--nproc_per_node", "--nproc-per-node"), ("--nnodes", "--nnodes"),
                                          ("--master_port", "--master-port"), ("--standalone", "--standalone")])
def test_torchruns_flags_after_the_script_say_put_them_before(flag, dashed, one_line):
    line = one_line(lambda: validate(["--model", "tiny-gpt2", flag, "2"] if flag != "--standalone"
                                     else ["--model", "tiny-gpt2", flag]))
    assert line.endswith(f"{flag}: torchrun's flag, given after the script: put it before, torchrun {dashed} ... "
                         f"scripts/train.py ..."), line


# --- 3. dp and the other commands' sizes ---------------------------------------------------------------------------
@pytest.mark.parametrize("argv, world", [
    (["--model", "tiny-gpt2"], "the processes launched (torchrun --nproc-per-node x --nnodes)"),
])
@pytest.mark.parametrize("flag", ["--data-parallel-size", "--dp"])
def test_train_dp_is_not_a_flag(argv, world, flag, one_line):
    line = one_line(lambda: validate(argv + [flag, "2"]))
    assert line.endswith(f"{flag}: dp is not a flag: it is what the other sizes leave, {world} / (tp x cp x pp)")


PLAN = ["plan", "--model", "gpt2", "--gpus", "8", "--global-batch-size", "8"]


@pytest.mark.parametrize("argv, hint", [
    (PLAN + ["--data-parallel-size", "2"], "dp is not a flag: it is what the other sizes leave, --gpus / (tp x cp x pp)"),
    (PLAN + ["--dp", "2"], "dp is not a flag: it is what the other sizes leave, --gpus / (tp x cp x pp)"),
    (PLAN + ["--tp", "2"], "--tp: the flag is --tensor-model-parallel-size"),
    (PLAN + ["--pp", "2"], "--pp: the flag is --pipeline-model-parallel-size"),
    (PLAN + ["--bf16"], "--bf16: plan prices bf16 and fp16 alike: --precision mixed, the default"),
    (PLAN + ["--fp16"], "--fp16: plan prices bf16 and fp16 alike: --precision mixed, the default"),
    (["plan", "--model", "gpt2", "--num-gpus", "8", "--global-batch-size", "8"], "--num-gpus: give --gpus N"),
    (["layout", "--world-size", "8"], "--world-size: give the ranks as --world N"),
    (["layout", "--world", "8", "--dp", "2"], "dp is not a flag: it is what the other sizes leave, --world / "),
    (["layout", "--world", "8", "--tp", "2"], "--tp: the flag is --tensor-model-parallel-size"),
    (["checkpoint", "inspect", "x", "--data-parallel-size", "2"], "it is what the other sizes leave, --world-size /"),
    (["calibrate", "--nproc-per-node", "2"], "--nproc-per-node: give --ranks N: calibrate starts its own processes"),
])
def test_hybrid_commands_name_their_own_flag_for_the_sizes(argv, hint, one_line):
    line = one_line(lambda: hybrid_main(argv))
    assert "unrecognized arguments: " in line and hint in line and "did you mean" not in line, line


def test_each_short_size_hint_names_a_flag_the_command_has():
    from hybrid.cli import build_parser
    from hybrid.cliutil import parallel_hints
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices and "plan" in a.choices)
    for name in ("plan", "layout"):
        flags = {s for a in sub.choices[name]._actions for s in a.option_strings}
        for short, hint in parallel_hints("W").items():
            if "the flag is" in hint:
                assert hint.split("the flag is ")[1] in flags, (name, short)


# --- 4. a misspelt config.json key ----------------------------------------------------------------------------------
LLAMA = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


def _config(tmp_path, **change) -> str:
    raw = {k: v for k, v in {**LLAMA, **change}.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return str(tmp_path)


@pytest.mark.parametrize("typo, meant, default", [
    ("num_attention_head", "num_attention_heads", "32"),
    ("num_hidden_layer", "num_hidden_layers", "32"),
    ("intermediate_sizes", "intermediate_size", "11008"),
    ("max_position_embedding", "max_position_embeddings", "2048"),
    ("tie_word_embedding", "tie_word_embeddings", "false"),
])
def test_a_misspelt_config_key_is_named_with_the_default_it_would_get(typo, meant, default, tmp_path, one_line):
    folder = _config(tmp_path, **{meant: None, typo: LLAMA.get(meant, True)})
    line = one_line(lambda: validate(["--model", folder]))
    assert line == (f"train.py: error: --model {folder}/config.json: {typo!r} is not a llama config field; did you "
                    f"mean {meant!r}? (transformers ignores {typo!r}, and the model would get the default of "
                    f"{meant!r}, {default})")


def test_the_models_shipped_configs_and_other_tools_metadata_are_taken(tmp_path):
    """No false alarm: the committed transformers configs (gpt2's n_ctx and task_specific_params, llama's
    rope_scaling and torch_dtype: keys this transformers no longer lists) and a key far from every field."""
    from models.config import load_config
    folder = os.path.join(ROOT, "tests", "data", "configs")
    for name in sorted(os.listdir(folder)):
        assert load_config(os.path.join(folder, name)).num_layers >= 1, name
    cfg = load_config(_config(tmp_path, my_tool_run_id="abc", num_hidden_layer=3))  # beside the real key: harmless
    assert cfg.num_layers == 2 and cfg.num_heads == 4


def test_hybrid_models_names_the_misspelt_key_too(tmp_path, one_line):
    folder = _config(tmp_path, num_attention_heads=None, num_attention_head=4)
    assert "'num_attention_head' is not a llama config field" in one_line(lambda: hybrid_main(["models", folder]))


# --- 7. --save into a transformers model folder ---------------------------------------------------------------------
def _model_folder(tmp_path) -> str:
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (folder / "model.safetensors").write_bytes(b"")  # only the names are looked at before the refusal
    return str(folder)


@pytest.mark.parametrize("suffix", ["", "/"])
def test_load_and_save_the_same_model_folder_is_refused_not_a_fresh_start(suffix, tmp_path, one_line):
    hf = _model_folder(tmp_path)
    line = one_line(lambda: validate(["--model", "tiny-gpt2", "--load", hf, "--save", hf + suffix]))
    assert line == (f"train.py: error: --save {hf + suffix!r} is the transformers model folder --load reads the "
                    f"initial weights from, and --save DIR --load DIR means resume: with no checkpoint in it the run "
                    f"would start from scratch, the weights unread; give --save a directory of its own, e.g. --save "
                    f"{hf}_ckpt")
    assert sorted(os.listdir(hf)) == ["config.json", "model.safetensors"]


def test_save_into_another_model_folder_needs_consent(tmp_path, one_line):
    hf = _model_folder(tmp_path)
    line = one_line(lambda: validate(["--model", "tiny-gpt2", "--save", hf]))
    assert line.startswith(f"train.py: error: --save {hf!r} is a transformers model folder (config.json and its "
                           f"weights): ") and line.endswith("or pass --overwrite-save to write there anyway")
    assert validate(["--model", "tiny-gpt2", "--save", hf, "--overwrite-save"])
    assert validate(["--model", "tiny-gpt2", "--save", str(tmp_path / "ckpt")])


# --- 8. --exit-interval beyond the run --------------------------------------------------------------------------------
def test_exit_interval_past_train_iters_is_one_line(one_line):
    line = one_line(lambda: validate(["--model", "tiny-gpt2", "--train-iters", "2", "--exit-interval", "3"]))
    assert line == ("train.py: error: --exit-interval 3 stops after an iteration divisible by it, and --train-iters 2 "
                    "ends the run first, so it would never stop it; give --exit-interval N <= 2, or drop it")
    assert validate(["--model", "tiny-gpt2", "--train-iters", "2", "--exit-interval", "2"])


# --- 9. the tokenizer against the data ------------------------------------------------------------------------------
def _tokenizer_json(path) -> str:
    """A tokenizers JSON of 300 word ids (the model below holds 512)."""
    path.write_text(json.dumps({"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None,
                                "post_processor": None, "decoder": None, "model": {
                                    "type": "WordLevel", "vocab": {f"w{i}": i for i in range(300)}, "unk_token": "w0"}}))
    return str(path)


def _dataset(prefix: str, top: int) -> str:
    import numpy as np

    from hybrid.data.indexed import IndexedDatasetWriter
    w = IndexedDatasetWriter(prefix, np.uint16)
    for start in range(0, 4000, 100):
        w.add_document((np.arange(start, start + 100) % (top + 1)).astype(np.int64))
    w.finalize()
    return prefix


@pytest.fixture
def model512(tmp_path) -> str:
    return _config(tmp_path, vocab_size=512, max_position_embeddings=128)


def test_hf_tokenizer_on_text_data_says_preprocess_it_first(model512, tmp_path, one_line):
    tok = _tokenizer_json(tmp_path / "tok.json")
    text = tmp_path / "corpus.txt"
    text.write_text("hello world\n\n" * 200)
    base = ["--model", model512, "--seq-length", "16", "--tokenizer-type", "HuggingFaceTokenizer",
            "--tokenizer-model", tok]
    line = one_line(lambda: validate(base + ["--data-path", str(text)]))
    assert line.startswith(f"train.py: error: --data-path {text} is text, read a byte per token: --tokenizer-type "
                           f"HuggingFaceTokenizer would not tokenize it, only be recorded as the run's tokenizer")
    assert f"--tokenizer-model {tok}, then --data-path NAME_text_document), or drop the tokenizer flags" in line
    line = one_line(lambda: validate(base))
    assert line.startswith("train.py: error: without --data-path the run reads the default corpus, text, read a byte")
    assert validate(base + ["--data-path", _dataset(str(tmp_path / "tokd"), 299)])  # tokenized: taken


def test_byte_level_on_data_with_ids_past_255_names_the_other_tokenizer(model512, tmp_path, one_line):
    data = _dataset(str(tmp_path / "d"), 300)
    base = ["--model", model512, "--seq-length", "16", "--data-path"]
    line = one_line(lambda: validate(base + [data, "--tokenizer-type", "ByteLevel"]))
    assert line == (f"train.py: error: --data-path {data}: token id 300 is beyond --tokenizer-type ByteLevel's 256 "
                    f"byte tokens, so another tokenizer wrote it; give that one (--tokenizer-type HuggingFaceTokenizer "
                    f"--tokenizer-model DIR), the one the run records for generate and convert")
    assert validate(base + [_dataset(str(tmp_path / "b"), 255), "--tokenizer-type", "ByteLevel"])  # bytes: taken
    assert validate(base + [data])  # no tokenizer named: nothing recorded to contradict


# --- 10. train_tokenizer.py -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("flag, hint", [
    ("--output-prefix", "--output-prefix: the tokenizer is a folder: give --output DIR"),
    ("--tokenizer-type", "--tokenizer-type: this trains a byte-level BPE tokenizer.json"),
])
def test_train_tokenizer_names_its_flags_for_preprocess_datas(flag, hint, tmp_path, one_line):
    from hybrid.data.train_tokenizer import build_parser
    line = one_line(lambda: build_parser().parse_args(["--output", str(tmp_path / "tok"), flag, "x"]))
    assert line.startswith(f"train_tokenizer.py: error: unrecognized arguments: {flag}; ") and hint in line, line
    assert os.listdir(tmp_path) == []


# --- 11. a switch given a value ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, switch, word", [
    (["--bf16", "True"], "--bf16", "True"),
    (["--sequence-parallel", "1"], "--sequence-parallel", "1"),
    (["--no-check-for-nan-in-loss-and-grad", "false"], "--no-check-for-nan-in-loss-and-grad", "false"),
])
def test_a_switch_given_a_value_names_the_switch(argv, switch, word, one_line):
    line = one_line(lambda: validate(["--model", "tiny-gpt2"] + argv))
    assert line == (f"train.py: error: argument {switch}: a switch, it takes no value (got {word!r}): give {switch} "
                    f"alone, or leave it out")


def test_a_stray_word_elsewhere_is_still_unrecognized(one_line):
    line = one_line(lambda: validate(["--model", "tiny-gpt2", "--lr", "1e-3", "True"]))
    assert line == "train.py: error: unrecognized arguments: True; see --help"
    line = one_line(lambda: hybrid_main(["layout", "--world", "4", "--tensor-model-parallel-size", "2", "x"]))
    assert line == "hybrid layout: error: unrecognized arguments: x; see --help"


# --- 12. hybrid convert ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, hint", [
    (["--torch_dtype", "bfloat16"], "unrecognized arguments: --torch_dtype; --torch_dtype: give --dtype bf16"),
    (["--dtype", "bfloat16"], "invalid choice: 'bfloat16' (choose from 'fp32', 'bf16', 'fp16'); torch's bfloat16 is "
                              "--dtype bf16 here"),
    (["--dtype", "float16"], "torch's float16 is --dtype fp16 here"),
    (["--ckpt-step", "2"], "--ckpt-step: give --iteration N"),
    (["--safe-serialization"], "--safe-serialization: the weights are always written as safetensors; drop the flag"),
    (["--push-to-hub"], "--push-to-hub: not implemented"),
])
def test_convert_other_tools_flags_name_converts(argv, hint, tmp_path, one_line):
    line = one_line(lambda: hybrid_main(["convert", str(tmp_path / "src"), str(tmp_path / "dst")] + argv))
    assert line.startswith("hybrid convert: error: ") and hint in line and "see --help" not in line, line
    assert os.listdir(tmp_path) == []


# --- 6. hybrid generate's other names ---------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, hint", [
    (["--bf16"], "--bf16: decoding runs in fp32 (the weights, bf16 or not, are read into fp32 parameters)"),
    (["--prompt-file", "p.txt"], "--prompt-file: give the file's text as --prompt \"$(cat FILE)\""),
    (["--eos-token-id", "0"], "--eos-token-id: decoding does not stop at a token: it runs --max-new-tokens tokens"),
    (["--device", "cuda"], "--device: the device is chosen: each rank's GPU (LOCAL_RANK's) where CUDA is present"),
    (["--stream"], "--stream: the tokens are printed when decoding ends"),
])
def test_generate_other_tools_flags_say_what_generate_does(argv, hint, tmp_path, one_line):
    line = one_line(lambda: hybrid_main(["generate", str(tmp_path), "--prompt", "Hi"] + argv))
    assert line.startswith("hybrid generate: error: unrecognized arguments: ") and hint in line, line
    assert "see --help" not in line and "did you mean" not in line


# --- 5. a closed pipe ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_hybrid_layout_into_a_pipe_closed_early_ends_quietly():
    """`hybrid layout --world 4096 | head -1`: the reader leaves, the rest of the lines meet a closed pipe."""
    p = subprocess.run(f"{sys.executable} -m hybrid.cli layout --world 4096 | head -1", shell=True,
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.stdout.startswith("world 4096 = tp 1 x dp 4096 x pp 1") and p.stderr == "", p.stderr
