"""Round 20's new-user pass over the planner guide, `hybrid calibrate` and train.py's DeepSpeed JSON, with bad and
edge inputs. Most were one line naming the flag and the fix already. These were not:

1. A JSON file cut short (a copy or download interrupted) -- `--model DIR` (config.json), `--hardware`,
   `--deepspeed-config` -- said "not valid JSON (Expecting ',' delimiter at line 10)", which does not say the file
   is incomplete; a string cut at its line end read "Invalid control character at at line 1" (the parser's message
   ends in "at"); an empty file "Expecting value at line 1". Now: the file is empty / ends before the JSON does /
   a string is never closed, with line and column (cliutil.json_problem, one function for the three).
2. `hybrid plan --plot FILE` over an existing file that is not an image of FILE's format (a mistyped name hitting
   notes.svg, a CSV saved as results.png) replaced it after the search; now one line before it, as `hybrid
   calibrate --out` refuses a file that is not a profile. A plot of that format is still replaced (re-plotting).
3. A transformers config.json of a task head on a decoder (LlamaForSequenceClassification) was planned as the
   causal LM of its sizes, a vocabulary-wide head included; now refused by its class, with the fix.
4. `--load` (train.py; SRC of generate / convert) of a backbone saved alone (LlamaModel) said "the checkpoint does
   not match --model"; now that the LM head is missing, and the class it was saved as.
5. `hybrid calibrate --ranks 1 --base h200` (README: one GPU) on a machine without CUDA timed the CPU and kept the
   H200's node: refused before any rank (an explicit --backend gloo still mixes them, as gpu_check --dry-run does).
6. `hybrid plan --context-parallel-size 3` on 64 GPUs searched, then gave the general rule; now the size, first.
7. A CPU profile from an older `hybrid calibrate` (no executor / optimizer CPU costs, or none at all: priced 0, up
   to a 2.9x faster step) planned with nothing said; now a warning line naming the fields and the rerun.
8. train.py --zero-stage 1-3 on one rank ran while its start-up lines called the layout one that "cannot run"
   (the planner's Layout refuses ZeRO at dp 1): priced as ZeRO 0 now, and said so.
9. --sequence-parallel with a --seq-length the TP size does not divide: the lengths that split, offered.
10. `hybrid calibrate` on a CPU printed DeepSpeed's "If you have GPU ..., we were unable to detect it" warning.
"""

from __future__ import annotations

import os

import pytest

from hybrid.planner import cli as plan_cli

TINY = ["--model", "tiny-gpt2", "--gpus", "4", "--global-batch-size", "16", "--seq-length", "128"]

# (file text, what the message must say): the three ways a JSON file is cut short, and a mid-file error
JSON_CASES = [
    ('{"model_type": "llama",\n "hidden_size": 64,', "the file ends at line 2 column 20 before the JSON does: cut "
                                                     "short? write the whole file"),
    ('{"model_type": "llama", "name": "ab\n', "the file ends at line 1 column 36 before the JSON does: cut short? "
                                             "write the whole file"),  # was "Invalid control character at at"
    ('{"model_type": "llama",\n "num_hid', "the string at line 2 column 2 is never closed, the file ends inside it: "
                                          "cut short? write the whole file"),
    ("  \n", "the file is empty"),
    ('{"model_type": "llama" "hidden_size": 64}', "Expecting ',' delimiter at line 1 column 24"),
    ('{"name": "a\tb"}', "Invalid control character at line 1 column 12"),
]


def _plan_error(argv: list[str], capsys) -> str:
    assert plan_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


@pytest.mark.parametrize("text, says", JSON_CASES)
def test_a_json_file_cut_short_is_named_so_for_every_json_input(text, says, tmp_path, capsys):
    """--model DIR's config.json, --hardware and --deepspeed-config: one wording, the position, never "at at"."""
    from hybrid.zero.ds_config import read_deepspeed_config
    (tmp_path / "config.json").write_text(text)
    (tmp_path / "hw.json").write_text(text)
    lines = [_plan_error(["--model", str(tmp_path), "--gpus", "8", "--global-batch-size", "8"], capsys),
             _plan_error(TINY + ["--hardware", str(tmp_path / "hw.json")], capsys)]
    with pytest.raises(ValueError) as e:
        read_deepspeed_config(str(tmp_path / "hw.json"))
    lines.append(str(e.value))
    for line, name in zip(lines, (f"--model {tmp_path}/config.json", f"--hardware {tmp_path}/hw.json",
                                  f"--deepspeed-config {tmp_path}/hw.json")):
        assert f"{name}: not valid JSON ({says})" in line and " at at " not in line, line


@pytest.mark.parametrize("name, text", [("results.png", b"step,loss\n1,5.2\n"), ("notes.svg", b"# my notes\n"),
                                        ("paper.pdf", b"\x89PNG\r\n\x1a\n")])
def test_plot_over_a_file_that_is_not_its_image_is_refused_before_the_search(name, text, tmp_path, capsys,
                                                                           monkeypatch):
    path = tmp_path / name
    path.write_bytes(text)
    monkeypatch.setattr(plan_cli, "search", lambda *a, **k: pytest.fail("searched before refusing --plot"))
    line = _plan_error(TINY + ["--plot", str(path)], capsys)
    assert line == (f"hybrid plan: error: --plot {str(path)!r} exists and is not a {os.path.splitext(name)[1]} "
                    f"image, which the plot would replace; give a new file name, or remove the file first")
    assert path.read_bytes() == text and os.listdir(tmp_path) == [name]


def test_plot_over_its_own_earlier_plot_replaces_it(tmp_path, capsys):
    """Re-plotting is meant to replace: the check refuses only what is not an image of the format."""
    path = tmp_path / "plan.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 16)  # an earlier plot (its signature; the rest is not read)
    assert plan_cli.main(TINY + ["--plot", str(path)]) == 0
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000 and os.listdir(tmp_path) == ["plan.png"]


LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 128}


def test_a_config_of_a_task_head_is_refused_where_a_causal_lm_is_planned_and_trained(tmp_path, capsys):
    """3. A LlamaForSequenceClassification config.json was planned as a causal LM with a vocabulary-wide head it
    does not have (and train.py --load failed later on its missing lm_head.weight): one line naming the class and
    the fix. A bare backbone (LlamaModel) or no `architectures` still plans: those sizes as a causal LM."""
    import json

    from models.config import load_config
    argv = ["--model", str(tmp_path), "--gpus", "2", "--global-batch-size", "4", "--seq-length", "64"]
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "architectures": ["LlamaForSequenceClassification"]}))
    assert _plan_error(argv, capsys) == (
        f"hybrid plan: error: --model {tmp_path}/config.json: architectures [\"LlamaForSequenceClassification\"] is a "
        f"task head, not a causal language model, which hybrid trains and plans; use a LlamaForCausalLM checkpoint "
        f"(for these sizes as a causal LM trained from scratch, write \"architectures\": [\"LlamaForCausalLM\"] in a "
        f"copy of config.json)")
    for names in (["LlamaModel"], ["LlamaForCausalLM"], None):
        (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "architectures": names}))
        assert load_config(str(tmp_path)).num_layers == 2


def test_a_backbone_saved_without_its_lm_head_is_named_so_before_any_process_group(tmp_path):
    """4. `--load DIR` of a LlamaModel (the backbone alone) said "the checkpoint does not match --model", which it
    does; now it says the LM head is missing and which class the folder was saved as (train.py, generate and
    convert share models.hf_io.check_checkpoint, on the meta device)."""
    from transformers import LlamaConfig, LlamaModel

    from models.config import load_config
    from models.hf_io import check_checkpoint
    LlamaModel(LlamaConfig(**{k: v for k, v in LLAMA.items() if k != "model_type"})).save_pretrained(tmp_path)
    with pytest.raises(ValueError) as e:
        check_checkpoint(load_config(str(tmp_path)), tmp_path)
    assert str(e.value) == (f"--load {tmp_path}: checkpoint has no tensor 'lm_head.weight': the model was saved "
                            f"without its language-model head (as LlamaModel); load a causal LM's checkpoint "
                            f"(...ForCausalLM)")


def test_calibrate_a_gpu_preset_on_a_machine_without_one_is_one_line_before_any_rank(tmp_path, one_line,
                                                                                   monkeypatch):
    """5. README's `hybrid calibrate --ranks 1 --base h200` (for one GPU) on a CPU machine measured the CPU over gloo
    for a minute and wrote a profile of neither: the CPU's compute with the H200's NVLink node, which then planned
    CPU ranks talking at 450 GB/s. Refused now, unless --backend gloo is given (gpu_check.py's --dry-run does)."""
    import torch

    from hybrid.cli import main
    from hybrid.planner import calibrate
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(calibrate, "calibrate", lambda cfg: pytest.fail("measured before the --base check"))
    out = tmp_path / "h200.json"
    line = one_line(lambda: main(["calibrate", "--ranks", "1", "--base", "h200", "--out", str(out)]))
    assert line == ("hybrid calibrate: error: --base h200 is a GPU preset, but this machine has no CUDA device: "
                    "calibrate would time this CPU over gloo and keep the h200's node links, a profile of neither; "
                    "run it on the h200 machine, or drop --base to profile this CPU (--backend gloo to mix them "
                    "anyway)"), line
    assert not out.exists()


def test_a_cp_size_that_does_not_divide_the_gpus_is_named_before_the_search(capsys, monkeypatch):
    """6. `--context-parallel-size 3` on 64 GPUs searched, then said "no layout fits at --context-parallel-size 3 (a
    size must divide --gpus and half the --seq-length; ...)": now the size and the sizes that divide, first."""
    from hybrid.planner import context
    monkeypatch.setattr(context, "search_cp", lambda *a, **k: pytest.fail("searched before the size check"))
    line = _plan_error(["--model", "llama-3-8b", "--gpus", "64", "--gpu", "h100-80g", "--global-batch-size", "16",
                        "--seq-length", "131072", "--activation-profile", "bf16-flash",
                        "--context-parallel-size", "2,3"], capsys)
    assert line == ("hybrid plan: error: --context-parallel-size 2,3: 3 does not divide --gpus 64 (the GPUs split "
                    "into CP groups of that size); give sizes that divide it, e.g. 2, 4, 8, 16, 32, 64")


def test_a_cpu_profile_from_an_older_calibrate_is_said_so_and_still_plans(tmp_path, capsys):
    """7. A gloo profile written before `hybrid calibrate` measured the executor's and the optimizer's CPU costs
    (round 14; the repository keeps round 12's) has the same format version, and those costs were priced 0 with
    nothing said (tiny-gpt2 on 4 ranks: 3 % faster; without every CPU cost, 2.9x faster and another best layout).
    Now one warning line naming the fields and the rerun; the plan is still made (kept profiles are records)."""
    import json
    root = os.path.join(os.path.dirname(__file__), "..", "docs", "results", "data")
    with open(os.path.join(root, "mainjob_r19_run1.hw8.json")) as f:
        prof = json.load(f)
    from hybrid.planner.calibrate import EDGE_FIXED_FIELDS
    for k in (f for pair in EDGE_FIXED_FIELDS.values() for f in pair):  # round 25's CPU costs (calib25), which
        prof["hardware"][k] = 0.0  # round 19's profile predates
    full, old = tmp_path / "full.json", tmp_path / "old.json"
    full.write_text(json.dumps(prof))
    for k in ("executor_forward_cpu_s", "optimizer_step_cpu_s"):
        del prof["hardware"][k]
    old.write_text(json.dumps(prof))
    argv = ["--model", "tiny-gpt2", "--gpus", "4", "--global-batch-size", "16", "--seq-length", "128", "--top", "1"]
    assert plan_cli.main(argv + ["--hardware", str(full)]) == 0 and capsys.readouterr().err == ""
    assert plan_cli.main(argv + ["--hardware", str(old)]) == 0
    captured = capsys.readouterr()
    assert captured.err == (f"hybrid plan: warning: --hardware {old} was written by an older hybrid calibrate: it "
                            f"lacks executor_forward_cpu_s, optimizer_step_cpu_s, priced 0 (the step comes out faster "
                            f"than this machine runs it); re-run `hybrid calibrate --out {old}` for this hybrid's CPU "
                            f"costs\n") and " tp" in captured.out


def test_zero_at_one_rank_is_priced_as_zero_0_not_called_a_layout_that_cannot_run(tmp_path):
    """8. `python scripts/train.py --zero-stage 3` (one rank) ran, while its start-up lines said "planner: no
    prediction for this layout ...: layout tp1 pp1 dp1 ... z3 cannot run: ZeRO 3 with dp 1 partitions nothing".
    Each shard is the whole at dp 1: priced as ZeRO 0 now, and both planner lines say so."""
    import torch

    from hybrid.metrics.split import predicted_split_line
    from hybrid.train import explain
    from hybrid.train.args import configure, parse_args
    prof = os.path.join(os.path.dirname(__file__), "..", "docs", "results", "data", "mainjob_r19_run1.hw8.json")
    run, _ = configure(parse_args(["--model", "tiny-gpt2", "--global-batch-size", "4", "--seq-length", "32",
                                   "--zero-stage", "3", "--hardware", prof]), world=1)
    line = explain.prediction_line(explain.predict(run, torch.device("cpu"), 0.0))
    assert line.startswith("planner: this layout on mainjob_r19_run1.hw8.json: ") and line.endswith(
        " (ZeRO 3 at dp 1 partitions nothing: priced as ZeRO 0) -- compare with the iteration lines"), line
    split = predicted_split_line(run, run.model.arch, run.parallel.dims, run.training.batch, run.parallel.pipeline)
    assert split.startswith("planner: predicted ") and split.endswith(
        "; ZeRO 3 at dp 1 partitions nothing: priced as ZeRO 0"), split


def test_sequence_parallel_on_an_odd_sequence_names_the_lengths_that_split():
    """9. --sequence-parallel with a --seq-length TP does not divide said what was wrong but not what to give."""
    from hybrid.train.args import configure, parse_args
    with pytest.raises(ValueError) as e:
        configure(parse_args(["--model", "tiny-gpt2", "--sequence-parallel", "--tensor-model-parallel-size", "2",
                              "--global-batch-size", "8", "--seq-length", "255"]), world=2)
    assert str(e.value) == ("--sequence-parallel needs --seq-length (255) divisible by --tensor-model-parallel-size "
                            "(2); give --seq-length 254 or 256")  # tiny-gpt2 has 256 positions: 256 is offered


def test_calibrate_on_a_cpu_keeps_deepspeeds_gpu_warning_out_of_its_report(tmp_path, monkeypatch):
    """10. `hybrid calibrate` on this CPU printed DeepSpeed's "[WARNING] ... Setting accelerator to CPU. If you have
    GPU or other accelerator, we were unable to detect it." among its results (the ranks' CPU Adam preload imports
    deepspeed). The ranks now start with DS_ACCELERATOR=cpu, DeepSpeed's own choice there; this process's
    environment is left as it was."""
    import torch

    from hybrid.cli import main
    from hybrid.planner import calibrate
    seen = []

    def measured(cfg):
        seen.append(os.environ.get("DS_ACCELERATOR"))
        raise RuntimeError("stop here")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    # the forkserver the ranks fork from (and import deepspeed in) starts here, before the measuring
    monkeypatch.setattr(calibrate, "ranks_leave_ctrl_c_to_this_process",
                        lambda: seen.append(os.environ.get("DS_ACCELERATOR")))
    monkeypatch.setattr(calibrate, "calibrate", measured)
    with pytest.raises(RuntimeError, match="stop here"):
        main(["calibrate", "--ranks", "1", "--out", str(tmp_path / "cpu.json")])
    assert seen == ["cpu", "cpu"] and "DS_ACCELERATOR" not in os.environ
