"""--deepspeed-config's optimizer and scheduler sections, and the compression flags that did nothing: each either
reaches the run (as the file's other keys do: a flag given explicitly that disagrees is one line naming both) or is
refused by name with the flag to use. Parse level only: no process group."""

from __future__ import annotations

import json
import re

import pytest

from hybrid.train.args import parse_args, run_config
from hybrid.train_step import OptimizerConfig
from hybrid.zero.ds_config import ADAM_EPS


def _ds(tmp_path, cfg: dict) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _run(argv: list[str], world: int = 2):
    return run_config(parse_args(argv), world=world)


ADAMW = {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.8, 0.99], "eps": 1e-8, "weight_decay": 0.1}}


@pytest.mark.parametrize("kind", ["Adam", "AdamW"])
def test_optimizer_params_reach_the_run(kind, tmp_path):
    """The user's lr, betas and weight decay are the run's (they were warned about and trained at --lr's default)."""
    run = _run(["--deepspeed-config", _ds(tmp_path, {"optimizer": {**ADAMW, "type": kind}})])
    opt = run.optimizer
    assert (opt.lr, opt.beta1, opt.beta2, opt.weight_decay, opt.optimizer) == (3e-4, 0.8, 0.99, 0.1, "adam")
    assert run.ds_unsupported == ()


def test_optimizer_params_agree_with_flags_or_fail_naming_both(tmp_path):
    path = _ds(tmp_path, {"optimizer": ADAMW})
    assert _run(["--deepspeed-config", path, "--lr", "3e-4"]).optimizer.lr == 3e-4  # the same value: fine
    for flag, value, key in (("--lr", "1e-3", "optimizer.params.lr = 0.0003"),
                             ("--adam-beta2", "0.95", "optimizer.params.betas[1] = 0.99"),
                             ("--weight-decay", "0", "optimizer.params.weight_decay = 0.1")):
        with pytest.raises(ValueError, match=re.escape(f"sets {key} but {flag} ")):
            _run(["--deepspeed-config", path, flag, value])
    with pytest.raises(ValueError, match="optimizer.type 'adamw' .* but --optimizer sgd was given"):
        _run(["--deepspeed-config", path, "--optimizer", "sgd"])


def test_onebitadam_params_reach_the_run(tmp_path):
    cfg = {"optimizer": {"type": "OneBitAdam", "params": {"lr": 2e-4, "freeze_step": 4, "cuda_aware": False}}}
    run = _run(["--deepspeed-config", _ds(tmp_path, cfg)])
    assert (run.optimizer.lr, run.compress.onebit_freeze_iters, run.optimizer.optimizer) == (2e-4, 4, "onebit-adam")
    assert run.ds_unsupported == ("optimizer.params.cuda_aware",)  # picks a comm backend: warned, same math


@pytest.mark.parametrize("params,message", [
    ({"eps": 1e-6}, "optimizer.params.eps 1e-06 is not one train.py runs"),
    ({"betas": [0.9]}, "optimizer.params.betas must be a list of two numbers"),
    ({"betas": [0.9, 1.0]}, r"optimizer.params.betas\[1\] must be in \[0, 1\)"),
    ({"lr": "3e-4"}, "optimizer.params.lr must be a number"),  # "auto": the flag's (tests/test_newuser11_inputs.py)
    ({"lr": 0}, "optimizer.params.lr must be > 0"),
    ({"amsgrad": True}, "optimizer.params.amsgrad true is not one train.py runs"),
    ({"adam_w_mode": False, "weight_decay": 0.1}, "adam_w_mode false with weight_decay > 0 is Adam's L2"),
    ({"freeze_step": 5}, "optimizer.params.freeze_step is not one train.py reads for Adam"),
    ({"momentum": 0.9}, "optimizer.params.momentum is not one train.py reads"),
])
def test_optimizer_params_train_py_does_not_run_are_refused_by_name(params, message, tmp_path):
    with pytest.raises(ValueError, match=message) as e:
        _run(["--deepspeed-config", _ds(tmp_path, {"optimizer": {"type": "Adam", "params": params}})])
    assert "\n" not in str(e.value)


def test_the_eps_accepted_is_the_one_the_optimizer_runs():
    assert ADAM_EPS == OptimizerConfig().eps


def _deepspeed_rates(kind: str, params: dict, lr: float, steps: int) -> list[float]:
    """The rate each optimizer step runs at under DeepSpeed's own scheduler: its engine sets the rate at
    construction and calls scheduler.step() after each optimizer step (deepspeed/runtime/engine.py)."""
    import torch
    schedules = pytest.importorskip("deepspeed.runtime.lr_schedules")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sch = getattr(schedules, kind)(opt, **params)
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        sch.step()
    return rates


def _flag_rates(flags: str, steps: int) -> list[float]:
    cfg = _run(flags.split()).optimizer
    return [cfg.lr_at(k) for k in range(steps)]


@pytest.mark.parametrize("kind,params", [
    ("WarmupLR", {"warmup_num_steps": 4, "warmup_max_lr": 0.01, "warmup_type": "linear"}),
    ("WarmupDecayLR", {"warmup_num_steps": 4, "total_num_steps": 12, "warmup_max_lr": 0.01,
                       "warmup_type": "linear"}),
    ("WarmupCosineLR", {"warmup_num_steps": 4, "total_num_steps": 12, "cos_min_ratio": 0.1,
                        "warmup_type": "linear"}),
])
def test_scheduler_is_refused_with_the_nearest_flags_checked_against_deepspeed(kind, params, tmp_path):
    """DeepSpeed's schedule has no exact equivalent (its ramp is a step behind Megatron's): refused with the
    nearest flags, which -- run through train.py's schedule -- match DeepSpeed's rate on every step past the
    warm-up and differ inside it (so mapping it silently would change the schedule)."""
    cfg = {"optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "scheduler": {"type": kind, "params": params}}
    with pytest.raises(ValueError, match=f"scheduler {kind} has no exact train.py equivalent") as e:
        _run(["--deepspeed-config", _ds(tmp_path, cfg)])
    message = str(e.value)
    assert "\n" not in message and "log" not in message  # warmup_type linear: only the one-step shift is named
    near = message.split("pass the nearest flags: ")[1]
    steps = 16
    ours = _flag_rates(near + " --train-iters 16", steps)
    theirs = _deepspeed_rates(kind, params, 0.01, steps)
    warm = params["warmup_num_steps"] + 1
    assert ours[warm:] == pytest.approx(theirs[warm:], rel=1e-12, abs=1e-15)
    assert ours[:warm] != pytest.approx(theirs[:warm], rel=1e-3)


@pytest.mark.parametrize("sch,message", [
    ({"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10}},
     "warmup_type log (DeepSpeed's default)"),
    ({"type": "WarmupLR", "params": {"warmup_min_lr": 1e-5, "warmup_type": "linear"}}, "warmup_min_lr is not 0"),
    ({"type": "OneCycle", "params": {}}, 'scheduler.type "OneCycle" is not one train.py runs'),
])
def test_scheduler_refusals_name_the_reason(sch, message, tmp_path):
    with pytest.raises(ValueError, match=re.escape(message)):
        _run(["--deepspeed-config", _ds(tmp_path, {"scheduler": sch})])


# --- hybrid/compress/args.py: flags their method never reads ---------------------------------------------------
@pytest.mark.parametrize("argv,world,message", [
    (["--powersgd-start-iter", "5"], 2, "--powersgd-start-iter 5 does nothing without --powersgd-rank"),
    (["--powersgd-rank", "0", "--powersgd-start-iter", "2"], 2,
     "--powersgd-start-iter 2 does nothing without --powersgd-rank (given as 0)"),
    (["--onebit-freeze-iters", "5"], 2, "--onebit-freeze-iters 5 is 1-bit Adam's; the run's optimizer is adam"),
    (["--simulated-dp-bandwidth", "0.5"], 1, "--simulated-dp-bandwidth 0.5 slows the DP gradient collectives, and "
                                             "at dp 1 there are none"),
    (["--simulated-dp-bandwidth", "0.5", "--tensor-model-parallel-size", "2"], 2, "at dp 1 there are none"),
])
def test_compression_flags_that_would_do_nothing_are_one_line(argv, world, message):
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        _run(argv, world=world)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("argv,world", [
    (["--powersgd-rank", "2", "--powersgd-start-iter", "5"], 2),
    (["--optimizer", "onebit-adam", "--onebit-freeze-iters", "5", "--clip-grad", "0"], 2),
    (["--simulated-dp-bandwidth", "0.5"], 2),
    (["--simulated-dp-bandwidth", "0"], 1),  # off
])
def test_compression_flags_their_method_reads_are_accepted(argv, world):
    _run(argv, world=world)


def test_onebit_freeze_iters_beside_a_deepspeed_onebitadam_is_its_conflict_rule(tmp_path):
    path = _ds(tmp_path, {"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 4}}})
    assert _run(["--deepspeed-config", path, "--onebit-freeze-iters", "4"]).compress.onebit_freeze_iters == 4
    with pytest.raises(ValueError, match="freeze_step 4 != --onebit-freeze-iters 5"):
        _run(["--deepspeed-config", path, "--onebit-freeze-iters", "5"])


# --- the resume's fallback message (hybrid/checkpoint/run.py) -----------------------------------------------
@pytest.mark.parametrize("iterations", [[8], [8, 4]])
def test_a_damaged_checkpoint_warning_says_whether_there_is_one_to_fall_back_to(iterations, monkeypatch, capsys):
    """A truncated file caught by the checksums after start-up (the small files passed the pre-start check): the
    warning names the checkpoint it falls back to, or says there is none; the error then says what to do. The
    collective verify is stubbed (every checkpoint damaged): this checks the messages, not the checksums."""
    from types import SimpleNamespace

    from hybrid.checkpoint import run as ckpt_run
    damaged = "iter_{}/__0_0.distcp: 10 bytes, the manifest says 4096 (truncated?)"
    monkeypatch.setattr(ckpt_run, "_core", lambda: SimpleNamespace(
        verify=lambda path, group: damaged.format(path.rsplit("_", 1)[-1])))
    monkeypatch.setattr(ckpt_run.store, "candidates", lambda root: list(iterations))
    monkeypatch.setattr(ckpt_run, "_log", print)
    runs = object.__new__(ckpt_run.RunCheckpoints)
    runs.cfg, runs.ctl = SimpleNamespace(load="ckpt", ckpt_step=None), None
    with pytest.raises(SystemExit) as e:
        runs.resume()
    warnings = capsys.readouterr().out.strip().splitlines()
    assert len(warnings) == len(iterations)
    if len(iterations) == 2:
        assert warnings[0].endswith("falling back to the previous complete checkpoint (iteration 4)")
    assert warnings[-1].endswith("; there is no previous complete checkpoint to fall back to")
    which = "its only checkpoint (iteration 8)" if len(iterations) == 1 else "every one of its 2 checkpoints"
    assert str(e.value) == (f"train.py: error: --load ckpt: no intact checkpoint ({which} failed its checksums); "
                            "restore the damaged files (`hybrid checkpoint inspect ckpt` names them) or drop --load "
                            "to start from scratch")


def test_a_whole_number_written_as_a_float_is_the_integer(tmp_path):
    """DeepSpeed's docs write `"reduce_bucket_size": 5e8`; JSON parses it as 500000000.0, the same count (it was
    refused as 'not an integer'); 2.5 and 5e8 + 0.5 stay refused."""
    run = _run(["--deepspeed-config", _ds(tmp_path, {"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}})])
    assert run.zero.bucket_bytes == 4 * 500_000_000
    for bad in (2.5, 1e300):
        with pytest.raises(ValueError, match="reduce_bucket_size must be"):
            _run(["--deepspeed-config", _ds(tmp_path, {"zero_optimization": {"reduce_bucket_size": bad}})])


def test_a_static_fp16_loss_scale_is_refused_and_zero_is_dynamic(tmp_path):
    """fp16.loss_scale 128 is DeepSpeed's static scale: it was only warned about as 'not read' and the run scaled
    dynamically. 0 is DeepSpeed's default (dynamic) and is accepted without a warning."""
    with pytest.raises(ValueError, match=r"fp16\.loss_scale 128 is a static loss scale"):
        _run(["--deepspeed-config", _ds(tmp_path, {"fp16": {"enabled": True, "loss_scale": 128}})])
    run = _run(["--deepspeed-config", _ds(tmp_path, {"fp16": {"enabled": True, "loss_scale": 0}})])
    assert "fp16.loss_scale" not in run.ds_unsupported
