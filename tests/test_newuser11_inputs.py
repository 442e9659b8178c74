"""Eleventh-round new-user findings: README.md and each doc page's first command as written, the `hybrid` commands
rounds 8-10 did not walk (layout, models, checkpoint, calibrate, plan --hardware / --explain / --json), the
DeepSpeed JSON and Megatron-LM flags users carry over, the scripts run by hand, and the launcher's environment
(rounds 8-10: tests/test_newuser{8,9,10}_inputs.py, not redone here).

In this process, one rank, no process group (the shared harness: hybrid/testing_inputs.py, conftest's `one_line`)."""

from __future__ import annotations

import pytest

from hybrid.train.main import validate

pytestmark = pytest.mark.usefixtures("one_process")  # tests/conftest.py: python, not torchrun: world 1


def _world(monkeypatch, n: int, rank: int = 0) -> None:
    """torchrun's environment for rank `rank` of `n` on one node: validate then checks the layout of an n-rank job."""
    for name, value in (("WORLD_SIZE", str(n)), ("RANK", str(rank)), ("LOCAL_RANK", str(rank)),
                        ("LOCAL_WORLD_SIZE", str(n)), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)


# --- 1. the default watchdog beside a short --distributed-timeout-minutes: it could never fire -----------------------
def _timeout_warning(minutes: str, seconds: str, half: str) -> str:
    return (f"train.py: warning: --distributed-timeout-minutes {minutes} ({seconds} s) is not above the default "
            f"--watchdog-timeout 300 s: a hung collective times out first and the hang verdict never prints; give a "
            f"--watchdog-timeout below {seconds} (e.g. {half}), or --watchdog-timeout 0 to turn the watchdog off")


@pytest.mark.parametrize("minutes, seconds, half", [("1", "60", "30"), ("5", "300", "150"), ("0.2", "12", "6")])
def test_default_watchdog_beside_a_short_collective_timeout_warns_once_on_rank0(minutes, seconds, half, capsys,
                                                                                  monkeypatch):
    """Round 10 refused a --watchdog-timeout given at or above the collectives' timeout and left the default 300 s
    beside `--distributed-timeout-minutes 1` alone: the collective timed out at 60 s, with gloo's or NCCL's message,
    and the verdict docs/operations.md teaches to read never printed -- without a word. Now one warning naming both
    flags and the fix; the run is not refused (the watchdog was not asked for) and the watchdog is not lowered."""
    _world(monkeypatch, 2)
    run = validate(["--distributed-timeout-minutes", minutes])[0]
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert lines == [_timeout_warning(minutes, seconds, half)], lines
    assert run.fault.watchdog_timeout == 300.0 and run.parallel.timeout_minutes == float(minutes)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    validate(["--distributed-timeout-minutes", minutes])
    assert capsys.readouterr().err == ""  # rank 0's alone


@pytest.mark.parametrize("argv", [["--distributed-timeout-minutes", "5.01"],  # 300.6 s: above the watchdog
                                  ["--distributed-timeout-minutes", "1", "--watchdog-timeout", "30"],  # nested
                                  ["--distributed-timeout-minutes", "1", "--watchdog-timeout", "0"],  # off
                                  []])  # the defaults: 300 s < 10 minutes
def test_nested_or_disabled_watchdog_or_the_defaults_print_no_warning(argv, capsys, monkeypatch):
    _world(monkeypatch, 2)
    assert validate(argv)[0].warnings == ()
    assert capsys.readouterr().err == ""


def test_one_rank_runs_no_watchdog_so_a_short_timeout_warns_nothing(capsys):
    """hybrid/fault/session.py starts the watchdog at world > 1 only."""
    assert validate(["--distributed-timeout-minutes", "1"])[0].warnings == ()
    assert capsys.readouterr().err == ""


# --- 2. hybrid checkpoint inspect of another tool's folder: it passed for an unfinished save of ours ----------------
def _inspect(path) -> list[str]:
    from hybrid.cli import main
    return lambda: main(["checkpoint", "inspect", str(path)])


def test_inspect_of_a_megatron_folder_or_its_iter_dir_names_it(tmp_path, one_line):
    """Megatron-LM's iter_0000002/ was listed as "incomplete (no manifest.json: a save that did not finish; removed
    by the next save)": wrong, and it told the user a save would delete it. Now one line naming the tool and the
    way in (store.MEGATRON_EXPORT, as train.py --load says)."""
    from hybrid.checkpoint import store
    (tmp_path / "iter_0000002" / "mp_rank_00").mkdir(parents=True)
    (tmp_path / "iter_0000002" / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"megatron")
    (tmp_path / store.MEGATRON_TRACKER).write_text("2")
    for path in (tmp_path, tmp_path / "iter_0000002"):
        line = one_line(_inspect(path))
        assert line == (f"hybrid checkpoint inspect: error: {str(tmp_path)!r} is a Megatron-LM checkpoint "
                        f"(latest_checkpointed_iteration.txt), not a hybrid --save directory; {store.MEGATRON_EXPORT}, "
                        f"then give that folder to --load"), line
        assert one_line.out == ""


def test_inspect_of_a_deepspeed_or_transformers_folder_names_it_and_the_way_in(tmp_path, one_line):
    """A DeepSpeed folder printed "DIR: latest -> none" and exited 1 with nothing else; a transformers folder "holds
    no checkpoint", not that train.py reads it as it is."""
    ds, hf = tmp_path / "ds", tmp_path / "hf"
    (ds / "global_step10").mkdir(parents=True)
    (ds / "latest").write_text("global_step10")
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    line = one_line(_inspect(ds))
    assert line == (f"hybrid checkpoint inspect: error: {str(ds)!r} is a DeepSpeed checkpoint (latest + "
                    f"global_step*/), not a hybrid --save directory; convert it first: hybrid convert {ds} CKPT "
                    f"--model CONFIG, then --load CKPT (docs/convert.md)"), line
    line = one_line(_inspect(hf))
    assert line.endswith(f"is a transformers model folder (config.json), not a hybrid --save directory: train.py "
                         f"reads it as it is (--model {hf} --load {hf}), nothing to inspect"), line
    assert one_line.out == ""


def test_inspect_help_shows_its_continued_example_on_two_lines(capsys):
    """The docstring's line continuation was a Python escape: --help printed one line with a run of spaces."""
    from hybrid.cli import main
    with pytest.raises(SystemExit):
        main(["checkpoint", "--help"])
    out = capsys.readouterr().out
    assert "--pipeline-model-parallel-size 2 \\\n        --world-size 16" in out, out


# --- 3. hybrid calibrate --out an existing file that is not a profile: replaced after the minute of measuring -------
def test_calibrate_out_over_a_file_that_is_not_a_profile_is_one_line_before_any_work(tmp_path, one_line,
                                                                                      monkeypatch):
    """`hybrid calibrate --out train.py` (or a results JSON) measured for a minute, then replaced the file. Now one
    line before anything is spawned; the file is unchanged."""
    from hybrid.cli import main
    from hybrid.planner import calibrate
    monkeypatch.setattr(calibrate, "calibrate", lambda cfg: pytest.fail("measured before the --out check"))
    for name, text in (("notes.txt", "my notes\n"), ("results.json", '{"tokens_per_s": 3}\n'), ("bin", "\udcff")):
        path = tmp_path / name
        path.write_text(text, errors="surrogateescape")
        line = one_line(lambda: main(["calibrate", "--out", str(path)]))
        assert line == (f"hybrid calibrate: error: --out {str(path)!r} exists and is not a hardware profile "
                        f"(hybrid-hardware-profile/1), which it would replace; give a new file name, or remove the "
                        f"file first"), line
        assert path.read_text(errors="surrogateescape") == text


@pytest.mark.parametrize("fmt", ["hybrid-hardware-profile/1", "hybrid-hardware-profile/0"])
def test_calibrate_out_over_a_profile_of_any_version_is_taken(tmp_path, fmt):
    """Re-calibrating replaces the profile, as the message for an old one (below) tells the user to do."""
    from hybrid.planner.calibrate import check_replaces_a_profile
    (tmp_path / "hw.json").write_text('{"format": "%s", "hardware": {}}' % fmt)
    check_replaces_a_profile(str(tmp_path / "hw.json"))
    check_replaces_a_profile(str(tmp_path / "new.json"))  # absent: nothing to replace


def test_plan_hardware_of_an_older_profile_format_names_the_version_and_the_rerun(tmp_path):
    """It said "not a hybrid-hardware-profile/1 file (write one with ...)" of a profile an older hybrid wrote."""
    from hybrid.planner.calibrate import load_hardware
    path = tmp_path / "old.json"
    path.write_text('{"format": "hybrid-hardware-profile/0", "hardware": {}}')
    with pytest.raises(ValueError) as e:
        load_hardware(str(path))
    assert str(e.value) == (f"--hardware {path}: a profile of format 'hybrid-hardware-profile/0', this hybrid reads "
                            f"hybrid-hardware-profile/1; re-run `hybrid calibrate --out {path}` on that machine")


# --- 4. the HF Trainer's DeepSpeed templates: "auto" everywhere, refused one key at a time ---------------------------
HF_ZERO2 = {  # transformers' docs, "DeepSpeed" / ZeRO-2 example (every "auto" is the Trainer's argument)
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "overlap_comm": True, "reduce_bucket_size": "auto", "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False}


def _ds(tmp_path, cfg) -> str:
    import json
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_hf_zero2_template_takes_every_auto_from_the_flags(tmp_path, capsys):
    """It stopped at the first "auto" ("train_micro_batch_size_per_gpu must be an integer, got "auto""), then the
    next; the HF Trainer fills them from its arguments, and train.py's flags are those. Now each "auto" is the flag's
    value (given or its default), the file's numbers still apply (stage 2, offload), and nothing else changes."""
    flags = ["--bf16", "--lr", "3e-4", "--micro-batch-size", "2", "--global-batch-size", "8", "--clip-grad", "0.5"]
    run = validate(["--deepspeed-config", _ds(tmp_path, HF_ZERO2), *flags])[0]
    plain = validate([*flags, "--zero-stage", "2", "--offload-optimizer"])[0]
    assert (run.zero.stage, run.zero.offload_optimizer, run.zero.precision.value) == (2, True, "bf16")
    assert run.optimizer == plain.optimizer and run.training.batch == plain.training.batch
    assert run.zero.bucket_bytes == plain.zero.bucket_bytes  # reduce_bucket_size "auto": --zero-bucket-bytes' default
    assert "fp16.hysteresis" in run.ds_unsupported and "steps_per_print" in run.ds_unsupported


def test_auto_beside_the_flags_defaults_is_the_default(tmp_path):
    run = validate(["--deepspeed-config", _ds(tmp_path, HF_ZERO2)])[0]
    plain = validate(["--zero-stage", "2", "--offload-optimizer"])[0]
    assert run.zero.precision.value == "fp32" and run.optimizer == plain.optimizer
    assert run.training.batch == plain.training.batch


@pytest.mark.parametrize("cfg, want", [
    ({"train_micro_batch_size_per_gpu": "4"}, 'train_micro_batch_size_per_gpu must be an integer, got "4"; write the '
                                              'number (or "auto": the flag\'s value)'),
    ({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                   "warmup_num_steps": "auto"}}},
     'scheduler WarmupLR with "auto" params is the HF Trainer\'s template (it fills them from its arguments); remove '
     'the scheduler section and set the schedule with --lr, --lr-warmup-iters, --lr-decay-style, --lr-decay-iters, '
     '--min-lr'),
    ({"optimizer": {"type": "Lion"}}, 'optimizer.type "Lion" is not one train.py runs (Adam, AdamW, OneBitAdam); '
                                      'remove the optimizer section'),  # was "use remove the ..."
])
def test_a_string_number_or_an_auto_scheduler_stays_one_line(cfg, want, tmp_path, one_line):
    """A scheduler's "auto" would have been read as DeepSpeed's default 1000 warm-up steps in the nearest-flags
    advice: refused by name instead."""
    line = one_line(lambda: validate(["--deepspeed-config", _ds(tmp_path, cfg)]))
    assert line.startswith(f"train.py: error: --deepspeed-config: {want}"), line


# --- 5. Megatron-LM example scripts' flags with nothing to set here: "see --help" gave no way on -------------------
@pytest.mark.parametrize("argv, hint", [
    (["--overlap-grad-reduce"], "gradient reductions always overlap backward"),
    (["--no-gradient-accumulation-fusion"], "there is no fused gradient-accumulation kernel"),
    (["--log-throughput"], "tokens/s and TFLOP/s/device are on every log line"),
    (["--use-rotary-position-embeddings"], "model_type llama for rotary embeddings"),
    (["--no-position-embedding"], "model_type llama for rotary embeddings"),
    (["--timing-log-level", "2"], "print every --timing-log-interval log intervals"),
    (["--log-timers-to-tensorboard"], "print every --timing-log-interval log intervals"),
    (["--log-params-norm"], "not implemented"),
    (["--adam-eps", "1e-8"], "Adam's eps is 1e-8"),
    (["--ckpt-format", "torch_dist"], "checkpoints have one format"),
])
def test_megatron_flags_with_nothing_to_set_name_what_to_do(argv, hint, one_line):
    line = one_line(lambda: validate(argv))
    assert line.startswith(f"train.py: error: unrecognized arguments: {argv[0]}; {argv[0]}: "), line
    assert hint in line, line
    assert line.endswith("drop the flag") or "not implemented" in line or "rotary" in line, line


def test_adam_eps_hint_is_the_eps_the_optimizer_runs():
    from hybrid.train_step import OptimizerConfig
    assert OptimizerConfig().eps == 1e-8


def test_eval_interval_0_names_the_two_ways_to_get_megatrons_meaning(one_line):
    """Megatron-LM's --eval-interval 0 skips the periodic validation; "must be >= 1, got 0" gave no way on."""
    line = one_line(lambda: validate(["--eval-interval", "0"]))
    assert line == ("train.py: error: --eval-interval must be >= 1, got 0 (Megatron-LM's 0 skips the periodic "
                    "validation: here drop --eval-interval and give --eval-iters 0 for none at all, or an "
                    "--eval-interval above --train-iters for the end-of-run one alone)"), line
    assert validate(["--eval-iters", "0"])[0].data.eval_iters == 0


# --- 6. eight scripts answered a mistyped flag with argparse's usage block ------------------------------------
def test_every_script_parses_with_the_one_line_parser():
    """bench_calibrate_repeat, bench_compile, bench_cp, bench_planner_mainjob, bench_startup, gpu_check,
    plot_comm_efficient and reference_losses built a plain
    ArgumentParser: `--nosuch` printed the usage block, and an abbreviation (`--rep 3`) was taken as a flag's prefix.
    Each script's parser is now hybrid.cliutil.OneLineParser (one line, the closest flag; allow_abbrev off), as the
    others'. A text check: each script builds its parser inside main(), run only as a command."""
    import glob
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    plain = [os.path.basename(p) for p in sorted(glob.glob(os.path.join(root, "scripts", "*.py")))
             if "argparse.ArgumentParser(" in open(p).read()]
    assert plain == ["cpu_time.py"], plain  # its REMAINDER is a command's own flags, which OneLineParser would refuse


@pytest.mark.parametrize("script", ["bench_calibrate_repeat", "bench_compile", "bench_cp", "bench_planner_mainjob",
                                    "bench_startup"])
def test_bench_out_into_a_missing_folder_is_one_line_before_the_benchmark(script, tmp_path, monkeypatch, one_line):
    """These five wrote --out with open() after the benchmark (minutes): a missing folder was a traceback at the
    end, the numbers lost. Now hybrid.cliutil.check_output_file's line first, nothing started."""
    import importlib.util
    import os
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in ("run", "Popen"):
        monkeypatch.setattr(subprocess, name, lambda *a, **k: pytest.fail("started work before the --out check"))
    spec = importlib.util.spec_from_file_location(script, os.path.join(root, "scripts", f"{script}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if hasattr(module, "table"):
        monkeypatch.setattr(module, "table", lambda args: pytest.fail("started work before the --out check"))
    out = str(tmp_path / "no" / "table.md")
    monkeypatch.setattr("sys.argv", [f"{script}.py", "--out", out])
    line = one_line(lambda: module.main())
    assert line == (f"{script}.py: error: --out {out!r}: its directory {tmp_path / 'no'} does not exist; create it "
                    f"first"), line


# --- 7. a typo'd HYBRID_DEVICE / HYBRID_BACKEND (docs/results/gpu_h200.md): a traceback at start-up -----------------
@pytest.mark.parametrize("env, want", [
    ({"HYBRID_DEVICE": "cpux"}, "HYBRID_DEVICE='cpux' is not a device; give cpu or cuda:N, or unset it"),
    ({"HYBRID_BACKEND": "glo"}, "HYBRID_BACKEND='glo' with device cpu: give gloo (any device) or nccl (CUDA), or "
                                "unset it"),
    ({"HYBRID_BACKEND": "nccl", "HYBRID_DEVICE": "cpu"}, "HYBRID_BACKEND='nccl' with device cpu: give gloo"),
])
def test_a_typod_backend_or_device_variable_is_one_line_before_any_process_group(env, want, monkeypatch, one_line):
    """"cpux" was torch's RuntimeError from hybrid/mesh.default_backend, "glo" an AssertionError inside
    init_process_group: both after the checks. check_launch now asks default_backend first."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    line = one_line(lambda: validate(["--seq-length", "32"]))
    assert line.startswith(f"train.py: error: {want}"), line


def test_no_cuda_device_variable_on_a_cpu_machine_names_it(monkeypatch, one_line):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: cuda:0 is a device here")
    monkeypatch.setenv("HYBRID_DEVICE", "cuda:0")
    line = one_line(lambda: validate([]))
    assert line == ("train.py: error: HYBRID_DEVICE='cuda:0': hybrid runs on cpu (this machine has no CUDA); give "
                    "that, or unset it"), line
