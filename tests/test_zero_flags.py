"""ZeRO flags and DeepSpeed configs are checked before any process group starts; DeepSpeed's CPU
Adam (the offloaded step) computes torch's AdamW."""

from __future__ import annotations

import glob
import json
import os
import math
import re
import shlex
import subprocess
import sys

import pytest
import torch

from hybrid import testing
from hybrid.train.args import run_config
from hybrid.zero.ds_config import read_deepspeed_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import train as train_script  # noqa: E402


@pytest.mark.parametrize("argv,message", [
    (["--zero-stage", "4"], "--zero-stage must be 0, 1, 2 or 3"),
    (["--offload-params", "--zero-stage", "2"], "--offload-params needs --zero-stage 3"),
    (["--zero3-keep-gathered"], "--zero3-keep-gathered applies to --zero-stage 3"),
    (["--bf16", "--fp16"], "--bf16 and --fp16 are exclusive"),
    (["--clip-grad", "-1"], "--clip-grad must be >= 0"),
    (["--deepspeed-config", "/no/such/ds.json"], "--deepspeed-config '/no/such/ds.json' is not a file"),
])
def test_bad_zero_flags_are_rejected_before_any_process_group(argv, message, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit, match=re.escape(message)) as e:
        train_script.main(argv)
    assert "\n" not in str(e.value)
    assert not torch.distributed.is_initialized()


def _write(tmp_path, cfg) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_deepspeed_config_sets_the_flags_and_names_what_it_ignores(tmp_path):
    path = _write(tmp_path, {
        "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
        "bf16": {"enabled": True}, "optimizer": {"type": "Adam"},
        "zero_optimization": {"stage": 3, "overlap_comm": True, "offload_optimizer": {"device": "cpu"},
                              "offload_param": {"device": "cpu", "buffer_count": 4}}})
    args = train_script.parse_args(["--deepspeed-config", path])
    run = run_config(args, world=4)
    assert (run.zero.stage, run.zero.offload_optimizer, run.zero.offload_params) == (3, True, True)
    assert run.zero.precision.value == "bf16" and run.optimizer.clip_grad == 0.5
    assert (run.training.batch.micro_batch, run.training.batch.global_batch) == (3, 3 * 4 * 2)
    assert list(run.ds_unsupported) == ["zero_optimization.overlap_comm",
                                        "zero_optimization.offload_param.buffer_count"]


@pytest.mark.parametrize("cfg,message", [
    ({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}}, "offload_optimizer.device 'nvme'"),
    # a number written as a string ("auto" is the flag's value: tests/test_newuser11_inputs.py)
    ({"train_micro_batch_size_per_gpu": "4"}, 'train_micro_batch_size_per_gpu must be an integer, got "4"'),
    ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1},
     "train_batch_size 10 != "),
    ({"zero_optimization": {"stage": 3}, "fp16": {"enabled": True}, "bf16": {"enabled": True}}, "exclusive"),
    # a misspelt key would silently run another stage; another optimizer would silently run AdamW
    ({"zero_optimization": {"stage": 1}, "zero_optimisation": {"stage": 2}},
     '"zero_optimisation" is not a DeepSpeed key; did you mean "zero_optimization"?'),
    ({"optimizer": {"type": "SGD", "params": {"lr": 0.1}}},
     'optimizer.type "SGD" is not one train.py runs (Adam, AdamW, OneBitAdam); use --optimizer sgd'),
    ({"optimizer": {"type": "Lamb"}}, 'optimizer.type "Lamb" is not one train.py runs'),
])
def test_bad_deepspeed_configs_exit_with_one_line(cfg, message, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit, match=re.escape(message)) as e:
        train_script.main(["--deepspeed-config", _write(tmp_path, cfg)])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("precision,accum,want", [
    ({"bf16": {"enabled": True}}, "fp32", True),  # DeepSpeed's fp32 accumulation under bf16: the flag
    ({"fp16": {"enabled": True}}, "fp32", True),
    ({"bf16": {"enabled": True}}, "bf16", False),  # the compute dtype: --grad-reduce-in-bf16 (fp32 is the default)
    ({}, "fp32", False),  # fp32 training accumulates in fp32 anyway: nothing to switch on, no error
])
def test_deepspeed_grad_accum_dtype_sets_the_fp32_gradients_flag(precision, accum, want, tmp_path):
    path = _write(tmp_path, {**precision, "data_types": {"grad_accum_dtype": accum}})
    args = train_script.parse_args(["--deepspeed-config", path])
    run = run_config(args, world=2)
    assert run.zero.accumulate_fp32_grads is want and list(run.ds_unsupported) == []


def test_fp32_gradients_flag_reaches_the_zero_config():
    zero = run_config(train_script.parse_args(["--bf16", "--accumulate-allreduce-grads-in-fp32"]), world=2).zero
    assert zero.accumulate_fp32_grads and zero.grad_dtype == torch.float32
    zero = run_config(train_script.parse_args(["--bf16"]), world=2).zero
    assert zero.accumulate_fp32_grads and zero.grad_dtype == torch.float32  # --bf16's default since round 22
    zero = run_config(train_script.parse_args(["--bf16", "--grad-reduce-in-bf16"]), world=2).zero
    assert not zero.accumulate_fp32_grads and zero.grad_dtype == torch.bfloat16  # Megatron's opt-out
    zero = run_config(train_script.parse_args(["--fp16"]), world=2).zero
    assert not zero.accumulate_fp32_grads and zero.grad_dtype == torch.float16  # --fp16: Megatron's default too


def test_deepspeed_reader_accepts_an_empty_config(tmp_path):
    s = read_deepspeed_config(_write(tmp_path, {}))
    assert s.zero_stage is None and s.unsupported == []


def _cpu_adam_built() -> bool:
    """DeepSpeed JIT-builds its CPU Adam on first use (~3 minutes on 2 cores): test it only when built."""
    return bool(glob.glob(os.path.expanduser("~/.cache/torch_extensions/*/cpu_adam/*.so")))


@pytest.mark.skipif(not _cpu_adam_built(), reason="DeepSpeed CPU Adam not built yet (train.py builds it on first use)")
@pytest.mark.slow
def test_deepspeed_cpu_adam_computes_torch_adamw():
    """Same decoupled-weight-decay AdamW; DeepSpeed's AVX kernel rounds differently (fused fp32
    ops), so after 5 steps the weights agree to a few fp32 ulps of the largest weight (measured
    7e-7 at max|w| = 4, i.e. 1.5 ulp), not bit for bit."""
    from hybrid.zero.config import CpuAdam
    from hybrid.zero.engine import cpu_adamw
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(4096, generator=gen)
    grads = [torch.randn(4096, generator=gen) for _ in range(5)]
    out = {}
    for which in (CpuAdam.DEEPSPEED, CpuAdam.TORCH_LOOP):
        w = w0.clone()
        opt, _ = cpu_adamw([{"params": [w], "weight_decay": 0.1}], which, lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
        for g in grads:
            w.grad = g.clone()
            opt.step()
        out[which] = w
    ulp = torch.finfo(torch.float32).eps * w0.abs().max().item()
    assert (out[CpuAdam.DEEPSPEED] - out[CpuAdam.TORCH_LOOP]).abs().max().item() <= 4 * ulp


def readme_command(marker: str) -> list[str]:
    """The README's `torchrun` command (with its backslash continuations) that contains `marker`."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read().replace("\\\n", " ")
    found = [line for line in text.splitlines() if line.strip().startswith("torchrun") and marker in line]
    assert len(found) == 1, f"README: expected one torchrun command with {marker!r}, found {found}"
    return shlex.split(found[0].split("#")[0])


def _torchrun_train(argv: list[str]) -> subprocess.CompletedProcess:
    """`torchrun ARGV` as written; its ranks forked from hybrid.testing's forkserver (hybrid.testing.torchrun_cli)."""
    return testing.torchrun_cli(argv, env={"OMP_NUM_THREADS": "1"}, cwd=ROOT, timeout=600)


def _logged_losses(stdout: str) -> list[float]:
    return [float(line.split("lm loss")[1].split("|")[0]) for line in stdout.splitlines()
            if line.lstrip().startswith("iteration")]


@pytest.mark.slow
def test_readme_zero3_offload_bf16_command_runs_under_torchrun():
    """The README's headline ZeRO command as written there -- 8 ranks, tp 2 x pp 2 x dp 2, ZeRO-3 with
    optimizer and parameter offload, bf16 -- shortened only by flags appended after it (argparse:
    the last one wins): 2 iterations of 32 tokens, the end's validation and test on one batch each (as
    tests/test_docs_commands.py shortens a documented run). It must start, train and report finite losses."""
    argv = readme_command("--offload-params")
    assert argv[:3] == ["torchrun", "--nproc-per-node", "8"] and argv[3] == "scripts/train.py", argv
    out = _torchrun_train([*argv[1:], "--train-iters", "2", "--seq-length", "32", "--log-interval", "1",
                           "--eval-iters", "1"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tp 2 x pp 2" in out.stdout and "x dp 2 on 8" in out.stdout, out.stdout
    assert "zero: stage 3 | bf16 | offload optimizer" in out.stdout and "offload params" in out.stdout, out.stdout
    assert "| fp32 grads |" in out.stdout, out.stdout  # --bf16's default since round 22: Megatron's fp32 main grads
    losses = _logged_losses(out.stdout)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), out.stdout


@pytest.mark.slow
def test_zero3_fp32_optimizer_offload_starts_and_trains_under_torchrun():
    """The reported crash: fp32 ZeRO-3 with only the optimizer offloaded (default preset, default
    --cpu-adam auto) died in ZeroOptimizer._init_unit reading a freed buffer."""
    out = _torchrun_train(["--nproc-per-node", "2", "scripts/train.py", "--micro-batch-size", "2",
                           "--global-batch-size", "4", "--seq-length", "32", "--train-iters", "2",
                           "--log-interval", "1", "--zero-stage", "3", "--offload-optimizer", "--eval-iters", "1"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "zero: stage 3 | fp32 | offload optimizer" in out.stdout and "offload params" not in out.stdout
    losses = _logged_losses(out.stdout)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), out.stdout
