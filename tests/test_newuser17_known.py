"""Round 17: the ten findings round 16's new-user pass left open, each reproduced (the line it used to give is in the
test's docstring) and now one line naming the flag, key or file and the fix, before any process group or work.

1. --timeline inside an iteration of a checkpoint: the run trained to its end, then the write failed with a
   FileNotFoundError traceback (the iteration folder had been pruned by --save-keep); inside --save, the checkpoint
   folder got the run's other files -- refused, as --metrics-file there.
2. --tensorboard-dir X --save X (or one inside the other): the event files among the checkpoints (and inside an
   iteration, deleted with it) -- refused.
3. A DeepSpeed JSON's misspelt nested key ("stag" in zero_optimization) was a warning ("not supported, ignored") and
   the run trained at ZeRO 0 -- refused with "did you mean", as DeepSpeed's own config model refuses it.
4. hybrid convert's DST in a checkpoint directory (or one iteration of it) was written there; `--out DST` said
   "see --help" -- refused, and --out / --output / --save name the DST word.
5. hybrid convert's verify step (two whole fp32 models, minutes for a 7B one) printed nothing until the end -- a
   line on stderr before it starts.
6. plot_run.py given a checkpoint said "holds no TensorBoard event files" / "line 1 is not JSON" -- names it.
7. preprocess_data.py printed "1 documents, 1 tokens ... 1 worker(s)"; train.py "1 iterations" -- plural fixed.
8. train_tokenizer.py took --json-key where preprocess_data.py (and Megatron) take --json-keys: both now.
9. A flag given twice (--lr 1e-3 ... --lr 1e-4): the last won silently -- still the last (argparse's rule, which
   Megatron-LM inherits), with a one-line warning saying so.
10. Ctrl-C during `python -m hybrid.train`'s first import of torch: a traceback (the package imported torch before
   its __main__) -- one line and 130, as scripts/train.py."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from hybrid.cli import main as hybrid_main
from hybrid.train.main import validate

pytestmark = pytest.mark.usefixtures("one_process")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = ["--model", "tiny-gpt2", "--train-iters", "1"]


def _checkpoint(root, iterations=(2, 4)) -> str:
    """A checkpoint directory's shape (what the checks look at: `latest` and iter_NNNNNNN/), no weights."""
    for i in iterations:
        os.makedirs(root / f"iter_{i:07d}")
    (root / "latest").write_text(f"iter_{iterations[-1]:07d}")
    return str(root)


def _listing(path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), path) for d, ds, fs in os.walk(path) for n in ds + fs)


# --- 1. and 2. the run's other outputs inside the checkpoints ------------------------------------------------------
@pytest.mark.parametrize("flag, where, said", [
    ("--timeline", "ck/iter_0000004/t.json", "is inside iteration 4 of the checkpoint directory"),
    ("--metrics-file", "ck/iter_0000002/m.jsonl", "is inside iteration 2 of the checkpoint directory"),
    ("--tensorboard-dir", "ck/iter_0000002/tb", "is inside iteration 2 of the checkpoint directory"),
    ("--timeline", "ck/t.json", "is inside --save"),
    ("--tensorboard-dir", "ck", "is the same folder as --save"),
    ("--tensorboard-dir", "ck/tb", "is inside --save"),
])
def test_an_output_inside_the_checkpoints_is_refused(flag, where, said, tmp_path, one_line, monkeypatch):
    """Before: --timeline ck/iter_0000004/t.json with --save-keep trained to the end and then raised
    FileNotFoundError (the folder pruned); --tensorboard-dir ck --save ck wrote event files among the checkpoints."""
    ck = _checkpoint(tmp_path / "ck")
    monkeypatch.chdir(tmp_path)
    before = _listing(tmp_path)
    line = one_line(lambda: validate(TRAIN + ["--save", "ck", "--load", "ck", "--save-keep", "1", flag, where]))
    beside = os.path.basename(where) if where != "ck" else "tensorboard"
    assert line.startswith(f"train.py: error: {flag} {where!r} {said}") and line.endswith(f"e.g. {flag} {beside}"), line
    assert ck in line or "--save 'ck'" in line, line
    assert _listing(tmp_path) == before


def test_an_output_inside_another_runs_iteration_is_refused_too(tmp_path, one_line):
    _checkpoint(tmp_path / "old")
    line = one_line(lambda: validate(TRAIN + ["--timeline", str(tmp_path / "old" / "iter_0000002" / "t.json")]))
    assert f"is inside iteration 2 of the checkpoint directory {tmp_path / 'old'}: a later save" in line, line


def test_save_inside_the_tensorboard_dir_is_refused(tmp_path, one_line, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_line(lambda: validate(TRAIN + ["--save", "runs/ck", "--tensorboard-dir", "runs"]))
    assert line == ("train.py: error: --save 'runs/ck' is inside --tensorboard-dir 'runs': TensorBoard reads every "
                    "folder under it, the checkpoint shards included; give them separate folders, e.g. "
                    "--tensorboard-dir runs/tensorboard --save runs/ck")
    assert os.listdir(tmp_path) == []


def test_outputs_beside_the_checkpoints_are_taken(tmp_path, monkeypatch):
    """The fix each line suggests is accepted (the README's layout: checkpoints, metrics and timeline side by side)."""
    _checkpoint(tmp_path / "ck")
    monkeypatch.chdir(tmp_path)
    run = validate(TRAIN + ["--save", "ck2", "--timeline", "t.json", "--metrics-file", "m.jsonl",
                            "--tensorboard-dir", "tensorboard"])[0]
    assert run.metrics.tensorboard_dir == "tensorboard" and run.checkpoint.save == "ck2"


# --- 3. a DeepSpeed JSON's misspelt nested key -----------------------------------------------------------------------
@pytest.mark.parametrize("section, said", [
    ({"zero_optimization": {"stag": 2}}, 'zero_optimization.stag is not a DeepSpeed key; did you mean "stage"?'),
    ({"zero_optimization": {"offload_params": {"device": "cpu"}}},
     'zero_optimization.offload_params is not a DeepSpeed key; did you mean "offload_param"?'),
    ({"zero_optimization": {"offload_optimizer": {"devcie": "cpu"}}},
     'zero_optimization.offload_optimizer.devcie is not a DeepSpeed key; did you mean "device"?'),
    ({"fp16": {"enabeld": True}}, 'fp16.enabeld is not a DeepSpeed key; did you mean "enabled"?'),
    ({"bf16": {"enable": True}}, 'bf16.enable is not a DeepSpeed key; did you mean "enabled"?'),
    ({"zero_optimization": {"stage3_max_live_parameter": 1}},
     'stage3_max_live_parameter is not a DeepSpeed key; did you mean "stage3_max_live_parameters"?'),
    ({"zero_optimization": {"frobnicate": 1}}, 'zero_optimization.frobnicate is not a DeepSpeed key (train.py reads '
                                               '"offload_optimizer", "offload_param", "reduce_bucket_size", "stage"); '
                                               'remove it'),
])
def test_a_misspelt_deepspeed_key_is_refused_with_the_key_meant(section, said, tmp_path, one_line):
    """Before: "train.py: warning: --deepspeed-config keys not supported, ignored: zero_optimization.stag", and the
    run trained at ZeRO 0."""
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 2, **section}))
    line = one_line(lambda: validate(TRAIN + ["--micro-batch-size", "2", "--deepspeed-config", str(ds)]))
    assert line.startswith("train.py: error: --deepspeed-config: ") and line.endswith(said), line


def test_deepspeeds_own_keys_are_still_warned_not_refused(tmp_path):
    from hybrid.zero.ds_config import read_deepspeed_config
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2, "overlap_comm": True, "stage3_max_live_parameters": 1,
                                                    "offload_optimizer": {"device": "cpu", "nvme_path": "/x"}},
                              "fp16": {"enabled": False, "hysteresis": 2}, "bf16": {"immediate_grad_update": True}}))
    s = read_deepspeed_config(str(ds))
    assert s.zero_stage == 2 and s.offload_optimizer and s.unsupported == [
        "zero_optimization.overlap_comm", "zero_optimization.stage3_max_live_parameters",
        "zero_optimization.offload_optimizer.nvme_path", "bf16.immediate_grad_update", "fp16.hysteresis"]


def test_the_key_lists_are_deepspeeds_own():
    """DEEPSPEED_SECTION_KEYS + what train.py reads = the fields (and aliases) of DeepSpeed's pydantic models, which
    forbid any other key: read from the installed DeepSpeed, not copied from the table under test."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (DeepSpeedZeroOffloadOptimizerConfig,
                                                       DeepSpeedZeroOffloadParamConfig)

    from hybrid.zero.ds_config import DEEPSPEED_SECTION_KEYS, SUPPORTED
    for section, model in (("zero_optimization", DeepSpeedZeroConfig), ("fp16", DeepSpeedFP16Config),
                           ("bf16", DeepSpeedBF16Config), ("offload_optimizer", DeepSpeedZeroOffloadOptimizerConfig),
                           ("offload_param", DeepSpeedZeroOffloadParamConfig)):
        assert model.model_config.get("extra") == "forbid", section  # why a key outside them is refused
        theirs = set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}
        assert DEEPSPEED_SECTION_KEYS[section] | SUPPORTED[section] == theirs, section


# --- 4. hybrid convert's DST in a checkpoint ------------------------------------------------------------------------
@pytest.mark.parametrize("dst, said", [
    ("ck/hf", "DST 'ck/hf' is inside the checkpoint directory {ck} (iter_*/, latest): the conversion would be "
              "written among its checkpoints; give a directory of its own, e.g. hf"),
    ("ck/iter_0000002/hf", "DST 'ck/iter_0000002/hf' is inside the checkpoint directory {ck}"),
    ("ck", "DST 'ck' is the checkpoint directory {ck} (iter_*/, latest): the conversion would be written among its "
           "checkpoints; give a directory of its own, e.g. ck_converted"),
])
def test_convert_into_a_checkpoint_is_refused(dst, said, tmp_path, one_line, monkeypatch):
    """Before: `hybrid convert run1 run2/hf` wrote a transformers folder among run2's iter_*/ (and into an iteration
    folder, which a save replaces and --save-keep deletes)."""
    _checkpoint(tmp_path / "src")
    ck = _checkpoint(tmp_path / "ck")
    monkeypatch.chdir(tmp_path)
    before = _listing(tmp_path)
    line = one_line(lambda: hybrid_main(["convert", "src", dst]))
    assert line.startswith("hybrid convert: error: " + said.format(ck=ck)), line
    assert _listing(tmp_path) == before


@pytest.mark.parametrize("flag", ["--out", "--output", "--output-dir", "--save"])
def test_convert_output_flags_of_other_tools_name_the_dst_word(flag, tmp_path, one_line):
    line = one_line(lambda: hybrid_main(["convert", str(tmp_path), flag, str(tmp_path / "o")]))
    assert line == (f"hybrid convert: error: unrecognized arguments: {flag}; {flag}: give the target as DST, the "
                    f"second word (hybrid convert SRC DST)"), line


# --- 5. convert's verify step says what it is doing before it starts ------------------------------------------------
def test_verify_announces_itself_before_loading_the_two_models(capsys, monkeypatch):
    """Every direction verifies through verify_hybrid_against (hybrid -> hf included, since round 17): its line is on
    stderr before the first model loads -- seen from inside that load."""
    import torch

    from hybrid.convert import verify
    from models import load_config
    seen = []

    def load(cfg, it_dir):
        seen.append(capsys.readouterr().err)
        raise RuntimeError("stop here")
    monkeypatch.setattr(verify, "load_ours", load)
    cfg = load_config("tiny-gpt2")
    with pytest.raises(RuntimeError, match="stop here"):
        verify.verify_hybrid_against(cfg, "unused", lambda: None, torch.float32)
    mib = 2 * cfg.num_parameters * 4 / 2**20  # both models' fp32 weights
    assert seen == [f"verify: loading the converted model and transformers' (0.23M parameters each, {mib:.3g} MiB in "
                    "fp32 for both) to compare their logits on a fixed batch of 2 x 32 tokens (--no-verify skips "
                    "this) ...\n"]


def test_every_direction_verifies_through_the_announcing_function():
    """hybrid -> hf had its own copy of the check (load_ours, from_pretrained, verdict) that printed nothing."""
    for name in ("to_hf.py", "to_hybrid.py"):
        source = open(os.path.join(ROOT, "hybrid", "convert", name)).read()
        assert "verify_hybrid_against(" in source and "load_ours(" not in source, name


# --- 6. plot_run.py given a checkpoint -------------------------------------------------------------------------------
@pytest.mark.parametrize("run, what", [
    ("ck", "is a checkpoint directory"),
    ("ck/iter_0000002", "is inside the checkpoint directory {ck}"),
    ("ck/latest", "is inside the checkpoint directory {ck}"),
])
def test_plot_run_given_a_checkpoint_names_it(run, what, tmp_path, one_line, monkeypatch):
    """Before: "ck holds no TensorBoard event files (events.out.tfevents.*); give the run's --tensorboard-dir"."""
    from hybrid.metrics.plot import main as plot_main
    ck = _checkpoint(tmp_path / "ck")
    monkeypatch.chdir(tmp_path)
    line = one_line(lambda: plot_main([run, "--out", "a.png"]))
    assert line == (f"plot_run.py: error: {run} {what.format(ck=ck)} (a run's --save), which holds no curves: give "
                    f"the run's --metrics-file FILE or --tensorboard-dir DIR"), line
    assert not os.path.exists(tmp_path / "a.png")


def test_plot_run_still_reads_a_metrics_file_kept_beside_checkpoints(tmp_path, capsys):
    from hybrid.metrics.plot import main as plot_main
    _checkpoint(tmp_path / "ck")
    (tmp_path / "ck" / "m.jsonl").write_text('{"iteration": 1, "lm_loss": 2.5}\n')
    plot_main([str(tmp_path / "ck" / "m.jsonl"), "--out", str(tmp_path / "a.png")])
    assert "lm loss 2.5000 at iteration 1" in capsys.readouterr().out and (tmp_path / "a.png").is_file()


# --- 7. one document ------------------------------------------------------------------------------------------------
def test_preprocess_counts_one_document_in_the_singular(tmp_path, capsys):
    """Before: "preprocess_data.py: 1 documents, 3 tokens, ... 1 worker(s)) -> ..." and "Processed 1 documents"."""
    from hybrid.data import preprocess
    (tmp_path / "a.jsonl").write_text('{"text": "abc"}\n')
    preprocess.main(["--input", str(tmp_path / "a.jsonl"), "--output-prefix", str(tmp_path / "o"),
                     "--tokenizer-type", "ByteLevel", "--log-interval", "1"])
    out, err = capsys.readouterr()
    assert out.startswith("preprocess_data.py: 1 document, 3 tokens, ") and ", 1 worker) -> " in out, out
    assert err.startswith("Processed 1 document ("), err


def test_the_schedule_line_counts_one_iteration_in_the_singular():
    from hybrid.train.explain import schedule_line
    flags = {"lr": 1e-3, "min_lr": 1e-4, "lr_warmup_iters": 1, "lr_decay_style": "cosine", "train_iters": 1}
    assert schedule_line(flags, 1, 32).startswith("schedule: 1 iteration x 1 sample x 32 tokens | lr: warm-up to "
                                                  "0.001 over 1 iteration, ")


# --- 8. --json-keys in both data tools -------------------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["--json-keys", "--json-key"])
def test_train_tokenizer_takes_preprocess_datas_json_keys(flag, tmp_path):
    """Before: `train_tokenizer.py --json-keys body` (preprocess_data.py's flag, Megatron's) was "unrecognized
    arguments: --json-keys; did you mean --json-key?"."""
    from hybrid.data.train_tokenizer import build_parser, texts
    args = build_parser().parse_args(["--output", str(tmp_path / "t"), flag, "title", "body"])
    (tmp_path / "a.jsonl").write_text('{"title": "T", "body": "B"}\n')
    assert list(texts([str(tmp_path / "a.jsonl")], args.json_keys)) == ["T", "B"]


def test_train_tokenizer_names_the_missing_key_and_the_flag(tmp_path, one_line):
    from hybrid.data.train_tokenizer import main
    (tmp_path / "a.jsonl").write_text('{"body": "B"}\n')
    line = one_line(lambda: main(["--input", str(tmp_path / "a.jsonl"), "--output", str(tmp_path / "t")]))
    assert line.endswith("line 1 has no string 'text' (its keys: body); pass --json-keys with the text's key"), line
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl"]


# --- 9. a flag given twice -------------------------------------------------------------------------------------------
def test_a_flag_given_twice_keeps_the_last_and_says_so(capsys):
    """Megatron-LM parses with argparse, which keeps the last value of a repeated option without a word; train.py
    keeps it too (a command built by appending an override means the last) and warns, once its checks pass."""
    capsys.readouterr()
    run = validate(TRAIN + ["--lr", "1e-3", "--lr", "1e-4", "--bf16", "--bf16", "--seed", "3", "--seed", "3"])[0]
    assert run.optimizer.lr == 1e-4 and "repeated" not in run.flag_values  # not a flag a checkpoint records
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if "given" in ln]
    assert warnings == ["train.py: warning: --lr given twice (--lr 1e-3, then --lr 1e-4): the last is used, as "
                        "argparse (and Megatron-LM) does; drop the other"]  # a switch or an equal value: no repeat


def test_a_bad_input_with_a_repeated_flag_is_still_one_line(one_line):
    line = one_line(lambda: validate(TRAIN + ["--lr", "1e-3", "--lr=1e-4", "--micro-batch-size", "0"]))
    assert "given twice" not in line and "--micro-batch-size" in line, line


def test_other_commands_warn_at_parse_time(capsys):
    from hybrid.cliutil import OneLineParser
    p = OneLineParser(prog="tool")
    p.add_argument("--keys", nargs="+")
    p.add_argument("--lr", type=float)
    assert p.parse_args(["--keys", "a", "b", "--lr", "-1e-4", "--keys", "c", "--lr", "-inf", "--lr", "2"]).keys == ["c"]
    assert capsys.readouterr().err.splitlines() == [
        "tool: warning: --keys given twice (--keys a b, then --keys c): the last is used, as argparse (and "
        "Megatron-LM) does; drop the other",
        "tool: warning: --lr given 3 times (--lr -1e-4, --lr -inf, then --lr 2): the last is used, as argparse (and "
        "Megatron-LM) does; drop the others"]


# --- 10. Ctrl-C during `python -m hybrid.train`'s first import of torch ----------------------------------------------
def test_the_train_package_imports_nothing_heavy_before_its_main():
    """`python -m hybrid.train` imports hybrid/train/__init__.py first, outside any handler: it imports nothing at its
    top (its names load on first use; `sys` and `types` for its module class, the standard library and already
    loaded), and __main__ imports hybrid.cliutil only before its handler."""
    for name, allowed in (("__init__.py", {"sys", "types"}), ("__main__.py", {"hybrid.cliutil"})):
        tree = ast.parse(open(os.path.join(ROOT, "hybrid", "train", name)).read())
        top = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names} | \
              {n.module for n in tree.body if isinstance(n, ast.ImportFrom)}
        assert top - {"__future__"} <= allowed, (name, top)


def test_the_train_packages_names_load_on_first_use(monkeypatch):
    """scripts/train.py's `from hybrid.train import ..., main` gets the function, as the eager imports gave it (the
    names are dropped first: this process imported them already)."""
    import hybrid.train
    from hybrid.train.config import RunConfig
    from hybrid.train.main import main
    for name in hybrid.train.__all__:
        monkeypatch.delattr(hybrid.train, name, raising=False)
    from hybrid.train import main as got
    assert got is main and hybrid.train.RunConfig is RunConfig
    with pytest.raises(AttributeError):
        hybrid.train.no_such_name  # noqa: B018


_CTRL_C_IN_PYTHON_M = """
import os, runpy, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's Ctrl-C (the xdist worker ignores SIGINT)
class CtrlC:
    def find_spec(self, name, path, target=None):
        if name == "torch":
            os.kill(os.getpid(), signal.SIGINT)
sys.meta_path.insert(0, CtrlC())
sys.argv = ["hybrid.train", "--model", "tiny-gpt2", "--save", sys.argv[1]]
runpy.run_module("hybrid.train", run_name="__main__", alter_sys=True)  # what `python -m hybrid.train` runs
"""


@pytest.mark.slow
def test_ctrl_c_during_python_m_hybrid_trains_first_import_of_torch_is_one_line_and_130(tmp_path):
    """Before: Python's traceback through hybrid/train/__init__.py's import of torch, status 1."""
    p = subprocess.run([sys.executable, "-c", _CTRL_C_IN_PYTHON_M, str(tmp_path / "ckpt")], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT), cwd=tmp_path)
    assert p.returncode == 130, p.stderr
    assert p.stderr == "train.py: interrupted while starting, before any work: nothing was run or written\n"
    assert p.stdout == "" and os.listdir(tmp_path) == []


def test_the_train_packages_main_is_the_function_after_the_submodule_is_imported(monkeypatch):
    """The forkserver's PRELOAD imports `hybrid.train.main` (the submodule) before anything asks for the package's
    names; the import system then binds the submodule as `hybrid.train.main`, and a lazy package left
    `from hybrid.train import main` the module (scripts/train.py's import) -- found at the merge of round 17."""
    import importlib
    import types

    import hybrid.train
    for name in hybrid.train.__all__:
        monkeypatch.delattr(hybrid.train, name, raising=False)
    monkeypatch.delitem(sys.modules, "hybrid.train.main")
    importlib.import_module("hybrid.train.main")  # binds the submodule on the package, as a first import does
    from hybrid.train import main as got
    assert not isinstance(got, types.ModuleType) and got is sys.modules["hybrid.train.main"].main


def test_hybrid_plan_and_the_hybrid_command_warn_after_they_ran_and_an_error_stays_one_line(capsys):
    """`hybrid plan` (and every `hybrid` sub-command) warns about a repeated flag once it has run, not at parse time:
    an error after parsing -- the plan's checks -- is then one line (test_planner_fused_ce's refusal had two)."""
    from hybrid.cli import main as hybrid_main
    from hybrid.planner.cli import main as plan_main
    flags = ["--model", "gpt2", "--gpus", "8", "--global-batch-size", "16", "--top", "1"]
    capsys.readouterr()
    assert plan_main(flags + ["--fp8", "--gpu", "h100-80g", "--gpu", "a100-80g"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--fp8" in err[0], err
    assert plan_main(flags + ["--top", "2"]) == 0
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("hybrid plan: warning: --top given twice")
    hybrid_main(["layout", "--world", "4", "--tensor-model-parallel-size", "2", "--tensor-model-parallel-size", "4"])
    assert capsys.readouterr().err.strip().startswith("hybrid layout: warning: --tensor-model-parallel-size given")
