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
                    f"mean {meant!r}? (transformers ignores {typo!r}, and the model would get {meant}'s default, "
                    f"{default})")


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


# --- 5. a closed pipe ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_hybrid_layout_into_a_pipe_closed_early_ends_quietly():
    """`hybrid layout --world 4096 | head -1`: the reader leaves, the rest of the lines meet a closed pipe."""
    p = subprocess.run(f"{sys.executable} -m hybrid.cli layout --world 4096 | head -1", shell=True,
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.stdout.startswith("world 4096 = tp 1 x dp 4096 x pp 1") and p.stderr == "", p.stderr
